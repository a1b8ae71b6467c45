"""Capture through ``torch.export`` (``convert(..., example_inputs=...)``):
Hugging Face BERT and GPT-2 built from their configs (random weights, nothing
downloaded), embeddings and integer inputs, tensors computed from input
shapes (position ids, causal masks), each compared with PyTorch at run time
on shapes other than the example's."""

from __future__ import annotations

import pickle

import ai3
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel, GPT2Config, GPT2Model


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).abs().max() / ref.abs().max())


def _check(module: nn.Module, model: ai3.Model, shape, vocab: int, tol: float = 1e-5) -> None:
    x = torch.randint(0, vocab, shape)
    with torch.no_grad():
        ref = module(x)
    got = model(x)
    assert type(got) is type(ref)
    for key in got.keys():  # the converted model returns no key/value cache
        assert got[key].shape == ref[key].shape, key
        assert _rel(got[key], ref[key]) < tol, (key, shape)


def _bert(small: bool) -> nn.Module:
    cfg = (
        BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=96)
        if small
        else BertConfig()
    )
    return BertModel(cfg).eval()


def _gpt2(small: bool) -> nn.Module:
    return GPT2Model(GPT2Config(n_layer=2, n_embd=64, n_head=4) if small else GPT2Config()).eval()


MODELS = {"bert": _bert, "gpt2": _gpt2}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    "small, shapes",
    [
        # a new batch and length, the example's again, then one seen before
        pytest.param(True, [(2, 16), (3, 37), (1, 5), (3, 37)], id="small"),
        # BERT-base and GPT-2 small, at two sequence lengths
        pytest.param(False, [(2, 16), (1, 64)], id="base", marks=pytest.mark.slow),
    ],
)
def test_transformers_match_and_follow_batch_and_sequence_length(name, small, shapes):
    torch.manual_seed(0)
    module = MODELS[name](small)
    vocab = module.config.vocab_size
    model = ai3.convert(module, example_inputs=torch.randint(0, vocab, (2, 16)))
    for shape in shapes:
        _check(module, model, shape, vocab)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_eager_attention_code_becomes_attention_nodes(name):
    """The models' "eager" attention (matmul, scale, mask, softmax, matmul)
    is rewritten into one attention node per layer."""
    torch.manual_seed(0)
    module = MODELS[name](True)
    module.config._attn_implementation = "eager"
    vocab = module.config.vocab_size
    model = ai3.convert(module, example_inputs=torch.randint(0, vocab, (2, 16)))
    ops = [r["op"] for r in model.summary()]
    assert ops.count("attention") == 2 and "softmax" not in ops, ops
    for shape in [(2, 16), (3, 9)]:
        _check(module, model, shape, vocab)


def test_captured_model_pickles_and_keeps_its_structure():
    torch.manual_seed(0)
    module = _gpt2(True)
    model = ai3.convert(module, example_inputs=torch.randint(0, 100, (2, 8)))
    x = torch.randint(0, 100, (2, 11))
    again = pickle.loads(pickle.dumps(model))
    assert torch.equal(again(x).last_hidden_state, model(x).last_hidden_state)
    with pytest.raises(ai3.InvalidArgumentError, match=r"expected 1 input\(s\), got 2"):
        model(x, x)
    rows = model.summary([2, 9])
    assert [r["op"] for r in rows].count("attention") == 2


def test_selectors_see_the_modules_of_a_captured_graph():
    torch.manual_seed(0)
    module = _bert(True)
    seen = []

    def pick(m, shape):  # the example inputs give the sample shapes
        seen.append((m, shape))
        return "default"

    model = ai3.convert(
        module,
        {"linear": pick, "attention": ["naive", "flash"]},
        example_inputs=torch.zeros(2, 8, dtype=torch.long),
    )
    assert len(seen) == 2 * 6 + 1 and all(isinstance(m, nn.Linear) for m, _ in seen)
    assert seen[0][0] is module.encoder.layer[0].attention.self.query
    assert list(seen[0][1]) == [2, 8, 64]
    algos = [r["algorithm"] for r in model.summary([2, 8]) if r["op"] == "attention"]
    assert algos == ["naive", "flash"]
    _check(module, model, (2, 8), 100)


class TinyLM(nn.Module):
    """Token and position embeddings, a causal mask built from the length, attention."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, 16)
        self.pos = nn.Embedding(64, 16)
        self.qkv = nn.Linear(16, 48)

    def forward(self, ids):
        b, s = ids.shape
        h = self.tok(ids) + self.pos(torch.arange(s))
        q, k, v = self.qkv(h).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, s, 16) ** 3


def test_shape_derived_positions_and_masks_are_computed_per_shape():
    torch.manual_seed(0)
    lm = TinyLM().eval()
    # torch.fx traces it, but cannot lower torch.arange: convert captures it with torch.export.
    model = ai3.convert(lm, example_inputs=torch.randint(0, 50, (2, 6)))
    for shape in [(2, 6), (1, 9), (4, 3)]:
        x = torch.randint(0, 50, shape)
        with torch.no_grad():
            ref = lm(x)
        assert _rel(model(x), ref) < 1e-5, shape


def test_embedding_through_fx_and_its_errors():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3)).eval()
    model = ai3.convert(net)
    x = torch.tensor([[1, 9, 0], [4, 4, 2]])
    with torch.no_grad():
        ref = net(x)
    assert _rel(model(x), ref) < 1e-6
    with pytest.raises(ai3.InvalidArgumentError, match=r"not a row of the table of 10 rows.*\[1\]"):
        model(torch.tensor([10]))
    with pytest.raises(ai3.InvalidArgumentError, match="index -1 is not a row"):
        model(torch.tensor([-1]))
    with pytest.raises(ai3.DtypeError, match=r"indices of shape \[2\] are torch.float32"):
        model(torch.tensor([1.0, 2.0]))
    with pytest.raises(ai3.DtypeError, match="beyond what torch.float32 holds exactly"):
        model(torch.tensor([2**24]))


def test_embedding_function_and_unsupported_max_norm():
    class Fn(nn.Module):
        def __init__(self, max_norm=None):
            super().__init__()
            self.table = nn.Parameter(torch.randn(7, 5))
            self.max_norm = max_norm

        def forward(self, ids):
            return F.embedding(ids, self.table, max_norm=self.max_norm)

    x = torch.tensor([[6, 0, 3]])
    fn = Fn().eval()
    assert torch.equal(ai3.convert(fn)(x), fn(x).detach())
    with pytest.raises(ai3.UnsupportedOperationError, match="max_norm=1.0"):
        ai3.convert(nn.Sequential(nn.Embedding(7, 5, max_norm=1.0)))


class Branchy(nn.Module):
    """Branches on a size, which torch.fx cannot trace."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        if x.shape[-1] > 3:
            return torch.relu(self.lin(x))
        return x


def test_untraceable_networks_need_example_inputs():
    with pytest.raises(ai3.UnsupportedOperationError, match="example_inputs"):
        ai3.convert(Branchy())
    net = Branchy().eval()
    model = ai3.convert(net, example_inputs=torch.randn(2, 8))
    x = torch.randn(5, 8)
    assert _rel(model(x), net(x).detach()) < 1e-6
    with pytest.raises(ai3.InvalidArgumentError, match=r"expected 1 input\(s\), got 2"):
        model(x, x)


def test_integer_inputs_read_as_numbers_are_unsupported():
    class AddIds(nn.Module):
        def forward(self, ids):
            if ids.shape[0] > 0:  # (not traceable by torch.fx)
                return ids + 1.5
            return ids

    with pytest.raises(ai3.UnsupportedOperationError, match="integer input of shape"):
        ai3.convert(AddIds(), example_inputs=torch.zeros(2, 3, dtype=torch.long))


def test_sequences_too_long_for_the_tables_and_failing_shape_code_are_clear_errors():
    lm = TinyLM().eval()
    model = ai3.convert(lm, example_inputs=torch.randint(0, 50, (2, 6)))
    # The position embeddings depend on the length alone: PyTorch computes them, per shape.
    with pytest.raises(
        ai3.ShapeError, match=r"shapes \[\[1, 70\]\]: IndexError: index out of range"
    ):
        model(torch.randint(0, 50, (1, 70)))  # 64 positions in the table

    class Halves(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Embedding(32, 4)

        def forward(self, ids):
            return self.pos(torch.arange(ids.shape[1]).view(2, -1))

    halves = Halves().eval()
    model = ai3.convert(halves, example_inputs=torch.zeros(2, 6, dtype=torch.long))
    x = torch.zeros(2, 8, dtype=torch.long)
    assert torch.equal(model(x), halves(x).detach())
    with pytest.raises(ai3.ShapeError, match=r"inputs of shapes \[\[2, 7\]\]"):
        model(torch.zeros(2, 7, dtype=torch.long))
