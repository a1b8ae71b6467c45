"""``torch.einsum`` as the ai3 operations it amounts to: each operand's
letters that nothing else reads summed out (``sum``), the operands
contracted pairwise, left to right, each pair as one batched ``matmul``
between ``permute`` / ``reshape`` steps that group its letters, and a final
``permute`` into the output's order.

A pair's letters fall in four groups: *batch* (in both operands and kept),
*contracted* (in both, summed), *left* and *right* (in one operand, kept).
The left operand is laid out ``[batch..., left, contracted]`` and the right
``[batch..., contracted, right]``, the groups merged into one dimension
each, so that their product is ``[batch..., left, right]``. Sizes are read
from the operands at run time, so a converted model follows its input's
sizes. An operand with a repeated letter (``'ii->i'``, a diagonal) is
unsupported; so is ``...`` where the operands' ranks are unknown (a graph
traced by torch.fx; torch.export records them).
"""

from __future__ import annotations

import string
from typing import Any

import torch
import torch.fx

from .. import _sizes as S
from .calls import Unsupported
from .lowerer import Lowerer
from .registry import register
from .shapes import _size_spec

_LETTERS = set(string.ascii_letters)


def _rank_of(n: Any) -> int | None:
    """The rank torch.export (``val``) or shape propagation recorded for ``n``."""
    if not isinstance(n, torch.fx.Node):
        return None
    val = n.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dim()
    meta = n.meta.get("tensor_meta")
    return len(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def parse(equation: str, ranks: list[int | None]) -> tuple[list[list[str]], list[str]]:
    """Each operand's letters and the output's; ``...`` becomes as many fresh
    symbols as the operand's rank leaves, aligned from the right as PyTorch
    broadcasts them. Raises :class:`Unsupported` for what ai3 cannot compute."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Unsupported(
            f"einsum {equation!r} names {len(terms)} operand(s) for {len(ranks)} given"
        )
    if rhs.count("...") > 1 or any(t.count("...") > 1 for t in terms):
        raise Unsupported(f"einsum {equation!r} has '...' more than once in a term")
    for t in [*terms, rhs]:
        bad = set(t.replace("...", "")) - _LETTERS
        if bad:
            raise Unsupported(f"einsum {equation!r}: {sorted(bad)} are not subscripts")
    widths = []
    for t, r in zip(terms, ranks, strict=True):
        named = len(t.replace("...", ""))
        if "..." not in t:
            widths.append(0)
            continue
        if r is None:
            raise Unsupported(
                f"einsum {equation!r} with '...' needs the operands' ranks, which ai3 knows "
                "for graphs captured by torch.export (convert with example_inputs)"
            )
        if r < named:
            raise Unsupported(f"einsum {equation!r}: an operand of rank {r} for term {t!r}")
        widths.append(r - named)
    width = max(widths, default=0)
    ell = [f"…{i}" for i in range(width)]  # fresh symbols, never letters

    def expand(term: str, w: int) -> list[str]:
        before, dots, after = term.partition("...")
        return [*before, *(ell[width - w :] if dots else []), *after]

    ins = [expand(t, w) for t, w in zip(terms, widths, strict=True)]
    for t, term in zip(ins, terms, strict=True):
        repeated = sorted({x for x in t if t.count(x) > 1})
        if repeated:
            raise Unsupported(
                f"einsum {equation!r}: subscript {repeated[0]!r} repeats within operand "
                f"{term!r} (a diagonal; ai3 computes einsums without them)"
            )
    for t, r in zip(ins, ranks, strict=True):
        if r is not None and len(t) != r:
            raise Unsupported(
                f"einsum {equation!r}: an operand of rank {r} for {len(t)} subscripts"
            )
    if arrow:
        out = expand(rhs, width)
        if "..." not in rhs and width and any(widths):
            raise Unsupported(f"einsum {equation!r}: '...' in the inputs but not the output")
    else:  # implicit output: '...' first, then the letters used once, in alphabetical order
        counts = [x for t in ins for x in t if x in _LETTERS]
        out = ell + sorted(x for x in set(counts) if counts.count(x) == 1)
    every = {x for t in ins for x in t}
    missing = [x for x in out if x not in every]
    if missing or len(set(out)) != len(out):
        raise Unsupported(f"einsum {equation!r}: output subscripts {missing or out} are not valid")
    return ins, out


class _Emit:
    """Adds the steps of one einsum. Every step but the last computes a node
    standing for an intermediate value; the last computes the einsum's node."""

    def __init__(self, lw: Lowerer, n: torch.fx.Node):
        self.lw, self.n = lw, n
        self.pending: tuple | None = None
        self.count = 0

    def __call__(self, op: str, x: Any, params: dict, shapes: tuple = ()) -> torch.fx.Node:
        self.settle()
        self.count += 1
        node = self.lw.partial(self.n, f"einsum{self.count}")
        self.pending = (node, op, x, params, shapes)
        return node

    def settle(self, last: bool = False) -> None:
        """Adds the step held back (as the einsum's own when ``last``), so
        that what follows may read its value."""
        if self.pending is None:
            return
        node, op, x, params, shapes = self.pending
        inputs = x if isinstance(x, list) else [x]
        self.lw.step(self.n if last else node, op, inputs, params, shapes=shapes)
        self.pending = None

    def finish(self, result: torch.fx.Node, source: Any) -> None:
        if self.pending is None:  # nothing computed: the einsum is its operand, unchanged
            self.lw.alias(self.n, source, same=False)
        else:
            assert result is self.pending[0]
            self.settle(last=True)


class _Operand:
    """A value and its letters; ``sizes`` gives each letter's size at run time."""

    def __init__(self, node: Any, letters: list[str], sizes: dict[str, S.SizeExpr]):
        self.node, self.letters, self.sizes = node, letters, sizes


def _sum_out(emit: _Emit, a: _Operand, keep: set[str]) -> _Operand:
    dims = [i for i, x in enumerate(a.letters) if x not in keep]
    if not dims:
        return a
    node = emit("sum", a.node, {"dims": dims, "keepdim": False})
    return _Operand(node, [x for x in a.letters if x in keep], a.sizes)


def _permute(emit: _Emit, a: _Operand, order: list[str]) -> _Operand:
    if order == a.letters:
        return a
    node = emit("permute", a.node, {"dims": [a.letters.index(x) for x in order]})
    return _Operand(node, order, a.sizes)


def _product(sizes: list[S.SizeExpr]) -> S.SizeExpr:
    out: S.SizeExpr = S.Const(1)
    for s in sizes:
        out = s if out == S.Const(1) else S.BinOp("mul", out, s)
    return out


def _reshape(emit: _Emit, lw: Lowerer, x: Any, entries: list[S.SizeExpr]) -> torch.fx.Node:
    emit.settle()  # the sizes may read the value of the step held back
    spec, extra = _size_spec(lw, x, entries)
    return emit("reshape", x, {"shape": spec}, extra)


def _contract(emit: _Emit, lw: Lowerer, a: _Operand, b: _Operand, keep: set[str]) -> _Operand:
    """``a`` and ``b`` contracted into ``[batch..., left..., right...]``."""
    a, b = _sum_out(emit, a, keep | set(b.letters)), _sum_out(emit, b, keep | set(a.letters))
    batch = [x for x in a.letters if x in b.letters and x in keep]
    contracted = [x for x in a.letters if x in b.letters and x not in keep]
    left = [x for x in a.letters if x not in b.letters]
    right = [x for x in b.letters if x not in a.letters]
    sizes = {**b.sizes, **a.sizes}  # for the letters kept; batch letters may differ

    def grouped(op: _Operand, first: list[str], second: list[str]) -> Any:
        op = _permute(emit, op, batch + first + second)
        if len(first) == 1 and len(second) == 1:
            return op.node
        own = op.sizes  # a batch letter of size 1 in one operand broadcasts in matmul
        merged = [_product([own[x] for x in first]), _product([own[x] for x in second])]
        return _reshape(emit, lw, op.node, [own[x] for x in batch] + merged)

    lhs, rhs = grouped(a, left, contracted), grouped(b, contracted, right)
    mm = emit("matmul", [lhs, rhs], {})
    letters = batch + left + right
    if len(left) == 1 and len(right) == 1:
        return _Operand(mm, letters, sizes)
    # Batch sizes from the product, where PyTorch's broadcasting has settled them.
    batch_sizes = [S.Dim(mm, i) for i in range(len(batch))]
    shape = batch_sizes + [sizes[x] for x in left + right]
    return _Operand(_reshape(emit, lw, mm, shape), letters, sizes)


def _einsum(lw: Lowerer, n) -> None:
    if not n.args or not isinstance(n.args[0], str) or n.kwargs:
        raise Unsupported("einsum with an equation string and tensors (not the sublist form)")
    equation, operands = n.args[0], list(n.args[1:])
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = list(operands[0])  # torch.einsum(eq, [a, b])
    if not operands or not all(lw.is_value(x) for x in operands):
        raise Unsupported(f"einsum {equation!r} with operands that are not tensors")
    ins, out = parse(equation, [_rank_of(x) for x in operands])
    emit = _Emit(lw, n)
    ops = []
    for x, letters in zip(operands, ins, strict=True):
        node = lw.tensor(x)
        ops.append(_Operand(node, letters, {c: S.Dim(node, i) for i, c in enumerate(letters)}))
    acc = ops[0]
    for i, b in enumerate(ops[1:], start=1):
        keep = set(out).union(*(o.letters for o in ops[i + 1 :]))
        acc = _contract(emit, lw, acc, b, keep)
    acc = _permute(emit, _sum_out(emit, acc, set(out)), out)
    emit.finish(acc.node, operands[0])


register(functions={torch.einsum: _einsum, torch.ops.aten.einsum.default: _einsum})
