"""Lowering a ``torch.fx`` graph to ai3 operations.

Each fx node becomes a :class:`Step` (one ai3 node), an alias of another
value (Dropout, Identity, ``contiguous``), a symbolic size (``x.size(0)``),
or the pieces of a ``chunk``/``split`` that later ``getitem`` nodes slice.
Nodes ai3 cannot run are collected, so one error can list all of them.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from . import _layers as L
from . import _sizes as S


class Unsupported(Exception):
    """Raised by a handler for a node ai3 cannot run; the message describes it."""


@dataclass(frozen=True)
class In:
    """Placeholder in :attr:`Step.args` for the value id of input ``k``."""

    k: int


#: Placeholder in :attr:`Step.args` for the list of all input value ids.
ALL_INPUTS = "__all_inputs__"
#: Placeholder in :attr:`Step.args` for the selected algorithm.
ALGO = "__algorithm__"


@dataclass
class Step:
    """One ai3 node: ``getattr(core_model, method)(name, *args, **kwargs)``."""

    node: torch.fx.Node
    op: str
    method: str
    inputs: list[torch.fx.Node]
    args: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    module: nn.Module | None = None


@dataclass(frozen=True)
class Alias:
    """The node's value is another node's value."""

    node: torch.fx.Node


@dataclass(frozen=True)
class Pieces:
    """The tuple returned by ``chunk`` / ``split``; only ``getitem`` may read it."""

    node: torch.fx.Node
    dim: int
    chunks: int | None
    split_size: int | None
    sections: list[int] | None


_TENSOR = "tensor"
_CONST = "const"
#: The value of a node that could not be lowered: readers go on without another error.
_OPAQUE = "opaque"


def bind(n: torch.fx.Node, names: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
    """The node's arguments by parameter name (positional first, then keywords)."""
    b = dict(defaults)
    b.update(zip(names, n.args, strict=False))
    b.update(n.kwargs)
    missing = [k for k in names if k not in b]
    if missing:
        raise Unsupported(f"missing argument(s) {missing}")
    return b


_REQUIRED = object()


def arg(n: torch.fx.Node, i: int, name: str, default: Any = _REQUIRED) -> Any:
    """Argument ``i`` (positional) or ``name`` (keyword) of a call."""
    if len(n.args) > i:
        return n.args[i]
    if name in n.kwargs:
        return n.kwargs[name]
    if default is _REQUIRED:
        raise Unsupported(f"missing argument '{name}'")
    return default


def _describe(gm: torch.fx.GraphModule, n: torch.fx.Node) -> str:
    if n.op == "call_module":
        return f"{type(gm.get_submodule(n.target)).__name__} module '{n.target}'"
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    t = n.target
    mod = getattr(t, "__module__", None) or ""
    return f"{mod}.{getattr(t, '__name__', t)}".lstrip(".")


class Lowerer:
    """Walks an fx graph once, producing steps, aliases and the unsupported list."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.kind: dict[torch.fx.Node, Any] = {}
        self.steps: list[Step] = []
        self.unsupported: list[tuple[str, str]] = []
        self.outputs: list[torch.fx.Node] = []
        self.single_output = True

    # ---- values ----------------------------------------------------------------------------

    def canonical(self, n: torch.fx.Node) -> torch.fx.Node:
        """Follows aliases to the node that really produces the value."""
        k = self.kind.get(n)
        while isinstance(k, Alias):
            n = k.node
            k = self.kind.get(n)
        return n

    def tensor(self, arg: Any) -> torch.fx.Node:
        """The producing node of a tensor argument, or :class:`Unsupported`."""
        if not isinstance(arg, torch.fx.Node):
            raise Unsupported(f"expected a tensor argument, got {type(arg).__name__}")
        n = self.canonical(arg)
        if self.kind.get(n) not in (_TENSOR, _CONST, _OPAQUE):
            raise Unsupported(f"'{arg.name}' is not a tensor ai3 can read here")
        return n

    def const_tensor(self, arg: Any) -> torch.Tensor | None:
        """A weight given as a get_attr node (or None)."""
        if arg is None:
            return None
        if isinstance(arg, torch.Tensor):
            return arg
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            return self.fetch(arg.target)
        raise Unsupported("weights must be module attributes")

    def fetch(self, target: str) -> Any:
        obj: Any = self.gm
        for atom in str(target).split("."):
            obj = getattr(obj, atom)
        return obj

    def size(self, arg: Any) -> S.SizeExpr:
        """A size argument: an int or a symbolic size node."""
        if isinstance(arg, torch.fx.Node):
            k = self.kind.get(self.canonical(arg))
            e = S.as_size(k)
        else:
            e = S.as_size(arg)
        if e is None:
            raise Unsupported(f"expected a size, got {arg!r}")
        return e

    # ---- steps -----------------------------------------------------------------------------

    def step(self, n, op, method, inputs, args, module=None, **kwargs) -> None:
        self.steps.append(
            Step(n, op, method, [self.tensor(i) for i in inputs], args, kwargs, module)
        )
        self.kind[n] = _TENSOR

    def unary(self, n, x, op, method, *args, module=None) -> None:
        self.step(n, op, method, [x], [In(0), *args, ALGO], module)

    def activation(self, n, x, kind: str, params: list[float], module=None) -> None:
        if kind == "relu":
            self.unary(n, x, "relu", "relu", module=module)
        else:
            self.unary(n, x, kind, "activation", kind, params, module=module)

    # ---- the walk --------------------------------------------------------------------------

    def run(self) -> None:
        for n in self.gm.graph.nodes:
            try:
                self.lower(n)
            except Unsupported as e:
                self.unsupported.append((n.name, f"{_describe(self.gm, n)}: {e}"))
                self.kind[n] = _OPAQUE  # keep going to find every unsupported node

    def lower(self, n: torch.fx.Node) -> None:
        if n.op == "placeholder":
            self.kind[n] = _TENSOR
        elif n.op == "get_attr":
            if not isinstance(self.fetch(n.target), torch.Tensor):
                raise Unsupported("non-tensor attribute")
            self.kind[n] = _CONST
        elif n.op == "output":
            self.lower_output(n)
        elif n.op == "call_module":
            m = self.gm.get_submodule(n.target)
            handler = MODULES.get(type(m))
            if handler is None:
                raise Unsupported("no ai3 implementation")
            handler(self, n, m)
        elif n.op == "call_function":
            handler = FUNCTIONS.get(n.target)
            if handler is None:
                raise Unsupported("no ai3 implementation")
            handler(self, n)
        elif n.op == "call_method":
            handler = METHODS.get(n.target)
            if handler is None:
                raise Unsupported("no ai3 implementation")
            handler(self, n)
        else:
            raise Unsupported(f"fx op {n.op}")

    def lower_output(self, n: torch.fx.Node) -> None:
        result = n.args[0]
        self.single_output = isinstance(result, torch.fx.Node)
        items = [result] if self.single_output else result
        if not isinstance(items, list | tuple):
            raise Unsupported(
                f"output structure {type(result).__name__} (ai3 returns a tensor or a tuple)"
            )
        self.outputs = [self.tensor(r) for r in items]


# ---- module handlers ----------------------------------------------------------------------


def _conv_module(lw: Lowerer, n, m: nn.Conv2d) -> None:
    s = L.conv_spec_of(m)
    args = [
        In(0),
        m.weight,
        m.bias,
        s.stride,
        s.padding,
        s.dilation,
        s.groups,
        s.padding_mode,
        ALGO,
    ]
    lw.step(n, "conv2d", "conv2d", [n.args[0]], args, m)


def _linear_module(lw: Lowerer, n, m: nn.Linear) -> None:
    lw.step(n, "linear", "linear", [n.args[0]], [In(0), m.weight, m.bias, ALGO], m)


def _bn_module(lw: Lowerer, n, m: nn.BatchNorm2d) -> None:
    if m.running_mean is None or m.running_var is None:
        raise Unsupported("BatchNorm without running statistics (track_running_stats=False)")
    args = [In(0), m.weight, m.bias, m.running_mean, m.running_var, float(m.eps), ALGO]
    lw.step(n, "batchnorm2d", "batchnorm2d", [n.args[0]], args, m)


def _layernorm_module(lw: Lowerer, n, m: nn.LayerNorm) -> None:
    args = [In(0), list(m.normalized_shape), m.weight, m.bias, float(m.eps), ALGO]
    lw.step(n, "layernorm", "layernorm", [n.args[0]], args, m)


def _maxpool_module(lw: Lowerer, n, m: nn.MaxPool2d) -> None:
    if m.return_indices:
        raise Unsupported("return_indices=True")
    p = L.maxpool_spec_of(m)
    lw.unary(
        n,
        n.args[0],
        "maxpool2d",
        "maxpool2d",
        p.kernel,
        p.stride,
        p.padding,
        p.dilation,
        p.ceil_mode,
        module=m,
    )


def _avgpool_module(lw: Lowerer, n, m: nn.AvgPool2d) -> None:
    p, inc, div = L.avgpool_spec_of(m)
    lw.unary(
        n,
        n.args[0],
        "avgpool2d",
        "avgpool2d",
        p.kernel,
        p.stride,
        p.padding,
        p.ceil_mode,
        inc,
        div,
        module=m,
    )


def _adaptive_module(op: str) -> Callable:
    def handler(lw: Lowerer, n, m) -> None:
        if getattr(m, "return_indices", False):
            raise Unsupported("return_indices=True")
        lw.unary(n, n.args[0], op, op, L.adaptive_size(m.output_size), module=m)

    return handler


def _flatten_module(lw: Lowerer, n, m: nn.Flatten) -> None:
    lw.unary(n, n.args[0], "flatten", "flatten", m.start_dim, m.end_dim, module=m)


def _softmax_module(lw: Lowerer, n, m: nn.Softmax) -> None:
    if m.dim is None:
        raise Unsupported("Softmax without dim")
    lw.unary(n, n.args[0], "softmax", "softmax", m.dim, module=m)


def _act_module(kind: str, params: Callable[[nn.Module], list[float]] = lambda m: []) -> Callable:
    def handler(lw: Lowerer, n, m) -> None:
        lw.activation(n, n.args[0], kind, params(m), module=m)

    return handler


def _identity_module(lw: Lowerer, n, m) -> None:
    lw.kind[n] = Alias(lw.tensor(n.args[0]))


MODULES: dict[type, Callable] = {
    nn.Conv2d: _conv_module,
    nn.Linear: _linear_module,
    nn.BatchNorm2d: _bn_module,
    nn.LayerNorm: _layernorm_module,
    nn.MaxPool2d: _maxpool_module,
    nn.AvgPool2d: _avgpool_module,
    nn.AdaptiveAvgPool2d: _adaptive_module("adaptiveavgpool2d"),
    nn.AdaptiveMaxPool2d: _adaptive_module("adaptivemaxpool2d"),
    nn.Flatten: _flatten_module,
    nn.Softmax: _softmax_module,
    nn.ReLU: _act_module("relu"),
    nn.ReLU6: _act_module("relu6"),
    nn.Hardtanh: _act_module("hardtanh", lambda m: [float(m.min_val), float(m.max_val)]),
    nn.Hardswish: _act_module("hardswish"),
    nn.Hardsigmoid: _act_module("hardsigmoid"),
    nn.SiLU: _act_module("silu"),
    nn.Sigmoid: _act_module("sigmoid"),
    nn.Tanh: _act_module("tanh"),
    nn.GELU: _act_module("gelu", lambda m: [1.0 if m.approximate == "tanh" else 0.0]),
    nn.Dropout: _identity_module,
    nn.Dropout2d: _identity_module,
    nn.AlphaDropout: _identity_module,
    nn.Identity: _identity_module,
}


def _swapped_module(lw: Lowerer, n, m) -> None:
    """A module ``ai3.swap_operation`` put in place: lowered as the PyTorch
    module it stands for. The step keeps the swapped module, so convert can
    keep its algorithm."""
    plain = m.to_torch()
    MODULES[type(plain)](lw, n, plain)
    lw.steps[-1].module = m


def _register_swapped() -> None:
    from . import swap

    for cls in swap._WRAPPERS.values():
        MODULES[cls] = _swapped_module


_register_swapped()


# ---- function and method handlers ---------------------------------------------------------


def _act_fn(kind: str, names=("input",), defaults=None, params=lambda b: []) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = bind(n, names, defaults or {})
        lw.activation(n, b["input"], kind, params(b))

    return handler


def _hardtanh_params(b) -> list[float]:
    return [float(b["min_val"]), float(b["max_val"])]


def _gelu_params(b) -> list[float]:
    return [1.0 if b["approximate"] == "tanh" else 0.0]


def _flatten_fn(lw: Lowerer, n) -> None:
    b = bind(n, ("input", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1})
    lw.unary(n, b["input"], "flatten", "flatten", b["start_dim"], b["end_dim"])


def _maxpool_fn(lw: Lowerer, n) -> None:
    names = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
    d = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False}
    b = bind(n, names, d)
    if b["return_indices"]:
        raise Unsupported("return_indices=True")
    p = L.pool_spec(b["kernel_size"], b["stride"], b["padding"], b["dilation"], b["ceil_mode"])
    lw.unary(
        n,
        b["input"],
        "maxpool2d",
        "maxpool2d",
        p.kernel,
        p.stride,
        p.padding,
        p.dilation,
        p.ceil_mode,
    )


def _avgpool_fn(lw: Lowerer, n) -> None:
    names = (
        "input",
        "kernel_size",
        "stride",
        "padding",
        "ceil_mode",
        "count_include_pad",
        "divisor_override",
    )
    d = {
        "stride": None,
        "padding": 0,
        "ceil_mode": False,
        "count_include_pad": True,
        "divisor_override": None,
    }
    b = bind(n, names, d)
    p = L.pool_spec(b["kernel_size"], b["stride"], b["padding"], 1, b["ceil_mode"])
    lw.unary(
        n,
        b["input"],
        "avgpool2d",
        "avgpool2d",
        p.kernel,
        p.stride,
        p.padding,
        p.ceil_mode,
        bool(b["count_include_pad"]),
        b["divisor_override"],
    )


def _adaptive_fn(op: str) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = bind(n, ("input", "output_size", "return_indices"), {"return_indices": False})
        if b["return_indices"]:
            raise Unsupported("return_indices=True")
        lw.unary(n, b["input"], op, op, L.adaptive_size(b["output_size"]))

    return handler


def _weights(lw: Lowerer, x: Any, *weights: Any) -> tuple[list[Any], list[Any]]:
    """The values a layer reading ``x`` with ``weights`` reads, and its weight arguments.

    Weights that are all module attributes stay constants the layer holds,
    prepared once. If any is a graph value (a model input, a computed
    tensor), every weight becomes an input the layer reads on every call,
    given as an :class:`In` placeholder (absent ones stay None)."""

    def held(w: Any) -> bool:
        return not isinstance(w, torch.fx.Node) or lw.canonical(w).op == "get_attr"

    if all(held(w) for w in weights):
        return [x], [lw.const_tensor(lw.canonical(w) if w is not None else None) for w in weights]
    inputs, args = [x], []
    for w in weights:
        if w is None:
            args.append(None)
        else:
            args.append(In(len(inputs)))
            inputs.append(w)
    return inputs, args


def _conv_fn(lw: Lowerer, n) -> None:
    """``F.conv2d`` / ``torch.conv2d``: weight and bias constants or graph values."""
    b = bind(
        n,
        ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
        {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1},
    )
    inputs, (w, bias) = _weights(lw, b["input"], b["weight"], b["bias"])
    if isinstance(w, In) and b["padding"] == "same":
        raise Unsupported("padding='same' with a weight known only at run time")
    s = L.conv_spec(
        w if isinstance(w, torch.Tensor) else None,
        b["stride"],
        b["padding"],
        b["dilation"],
        b["groups"],
    )
    args = [In(0), w, bias, s.stride, s.padding, s.dilation, s.groups, "zeros", ALGO]
    lw.step(n, "conv2d", "conv2d", inputs, args)


def _linear_fn(lw: Lowerer, n) -> None:
    b = bind(n, ("input", "weight", "bias"), {"bias": None})
    inputs, (w, bias) = _weights(lw, b["input"], b["weight"], b["bias"])
    lw.step(n, "linear", "linear", inputs, [In(0), w, bias, ALGO])


def _batchnorm(lw: Lowerer, n, b: dict[str, Any]) -> None:
    if b["training"]:
        raise Unsupported("training=True (statistics of the batch; ai3 runs inference)")
    if b["running_mean"] is None or b["running_var"] is None:
        raise Unsupported("batch norm without running statistics")
    inputs, (w, bias, mean, var) = _weights(
        lw, b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"]
    )
    args = [In(0), w, bias, mean, var, float(b["eps"]), ALGO]
    lw.step(n, "batchnorm2d", "batchnorm2d", inputs, args)


def _batchnorm_fn(lw: Lowerer, n) -> None:
    """``F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)``."""
    names = (
        "input",
        "running_mean",
        "running_var",
        "weight",
        "bias",
        "training",
        "momentum",
        "eps",
    )
    d = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}
    _batchnorm(lw, n, bind(n, names, d))


def _torch_batchnorm_fn(lw: Lowerer, n) -> None:
    """``torch.batch_norm``: the same arguments in ATen's order."""
    names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum")
    names += ("eps", "cudnn_enabled")
    _batchnorm(lw, n, bind(n, names, {}))


def _layernorm_fn(lw: Lowerer, n) -> None:
    """``F.layer_norm`` / ``torch.layer_norm`` (whose extra ``cudnn_enable`` changes nothing)."""
    b = bind(
        n,
        ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"),
        {"weight": None, "bias": None, "eps": 1e-5, "cudnn_enable": True},
    )
    inputs, (w, bias) = _weights(lw, b["input"], b["weight"], b["bias"])
    shape = (
        [b["normalized_shape"]]
        if isinstance(b["normalized_shape"], int)
        else list(b["normalized_shape"])
    )
    args = [In(0), shape, w, bias, float(b["eps"]), ALGO]
    lw.step(n, "layernorm", "layernorm", inputs, args)


def _softmax_fn(lw: Lowerer, n) -> None:
    b = bind(n, ("input", "dim"), {"dim": None})
    if b["dim"] is None or b.get("dtype") is not None:
        raise Unsupported("softmax needs an explicit dim and no dtype")
    lw.unary(n, b["input"], "softmax", "softmax", int(b["dim"]))


def _identity_fn(lw: Lowerer, n) -> None:
    lw.kind[n] = Alias(lw.tensor(n.args[0] if n.args else n.kwargs["input"]))


_BINARY_NAMES = {
    operator.add: "add",
    torch.add: "add",
    operator.sub: "sub",
    torch.sub: "sub",
    operator.mul: "mul",
    torch.mul: "mul",
    operator.truediv: "div",
    torch.div: "div",
}


def _is_tensor_arg(lw: Lowerer, a: Any) -> bool:
    return isinstance(a, torch.fx.Node) and lw.kind.get(lw.canonical(a)) in (
        _TENSOR,
        _CONST,
        _OPAQUE,
    )


def _binary(lw: Lowerer, n, kind: str, a: Any, b: Any) -> None:
    ta, tb = _is_tensor_arg(lw, a), _is_tensor_arg(lw, b)
    if ta and tb:
        lw.step(n, kind, "binary", [a, b], [kind, ALL_INPUTS, None, False, ALGO])
    elif ta or tb:
        scalar = b if ta else a
        if isinstance(scalar, bool) or not isinstance(scalar, int | float):
            raise Unsupported(f"operand {scalar!r} is neither a tensor nor a number")
        lw.step(
            n, kind, "binary", [a if ta else b], [kind, ALL_INPUTS, float(scalar), not ta, ALGO]
        )
    elif kind in ("add", "sub", "mul") or n.target is operator.floordiv:
        name = S.OPERATORS.get(n.target, kind)
        lw.kind[n] = S.BinOp(name, lw.size(a), lw.size(b))
    else:
        raise Unsupported("arithmetic on non-tensors")


def _binary_fn(lw: Lowerer, n) -> None:
    if n.target is operator.floordiv:
        lw.kind[n] = S.BinOp("floordiv", lw.size(n.args[0]), lw.size(n.args[1]))
        return
    kind = _BINARY_NAMES[n.target]
    b = bind(n, ("input", "other"), {})
    _binary_options(n, b)
    _binary(lw, n, kind, b["input"], b["other"])


def _binary_options(n, given: dict[str, Any]) -> None:
    """Rejects the options of add/sub/mul/div that ai3 does not honour (``alpha``
    other than 1, any ``rounding_mode``, ``out``, ...) instead of ignoring them."""
    extra = {k: v for k, v in given.items() if k not in ("input", "other", "self")}
    if extra.get("alpha", 1) == 1:
        extra.pop("alpha", None)
    if extra.get("rounding_mode", None) is None:
        extra.pop("rounding_mode", None)
    if extra or len(n.args) > 2:
        shown = {**extra, **({"args": n.args[2:]} if len(n.args) > 2 else {})}
        raise Unsupported(f"arguments ai3 does not implement: {shown}")


def _binary_method(kind: str) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        if len(n.args) < 2:
            raise Unsupported("missing the other operand")
        _binary_options(n, dict(n.kwargs))
        _binary(lw, n, kind, n.args[0], n.args[1])

    return handler


def _cat_fn(lw: Lowerer, n) -> None:
    b = bind(n, ("tensors", "dim"), {"dim": 0})
    parts = list(b["tensors"])
    lw.step(n, "cat", "cat", parts, [ALL_INPUTS, int(b["dim"]), ALGO])


def _dims(args: tuple) -> list[int]:
    if len(args) == 1 and isinstance(args[0], list | tuple):
        return [int(d) for d in args[0]]
    return [int(d) for d in args]


def _mean(lw: Lowerer, n, x, dim, keepdim, dtype=None) -> None:
    if dtype is not None:
        raise Unsupported("mean with dtype")
    dims = [] if dim is None else ([int(dim)] if isinstance(dim, int) else [int(d) for d in dim])
    lw.unary(n, x, "mean", "mean", dims, bool(keepdim))


def _mean_fn(lw: Lowerer, n) -> None:
    b = bind(n, ("input", "dim", "keepdim"), {"dim": None, "keepdim": False})
    _mean(lw, n, b["input"], b["dim"], b["keepdim"], b.get("dtype"))


def _permute(lw: Lowerer, n, x, dims: list[int]) -> None:
    lw.unary(n, x, "permute", "permute", dims)


def _transpose(lw: Lowerer, n, x, d0: int, d1: int) -> None:
    # The input's rank is unknown until run time, so the two axes go to Rust as they are.
    lw.unary(n, x, "permute", "transpose", int(d0), int(d1))


def _reshape(lw: Lowerer, n, x, shape_args: tuple) -> None:
    one = len(shape_args) == 1
    entries = shape_args[0] if one and isinstance(shape_args[0], list | tuple) else shape_args
    if one and isinstance(shape_args[0], torch.fx.Node):
        if isinstance(lw.kind.get(lw.canonical(shape_args[0])), S.ShapeOf):
            raise Unsupported("reshape to another tensor's whole shape")
    exprs = [lw.size(e) for e in entries]
    data = lw.tensor(x)
    extra: list[torch.fx.Node] = []
    for e in exprs:
        for m in S.nodes_of(e):
            if m is not data and m not in extra:
                extra.append(m)
    index = {data: 0, **{m: i + 1 for i, m in enumerate(extra)}}
    spec = [S.encode(e, index) for e in exprs]
    lw.step(n, "reshape", "reshape", [data, *extra], [ALL_INPUTS, spec, ALGO])


def _pieces(lw: Lowerer, n, x, how: Any, dim: int, chunks: bool) -> None:
    t = lw.tensor(x)
    if chunks:
        lw.kind[n] = Pieces(t, int(dim), int(how), None, None)
    elif isinstance(how, int):
        lw.kind[n] = Pieces(t, int(dim), None, int(how), None)
    else:
        lw.kind[n] = Pieces(t, int(dim), None, None, [int(s) for s in how])


def _getitem(lw: Lowerer, n) -> None:
    src, idx = n.args
    k = lw.kind.get(lw.canonical(src)) if isinstance(src, torch.fx.Node) else None
    if k == _OPAQUE:
        lw.kind[n] = _OPAQUE  # its source is already reported
    elif isinstance(k, S.ShapeOf) and isinstance(idx, int):
        lw.kind[n] = S.Dim(k.node, idx)
    elif isinstance(k, Pieces) and isinstance(idx, int):
        lw.unary(n, k.node, "slice", "slice", k.dim, idx, k.chunks, k.split_size, k.sections)
    else:
        raise Unsupported("indexing (only chunk/split pieces and sizes can be indexed)")


def _getattr_fn(lw: Lowerer, n) -> None:
    src, attr = n.args
    if attr != "shape":
        raise Unsupported(f"attribute '{attr}'")
    lw.kind[n] = S.ShapeOf(lw.tensor(src))


def _size_method(lw: Lowerer, n) -> None:
    x = lw.tensor(n.args[0])
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    lw.kind[n] = S.ShapeOf(x) if dim is None else S.Dim(x, int(dim))


FUNCTIONS: dict[Any, Callable] = {
    torch.relu: _act_fn("relu"),
    F.relu: _act_fn("relu", ("input", "inplace"), {"inplace": False}),
    F.relu6: _act_fn("relu6", ("input", "inplace"), {"inplace": False}),
    F.hardtanh: _act_fn(
        "hardtanh",
        ("input", "min_val", "max_val", "inplace"),
        {"min_val": -1.0, "max_val": 1.0, "inplace": False},
        _hardtanh_params,
    ),
    F.hardswish: _act_fn("hardswish", ("input", "inplace"), {"inplace": False}),
    F.hardsigmoid: _act_fn("hardsigmoid", ("input", "inplace"), {"inplace": False}),
    F.silu: _act_fn("silu", ("input", "inplace"), {"inplace": False}),
    torch.sigmoid: _act_fn("sigmoid"),
    F.sigmoid: _act_fn("sigmoid"),
    torch.tanh: _act_fn("tanh"),
    F.tanh: _act_fn("tanh"),
    F.gelu: _act_fn("gelu", ("input", "approximate"), {"approximate": "none"}, _gelu_params),
    torch.flatten: _flatten_fn,
    F.max_pool2d: _maxpool_fn,
    F.avg_pool2d: _avgpool_fn,
    F.adaptive_avg_pool2d: _adaptive_fn("adaptiveavgpool2d"),
    F.adaptive_max_pool2d: _adaptive_fn("adaptivemaxpool2d"),
    torch.max_pool2d: _maxpool_fn,
    F.linear: _linear_fn,
    torch.conv2d: _conv_fn,  # F.conv2d is the same function
    F.batch_norm: _batchnorm_fn,
    torch.batch_norm: _torch_batchnorm_fn,
    F.layer_norm: _layernorm_fn,
    torch.layer_norm: _layernorm_fn,
    F.softmax: _softmax_fn,
    torch.softmax: _softmax_fn,
    F.dropout: _identity_fn,
    F.dropout2d: _identity_fn,
    torch.cat: _cat_fn,
    torch.concat: _cat_fn,
    torch.mean: _mean_fn,
    torch.permute: lambda lw, n: _permute(lw, n, n.args[0], _dims((arg(n, 1, "dims"),))),
    torch.transpose: lambda lw, n: _transpose(
        lw, n, n.args[0], arg(n, 1, "dim0"), arg(n, 2, "dim1")
    ),
    torch.reshape: lambda lw, n: _reshape(lw, n, n.args[0], (arg(n, 1, "shape"),)),
    torch.chunk: lambda lw, n: _pieces(
        lw, n, n.args[0], arg(n, 1, "chunks"), arg(n, 2, "dim", 0), True
    ),
    torch.split: lambda lw, n: _pieces(
        lw, n, n.args[0], arg(n, 1, "split_size_or_sections"), arg(n, 2, "dim", 0), False
    ),
    operator.getitem: _getitem,
    builtins.getattr: _getattr_fn,
    operator.floordiv: _binary_fn,
    **{f: _binary_fn for f in _BINARY_NAMES},
}


def _method_act(kind: str) -> Callable:
    return lambda lw, n: lw.activation(n, n.args[0], kind, [])


METHODS: dict[str, Callable] = {
    "relu": _method_act("relu"),
    "sigmoid": _method_act("sigmoid"),
    "tanh": _method_act("tanh"),
    "flatten": lambda lw, n: lw.unary(
        n, n.args[0], "flatten", "flatten", arg(n, 1, "start_dim", 0), arg(n, 2, "end_dim", -1)
    ),
    "softmax": lambda lw, n: lw.unary(n, n.args[0], "softmax", "softmax", int(arg(n, 1, "dim"))),
    "mean": lambda lw, n: _mean(
        lw, n, n.args[0], arg(n, 1, "dim", None), arg(n, 2, "keepdim", False), n.kwargs.get("dtype")
    ),
    "permute": lambda lw, n: _permute(
        lw, n, n.args[0], _dims(n.args[1:]) if len(n.args) > 1 else list(n.kwargs["dims"])
    ),
    "transpose": lambda lw, n: _transpose(lw, n, n.args[0], arg(n, 1, "dim0"), arg(n, 2, "dim1")),
    "view": lambda lw, n: _reshape(lw, n, n.args[0], n.args[1:]),
    "reshape": lambda lw, n: _reshape(lw, n, n.args[0], n.args[1:]),
    "contiguous": _identity_fn,
    "chunk": lambda lw, n: _pieces(
        lw, n, n.args[0], arg(n, 1, "chunks"), arg(n, 2, "dim", 0), True
    ),
    "split": lambda lw, n: _pieces(
        lw, n, n.args[0], arg(n, 1, "split_size"), arg(n, 2, "dim", 0), False
    ),
    "size": _size_method,
    "add": _binary_method("add"),
    "sub": _binary_method("sub"),
    "mul": _binary_method("mul"),
    "div": _binary_method("div"),
}


def _register_torchvision() -> None:
    """torchvision's fx-wrapped functions that are the identity in inference."""
    try:
        from torchvision.ops import stochastic_depth
    except ImportError:  # torchvision is optional
        return
    FUNCTIONS[stochastic_depth] = _identity_fn


_register_torchvision()
