"""Pooling and reductions: max, average and adaptive 2-D pooling (modules and
functions), and the reductions ``mean`` and ``sum``."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import _layers as L
from .calls import Sig, Unsupported, as_bool, as_ints
from .lowerer import Lowerer
from .registry import register


def _maxpool(lw: Lowerer, n, x, p: L.PoolSpec, module=None) -> None:
    window = {"kernel_size": p.kernel, "stride": p.stride, "padding": p.padding}
    lw.unary(n, x, "maxpool2d", module, dilation=p.dilation, ceil_mode=p.ceil_mode, **window)


def _avgpool(lw: Lowerer, n, x, p: L.PoolSpec, include_pad, divisor, module=None) -> None:
    window = {"kernel_size": p.kernel, "stride": p.stride, "padding": p.padding}
    options = {"count_include_pad": include_pad, "divisor_override": divisor}
    lw.unary(n, x, "avgpool2d", module, ceil_mode=p.ceil_mode, **window, **options)


def _maxpool_module(lw: Lowerer, n, m: nn.MaxPool2d, x) -> None:
    if m.return_indices:
        raise Unsupported("return_indices=True")
    _maxpool(lw, n, x, L.maxpool_spec_of(m), m)


def _avgpool_module(lw: Lowerer, n, m: nn.AvgPool2d, x) -> None:
    p, inc, div = L.avgpool_spec_of(m)
    _avgpool(lw, n, x, p, inc, div, m)


def _adaptive_module(op: str) -> Callable:
    def handler(lw: Lowerer, n, m, x) -> None:
        if getattr(m, "return_indices", False):
            raise Unsupported("return_indices=True")
        lw.unary(n, x, op, module=m, output_size=L.adaptive_size(m.output_size))

    return handler


_MAXPOOL = Sig(
    "input, kernel_size, stride, padding, dilation, ceil_mode, return_indices",
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode=False,
    return_indices=False,
    fixed="return_indices",
)
#: ``torch.max_pool2d`` (ATen's): no ``return_indices``, and ``stride=[]`` means the kernel.
_TORCH_MAXPOOL = Sig(
    "input, kernel_size, stride, padding, dilation, ceil_mode",
    stride=(),
    padding=0,
    dilation=1,
    ceil_mode=False,
)


def _maxpool_fn(sig: Sig) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        p = L.pool_spec(
            b["kernel_size"],
            b["stride"],
            b["padding"],
            b["dilation"],
            as_bool("ceil_mode", b["ceil_mode"]),
            "maxpool2d",
        )
        _maxpool(lw, n, b["input"], p)

    return handler


_AVGPOOL = Sig(
    "input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override",
    stride=None,
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
)


def _avgpool_fn(lw: Lowerer, n) -> None:
    b = _AVGPOOL.bind(n)
    ceil_mode = as_bool("ceil_mode", b["ceil_mode"])
    p = L.pool_spec(b["kernel_size"], b["stride"], b["padding"], 1, ceil_mode, "avgpool2d")
    include_pad = as_bool("count_include_pad", b["count_include_pad"])
    _avgpool(lw, n, b["input"], p, include_pad, L.divisor_override(b["divisor_override"]))


def _adaptive_fn(op: str, sig: Sig) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        lw.unary(n, b["input"], op, output_size=L.adaptive_size(b["output_size"]))

    return handler


_TORCH_MEAN = Sig(
    "input, dim, keepdim, *, dtype, out", dim=None, keepdim=False, dtype=None, out=None,
    fixed="dtype out",
)  # fmt: skip
_METHOD_MEAN = Sig(
    "input, dim, keepdim, *, dtype", dim=None, keepdim=False, dtype=None, fixed="dtype"
)


def _reduce_fn(op: str, sig: Sig) -> Callable:
    """``torch.mean`` / ``torch.sum`` and their methods: over ``dim`` (None or
    empty: every dimension)."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        dim, keepdim = b.get("dim"), b.get("keepdim", False)  # ATen's .default has neither
        dims = [] if dim is None else as_ints("dim", dim)
        lw.unary(n, b["input"], op, dims=dims, keepdim=as_bool("keepdim", keepdim))

    return handler


_ATEN_REDUCE = Sig("input, dim, keepdim, *, dtype", keepdim=False, dtype=None, fixed="dtype")
_ATEN_ALL = Sig("input, *, dtype", dtype=None, fixed="dtype")
aten = torch.ops.aten


register(
    modules={
        nn.MaxPool2d: _maxpool_module,
        nn.AvgPool2d: _avgpool_module,
        nn.AdaptiveAvgPool2d: _adaptive_module("adaptiveavgpool2d"),
        nn.AdaptiveMaxPool2d: _adaptive_module("adaptivemaxpool2d"),
    },
    functions={
        F.max_pool2d: _maxpool_fn(_MAXPOOL),
        torch.max_pool2d: _maxpool_fn(_TORCH_MAXPOOL),
        F.avg_pool2d: _avgpool_fn,
        F.adaptive_avg_pool2d: _adaptive_fn("adaptiveavgpool2d", Sig("input, output_size")),
        F.adaptive_max_pool2d: _adaptive_fn(
            "adaptivemaxpool2d",
            Sig("input, output_size, return_indices", return_indices=False, fixed="return_indices"),
        ),
        torch.mean: _reduce_fn("mean", _TORCH_MEAN),
        torch.sum: _reduce_fn("sum", _TORCH_MEAN),
        aten.mean.dim: _reduce_fn("mean", _ATEN_REDUCE),
        aten.sum.dim_IntList: _reduce_fn("sum", _ATEN_REDUCE),
        aten.mean.default: _reduce_fn("mean", _ATEN_ALL),
        aten.sum.default: _reduce_fn("sum", _ATEN_ALL),
    },
    methods={"mean": _reduce_fn("mean", _METHOD_MEAN), "sum": _reduce_fn("sum", _METHOD_MEAN)},
)
