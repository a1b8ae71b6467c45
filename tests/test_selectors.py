"""Algorithmic selectors: names, lists, functions of the module (and of its
input shape), and the errors when a selector does not fit the network."""

from __future__ import annotations

import copy

import ai3
import pytest
import torch
import torch.nn.functional as F
from ai3 import swap
from conftest import assert_close, reference
from torch import nn


class ThreeConvs(nn.Module):
    """Three convs registered in an order different from the forward order."""

    def __init__(self):
        super().__init__()
        self.c_last = nn.Conv2d(8, 4, 1)
        self.c_first = nn.Conv2d(3, 6, 3, padding=1)
        self.c_mid = nn.Conv2d(6, 8, 3, stride=2)
        self.fc = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        x = F.relu(self.c_first(x))
        x = F.relu(self.c_mid(x))
        x = self.c_last(x)
        return self.fc(torch.flatten(x, 1))


INPUT_SHAPE = (2, 3, 8, 8)
# The inputs each conv sees, in forward order, for INPUT_SHAPE.
CONV_INPUTS = [(2, 3, 8, 8), (2, 6, 8, 8), (2, 8, 3, 3)]


def net_and_input():
    net = ThreeConvs()
    return net, torch.randn(INPUT_SHAPE)


def conv_algorithms_of_model(model: ai3.Model, shape=INPUT_SHAPE) -> list[str]:
    return [r["algorithm"] for r in model.summary(shape) if r["op"] == "conv2d"]


def conv_algorithms_of_swapped(net: ThreeConvs) -> list[str]:
    mods = [net.c_first, net.c_mid, net.c_last]
    return [m.algorithm if isinstance(m, swap.Conv2d) else "torch" for m in mods]


def run(path, net, algos, x, sample_input_shape=None):
    """(output, conv algorithms in forward order) for convert or swap."""
    if path == "convert":
        model = ai3.convert(net, {"conv2d": algos}, sample_input_shape)
        return model(x), conv_algorithms_of_model(model)
    swapped = ai3.swap_conv2d(net, algos, sample_input_shape)
    assert swapped is net
    return swapped(x), conv_algorithms_of_swapped(net)


PATHS = ["convert", "swap"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["direct", "smm", "gemm"])
def test_string_selector(name, path):
    net, x = net_and_input()
    expected = reference(net, x)
    out, algos = run(path, net, name, x)
    assert algos == [name] * 3
    assert_close(out, expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "selection",
    [["direct", "smm", "gemm"], ["gemm", "direct", "smm"], ["winograd", "smm", "direct"]],
    ids=str,
)
def test_list_selector_in_forward_order(selection, path):
    net, x = net_and_input()
    expected = reference(net, x)
    out, algos = run(path, net, selection, x)
    assert algos == selection
    assert_close(out, expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("given", [0, 1, 2])
def test_list_selector_too_short(given, path):
    net, _ = net_and_input()
    with pytest.raises(ai3.SelectorError) as info:
        if path == "convert":
            ai3.convert(net, {"conv2d": ["direct"] * given})
        else:
            ai3.swap_conv2d(net, ["direct"] * given)
    msg = str(info.value)
    assert "3" in msg and str(given) in msg, msg
    assert "3 conv2d" in msg, msg
    assert isinstance(info.value, ValueError)


def test_swap_list_too_short_leaves_module_untouched():
    net, _ = net_and_input()
    before = [net.c_first, net.c_mid, net.c_last]
    with pytest.raises(ai3.SelectorError):
        ai3.swap_conv2d(net, ["direct", "smm"])
    assert [net.c_first, net.c_mid, net.c_last] == before


@pytest.mark.parametrize("path", PATHS)
def test_function_selector_one_arg(path):
    net, x = net_and_input()
    expected = reference(net, x)
    seen = []

    def selector(module):
        seen.append(module.in_channels)
        return "smm" if module.in_channels > 4 else "direct"

    out, algos = run(path, net, selector, x)
    assert seen == [3, 6, 8], "the selector is called once per module, in forward order"
    assert algos == ["direct", "smm", "smm"]
    assert_close(out, expected)


@pytest.mark.parametrize("path", PATHS)
def test_function_selector_two_args_sees_real_input_shapes(path):
    net, x = net_and_input()
    expected = reference(net, x)
    seen = []

    def selector(module, input_shape):
        seen.append((module.in_channels, tuple(input_shape)))
        return "gemm" if input_shape[2] > 4 else "direct"

    out, algos = run(path, net, selector, x, sample_input_shape=INPUT_SHAPE)
    assert [s for _, s in seen] == CONV_INPUTS
    assert [c for c, _ in seen] == [3, 6, 8]
    assert algos == ["gemm", "gemm", "direct"]
    assert_close(out, expected)


def test_function_selector_two_args_linear_shape():
    net, x = net_and_input()
    seen = []

    def selector(module, input_shape):
        seen.append(tuple(input_shape))
        return "gemm"

    model = ai3.convert(net, {"linear": selector}, INPUT_SHAPE)
    assert seen == [(2, 36)]
    assert_close(model(x), reference(net, x))


@pytest.mark.parametrize("path", PATHS)
def test_two_arg_function_without_sample_shape_is_an_error(path):
    net, _ = net_and_input()
    with pytest.raises(ai3.SelectorError, match="sample_input_shape"):
        run(path, net, lambda m, shape: "direct", None)


@pytest.mark.parametrize("path", PATHS)
def test_one_arg_function_with_sample_shape_is_an_error(path):
    net, _ = net_and_input()
    with pytest.raises(ai3.SelectorError, match="sample_input_shape"):
        run(path, net, lambda m: "direct", None, sample_input_shape=INPUT_SHAPE)


@pytest.mark.parametrize("path", PATHS)
def test_function_returning_non_string(path):
    net, _ = net_and_input()
    with pytest.raises(ai3.SelectorError):
        run(path, net, lambda m: 3, None)


@pytest.mark.parametrize("path", PATHS)
def test_custom_not_implemented(path):
    row = next(
        r for r in ai3.algorithm_table() if r["op"] == "conv2d" and r["algorithm"] == "custom"
    )
    if row["unavailable"] is None:
        pytest.skip("this build has a custom conv2d (built with AI3_CUSTOM_DIR)")
    net, _ = net_and_input()
    with pytest.raises(ai3.AlgorithmError, match=r"custom conv2d is not implemented.*conv2d\.cpp"):
        run(path, net, "custom", None)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["fourier", "Direct", "", "winograd2"])
def test_unknown_algorithm_lists_valid_names(name, path):
    net, _ = net_and_input()
    with pytest.raises(ai3.AlgorithmError) as info:
        run(path, net, name, None)
    msg = str(info.value)
    for valid in ["direct", "smm", "gemm", "winograd"]:
        assert valid in msg, msg


def test_unknown_linear_algorithm():
    net, _ = net_and_input()
    with pytest.raises(ai3.AlgorithmError, match="gemm"):
        ai3.convert(net, {"linear": "smm"})


def test_torch_in_swap_keeps_original_module_object():
    net, x = net_and_input()
    expected = reference(net, x)
    first, mid, last = net.c_first, net.c_mid, net.c_last
    ai3.swap_conv2d(net, ["torch", "direct", "torch"])
    assert net.c_first is first
    assert net.c_last is last
    assert net.c_mid is not mid and isinstance(net.c_mid, swap.Conv2d)
    assert net.c_mid.weight is mid.weight
    assert_close(net(x), expected)


def test_torch_everywhere_in_swap_changes_nothing():
    net, _ = net_and_input()
    before = list(net.modules())
    ai3.swap_conv2d(net, "torch")
    assert list(net.modules()) == before


@pytest.mark.parametrize("selector", ["torch", ["direct", "torch", "smm"], lambda m: "torch"])
def test_torch_in_convert_is_an_error(selector):
    net, _ = net_and_input()
    with pytest.raises(ai3.SelectorError, match="torch"):
        ai3.convert(net, {"conv2d": selector})


@pytest.mark.parametrize("key", ["conv2d", nn.Conv2d, "Conv2d", "conv_2d"], ids=str)
def test_op_given_as_type_or_name_convert(key):
    net, x = net_and_input()
    model = ai3.convert(net, {key: "smm"})
    assert conv_algorithms_of_model(model) == ["smm"] * 3
    assert_close(model(x), reference(net, x))


@pytest.mark.parametrize("op", ["conv2d", nn.Conv2d], ids=str)
def test_op_given_as_type_or_name_swap(op):
    net, x = net_and_input()
    expected = reference(net, x)
    ai3.swap_operation(op, net, "gemm")
    assert conv_algorithms_of_swapped(net) == ["gemm"] * 3
    assert_close(net(x), expected)


@pytest.mark.parametrize("key", ["groupnorm", nn.GroupNorm, 3], ids=str)
def test_unknown_operation_key(key):
    net, _ = net_and_input()
    with pytest.raises(ai3.SelectorError):
        ai3.convert(net, {key: "direct"})


def test_algos_must_be_a_mapping():
    net, _ = net_and_input()
    with pytest.raises(ai3.SelectorError):
        ai3.convert(net, ["direct", "smm", "gemm"])


def test_swap_with_builds_replacement():
    net, x = net_and_input()
    expected = reference(net, x)
    calls = []

    def build(orig, algorithm):
        calls.append((type(orig).__name__, algorithm))
        return swap.Conv2d(orig, algorithm)

    ai3.swap_conv2d(net, ["smm", "direct", "gemm"], swap_with=build)
    assert calls == [("Conv2d", "smm"), ("Conv2d", "direct"), ("Conv2d", "gemm")]
    assert_close(net(x), expected)


def test_swap_module_that_is_itself_the_op():
    conv = nn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 6, 6)
    expected = reference(conv, x)
    out = ai3.swap_conv2d(conv, "direct")
    assert isinstance(out, swap.Conv2d)
    assert_close(out(x), expected)


def test_default_algorithm_resolves_in_summary():
    net, _ = net_and_input()
    model = ai3.convert(net)
    names = conv_algorithms_of_model(model)
    assert all(n in ai3.SUPPORTED_ALGORITHMS["conv2d"] for n in names), names
    assert "default" not in names
    # README's table: 'default' is direct for convolutions with fewer than 16
    # input channels (all three here), except float32 layers without groups
    # that gemm runs on register tiles (a CPU with AVX2 or AVX-512); gemm for
    # linear, direct for the others. The ReLUs are fused into the convolutions
    # before them.
    thin = "gemm" if ai3.cpu_isa() in ("avx2", "avx512") else "direct"
    by_op = {r["op"]: r["algorithm"] for r in model.summary(INPUT_SHAPE)}
    assert by_op == {"conv2d": thin, "flatten": "direct", "linear": "gemm"}
    assert conv_algorithms_of_model(ai3.convert(net.double())) == ["direct"] * 3
    # With enough channels, 'default' is winograd on 3x3 stride-1 layers and
    # gemm on the rest; thin 3x3 stride-1 layers go to direct (in float32
    # with AVX2 on channel blocks, else the tiles where the CPU has them).
    wide = nn.Sequential(
        nn.Conv2d(96, 128, 3, padding=1), nn.Conv2d(128, 16, 3, stride=2), nn.Conv2d(16, 16, 3)
    )
    algos = conv_algorithms_of_model(ai3.convert(wide), (1, 96, 16, 16))
    # Where the CPU has them (AVX2), the strided 3x3 layer goes to direct's
    # channel blocks too.
    strided = "direct" if ai3.cpu_isa() in ("avx2", "avx512") else "gemm"
    assert algos == ["winograd", strided, "direct"]
    # At most 32 outputs: direct's channel blocks beat Winograd on fewer
    # than 16 tiles (a 5x5 plane), Winograd's channel blocks take DenseNet's
    # 128 -> 32 layers from 7x7 on; with more outputs Winograd stays.
    dense = ai3.convert(nn.Sequential(nn.Conv2d(128, 32, 3, padding=1)))
    blocked = ai3.cpu_isa() in ("avx2", "avx512")
    if blocked:
        assert conv_algorithms_of_model(dense, (1, 128, 5, 5)) == ["direct"]
    assert conv_algorithms_of_model(dense, (1, 128, 14, 14)) == ["winograd"]
    assert conv_algorithms_of_model(dense, (1, 128, 56, 56)) == ["winograd"]
    wider = ai3.convert(nn.Sequential(nn.Conv2d(128, 40, 3, padding=1)))
    assert conv_algorithms_of_model(wider, (1, 128, 14, 14)) == ["winograd"]
    # Winograd needs 16 output tiles of 2x2 over the batch (a 7x7 plane):
    # not a 5x5 one at batch 1, but at batch 2.
    algos = conv_algorithms_of_model(ai3.convert(wide), (1, 96, 13, 13))
    assert algos[0] == "winograd"
    one = ai3.convert(nn.Sequential(nn.Conv2d(96, 128, 3, padding=1)))
    assert conv_algorithms_of_model(one, (1, 96, 5, 5)) != ["winograd"]
    assert conv_algorithms_of_model(one, (2, 96, 5, 5)) == ["winograd"]
    # Fewer than 48 input channels: not Winograd, however wide the output,
    # unless Winograd's channel blocks take the layer (at least 16 inputs
    # and 128 tiles of 2x2).
    for c in (16, 24, 32):
        thin_in = ai3.convert(nn.Sequential(nn.Conv2d(c, 256, 3, padding=1)))
        assert conv_algorithms_of_model(thin_in, (1, c, 14, 14)) != ["winograd"]
        assert (conv_algorithms_of_model(thin_in, (1, c, 28, 28)) == ["winograd"]) == blocked
    thin_in = ai3.convert(nn.Sequential(nn.Conv2d(8, 256, 3, padding=1)))
    assert conv_algorithms_of_model(thin_in, (1, 8, 28, 28)) != ["winograd"]


def test_summary_reports_every_layer():
    net, x = net_and_input()
    model = ai3.convert(net, {"conv2d": ["direct", "smm", "gemm"]}, INPUT_SHAPE)
    rows = model.summary()
    # The two ReLUs are fused into the convolutions that feed them.
    assert [(r["op"], r["fused"]) for r in rows] == [
        ("conv2d", "relu"),
        ("conv2d", "relu"),
        ("conv2d", None),
        ("flatten", None),
        ("linear", None),
    ]
    assert set(rows[0]) >= {"name", "op", "algorithm", "input_shapes", "output_shape", "fused"}
    convs = [r for r in rows if r["op"] == "conv2d"]
    assert [list(r["input_shapes"][0]) for r in convs] == [list(s) for s in CONV_INPUTS]
    assert [r["algorithm"] for r in convs] == ["direct", "smm", "gemm"]
    assert list(rows[-1]["output_shape"]) == list(reference(net, x).shape)
    # summary for another shape gives that shape's dims
    rows4 = model.summary((4, 3, 8, 8))
    assert list(rows4[-1]["output_shape"]) == [4, 5]
    text = repr(model)
    for algo in ("direct", "smm", "gemm"):
        assert algo in text


def test_summary_without_shape_is_an_error():
    model = ai3.convert(ThreeConvs())
    with pytest.raises(ValueError):
        model.summary()
    assert "conv2d" in repr(model)


def test_registry_constants():
    assert set(ai3.SUPPORTED_ALGORITHMS["conv2d"]) >= {"direct", "smm", "gemm", "winograd"}
    assert "gemm" in ai3.SUPPORTED_ALGORITHMS["linear"]
    for op in ("relu", "maxpool2d", "avgpool2d", "adaptiveavgpool2d", "flatten"):
        assert "direct" in ai3.SUPPORTED_ALGORITHMS[op]
    assert set(ai3.DEFAULT_ALGOS) == set(ai3.SUPPORTED_ALGORITHMS)
    assert all(v == "default" for v in ai3.DEFAULT_ALGOS.values())
    assert ai3.using_cudnn() is False
    assert ai3.using_cublas() is False
    assert ai3.using_sycl() is False
    assert ai3.using_mps_and_metal() is False
    assert isinstance(ai3.__version__, str) and ai3.__version__
    assert ai3.swap_backend is ai3.convert


def test_selectors_do_not_mutate_original_in_convert():
    net, x = net_and_input()
    snapshot = copy.deepcopy(net.state_dict())
    ai3.convert(net, {"conv2d": "smm"})
    for k, v in net.state_dict().items():
        assert torch.equal(v, snapshot[k])
    assert all(type(m).__module__.startswith("torch") for m in net.modules() if m is not net)


class _Reused(nn.Module):
    """One conv module called twice, then a second conv."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Conv2d(4, 4, 3, padding=1)
        self.last = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        return self.last(self.shared(self.shared(x)))


def test_reused_module_takes_one_list_entry_in_convert_and_swap():
    net = _Reused().eval()
    x = torch.randn(1, 4, 8, 8)
    expected = net(x)
    model = ai3.convert(net, {"conv2d": ["winograd", "smm"]})
    rows = model.summary(tuple(x.shape))
    assert [r["name"] for r in rows] == ["shared", "shared", "last"]
    assert [r["algorithm"] for r in rows] == ["winograd", "winograd", "smm"]
    torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)
    ai3.swap_conv2d(net, ["winograd", "smm"])
    assert (net.shared.algorithm, net.last.algorithm) == ("winograd", "smm")
    torch.testing.assert_close(net(x), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["implicit gemm", "implicit precomp gemm", "winograd nonfused",
                                  "fft tiling", "guess", "find"])  # fmt: skip
def test_cudnn_algorithms_are_named_and_say_they_need_a_gpu(name):
    assert name in ai3.SUPPORTED_ALGORITHMS["conv2d"]
    assert not ai3.using_cudnn()
    row = next(r for r in ai3.algorithm_table() if r["algorithm"] == name)
    assert row["device"] == "cuda" and "no CUDA backend" in row["unavailable"]
    net = nn.Sequential(nn.Conv2d(3, 4, 3))
    with pytest.raises(
        ai3.AlgorithmError, match=f"conv2d.*'{name}' runs on cuda only.*runs on the cpu"
    ):
        ai3.convert(net, {"conv2d": name})
    with pytest.raises(ai3.AlgorithmError, match=f"'{name}' runs on cuda only"):
        ai3.swap_conv2d(net, name)
