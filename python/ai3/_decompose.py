"""Modules traced as the functional code they compute, so that each of their
steps becomes an ai3 node:

- ``nn.MultiheadAttention``: one :func:`multihead_attention` call, which
  the lowering makes one ``multihead_attention`` node (its projections and
  scaled dot-product attention, whose algorithm is selectable);
- torchvision's Swin blocks (``ShiftedWindowAttention``, ``PatchMerging`` and their v2):
  windows cut by reshapes and permutes, the cyclic shift a ``roll``, and the
  attention one ``attention`` node whose mask (the relative position bias
  plus the shifted windows' mask) is computed once, at convert time. Their
  windows depend on the image size, so they need ``sample_input_shape``.

:class:`ai3._shapes.Tracer` calls :func:`decompose` for each module call,
with the module's input shape when ``convert`` knows it; a call it cannot
honour (``why_not`` says why) stays one ``call_module`` node, which the
lowering reports as unsupported with that reason.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

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


def multihead_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    v_weight: torch.Tensor,
    q_bias: torch.Tensor | None,
    k_bias: torch.Tensor | None,
    v_bias: torch.Tensor | None,
    out_weight: torch.Tensor,
    out_bias: torch.Tensor | None,
    num_heads: int,
    batch_first: bool,
) -> torch.Tensor:
    """What ``nn.MultiheadAttention`` computes in eval mode (its output, not
    the attention weights), with the mask in SDPA's form (True or 0 attends;
    3-D: ``[batch * heads, q_len, kv_len]``). Traced as one call, which the
    lowering makes one ``multihead_attention`` node; PyTorch runs it when
    convert propagates sample shapes."""
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    elif not batch_first:
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    b, lq, lk = query.shape[0], query.shape[1], key.shape[1]

    def heads(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
        return F.linear(x, w, bias).view(b, n, num_heads, -1).transpose(1, 2)

    q, k, v = (
        heads(query, q_weight, q_bias, lq),
        heads(key, k_weight, k_bias, lk),
        heads(value, v_weight, v_bias, lk),
    )
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.view(b, num_heads, lq, lk)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    out = F.linear(out.transpose(1, 2).reshape(b, lq, -1), out_weight, out_bias)
    if unbatched:
        return out.squeeze(0)
    return out if batch_first else out.transpose(0, 1)


torch.fx.wrap("multihead_attention")


def _mha(m: nn.MultiheadAttention, args: tuple, kwargs: dict) -> Any:
    """``m(query, key, value, ...)`` as one :func:`multihead_attention` call:
    ``(output, None)`` (the attention weights are not computed)."""
    a = _mha_args(m, args, kwargs)
    # The real tensors (the tracer hands out proxies), sliced once: constants of the graph.
    real = m._parameters
    if m._qkv_same_embed_dim:
        wq, wk, wv = (t.detach() for t in real["in_proj_weight"].chunk(3))
    else:
        wq, wk, wv = (real[f"{x}_proj_weight"].detach() for x in "qkv")
    bias = real["in_proj_bias"]
    bq, bk, bv = (None,) * 3 if bias is None else (t.detach() for t in bias.chunk(3))
    mask = a["attn_mask"]
    held = _constant_of(mask)
    if held is not None and held.dtype == torch.bool:
        mask = ~held  # MultiheadAttention's True masks out; SDPA's True attends
    out_w, out_b = m.out_proj._parameters["weight"], m.out_proj._parameters["bias"]
    out = multihead_attention(
        a["query"], a["key"], a["value"], mask, wq, wk, wv, bq, bk, bv,
        out_w.detach(), None if out_b is None else out_b.detach(), m.num_heads, m.batch_first,
    )  # fmt: skip
    return out, None


def _swin_shape(shape: Any) -> str | None:
    if shape is None:
        return (
            "Swin's windows depend on the image size: give convert a sample_input_shape "
            "(the network's native one, e.g. (1, 3, 224, 224))"
        )
    if len(shape) != 4:
        return f"input of shape {list(shape)} (expected [batch, height, width, channels])"
    return None


def _swin_attention_why_not(m: nn.Module, args: tuple, kwargs: dict, shape: Any) -> str | None:
    if m.training and (m.dropout > 0 or m.attention_dropout > 0):
        return "training mode with dropout (call .eval() before ai3.convert)"
    return None


def _shift_mask(pad_h: int, pad_w: int, ws: list[int], shift: list[int]) -> torch.Tensor:
    """torchvision's mask of the shifted windows: ``[windows, N, N]``, -100
    between positions that came from different regions."""
    mask = torch.zeros(pad_h, pad_w)
    h_slices = ((0, -ws[0]), (-ws[0], -shift[0]), (-shift[0], None))
    w_slices = ((0, -ws[1]), (-ws[1], -shift[1]), (-shift[1], None))
    count = 0
    for h in h_slices:
        for w in w_slices:
            mask[h[0] : h[1], w[0] : w[1]] = count
            count += 1
    mask = mask.view(pad_h // ws[0], ws[0], pad_w // ws[1], ws[1]).permute(0, 2, 1, 3)
    mask = mask.reshape(-1, ws[0] * ws[1])
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


def _swin_attention(m: nn.Module, args: tuple, kwargs: dict, shape: Any) -> Any:
    """torchvision's ``shifted_window_attention`` for an input of ``shape``:
    the batch stays symbolic, the windows are fixed."""
    x = args[0] if args else kwargs["x"]
    _, h, w, c = shape
    ws, shift, heads = list(m.window_size), list(m.shift_size), m.num_heads
    pad_r, pad_b = (ws[1] - w % ws[1]) % ws[1], (ws[0] - h % ws[0]) % ws[0]
    if pad_r or pad_b:
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
    ph, pw = h + pad_b, w + pad_r
    shift = [0 if ws[0] >= ph else shift[0], 0 if ws[1] >= pw else shift[1]]
    if sum(shift) > 0:
        x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
    nh, nw, n = ph // ws[0], pw // ws[1], ws[0] * ws[1]
    batch = x.size(0)
    x = (
        x.view(batch, nh, ws[0], nw, ws[1], c)
        .permute(0, 1, 3, 2, 4, 5)
        .reshape(batch, nh * nw, n, c)
    )
    qkv_bias = m.qkv.bias
    if hasattr(m, "logit_scale") and m.qkv._parameters["bias"] is not None:
        # Swin v2 computes with the keys' third of the bias at zero.
        qkv_bias = m.qkv._parameters["bias"].detach().clone()
        qkv_bias[c : 2 * c] = 0
    qkv = F.linear(x, m.qkv.weight, qkv_bias).reshape(batch, nh * nw, n, 3, heads, c // heads)
    qkv = qkv.permute(3, 0, 1, 4, 2, 5)  # [3, batch, windows, heads, N, head_dim]
    mask = _relative_position_bias(m, ws)  # [1, heads, N, N]
    if sum(shift) > 0:
        mask = mask + _shift_mask(ph, pw, ws, shift).unsqueeze(1)  # [windows, heads, N, N]
    q, k, v = qkv[0], qkv[1], qkv[2]
    if hasattr(m, "logit_scale"):  # Swin v2: cosine similarity, scaled per head
        real = m._parameters["logit_scale"].detach()
        logit_scale = torch.clamp(real, max=math.log(100.0)).exp()  # [heads, 1, 1]
        q, k, scale = F.normalize(q, dim=-1) * logit_scale, F.normalize(k, dim=-1), 1.0
    else:
        scale = (c // heads) ** -0.5
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.contiguous(), scale=scale)
    out = out.transpose(2, 3).reshape(batch, nh * nw, n, c)
    out = F.linear(out, m.proj.weight, m.proj.bias)
    out = (
        out.view(batch, nh, nw, ws[0], ws[1], c).permute(0, 1, 3, 2, 4, 5).reshape(batch, ph, pw, c)
    )
    if sum(shift) > 0:
        out = torch.roll(out, shifts=(shift[0], shift[1]), dims=(1, 2))
    if pad_r or pad_b:
        out = out[:, :h, :w, :]
    return out


def _relative_position_bias(m: nn.Module, ws: list[int]) -> torch.Tensor:
    """The module's relative position bias, ``[1, heads, N, N]``, computed from
    its real tensors (the tracer hands out proxies): a constant of the graph.
    Swin v2 derives it from a small MLP over fixed coordinates."""
    from torchvision.models.swin_transformer import _get_relative_position_bias

    index = m._buffers["relative_position_index"]
    with torch.no_grad():
        if hasattr(m, "cpb_mlp"):
            first, last = m.cpb_mlp[0], m.cpb_mlp[2]
            h = F.relu(F.linear(m._buffers["relative_coords_table"], *_weights(first)))
            table = F.linear(h, *_weights(last)).view(-1, m.num_heads)
            return 16 * torch.sigmoid(_get_relative_position_bias(table, index, ws))
        table = m._parameters["relative_position_bias_table"]
        return _get_relative_position_bias(table, index, ws).detach()


def _weights(linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return linear._parameters["weight"], linear._parameters["bias"]


def _patch_merging(m: nn.Module, args: tuple, kwargs: dict, shape: Any) -> Any:
    x = args[0] if args else kwargs["x"]
    h, w = shape[-3], shape[-2]
    if h % 2 or w % 2:
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
    parts = [
        x[..., 0::2, 0::2, :],
        x[..., 1::2, 0::2, :],
        x[..., 0::2, 1::2, :],
        x[..., 1::2, 1::2, :],
    ]
    x = torch.cat(parts, -1)
    if type(m).__name__ == "PatchMergingV2":  # v2 normalises after the reduction
        return m.norm(m.reduction(x))
    return m.reduction(m.norm(x))


def _maxvit_attention(m: nn.Module, args: tuple, kwargs: dict, shape: Any) -> Any:
    """torchvision MaxViT's ``RelativePositionalMultiHeadAttention``: its two
    einsums and softmax are one ``attention`` node, the relative position
    bias (from its parameters alone) a mask computed at convert time."""
    x = args[0] if args else kwargs["x"]
    heads, dim = m.n_heads, m.head_dim
    batch, groups, points = x.size(0), x.size(1), x.size(2)
    q, k, v = m.to_qkv(x).chunk(3, dim=-1)
    q, k, v = (
        t.reshape(batch, groups, points, heads, dim).permute(0, 1, 3, 2, 4) for t in (q, k, v)
    )
    with torch.no_grad():
        index = m._buffers["relative_position_index"].view(-1)
        table = m._parameters["relative_position_bias_table"]
        bias = table[index].view(m.max_seq_len, m.max_seq_len, -1).permute(2, 0, 1)
    # MaxViT scales by the feature size, not the head size.
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.unsqueeze(0).contiguous(), scale=m.scale_factor
    )
    out = out.permute(0, 1, 3, 2, 4).reshape(batch, groups, points, heads * dim)
    return m.merge(out)


def _mha_why(m: nn.Module, args: tuple, kwargs: dict, shape: Any) -> str | None:
    return mha_why_not(m, _mha_args(m, args, kwargs))


class Decomposition(NamedTuple):
    """How a module class is traced as functional code: ``why_not`` says why
    a call cannot be (or None), ``build`` traces it; both are called as
    ``f(module, args, kwargs, input_shape or None)``. ``needs_shape``: the
    decomposition depends on the input shape (given by ``sample_input_shape``)."""

    why_not: Callable[..., str | None]
    build: Callable[..., Any]
    needs_shape: bool = False


def _always(m: nn.Module, args: tuple, kwargs: dict, shape: Any) -> None:
    return None


def _entries() -> dict[type, Decomposition]:
    entries = {nn.MultiheadAttention: Decomposition(_mha_why, lambda m, a, k, s: _mha(m, a, k))}
    try:
        from torchvision.models import maxvit
        from torchvision.models import swin_transformer as swin
    except ImportError:  # torchvision is optional
        return entries
    for cls in (swin.ShiftedWindowAttention, swin.ShiftedWindowAttentionV2):
        entries[cls] = Decomposition(_swin_attention_why_not, _swin_attention, needs_shape=True)
    for cls in (swin.PatchMerging, swin.PatchMergingV2):
        entries[cls] = Decomposition(_always, _patch_merging, needs_shape=True)
    entries[maxvit.RelativePositionalMultiHeadAttention] = Decomposition(_always, _maxvit_attention)
    return entries


#: Modules traced as functional code, by class.
DECOMPOSITIONS: dict[type, Decomposition] = _entries()

#: The modules whose decomposition needs their input shape (Swin's).
NEEDS_SHAPES = tuple(t for t, d in DECOMPOSITIONS.items() if d.needs_shape)


def why_not(m: nn.Module, args: tuple, kwargs: dict, shape: Any = None) -> str | None:
    """Why a call of ``m`` cannot be decomposed, or None (also None for
    modules without a decomposition)."""
    if m._forward_hooks or m._forward_pre_hooks:
        return "forward hooks, which ai3 would not run"
    entry = DECOMPOSITIONS.get(type(m))
    if entry is None:
        return None
    return (entry.needs_shape and _swin_shape(shape)) or entry.why_not(m, args, kwargs, shape)


def decompose(m: nn.Module, args: tuple, kwargs: dict, shape: Any = None) -> Any:
    """The traced functional form of ``m(*args, **kwargs)``, or
    ``NotImplemented`` when ``m`` has none or this call cannot use it."""
    entry = DECOMPOSITIONS.get(type(m))
    if entry is None or why_not(m, args, kwargs, shape) is not None:
        return NotImplemented
    return entry.build(m, args, kwargs, shape)
