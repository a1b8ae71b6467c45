"""Whole networks: torchvision's VGG16 and AlexNet (random weights), and the
samples of the ai3 paper and reference docs, run as written (weights=None)."""

from __future__ import annotations

import copy

import ai3
import pytest
import torch
import torchvision
from conftest import assert_close
from torch import nn

SWAP_FUNCTIONS = [
    ai3.swap_conv2d,
    ai3.swap_linear,
    ai3.swap_relu,
    ai3.swap_maxpool2d,
    ai3.swap_avgpool2d,
    ai3.swap_adaptiveavgpool2d,
    ai3.swap_flatten,
]
TORCH_TYPES = (nn.Conv2d, nn.Linear, nn.ReLU, nn.MaxPool2d, nn.AdaptiveAvgPool2d, nn.Flatten)


@pytest.fixture(scope="module")
def vgg16():
    torch.manual_seed(0)
    return torchvision.models.vgg16(weights=None).eval()


@pytest.fixture(scope="module")
def alexnet():
    torch.manual_seed(0)
    return torchvision.models.alexnet(weights=None).eval()


def _model(name, request):
    return request.getfixturevalue(name)


def assert_close_to_scale(actual, expected, rel=1e-3):
    """Deep networks in float32: within ``rel`` of the output's scale."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    scale = float(expected.abs().max())
    assert scale > 0
    err = float((actual - expected).abs().max())
    assert err <= rel * scale, f"max error {err} > {rel} * {scale}"


NETS = ["vgg16", "alexnet"]
# AlexNet's first conv has stride 4 and an 11x11 kernel: winograd cannot run it.
CONV_ALGOS = {
    "vgg16": ["default", "direct", "smm", "gemm", "winograd"],
    "alexnet": ["default", "smm", "gemm"],
}
CASES = [(n, a) for n in NETS for a in CONV_ALGOS[n]]


@pytest.mark.parametrize(("name", "conv_algo"), CASES)
@pytest.mark.parametrize("batch", [1, 2])
def test_convert_torchvision(name, conv_algo, batch, request):
    net = _model(name, request)
    x = torch.randn(batch, 3, 64, 64)
    with torch.inference_mode():
        expected = net(x)
    model = ai3.convert(net, {"conv2d": conv_algo, "linear": "gemm"})
    out = model(x)
    assert_close_to_scale(out, expected)
    algos = {r["algorithm"] for r in model.summary((batch, 3, 64, 64)) if r["op"] == "conv2d"}
    if conv_algo != "default":
        assert algos == {conv_algo}


@pytest.mark.parametrize(("name", "conv_algo"), [("vgg16", "winograd"), ("alexnet", "gemm")])
def test_swap_torchvision(name, conv_algo, request):
    net = copy.deepcopy(_model(name, request))
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        expected = net(x)
    for swap in SWAP_FUNCTIONS:
        net = swap(net, conv_algo if swap is ai3.swap_conv2d else "default")
    leftover = [type(m).__name__ for m in net.modules() if type(m) in TORCH_TYPES]
    assert not leftover, leftover
    with torch.inference_mode():
        out = net(x)
    assert_close_to_scale(out, expected)


def test_alexnet_winograd_is_rejected(alexnet):
    with pytest.raises(ai3.AlgorithmError):
        ai3.convert(alexnet, {"conv2d": "winograd"})


def test_alexnet_winograd_where_possible(alexnet):
    """A function selector picks winograd exactly for the layers that allow it."""

    def selector(conv):
        ok = conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.dilation == (1, 1)
        return "winograd" if ok else "gemm"

    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        expected = alexnet(x)
    model = ai3.convert(alexnet, {"conv2d": selector})
    assert_close_to_scale(model(x), expected)
    got = [r["algorithm"] for r in model.summary((1, 3, 64, 64)) if r["op"] == "conv2d"]
    assert got == ["gemm", "gemm", "winograd", "winograd", "winograd"]


def test_vgg16_f64(vgg16):
    net = copy.deepcopy(vgg16).double()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    with torch.inference_mode():
        expected = net(x)
    model = ai3.convert(net, {"conv2d": "winograd"})
    assert model.dtype == torch.float64
    assert_close(model(x), expected, torch.float64, factor=100.0)


# ---- the paper's Listing 1 ----------------------------------------------------------------


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=3, out_channels=16, kernel_size=3, padding=1)
        self.maxpool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(in_channels=16, out_channels=32, kernel_size=3, padding=1)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = self.maxpool(x)
        x = torch.relu(self.conv2(x))
        x = torch.flatten(x, 1)
        return x


def test_paper_listing_1():
    input_data = torch.randn(10, 3, 224, 224)
    orig = ConvNet()
    torch_out = orig(input_data)
    model: ai3.Model = ai3.swap_backend(orig, {"conv2d": "direct"})
    sb_out = model(input_data)
    ai3.swap_conv2d(orig, ["direct", "smm"])
    sc_out = orig(input_data)
    assert torch.allclose(torch_out, sb_out, atol=1e-6)
    assert torch.allclose(torch_out, sc_out, atol=1e-6)
    # and the swap did what the listing says
    assert (orig.conv1.algorithm, orig.conv2.algorithm) == ("direct", "smm")


def test_reference_docs_swap_operation_example():
    input_data = torch.randn(10, 3, 224, 224)
    orig = ConvNet()
    orig_out = orig(input_data)
    ai3.swap_operation(nn.Conv2d, orig, ["direct", "smm"])
    so_out = orig(input_data)
    assert torch.allclose(orig_out, so_out, atol=1e-6)


# ---- the paper's Listing 2 (VGG16 at 224x224) ----------------------------------------------


def selector(orig: torch.nn.Conv2d) -> str:
    in_channels = orig.weight.shape[1]
    if in_channels > 200:
        return "smm"
    return "direct"


def test_paper_listing_2():
    input_data = torch.randn(1, 3, 224, 224)
    vgg16 = torchvision.models.vgg16(weights=None)
    vgg16.eval()
    torch_out = vgg16(input_data)

    model: ai3.Model = ai3.swap_backend(vgg16, {"conv2d": selector})

    sb_out = model(input_data)
    assert torch.allclose(torch_out, sb_out, atol=1e-4)

    ai3.swap_conv2d(vgg16, selector)
    sc_out = vgg16(input_data)
    assert torch.allclose(torch_out, sc_out, atol=1e-4)

    convs = [m for m in vgg16.modules() if isinstance(m, ai3.swap.Conv2d)]
    assert [c.algorithm for c in convs] == [
        "smm" if c.in_channels > 200 else "direct" for c in convs
    ]


# ---- the reference docs' convert example ---------------------------------------------------


def auto_selector(orig: torch.nn.Conv2d, input_shape) -> str:
    out_channels = orig.weight.shape[0]
    if out_channels < 50 and input_shape[1] < 50 and input_shape[2] > 150 and input_shape[3] > 150:
        return "direct"
    return "smm"


def test_reference_docs_convert_example():
    input_data = torch.randn(1, 3, 224, 224)
    vgg16 = torchvision.models.vgg16(weights=None)
    vgg16 = vgg16.eval()
    with torch.inference_mode():
        torch_out = vgg16(input_data)
    model: ai3.Model = ai3.convert(
        vgg16,
        {"conv2d": auto_selector, "maxpool2d": "default"},
        sample_input_shape=(1, 3, 224, 224),
    )
    sb_out = model(input_data)
    assert torch.allclose(torch_out, sb_out, atol=1e-4)
    convs = [r for r in model.summary() if r["op"] == "conv2d"]
    # VGG16 has no conv with fewer than 50 output channels: every layer is smm.
    assert [r["algorithm"] for r in convs] == ["smm"] * 13


def test_reference_docs_convert_example_small():
    """The same selector where it does pick 'direct' (a small first layer on a big image)."""
    net = ConvNet()
    shape = (1, 3, 160, 160)
    seen = []

    def recording(orig, input_shape):
        seen.append(tuple(input_shape))
        return auto_selector(orig, input_shape)

    model = ai3.convert(
        net, {"conv2d": recording, "maxpool2d": "default"}, sample_input_shape=shape
    )
    assert seen == [(1, 3, 160, 160), (1, 16, 80, 80)]
    assert [r["algorithm"] for r in model.summary() if r["op"] == "conv2d"] == ["direct", "smm"]
    x = torch.randn(shape)
    with torch.inference_mode():
        assert_close(model(x), net(x))


# ---- convert's dtype argument, several inputs and outputs ---------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, "float64", "torch.float64"], ids=str)
def test_convert_dtype_argument_casts_weights(dtype):
    net = ConvNet()  # float32 parameters
    model = ai3.convert(net, {"conv2d": "gemm"}, dtype=dtype)
    assert model.dtype == torch.float64
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = copy.deepcopy(net).double()(x)
    assert_close(model(x), expected, torch.float64)


class TwoInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x, y):
        return torch.relu(self.conv(x)), self.fc(torch.flatten(y, 1))


def test_convert_several_inputs_and_outputs():
    net = TwoInTwoOut()
    x, y = torch.randn(2, 3, 5, 5), torch.randn(3, 2, 3)
    with torch.no_grad():
        ex, ey = net(x, y)
    out = ai3.convert(net)(x, y)
    assert isinstance(out, tuple) and len(out) == 2
    assert_close(out[0], ex)
    assert_close(out[1], ey)


def test_profile_times_every_layer():
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    ).eval()
    model = ai3.convert(net, {"conv2d": "direct"})
    x = torch.randn(2, 3, 16, 16)
    rows = model.profile(x, repeat=3)
    summary = model.summary(tuple(x.shape))
    assert [r["name"] for r in rows] == [r["name"] for r in summary]
    assert [r["algorithm"] for r in rows] == [r["algorithm"] for r in summary]
    assert all(r["ms"] >= 0 and r["ms"] == r["ms"] for r in rows)
    assert rows[0]["algorithm"] == "direct"
    # Profiling leaves the model working.
    assert_close(model(x), net(x))
    with pytest.raises(ValueError, match="repeat"):
        model.profile(x, repeat=0)
    with pytest.raises(ai3.Error):
        model.profile(torch.randn(2, 5, 16, 16))
