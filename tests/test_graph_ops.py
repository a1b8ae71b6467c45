"""The operations real networks need, converted through ``torch.fx`` as
modules, ``torch.*`` / ``F.*`` functions and tensor methods, each compared
with PyTorch in float32 and float64."""

from __future__ import annotations

import ai3
import pytest
import torch
import torch.nn.functional as F
from conftest import DTYPE_IDS, DTYPES, Fn, Two, assert_close
from torch import nn


def check(module: nn.Module, dtype: torch.dtype, *inputs: torch.Tensor, algos=None) -> ai3.Model:
    module = module.to(dtype).eval()
    inputs = tuple(x.to(dtype) for x in inputs)
    with torch.no_grad():
        expected = module(*inputs)
    model = ai3.convert(module, algos, dtype=dtype)
    assert_close(model(*inputs), expected, dtype)
    return model


ACTIVATIONS = [
    nn.ReLU6(),
    nn.Hardtanh(-2.0, 3.0),
    nn.Hardswish(),
    nn.Hardsigmoid(),
    nn.SiLU(),
    nn.Sigmoid(),
    nn.Tanh(),
    nn.GELU(),
    nn.GELU(approximate="tanh"),
    nn.Softmax(dim=1),
    nn.Softmax(dim=-1),
    Fn(F.relu6),
    Fn(lambda x: F.hardtanh(x, -0.5, 0.5)),
    Fn(F.hardswish),
    Fn(F.hardsigmoid),
    Fn(F.silu),
    Fn(torch.sigmoid),
    Fn(torch.tanh),
    Fn(lambda x: F.gelu(x, approximate="tanh")),
    Fn(lambda x: F.softmax(x, dim=0)),
    Fn(lambda x: x.sigmoid()),
    Fn(lambda x: x.tanh()),
    Fn(lambda x: x.softmax(-2)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("act", ACTIVATIONS, ids=lambda m: repr(m)[:40])
def test_activations(act, dtype):
    x = torch.randn(2, 3, 5, 4) * 4
    check(nn.Sequential(act), dtype, x)


BINARY = [
    ("same shape", lambda x, y: x + y, (2, 3, 4, 5), (2, 3, 4, 5)),
    ("squeeze-excitation", lambda x, y: x * y, (2, 3, 4, 5), (2, 3, 1, 1)),
    ("channel bias", lambda x, y: x - y, (2, 3, 4, 5), (3, 1, 1)),
    ("ranks differ", lambda x, y: torch.mul(x, y), (5,), (2, 3, 5)),
    ("both broadcast", lambda x, y: torch.div(x, y), (2, 1, 5), (1, 4, 1)),
    ("torch.add", lambda x, y: torch.add(x, y), (3, 4), (3, 4)),
    ("sub", lambda x, y: torch.sub(y, x), (3, 4), (1, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", BINARY, ids=[c[0] for c in BINARY])
def test_binary_broadcasting(case, dtype):
    _, fn, sa, sb = case
    x, y = torch.randn(sa), torch.rand(sb) + 0.5
    check(Two(fn), dtype, x, y)


SCALAR = [
    lambda x: x + 2,
    lambda x: 2 + x,
    lambda x: x - 1.5,
    lambda x: 1.5 - x,
    lambda x: x * 3,
    lambda x: x / 4,
    lambda x: 4 / (x.sigmoid() + 1),
    lambda x: x.add(1),
    lambda x: x.mul(0.5),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("k", range(len(SCALAR)))
def test_binary_with_scalars(k, dtype):
    check(Fn(SCALAR[k]), dtype, torch.randn(2, 3, 4))


class Cat(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cat([x, x.relu(), x * 2], self.dim)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cat(dim, dtype):
    check(Cat(dim), dtype, torch.randn(2, 3, 4, 5))


# At batch 1 the memory planner places a concatenation's inputs inside its
# output (their producers write there, the concatenation copies nothing). Each
# pattern below stresses one of its rules; all run at batch 1 (planned in
# place) and 2 (copied), in shapes whose maps are and are not 64-byte aligned.
CAT_PATTERNS = {
    # DenseNet: every layer concatenates all earlier maps.
    "dense_chain": lambda x: _dense_chain(x),
    # Inception: branches of one input, concatenated.
    "branches": lambda x: torch.cat([x.relu(), x.sigmoid(), x * 2, x.tanh()], 1),
    # A concatenation inside another.
    "nested": lambda x: torch.cat([torch.cat([x.relu(), x * 3], 1), x.sigmoid()], 1),
    # One map in two concatenations, at different places.
    "two_places": lambda x: (
        torch.cat([x.relu(), x.sigmoid()], 1) * torch.cat([x.sigmoid(), x.relu()], 1)
    ),
    # The same map twice in one concatenation.
    "twice": lambda x: torch.cat([x.relu(), x.relu().relu(), x.relu()], 1).relu(),
    # A map read again after its concatenation, past later work.
    "read_after": lambda x: _read_after(x),
    # The graph's input, and the graph's output.
    "input_and_output": lambda x: torch.cat([x, x.relu()], 1),
    # Along the batch and the last dimension.
    "batch_dim": lambda x: torch.cat([x.relu(), x.sigmoid()], 0).relu(),
    "last_dim": lambda x: torch.cat([x.relu(), x.sigmoid()], -1).relu(),
}


def _dense_chain(x):
    maps = [x.relu()]
    for k in range(4):
        y = torch.cat(maps, 1)
        maps.append((y * (0.5 + k)).sigmoid())
    return torch.cat(maps, 1).tanh()


def _read_after(x):
    a, b = x.relu(), x.sigmoid()
    y = torch.cat([a, b], 1).tanh()
    z = (y * 2).sigmoid() * 3
    return z + torch.cat([a * 2, b], 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("shape", [(16, 4, 4), (3, 5, 5)], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("pattern", list(CAT_PATTERNS))
def test_concatenations_planned_in_place(pattern, shape, batch, dtype):
    model = check(Fn(CAT_PATTERNS[pattern]), dtype, torch.randn(batch, *shape))
    # A second call reuses the arena: the planned places must hold again.
    x = torch.randn(batch, *shape, dtype=dtype)
    with torch.no_grad():
        assert_close(model(x), CAT_PATTERNS[pattern](x), dtype)


def _random_bn(c: int, affine: bool = True) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c, affine=affine)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        if affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)
    return bn


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("affine", [True, False])
def test_batchnorm_standalone(affine, dtype):
    net = nn.Sequential(nn.ReLU(), _random_bn(4, affine))
    model = check(net, dtype, torch.randn(2, 4, 5, 5))
    assert "batchnorm2d" in [r["op"] for r in model.summary((2, 4, 5, 5))]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("act", [nn.ReLU(), nn.ReLU6(), nn.SiLU(), nn.Hardswish(), nn.GELU()])
@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "winograd"])
def test_conv_bn_activation_fused(act, algo, dtype):
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), _random_bn(6), act)
    model = check(net, dtype, torch.randn(2, 3, 7, 6), algos={"conv2d": algo})
    rows = model.summary((2, 3, 7, 6))
    assert [r["op"] for r in rows] == ["conv2d"], rows
    assert rows[0]["algorithm"] == algo


class PreActivation(nn.Module):
    """DenseNet's layout: BatchNorm and activation after a concatenation, so the
    BatchNorm cannot fold into a convolution; ``share`` also reads its output."""

    def __init__(self, act: nn.Module, share: bool = False):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 3, 1)
        self.bn, self.act, self.share = _random_bn(5), act, share
        self.conv = nn.Conv2d(5, 4, 3, padding=1)

    def forward(self, x):
        y = self.bn(torch.cat([self.a(x), self.b(x)], 1))
        z = self.conv(self.act(y))
        return torch.cat([z, y], 1) if self.share else z


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("act", [nn.ReLU(), nn.Hardtanh(-0.5, 0.25), nn.SiLU(), nn.GELU("tanh")])
def test_batchnorm_activation_fused_after_cat(act, dtype):
    model = check(PreActivation(act), dtype, torch.randn(2, 3, 6, 5))
    rows = model.summary((2, 3, 6, 5))
    bn = [r for r in rows if r["op"] == "batchnorm2d"]
    assert len(bn) == 1 and bn[0]["fused"] is not None, rows
    assert not any(r["op"] == bn[0]["fused"] for r in rows), rows


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_batchnorm_activation_not_fused_when_batchnorm_output_is_shared(dtype):
    model = check(PreActivation(nn.ReLU(), share=True), dtype, torch.randn(2, 3, 6, 5))
    rows = model.summary((2, 3, 6, 5))
    assert [r["fused"] for r in rows if r["op"] == "batchnorm2d"] == [None], rows
    assert "relu" in [r["op"] for r in rows], rows


class Residual(nn.Module):
    """An activation after elementwise arithmetic: ``act(conv(x) op y)``, with
    ``y`` broadcast or a scalar; ``share`` also returns the arithmetic's result."""

    def __init__(self, op, act: nn.Module, share: bool = False):
        super().__init__()
        self.conv, self.op, self.act, self.share = nn.Conv2d(3, 4, 1), op, act, share

    def forward(self, x):
        y = self.op(self.conv(x), x.mean(1, keepdim=True))
        z = self.act(y)
        return torch.cat([z, y], 1) if self.share else z


RESIDUAL_OPS = {
    "add": lambda a, b: a + b,
    "sub_broadcast": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "rsub_scalar": lambda a, b: 0.5 - a,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", RESIDUAL_OPS, ids=list(RESIDUAL_OPS))
@pytest.mark.parametrize("act", [nn.ReLU(), nn.Hardtanh(-0.5, 0.25), nn.Sigmoid()])
def test_activation_fused_into_elementwise_arithmetic(op, act, dtype):
    model = check(Residual(RESIDUAL_OPS[op], act), dtype, torch.randn(2, 3, 5, 4))
    ops = [(r["op"], r["fused"]) for r in model.summary((2, 3, 5, 4))]
    arith = [f for o, f in ops if o in ("add", "sub", "mul")]
    assert len(arith) == 1 and arith[0] is not None, ops
    assert arith[0] not in [o for o, _ in ops], ops


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_activation_not_fused_when_arithmetic_output_is_shared(dtype):
    model = check(Residual(RESIDUAL_OPS["add"], nn.ReLU(), True), dtype, torch.randn(2, 3, 5, 4))
    ops = [(r["op"], r["fused"]) for r in model.summary((2, 3, 5, 4))]
    assert ("add", None) in ops and ("relu", None) in ops, ops


class SharedConvOutput(nn.Module):
    """The conv output feeds the BatchNorm and the residual add: no folding allowed."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = _random_bn(3)

    def forward(self, x):
        y = self.conv(x)
        return F.relu(self.bn(y)) + y


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_no_folding_when_conv_output_is_shared(dtype):
    model = check(SharedConvOutput(), dtype, torch.randn(1, 3, 6, 6))
    assert "batchnorm2d" in [r["op"] for r in model.summary((1, 3, 6, 6))]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_linear_relu_fused_over_leading_dims(dtype):
    net = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    check(net, dtype, torch.randn(2, 4, 5))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "act",
    [nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU(), nn.Hardswish(), nn.ReLU6(), nn.Tanh()],
    ids=["gelu", "gelu-tanh", "silu", "hardswish", "relu6", "tanh"],
)
def test_activations_fused_into_linear_over_many_blocks(act, dtype):
    """Enough rows and features for several of the packed kernel's tasks,
    each applying the activation to its own finished block."""
    net = nn.Sequential(nn.Linear(70, 100), act)
    model = check(net, dtype, torch.randn(3, 100, 70) * 3)
    assert [r["op"] for r in model.summary((3, 100, 70))] == ["linear"]


class LayerNorm2d(nn.LayerNorm):
    """ConvNeXt's channel LayerNorm (fx traces its permutes and F.layer_norm)."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "norm",
    [
        nn.LayerNorm(5),
        nn.LayerNorm([4, 5]),
        nn.LayerNorm(5, elementwise_affine=False),
        LayerNorm2d(3),
    ],
    ids=["last", "last2", "no-affine", "channels"],
)
def test_layernorm(norm, dtype):
    with torch.no_grad():
        for p in norm.parameters():
            p.uniform_(-1, 1)
    check(nn.Sequential(norm), dtype, torch.randn(2, 3, 4, 5) * 3 + 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("size", [1, 3, (2, 5), (None, 2), (4, None)])
def test_adaptive_max_pool(size, dtype):
    check(nn.Sequential(nn.AdaptiveMaxPool2d(size)), dtype, torch.randn(2, 3, 7, 9))
    check(Fn(lambda x: F.adaptive_max_pool2d(x, 2)), dtype, torch.randn(3, 5, 6))


MEANS = [
    lambda x: x.mean([2, 3]),
    lambda x: x.mean((2, 3), keepdim=True),
    lambda x: torch.mean(x, dim=-1),
    lambda x: torch.mean(x, 1, True),
    lambda x: x.mean(),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("k", range(len(MEANS)))
def test_mean(k, dtype):
    check(Fn(MEANS[k]), dtype, torch.randn(2, 3, 4, 5))


SHAPES = [
    lambda x: x.permute(0, 2, 3, 1),
    lambda x: torch.permute(x, (3, 1, 0, 2)),
    lambda x: x.transpose(1, 2),
    lambda x: torch.transpose(x, -1, 0),
    lambda x: x.view(x.size(0), -1),
    lambda x: x.reshape(2, 3, -1),
    lambda x: torch.reshape(x, (-1,)),
    lambda x: x.view(x.shape[0], x.shape[1] // 3, 3, -1),
    lambda x: x.contiguous().flatten(1),
    lambda x: x.chunk(2, dim=3)[1],
    lambda x: torch.chunk(x, 3, 1)[2],
    lambda x: x.split(2, dim=2)[1],
    lambda x: torch.split(x, [1, 4], 3)[1] * 2,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("k", range(len(SHAPES)))
def test_shape_operations(k, dtype):
    check(Fn(SHAPES[k]), dtype, torch.randn(2, 3, 4, 5))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, -1, height, width)


class ShuffleBlock(nn.Module):
    def forward(self, x):
        x1, x2 = x.chunk(2, dim=1)
        return channel_shuffle(torch.cat((x1, x2.relu()), dim=1), 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_shufflenet_channel_shuffle_follows_the_batch_size(dtype):
    model = ai3.convert(ShuffleBlock(), dtype=dtype)
    for shape in [(1, 4, 3, 3), (3, 4, 5, 2)]:  # sizes are read at run time
        x = torch.randn(shape, dtype=dtype)
        assert_close(model(x), ShuffleBlock()(x), dtype)


class LayerScale(nn.Module):
    """A parameter used as a tensor operand (ConvNeXt's layer scale)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(3, 1, 1) + 0.5)

    def forward(self, x):
        return self.scale * x + x


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_parameter_as_operand(dtype):
    check(LayerScale(), dtype, torch.randn(2, 3, 4, 4))


def test_unsupported_still_lists_every_node():
    class Bad(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 1) + torch.sort(x)[0] + torch.flip(x, [1])

    with pytest.raises(ai3.UnsupportedOperationError) as info:
        ai3.convert(Bad())
    names = [n for n, _ in info.value.nodes]
    assert len(names) == 3, info.value.nodes


def test_broadcast_mismatch_is_a_shape_error():
    model = ai3.convert(Two(lambda x, y: x + y))
    with pytest.raises(ai3.ShapeError) as info:
        model(torch.randn(2, 3), torch.randn(4, 3))
    assert "[2, 3]" in str(info.value) and "[4, 3]" in str(info.value)


class SkipBlock(nn.Module):
    """ResNet's block ending: ``act(bn(conv(x)) + skip)``, with the skip computed
    after the convolution (torchvision's order) when ``downsample`` is set.
    ``mode`` breaks the fusion: the convolution's output read twice, the
    activation applied before the add, or a skip that broadcasts."""

    def __init__(self, c: int, k: int, groups: int = 1, downsample: bool = False, mode=""):
        super().__init__()
        self.conv = nn.Conv2d(c, c, k, padding=k // 2, groups=groups)
        self.bn = _random_bn(c)
        self.down = nn.Conv2d(c, c, 1) if downsample else None
        self.mode = mode

    def forward(self, x):
        y = self.bn(self.conv(x))
        skip = self.down(x) if self.down is not None else x
        if self.mode == "pre_activation":
            return torch.relu(y) + skip
        if self.mode == "broadcast":
            skip = skip.mean((2, 3), keepdim=True)
        out = torch.relu(skip + y if self.mode == "swapped" else y + skip)
        return out + y if self.mode == "shared" else out


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "winograd", "fft", "default"])
@pytest.mark.parametrize(
    "k, groups, downsample, mode",
    [(1, 1, False, ""), (3, 1, True, ""), (3, 1, False, "swapped"), (3, 6, False, "")],
    ids=["1x1", "3x3-downsample", "3x3-skip-first", "depthwise"],
)
def test_residual_add_fused_into_convolution(k, groups, downsample, mode, algo, dtype):
    if algo == "winograd" and (k != 3 or groups != 1):
        pytest.skip("winograd takes 3x3 convolutions without groups only")
    net = SkipBlock(6, k, groups, downsample, mode).to(dtype).eval()
    x = torch.randn(2, 6, 9, 7, dtype=dtype)
    with torch.no_grad():
        expected = net(x)

    # The downsample (1x1) runs 'default' when winograd is asked for.
    def select(m, _shape):
        return algo if algo != "winograd" or m.kernel_size == (3, 3) else "default"

    model = ai3.convert(net, {"conv2d": select}, dtype=dtype, sample_input_shape=(2, 6, 9, 7))
    assert_close(model(x), expected, dtype)
    rows = model.summary((2, 6, 9, 7))
    assert "add" not in [r["op"] for r in rows], rows
    fused = [r for r in rows if r["op"] == "conv2d" and r["fused"] == "add+relu"]
    assert len(fused) == 1 and len(fused[0]["input_shapes"]) == 2, rows


@pytest.mark.parametrize("mode", ["shared", "pre_activation", "broadcast"])
def test_residual_add_not_fused_where_it_would_change_the_result(mode):
    net = SkipBlock(4, 3, mode=mode).eval()
    x = torch.randn(2, 4, 6, 5)
    with torch.no_grad():
        expected = net(x)
    model = ai3.convert(net, sample_input_shape=(2, 4, 6, 5))
    assert_close(model(x), expected, torch.float32)
    rows = model.summary((2, 4, 6, 5))
    assert "add" in [r["op"] for r in rows], rows
    assert not any(r["fused"] and "add" in r["fused"] for r in rows), rows


def test_residual_add_not_fused_without_known_shapes():
    """Without a sample shape nothing proves the skip has the output's shape."""
    net = SkipBlock(4, 3).eval()
    x = torch.randn(2, 4, 6, 5)
    model = ai3.convert(net)
    with torch.no_grad():
        assert_close(model(x), net(x), torch.float32)
    assert "add" in [r["op"] for r in model.summary((2, 4, 6, 5))]


def test_residual_of_another_shape_is_a_shape_error():
    """The Rust operation checks the residual it is given, naming both shapes,
    and adds one of the right shape."""
    from ai3 import _core

    w = torch.randn(4, 3, 1, 1)
    m = _core.Model("float32", 2)
    m.set_outputs([m.add("conv2d", "c", [0, 1], {"weight": w})])
    x, r = torch.randn(1, 3, 5, 5), torch.randn(1, 4, 5, 5)
    with pytest.raises(ai3.ShapeError, match=r"conv2d.*\[1, 4, 5, 5\].*\[1, 4, 5, 4\]"):
        m.run([x, torch.randn(1, 4, 5, 4)])
    got = torch.from_dlpack(m.run([x, r])[0])
    assert_close(got, F.conv2d(x, w) + r, torch.float32)


def test_residual_fused_convolution_under_auto():
    """'auto' times the fused convolution as a node of its own, residual input included."""
    net = SkipBlock(4, 3, downsample=True).eval()
    x = torch.randn(2, 4, 6, 5)
    with torch.no_grad():
        expected = net(x)
    model = ai3.convert(net, {"conv2d": ai3.Auto(cache=False)}, sample_input_shape=(2, 4, 6, 5))
    assert_close(model(x), expected, torch.float32)
    rows = model.summary((2, 4, 6, 5))
    assert [r["fused"] for r in rows if r["op"] == "conv2d"].count("add+relu") == 1, rows


class LinearSkip(nn.Module):
    """``linear(x) + y`` (a transformer's or ConvNeXt's residual), then an
    activation; ``mode`` swaps the add's operands or breaks the fusion (the
    linear's output read again, a skip that broadcasts)."""

    def __init__(self, mode: str = ""):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.mode = mode

    def forward(self, x, skip):
        y = self.fc(x)
        if self.mode == "broadcast":
            skip = skip.mean(1, keepdim=True)
        out = torch.relu(skip + y if self.mode == "swapped" else y + skip)
        return out + y if self.mode == "shared" else out


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "mode, fused", [("", True), ("swapped", True), ("shared", False), ("broadcast", False)]
)
def test_residual_add_fused_into_linear(mode, fused, dtype):
    """Fused where the add is the linear's only reader and the skip has its
    output's shape (the add, then the activation, in its epilogue); left
    alone elsewhere. Compared with PyTorch either way."""
    net = LinearSkip(mode).to(dtype).eval()
    x, skip = torch.randn(3, 5, 8, dtype=dtype), torch.randn(3, 5, 8, dtype=dtype)
    with torch.no_grad():
        expected = net(x, skip)
    model = ai3.convert(net, dtype=dtype, sample_input_shape=[(3, 5, 8), (3, 5, 8)])
    assert_close(model(x, skip), expected, dtype)
    rows = model.summary([(3, 5, 8), (3, 5, 8)])
    linear = [r for r in rows if r["op"] == "linear"]
    assert (linear[0]["fused"] == "add+relu") == fused, rows
    assert ("add" not in [r["op"] for r in rows]) == fused, rows


def test_linear_residual_of_another_shape_is_a_shape_error():
    """The Rust operation checks the residual it is given, naming both shapes,
    and adds one of the right shape (both the packed f32 path and f64's)."""
    from ai3 import _core

    for dtype in (torch.float32, torch.float64):
        w = torch.randn(4, 3, dtype=dtype)
        m = _core.Model(str(dtype).removeprefix("torch."), 2)
        m.set_outputs([m.add("linear", "fc", [0, 1], {"weight": w})])
        x, r = torch.randn(2, 3, dtype=dtype), torch.randn(2, 4, dtype=dtype)
        with pytest.raises(ai3.ShapeError, match=r"linear.*\[2, 5\].*\[2, 4\]"):
            m.run([x, torch.randn(2, 5, dtype=dtype)])
        got = torch.from_dlpack(m.run([x, r])[0])
        assert_close(got, F.linear(x, w) + r, dtype)


class ScaledLayer(nn.Module):
    """``gamma * layer(x)`` with ``gamma`` a parameter, ConvNeXt's layer scale:
    ``kind`` picks the layer (a linear over channels-last pixels, permuted back
    to NCHW as ConvNeXt does, a linear without the permute, a convolution, a
    depthwise one) and ``gamma``'s shape; ``mode`` breaks the fold: the
    layer's output read again, an activation between, a scale along another
    dimension, a scale that broadcasts the layer's output up."""

    def __init__(self, kind: str, gamma_shape: tuple[int, ...], mode: str = "", bias: bool = True):
        super().__init__()
        c = 6
        self.kind, self.mode = kind, mode
        if kind.startswith("linear"):
            self.layer = nn.Linear(c, c, bias=bias)
        else:
            groups = c if kind == "depthwise" else 1
            out = 1 if mode == "broadcast_up" else c
            self.layer = nn.Conv2d(c, out, 3, padding=1, groups=groups, bias=bias)
        self.gamma = nn.Parameter(torch.rand(gamma_shape) + 0.5)

    def forward(self, x):
        if self.kind == "linear_permuted":
            y = self.layer(x.permute(0, 2, 3, 1))
            if self.mode == "activation":
                y = F.gelu(y)
            z = y.permute(0, 3, 1, 2)
        elif self.kind == "linear":
            z = self.layer(x)
        else:
            z = self.layer(x)
        if self.mode == "activation" and self.kind != "linear_permuted":
            z = F.gelu(z)
        out = self.gamma * z + x if self.mode != "swapped" else z * self.gamma + x
        return out + z if self.mode == "shared" else out


LAYER_SCALES = {
    "convnext": ("linear_permuted", (6, 1, 1)),
    "linear-last-dim": ("linear", (6,)),
    "conv": ("conv", (6, 1, 1)),
    "depthwise": ("depthwise", (1, 6, 1, 1)),
    "scalar": ("conv", (1,)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("mode", ["", "swapped"], ids=["gamma-first", "gamma-second"])
@pytest.mark.parametrize("case", LAYER_SCALES, ids=list(LAYER_SCALES))
def test_layer_scale_folded_into_the_layer(case, mode, bias, dtype):
    kind, shape = LAYER_SCALES[case]
    net = ScaledLayer(kind, shape, mode, bias).to(dtype).eval()
    x = torch.randn(2, 6, 5, 4, dtype=dtype)
    if kind == "linear":
        x = torch.randn(2, 5, 4, 6, dtype=dtype)
    with torch.no_grad():
        expected = net(x)
    model = ai3.convert(net, dtype=dtype, sample_input_shape=tuple(x.shape))
    assert_close(model(x), expected, dtype)
    ops = [r["op"] for r in model.summary(tuple(x.shape))]
    assert "mul" not in ops, ops


@pytest.mark.parametrize(
    "kind, shape, mode",
    [
        ("linear_permuted", (6, 1, 1), "shared"),
        ("linear_permuted", (6, 1, 1), "activation"),
        ("conv", (6, 1, 1), "activation"),
        # Along the rows of a channels-last linear's output, not its features.
        ("linear_permuted", (1, 5, 1), ""),
        ("conv", (1, 1, 4), ""),
        # The scale broadcasts the layer's one output channel up to six.
        ("conv", (6, 1, 1), "broadcast_up"),
    ],
    ids=["shared", "linear-activation", "conv-activation", "rows", "columns", "broadcast-up"],
)
def test_layer_scale_not_folded_where_it_would_change_the_result(kind, shape, mode):
    net = ScaledLayer(kind, shape, mode).eval()
    x = torch.randn(2, 6, 5, 4)
    with torch.no_grad():
        expected = net(x)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    assert_close(model(x), expected, torch.float32)
    assert "mul" in [r["op"] for r in model.summary(tuple(x.shape))]


def test_layer_scale_not_folded_without_known_shapes():
    """Without a sample shape nothing proves the scale leaves the layer's output's shape."""
    net = ScaledLayer("conv", (6, 1, 1)).eval()
    x = torch.randn(2, 6, 5, 4)
    model = ai3.convert(net)
    with torch.no_grad():
        assert_close(model(x), net(x), torch.float32)
    assert "mul" in [r["op"] for r in model.summary(tuple(x.shape))]


class SqueezeExcite(nn.Module):
    """EfficientNet's block tail: a 3x3 convolution, squeeze-and-excitation
    (global pool, two 1x1 layers, a sigmoid, ``x * s``), a 1x1 projection
    and, with ``residual``, the block's skip. ``mode`` breaks the fold: the
    product read again, a 3x3 projection, a scale per row rather than per
    channel, a projection with more output channels than a sixteenth of
    the pixels."""

    def __init__(self, c: int = 24, out: int = 4, residual: bool = False, mode: str = ""):
        super().__init__()
        self.mode, self.residual = mode, residual
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.fc1, self.fc2 = nn.Conv2d(c, 6, 1), nn.Conv2d(6, c, 1)
        wide = out * 8 if mode == "wide" else out
        k = 3 if mode == "3x3" else 1
        self.project = nn.Conv2d(c, wide, k, padding=k // 2)
        self.skip = nn.Conv2d(c, wide, 1) if residual else None

    def forward(self, x):
        y = self.conv(x)
        s = torch.sigmoid(self.fc2(F.silu(self.fc1(y.mean((2, 3), keepdim=True)))))
        if self.mode == "rows":
            s = y.mean((1, 3), keepdim=True).sigmoid()
        z = y * s if self.mode != "scale_first" else s * y
        out = self.project(z)
        if self.residual:
            out = out + self.skip(x)
        return out + z.mean() if self.mode == "shared" else out


def _scaled_rows(model, shape):
    rows = model.summary(shape)
    return rows, [r for r in rows if r["op"] == "conv2d" and "mul" in (r["fused"] or "")]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["default", "gemm", "direct", "smm"])
@pytest.mark.parametrize(
    "batch, residual, mode",
    [(1, False, ""), (2, True, ""), (3, False, "scale_first")],
    ids=["b1", "b2-residual", "b3-scale-first"],
)
def test_squeeze_excitation_scale_folded_into_the_projection(batch, residual, mode, algo, dtype):
    """``project(y * s)`` runs as one convolution that scales its input's
    channels (its weights per image on the blocked 1x1 kernel, a scaled copy
    of the input for the other kernels), with the skip added after."""
    net = SqueezeExcite(residual=residual, mode=mode).to(dtype).eval()
    shape = (batch, 24, 16, 14)
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        expected = net(x)

    def select(m, _shape):
        return algo if m is net.project else "default"

    model = ai3.convert(net, {"conv2d": select}, dtype=dtype, sample_input_shape=shape)
    assert_close(model(x), expected, dtype)
    rows, scaled = _scaled_rows(model, shape)
    assert "mul" not in [r["op"] for r in rows], rows
    assert len(scaled) == 1, rows
    want = "mul+add" if residual else "mul"
    assert scaled[0]["fused"] == want and scaled[0]["algorithm"] == algo.replace("default", "gemm")
    assert scaled[0]["input_shapes"][-1] == [batch, 24, 1, 1], scaled
    # Another batch through the same model: the scale follows the input's.
    x2 = torch.randn(batch + 1, *shape[1:], dtype=dtype)
    with torch.no_grad():
        assert_close(model(x2), net(x2), dtype)


@pytest.mark.parametrize("mode", ["shared", "3x3", "rows", "wide"])
def test_squeeze_excitation_scale_not_folded_where_it_would_not_apply(mode):
    """The product read again, a 3x3 projection or a scale that is not per
    channel change the result if folded; a projection with few pixels per
    output channel keeps its ``mul`` (scaling its weights costs more)."""
    net = SqueezeExcite(mode=mode).eval()
    shape = (2, 24, 9, 8)
    x = torch.randn(shape)
    with torch.no_grad():
        expected = net(x)
    model = ai3.convert(net, sample_input_shape=shape)
    assert_close(model(x), expected, torch.float32)
    rows, scaled = _scaled_rows(model, shape)
    assert "mul" in [r["op"] for r in rows] and not scaled, rows


def test_squeeze_excitation_scale_not_folded_without_known_shapes():
    net = SqueezeExcite().eval()
    x = torch.randn(2, 24, 9, 8)
    model = ai3.convert(net)
    with torch.no_grad():
        assert_close(model(x), net(x), torch.float32)
    assert "mul" in [r["op"] for r in model.summary(tuple(x.shape))]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_input_scale_of_a_convolution_in_the_core(dtype):
    """The Rust operation checks the scale it is given, naming the shapes,
    takes one of batch 1 for every image, and scales any convolution's
    input (a 3x3 with a residual here), in NCHW."""
    from ai3 import _core

    w = torch.randn(5, 3, 3, 3, dtype=dtype)
    m = _core.Model(str(dtype).removeprefix("torch."), 3)
    m.set_outputs(
        [
            m.add(
                "conv2d",
                "c",
                [0, 1, 2],
                {"weight": w, "padding": [1, 1, 1, 1], "input_scale": True},
            )
        ]
    )
    x, r = torch.randn(2, 3, 6, 5, dtype=dtype), torch.randn(2, 5, 6, 5, dtype=dtype)
    for s in (torch.randn(2, 3, 1, 1, dtype=dtype), torch.randn(1, 3, 1, 1, dtype=dtype)):
        got = torch.from_dlpack(m.run([x, r, s])[0])
        assert_close(got, F.conv2d(x * s, w, padding=1) + r, dtype)
    with pytest.raises(
        ai3.ShapeError, match=r"conv2d.*scale.*\[2, 3, 1, 1\] or \[1, 3, 1, 1\].*\[2, 3, 2, 1\]"
    ):
        m.run([x, r, torch.randn(2, 3, 2, 1, dtype=dtype)])
    bad = _core.Model(str(dtype).removeprefix("torch."), 1)
    with pytest.raises(ai3.InvalidArgumentError, match=r"conv2d.*input scale.*1 input"):
        bad.add("conv2d", "c", [0], {"weight": w, "input_scale": True})


class ChannelsLastBlocks(nn.Module):
    """Convolutions between permutes to and from channels last, as ConvNeXt
    runs them: ``mode`` picks the convolution (``depthwise`` 7x7, a
    ``patches`` 2x2 stride-2 downsampling read by a depthwise layer and a
    residual add, a ``dense`` 3x3 with no channels-last kernel) or breaks
    the rewrite (the convolution's output also a graph ``output``, an
    ``activation`` after it, a ``reader`` that needs NCHW)."""

    def __init__(self, mode: str, c: int = 8):
        super().__init__()
        self.mode = mode
        groups = 1 if mode == "dense" else c
        k = 3 if mode == "dense" else 7
        self.down = nn.Conv2d(c, c, 2, stride=2)
        self.conv = nn.Conv2d(c, c, k, padding=k // 2, groups=groups)
        self.norm = nn.LayerNorm(c)
        self.mlp = nn.Linear(c, c)

    def block(self, x):
        y = self.conv(x)
        if self.mode == "activation":
            y = F.relu(y)
        z = self.mlp(self.norm(y.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return z + x, y

    def forward(self, x):
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if self.mode == "patches":
            x = self.down(x)
        x, y = self.block(x)
        x, _ = self.block(x)
        if self.mode == "output":
            return x, y
        if self.mode == "reader":
            return x + y.mean()
        return x


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "mode, rewritten",
    [
        ("depthwise", [True, True]),
        ("patches", [True, True, True]),
        ("dense", [True, True]),
        # The first block's convolution output is read as NCHW.
        ("output", [False, True]),
        ("reader", [False, True]),
        ("activation", [False, False]),
    ],
)
def test_channels_last_convolutions_drop_their_permutes(mode, rewritten, dtype):
    """Where every reader takes it, a convolution of a permute to NCHW runs
    channels last and the permutes around it go; otherwise that convolution
    is left as it was. Either way the network computes what PyTorch does."""
    net = ChannelsLastBlocks(mode).to(dtype).eval()
    x = torch.randn(2, 8, 6, 10, dtype=dtype)
    with torch.no_grad():
        expected = net(x)
    model = ai3.convert(net, dtype=dtype, sample_input_shape=tuple(x.shape))
    got = model(x)
    if mode == "output":
        assert_close(got[0], expected[0], dtype)
        assert_close(got[1], expected[1], dtype)
    else:
        assert_close(got, expected, dtype)
    rows = model.summary(tuple(x.shape))
    permutes = [r for r in rows if r["op"] == "permute"]
    convs = [r for r in rows if r["op"] == "conv2d"]
    # Channels last: [n, h, w, 8] in, not [n, 8, h, w], and the summary says so.
    assert [r["input_shapes"][0][-1] == 8 for r in convs] == rewritten, convs
    assert [r["layout"] == "NHWC" for r in convs] == rewritten, convs
    # All rewritten: one permute of the input to channels last, one of the output back.
    assert (len(permutes) == 2) == all(rewritten), permutes
