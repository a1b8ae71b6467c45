"""Embedding: ``nn.Embedding``, ``F.embedding`` and ATen's ``embedding``, as
one ai3 ``embedding`` node holding the table.

The indices are integers in PyTorch; ai3 computes in one float dtype, so a
model converts its index inputs exactly (:func:`ai3._export.index_input`)
and the node checks each is a row of the table. ``padding_idx``,
``scale_grad_by_freq`` and ``sparse`` shape only the gradient, which a
converted model does not compute; ``max_norm`` rescales rows of the table
during the call, which ai3 does not do (unsupported)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .calls import Sig, Unsupported
from .lowerer import Lowerer
from .registry import register


def _embedding(lw: Lowerer, n, indices, weight, max_norm, module=None) -> None:
    if max_norm is not None:
        raise Unsupported(f"max_norm={max_norm!r} (it rescales rows of the table in place)")
    inputs, (w,) = lw.weight_args(indices, weight)
    lw.step(n, "embedding", inputs, {"weight": w}, module)


def _embedding_module(lw: Lowerer, n, m: nn.Embedding, x) -> None:
    _embedding(lw, n, x, m.weight, m.max_norm, m)


_F_EMBEDDING = Sig(
    "input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse",
    padding_idx=None,
    max_norm=None,
    norm_type=2.0,
    scale_grad_by_freq=False,
    sparse=False,
)


def _embedding_fn(lw: Lowerer, n) -> None:
    b = _F_EMBEDDING.bind(n)
    _embedding(lw, n, b["input"], b["weight"], b["max_norm"])


_ATEN_EMBEDDING = Sig(
    "weight, indices, padding_idx, scale_grad_by_freq, sparse",
    padding_idx=-1,
    scale_grad_by_freq=False,
    sparse=False,
)


def _aten_embedding(lw: Lowerer, n) -> None:
    b = _ATEN_EMBEDDING.bind(n)
    _embedding(lw, n, b["indices"], b["weight"], None)


register(
    modules={nn.Embedding: _embedding_module},
    functions={F.embedding: _embedding_fn, torch.ops.aten.embedding.default: _aten_embedding},
)
