"""Planned layouts: runs of depthwise and 1x1 convolutions, their activations,
adds, per-channel products and global pooling keep the channel-blocked layout
(NCHW8c) between them, with reorders only at the run's edges. Every case is
checked against PyTorch, with the layout on and off, and the summary says
which nodes ran blocked and where values were reordered."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import ai3
import pytest
import torch
from ai3 import _core
from conftest import assert_close, reference
from torch import nn

# The blocked kernels are f32 with AVX2 and FMA; with a lower level every
# value stays NCHW (checked below in a process of its own).
BLOCKED = _core.cpu_isa() in ("avx2", "avx512")


class InvertedResidual(nn.Module):
    """MobileNetV2/EfficientNet's block: expand (1x1), depthwise, squeeze and
    excitation, project (1x1), with a skip; channel counts need not be
    multiples of 8."""

    def __init__(self, c: int, hidden: int, stride: int = 1, k: int = 3, se: bool = True):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, hidden, 1), nn.BatchNorm2d(hidden), nn.ReLU6())
        self.dw = nn.Sequential(
            nn.Conv2d(hidden, hidden, k, stride, k // 2, groups=hidden), nn.Hardswish()
        )
        self.se = (
            nn.Sequential(
                nn.AdaptiveAvgPool2d(1),
                nn.Conv2d(hidden, max(1, hidden // 4), 1),
                nn.SiLU(),
                nn.Conv2d(max(1, hidden // 4), hidden, 1),
                nn.Sigmoid(),
            )
            if se
            else None
        )
        self.project = nn.Conv2d(hidden, c, 1)
        self.skip = stride == 1

    def forward(self, x):
        y = self.dw(self.expand(x))
        if self.se is not None:
            y = y * self.se(y)
        y = self.project(y)
        return x + y if self.skip else y


def mobile_net(c: int = 11) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, c, 3, 2, 1),
        nn.ReLU(),
        InvertedResidual(c, 3 * c),
        InvertedResidual(c, 2 * c + 1, stride=2, k=5),
        InvertedResidual(c, 4 * c, se=False),
        nn.Conv2d(c, 40, 1),
        nn.GELU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(40, 10),
    ).eval()


def _scaled(net: nn.Module) -> nn.Module:
    """Weights large enough that the output is not vanishingly small."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.mul_(2.0)
    return net


def layouts(model: ai3.Model, shape) -> dict[str, str]:
    return {r["name"]: r["layout"] for r in model.summary(shape)}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("c", [8, 11])
def test_a_mobile_network_runs_blocked_and_matches_pytorch(batch, c):
    net = _scaled(mobile_net(c))
    x = torch.randn(batch, 3, 30, 34)
    want = reference(net, x)
    model = ai3.convert(net)
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    blocked = [r for r in rows if r["layout"] == "NCHW8c"]
    if not BLOCKED:
        assert not blocked
        return
    # Everything from the first depthwise convolution to the global pooling.
    assert len(blocked) >= len(rows) - 5, str(rows)
    assert rows[0]["layout"] == "NCHW" and rows[-1]["layout"] == "NCHW"
    reorders = [(r["name"], x) for r in rows for x in r["reorders"]]
    # In once (the stem's output, read by the first block's expansion and
    # its skip) and out once (the pooled features, to flatten).
    assert len(reorders) == 2, reorders
    assert reorders[0][1].endswith("-> NCHW8c") and reorders[1][1].endswith("-> NCHW")
    assert "NCHW8c" in str(rows) and "reorders" in str(rows)

    model.blocked_layouts = False
    assert set(layouts(model, tuple(x.shape)).values()) == {"NCHW"}
    assert_close(model(x), want)


def test_float64_stays_nchw_and_matches_pytorch():
    net = _scaled(mobile_net()).double()
    x = torch.randn(2, 3, 20, 20, dtype=torch.float64)
    model = ai3.convert(net, dtype=torch.float64)
    assert_close(model(x), reference(net, x))
    assert set(layouts(model, tuple(x.shape)).values()) == {"NCHW"}


class Edges(nn.Module):
    """Blocked values read by NCHW nodes and returned, per-channel operands
    in either order, a scalar, a residual of two blocked values."""

    def __init__(self, c: int = 13):
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, 1, 1, groups=c)
        self.b = nn.Conv2d(c, c, 5, 2, 2, groups=c)
        self.pw = nn.Conv2d(c, c, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.max = nn.MaxPool2d(2)

    def forward(self, x):
        y = torch.relu(self.a(x))
        z = self.b(y)
        s = self.pool(z)
        w = self.pw(z) - s  # per-channel, second
        v = s - w  # per-channel, first
        u = (v + w) * 0.5 + s * w  # elementwise, a scalar, per-channel product
        return u, self.max(y), torch.sigmoid(u)


@pytest.mark.parametrize("batch", [1, 2])
def test_edges_of_blocked_runs_match_pytorch(batch):
    net = Edges().eval()
    x = torch.randn(batch, 13, 17, 19)
    want = reference(net, x)
    model = ai3.convert(net)
    got = model(x)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w)
    rows = model.summary(tuple(x.shape))
    if BLOCKED:
        assert any(r["layout"] == "NCHW8c" for r in rows)
        # The max pooling reads the first convolution's blocked output
        # through a reorder to NCHW; outputs leave blocked runs the same way.
        maxpool = next(r for r in rows if r["op"] == "maxpool2d")
        assert maxpool["layout"] == "NCHW" and maxpool["reorders"], rows
    model.blocked_layouts = False
    for g, w in zip(model(x), want, strict=True):
        assert_close(g, w)


def test_runs_that_do_not_pay_stay_nchw():
    # One 1x1 convolution between 3x3 ones on a large plane: the reorders
    # would cost more than the blocked kernel saves.
    net = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(16, 16, 1), nn.Conv2d(16, 8, 3, padding=1)
    ).eval()
    x = torch.randn(1, 8, 32, 32)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    assert set(layouts(model, tuple(x.shape)).values()) == {"NCHW"}


def test_explicit_algorithms_are_honoured():
    # 'smm' for the 1x1 layers: no blocked kernel implements it, so they run
    # NCHW; the depthwise layer ('default' -> direct) alone does not pay.
    net = nn.Sequential(
        nn.Conv2d(8, 24, 1), nn.Conv2d(24, 24, 3, padding=1, groups=24), nn.Conv2d(24, 8, 1)
    ).eval()
    x = torch.randn(1, 8, 14, 14)
    model = ai3.convert(net, {"conv2d": ["smm", "default", "smm"]})
    assert_close(model(x), reference(net, x))
    rows = model.summary(tuple(x.shape))
    assert [r["algorithm"] for r in rows] == ["smm", "direct", "smm"]
    assert {r["layout"] for r in rows} == {"NCHW"}


def test_the_switch_survives_pickling_and_the_profile_counts_reorders():
    net = _scaled(mobile_net())
    x = torch.randn(1, 3, 24, 24)
    model = ai3.convert(net)
    assert model.blocked_layouts is True
    prof = model.profile(x, repeat=2)
    assert prof.total_ms > 0 and all(r["ms"] >= 0 for r in prof)
    model.blocked_layouts = False
    again = pickle.loads(pickle.dumps(model))
    assert again.blocked_layouts is False
    assert set(layouts(again, tuple(x.shape)).values()) == {"NCHW"}
    assert_close(again(x), reference(net, x))


@pytest.mark.skipif(not BLOCKED, reason="the main run already uses the portable level")
def test_the_portable_level_keeps_every_value_nchw():
    code = (
        "import torch, ai3, sys; sys.path.insert(0, sys.argv[1]);"
        "from test_layouts import mobile_net, _scaled;"
        "net = _scaled(mobile_net()); x = torch.randn(2, 3, 24, 24);"
        "m = ai3.convert(net);"
        "torch.testing.assert_close(m(x), net(x), rtol=1e-4, atol=1e-4);"
        "print(sorted({r['layout'] for r in m.summary(tuple(x.shape))}))"
    )
    env = dict(os.environ, AI3_CPU_ISA="portable")
    got = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(__file__)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.strip() == "['NCHW']"


def test_an_unbatched_input_runs_nchw():
    # Blocked values are 4-D: a 3-D (unbatched) input keeps every value NCHW.
    net = nn.Sequential(
        nn.Conv2d(11, 33, 1),
        nn.ReLU6(),
        nn.Conv2d(33, 33, 3, padding=1, groups=33),
        nn.Hardswish(),
        nn.Conv2d(33, 11, 1),
    ).eval()
    x = torch.randn(11, 20, 20)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    assert set(layouts(model, tuple(x.shape)).values()) == {"NCHW"}
    batched = x.unsqueeze(0)
    assert_close(model(batched), reference(net, batched))
    if BLOCKED:
        assert "NCHW8c" in layouts(model, tuple(batched.shape)).values()


@pytest.mark.parametrize("hw", [28, 56])
def test_resnet_bottlenecks_run_their_1x1_layers_blocked(hw):
    # ResNet-50's bottlenecks on its 28x28 and 56x56 planes: the 1x1 layers
    # and the residual adds run blocked, each 3x3 layer NCHW between them
    # (four blocks in a row, as in ResNet-50's stages: the reorders around
    # each 3x3 layer and at the ends cost less than the 1x1 layers save).
    from torchvision.models.resnet import Bottleneck

    torch.manual_seed(0)
    net = nn.Sequential(*(Bottleneck(64, 16) for _ in range(4))).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 64, hw, hw)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    layout = {r["name"]: r["layout"] for r in rows if r["op"].startswith("conv2d")}
    if BLOCKED:
        # Each block's expansion with its residual add runs blocked, each 3x3
        # layer NCHW; a reduction runs blocked once its input is.
        assert {layout[f"{i}.conv3"] for i in range(4)} == {"NCHW8c"}, rows
        assert {layout[f"{i}.conv2"] for i in range(4)} == {"NCHW"}, rows
        assert {layout[f"{i}.conv1"] for i in range(1, 4)} == {"NCHW8c"}, rows
    else:
        assert set(layout.values()) == {"NCHW"}, rows
    model.blocked_layouts = False
    assert_close(model(x), want)
