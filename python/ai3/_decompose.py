"""Modules traced as the functional code they compute, so that each of their
steps becomes an ai3 node: ``nn.MultiheadAttention`` is its input
projections, one ``attention`` node (scaled dot-product attention, whose
algorithm is selectable) and its output projection.

:class:`ai3._shapes.Tracer` calls :func:`decompose` for each module call;
a call it cannot honour (``why_not`` says why) stays one ``call_module``
node, which the lowering reports as unsupported with that reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

_MHA_SIG = inspect.signature(nn.MultiheadAttention.forward)


def _mha_args(m: nn.MultiheadAttention, args: tuple, kwargs: dict) -> dict[str, Any]:
    b = _MHA_SIG.bind(m, *args, **kwargs)
    b.apply_defaults()
    return b.arguments


def mha_why_not(m: nn.MultiheadAttention, a: dict[str, Any]) -> str | None:
    """Why ai3 cannot compute this call of ``m``, or None."""
    if m.training and m.dropout > 0:
        return "training mode with dropout (call .eval() before ai3.convert)"
    if m.bias_k is not None or m.add_zero_attn:
        return "add_bias_kv / add_zero_attn"
    if a["key_padding_mask"] is not None:
        return "key_padding_mask (give the mask as attn_mask)"
    if a["is_causal"] is not False and a["attn_mask"] is None:
        return "is_causal without attn_mask (PyTorch needs the mask too)"
    for name in ("need_weights", "average_attn_weights", "is_causal"):
        if not isinstance(a[name], bool):
            return f"{name} computed by the network"
    return None


def _constant_of(t: Any) -> torch.Tensor | None:
    """The tensor a traced module attribute holds (``self.mask``), if ``t`` is one."""
    if isinstance(t, torch.Tensor):
        return t
    if isinstance(t, torch.fx.Proxy) and t.node.op == "get_attr":
        obj: Any = t.tracer.root
        for atom in str(t.node.target).split("."):
            obj = getattr(obj, atom)
        return obj if isinstance(obj, torch.Tensor) else None
    return None


def _mha(m: nn.MultiheadAttention, args: tuple, kwargs: dict) -> Any:
    """``m(query, key, value, ...)`` in functional form: ``(output, None)``
    (the attention weights are not computed)."""
    a = _mha_args(m, args, kwargs)
    query, key, value, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not m.batch_first:
        q_t = query.transpose(0, 1)
        k_t = q_t if key is query else key.transpose(0, 1)
        v_t = k_t if value is key else (q_t if value is query else value.transpose(0, 1))
        query, key, value = q_t, k_t, v_t
    heads, dim, embed = m.num_heads, m.head_dim, m.embed_dim
    batch, q_len, kv_len = query.size(0), query.size(1), key.size(1)
    w, b = m.in_proj_weight, m.in_proj_bias
    if query is key and key is value and m._qkv_same_embed_dim:
        q, k, v = F.linear(query, w, b).chunk(3, dim=-1)
    else:
        # The real tensors (the tracer hands out proxies), sliced once: constants of the graph.
        real = m._parameters
        if m._qkv_same_embed_dim:
            wq, wk, wv = (t.detach() for t in real["in_proj_weight"].chunk(3))
        else:
            wq, wk, wv = (real[f"{x}_proj_weight"] for x in "qkv")
        bias = real["in_proj_bias"]
        bq, bk, bv = (None,) * 3 if bias is None else (t.detach() for t in bias.chunk(3))
        q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    q = q.view(batch, q_len, heads, dim).transpose(1, 2)
    k = k.view(batch, kv_len, heads, dim).transpose(1, 2)
    v = v.view(batch, kv_len, heads, dim).transpose(1, 2)
    held = _constant_of(mask)
    if held is not None and held.dtype == torch.bool:
        mask = ~held  # MultiheadAttention's True masks out; SDPA's True attends
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = out.transpose(1, 2).reshape(batch, q_len, embed)
    out = F.linear(out, m.out_proj.weight, m.out_proj.bias)
    if not m.batch_first:
        out = out.transpose(0, 1)
    return out, None


#: Modules traced as functional code, by class: ``(why_not, decomposition)``.
DECOMPOSITIONS: dict[type, tuple[Callable, Callable]] = {
    nn.MultiheadAttention: (
        lambda m, args, kwargs: mha_why_not(m, _mha_args(m, args, kwargs)),
        _mha,
    ),
}


def why_not(m: nn.Module, args: tuple, kwargs: dict) -> str | None:
    """Why a call of ``m`` cannot be decomposed, or None (also None for
    modules without a decomposition)."""
    entry = DECOMPOSITIONS.get(type(m))
    return None if entry is None else entry[0](m, args, kwargs)


def decompose(m: nn.Module, args: tuple, kwargs: dict) -> Any:
    """The traced functional form of ``m(*args, **kwargs)``, or
    ``NotImplemented`` when ``m`` has none or this call cannot use it."""
    entry = DECOMPOSITIONS.get(type(m))
    if entry is None or m._forward_hooks or m._forward_pre_hooks:
        return NotImplemented
    if entry[0](m, args, kwargs) is not None:
        return NotImplemented
    return entry[1](m, args, kwargs)
