"""Activations (ReLU and its kin, sigmoid, tanh, GELU, ...) as modules,
functions and tensor methods, in place or not; softmax; and L2 normalisation
(``F.normalize``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .calls import INPUT, Sig, Unsupported, as_bool, as_float, as_int
from .lowerer import Lowerer
from .registry import register


def _gelu_approximate(approximate: Any) -> dict[str, Any]:
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate={approximate!r} (PyTorch takes 'none' or 'tanh')")
    return {"approximate": approximate}


def _hardtanh_params(min_val: Any, max_val: Any) -> dict[str, Any]:
    return {"min_val": as_float("min_val", min_val), "max_val": as_float("max_val", max_val)}


def _act_module(
    kind: str, params: Callable[[nn.Module], dict[str, Any]] = lambda m: {}
) -> Callable:
    def handler(lw: Lowerer, n, m, x) -> None:
        inplace = as_bool("inplace", getattr(m, "inplace", False))
        lw.step(n, kind, [x], params(m), module=m, inplace=inplace)

    return handler


def _act_fn(kind: str, sig: Sig = INPUT, params=lambda b: {}, inplace=False) -> Callable:
    """An activation: ``inplace`` for ``x.relu_()``-like calls, else read from the
    call's ``inplace`` argument when it has one."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        changes = inplace or as_bool("inplace", b.get("inplace", False))
        lw.step(n, kind, [b["input"]], params(b), inplace=changes)

    return handler


#: ``F.relu(input, inplace=False)`` and the other activations with an ``inplace`` flag.
_INPLACE = Sig("input, inplace", inplace=False)
#: ``torch.sigmoid`` / ``torch.tanh``: ai3 does not write into an ``out`` tensor.
_OUT = Sig("input, *, out", out=None, fixed="out")


def _softmax_module(lw: Lowerer, n, m: nn.Softmax, x) -> None:
    if m.dim is None:
        raise Unsupported("Softmax without dim")
    lw.unary(n, x, "softmax", module=m, dim=as_int("dim", m.dim))


def _softmax_fn(sig: Sig) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        if b["dim"] is None:
            raise Unsupported("softmax without dim (PyTorch's implicit choice is deprecated)")
        lw.unary(n, b["input"], "softmax", dim=as_int("dim", b["dim"]))

    return handler


#: ``torch.softmax(input, dim, dtype=None)`` and ``x.softmax(dim, dtype=None)``.
_softmax = _softmax_fn(Sig("input, dim, dtype", dtype=None, fixed="dtype"))


_NORMALIZE = Sig("input, p, dim, eps, out", p=2.0, dim=1, eps=1e-12, out=None, fixed="out")


def _normalize(lw: Lowerer, n) -> None:
    """``F.normalize`` with the L2 norm (``p=2``)."""
    b = _NORMALIZE.bind(n)
    if as_float("p", b["p"]) != 2.0:
        raise Unsupported(f"p={b['p']!r} (ai3 normalises by the L2 norm, p=2)")
    params = {"dim": as_int("dim", b["dim"]), "eps": as_float("eps", b["eps"])}
    lw.step(n, "normalize", [b["input"]], params)


register(
    modules={
        nn.Softmax: _softmax_module,
        nn.ReLU: _act_module("relu"),
        nn.ReLU6: _act_module("relu6"),
        nn.Hardtanh: _act_module("hardtanh", lambda m: _hardtanh_params(m.min_val, m.max_val)),
        nn.Hardswish: _act_module("hardswish"),
        nn.Hardsigmoid: _act_module("hardsigmoid"),
        nn.SiLU: _act_module("silu"),
        nn.Sigmoid: _act_module("sigmoid"),
        nn.Tanh: _act_module("tanh"),
        nn.GELU: _act_module("gelu", lambda m: _gelu_approximate(m.approximate)),
    },
    functions={
        torch.relu: _act_fn("relu"),
        torch.relu_: _act_fn("relu", inplace=True),
        F.relu: _act_fn("relu", _INPLACE),
        F.relu_: _act_fn("relu", inplace=True),
        F.relu6: _act_fn("relu6", _INPLACE),
        F.hardtanh: _act_fn(
            "hardtanh",
            Sig("input, min_val, max_val, inplace", min_val=-1.0, max_val=1.0, inplace=False),
            lambda b: _hardtanh_params(b["min_val"], b["max_val"]),
        ),
        F.hardswish: _act_fn("hardswish", _INPLACE),
        F.hardsigmoid: _act_fn("hardsigmoid", _INPLACE),
        F.silu: _act_fn("silu", _INPLACE),
        torch.sigmoid: _act_fn("sigmoid", _OUT),
        F.sigmoid: _act_fn("sigmoid"),
        torch.tanh: _act_fn("tanh", _OUT),
        F.tanh: _act_fn("tanh"),
        F.gelu: _act_fn(
            "gelu",
            Sig("input, approximate", approximate="none"),
            lambda b: _gelu_approximate(b["approximate"]),
        ),
        F.softmax: _softmax_fn(
            Sig(
                "input, dim, _stacklevel, dtype", dim=None, _stacklevel=3, dtype=None, fixed="dtype"
            )
        ),
        torch.softmax: _softmax,
        F.normalize: _normalize,
    },
    methods={
        "relu": _act_fn("relu"),
        "relu_": _act_fn("relu", inplace=True),
        "sigmoid": _act_fn("sigmoid"),
        "sigmoid_": _act_fn("sigmoid", inplace=True),
        "tanh": _act_fn("tanh"),
        "tanh_": _act_fn("tanh", inplace=True),
        "softmax": _softmax,
    },
)

#: The same operations as ATen records them in graphs captured by torch.export.
aten = torch.ops.aten
_GELU = Sig("input, approximate", approximate="none")
register(
    functions={
        aten.relu.default: _act_fn("relu"),
        aten.relu_.default: _act_fn("relu", inplace=True),
        aten.hardtanh.default: _act_fn(
            "hardtanh",
            Sig("input, min_val, max_val", min_val=-1.0, max_val=1.0),
            lambda b: _hardtanh_params(b["min_val"], b["max_val"]),
        ),
        aten.hardswish.default: _act_fn("hardswish"),
        aten.hardsigmoid.default: _act_fn("hardsigmoid"),
        aten.silu.default: _act_fn("silu"),
        aten.sigmoid.default: _act_fn("sigmoid"),
        aten.tanh.default: _act_fn("tanh"),
        aten.gelu.default: _act_fn("gelu", _GELU, lambda b: _gelu_approximate(b["approximate"])),
        aten.softmax.int: _softmax,
        aten._softmax.default: _softmax_fn(
            Sig("input, dim, half_to_float", half_to_float=False, fixed="half_to_float")
        ),
    }
)
