"""The benchmark scripts' own arithmetic, checked against PyTorch's."""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import ai3
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def _load(name: str):
    """A script of benches/ as a module, without putting benches/ on sys.path (its
    transformers.py would hide the transformers package from later tests)."""
    path = Path(__file__).resolve().parents[1] / "benches" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ai3_benches_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layer_kinds = _load("layer_kinds")


def test_layer_kinds_names_each_node_and_counts_its_flops_as_pytorch_does():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),  # dense 3x3
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16),  # depthwise
        nn.Conv2d(16, 24, 1),  # pointwise
        nn.Conv2d(24, 24, 5, padding=2, groups=4),  # grouped: neither
        nn.Flatten(),
        nn.Linear(24 * 8 * 8, 10),
    ).eval()
    x = torch.randn(2, 3, 16, 16)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    rows = model.profile(x, repeat=1)
    want = {
        "0": "3x3 conv",
        "2": "depthwise conv",
        "3": "1x1 conv",
        "4": "5x5 conv",
        "6": "linear",
    }
    seen = {}
    for row in rows:
        kind, flops = layer_kinds.kind_and_flops(net, row)
        if row["name"] in want:
            assert kind == want[row["name"]], row
            module = net.get_submodule(row["name"])
            probe = torch.randn(row["input_shapes"][0])
            with FlopCounterMode(display=False) as counter:
                module(probe)
            assert flops == counter.get_total_flops(), (row["name"], flops)
            seen[row["name"]] = kind
        else:
            assert flops == 0.0 and kind == row["op"].split("+")[0], row
    assert seen == want, rows


def test_loading_the_bench_scripts_leaves_sys_path_alone():
    before = list(sys.path)
    _load("layer_kinds")
    assert sys.path == before


roofline = _load("roofline")


def test_roofline_counts_flops_as_pytorch_does_and_takes_each_layers_longer_bound():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),  # 3x3 stride 1: Winograd's
        nn.Conv2d(8, 8, 3, stride=2, padding=1),  # strided: not
        nn.Conv2d(8, 8, 3, padding=1, groups=8),  # depthwise: not
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 1000),  # large weight, few products
    ).eval()
    x = torch.randn(1, 3, 8, 8)
    with FlopCounterMode(display=False) as counter:
        net(x)
    peak_gflops, read_gbs = 100.0, 10.0
    c = roofline.count(net, x, peak_gflops, read_gbs)
    assert 2 * c["all"] == counter.get_total_flops()
    assert c["winograd"] == 8 * 8 * 8 * 3 * 9  # out channels x pixels x (in x 3x3)
    assert c["weight_bytes"] == 4 * sum(p.numel() for p in net.parameters())
    # Each layer's bound, computed apart: the convolutions' FLOP at the peak,
    # the linear layer's weight at the bandwidth (far longer than its FLOP).
    convs = [net[0], net[1], net[2]]
    outs = [(8, 8), (4, 4), (4, 4)]
    want = 0.0
    for m, (h, w) in zip(convs, outs, strict=True):
        flops = 2 * m.out_channels * h * w * (m.in_channels // m.groups) * 9
        want += max(
            flops / peak_gflops / 1e6, 4 * sum(p.numel() for p in m.parameters()) / read_gbs / 1e6
        )
    lin_bytes = 4 * (net[4].weight.numel() + net[4].bias.numel())
    assert lin_bytes / read_gbs > 2 * net[4].weight.numel() / peak_gflops
    want += lin_bytes / read_gbs / 1e6
    assert abs(c["floor_ms"] - want) < 1e-12


host = _load("host")

CPUINFO = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 17
model name	: AMD EPYC
flags		: fpu sse2 avx avx2 fma avx512f avx512bw

processor	: 1
model name	: Something Else
flags		: fpu
"""


def test_the_cpu_is_named_with_its_family_model_and_vector_level():
    assert host.cpu_name(CPUINFO) == "AMD EPYC (family 25, model 17; AVX-512)"
    avx2 = CPUINFO.replace(" avx512f avx512bw", "")
    assert host.cpu_name(avx2) == "AMD EPYC (family 25, model 17; AVX2)"
    assert host.cpu_name(avx2.replace(" fma", "")).endswith("; no AVX2)")
    no_numbers = "model name\t: Xeon\nflags\t\t: avx2 fma\n"
    assert host.cpu_name(no_numbers) == "Xeon (AVX2)"
    # No model name (aarch64's /proc/cpuinfo, or none at all): the platform's.
    fallback = platform.processor() or platform.machine()
    assert host.cpu_name("processor\t: 0\nCPU implementer\t: 0x41\n") == fallback
    assert host.cpu_name("") == fallback
