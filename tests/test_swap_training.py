"""Swapped networks keep being PyTorch networks: they train (gradients equal
PyTorch's), optimizers update them, they compile with ``torch.compile`` and
they pickle and deep-copy. Converted models pickle and deep-copy too."""

from __future__ import annotations

import copy
import pickle

import ai3
import pytest
import torch
import torch.nn.functional as F
from ai3 import swap
from conftest import DTYPE_IDS, DTYPES, assert_close, reference
from torch import nn

OPS = ["conv2d", "linear", "relu", "maxpool2d", "avgpool2d", "adaptiveavgpool2d", "flatten"]
TORCH_TYPES = (
    nn.Conv2d,
    nn.Linear,
    nn.ReLU,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.Flatten,
)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 6, 3, padding=1, bias=False)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.AvgPool2d(2)
        self.conv3 = nn.Conv2d(6, 6, 3, padding="same", padding_mode="reflect")
        self.adapt = nn.AdaptiveAvgPool2d((3, 2))
        self.flat = nn.Flatten()
        self.fc = nn.Linear(6 * 3 * 2, 5)

    def forward(self, x):
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = self.conv3(x)
        return self.fc(self.flat(self.adapt(x)))


def swap_all(net: nn.Module, conv_algo: str = "default") -> nn.Module:
    for op in OPS:
        net = ai3.swap_operation(op, net, conv_algo if op == "conv2d" else "default")
    leftover = [type(m).__name__ for m in net.modules() if type(m) in TORCH_TYPES]
    assert not leftover, f"not swapped: {leftover}"
    return net


def make(dtype=torch.float32, conv_algo="default"):
    ref = SmallCNN().to(dtype)
    net = swap_all(copy.deepcopy(ref), conv_algo)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    return ref, net, x


CONV_ALGOS = ["direct", "smm", "gemm", "winograd", "default"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("conv_algo", CONV_ALGOS)
def test_forward_matches(conv_algo, dtype):
    ref, net, x = make(dtype, conv_algo)
    assert isinstance(net.conv1, swap.Conv2d) and net.conv1.algorithm == conv_algo
    assert_close(net(x), reference(ref, x), dtype)


def _grads(net: nn.Module, x: torch.Tensor, w: torch.Tensor):
    x = x.clone().requires_grad_(True)
    net.zero_grad()
    out = net(x)
    loss = (out * w).sum()
    loss.backward()
    params = {n: p.grad.clone() for n, p in net.named_parameters()}
    return out.detach(), x.grad.clone(), params


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("conv_algo", CONV_ALGOS)
def test_gradients_match(conv_algo, dtype):
    ref, net, x = make(dtype, conv_algo)
    w = torch.randn(2, 5, dtype=dtype)
    out_ref, gx_ref, gp_ref = _grads(ref, x, w)
    out, gx, gp = _grads(net, x, w)
    assert_close(out, out_ref, dtype)
    assert_close(gx, gx_ref, dtype)
    assert gp.keys() == gp_ref.keys(), (gp.keys(), gp_ref.keys())
    for name in gp_ref:
        assert_close(gp[name], gp_ref[name], dtype)


@pytest.mark.parametrize("op", OPS)
def test_gradient_of_each_op_alone(op):
    """Each custom op's backward against torch's, in f64 with non-trivial hyperparameters."""
    layers = {
        "conv2d": (nn.Conv2d(3, 4, 3, stride=2, padding=1, dilation=2, groups=1), (2, 3, 9, 8)),
        "linear": (nn.Linear(6, 4), (2, 3, 6)),
        "relu": (nn.ReLU(), (2, 3, 5, 4)),
        "maxpool2d": (nn.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 3, 9, 8)),
        "avgpool2d": (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 3, 9, 8)),
        "adaptiveavgpool2d": (nn.AdaptiveAvgPool2d((4, 3)), (2, 3, 9, 7)),
        "flatten": (nn.Flatten(1, 2), (2, 3, 5, 4)),
    }
    layer, shape = layers[op]
    ref = nn.Sequential(layer).double()
    net = ai3.swap_operation(op, copy.deepcopy(ref), "default")
    assert not isinstance(net[0], TORCH_TYPES)
    x = torch.randn(shape, dtype=torch.float64)
    w = torch.randn_like(ref(x))
    out_ref, gx_ref, gp_ref = _grads(ref, x, w)
    out, gx, gp = _grads(net, x, w)
    assert_close(out, out_ref)
    assert_close(gx, gx_ref)
    for name in gp_ref:
        assert_close(gp[name], gp_ref[name])


@pytest.mark.parametrize("conv_algo", ["gemm", "winograd"])
def test_optimizer_step(conv_algo):
    ref, net, x = make(torch.float64, conv_algo)
    # The swapped modules share the Parameters of the deep copy, not of ref.
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    target = torch.randn(2, 5, dtype=torch.float64)
    for _ in range(2):
        for model, opt_ in ((ref, opt_ref), (net, opt)):
            opt_.zero_grad()
            F.mse_loss(model(x), target).backward()
            opt_.step()
    for name, p in net.named_parameters():
        assert not torch.equal(p.detach(), before[name]), f"{name} did not change"
        assert_close(p.detach(), dict(ref.named_parameters())[name].detach())
    # The next forward uses the updated weights (no stale packed/transformed copy).
    out = net(x)
    assert_close(out, reference(ref, x))
    fresh = swap_all(copy.deepcopy(ref), conv_algo)
    assert_close(out, fresh(x).detach())


def test_in_place_weight_change_is_seen_by_swapped_module():
    ref, net, x = make(torch.float64, "winograd")
    out0 = net(x).detach()
    with torch.no_grad():
        net.conv1.weight.mul_(2.0)
        net.fc.bias.add_(1.0)
        ref.conv1.weight.mul_(2.0)
        ref.fc.bias.add_(1.0)
    out1 = net(x).detach()
    assert not torch.allclose(out0, out1)
    assert_close(out1, reference(ref, x))


def _cached_model(weight: torch.Tensor):
    """The ai3 model a swapped layer keeps for ``weight``, or None."""
    from ai3 import _custom_ops

    entry = _custom_ops._BY_WEIGHT.get(id(weight))
    return None if entry is None or entry[0]() is not weight else entry[2]


def test_swapped_layer_keeps_its_packed_weights_until_they_change():
    """Weights are transformed once, not per call; any change PyTorch can see
    (in-place update, load_state_dict, a new ``.data``) rebuilds them."""
    ref, net, x = make(torch.float64, "winograd")
    w = net.conv1.weight
    with torch.no_grad():
        net(x)
        first = _cached_model(w)
        assert first is not None
        net(x)
        assert _cached_model(w) is first
        assert_close(net(x), reference(ref, x))

        w.add_(0.25)
        ref.conv1.weight.add_(0.25)
        assert_close(net(x), reference(ref, x))
        assert _cached_model(w) is not first

        state = {k: torch.randn_like(v) for k, v in ref.state_dict().items()}
        ref.load_state_dict(state)
        net.load_state_dict(state)
        assert_close(net(x), reference(ref, x))

        fresh = torch.randn_like(w)
        w.data = fresh.clone()
        ref.conv1.weight.data = fresh.clone()
        net.fc.bias.data = torch.randn_like(net.fc.bias)
        ref.fc.bias.data = net.fc.bias.data.clone()
        assert_close(net(x), reference(ref, x))


def test_cached_models_leave_with_their_weights():
    import gc

    from ai3 import _custom_ops

    conv = swap.Conv2d(nn.Conv2d(3, 4, 3), "winograd")
    with torch.no_grad():
        conv(torch.randn(1, 3, 8, 8))
    key = id(conv.weight)
    assert key in _custom_ops._BY_WEIGHT
    del conv
    gc.collect()
    assert key not in _custom_ops._BY_WEIGHT


def test_layers_sharing_a_weight_with_different_settings():
    shared = nn.Conv2d(4, 4, 3, padding=1)
    other = nn.Conv2d(4, 4, 3)  # same weight, no padding
    other.weight, other.bias = shared.weight, shared.bias
    ref = nn.Sequential(shared, other)
    net = ai3.swap_conv2d(copy.deepcopy(ref), "winograd")
    assert net[0].weight is net[1].weight
    x = torch.randn(2, 4, 12, 12)
    with torch.no_grad():
        for _ in range(2):
            assert_close(net(x), ref(x))


def test_weights_made_under_inference_mode():
    """Inference tensors have no version counter: such layers are rebuilt per call,
    and swapping them says so, once per call of swap_operation."""
    with torch.inference_mode():
        ref = nn.Sequential(nn.Conv2d(3, 5, 3), nn.Linear(6, 2))
        with pytest.warns(
            UserWarning, match=r"1 swapped conv2d layer\(s\) .*inference tensors"
        ) as caught:
            net = ai3.swap_conv2d(copy.deepcopy(ref), "winograd")
        assert caught[0].filename == __file__  # points at the caller, not at ai3
        with pytest.warns(UserWarning, match=r"1 swapped linear layer\(s\)"):
            net = ai3.swap_operation("linear", net)
        x = torch.randn(2, 3, 8, 8)
        assert_close(net(x), ref(x))
        ref[0].weight.mul_(-2.0)
        net[0].weight.mul_(-2.0)
        ref[1].bias.add_(3.0)
        net[1].bias.add_(3.0)
        assert_close(net(x), ref(x))


def test_weights_made_outside_inference_mode_do_not_warn():
    """A network built normally and run under inference_mode: no warning."""
    import warnings

    ref = nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net = ai3.swap_conv2d(copy.deepcopy(ref))
        with torch.inference_mode():
            x = torch.randn(2, 3, 8, 8)
            assert_close(net(x), ref(x))


def test_converted_model_keeps_its_own_weights():
    """convert copies the weights: changing the module afterwards does not change the model."""
    ref = SmallCNN()
    x = torch.randn(2, 3, 16, 16)
    expected = reference(ref, x)
    model = ai3.convert(ref, {"conv2d": "winograd"})
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(-3.0)
    assert_close(model(x), expected)


def test_train_mode_and_eval_mode_same_output():
    ref, net, x = make()
    net.train()
    a = net(x).detach()
    net.eval()
    b = net(x).detach()
    assert torch.equal(a, b)


# ---- torch.compile ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph(backend):
    torch._dynamo.reset()
    ref, net, x = make(torch.float32, "smm")
    compiled = torch.compile(net, fullgraph=True, backend=backend)
    assert_close(compiled(x), reference(ref, x))
    # Another batch size, and gradients through the compiled graph.
    x3 = torch.randn(3, 3, 16, 16)
    w = torch.randn(3, 5)
    out_ref, gx_ref, gp_ref = _grads(ref, x3, w)
    out, gx, gp = _grads(compiled, x3, w)
    assert_close(out, out_ref)
    assert_close(gx, gx_ref)
    for name in gp_ref:
        key = name if name in gp else f"_orig_mod.{name}"
        assert_close(gp[key], gp_ref[name])


def test_compile_inductor():
    torch._dynamo.reset()
    ref, net, x = make(torch.float32, "gemm")
    compiled = torch.compile(net, fullgraph=True)
    with torch.no_grad():
        assert_close(compiled(x), reference(ref, x))


def _count_direct_calls(monkeypatch) -> dict:
    """Counts, per operator, the calls that skip the dispatcher (the eager
    implementations reached through ``_custom_ops.call``'s fast path)."""
    from ai3 import _custom_ops

    counts = {op: 0 for op in OPS}
    for op in OPS:
        impl = _custom_ops._EAGER[op]

        def counted(*args, _impl=impl, _op=op):
            counts[_op] += 1
            return _impl(*args)

        monkeypatch.setitem(_custom_ops._EAGER, op, counted)
    return counts


def test_inference_mode_skips_the_dispatcher(monkeypatch):
    ref, net, x = make(torch.float32)
    counts = _count_direct_calls(monkeypatch)
    with torch.inference_mode():
        assert_close(net(x), reference(ref, x))
    # Every swapped layer ran its implementation directly, each once.
    assert counts == {op: (3 if op == "conv2d" else 2 if op == "relu" else 1) for op in OPS}


def test_dispatcher_is_kept_where_it_records_something(monkeypatch):
    ref, net, x = make(torch.float32)
    counts = _count_direct_calls(monkeypatch)
    # Autograd (training), no_grad (not inference mode) and torch.compile under
    # inference mode all go through torch.ops.ai3.
    out = net(x)
    out.sum().backward()
    with torch.no_grad():
        assert_close(net(x), reference(ref, x))
    torch._dynamo.reset()
    compiled = torch.compile(net, fullgraph=True, backend="eager")
    with torch.inference_mode():
        assert_close(compiled(x), reference(ref, x))
    assert counts == {op: 0 for op in OPS}


def _op_samples():
    f = torch.float64
    x = torch.randn(2, 3, 9, 8, dtype=f, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=f, requires_grad=True)
    wg = torch.randn(6, 1, 3, 3, dtype=f, requires_grad=True)
    b = torch.randn(4, dtype=f, requires_grad=True)
    lw = torch.randn(5, 8, dtype=f, requires_grad=True)
    lb = torch.randn(5, dtype=f, requires_grad=True)
    ops = torch.ops.ai3
    return [
        ("conv2d", ops.conv2d, (x, w, b, [1, 1], [1, 1], [1, 1], 1, "direct")),
        ("conv2d_strided", ops.conv2d, (x, w, None, [2, 1], [0, 1], [2, 1], 1, "gemm")),
        ("conv2d_groups", ops.conv2d, (x, wg, None, [1, 2], [1, 0], [1, 1], 3, "smm")),
        ("conv2d_winograd", ops.conv2d, (x, w, b, [1, 1], [1, 1], [1, 1], 1, "winograd")),
        ("linear", ops.linear, (torch.randn(2, 3, 8, dtype=f, requires_grad=True), lw, lb, "gemm")),
        ("linear_nobias", ops.linear, (torch.randn(4, 8, dtype=f), lw, None, "default")),
        ("relu", ops.relu, (x, "direct")),
        ("maxpool2d", ops.maxpool2d, (x, [3, 3], [2, 2], [1, 1], [1, 1], True, "direct")),
        ("maxpool2d_dil", ops.maxpool2d, (x, [2, 3], [1, 2], [1, 0], [2, 1], False, "direct")),
        ("avgpool2d", ops.avgpool2d, (x, [3, 3], [2, 2], [1, 1], True, False, None, "direct")),
        ("avgpool2d_div", ops.avgpool2d, (x, [2, 3], [2, 1], [0, 1], False, True, 5, "direct")),
        ("adaptiveavgpool2d", ops.adaptiveavgpool2d, (x, [4, 3], "direct")),
        ("flatten", ops.flatten, (x, 1, -1, "direct")),
        ("flatten_mid", ops.flatten, (x, 1, 2, "direct")),
    ]


@pytest.mark.parametrize(
    ("op", "args"), [(f, a) for _, f, a in _op_samples()], ids=[i for i, _, _ in _op_samples()]
)
def test_custom_op_opcheck(op, args):
    """torch.library.opcheck: schema, fake (meta) implementation and autograd registration."""
    torch.library.opcheck(op, args)


@pytest.mark.parametrize(
    ("op", "args"), [(f, a) for _, f, a in _op_samples()], ids=[i for i, _, _ in _op_samples()]
)
def test_custom_op_fake_shape_equals_real(op, args):
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = op(*args)
    mode = FakeTensorMode()
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        fake = op(*fake_args)
    assert tuple(fake.shape) == tuple(real.shape)
    assert fake.dtype == real.dtype


# ---- pickle / deepcopy --------------------------------------------------------------------


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_swapped_module_pickle_and_deepcopy(how):
    ref, net, x = make(torch.float32, "winograd")
    expected = reference(ref, x)
    clone = pickle.loads(pickle.dumps(net)) if how == "pickle" else copy.deepcopy(net)
    assert isinstance(clone.conv1, swap.Conv2d) and clone.conv1.algorithm == "winograd"
    assert clone.conv1.weight is not net.conv1.weight
    assert_close(clone(x), expected)
    assert_close(net(x), expected)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_model_pickle_and_deepcopy(how, dtype):
    ref = SmallCNN().to(dtype)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    expected = reference(ref, x)
    model = ai3.convert(ref, {"conv2d": ["direct", "smm", "winograd"]}, (2, 3, 16, 16))
    clone = pickle.loads(pickle.dumps(model)) if how == "pickle" else copy.deepcopy(model)
    assert isinstance(clone, ai3.Model)
    assert clone.dtype == dtype
    out = clone(x)
    assert_close(out, expected, dtype)
    assert torch.equal(out, model(x))
    assert [r["algorithm"] for r in clone.summary()] == [r["algorithm"] for r in model.summary()]
    del model  # the clone owns its weights
    assert_close(clone(x), expected, dtype)
