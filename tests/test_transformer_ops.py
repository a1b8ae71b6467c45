"""The operations transformers need besides attention: ``expand``, basic
indexing (``x[:, 0]``, ``x[..., 1:5:2]``, ``x[None]``), shape assertions on
static shapes, and ``nn.MultiheadAttention`` traced as its projections around
one ``attention`` node. Each compared with PyTorch at test time."""

from __future__ import annotations

import ai3
import pytest
import torch
import torch.nn.functional as F
import torchvision
from conftest import Fn, Two, assert_close
from torch import nn


def _same(module, *inputs, algos=None):
    module = module.eval()
    model = ai3.convert(module, algos)
    want = module(*inputs)
    got = model(*inputs)
    assert got.shape == want.shape
    assert_close(got, want, torch.float32)
    return model


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x[:, 0],
        lambda x: x[:, :2],
        lambda x: x[..., 1:5:2],
        lambda x: x[-1, -2:, None],
        lambda x: x[None, ..., 0],
        lambda x: x[1:1],  # empty
        lambda x: x[:, 10:],  # past the end: empty, as in PyTorch
        lambda x: x[0, 1, 2],
        lambda x: x[..., -9:100],
        lambda x: x.unsqueeze(0),
        lambda x: x.unsqueeze(2),
        lambda x: torch.unsqueeze(x, -1),
        lambda x: x.unsqueeze(-3),
        lambda x: torch.swapaxes(x, 0, 2),
        lambda x: x.swapaxes(-1, 1),
    ],
)
def test_indexing_matches_pytorch(fn):
    _same(Fn(fn), torch.randn(3, 4, 6))


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda x: x[::-1], "steps must be positive"),
        (lambda x: x[:, 7], "index 7 is out of bounds for dimension 1 with size 4"),
        (lambda x: x[0, 0, 0, 0], "4 indices for an input of shape"),
    ],
)
def test_bad_indices_name_the_operation(fn, match):
    with pytest.raises(ai3.Error, match=match):
        ai3.convert(Fn(fn))(torch.randn(3, 4, 6))


def test_indexing_with_tensors_is_unsupported():
    class Gather(nn.Module):
        def forward(self, x, i):
            return x[i]

    with pytest.raises(ai3.UnsupportedOperationError, match="index computed by the network"):
        ai3.convert(Gather())


class ClassToken(nn.Module):
    """ViT's class token: a parameter expanded to the batch, then concatenated."""

    def __init__(self):
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, 8))

    def forward(self, x):
        n = x.shape[0]
        return torch.cat([self.token.expand(n, -1, -1), x], dim=1)


def test_expand_follows_the_batch():
    module = ClassToken().eval()
    model = _same(module, torch.randn(3, 5, 8))
    x = torch.randn(7, 2, 8)
    assert_close(model(x), module(x), torch.float32)


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda x: x.expand(2, 3, 4), (3, 1)),
        (lambda x: x.expand(-1, 5), (3, 1)),
        (lambda x: x.expand(4, -1), (1, 6)),
        (lambda x: x.expand(2, -1, -1), (3, 4)),
        (lambda x: x.expand(0, 3, 4), (3, 4)),
    ],
)
def test_expand_matches_pytorch(fn, shape):
    _same(Fn(fn), torch.randn(shape))


def test_expand_of_a_size_other_than_one_is_an_error():
    with pytest.raises(ai3.ShapeError, match="size 5 at dimension 1 cannot expand size 4"):
        ai3.convert(Fn(lambda x: x.expand(3, 5)))(torch.randn(3, 4))


class Asserting(nn.Module):
    """ViT's shape checks: ``torch._assert`` on sizes and on the rank."""

    def forward(self, x):
        n, c, h, w = x.shape
        torch._assert(h == 8, "wrong height")
        torch._assert(x.dim() == 4, "wrong rank")
        return x.flatten(2)


def test_shape_assertions_are_checked_at_convert_time_and_dropped():
    model = _same(Asserting(), torch.randn(2, 3, 8, 5))
    assert [r["op"] for r in model.summary((2, 3, 8, 5))] == ["flatten"]
    with pytest.raises(ai3.ShapeError, match="fails on sample_input_shape.*wrong height"):
        ai3.convert(Asserting(), sample_input_shape=(2, 3, 9, 5))


def test_an_assertion_on_values_is_unsupported():
    class Values(nn.Module):
        def forward(self, x):
            torch._assert(x.sum() > 0, "positive")
            return x

    with pytest.raises(ai3.UnsupportedOperationError):
        ai3.convert(Values())


class Attn(nn.Module):
    def __init__(self, mask=None, **kwargs):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, **kwargs)
        self.register_buffer("mask", mask)

    def forward(self, q, kv):
        return self.mha(q, kv, kv, attn_mask=self.mask, need_weights=False)[0]


class SelfAttn(Attn):
    def forward(self, x):
        out, _ = self.mha(x, x, x, attn_mask=self.mask)
        return out


@pytest.mark.parametrize("algo", ["naive", "flash", "default"])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_multihead_self_attention_is_one_node(algo, batch_first, bias):
    """One multihead_attention node, whose attention algorithm the
    ``attention`` selector (or its own) chooses; batched and unbatched."""
    torch.manual_seed(0)
    module = SelfAttn(batch_first=batch_first, bias=bias)
    for key in ("attention", "multihead_attention"):
        model = _same(module, torch.randn(3, 10, 16), algos={key: algo})
        rows = model.summary((3, 10, 16))
        assert [r["op"] for r in rows] == ["multihead_attention"]
        if algo != "default":
            assert rows[0]["algorithm"] == algo
    x = torch.randn(10, 16)  # unbatched
    assert_close(model(x), module.eval()(x), torch.float32)


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("kdim", [None, 12])
def test_multihead_cross_attention_with_masks(mask, kdim):
    torch.manual_seed(1)
    held = {
        None: None,
        "bool": torch.rand(10, 7) > 0.7,  # True masks out, as MultiheadAttention reads it
        "float": torch.randn(10, 7),
    }[mask]
    module = Attn(held, batch_first=True, kdim=kdim, vdim=kdim)
    kv = torch.randn(2, 7, kdim or 16)
    _same(module, torch.randn(2, 10, 16), kv)


@pytest.mark.parametrize(
    "kwargs, call, match",
    [
        ({"add_bias_kv": True}, {}, "add_bias_kv"),
        ({}, {"key_padding_mask": True}, "key_padding_mask"),
    ],
)
def test_what_multihead_attention_cannot_do_is_named(kwargs, call, match):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(8, 2, batch_first=True, **kwargs)

        def forward(self, x):
            pad = x[:, :, 0] > 0 if call else None
            return self.mha(x, x, x, key_padding_mask=pad)[0]

    with pytest.raises(ai3.UnsupportedOperationError, match=match):
        ai3.convert(M().eval())


@pytest.mark.parametrize("fn", [torch.matmul, lambda a, b: a @ b, lambda a, b: a.matmul(b)])
@pytest.mark.parametrize(
    "sa, sb",
    [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 5)),
     ((2, 3, 4), (4,)), ((4,), (4,)), ((0, 3, 4), (4, 2)), ((3, 0), (0, 2))],
)  # fmt: skip
def test_matmul_broadcasts_like_pytorch(fn, sa, sb):
    _same(Two(fn), torch.randn(sa), torch.randn(sb))


def test_bmm_and_the_explicit_attention_pattern():
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 3)
    _same(Two(torch.bmm), q, k.transpose(1, 2).contiguous())

    class Explicit(nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1) * 8**-0.5, dim=-1) @ v

    _same(Explicit(), q, k, v)


def test_matmul_shape_errors_name_the_shapes():
    with pytest.raises(
        ai3.ShapeError, match=r"inner dimensions differ: shapes \[3, 4\] and \[5, 6\]"
    ):
        ai3.convert(Two(torch.matmul))(torch.randn(3, 4), torch.randn(5, 6))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.pad(x, (1, 2)),
        lambda x: F.pad(x, (0, 0, 0, 1, 2, 0), value=-3.5),
        lambda x: torch.roll(x, shifts=(-1, 2), dims=(1, 2)),
        lambda x: torch.roll(x, 5),
        lambda x: x.roll(-7, 0),
        lambda x: torch.roll(x, shifts=(1, 1), dims=(2, 2)),
    ],
)
def test_pad_and_roll_match_pytorch(fn):
    _same(Fn(fn), torch.randn(3, 4, 5))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.normalize(x),
        lambda x: F.normalize(x, dim=-1, eps=1e-3),
        lambda x: F.normalize(x * 0, dim=0),  # all zeros: divided by eps
    ],
)
def test_normalize_matches_pytorch(fn):
    _same(Fn(fn), torch.randn(3, 4, 5))


def test_normalize_other_than_l2_is_unsupported():
    with pytest.raises(ai3.UnsupportedOperationError, match="p=1"):
        ai3.convert(Fn(lambda x: F.normalize(x, p=1)))


def test_what_pad_cannot_do_is_named():
    with pytest.raises(ai3.UnsupportedOperationError, match="mode='reflect'"):
        ai3.convert(Fn(lambda x: F.pad(x, (1, 1), mode="reflect")))
    with pytest.raises(ai3.InvalidArgumentError, match="negative padding"):
        ai3.convert(Fn(lambda x: F.pad(x, (-1, 1))))


def _swin(name: str) -> nn.Module:
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval()


def test_maxvit_attention_is_one_attention_node_per_block():
    net = _swin("maxvit_t")
    model = ai3.convert(net)  # no sample shape needed
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        want = net(x)
    got = model(x)
    assert float((got - want).abs().max()) <= 1e-3 * float(want.abs().max())
    rows = model.summary((1, 3, 224, 224)).rows
    assert sum(r["op"] == "attention" for r in rows) == 2 * sum(len(b.layers) for b in net.blocks)


def test_swin_needs_a_sample_shape_and_says_so():
    with pytest.raises(ai3.UnsupportedOperationError, match="give convert a sample_input_shape"):
        ai3.convert(_swin("swin_t"))


@pytest.mark.parametrize(
    "name, algo", [("swin_t", "naive"), ("swin_t", "flash"), ("swin_v2_t", "flash")]
)
def test_swin_matches_pytorch(name, algo):
    net = _swin(name)
    size = 256 if name == "swin_v2_t" else 224
    model = ai3.convert(net, {"attention": algo}, sample_input_shape=(1, 3, size, size))
    x = torch.randn(2, 3, size, size)  # another batch than the sample's
    with torch.inference_mode():
        want = net(x)
    got = model(x)
    assert float((got - want).abs().max()) <= 1e-3 * float(want.abs().max())
    rows = model.summary((2, 3, size, size)).rows
    assert {r["algorithm"] for r in rows if r["op"] == "attention"} == {algo}
    assert sum(r["op"] == "roll" for r in rows) > 0


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda x: x.squeeze(), (1, 3, 1, 4)),
        (lambda x: x.squeeze(0), (1, 3, 1, 4)),
        (lambda x: x.squeeze(1), (1, 3, 1, 4)),  # size 3: kept, as in PyTorch
        (lambda x: torch.squeeze(x, -2), (1, 3, 1, 4)),
        (lambda x: x.squeeze((0, 2)), (1, 3, 1, 4)),
        (lambda x: x.squeeze(dim=(1, 3)), (2, 1, 3, 1)),
        (lambda x: x.sum(), (3, 4)),
        (lambda x: x.sum(1), (3, 4, 5)),
        (lambda x: torch.sum(x, (0, 2), keepdim=True), (3, 4, 5)),
        (lambda x: x.sum(-1, True), (3, 4, 5)),
        (lambda x: x.sum(0), (0, 4)),  # a sum over no elements is 0
    ],
)
def test_squeeze_and_sum_match_pytorch(fn, shape):
    _same(Fn(fn), torch.randn(shape))


def test_squeeze_follows_the_size_at_each_call():
    """Whether a dimension goes depends on its size in each call, not at convert time."""
    module = Fn(lambda x: x.squeeze(0))
    model = _same(module, torch.randn(1, 3))
    x = torch.randn(2, 3)
    assert model(x).shape == (2, 3)
    assert_close(model(x), module(x), torch.float32)


class Einsum(nn.Module):
    def __init__(self, equation):
        super().__init__()
        self.equation = equation

    def forward(self, a, b, c):
        return torch.einsum(self.equation, a, b, c)


_EINSUMS = [
    # equation, operand shapes; the first ones are MaxViT's and common attention code's.
    ("bhid,bhjd->bhij", [(2, 3, 5, 4), (2, 3, 6, 4)]),
    ("bhij,bhjd->bhid", [(2, 3, 5, 6), (2, 3, 6, 4)]),
    ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,kj", [(3, 4), (5, 4)]),  # implicit output: 'ik'
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij", [(3, 4)]),
    ("ji", [(3, 4)]),  # implicit output in alphabetical order: a transpose
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(3,), (3,)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("abcd,cdef->abef", [(2, 3, 4, 5), (4, 5, 6, 7)]),
    ("abc,abd->cd", [(2, 3, 4), (2, 3, 5)]),
    ("ijk,ik->j", [(2, 3, 4), (2, 4)]),
    ("bij,bjk,bkl->bil", [(2, 3, 4), (2, 4, 5), (2, 5, 6)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("bi,bj->bji", [(1, 3), (4, 5)]),  # a batch letter of size 1 broadcasts
]


@pytest.mark.parametrize("equation, shapes", _EINSUMS)
def test_einsum_matches_pytorch(equation, shapes):
    inputs = [torch.randn(s) for s in shapes]
    if len(inputs) == 1:
        module = Fn(lambda x: torch.einsum(equation, x))
    elif len(inputs) == 2:
        module = Two(lambda a, b: torch.einsum(equation, a, b))
    else:
        module = Einsum(equation)
    model = _same(module, *inputs)
    assert {r["op"] for r in model.summary([list(s) for s in shapes])} <= {
        "permute", "reshape", "matmul", "sum"
    }  # fmt: skip


def test_einsum_follows_the_sizes_of_each_call():
    module = Two(lambda q, k: torch.einsum("bhid,bhjd->bhij", q, k))
    model = _same(module, torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4))
    q, k = torch.randn(1, 3, 9, 4), torch.randn(1, 3, 2, 4)
    assert_close(model(q, k), module(q, k), torch.float32)


def test_einsum_with_an_ellipsis_is_captured_with_its_ranks():
    """'...' needs the operands' ranks: torch.export records them, torch.fx does not."""
    module = Two(lambda a, b: torch.einsum("...ij,...jk->...ik", a, b))
    with pytest.raises(ai3.UnsupportedOperationError, match="needs the operands' ranks"):
        ai3.convert(module)
    a, b = torch.randn(2, 3, 4, 5), torch.randn(3, 5, 6)
    model = ai3.convert(module, example_inputs=(a, b))
    assert_close(model(a, b), module(a, b), torch.float32)


@pytest.mark.parametrize(
    "equation, match",
    [
        ("ii->i", "subscript 'i' repeats within operand 'ii'"),
        ("ij->k", "output subscripts"),
        ("i1->i", "are not subscripts"),
        ("ij,jk->ik", "names 2 operand"),
    ],
)
def test_what_einsum_cannot_do_is_named(equation, match):
    with pytest.raises(ai3.UnsupportedOperationError, match=match):
        ai3.convert(Fn(lambda x: torch.einsum(equation, x)))


class ExplicitAttention(nn.Module):
    """Attention written out, as timm-style and Hugging Face "eager" code does."""

    def __init__(self, scaling="mul", mask=None, heads=4):
        super().__init__()
        self.qkv, self.heads, self.scaling = nn.Linear(32, 96), heads, scaling
        self.register_buffer("mask", mask)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1)
        if self.scaling == "mul":
            scores = scores * 0.3
        elif self.scaling == "div":
            scores = scores / 8**0.5
        if self.mask is not None:
            scores = self.mask + scores
        out = F.dropout(scores.softmax(dim=-1), 0.1, self.training) @ v
        return out.transpose(1, 2).reshape(b, n, c)


@pytest.mark.parametrize("algo", ["naive", "flash"])
@pytest.mark.parametrize(
    "scaling, mask",
    [("mul", None), ("div", None), (None, None), ("mul", torch.randn(1, 4, 10, 10)),
     ("div", torch.randn(10, 10)), (None, torch.randn(4, 1, 10))],
)  # fmt: skip
def test_explicit_attention_becomes_one_attention_node(scaling, mask, algo):
    """Given shapes, ``softmax(q @ kᵀ * s + mask) @ v`` is one attention node,
    whose algorithm selectors choose; the result still matches PyTorch."""
    module = ExplicitAttention(scaling, mask).eval()
    x = torch.randn(2, 10, 32)
    model = ai3.convert(module, {"attention": algo}, sample_input_shape=(2, 10, 32))
    rows = model.summary((2, 10, 32))
    assert [r["op"] for r in rows].count("attention") == 1
    assert not {"softmax", "matmul"} & {r["op"] for r in rows}
    assert [r["algorithm"] for r in rows if r["op"] == "attention"] == [algo]
    assert_close(model(x), module(x), torch.float32)
    x = torch.randn(2, 10, 32)  # a mask of fixed length: same length, another input
    assert_close(model(x), module(x), torch.float32)


def test_explicit_attention_is_left_alone_where_it_is_not_attention():
    """Without known shapes, with broadcast batches, a second reader of the
    scores, or a mask that grows the scores, the steps stay as written (and
    still match PyTorch)."""

    class Broadcast(nn.Module):
        def forward(self, q, k):
            return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ k

    class Reused(nn.Module):
        def forward(self, q, k, v):
            s = q @ k.transpose(-2, -1)
            return torch.softmax(s, dim=-1) @ v + s.sum()

    class Growing(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.randn(3, 1, 1, 7))

        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1) + self.mask, dim=-1) @ v

    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(1, 3, 7, 8), torch.randn(2, 3, 7, 8)
    cases = [
        (ExplicitAttention(), [torch.randn(2, 10, 32)], None),
        (Broadcast(), [q, k], [list(q.shape), list(k.shape)]),
        (Reused(), [q, k.expand(2, -1, -1, -1), v], [list(q.shape)] * 3),
        (Growing(), [q[:1], k, v[:1]], [[1, 3, 5, 8], [1, 3, 7, 8], [1, 3, 7, 8]]),
    ]
    for module, inputs, shapes in cases:
        module = module.eval()
        model = ai3.convert(module, sample_input_shape=shapes)
        assert "attention" not in {r["op"] for r in model.summary(shapes or inputs[0].shape)}
        assert_close(model(*inputs), module(*inputs), torch.float32)


class MaskFromInput(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, batch_first=batch_first)

    def forward(self, x, mask):
        return self.mha(x, x, x, attn_mask=mask)[0]


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_masks_per_head_and_from_inputs(batch_first):
    """A held 3-D mask (one per batch entry and head) and a float mask given
    as an input, in both layouts; ViT's blocks are one node each."""
    torch.manual_seed(2)
    module = Attn(torch.randn(2 * 4, 10, 7), batch_first=batch_first)
    q, kv = torch.randn(2, 10, 16), torch.randn(2, 7, 16)
    if not batch_first:
        q, kv = q.transpose(0, 1), kv.transpose(0, 1)
    _same(module, q, kv)
    x = torch.randn(3, 5, 16) if batch_first else torch.randn(5, 3, 16)
    _same(MaskFromInput(batch_first), x, torch.randn(5, 5))
    _same(MaskFromInput(batch_first), x, torch.randn(3 * 4, 5, 5))  # per batch entry and head
    vit = torchvision.models.VisionTransformer(32, 16, 2, 4, 64, 128, num_classes=10).eval()
    model = ai3.convert(vit)
    ops = [r["op"] for r in model.summary((1, 3, 32, 32))]
    assert ops.count("multihead_attention") == 2 and "attention" not in ops
    x = torch.randn(2, 3, 32, 32)
    assert_close(model(x), vit(x), torch.float32)
