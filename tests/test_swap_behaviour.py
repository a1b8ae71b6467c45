"""Swapped modules behave like PyTorch's: they expose the hyperparameters and
repr of the module they replaced."""

from __future__ import annotations

import copy

import ai3
import pytest
import torch
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
