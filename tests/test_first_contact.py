"""What a new user tries first: a bare layer, functional forms of the
operations (weights held by the module or given to ``forward``), empty
batches, and the errors a wrong input shape gets. Every value is compared
with PyTorch computed here."""

from __future__ import annotations

from pathlib import Path

import ai3
import pytest
import torch
import torch.nn.functional as F
from conftest import DTYPE_IDS, DTYPES, Fn, assert_close, reference
from torch import nn

CONV_ALGOS = ["default", "direct", "smm", "gemm", "winograd", "fft"]


def converted(module: nn.Module, *inputs: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        expected = module(*inputs)
    got = ai3.convert(module, **kwargs)(*inputs)
    assert_close(got, expected)
    return got


# ---- a layer on its own ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer",
    [
        nn.Conv2d(3, 8, 3),
        nn.Conv2d(3, 8, 3, padding=2, padding_mode="reflect", stride=2),
        nn.Conv2d(4, 8, 3, padding="same", groups=2, bias=False),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.BatchNorm2d(3),
    ],
    ids=lambda m: type(m).__name__ + str(getattr(m, "padding_mode", "")),
)
def test_bare_layer_converts(layer):
    layer.eval()
    channels = 4 if isinstance(layer, nn.Conv2d) and layer.in_channels == 4 else 3
    x = torch.randn(2, channels, 9, 9)
    converted(layer, x)


def test_bare_layer_summary_names_it():
    model = ai3.convert(nn.Conv2d(3, 8, 3), {"conv2d": "gemm"})
    rows = model.summary((1, 3, 8, 8)).rows
    assert [(r["name"], r["op"], r["algorithm"]) for r in rows] == [("conv2d", "conv2d", "gemm")]


def test_bare_linear_converts():
    converted(nn.Linear(5, 3), torch.randn(4, 5))


# ---- functional forms with weights held by the module ---------------------------------------


class FunctionalConv(nn.Module):
    def __init__(self, fn, **kwargs):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 4 // kwargs.get("groups", 1), 3, 3))
        self.bias = nn.Parameter(torch.randn(8))
        self.fn, self.kwargs = fn, kwargs

    def forward(self, x):
        return self.fn(x, self.weight, self.bias, **self.kwargs)


@pytest.mark.parametrize("fn", [F.conv2d, torch.conv2d], ids=["F.conv2d", "torch.conv2d"])
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"stride": 2, "padding": 1}, {"padding": "same", "dilation": 2}, {"groups": 2}],
    ids=["plain", "strided", "same", "groups"],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_functional_conv2d(fn, kwargs, dtype):
    net = FunctionalConv(fn, **kwargs).to(dtype)
    converted(net, torch.randn(2, 4, 11, 10, dtype=dtype))


def test_functional_conv2d_positional_args():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 3, 2, 3))

        def forward(self, x):
            return torch.relu(F.conv2d(x, self.w, None, (1, 2), (1, 0), 1, 1))

    net = Net()
    model = ai3.convert(net)
    converted(net, torch.randn(1, 3, 7, 7))
    assert model.summary((1, 3, 7, 7)).rows[0]["fused"] == "relu"


@pytest.mark.parametrize("algo", CONV_ALGOS)
def test_functional_conv2d_every_algorithm(algo):
    net = FunctionalConv(F.conv2d, padding=1)
    converted(net, torch.randn(1, 4, 8, 8), algos={"conv2d": algo})


def test_functional_batch_norm_and_layer_norm():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.randn(3))
            self.register_buffer("var", torch.rand(3) + 0.5)
            self.g, self.b = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))
            self.ln = nn.Parameter(torch.randn(6))

        def forward(self, x):
            y = F.batch_norm(x, self.mean, self.var, self.g, self.b, eps=1e-3)
            y = torch.batch_norm(y, self.g, None, self.mean, self.var, False, 0.1, 1e-5, True)
            y = F.max_pool2d(y, 2) + torch.max_pool2d(y, 2, 2)
            return torch.layer_norm(F.layer_norm(y, (6,), self.ln), [6])

    converted(Net().eval(), torch.randn(2, 3, 12, 12))


def test_batch_norm_in_training_mode_is_unsupported():
    class Net(nn.Module):
        def forward(self, x):
            return F.batch_norm(x, torch.zeros(3), torch.ones(3), training=True)

    with pytest.raises(ai3.UnsupportedOperationError, match="training=True"):
        ai3.convert(Net())


# ---- weights that are graph values ----------------------------------------------------------


class ConvOfInputs(nn.Module):
    def forward(self, x, w, b):
        return F.conv2d(x, w, b, padding=1)


@pytest.mark.parametrize("algo", CONV_ALGOS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_conv2d_weights_as_model_inputs(algo, dtype):
    model = ai3.convert(ConvOfInputs(), {"conv2d": algo}, dtype=dtype)
    x = torch.randn(2, 4, 8, 8, dtype=dtype)
    # New weights on every call, of two different shapes: nothing may be kept between calls.
    for oc in (8, 8, 5):
        w, b = torch.randn(oc, 4, 3, 3, dtype=dtype), torch.randn(oc, dtype=dtype)
        assert_close(model(x, w, b), F.conv2d(x, w, b, padding=1))


def test_conv2d_weight_computed_in_the_network():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 3, 3, 3))
            self.b = nn.Parameter(torch.randn(8))

        def forward(self, x):
            return F.relu(F.conv2d(x, self.w * 0.5 + 1, self.b))

    net = Net()
    model = ai3.convert(net)
    converted(net, torch.randn(1, 3, 6, 6))
    rows = model.summary((1, 3, 6, 6)).rows
    conv = next(r for r in rows if r["op"] == "conv2d")
    assert conv["fused"] == "relu" and conv["input_shapes"][1] == [8, 3, 3, 3]


def test_linear_and_norms_with_weights_as_inputs():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin_b = nn.Parameter(torch.randn(4))

        def forward(self, x, w, g, mean, var, ln_w):
            y = F.batch_norm(x, mean, var, g, None)
            y = F.layer_norm(y, (5,), weight=ln_w, bias=ln_w * 2)
            return F.linear(y, w, self.lin_b)

    x = torch.randn(2, 3, 6, 5)
    stats = (torch.randn(3), torch.randn(3), torch.rand(3) + 0.5, torch.randn(5))
    net = Net()
    model = ai3.convert(net)
    for _ in range(2):  # other weights on the second call
        w = torch.randn(4, 5)
        with torch.no_grad():
            expected = net(x, w, *stats)
        assert_close(model(x, w, *stats), expected)
        stats = tuple(s + 1 for s in stats)


def test_same_padding_with_runtime_weight_is_unsupported():
    class Net(nn.Module):
        def forward(self, x, w):
            return F.conv2d(x, w, padding="same")

    with pytest.raises(ai3.UnsupportedOperationError, match="padding='same'"):
        ai3.convert(Net())


def test_runtime_weight_of_wrong_shape_names_the_shapes():
    model = ai3.convert(ConvOfInputs())
    x = torch.randn(1, 4, 8, 8)
    with pytest.raises(ai3.ShapeError, match=r"\[8, 3, 3, 3\]"):
        model(x, torch.randn(8, 3, 3, 3), torch.randn(8))


# ---- empty batches --------------------------------------------------------------------------


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(8 * 4, 5)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        y = torch.cat([y, F.avg_pool2d(y, 1)], 1).mean(1, keepdim=True) + y
        y = torch.flatten(self.avg(F.silu(y)), 1)
        return torch.softmax(self.fc(y), dim=-1)


@pytest.mark.parametrize("algo", CONV_ALGOS)
def test_empty_batch_convert(algo):
    net = SmallNet().eval()
    x = torch.randn(0, 3, 8, 8)
    model = ai3.convert(net, {"conv2d": algo})
    got = model(x)
    expected = reference(net, x)
    assert got.shape == expected.shape == (0, 5)
    # The same model still works on a real batch afterwards.
    x = torch.randn(2, 3, 8, 8)
    assert_close(model(x), reference(net, x))


@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "winograd", "fft"])
def test_empty_batch_swap(algo):
    net = SmallNet().eval()
    x = torch.randn(0, 3, 8, 8)
    expected = reference(net, x)
    ai3.swap_conv2d(net, algo)
    ai3.swap_linear(net)
    ai3.swap_maxpool2d(net)
    got = net(x)
    assert got.shape == expected.shape == (0, 5)


def test_mean_over_an_empty_dimension_is_nan_as_in_pytorch():
    class Net(nn.Module):
        def forward(self, x):
            return x.mean(0)

    x = torch.randn(0, 3)
    expected = Net()(x)
    got = ai3.convert(Net())(x)
    assert got.shape == expected.shape and torch.isnan(got).all() and torch.isnan(expected).all()


def test_empty_plane_is_still_an_error():
    model = ai3.convert(nn.Conv2d(3, 4, 1))
    with pytest.raises(ai3.ShapeError, match=r"\[1, 3, 0, 4\]"):
        model(torch.randn(1, 3, 0, 4))


# ---- error messages a new user reads --------------------------------------------------------


def test_three_d_input_missing_its_batch_says_how_it_was_read():
    model = ai3.convert(nn.Conv2d(3, 8, 3))
    with pytest.raises(ai3.ShapeError) as info:
        model(torch.randn(1, 3, 224))
    msg = str(info.value)
    assert "[1, 3, 224]" in msg and "4-D" in msg and "unbatched" in msg and "1 channel" in msg


def test_custom_unavailable_message_carries_no_build_path():
    repo = str(Path(__file__).resolve().parents[1])
    with pytest.raises(ai3.AlgorithmError) as info:
        ai3.convert(nn.Sequential(nn.Conv2d(3, 4, 3)), {"conv2d": "custom"})
    msg = str(info.value)
    assert "conv2d.cpp" in msg and "AI3_CUSTOM_DIR" in msg
    assert repo not in msg and "cpp_custom/README.md" in msg


# ---- options a handler cannot honour are reported, never ignored ----------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.div(3.0, rounding_mode="floor"),
        lambda x: x.div(x + 1, rounding_mode="trunc"),
        lambda x: torch.div(x, 3.0, rounding_mode="floor"),
        lambda x: x.add(x, alpha=2),
        lambda x: x.sub(1.0, alpha=3),
        lambda x: torch.add(x, x, alpha=0.5),
    ],
    ids=["div-floor", "div-trunc", "torch.div-floor", "add-alpha", "sub-alpha", "torch.add-alpha"],
)
def test_binary_options_are_reported(fn):
    with pytest.raises(ai3.UnsupportedOperationError) as info:
        ai3.convert(Fn(fn))
    assert "rounding_mode" in str(info.value) or "alpha" in str(info.value)


@pytest.mark.parametrize(
    "fn",
    [lambda x: x.div(3.0, rounding_mode=None), lambda x: x.add(x, alpha=1)],
    ids=["div-none", "add-alpha-1"],
)
def test_binary_default_options_convert(fn):
    x = torch.randn(2, 3) * 10
    converted(Fn(fn), x)


@pytest.mark.parametrize("algo", CONV_ALGOS)
@pytest.mark.parametrize("path", ["convert", "swap"])
@pytest.mark.parametrize(
    ("kernel", "stride", "out"),
    [(5, 10**12, (1, 1)), (3, (10**12, 2), (1, 5)), (3, (2, 10**12), (4, 1))],
    ids=["both", "rows", "columns"],
)
def test_huge_stride_gives_pytorchs_single_window(algo, path, kernel, stride, out):
    """A stride of 10**12 once made a kernel ask for terabytes and abort the process."""
    layer = nn.Conv2d(3, 4, kernel, stride=stride, padding=1)
    x = torch.randn(2, 3, 8, 9)
    expected = reference(layer, x)
    assert expected.shape == (2, 4, *out)
    if algo == "winograd":
        algo = "default"  # winograd needs stride 1 as the user wrote it
    if path == "convert":
        got = ai3.convert(layer, {"conv2d": algo})(x)
    else:
        got = ai3.swap_conv2d(nn.Sequential(layer), algo)(x)
    assert_close(got, expected)


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Conv2d(1, 1, 3, stride=-1),
        lambda: nn.Conv2d(1, 1, 3, dilation=(1, -2)),
        lambda: nn.Conv2d(1, 1, 3, padding=-1),
        lambda: nn.MaxPool2d(3, stride=-1),
        lambda: nn.MaxPool2d(-2),
        lambda: nn.AvgPool2d(2, padding=-1),
    ],
    ids=["conv-stride", "conv-dilation", "conv-padding", "max-stride", "max-kernel", "avg-pad"],
)
@pytest.mark.parametrize("how", ["convert", "swap"])
def test_negative_hyperparameters_are_invalid_arguments(make, how):
    """A negative stride, dilation, kernel or padding once reached the extension
    as an unsigned int and raised Python's OverflowError; PyTorch raises too."""
    m, x = make(), torch.randn(1, 1, 6, 6)
    with pytest.raises(RuntimeError):
        m(x)
    with pytest.raises(ai3.InvalidArgumentError, match="must be non-negative"):
        if how == "convert":
            ai3.convert(m)(x)
        else:
            ai3.swap_operation(type(m).__name__.lower(), m)(x)


def test_same_padding_with_a_stride_is_refused_as_in_pytorch():
    """F.conv2d(x, w, stride=2, padding='same') once converted and computed;
    PyTorch raises for it (the fuzzer found this)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(2, 1, 3, 3))

        def forward(self, x):
            return F.conv2d(x, self.w, stride=2, padding="same")

    net, x = Net(), torch.randn(1, 1, 6, 6)
    with pytest.raises(RuntimeError, match="strided"):
        net(x)
    with pytest.raises(ai3.InvalidArgumentError, match="padding='same' is not supported"):
        ai3.convert(net)(x)
