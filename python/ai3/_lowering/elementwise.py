"""Elementwise arithmetic and concatenation: ``+ - * /`` (operators,
``torch.add`` and friends, tensor methods) on two tensors or a tensor and a
number, the same operators (and ``//``) on symbolic sizes, and ``torch.cat``."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from .. import _sizes as S
from .calls import Sig, Unsupported, as_int
from .lowerer import Lowerer
from .registry import register

_BINARY_NAMES = {
    operator.add: "add",
    torch.add: "add",
    operator.sub: "sub",
    torch.sub: "sub",
    operator.mul: "mul",
    torch.mul: "mul",
    operator.truediv: "div",
    torch.div: "div",
}


def _binary(lw: Lowerer, n, kind: str, a: Any, b: Any) -> None:
    ta, tb = lw.is_value(a), lw.is_value(b)
    if ta and tb:
        lw.step(n, kind, [a, b])
    elif ta or tb:
        scalar = b if ta else a
        if isinstance(scalar, bool) or not isinstance(scalar, int | float):
            raise Unsupported(f"operand {scalar!r} is neither a tensor nor a number")
        lw.step(n, kind, [a if ta else b], {"scalar": float(scalar), "scalar_first": not ta})
    elif kind in ("add", "sub", "mul"):
        name = S.OPERATORS.get(n.target, kind)
        lw.kind[n] = S.BinOp(name, lw.size(a), lw.size(b))
    else:
        raise Unsupported("arithmetic on non-tensors")


#: Python's operators on tensors or sizes: two operands, nothing else.
_OPERATOR = Sig("a, b")
_ALPHA_OUT = Sig("input, other, *, alpha, out", alpha=1, out=None, fixed="alpha out")
#: ``torch.add`` / ``torch.sub`` / ``torch.mul`` / ``torch.div``: ai3 implements none
#: of their options (``alpha`` other than 1, a ``rounding_mode``, ``out``).
_TORCH_BINARY = {
    torch.add: _ALPHA_OUT,
    torch.sub: _ALPHA_OUT,
    torch.mul: Sig("input, other, *, out", out=None, fixed="out"),
    torch.div: Sig(
        "input, other, *, rounding_mode, out",
        rounding_mode=None,
        out=None,
        fixed="rounding_mode out",
    ),
}


def _binary_fn(lw: Lowerer, n) -> None:
    sig = _TORCH_BINARY.get(n.target)
    if sig is None:
        b = _OPERATOR.bind(n)
        a, other = b["a"], b["b"]
    else:
        b = sig.bind(n)
        a, other = b["input"], b["other"]
    if n.target is operator.floordiv:
        if lw.is_value(a) or lw.is_value(other):
            raise Unsupported("floor division of tensors")
        lw.kind[n] = S.BinOp("floordiv", lw.size(a), lw.size(other))
        return
    _binary(lw, n, _BINARY_NAMES[n.target], a, other)


#: ``x.add(y)`` and friends: the tensor methods' options, as for the functions.
_ALPHA = Sig("input, other, *, alpha", alpha=1, fixed="alpha")
_METHOD_BINARY = {
    "add": _ALPHA,
    "sub": _ALPHA,
    "mul": Sig("input, other"),
    "div": Sig("input, other, *, rounding_mode", rounding_mode=None, fixed="rounding_mode"),
}


def _binary_method(kind: str) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = _METHOD_BINARY[kind].bind(n)
        _binary(lw, n, kind, b["input"], b["other"])

    return handler


_CAT = Sig("tensors, dim, *, out", dim=0, out=None, fixed="out")


def _cat_fn(lw: Lowerer, n) -> None:
    b = _CAT.bind(n)
    parts = b["tensors"]
    if not isinstance(parts, list | tuple):
        raise Unsupported(f"tensors={parts!r}: expected a list or tuple of tensors")
    lw.step(n, "cat", list(parts), {"dim": as_int("dim", b["dim"])})


register(
    functions={
        torch.cat: _cat_fn,
        torch.concat: _cat_fn,
        operator.floordiv: _binary_fn,
        **{f: _binary_fn for f in _BINARY_NAMES},
    },
    methods={kind: _binary_method(kind) for kind in _METHOD_BINARY},
)

_POW = Sig("input, exponent")


def _pow(lw: Lowerer, n) -> None:
    """``x ** k`` for a whole exponent ``k`` from 1 to 4 (GPT-2's ``x ** 3`` in
    its GELU), as a chain of products; other exponents are unsupported."""
    b = _POW.bind(n)
    x, k = b["input"], b["exponent"]
    if isinstance(k, float) and k.is_integer():
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 4:
        raise Unsupported(f"exponent={k!r} (ai3 raises to a whole power from 1 to 4)")
    if k == 1:
        lw.alias(n, x, same=False)
        return
    # x**2 = x*x; x**3 = (x*x)*x; x**4 = (x*x)*(x*x): the last step computes n.
    square = n if k == 2 else lw.partial(n, "square")
    lw.step(square, "mul", [x, x])
    if k == 3:
        lw.step(n, "mul", [square, x])
    elif k == 4:
        lw.step(n, "mul", [square, square])


#: The same operations as ATen records them in graphs captured by torch.export.
aten = torch.ops.aten
register(
    functions={
        **{
            getattr(aten, kind).Tensor: _binary_method(kind)
            for kind in ("add", "sub", "mul", "div")
        },
        **{
            getattr(aten, kind).Scalar: _binary_method(kind)
            for kind in ("add", "sub", "mul", "div")
        },
        aten.pow.Tensor_Scalar: _pow,
        aten.cat.default: _cat_fn,
    }
)
