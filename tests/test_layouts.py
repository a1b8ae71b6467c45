"""Planned layouts: runs of depthwise and 1x1 convolutions, their activations,
adds, per-channel products and global pooling keep the channel-blocked layout
(NCHW8c) between them, with reorders only at the run's edges. Every case is
checked against PyTorch, with the layout on and off, and the summary says
which nodes ran blocked and where values were reordered."""

from __future__ import annotations

import copy
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
    assert rows[-1]["layout"] == "NCHW"
    reorders = [(r["name"], x) for r in rows for x in r["reorders"]]
    # 'default' runs the stem, planned blocked, on direct's blocked kernel
    # (whatever it picks in NCHW), which reads the NCHW image and writes
    # blocks: out once only.
    assert rows[0]["layout"] == "NCHW8c" and not rows[0]["reorders"], rows[0]
    assert rows[0]["algorithm"] == "direct", rows[0]
    assert len(reorders) == 1 and reorders[0][1].endswith("-> NCHW"), reorders
    assert "NCHW8c" in str(rows) and "reorders" in str(rows)

    model.blocked_layouts = False
    assert set(layouts(model, tuple(x.shape)).values()) == {"NCHW"}
    assert_close(model(x), want)


@pytest.mark.parametrize("batch", [1, 3])
def test_squeeze_excitation_folds_into_the_blocked_projection(batch):
    """With shapes known, the first block's ``y * se(y)`` is applied by its
    projection (``conv2d+mul+add``; the blocked 1x1 kernel scales its
    weights per image); the second block's, on a plane of fewer pixels per
    output channel, keeps its ``mul``."""
    net = _scaled(mobile_net(11))
    x = torch.randn(batch, 3, 30, 34)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    scaled = [r for r in rows if r["op"] == "conv2d" and r["fused"] == "mul+add"]
    assert len(scaled) == 1 and [r["op"] for r in rows].count("mul") == 1, str(rows)
    assert scaled[0]["layout"] == ("NCHW8c" if BLOCKED else "NCHW"), scaled
    model.blocked_layouts = False
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
        # The max pooling reads the first convolution's blocked output as
        # it is; its own output, a graph output, leaves through a reorder
        # to NCHW, as the others do.
        maxpool = next(r for r in rows if r["op"] == "maxpool2d")
        assert maxpool["layout"] == "NCHW8c", rows
        assert [x.endswith("-> NCHW") for x in maxpool["reorders"]] == [True], rows
    model.blocked_layouts = False
    for g, w in zip(model(x), want, strict=True):
        assert_close(g, w)


def test_runs_that_do_not_pay_stay_nchw():
    # One 1x1 convolution between grouped 3x3 ones (Winograd's NCHW kernel:
    # the blocked one takes one group): the reorders would cost more than
    # the blocked kernel saves.
    net = nn.Sequential(
        nn.Conv2d(128, 128, 3, padding=1, groups=2),
        nn.Conv2d(128, 128, 1),
        nn.Conv2d(128, 128, 3, padding=1, groups=2),
    ).eval()
    x = torch.randn(1, 128, 32, 32)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    assert set(layouts(model, tuple(x.shape)).values()) == {"NCHW"}


@pytest.mark.parametrize(
    "c_in, c_out, hw, alone_blocked",
    [
        # Wide and small (ResNet's deep 1x1 layers): blocked alone on AVX-512.
        (256, 512, 14, True),
        (512, 256, 7, True),
        # Narrow (MobileNet's projections), or a large plane: NCHW.
        (96, 576, 14, False),
        (256, 256, 28, False),
    ],
)
def test_a_1x1_layer_alone_runs_blocked_where_it_pays(c_in, c_out, hw, alone_blocked):
    # One 1x1 convolution between NCHW input and output (a swapped layer):
    # with AVX-512 the blocked kernel beats the NCHW GEMM by more than the
    # two reorders cost on wide layers of small planes only.
    net = nn.Sequential(nn.Conv2d(c_in, c_out, 1)).eval()
    x = torch.randn(1, c_in, hw, hw)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    want = "NCHW8c" if alone_blocked and _core.cpu_isa() == "avx512" else "NCHW"
    assert set(layouts(model, tuple(x.shape)).values()) == {want}


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


@pytest.mark.parametrize(("width", "hw"), [(64, 28), (64, 56), (16, 28), (16, 14)])
def test_resnet_bottlenecks_run_blocked(width, hw):
    # ResNet-50's bottlenecks on its 28x28 and 56x56 planes (four blocks in
    # a row, as in its stages): the 1x1 layers, the 3x3 ones (Winograd's
    # blocked kernel, or with thin layers on few tiles, 16 -> 16 at 14x14,
    # the blocked direct kernel) and the residual adds all run blocked.
    from torchvision.models.resnet import Bottleneck

    torch.manual_seed(0)
    net = nn.Sequential(*(Bottleneck(4 * width, width) for _ in range(4))).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 4 * width, hw, hw)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    layout = {r["name"]: r["layout"] for r in rows if r["op"].startswith("conv2d")}
    if BLOCKED:
        # Each block's expansion with its residual add runs blocked, each 3x3
        # layer as its kernel can; a reduction runs blocked once its input is.
        assert {layout[f"{i}.conv3"] for i in range(4)} == {"NCHW8c"}, rows
        assert {layout[f"{i}.conv2"] for i in range(4)} == {"NCHW8c"}, rows
        algorithms = {r["algorithm"] for r in rows if r["name"].endswith("conv2")}
        assert algorithms == {"direct" if width < 48 and hw < 28 else "winograd"}, rows
        assert {layout[f"{i}.conv1"] for i in range(1, 4)} == {"NCHW8c"}, rows
    else:
        assert set(layout.values()) == {"NCHW"}, rows
    model.blocked_layouts = False
    assert_close(model(x), want)


@pytest.mark.parametrize(("batch", "hw"), [(1, 14), (2, 15)])
def test_resnet_stage_transitions_run_blocked(batch, hw):
    # The first bottleneck of a ResNet stage: its 3x3 stride-2 layer on the
    # blocked direct kernel, its 1x1 stride-2 downsampling on the blocked
    # 1x1 kernel (the pixels it reads gathered first; an odd plane leaves
    # a last row and column read), the residual add fused into the
    # expansion: no reorder between the stages.
    from torchvision.models.resnet import Bottleneck

    torch.manual_seed(0)

    def transition(c, width):
        down = nn.Sequential(
            nn.Conv2d(c, 4 * width, 1, stride=2, bias=False), nn.BatchNorm2d(4 * width)
        )
        return Bottleneck(c, width, stride=2, downsample=down)

    net = nn.Sequential(Bottleneck(64, 16), transition(64, 20), Bottleneck(80, 20)).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(batch, 64, hw, hw)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    convs = {r["name"]: r for r in rows if r["op"].startswith("conv2d")}
    # 'default' gives the strided 1x1 layer the blocked 1x1 kernel ('gemm'),
    # on every ISA level (the README's table).
    assert convs["1.downsample.0"]["algorithm"] == "gemm", rows
    if BLOCKED:
        assert convs["1.conv2"]["algorithm"] == "direct", rows
        assert {r["layout"] for r in convs.values()} == {"NCHW8c"}, rows
        # Reorders only at the edges: the input into blocks, the output out.
        assert not any(r["reorders"] for r in rows[1:-1]), rows
        assert rows[0]["reorders"] and rows[-1]["reorders"], rows
    model.blocked_layouts = False
    assert_close(model(x), want)
    # Asked for by name, the strided 1x1 layer keeps its blocked kernel.
    model = ai3.convert(net, {"conv2d": "gemm"}, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    if BLOCKED:
        rows = model.summary(tuple(x.shape))
        down = next(r for r in rows if r["name"] == "1.downsample.0")
        assert down["layout"] == "NCHW8c", rows


class WinogradStack(nn.Module):
    """VGG-like 3x3 layers (ReLU, a max pooling, channel counts that leave
    partial blocks, padding that grows the plane, odd planes for partial
    edge tiles) and a basic block whose residual add and ReLU fuse into the
    last convolution."""

    def __init__(self, c: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(c, 60, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(60, 52, 3, padding=(2, 1)),
            nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(52, 64, 3, padding=1),
            nn.ReLU(),
        )
        self.conv1 = nn.Conv2d(64, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        y = self.features(x)
        z = torch.relu(self.conv1(y))
        return torch.relu(self.conv2(z) + y)


@pytest.mark.parametrize("batch", [1, 3])
def test_winograd_layers_run_blocked_with_fused_epilogues(batch):
    torch.manual_seed(0)
    net = WinogradStack(56).eval()
    x = torch.randn(batch, 56, 15, 13)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    convs = [r for r in rows if r["op"].startswith("conv2d")]
    assert {r["algorithm"] for r in convs} == {"winograd"}, rows
    # The skip's add and the ReLUs are fused into the convolutions.
    assert [r["op"] for r in rows if not r["op"].startswith("conv2d")] == ["maxpool2d"], rows
    if BLOCKED:
        assert {r["layout"] for r in convs} == {"NCHW8c"}, rows
    model.blocked_layouts = False
    assert_close(model(x), want)
    # The NCHW kernel of float64 layers, for comparison.
    net64 = copy.deepcopy(net).double()
    assert_close(ai3.convert(net64)(x.double()), reference(net64, x.double()))


def test_winograd_layer_takes_either_tile_size_as_the_batch_changes():
    # A 7x7 plane has 4 output tiles of 4x4: F(2x2, 3x3) at batch 1, F(4x4,
    # 3x3) from batch 4 (16 tiles), each with its own transformed weights.
    # One model (and one swapped layer) called with both, and back, must
    # match PyTorch every time; the larger tiles' wider transforms must stay
    # as accurate at larger magnitudes.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(64, 72, 3, padding=1), nn.ReLU()).eval()
    model = ai3.convert(net)
    swapped = copy.deepcopy(net)
    ai3.swap_conv2d(swapped, "winograd")
    for batch, scale in [(1, 1.0), (4, 1.0), (1, 1.0), (6, 100.0), (2, 1.0)]:
        x = scale * torch.randn(batch, 64, 7, 7)
        want = reference(net, x)
        assert_close(model(x), want)
        with torch.no_grad():
            assert_close(swapped(x), want)
        rows = model.summary(tuple(x.shape))
        assert [r["algorithm"] for r in rows if r["op"].startswith("conv2d")] == ["winograd"]


class DenseBlock(nn.Module):
    """DenseNet's block and transition: each layer (batch norm, ReLU, 1x1,
    batch norm, ReLU, 3x3) reads the concatenation of every earlier output."""

    def __init__(self, c: int, growth: int, layers: int = 3):
        super().__init__()

        def bn(n):
            m = nn.BatchNorm2d(n)
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            return m

        self.layers = nn.ModuleList(
            nn.Sequential(
                bn(c + i * growth),
                nn.ReLU(),
                nn.Conv2d(c + i * growth, 4 * growth, 1, bias=False),
                bn(4 * growth),
                nn.ReLU(),
                nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
            )
            for i in range(layers)
        )
        out = c + layers * growth
        self.transition = nn.Sequential(
            bn(out), nn.ReLU(), nn.Conv2d(out, out // 2, 1, bias=False), nn.AvgPool2d(2)
        )

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return self.transition(torch.cat(feats, 1))


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("growth", [8, 12])
def test_dense_blocks_run_blocked_through_norms_and_concatenations(batch, growth):
    # Batch norms and concatenations of whole channel blocks keep the run
    # blocked; with 12 channels per layer the concatenations cannot (a
    # layer's output would start mid-block), so they and the norms that
    # read them run NCHW. At batch 1 a blocked concatenation's inputs are
    # written in place, as NCHW ones are.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), DenseBlock(16, growth)).eval()
    x = torch.randn(batch, 3, 14, 12)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    by_op: dict[str, set[str]] = {}
    for r in rows:
        by_op.setdefault(r["op"].split("+")[0], set()).add(r["layout"])
    if BLOCKED and growth == 8:
        for op in ("cat", "batchnorm2d", "conv2d", "avgpool2d"):
            assert "NCHW8c" in by_op[op], rows
        assert all(r["layout"] == "NCHW8c" for r in rows if r["op"] == "cat"), rows
    elif BLOCKED:
        # The first concatenation has the stem's 16 channels alone.
        cats = [r for r in rows if r["op"] == "cat"]
        assert all(r["layout"] == "NCHW" for r in cats[1:]), rows
    else:
        assert set().union(*by_op.values()) == {"NCHW"}, rows
    model.blocked_layouts = False
    assert_close(model(x), want)


def test_basic_blocks_fuse_their_residual_into_the_blocked_direct_kernel():
    # ResNet's basic block on 16 channels: both 3x3 layers run on the
    # blocked direct kernel, the second with the skip and the ReLU applied
    # as each row of its output is stored.
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(0)
    net = nn.Sequential(*(BasicBlock(16, 16) for _ in range(3))).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 16, 11, 9)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = [r for r in model.summary(tuple(x.shape)) if r["op"].startswith("conv2d")]
    assert {r["algorithm"] for r in rows} == {"direct"}, rows
    assert sum("add" in (r["fused"] or "") for r in rows) == 3, rows
    assert {r["layout"] for r in rows} == ({"NCHW8c"} if BLOCKED else {"NCHW"}), rows
    model.blocked_layouts = False
    assert_close(model(x), want)


class Fire(nn.Module):
    """SqueezeNet's module: squeeze (1x1), then 1x1 and 3x3 expansions
    concatenated."""

    def __init__(self, c: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(c, squeeze, 1), nn.ReLU())
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x):
        s = self.squeeze(x)
        return torch.cat([self.e1(s), self.e3(s)], 1)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("ceil_mode", [True, False])
def test_fire_modules_and_max_pooling_run_blocked(batch, ceil_mode):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, 2),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, ceil_mode=ceil_mode),
        Fire(32, 16, 32),
        Fire(64, 16, 32),
        nn.MaxPool2d(3, 2, 1),
        Fire(64, 24, 48),
        nn.AvgPool2d(2, ceil_mode=ceil_mode),
        nn.Conv2d(96, 10, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    ).eval()
    x = torch.randn(batch, 3, 47, 45)
    want = reference(net, x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = model.summary(tuple(x.shape))
    pools = [r["layout"] for r in rows if r["op"] in ("maxpool2d", "avgpool2d")]
    cats = {r["layout"] for r in rows if r["op"] == "cat"}
    if BLOCKED:
        # The stem reads the NCHW image and writes blocks: the run starts
        # there, with nothing to reorder in.
        assert pools == ["NCHW8c"] * 3 and cats == {"NCHW8c"}, rows
        assert rows[0]["layout"] == "NCHW8c", rows
        assert [r["reorders"] for r in rows if r["reorders"]] == [["'9' -> NCHW"]], rows
    else:
        assert set(pools) == cats == {"NCHW"}, rows
    model.blocked_layouts = False
    assert_close(model(x), want)


def test_a_plan_outlives_a_change_of_thread_count():
    # 'default' follows the thread count: with two threads these thin 3x3
    # layers go to the blocked direct kernel and the plan keeps them
    # blocked; with one, 'default' would pick GEMM's tiles. The cached plan
    # still runs (through NCHW for those nodes) and gives the same values.
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1)
    ).eval()
    x = torch.randn(2, 8, 24, 24)
    want = reference(net, x)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        model = ai3.convert(net)
        assert_close(model(x), want)
        torch.set_num_threads(1)
        assert_close(model(x), want)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k,stride,pad", [(3, 2, 1), (7, 2, 3), (11, 4, 2), (1, 1, 0), (5, 1, 2)])
def test_layers_of_few_channels_read_either_layout(batch, k, stride, pad):
    # Direct's blocked kernel reads a layer of fewer than 8 input channels
    # in either layout: the RGB image NCHW where it lies (no reorder in),
    # the 5-channel value blocked from the layer before it.
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 24, k, stride, pad),
        nn.ReLU6(),
        nn.Conv2d(24, 5, 1),
        nn.ReLU(),
        nn.Conv2d(5, 16, 3, 1, 1),
        nn.Hardswish(),
        nn.Conv2d(16, 16, 3, 1, 1, groups=16),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    ).eval()
    x = torch.randn(batch, 3, 37, 41)
    want = reference(net, x)
    few = lambda m, _shape: "direct" if m.in_channels < 8 else "default"  # noqa: E731
    model = ai3.convert(net, algos={"conv2d": few}, sample_input_shape=tuple(x.shape))
    assert_close(model(x), want)
    rows = {r["name"]: r for r in model.summary(tuple(x.shape))}
    if BLOCKED:
        for name in ("0", "4"):
            assert rows[name]["layout"] == "NCHW8c" and not rows[name]["reorders"], rows
        assert rows["2"]["layout"] == "NCHW8c", rows
    # The plan, made for two threads, still runs on one ('default' may pick
    # another algorithm there, then run through NCHW copies).
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert_close(model(x), want)
    finally:
        torch.set_num_threads(threads)
    model.blocked_layouts = False
    assert_close(model(x), want)


# ---- channels-last inputs ---------------------------------------------------------------
#
# PyTorch hands channels-last values (``torch.channels_last``) to layers, as
# ConvNeXt's blocks do. A convolution whose kernel reads that layout (the
# depthwise path of 'direct' on whole blocks of 8 f32 channels with AVX2, the
# patches of 'gemm' when the windows do not overlap, which 'default' takes for
# such input) reads it in place and returns its output channels last; the
# others get a contiguous copy.


def _conv(c, oc, k, dtype=torch.float32, **kw):
    torch.manual_seed(0)
    return nn.Conv2d(c, oc, k, **kw).to(dtype)


#: (layer, input plane, whether its kernel reads channels-last input in place)
CHANNELS_LAST = {
    "depthwise7x7": (_conv(16, 16, 7, padding=3, groups=16), (9, 11), BLOCKED),
    "depthwise_stride2_wide": (_conv(8, 8, 3, stride=2, padding=1, groups=8), (7, 60), BLOCKED),
    "depthwise_no_bias": (_conv(24, 24, 5, padding=2, groups=24, bias=False), (6, 5), BLOCKED),
    # Two groups of 80 channels on AVX-512, rows of 5 and of 8 pixels and more.
    "depthwise_160_5x5": (_conv(160, 160, 5, padding=2, groups=160), (6, 5), BLOCKED),
    "depthwise_160_3x3": (_conv(160, 160, 3, padding=1, groups=160), (4, 21), BLOCKED),
    "depthwise_12_channels": (_conv(12, 12, 3, padding=1, groups=12), (9, 11), False),
    "depthwise_f64": (_conv(16, 16, 3, torch.float64, padding=1, groups=16), (9, 11), False),
    "depthwise_multiplier2": (_conv(8, 16, 3, padding=1, groups=8), (9, 11), False),
    "patches2x2": (_conv(8, 16, 2, stride=2), (9, 11), True),
    "patches4x4_f64": (_conv(16, 8, 4, torch.float64, stride=4), (18, 17), True),
    # 'default' picks 'direct' for these in NCHW; channels last, the patches.
    "patches2x2_default_direct": (_conv(32, 64, 2, stride=2), (16, 16), True),
    # Deeper than the packed linear kernel's reduction block, without a bias.
    "patches2x2_deep_no_bias": (_conv(96, 40, 2, stride=2, bias=False), (14, 13), True),
    "pointwise": (_conv(8, 12, 1), (9, 11), True),
    "overlapping3x3": (_conv(8, 12, 3, padding=1), (9, 11), False),
    "reflect": (_conv(8, 8, 3, padding=1, groups=8, padding_mode="reflect"), (9, 11), False),
}


def _channels_last_input(conv, plane, n=2):
    x = torch.randn(n, conv.in_channels, *plane, dtype=conv.weight.dtype)
    return x.contiguous(memory_format=torch.channels_last)


def _is_channels_last(t):
    return not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("case", list(CHANNELS_LAST))
def test_convert_reads_channels_last_input_in_place(case):
    conv, plane, in_place = CHANNELS_LAST[case]
    x = _channels_last_input(conv, plane)
    before = x.clone()
    model = ai3.convert(nn.Sequential(conv), {"conv2d": "default"})
    out = model(x)
    assert_close(out, reference(conv, x))
    assert torch.equal(x, before)
    # Only a kernel that read the input in place writes channels-last output.
    assert _is_channels_last(out) == in_place, out.stride()
    # The same model on contiguous input: NCHW in and out.
    y = x.contiguous()
    out = model(y)
    assert out.is_contiguous()
    assert_close(out, reference(conv, y))


@pytest.mark.parametrize("case", list(CHANNELS_LAST))
def test_swapped_conv_keeps_channels_last(case):
    # Whatever the kernel, the swapped layer returns its input's memory
    # format, as PyTorch's convolution does, and its fake implementation
    # (what torch.compile traces) says the same strides.
    from torch._subclasses.fake_tensor import FakeTensorMode

    conv, plane, _ = CHANNELS_LAST[case]
    x = _channels_last_input(conv, plane)
    want = reference(conv, x)
    net = ai3.swap_conv2d(nn.Sequential(copy.deepcopy(conv)))
    with torch.inference_mode():
        out = net(x)
    assert_close(out, want)
    assert out.stride() == want.stride()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = net(mode.from_tensor(x))
    assert fake.stride() == out.stride()
    # Gradients flow as through PyTorch's layer.
    xg = x.detach().requires_grad_()
    net(xg).sum().backward()
    xr = x.detach().requires_grad_()
    copy.deepcopy(conv)(xr).sum().backward()
    assert_close(xg.grad, xr.grad)


def test_a_channels_last_input_read_by_another_kernel_is_copied():
    # Two readers of one channels-last input: when one cannot read it in
    # place, both get the contiguous copy; when both can, neither does.
    class TwoHeads(nn.Module):
        def __init__(self, other):
            super().__init__()
            self.dw = _conv(16, 16, 3, padding=1, groups=16)
            self.other = other

        def forward(self, x):
            return self.dw(x), self.other(x)

    x = _channels_last_input(nn.Conv2d(16, 16, 1), (9, 11))
    for other, in_place in [(_conv(16, 8, 3, padding=1), False), (_conv(16, 8, 1), True)]:
        net = TwoHeads(other)
        want = reference(net, x)
        got = ai3.convert(net)(x)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w)
        # The depthwise head reads channels last only on the blocked kernels.
        both = in_place and BLOCKED
        assert _is_channels_last(got[0]) == both, got[0].stride()
        assert _is_channels_last(got[1]) == both, got[1].stride()


@pytest.mark.parametrize(
    "plane, k, stride",
    [
        ((7, 7), 3, 1),
        ((14, 14), 5, 1),
        ((15, 17), 3, 1),
        ((4, 4), 3, 1),
        ((7, 7), 7, 1),
        ((5, 60), 3, 1),
        ((3, 61), 5, 1),
        ((5, 60), 3, 2),
        ((4, 113), 3, 2),
        ((4, 64), 5, 2),
        ((14, 14), 3, 2),
        ((13, 27), 5, 2),
        ((7, 7), 3, 2),
        ((6, 9), 7, 2),
        # Stride 1 on AVX2: the rows' input pixels loaded once for all their
        # taps, 7 wide in place (58) and padded (9: rows of 5 and 4 pixels);
        # dilated rows load per tap.
        ((4, 58), 7, 1),
        ((5, 9), 3, 1),
        ((6, 13), 3, (1, 2)),
        ((3, 60), 5, (2, 1)),
    ],
)
def test_depthwise_between_blocked_layers_matches_pytorch(plane, k, stride):
    # With AVX-512, stride-1 depthwise layers on blocks hold two pixels per
    # register: from a padded copy whose extra columns are computed and not
    # stored (7x7, 14x14, 15x17, 7x7 with a 7x7 kernel; not 4x4, too
    # small), or in place on planes 56 and wider,
    # where 3- and 5-wide kernels of stride 2 do too; narrower planes of
    # stride 2 run those kernels from a padded copy, a row's pairs at a time
    # (14x14, 13x27 with odd output widths, 7x7; a 7-wide kernel stays on
    # AVX2). 20 channels leave padding lanes; the skip (stride 1) and ReLU6
    # may fuse into the depthwise kernel's stores. A tuple in place of the
    # stride is a dilation (rows, columns), with stride 1.
    stride, dilation = (1, stride) if isinstance(stride, tuple) else (stride, (1, 1))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.expand = nn.Conv2d(12, 20, 1)
            self.dw = nn.Conv2d(
                20,
                20,
                k,
                stride,
                padding=(dilation[0] * (k // 2), dilation[1] * (k // 2)),
                groups=20,
                dilation=dilation,
            )
            self.project = nn.Conv2d(20, 12, 1)

        def forward(self, x):
            y = nn.functional.relu6(self.expand(x))
            z = self.dw(y)
            return self.project(nn.functional.relu6(z + y if stride == 1 else z))

    net = _scaled(Net().eval())
    x = torch.randn(2, 12, *plane)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    if BLOCKED:
        rows = {r["name"]: r["layout"] for r in model.summary(tuple(x.shape))}
        assert rows["dw"] == "NCHW8c", rows


@pytest.mark.parametrize(
    "act", [nn.ReLU(), nn.ReLU6(), nn.Hardtanh(-0.5, 1.5)], ids=["relu", "relu6", "hardtanh"]
)
def test_clamps_fuse_into_the_blocked_kernels_and_keep_nan(act):
    # The 1x1, depthwise and direct kernels clamp in registers before they
    # store (and add a residual there); a NaN passes through the clamps, as
    # in PyTorch. 20 channels leave padding lanes in the last block.
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.expand = nn.Conv2d(16, 20, 1)
            self.dw = nn.Conv2d(20, 20, 3, padding=1, groups=20)
            self.down = nn.Conv2d(20, 20, 3, stride=2, padding=1)
            self.project = nn.Conv2d(20, 20, 1)
            self.act = act

        def forward(self, x):
            y = self.act(self.dw(self.act(self.expand(x))))
            z = self.act(self.down(y))
            return self.act(self.project(z) + z)

    net = _scaled(Net().eval())
    x = torch.randn(2, 16, 17, 19)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    if BLOCKED:
        rows = model.summary(tuple(x.shape))
        blocked = {r["name"] for r in rows if r["op"] == "conv2d" and r["layout"] == "NCHW8c"}
        # The strided 3x3 layer takes the blocked direct kernel too.
        assert blocked == {"expand", "dw", "down", "project"}, rows
    x[1, 3, 5, 7] = float("nan")
    got, want = model(x), reference(net, x)
    assert want.isnan().any() and not want.isnan().all()
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert_close(got[keep], want[keep])
