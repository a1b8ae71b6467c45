"""The ``attention`` operation: every algorithm against PyTorch's
``F.scaled_dot_product_attention`` on a grid of heads, lengths (tile
multiples and not), head dims, masks, causal and dtypes; its registry rows;
and its errors."""

from __future__ import annotations

import ai3
import pytest
import torch
import torch.nn.functional as F
from ai3 import _core
from conftest import assert_close
from torch import nn

ALGOS = ["naive", "flash", "default"]


class SDPA(nn.Module):
    """SDPA with a held mask (a buffer) or none."""

    def __init__(self, mask: torch.Tensor | None = None, **kwargs):
        super().__init__()
        self.kwargs = kwargs
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, **self.kwargs)


class MaskInput(nn.Module):
    """SDPA with the mask given as an input of the network."""

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **self.kwargs)


def _check(module, inputs, algo, dtype):
    model = ai3.convert(module, {"attention": algo}, dtype=dtype)
    want = module(*inputs)
    got = model(*inputs)
    assert got.shape == want.shape
    assert_close(got, want, dtype)
    return model


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "heads, q_len, kv_len, dim, v_dim",
    [(1, 1, 1, 8, 8), (2, 63, 65, 16, 16), (3, 64, 256, 8, 5), (2, 130, 300, 32, 32),
     (1, 300, 7, 4, 9)],
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa(algo, dtype, heads, q_len, kv_len, dim, v_dim, causal):
    torch.manual_seed(q_len + kv_len)
    q = torch.randn(2, heads, q_len, dim, dtype=dtype)
    k = torch.randn(2, heads, kv_len, dim, dtype=dtype)
    v = torch.randn(2, heads, kv_len, v_dim, dtype=dtype)
    _check(SDPA(is_causal=causal).to(dtype), (q, k, v), algo, dtype)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(
    "mask_shape, kind, as_input",
    [((70, 90), "bool", False), ((70, 90), "float", False), ((3, 1, 90), "float", False),
     ((2, 3, 70, 90), "bool", False), ((1, 90), "float", False), ((70, 90), "float", True),
     ((3, 1, 90), "float", True), ((2, 3, 70, 90), "float", True)],
)  # fmt: skip
def test_masks_held_or_given_broadcast_like_pytorch(algo, mask_shape, kind, as_input):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, 70, 16), torch.randn(2, 3, 90, 16), torch.randn(2, 3, 90, 16)
    if kind == "bool":
        mask = torch.rand(mask_shape) > 0.4
        mask[..., 5, :] = False  # a fully masked row: zeros, as in PyTorch
    else:
        mask = torch.randn(mask_shape)
    if as_input:
        _check(MaskInput(), (q, k, v, mask), algo, torch.float32)
    else:
        _check(SDPA(mask), (q, k, v), algo, torch.float32)


@pytest.mark.parametrize("algo", ALGOS)
def test_scale_gqa_and_unbatched_shapes(algo):
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 6, 20, 8), torch.randn(2, 2, 33, 8), torch.randn(2, 2, 33, 8)
    _check(SDPA(scale=0.3, enable_gqa=True), (q, k, v), algo, torch.float32)
    _check(SDPA(), (q[0], k[0].repeat(3, 1, 1), v[0].repeat(3, 1, 1)), algo, torch.float32)
    _check(SDPA(is_causal=True), (q[0, 0], k[0, 0], v[0, 0]), algo, torch.float32)
    k, v = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)
    _check(SDPA(), (q[..., :0, :], k, v), algo, torch.float32)  # no queries
    _check(SDPA(), (q, k[..., :0, :], v[..., :0, :]), algo, torch.float32)  # no keys: zeros


def test_registry_rows_and_workspace():
    assert ai3.SUPPORTED_ALGORITHMS["attention"][:3] == ["flash", "naive", "default"]

    def workspaces(length):
        core = _core.Model("float32", 3)
        core.set_outputs([core.add("attention", "a", [0, 1, 2], {})])
        shape = [1, 4, length, 64]
        rows = core.candidates([shape, shape, shape])[0]
        return {r["algorithm"]: r["workspace_bytes"] for r in rows}

    short, long = workspaces(512), workspaces(4096)
    assert long["naive"] == short["naive"] * 64  # the scores: length squared
    # Blocks, and in f32 with AVX-512 each running head's keys packed: linear in the length.
    packed_keys = (4096 - 512) * 64 * 4 * min(4, ai3.get_num_threads())
    assert long["flash"] - short["flash"] in (0, packed_keys)
    assert long["flash"] * 50 < long["naive"]


@pytest.mark.parametrize(
    "module, shapes, error, match",
    [
        (MaskInput(is_causal=True), [(1, 2, 4, 8)] * 3 + [(4, 4)], ai3.InvalidArgumentError,
         "give a mask or is_causal=True, not both"),
        (SDPA(), [(1, 2, 4, 8), (1, 3, 4, 8), (1, 3, 4, 8)], ai3.ShapeError,
         r"enable_gqa=True lets key and value have fewer heads.*\[1, 2, 4, 8\], \[1, 3, 4, 8\]"),
        (SDPA(), [(1, 2, 4, 8), (1, 2, 5, 7), (1, 2, 5, 8)], ai3.ShapeError,
         "query and key must share the last dimension"),
        (MaskInput(), [(1, 2, 4, 8)] * 3 + [(3, 4)], ai3.ShapeError,
         r"the mask does not broadcast to \[1, 2, 4, 4\]"),
    ],
)  # fmt: skip
def test_bad_shapes_are_errors_naming_them(module, shapes, error, match):
    inputs = [torch.randn(s) for s in shapes]
    with pytest.raises(error, match=match):
        ai3.convert(module)(*inputs)


def test_what_ai3_cannot_honour_is_unsupported():
    class Dropout(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)

    with pytest.raises(ai3.UnsupportedOperationError, match="dropout_p=0.1"):
        ai3.convert(Dropout())
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ai3.DtypeError, match="bool"):  # a boolean mask given as an input
        ai3.convert(MaskInput())(q, q, q, torch.ones(4, 4, dtype=torch.bool))


def test_multihead_attention_node_errors_name_the_operation_and_shapes():
    w = torch.randn(8, 8)

    def node(heads, **extra):
        core = _core.Model("float32", 3)
        params = {f"{x}_weight": w for x in ("q", "k", "v", "out")}
        core.set_outputs(
            [
                core.add(
                    "multihead_attention", "m", [0, 1, 2], {**params, "num_heads": heads, **extra}
                )
            ]
        )
        return core

    with pytest.raises(
        ai3.InvalidArgumentError, match="multihead_attention.*num_heads=3 must divide"
    ):
        node(3)
    core = node(2, batch_first=True)
    with pytest.raises(ai3.ShapeError, match=r"multihead_attention.*\[2, 5, 8\], \[3, 4, 8\]"):
        core.run([torch.randn(2, 5, 8), torch.randn(3, 4, 8), torch.randn(3, 4, 8)])
