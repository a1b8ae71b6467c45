"""Operations that pass their input on unchanged in inference, lowered as
aliases (no ai3 node): Dropout and its kin in eval mode, ``nn.Identity``,
``x.contiguous()``, torchvision's ``stochastic_depth``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
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


def _register_torchvision() -> None:
    """torchvision's fx-wrapped functions that are the identity in inference."""
    try:
        from torchvision.ops import stochastic_depth
    except ImportError:  # torchvision is optional
        return
    register(functions={stochastic_depth: _stochastic_depth})


_register_torchvision()
