"""The benchmark scripts' own arithmetic, checked against PyTorch's."""

from __future__ import annotations

import importlib.util
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
