"""Shape operations, which move elements without computing new ones:
flatten, permute/transpose, reshape/view, squeeze/unsqueeze, chunk/split and the ``getitem``
that picks a piece, and the symbolic sizes ``x.shape`` / ``x.size(d)``.

Their results may share their input's memory, so each records itself as a
view of it (:meth:`~.lowerer.Lowerer.view`) for the in-place tracking."""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .. import _sizes as S
from .calls import Sig, Unsupported, as_float, as_int, as_ints, has_node
from .lowerer import OPAQUE, Lowerer, Pieces
from .registry import register


def _flatten(lw: Lowerer, n, x, start_dim, end_dim, module=None) -> None:
    start, end = as_int("start_dim", start_dim), as_int("end_dim", end_dim)
    lw.unary(n, x, "flatten", module, start_dim=start, end_dim=end)
    lw.view(n, x)


def _flatten_module(lw: Lowerer, n, m: nn.Flatten, x) -> None:
    _flatten(lw, n, x, m.start_dim, m.end_dim, m)


_FLATTEN = Sig("input, start_dim, end_dim", start_dim=0, end_dim=-1)


def _flatten_fn(lw: Lowerer, n) -> None:
    """``torch.flatten(x, start_dim, end_dim)`` and ``x.flatten(start_dim, end_dim)``."""
    b = _FLATTEN.bind(n)
    _flatten(lw, n, b["input"], b["start_dim"], b["end_dim"])


def _permute(sig: Sig) -> Callable:
    """``torch.permute(x, dims)`` / ``x.permute(*dims)`` (or ``x.permute(dims)``)."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        dims = b["dims"]
        if sig.varargs and len(dims) == 1 and isinstance(dims[0], list | tuple):
            dims = dims[0]
        lw.unary(n, b["input"], "permute", dims=as_ints("dims", dims))
        lw.view(n, b["input"])

    return handler


_TRANSPOSE = Sig("input, dim0, dim1")
_SWAPAXES = Sig("input, axis0, axis1")


def _swapaxes(lw: Lowerer, n) -> None:
    """``torch.swapaxes`` / ``x.swapaxes``: ``transpose`` under another name."""
    b = _SWAPAXES.bind(n)
    d0, d1 = as_int("axis0", b["axis0"]), as_int("axis1", b["axis1"])
    lw.unary(n, b["input"], "permute", dim0=d0, dim1=d1)
    lw.view(n, b["input"])


_UNSQUEEZE = Sig("input, dim")


def _unsqueeze(lw: Lowerer, n) -> None:
    """``x.unsqueeze(dim)``: an ``index`` with ``None`` at ``dim``."""
    b = _UNSQUEEZE.bind(n)
    d = as_int("dim", b["dim"])
    items = (*[slice(None)] * d, None, ...) if d >= 0 else (..., None, *[slice(None)] * (-d - 1))
    _index(lw, n, b["input"], items)


_SQUEEZE = Sig("input, dim", dim=None)


def _squeeze(lw: Lowerer, n) -> None:
    """``x.squeeze(dim)``: the dimensions of size 1 among ``dim`` (an int, a
    tuple, or None for all) removed; their sizes are known only at run time."""
    b = _SQUEEZE.bind(n)
    params = {} if b["dim"] is None else {"dims": as_ints("dim", b["dim"])}
    lw.step(n, "squeeze", [b["input"]], params)
    lw.view(n, b["input"])


def _transpose(lw: Lowerer, n) -> None:
    b = _TRANSPOSE.bind(n)
    # The input's rank is unknown until run time, so the two axes go to Rust as they are.
    d0, d1 = as_int("dim0", b["dim0"]), as_int("dim1", b["dim1"])
    lw.unary(n, b["input"], "permute", dim0=d0, dim1=d1)
    lw.view(n, b["input"])


def _size_spec(lw: Lowerer, x: Any, entries: Any) -> tuple[list, tuple]:
    """Sizes as the ``Sizes`` parameter of ``reshape`` / ``expand`` takes them, and
    the tensors besides ``x`` whose shapes they read (the node's extra inputs)."""
    exprs = [lw.size(e) for e in entries]
    data = lw.tensor(x)
    extra: list[torch.fx.Node] = []
    for e in exprs:
        for m in S.nodes_of(e):
            if m is not data and m not in extra:
                extra.append(m)
    index = {data: 0, **{m: i + 1 for i, m in enumerate(extra)}}
    return [S.encode(e, index) for e in exprs], tuple(extra)


def _expand(lw: Lowerer, n, sig: Sig | None = None) -> None:
    """``x.expand(*sizes)``: each size a constant, ``-1``, or a size read at run time."""
    b = (sig or _EXPAND).bind(n)
    x, sizes = b["input"], b["size"]
    if len(sizes) == 1 and isinstance(sizes[0], list | tuple):
        sizes = sizes[0]
    if not sizes:
        raise Unsupported("no sizes given")
    spec, extra = _size_spec(lw, x, sizes)
    lw.step(n, "expand", [x], {"size": spec}, shapes=extra)
    lw.view(n, x)


_EXPAND = Sig("input, *size")


def _index_entry(item: Any) -> tuple[int, int | None, int | None, int]:
    """One position of ``x[...]`` as ``(kind, start, stop, step)`` (see the
    ``index`` operation)."""
    if item is None:
        return 2, None, None, 1
    if item is Ellipsis:
        return 3, None, None, 1
    if isinstance(item, int) and not isinstance(item, bool):
        return 1, item, None, 1
    if isinstance(item, slice):
        parts = (item.start, item.stop, item.step)
        if any(p is not None and (isinstance(p, bool) or not isinstance(p, int)) for p in parts):
            raise Unsupported(f"slice {item!r} with bounds that are not constant integers")
        return 0, item.start, item.stop, 1 if item.step is None else item.step
    raise Unsupported(
        f"index {item!r} (ai3 indexes with integers, slices, None and ...; not with tensors)"
    )


def _index(lw: Lowerer, n, src: Any, idx: Any) -> None:
    """``x[...]`` with basic indexing, as an ``index`` node."""
    items = idx if isinstance(idx, tuple) else (idx,)
    kinds, starts, stops, steps = zip(*(_index_entry(i) for i in items), strict=True)
    params = {"kinds": list(kinds), "starts": list(starts), "stops": list(stops)}
    lw.step(n, "index", [src], {**params, "steps": list(steps)})
    lw.view(n, src)


def _reshape(sig: Sig, name: str) -> Callable:
    """``torch.reshape(x, shape)``, ``x.reshape(*shape)`` and ``x.view(*size)``:
    each size a constant or a symbolic size read from a tensor at run time."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        x, shape = b["input"], b[name]
        if sig.varargs and not shape:
            raise Unsupported("no shape given")
        if sig.varargs and len(shape) == 1:
            shape = shape[0]  # x.view((2, -1)), x.view(x.shape), x.view(n)
        if isinstance(shape, torch.fx.Node):
            if isinstance(lw.kind.get(lw.canonical(shape)), S.ShapeOf):
                raise Unsupported("reshape to another tensor's whole shape")
            shape = [shape]
        entries = shape if isinstance(shape, list | tuple) else [shape]
        spec, extra = _size_spec(lw, x, entries)
        lw.step(n, "reshape", [x], {"shape": spec}, shapes=extra)
        lw.view(n, x)

    return handler


def _pieces(sig: Sig, how: str, chunks: bool) -> Callable:
    """``chunk`` / ``split``: the pieces, which ``getitem`` nodes slice out."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        x, size, dim = b[sig.first], b[how], as_int("dim", b["dim"])
        t = lw.tensor(x)
        if chunks or not isinstance(size, list | tuple):
            k = as_int(how, size)
            if k <= 0:
                raise Unsupported(f"{how}={k} (must be positive)")
            lw.kind[n] = Pieces(t, dim, k, None, None) if chunks else Pieces(t, dim, None, k, None)
        else:
            sections = as_ints(how, size)
            if any(s < 0 for s in sections):
                raise Unsupported(f"{how}={sections} (sizes must not be negative)")
            lw.kind[n] = Pieces(t, dim, None, None, sections)
        lw.view(n, x)

    return handler


_GETITEM = Sig("a, b")


def _getitem(lw: Lowerer, n) -> None:
    b = _GETITEM.bind(n)
    src, idx = b["a"], b["b"]
    if has_node(idx):
        raise Unsupported("an index computed by the network")
    k = lw.kind.get(lw.canonical(src)) if isinstance(src, torch.fx.Node) else None
    if k == OPAQUE:
        lw.kind[n] = OPAQUE  # its source is already reported
    elif isinstance(k, S.ShapeOf) and isinstance(idx, int) and not isinstance(idx, bool):
        lw.kind[n] = S.Dim(k.node, idx)
    elif isinstance(k, Pieces) and k.squeeze and isinstance(idx, int):
        lw.check_current(src)  # the pieces are views of their input
        _index(lw, n, k.node, _at_dim(k.dim, idx))
    elif isinstance(k, Pieces) and isinstance(idx, int) and not isinstance(idx, bool):
        lw.check_current(src)  # the pieces are views of their input
        if k.sections is not None:
            count = len(k.sections)
            if not -count <= idx < count:
                raise Unsupported(f"index {idx} out of range for a split into {count} pieces")
            idx %= count
        elif idx < 0:
            raise Unsupported(
                f"index {idx} counted from the end of a chunk/split whose number of pieces "
                "depends on the input's size"
            )
        how = {"chunks": k.chunks, "split_size": k.split_size, "sections": k.sections}
        lw.unary(n, k.node, "slice", dim=k.dim, index=idx, **how)
        lw.view(n, src)
    elif lw.is_value(src):
        _index(lw, n, src, idx)
    else:
        raise Unsupported("indexing (only tensors, chunk/split pieces and sizes can be indexed)")


_GETATTR = Sig("obj, name")


def _getattr_fn(lw: Lowerer, n) -> None:
    b = _GETATTR.bind(n)
    if b["name"] != "shape":
        raise Unsupported(f"attribute {b['name']!r}")
    lw.kind[n] = S.ShapeOf(lw.shape_source(b["obj"]))


_SIZE = Sig("input, dim", dim=None)


def _size_method(lw: Lowerer, n) -> None:
    b = _SIZE.bind(n)
    x = lw.shape_source(b["input"])
    dim = b["dim"]
    lw.kind[n] = S.ShapeOf(x) if dim is None else S.Dim(x, as_int("dim", dim))


_PAD = Sig("input, pad, mode, value", mode="constant", value=None)


def _pad(lw: Lowerer, n) -> None:
    """``F.pad`` with ``mode='constant'`` (the other modes pad images: unsupported here)."""
    b = _PAD.bind(n)
    if b["mode"] != "constant":
        raise Unsupported(f"mode={b['mode']!r} (ai3 pads with a constant)")
    value = 0.0 if b["value"] is None else as_float("value", b["value"])
    lw.step(n, "pad", [b["input"]], {"pad": as_ints("pad", b["pad"]), "value": value})


_ROLL = Sig("input, shifts, dims", dims=None)


def _roll(lw: Lowerer, n) -> None:
    b = _ROLL.bind(n)

    def ints(name: str, v: Any) -> list[int]:
        return [as_int(name, v)] if isinstance(v, int) else as_ints(name, v)

    params = {"shifts": ints("shifts", b["shifts"])}
    if b["dims"] is not None:
        params["dims"] = ints("dims", b["dims"])
    lw.step(n, "roll", [b["input"]], params)


def _rank(lw: Lowerer, n) -> None:
    """``x.dim()``: only shape assertions read it."""
    lw.kind[n] = S.ShapeFact(lw.shape_source(Sig("input").bind(n)["input"]))


_COMPARISONS = (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)


def _compare(lw: Lowerer, n) -> None:
    """A comparison of sizes (``h == self.image_size``): only shape assertions read it."""
    b = _GETITEM.bind(n)
    if lw.is_value(b["a"]) or lw.is_value(b["b"]):
        raise Unsupported("comparison of tensors")
    lw.kind[n] = S.ShapeFact(n)


_ASSERT = Sig("condition, message", message=None)


def _assert(lw: Lowerer, n) -> None:
    """``torch._assert`` on shapes. Given a ``sample_input_shape``, ``convert``
    runs the network once on it, which checks the assertion then; on other
    shapes the operations' own shape checks apply, so the node is dropped.
    A condition known false already makes the node unsupported."""
    b = _ASSERT.bind(n)
    cond = b["condition"]
    if isinstance(cond, torch.fx.Node):
        if not isinstance(lw.kind.get(lw.canonical(cond)), S.ShapeFact):
            raise Unsupported("an assertion on values, not shapes")
    elif not cond:
        raise Unsupported(f"an assertion that fails: {b['message']!r}")


_chunk = _pieces(Sig("input, chunks, dim", dim=0), "chunks", True)

register(
    modules={nn.Flatten: _flatten_module},
    functions={
        torch.flatten: _flatten_fn,
        torch.permute: _permute(Sig("input, dims")),
        torch.transpose: _transpose,
        torch.reshape: _reshape(Sig("input, shape"), "shape"),
        torch.chunk: _chunk,
        torch.split: _pieces(
            Sig("tensor, split_size_or_sections, dim", dim=0), "split_size_or_sections", False
        ),
        operator.getitem: _getitem,
        torch._assert: _assert,
        F.pad: _pad,
        torch.roll: _roll,
        torch.swapaxes: _swapaxes,
        torch.unsqueeze: _unsqueeze,
        torch.squeeze: _squeeze,
        **dict.fromkeys(_COMPARISONS, _compare),
        builtins.getattr: _getattr_fn,
    },
    methods={
        "flatten": _flatten_fn,
        "permute": _permute(Sig("input, *dims")),
        "transpose": _transpose,
        "view": _reshape(Sig("input, *size"), "size"),
        "reshape": _reshape(Sig("input, *shape"), "shape"),
        "chunk": _chunk,
        "split": _pieces(Sig("input, split_size, dim", dim=0), "split_size", False),
        "size": _size_method,
        "expand": _expand,
        "roll": _roll,
        "swapaxes": _swapaxes,
        "unsqueeze": _unsqueeze,
        "squeeze": _squeeze,
        "dim": _rank,
    },
)

#: A slice end of "to the end", as ATen records ``x[a:]``.
_TO_THE_END = 2**63 - 1
_SLICE = Sig("input, dim, start, end, step", dim=0, start=None, end=None, step=1)


def _at_dim(dim: int, item: Any) -> tuple[Any, ...]:
    """Index items applying ``item`` at dimension ``dim`` and leaving the others whole."""
    if dim >= 0:
        return (*[slice(None)] * dim, item, ...)
    return (..., item, *[slice(None)] * (-dim - 1))


def _aten_slice(lw: Lowerer, n) -> None:
    """``aten.slice(x, dim, start, end, step)``: ``x[..., start:end:step, ...]``."""
    b = _SLICE.bind(n)
    end = b["end"]
    if isinstance(end, int) and end >= _TO_THE_END:
        end = None
    item = slice(b["start"], end, b["step"])
    _index(lw, n, b["input"], _at_dim(as_int("dim", b["dim"]), item))


_SELECT = Sig("input, dim, index")


def _aten_select(lw: Lowerer, n) -> None:
    """``aten.select(x, dim, i)``: ``x[..., i, ...]``."""
    b = _SELECT.bind(n)
    item = as_int("index", b["index"])
    _index(lw, n, b["input"], _at_dim(as_int("dim", b["dim"]), item))


_UNBIND = Sig("input, dim", dim=0)


def _unbind(lw: Lowerer, n) -> None:
    """``x.unbind(dim)`` (and ``q, k, v = x``): pieces ``x[..., i, ...]``, read by ``getitem``."""
    b = _UNBIND.bind(n)
    lw.kind[n] = Pieces(lw.tensor(b["input"]), as_int("dim", b["dim"]), None, 1, None, True)
    lw.view(n, b["input"])


_ATEN_EXPAND = Sig("input, size, *, implicit", implicit=False)

#: The same operations as ATen records them in graphs captured by torch.export.
aten = torch.ops.aten
register(
    functions={
        aten.view.default: _reshape(Sig("input, size"), "size"),
        aten._unsafe_view.default: _reshape(Sig("input, size"), "size"),
        aten.reshape.default: _reshape(Sig("input, shape"), "shape"),
        aten.transpose.int: _transpose,
        aten.permute.default: _permute(Sig("input, dims")),
        aten.unsqueeze.default: _unsqueeze,
        aten.squeeze.default: _squeeze,
        aten.squeeze.dim: _squeeze,
        aten.squeeze.dims: _squeeze,
        aten.expand.default: lambda lw, n: _expand(lw, n, _ATEN_EXPAND),
        aten.slice.Tensor: _aten_slice,
        aten.select.int: _aten_select,
        aten.split.Tensor: _pieces(Sig("input, split_size, dim", dim=0), "split_size", False),
        aten.split_with_sizes.default: _pieces(
            Sig("input, split_sizes, dim", dim=0), "split_sizes", False
        ),
        aten.chunk.default: _chunk,
        aten.unbind.int: _unbind,
        aten.flatten.using_ints: _flatten_fn,
        aten.sym_size.int: _size_method,
    }
)
