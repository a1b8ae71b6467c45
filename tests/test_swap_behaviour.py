"""Swapped modules behave like PyTorch's: re-swapping applies the new choice
(``'torch'`` gives back the plain module), they expose the hyperparameters and
repr of the module they replaced, ``convert`` accepts networks holding them,
and an in-place ReLU still changes its input."""

from __future__ import annotations

import copy

import ai3
import pytest
import torch
import torch.nn.functional as F
from ai3 import swap
from conftest import assert_close, reference
from torch import nn

#: One layer per swappable operation, with non-default hyperparameters, its
#: input shape, and two algorithms to swap between.
LAYERS = {
    "conv2d": (lambda: nn.Conv2d(4, 6, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
               (2, 4, 9, 10), ("direct", "smm")),
    "conv2d_same_reflect": (lambda: nn.Conv2d(3, 5, (4, 3), padding="same", padding_mode="reflect",
                                              dilation=(2, 1), bias=False),
                            (2, 3, 11, 9), ("gemm", "direct")),
    "conv2d_circular": (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"),
                        (1, 3, 7, 7), ("winograd", "smm")),
    "linear": (lambda: nn.Linear(6, 4), (2, 3, 6), ("gemm", "default")),
    "linear_nobias": (lambda: nn.Linear(6, 4, bias=False), (5, 6), ("default", "gemm")),
    "relu": (lambda: nn.ReLU(), (2, 3, 5, 4), ("direct", "default")),
    "relu_inplace": (lambda: nn.ReLU(inplace=True), (2, 3, 5, 4), ("default", "direct")),
    "maxpool2d": (lambda: nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True),
                  (2, 3, 11, 10), ("direct", "default")),
    "avgpool2d": (lambda: nn.AvgPool2d((3, 2), 2, (1, 0), ceil_mode=True, count_include_pad=False,
                                       divisor_override=5),
                  (2, 3, 9, 8), ("direct", "default")),
    "adaptiveavgpool2d": (lambda: nn.AdaptiveAvgPool2d((None, 3)), (2, 3, 7, 8),
                          ("direct", "default")),
    "flatten": (lambda: nn.Flatten(1, 2), (2, 3, 5, 4), ("direct", "default")),
}  # fmt: skip

#: Attributes every nn.Module has; the rest of a layer's ``vars`` are its hyperparameters.
_INTERNALS = set(vars(nn.Module()))


def _hyperparameters(m: nn.Module) -> dict:
    return {k: v for k, v in vars(m).items() if k not in _INTERNALS and not k.startswith("_")}


def _op(case: str) -> str:
    return case.split("_")[0]


def _layer(case: str):
    make, shape, algos = LAYERS[case]
    torch.manual_seed(0)
    layer = make().double()
    return layer, torch.randn(shape, dtype=torch.float64), algos


# ---- 1. re-swapping ----------------------------------------------------------------------


@pytest.mark.parametrize("case", list(LAYERS))
def test_reswap_applies_new_algorithm(case):
    layer, x, (first, second) = _layer(case)
    expected = reference(layer, x)
    net = nn.Sequential(layer)
    params = list(layer.parameters())
    ai3.swap_operation(_op(case), net, first)
    assert net[0].algorithm == first
    ai3.swap_operation(_op(case), net, second)
    assert swap.is_swapped(net[0]) and net[0].algorithm == second
    assert all(a is b for a, b in zip(net[0].parameters(), params, strict=True))
    assert_close(net(x), expected)


@pytest.mark.parametrize("case", list(LAYERS))
def test_torch_restores_the_plain_module(case):
    layer, x, (first, second) = _layer(case)
    expected = reference(layer, x)
    net = nn.Sequential(copy.deepcopy(layer))
    params = dict(net[0].named_parameters())
    ai3.swap_operation(_op(case), net, first)
    ai3.swap_operation(_op(case), net, second)
    ai3.swap_operation(_op(case), net, "torch")
    plain = net[0]
    assert type(plain) is type(layer)
    assert vars(plain).keys() == vars(layer).keys()
    for k in vars(layer).keys() - _INTERNALS:
        assert getattr(plain, k) == getattr(layer, k), k
    assert dict(plain.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in plain.named_parameters())
    if "bias" in layer._parameters:
        assert (plain.bias is None) == (layer.bias is None)
    assert repr(plain) == repr(layer)
    with torch.no_grad():
        assert torch.equal(net(x.clone()), expected)


def test_reswap_keeps_optimizer_working():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    ref = ref.double()
    net = copy.deepcopy(ref)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    target = torch.randn(2, 2, dtype=torch.float64)
    ai3.swap_conv2d(net, "direct")
    ai3.swap_linear(net, "gemm")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for algo in ["smm", "winograd", "torch"]:
        ai3.swap_conv2d(net, algo)  # the optimizer still holds the live Parameters
        for model, o in ((net, opt), (ref, opt_ref)):
            o.zero_grad()
            F.mse_loss(model(x), target).backward()
            o.step()
    assert type(net[0]) is nn.Conv2d
    for (name, p), q in zip(net.named_parameters(), ref.parameters(), strict=True):
        assert_close(p.detach(), q.detach()), name
    assert_close(net(x), reference(ref, x))


class _OutOfOrder(nn.Module):
    """Convs registered in an order different from the forward order."""

    def __init__(self):
        super().__init__()
        self.c_last = nn.Conv2d(8, 4, 1)
        self.c_first = nn.Conv2d(3, 6, 3, padding=1)
        self.c_mid = nn.Conv2d(6, 8, 3, stride=2)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.c_last(self.act(self.c_mid(self.act(self.c_first(x)))))

    def convs(self):
        return [self.c_first, self.c_mid, self.c_last]


def _algos(net: _OutOfOrder) -> list[str]:
    return [m.algorithm if swap.is_swapped(m) else "torch" for m in net.convs()]


def test_list_selector_counts_swapped_layers_in_forward_order():
    net = _OutOfOrder()
    x = torch.randn(2, 3, 8, 8)
    expected = reference(net, x)
    ai3.swap_conv2d(net, ["torch", "direct", "torch"])
    assert _algos(net) == ["torch", "direct", "torch"]
    ai3.swap_conv2d(net, ["winograd", "smm", "gemm"])
    assert _algos(net) == ["winograd", "smm", "gemm"]
    ai3.swap_conv2d(net, ["torch", "direct", "torch"])
    assert _algos(net) == ["torch", "direct", "torch"]
    assert type(net.c_first) is nn.Conv2d and type(net.c_last) is nn.Conv2d
    assert_close(net(x), expected)


def test_forward_order_is_found_when_other_layers_are_swapped():
    """A swapped ReLU (whose forward fx cannot trace into) does not make the
    conv list fall back to registration order."""
    net = _OutOfOrder()
    ai3.swap_relu(net)
    ai3.swap_conv2d(net, ["direct", "smm", "gemm"])
    assert _algos(net) == ["direct", "smm", "gemm"]


def test_function_selector_sees_swapped_layers_with_their_attributes():
    net = _OutOfOrder()
    x = torch.randn(2, 3, 8, 8)
    expected = reference(net, x)
    ai3.swap_conv2d(net, "direct")
    seen = []

    def pick(m, shape):
        seen.append((m.in_channels, m.kernel_size, shape))
        return "gemm" if m.kernel_size == (1, 1) else "smm"

    ai3.swap_conv2d(net, pick, sample_input_shape=(2, 3, 8, 8))
    assert seen == [(3, (3, 3), (2, 3, 8, 8)), (6, (3, 3), (2, 6, 8, 8)), (8, (1, 1), (2, 8, 3, 3))]
    assert _algos(net) == ["smm", "smm", "gemm"]
    assert_close(net(x), expected)


def test_reswap_with_unknown_algorithm_is_an_error_and_changes_nothing():
    net = _OutOfOrder()
    ai3.swap_conv2d(net, "direct")
    before = list(net.modules())
    with pytest.raises(ai3.AlgorithmError, match="conv2d"):
        ai3.swap_conv2d(net, "no-such-algorithm")
    assert list(net.modules()) == before


def test_reswap_with_same_algorithm_keeps_the_module():
    net = _OutOfOrder()
    ai3.swap_conv2d(net, "smm")
    mid = net.c_mid
    ai3.swap_conv2d(net, "smm")
    assert net.c_mid is mid


def test_swap_with_receives_the_plain_module_when_reswapping():
    net = _OutOfOrder()
    ai3.swap_conv2d(net, "direct")
    got = []

    def build(orig, algorithm):
        got.append(type(orig))
        return swap.Conv2d(orig, algorithm)

    ai3.swap_conv2d(net, "gemm", swap_with=build)
    assert got == [nn.Conv2d] * 3
    assert _algos(net) == ["gemm"] * 3


# ---- 2. attributes and repr --------------------------------------------------------------


@pytest.mark.parametrize("case", list(LAYERS))
def test_swapped_module_exposes_the_original_attributes(case):
    layer, _, (algo, _) = _layer(case)
    swapped = ai3.swap_operation(_op(case), copy.deepcopy(layer), algo)
    hyper = _hyperparameters(layer)
    assert hyper, "the layer has hyperparameters to compare"
    for k, v in hyper.items():
        got = getattr(swapped, k)
        assert got == v and type(got) is type(v), (k, got, v)
    for name, p in layer.named_parameters(recurse=False):
        assert torch.equal(getattr(swapped, name), p)
    if hasattr(layer, "bias"):
        assert (swapped.bias is None) == (layer.bias is None)


@pytest.mark.parametrize("case", list(LAYERS))
def test_swapped_repr_reads_like_pytorch(case):
    layer, _, (algo, _) = _layer(case)
    swapped = ai3.swap_operation(_op(case), copy.deepcopy(layer), algo)
    extra = layer.extra_repr()
    expected = f"{type(layer).__name__}({extra + ', ' if extra else ''}algorithm={algo!r})"
    assert repr(swapped) == expected


def test_conv_attributes_as_pytorch_gives_them():
    conv = nn.Conv2d(3, 16, 3, padding=1)
    swapped = ai3.swap_conv2d(conv, "direct")
    assert (swapped.in_channels, swapped.out_channels) == (3, 16)
    assert swapped.kernel_size == (3, 3) and swapped.stride == (1, 1)
    assert swapped.padding == conv.padding == (1, 1)
    assert swapped.dilation == (1, 1) and swapped.groups == 1
    assert swapped.padding_mode == "zeros"
    assert swapped.weight is conv.weight and swapped.bias is conv.bias
    assert repr(swapped) == repr(conv)[:-1] + ", algorithm='direct')"
    same = ai3.swap_conv2d(nn.Conv2d(3, 4, 4, padding="same"), "direct")
    assert same.padding == "same"


# ---- 3. convert after swap ---------------------------------------------------------------


class _Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 6, 3, padding="same", padding_mode="reflect", bias=False)
        self.avg = nn.AvgPool2d(2, count_include_pad=False)
        self.adapt = nn.AdaptiveAvgPool2d((3, 2))
        self.flat = nn.Flatten()
        self.fc = nn.Linear(6 * 3 * 2, 5)

    def forward(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.avg(self.relu(self.conv2(x)))
        return self.fc(self.flat(self.adapt(x)))


SHAPE = (2, 3, 16, 16)


def _rows(model: ai3.Model) -> dict[str, str]:
    s = model.summary(SHAPE)
    rows = s.rows if hasattr(s, "rows") else s
    return {r["name"]: r["algorithm"] for r in rows}


def _swapped_small():
    torch.manual_seed(0)
    ref = _Small().eval()
    net = copy.deepcopy(ref)
    ai3.swap_conv2d(net, ["smm", "gemm"])
    for op in ["relu", "maxpool2d", "avgpool2d", "adaptiveavgpool2d", "flatten"]:
        ai3.swap_operation(op, net, "direct")
    ai3.swap_linear(net, "gemm")
    return ref, net, torch.randn(SHAPE)


def test_convert_network_with_swapped_modules_keeps_their_algorithms():
    ref, net, x = _swapped_small()
    model = ai3.convert(net)
    assert_close(model(x), reference(ref, x))
    rows = _rows(model)
    assert rows["conv1"] == "smm" and rows["conv2"] == "gemm" and rows["fc"] == "gemm"
    assert rows["pool"] == rows["avg"] == rows["adapt"] == rows["flat"] == "direct"


def test_convert_mixes_swapped_and_plain_layers():
    torch.manual_seed(0)
    ref = _Small().eval()
    net = copy.deepcopy(ref)
    ai3.swap_conv2d(net, ["torch", "winograd"])
    x = torch.randn(SHAPE)
    model = ai3.convert(net, {"linear": "gemm"}, SHAPE)
    assert_close(model(x), reference(ref, x))
    rows = _rows(model)
    assert rows["conv2"] == "winograd"
    assert rows["conv1"] in ai3.SUPPORTED_ALGORITHMS["conv2d"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [("direct", ["direct", "direct"]), (["winograd", "direct"], ["winograd", "direct"])],
    ids=["name", "list"],
)
def test_convert_selector_naming_the_operation_wins(selector, expected):
    ref, net, x = _swapped_small()
    model = ai3.convert(net, {"conv2d": selector})
    assert_close(model(x), reference(ref, x))
    rows = _rows(model)
    assert [rows["conv1"], rows["conv2"]] == expected
    assert rows["fc"] == "gemm"  # linear was not named: the swapped choice stays


def test_convert_function_selector_with_shapes_on_swapped_network():
    ref, net, x = _swapped_small()
    seen = []

    def pick(m, shape):
        seen.append((m.out_channels, shape))
        return "direct"

    model = ai3.convert(net, {"conv2d": pick}, SHAPE)
    assert seen == [(8, (2, 3, 16, 16)), (6, (2, 8, 8, 8))]
    assert_close(model(x), reference(ref, x))


def test_convert_a_swapped_module_itself():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x = torch.randn(1, 3, 9, 9)
    expected = reference(conv, x)
    model = ai3.convert(ai3.swap_conv2d(copy.deepcopy(conv), "smm"))
    assert_close(model(x), expected)
    s = model.summary((1, 3, 9, 9))
    rows = s.rows if hasattr(s, "rows") else s
    assert [r["algorithm"] for r in rows] == ["smm"]


# ---- 4. return value ---------------------------------------------------------------------


def test_swap_returns_the_module_or_its_replacement():
    net = _OutOfOrder()
    assert ai3.swap_conv2d(net, "direct") is net
    conv = nn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 6, 6)
    expected = reference(conv, x)
    a = ai3.swap_conv2d(conv, "direct")
    assert isinstance(a, swap.Conv2d) and a.algorithm == "direct"
    b = ai3.swap_conv2d(a, "smm")
    assert isinstance(b, swap.Conv2d) and b.algorithm == "smm" and b.weight is conv.weight
    c = ai3.swap_conv2d(b, "torch")
    assert type(c) is nn.Conv2d and c.weight is conv.weight
    assert_close(b(x), expected)
    assert "return" in ai3.swap_operation.__doc__.lower()


# ---- 5. in-place ReLU ---------------------------------------------------------------------


class ReadsAgain(nn.Module):
    """Reads the input of an in-place ReLU again: PyTorch sees the ReLU's result there."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.conv(x)
        y = self.relu(h)
        return h + y


def _forward_backward(net: nn.Module, x: torch.Tensor):
    x = x.clone().requires_grad_(True)
    out = net(x)
    out.sum().backward()
    return out.detach(), x.grad, net.conv.weight.grad


def test_swapped_in_place_relu_changes_its_input():
    torch.manual_seed(0)
    net = ReadsAgain().double()
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    expected = _forward_backward(net, x)
    net.zero_grad(set_to_none=True)
    ai3.swap_relu(net)
    for got, want in zip(_forward_backward(net, x), expected, strict=True):
        assert_close(got, want)
    with torch.inference_mode():
        assert_close(net(x), expected[0])


def test_swapped_in_place_relu_compiles():
    torch._dynamo.reset()
    net = ReadsAgain()
    x = torch.randn(2, 3, 5, 5)
    expected = reference(net, x)
    ai3.swap_relu(net)
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert_close(compiled(x), expected)
