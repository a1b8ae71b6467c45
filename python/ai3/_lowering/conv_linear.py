"""Convolution, linear layers and matrix products: ``nn.Conv2d``,
``nn.Linear``, ``F.conv2d``, ``F.linear`` (their functions' weights constants
or graph values), and ``torch.matmul`` / ``@`` / ``torch.bmm``."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import _layers as L
from .calls import Sig, Unsupported, as_int
from .lowerer import In, Lowerer
from .registry import register


def _conv(lw: Lowerer, n, inputs, w, bias, s: L.ConvSpec, module=None) -> None:
    params = {
        "weight": w,
        "bias": bias,
        "stride": s.stride,
        "padding": s.padding,
        "dilation": s.dilation,
        "groups": s.groups,
        "padding_mode": s.padding_mode,
    }
    lw.step(n, "conv2d", inputs, params, module)


def _conv_module(lw: Lowerer, n, m: nn.Conv2d, x) -> None:
    s = L.conv_spec_of(m)
    _conv(lw, n, [x], m.weight, m.bias, s, m)


def _linear_module(lw: Lowerer, n, m: nn.Linear, x) -> None:
    lw.step(n, "linear", [x], {"weight": m.weight, "bias": m.bias}, m)


_CONV = Sig(
    "input, weight, bias, stride, padding, dilation, groups",
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
)


def _conv_fn(lw: Lowerer, n) -> None:
    """``F.conv2d`` / ``torch.conv2d``: weight and bias constants or graph values."""
    b = _CONV.bind(n)
    inputs, (w, bias) = lw.weight_args(b["input"], b["weight"], b["bias"])
    if isinstance(w, In) and b["padding"] == "same":
        raise Unsupported("padding='same' with a weight known only at run time")
    s = L.conv_spec(
        w if isinstance(w, torch.Tensor) else None,
        b["stride"],
        b["padding"],
        b["dilation"],
        as_int("groups", b["groups"]),
    )
    _conv(lw, n, inputs, w, bias, s)  # padding_mode="zeros"


_LINEAR = Sig("input, weight, bias", bias=None)


def _linear_fn(lw: Lowerer, n) -> None:
    b = _LINEAR.bind(n)
    inputs, (w, bias) = lw.weight_args(b["input"], b["weight"], b["bias"])
    lw.step(n, "linear", inputs, {"weight": w, "bias": bias})


_ADDMM = Sig("input, mat1, mat2, *, beta, alpha", beta=1, alpha=1, fixed="beta alpha")


def _addmm(lw: Lowerer, n) -> None:
    """``aten.addmm(bias, x, w)`` = ``x @ w + bias``, as exported graphs record a
    linear layer stored transposed (GPT-2's ``Conv1D``): a ``linear`` node
    holding ``w`` transposed once, when ``w`` and ``bias`` are the module's."""
    b = _ADDMM.bind(n)
    bias, w = lw.const_tensor(lw.resolve(b["input"])), lw.const_tensor(lw.resolve(b["mat2"]))
    if w.dim() != 2 or bias.dim() != 1 or bias.shape[0] != w.shape[1]:
        raise Unsupported(
            f"addmm of a {list(w.shape)} matrix with a bias of shape {list(bias.shape)} "
            "(ai3 takes a 2-D weight and a 1-D bias of its columns)"
        )
    lw.step(n, "linear", [b["mat1"]], {"weight": w.t(), "bias": bias})


def _matmul(sig: Sig, a: str, b: str) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        bound = sig.bind(n)
        lw.step(n, "matmul", [bound[a], bound[b]])

    return handler


_MATMUL = _matmul(Sig("input, other, *, out", out=None, fixed="out"), "input", "other")
_BMM = _matmul(Sig("input, mat2, *, out", out=None, fixed="out"), "input", "mat2")

register(
    modules={nn.Conv2d: _conv_module, nn.Linear: _linear_module},
    # F.conv2d is torch.conv2d.
    functions={
        torch.conv2d: _conv_fn,
        F.linear: _linear_fn,
        torch.matmul: _MATMUL,
        torch.bmm: _BMM,
        operator.matmul: _matmul(Sig("a, b"), "a", "b"),
    },
    methods={"matmul": _MATMUL, "bmm": _BMM},
)

aten = torch.ops.aten
register(
    functions={
        aten.conv2d.default: _conv_fn,
        aten.linear.default: _linear_fn,
        aten.addmm.default: _addmm,
        aten.matmul.default: _MATMUL,
        aten.bmm.default: _BMM,
    }
)
