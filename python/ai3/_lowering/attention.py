"""Attention: ``F.scaled_dot_product_attention`` as one ai3 ``attention`` node,
whose algorithm (``naive``, ``flash``, ``default``) is selectable per layer."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .._decompose import multihead_attention
from .calls import Sig, Unsupported, as_bool, as_float, as_int
from .lowerer import Lowerer
from .registry import register

_SDPA = Sig(
    "query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa",
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
)


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """A mask as ai3 adds it to the scores: a boolean one (True: attend)
    becomes 0 where it attends and -inf elsewhere; a float one is already additive."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    if not mask.is_floating_point():
        raise Unsupported(f"attn_mask of dtype {mask.dtype} (PyTorch takes bool or float)")
    return mask


def attention_step(
    lw: Lowerer, n, q, k, v, mask: Any, *, causal: bool, scale: float | None, gqa: bool = False
) -> None:
    """The ``attention`` node computing ``n``; ``mask`` is None, a graph value
    (read on every call) or a tensor the network holds."""
    params: dict[str, Any] = {"is_causal": causal, "scale": scale, "enable_gqa": gqa}
    inputs = [q, k, v]
    if mask is not None:
        if not lw.is_value(mask):
            raise Unsupported(f"attn_mask={mask!r} (expected a tensor)")
        src = lw.resolve(mask)
        if src.op == "get_attr":  # a constant of the network: held, converted once
            params["attn_mask"] = additive_mask(lw.fetch(src.target))
        else:
            inputs.append(mask)
    lw.step(n, "attention", inputs, params)


def _sdpa(lw: Lowerer, n) -> None:
    b = _SDPA.bind(n)
    dropout = as_float("dropout_p", b["dropout_p"])
    if dropout != 0.0:
        raise Unsupported(f"dropout_p={dropout} (ai3 runs inference: dropout_p must be 0)")
    scale = None if b["scale"] is None else as_float("scale", b["scale"])
    attention_step(
        lw, n, b["query"], b["key"], b["value"], b["attn_mask"],
        causal=as_bool("is_causal", b["is_causal"]), scale=scale,
        gqa=as_bool("enable_gqa", b["enable_gqa"]),
    )  # fmt: skip


_MHA = Sig(
    "query, key, value, attn_mask, q_weight, k_weight, v_weight, q_bias, k_bias, v_bias, "
    "out_weight, out_bias, num_heads, batch_first"
)


def _multihead(lw: Lowerer, n) -> None:
    """One ``multihead_attention`` node for ``nn.MultiheadAttention`` (see
    :func:`ai3._decompose.multihead_attention`): the weights held, the mask
    held (converted once) or read as a fourth input."""
    b = _MHA.bind(n)
    heads = as_int("num_heads", b["num_heads"])
    params: dict[str, Any] = {
        "num_heads": heads,
        "batch_first": as_bool("batch_first", b["batch_first"]),
    }
    for name in ("q", "k", "v", "out"):
        params[f"{name}_weight"] = lw.const_tensor(b[f"{name}_weight"])
        params[f"{name}_bias"] = lw.const_tensor(b[f"{name}_bias"])
    inputs = [b["query"], b["key"], b["value"]]
    mask = b["attn_mask"]
    if mask is not None:
        if not lw.is_value(mask):
            raise Unsupported(f"attn_mask={mask!r} (expected a tensor)")
        src = lw.resolve(mask)
        if src.op == "get_attr":
            held = additive_mask(lw.fetch(src.target))
            if held.dim() == 3:  # [batch * heads, q_len, kv_len]
                held = held.view(-1, heads, *held.shape[1:])
            params["attn_mask"] = held
        else:
            inputs.append(mask)
    lw.step(n, "multihead_attention", inputs, params)


register(
    functions={
        multihead_attention: _multihead,
        F.scaled_dot_product_attention: _sdpa,
        torch.ops.aten.scaled_dot_product_attention.default: _sdpa,
    }
)
