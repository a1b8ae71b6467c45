"""Symbolic sizes: ``x.size(1)``, ``x.shape[0] // 2`` and friends, as fx
records them, become expressions the Rust side evaluates on each call, so a
converted model keeps working when the batch or image size changes."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch.fx


@dataclass(frozen=True)
class Dim:
    """Dimension ``axis`` of the tensor produced by ``node``."""

    node: torch.fx.Node
    axis: int


@dataclass(frozen=True)
class Const:
    """A plain integer."""

    value: int


@dataclass(frozen=True)
class BinOp:
    """``a <op> b`` on sizes; op is 'add', 'sub', 'mul' or 'floordiv'."""

    op: str
    a: Any
    b: Any


@dataclass(frozen=True)
class ShapeOf:
    """The whole shape of ``node`` (``x.size()`` / ``x.shape``)."""

    node: torch.fx.Node


@dataclass(frozen=True)
class ShapeFact:
    """A fact about shapes that only a shape assertion reads: a rank
    (``x.dim()``) or a comparison of sizes (``h == 224``)."""

    node: torch.fx.Node


SizeExpr = Dim | Const | BinOp

#: Python operators fx records on sizes, and their names on the Rust side.
OPERATORS = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.floordiv: "floordiv",
}


def as_size(v: Any) -> SizeExpr | None:
    """``v`` as a size expression, or None if it is not one."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return Const(v)
    if isinstance(v, Dim | Const | BinOp):
        return v
    return None


def encode(e: SizeExpr, index_of: dict[torch.fx.Node, int]) -> tuple:
    """The nested-tuple form of ``reshape``'s ``shape`` parameter; ``index_of`` numbers the
    tensors the expression reads (0 is the reshaped tensor itself)."""
    if isinstance(e, Const):
        return ("const", e.value)
    if isinstance(e, Dim):
        return ("dim", index_of[e.node], e.axis)
    return (e.op, encode(e.a, index_of), encode(e.b, index_of))


def nodes_of(e: SizeExpr) -> list[torch.fx.Node]:
    """Tensors an expression reads, in first-use order."""
    if isinstance(e, Dim):
        return [e.node]
    if isinstance(e, BinOp):
        return [*nodes_of(e.a), *(n for n in nodes_of(e.b) if n not in nodes_of(e.a))]
    return []
