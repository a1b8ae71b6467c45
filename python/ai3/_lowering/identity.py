"""Operations that pass their input on unchanged in inference, lowered as
aliases (no ai3 node): Dropout and its kin in eval mode, ``nn.Identity``,
``x.contiguous()``, torchvision's ``stochastic_depth``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .calls import Sig, Unsupported, as_bool, as_float
from .lowerer import Lowerer
from .registry import register


def _dropout(lw: Lowerer, n, x, p: Any, training: Any, *, same: bool, module: bool) -> None:
    """Dropout is the identity (its input itself) in eval mode or with ``p == 0``;
    in training mode it drops elements at random, which ai3 does not."""
    p, training = as_float("p", p), as_bool("training", training)
    if not 0.0 <= p <= 1.0:
        raise Unsupported(f"p={p} (a probability between 0 and 1)")
    if training and p > 0:
        where = (
            "the module is in training mode"
            if module
            else "training=True (a forward's `training=self.training` is read when it is traced)"
        )
        raise Unsupported(
            f"{where}: dropout with p={p} drops elements at random; call .eval() before ai3.convert"
        )
    lw.alias(n, x, same=same and not training)


def _dropout_module(same: bool) -> Callable:
    def handler(lw: Lowerer, n, m, x) -> None:
        _dropout(lw, n, x, m.p, m.training, same=same, module=True)

    return handler


def _identity_module(lw: Lowerer, n, m, x) -> None:
    lw.alias(n, x, same=True)


_DROPOUT = Sig("input, p, training, inplace", p=0.5, training=True, inplace=False)


def _dropout_fn(same: bool) -> Callable:
    """``F.dropout`` / ``F.dropout2d``: ``inplace`` changes nothing when no element is dropped."""

    def handler(lw: Lowerer, n) -> None:
        b = _DROPOUT.bind(n)
        as_bool("inplace", b["inplace"])
        _dropout(lw, n, b["input"], b["p"], b["training"], same=same, module=False)

    return handler


#: ``x.contiguous()``: ``memory_format`` changes only the strides, never the values.
_CONTIGUOUS = Sig("input, *, memory_format", memory_format=torch.contiguous_format)


def _contiguous(lw: Lowerer, n) -> None:
    lw.alias(n, _CONTIGUOUS.bind(n)["input"], same=False)


_STOCHASTIC_DEPTH = Sig("input, p, mode, training", training=True)


def _stochastic_depth(lw: Lowerer, n) -> None:
    """torchvision's ``stochastic_depth``: the identity in eval mode or with ``p == 0``."""
    b = _STOCHASTIC_DEPTH.bind(n)
    if b["mode"] not in ("batch", "row"):
        raise Unsupported(f"mode={b['mode']!r} (torchvision takes 'batch' or 'row')")
    _dropout(lw, n, b["input"], b["p"], b["training"], same=True, module=False)


register(
    modules={
        nn.Dropout: _dropout_module(same=True),
        # F.dropout2d views a 3-D input as a batch of one: its result is then a view.
        nn.Dropout2d: _dropout_module(same=False),
        nn.AlphaDropout: _dropout_module(same=True),
        nn.Identity: _identity_module,
    },
    functions={F.dropout: _dropout_fn(same=True), F.dropout2d: _dropout_fn(same=False)},
    methods={"contiguous": _contiguous},
)


_ATEN_DROPOUT = Sig("input, p, train")


def _aten_dropout(lw: Lowerer, n) -> None:
    b = _ATEN_DROPOUT.bind(n)
    _dropout(lw, n, b["input"], b["p"], b["train"], same=True, module=False)


_CLONE = Sig("input, *, memory_format", memory_format=None)


def _clone(lw: Lowerer, n) -> None:
    """``aten.clone``: ai3 never writes into a value another node reads, so a copy is an alias."""
    lw.alias(n, _CLONE.bind(n)["input"], same=False)


def _metadata_check(lw: Lowerer, n) -> None:
    """``aten._assert_tensor_metadata``: torch.export's check of a tensor's dtype
    and device, which ai3's own checks of its inputs cover."""


_TO = Sig(
    "input, *, dtype, layout, device, pin_memory, non_blocking, copy, memory_format",
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    copy=False,
    memory_format=None,
)


#: ``aten.to.dtype(x, dtype, non_blocking, copy, memory_format)``.
_TO_DTYPE = Sig(
    "input, dtype, non_blocking, copy, memory_format",
    non_blocking=False,
    copy=False,
    memory_format=None,
)


def _to(lw: Lowerer, n, sig: Sig = _TO) -> None:
    """``aten.to`` / ``aten._to_copy`` that keeps the dtype (a forward's
    ``x.to(self.dtype)``): the identity; a real conversion is unsupported, as
    ai3 computes in one dtype."""
    b = {"device": None, **sig.bind(n)}
    x = b["input"]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if b["dtype"] is not None and (val is None or val.dtype != b["dtype"]):
        raise Unsupported(f"a conversion to {b['dtype']} (ai3 computes in one dtype)")
    if b["device"] is not None and torch.device(b["device"]).type != "cpu":
        raise Unsupported(f"a move to {b['device']}")
    lw.alias(n, x, same=False)


aten = torch.ops.aten
register(
    functions={
        aten.dropout.default: _aten_dropout,
        aten.clone.default: _clone,
        aten.contiguous.default: _contiguous,
        aten._assert_tensor_metadata.default: _metadata_check,
        aten.to.dtype_layout: _to,
        aten.to.dtype: lambda lw, n: _to(lw, n, _TO_DTYPE),
        aten._to_copy.default: _to,
    }
)


def _register_torchvision() -> None:
    """torchvision's fx-wrapped functions that are the identity in inference."""
    try:
        from torchvision.ops import stochastic_depth
    except ImportError:  # torchvision is optional
        return
    register(functions={stochastic_depth: _stochastic_depth})


_register_torchvision()
