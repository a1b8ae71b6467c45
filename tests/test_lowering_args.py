"""No lowering handler ignores an argument: each one ai3 does not implement
makes its node unsupported (named in the one ``UnsupportedOperationError``),
each one it implements gives PyTorch's values, and in-place operations give
PyTorch's answer wherever the changed tensor is read afterwards."""

from __future__ import annotations

import ai3
import pytest
import torch
import torch.nn.functional as F
from conftest import Fn, assert_close, reference
from torch import nn
from torchvision.ops import StochasticDepth


def rejected(module: nn.Module) -> dict[str, str]:
    """The unsupported nodes ``convert`` reports, by node name."""
    with pytest.raises(ai3.UnsupportedOperationError) as info:
        ai3.convert(module)
    return dict(info.value.nodes)


def converted(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """ai3's output, checked against PyTorch's on a copy of ``x`` (in-place
    operations may change the input PyTorch is given)."""
    expected = reference(module, x.clone())
    got = ai3.convert(module)(x)
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert_close(g, e)
    else:
        assert_close(got, expected)
    return got


# ---- arguments ai3 does not implement make the node unsupported ---------------------------

FUNCTIONAL = [
    ("torch.softmax-dtype", lambda x: torch.softmax(x, 1, torch.float64), "softmax", "dtype"),
    ("Tensor.softmax-dtype", lambda x: x.softmax(1, dtype=torch.float64), "softmax", "dtype"),
    ("Tensor.softmax-dtype-pos", lambda x: x.softmax(1, torch.float64), "softmax", "dtype"),
    ("torch.mean-out", lambda x: torch.mean(x, 1, out=x * 1), "mean", "out="),
    ("Tensor.mean-extra-pos", lambda x: x.mean(1, True, torch.float64), "mean", "positional"),
    ("Tensor.mean-unknown-kw", lambda x: x.mean(1, foo=True), "mean", "foo"),
    ("torch.cat-out", lambda x: torch.cat([x, x], 1, out=x * 1), "cat", "out="),
    ("torch.sigmoid-out", lambda x: torch.sigmoid(x, out=x * 1), "sigmoid", "out="),
    ("torch.tanh-out", lambda x: torch.tanh(x, out=x * 1), "tanh", "out="),
    ("Tensor.relu-extra-pos", lambda x: x.relu(3), "relu", "positional"),
    ("Tensor.contiguous-pos", lambda x: x.contiguous(torch.channels_last), "contiguous", "positional"),
    ("Tensor.size-extra-pos", lambda x: x.view(x.size(0, 1), -1), "size", "positional"),
    ("F.gelu-approximate", lambda x: F.gelu(x, approximate="foo"), "gelu", "approximate='foo'"),
    ("F.dropout-training-default", lambda x: F.dropout(x, 0.5), "dropout", "training=True"),
    ("F.dropout-training", lambda x: F.dropout(x, 0.2, training=True), "dropout", ".eval()"),
    ("F.dropout2d-training", lambda x: F.dropout2d(x, 0.2), "dropout2d", "training=True"),
    ("Tensor.chunk-computed", lambda x: x.chunk(x.size(0), 1)[0], "chunk", "chunks="),
    ("Tensor.flatten-computed", lambda x: x.flatten(x.size(0)), "flatten", "start_dim="),
    ("Tensor.mean-computed-dim", lambda x: x.mean(x.size(0)), "mean", "dim="),
    ("Tensor.transpose-named", lambda x: x.transpose("a", 1), "transpose", "dim0='a'"),
    ("torch.cat-not-a-list", lambda x: torch.cat(x), "cat", "tensors="),
    ("Tensor.chunk-zero", lambda x: x.chunk(0, 1)[0], "chunk", "chunks=0"),
    ("Tensor.split-negative", lambda x: x.split([-1, 4], 1)[0], "split", "split_size=[-1, 4]"),
    ("chunk-index-from-end", lambda x: x.chunk(2, 1)[-1], "getitem", "-1"),
    ("split-index-out-of-range", lambda x: x.split([1, 2], 1)[2], "getitem", "out of range"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "node", "word"), [c[1:] for c in FUNCTIONAL], ids=[c[0] for c in FUNCTIONAL]
)
def test_unimplemented_argument_is_reported(fn, node, word):
    nodes = rejected(Fn(fn))
    assert node in nodes, nodes
    assert word in nodes[node], nodes[node]


class Calls(nn.Module):
    """Calls a ReLU module with an extra argument, which nn.ReLU.forward does not take."""

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(x, 3)


MODULES = [
    ("Dropout-training", lambda: nn.Sequential(nn.Dropout(0.5)).train(), "_0", "training mode"),
    ("Dropout2d-training", lambda: nn.Sequential(nn.Dropout2d(0.5)).train(), "_0", ".eval()"),
    ("AlphaDropout-training", lambda: nn.Sequential(nn.AlphaDropout(0.5)).train(), "_0",
     "training mode"),
    ("BatchNorm2d-training", lambda: nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)).train(),
     "_1", "training mode"),
    ("module-extra-argument", Calls, "relu", "positional"),
    ("StochasticDepth-training", lambda: nn.Sequential(StochasticDepth(0.2, "row")).train(),
     "stochastic_depth", "training=True"),
    ("StochasticDepth-mode", lambda: nn.Sequential(StochasticDepth(0.2, "foo")).eval(),
     "stochastic_depth", "mode='foo'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "node", "word"), [c[1:] for c in MODULES], ids=[c[0] for c in MODULES]
)
def test_unimplemented_module_state_is_reported(make, node, word):
    nodes = rejected(make())
    assert node in nodes, nodes
    assert word in nodes[node], nodes[node]


@pytest.mark.parametrize("kind", ["forward", "forward_pre"])
def test_forward_hooks_are_reported(kind):
    """fx does not run a leaf module's hooks, nor the traced root's."""
    inner = nn.Sequential(nn.ReLU())
    getattr(inner[0], f"register_{kind}_hook")(lambda *args: None)
    assert "hooks" in rejected(inner)["_0"]
    root = nn.Sequential(nn.ReLU())
    getattr(root, f"register_{kind}_hook")(lambda *args: None)
    assert "hooks" in rejected(root)["Sequential"]


def test_global_forward_hook_is_reported():
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        assert "hooks" in rejected(nn.Sequential(nn.ReLU()))["_0"]
    finally:
        handle.remove()


def test_every_unsupported_argument_is_listed_together():
    def fn(x):
        a = x.softmax(1, dtype=torch.float64)
        b = torch.mean(x, 1, out=x * 1)
        return a.sum() + b.sum() + torch.cumsum(x, 1)

    nodes = rejected(Fn(fn))
    assert {"softmax", "mean", "cumsum"} <= set(nodes), nodes


# ---- malformed arguments are entries of the error, not crashes ----------------------------


@pytest.mark.parametrize("error", [KeyError, IndexError, TypeError, ValueError])
def test_handler_lookup_errors_become_entries(monkeypatch, error):
    """A handler tripping on arguments of an unexpected form reports its node
    (with the error), and the walk goes on to report every other one."""
    from ai3 import _lowering

    def broken(lw, n):
        raise error("odd arguments")

    monkeypatch.setitem(_lowering.METHODS, "relu", broken)
    nodes = rejected(Fn(lambda x: torch.cumsum(x.relu(), 1)))
    assert set(nodes) == {"relu", "cumsum"}, nodes
    assert error.__name__ in nodes["relu"] and "odd arguments" in nodes["relu"]


@pytest.mark.parametrize(
    "fn",
    [lambda x: F.max_pool2d(x, 2.5), lambda x: F.max_pool2d(x, (1, 2, 3))],
    ids=["float-kernel", "triple-kernel"],
)
def test_invalid_pooling_window_names_the_node(fn):
    """Never rounded or cut: PyTorch rejects these windows too."""
    with pytest.raises(ai3.InvalidArgumentError, match="max_pool2d.*kernel_size"):
        ai3.convert(Fn(fn))


@pytest.mark.parametrize(
    ("fn", "op"),
    [
        (lambda x: F.max_pool2d(x, -2), "maxpool2d"),
        (lambda x: F.avg_pool2d(x, 2, divisor_override=-1), "avgpool2d"),
        (lambda x: F.adaptive_avg_pool2d(x, -1), "adaptiveavgpool2d"),
        (lambda x: F.layer_norm(x, (-5,)), "layernorm"),
    ],
    ids=["maxpool", "avgpool-divisor", "adaptive", "layernorm"],
)
def test_negative_sizes_are_invalid_arguments(fn, op):
    with pytest.raises(ai3.InvalidArgumentError, match=op):
        ai3.convert(Fn(fn))


# ---- arguments ai3 implements give PyTorch's values ---------------------------------------

HONOURED = [
    ("Tensor.view-size-kw", lambda x: x.view(size=(2, -1))),
    ("Tensor.reshape-shape-kw", lambda x: x.reshape(shape=(x.size(0), 3, -1))),
    ("split-index-from-end", lambda x: x.split([1, 2], 1)[-1]),
    ("torch.split-index-from-end", lambda x: torch.split(x, [2, 1], dim=1)[-2]),
]


@pytest.mark.parametrize("fn", [c[1] for c in HONOURED], ids=[c[0] for c in HONOURED])
def test_implemented_argument_gives_pytorchs_values(fn):
    converted(Fn(fn), torch.randn(2, 3, 4, 5))


HARMLESS = [
    ("F.softmax-stacklevel", lambda x: F.softmax(x, 1, _stacklevel=5)),
    ("contiguous-memory-format", lambda x: x.contiguous(memory_format=torch.channels_last) * 2),
    ("F.dropout-p0-training", lambda x: F.dropout(x, 0.0, training=True) + 1),
    ("F.dropout-eval-inplace", lambda x: F.dropout(x, 0.5, False, True) + 1),
    ("torch.layer_norm-cudnn", lambda x: torch.layer_norm(x, [5], None, None, 1e-5, False)),
]


@pytest.mark.parametrize("fn", [c[1] for c in HARMLESS], ids=[c[0] for c in HARMLESS])
def test_harmless_argument_still_converts(fn):
    """Arguments that cannot change the values are not reasons to refuse a node."""
    converted(Fn(fn), torch.randn(2, 3, 4, 5))


def test_batch_norm_momentum_and_cudnn_flag_are_harmless():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.randn(3))
            self.register_buffer("var", torch.rand(3) + 0.5)

        def forward(self, x):
            y = F.batch_norm(x, self.mean, self.var, momentum=0.9)
            return torch.batch_norm(y, None, None, self.mean, self.var, False, 0.5, 1e-3, False)

    converted(Net(), torch.randn(2, 3, 4, 4))


def test_stochastic_depth_in_eval_mode_converts():
    converted(nn.Sequential(StochasticDepth(0.3, "row"), nn.ReLU()).eval(), torch.randn(2, 3))


def test_dropout_without_probability_in_training_mode_converts():
    converted(nn.Sequential(nn.Dropout(0.0), nn.ReLU()).train(), torch.randn(2, 3))


# ---- in-place operations --------------------------------------------------------------------


class ConvBnReLU(nn.Module):
    """The value before an in-place ReLU is read again afterwards."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.bn(self.conv(x))
        self.relu(y)
        return y + self.conv(x)


def _changed_twice(x):
    z = x * 1
    F.hardtanh(z, -0.5, 0.25, inplace=True)
    F.silu(z, inplace=True)
    return z + 1


def _through_dropout(x):
    z = x * 1
    d = F.dropout(z, 0.5, training=False)  # z itself, in eval
    F.relu(d, inplace=True)
    return z + d


class ThroughIdentity(nn.Module):
    """In-place through an alias module, then a view made after the change."""

    def __init__(self):
        super().__init__()
        self.identity = nn.Identity()

    def forward(self, x):
        z = x * 1
        torch.relu_(self.identity(z))
        return z.view(z.size(0), -1)


def _changed_view_read_itself(x):
    v = (x * 1).view(-1)
    F.relu(v, inplace=True)
    return v


def _changed_view_shape_of_base(x):
    z = x * 1
    n = z.size(0)
    v = z.view(-1)
    F.relu6(v, inplace=True)
    return v.view(n, -1)


INPLACE = [
    ("F.relu-then-input-read", lambda x: x + F.relu(x, inplace=True)),
    ("F.relu-then-intermediate-read", lambda x: (lambda z: F.relu(z, inplace=True) + z)(x * 1)),
    ("Tensor.relu_", lambda x: (lambda z: (z.relu_(), z * 2)[1])(x * 1)),
    ("Tensor.sigmoid_", lambda x: (lambda z: (z.sigmoid_(), z - 1)[1])(x * 1)),
    ("Tensor.tanh_", lambda x: (lambda z: (z.tanh_(), z - 1)[1])(x * 1)),
    ("torch.relu_-both-outputs", lambda x: (lambda z: (z, torch.relu_(z)))(x * 1)),
    ("changed-twice", _changed_twice),
    ("through-dropout", _through_dropout),
    ("changed-view-read-itself", _changed_view_read_itself),
    ("changed-view-shape-of-base", _changed_view_shape_of_base),
]


@pytest.mark.parametrize("fn", [c[1] for c in INPLACE], ids=[c[0] for c in INPLACE])
def test_in_place_change_is_seen_by_later_readers(fn):
    converted(Fn(fn), torch.randn(2, 3, 4, 5))


def test_in_place_through_identity_module():
    converted(ThroughIdentity(), torch.randn(2, 3, 4))


def test_in_place_relu_module_before_a_second_reader():
    converted(ConvBnReLU().eval(), torch.randn(2, 3, 6, 6))


def test_in_place_change_of_an_input_leaves_the_callers_tensor_unchanged():
    """ai3 never writes into the tensors given to the model (documented in convert)."""
    x = torch.randn(2, 3, 4)
    before = x.clone()
    got = converted(Fn(lambda x: x + F.relu(x, inplace=True)), x)
    assert torch.equal(x, before)
    assert_close(got, 2 * before.relu())


def _base_read_after_view_changed(x):
    z = x * 1
    v = z.view(-1)
    F.relu(v, inplace=True)
    return z


def _view_read_after_base_changed(x):
    z = x * 1
    v = z.view(-1)
    F.relu(z, inplace=True)
    return v


def _piece_read_after_base_changed(x):
    z = x * 1
    a, _ = z.chunk(2, 1)
    F.relu(z, inplace=True)
    return a


def _contiguous_read_after_base_changed(x):
    z = x * 1
    c = z.contiguous()
    z.relu_()
    return c * 2


STALE = [
    ("base-after-view-changed", _base_read_after_view_changed, "output", "mul"),
    ("view-after-base-changed", _view_read_after_base_changed, "output", "view"),
    ("piece-after-base-changed", _piece_read_after_base_changed, "output", "getitem"),
    ("contiguous-after-base-changed", _contiguous_read_after_base_changed, "mul_1", "contiguous"),
]


@pytest.mark.parametrize(("fn", "node", "stale"), [c[1:] for c in STALE], ids=[c[0] for c in STALE])
def test_alias_read_after_an_in_place_change_is_reported(fn, node, stale):
    """ai3 computes views as copies: a view or alias of memory changed in place
    through another tensor, read afterwards, would be stale."""
    nodes = rejected(Fn(fn))
    assert node in nodes, nodes
    assert f"reads '{stale}'" in nodes[node] and "in-place" in nodes[node], nodes[node]


def test_in_place_change_of_a_module_tensor_is_reported():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))

        def forward(self, x):
            return x + F.relu(self.w, inplace=True)

    assert "in place" in rejected(Net())["relu"]


def test_an_operation_has_one_lowering_handler():
    """Registering a second handler for an operation is refused, and nothing
    of that call is registered."""
    from ai3 import _lowering

    before = (dict(_lowering.MODULES), dict(_lowering.FUNCTIONS), dict(_lowering.METHODS))
    with pytest.raises(ValueError, match="relu"):
        _lowering.register(methods={"a_new_method": print, "relu": print})
    assert (_lowering.MODULES, _lowering.FUNCTIONS, _lowering.METHODS) == before
    with pytest.raises(ValueError, match="ReLU"):
        _lowering.register(modules={nn.ReLU: print})
    assert _lowering.MODULES == before[0]
