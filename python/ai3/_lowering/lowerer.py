"""Lowering a ``torch.fx`` graph to ai3 operations.

Each fx node becomes a :class:`Step` (one ai3 node), an alias of another
value (Dropout, Identity, ``contiguous``), a symbolic size (``x.size(0)``),
or the pieces of a ``chunk``/``split`` that later ``getitem`` nodes slice.
Nodes ai3 cannot run are collected, so one error can list all of them.

Every handler reads its call through a :class:`~ai3._lowering.calls.Sig`, so an
argument ai3 does not implement makes the node unsupported instead of being
ignored. In-place operations (``F.relu(x, inplace=True)``, ``x.relu_()``)
are computed out of place; the lowerer follows PyTorch's aliasing so that
later readers of the changed tensor read the new value, and reports the
cases it cannot follow (a view or alias of the changed memory read
afterwards, a module tensor changed in place).
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
from torch.nn.modules import module as _module

from .. import _layers as L
from .. import _sizes as S
from ..errors import Error, InvalidArgumentError
from .calls import Sig, Unsupported, as_bool, as_float, as_int, as_ints


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
_VALUES = (_TENSOR, _CONST, _OPAQUE)


def _describe(gm: torch.fx.GraphModule, n: torch.fx.Node) -> str:
    if n.op == "call_module":
        return f"{type(gm.get_submodule(n.target)).__name__} module '{n.target}'"
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    t = n.target
    mod = getattr(t, "__module__", None) or ""
    return f"{mod}.{getattr(t, '__name__', t)}".lstrip(".")


class Lowerer:
    """Walks an fx graph once, producing steps, aliases and the unsupported list.

    Besides each node's value, it tracks PyTorch's aliasing: every tensor
    node denotes a tensor object (an alias such as Dropout in eval mode
    denotes its input's object), objects live in a storage (a view shares
    its base's), an in-place change gives the changed object a new value
    (read by every later reader), and makes the other objects of that
    storage stale: ai3 computed them as copies, so reading one afterwards is
    unsupported.
    """

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.kind: dict[torch.fx.Node, Any] = {}
        self.steps: list[Step] = []
        self.unsupported: list[tuple[str, str]] = []
        self.outputs: list[torch.fx.Node] = []
        self.single_output = True
        self._obj: dict[torch.fx.Node, int] = {}  # the tensor object a node denotes
        self._storage: list[int] = []  # object -> the storage it lives in
        self._version: dict[int, torch.fx.Node] = {}  # object -> its value after in-place changes
        self._stale: dict[int, torch.fx.Node] = {}  # object -> the in-place node it missed
        self._held: set[int] = set()  # storages of module attributes

    # ---- values ----------------------------------------------------------------------------

    def canonical(self, n: torch.fx.Node) -> torch.fx.Node:
        """Follows aliases to the node that really produces the value."""
        k = self.kind.get(n)
        while isinstance(k, Alias):
            n = k.node
            k = self.kind.get(n)
        return n

    def resolve(self, n: torch.fx.Node) -> torch.fx.Node:
        """The node whose value ``n`` holds now: in-place changes and aliases followed."""
        o = self._obj.get(n)
        changed = self._version.get(o) if o is not None else None
        return self.canonical(n if changed is None else changed)

    def tensor(self, arg: Any) -> torch.fx.Node:
        """The producing node of a tensor argument, or :class:`Unsupported`."""
        if not isinstance(arg, torch.fx.Node):
            raise Unsupported(f"expected a tensor argument, got {type(arg).__name__}")
        self.check_current(arg)
        return self.shape_source(arg)

    def check_current(self, arg: torch.fx.Node) -> None:
        """Raises :class:`Unsupported` if ``arg`` shares memory that an in-place
        operation changed through another tensor since ``arg`` was computed."""
        mutator = self._stale.get(self._obj.get(arg, -1))
        if mutator is not None:
            raise Unsupported(
                f"reads '{arg.name}' after the in-place '{mutator.name}' changed its memory "
                "through another view or alias (ai3 computes in-place operations out of "
                "place and follows the change only through the tensor it was applied to)"
            )

    def shape_source(self, arg: Any) -> torch.fx.Node:
        """Like :meth:`tensor`, for reading only the shape (which no in-place change alters)."""
        if not isinstance(arg, torch.fx.Node):
            raise Unsupported(f"expected a tensor argument, got {type(arg).__name__}")
        n = self.resolve(arg)
        if self.kind.get(n) not in _VALUES:
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

    # ---- aliasing --------------------------------------------------------------------------

    def _new_object(self, n: torch.fx.Node, storage: int | None = None) -> None:
        o = len(self._storage)
        self._obj[n] = o
        self._storage.append(o if storage is None else storage)

    def view(self, n: torch.fx.Node, base: torch.fx.Node) -> None:
        """``n`` may share ``base``'s memory (a view, or a copy PyTorch makes only
        for some strides: ``reshape``, ``contiguous``)."""
        self._new_object(n, self._storage[self._obj[base]])

    def alias(self, n: torch.fx.Node, x: Any, *, same: bool) -> None:
        """``n``'s value is ``x``'s: the very same tensor (``same``, as Identity) or
        possibly a view of it (as ``contiguous``)."""
        self.kind[n] = Alias(self.tensor(x))
        if same:
            self._obj[n] = self._obj[x]
        else:
            self.view(n, x)

    def _check_mutable(self, x: Any) -> None:
        if isinstance(x, torch.fx.Node) and self._storage[self._obj[x]] in self._held:
            raise Unsupported(
                f"changes '{x.name}', a tensor of the module, in place "
                "(ai3 holds the module's tensors constant)"
            )

    def _mutated(self, n: torch.fx.Node, x: torch.fx.Node) -> None:
        """``n`` changed ``x``'s tensor in place and returned it."""
        o = self._obj[x]
        self._obj[n] = o
        self._version[o] = n
        storage = self._storage[o]
        for other, s in enumerate(self._storage):
            if s == storage and other != o:
                self._stale.setdefault(other, n)

    # ---- steps -----------------------------------------------------------------------------

    def step(
        self, n, op, method, inputs, args, module=None, inplace=False, shapes=(), **kwargs
    ) -> None:
        """Adds the ai3 node computing ``n`` from ``inputs``, and from ``shapes``:
        tensors it reads only the shapes of. ``inplace``: ``n`` changes ``inputs[0]``."""
        if inplace:
            self._check_mutable(inputs[0])
        read = [self.tensor(i) for i in inputs] + [self.shape_source(i) for i in shapes]
        self.steps.append(Step(n, op, method, read, args, kwargs, module))
        self.kind[n] = _TENSOR
        if inplace:
            self._mutated(n, inputs[0])

    def unary(self, n, x, op, method, *args, module=None, inplace=False) -> None:
        self.step(n, op, method, [x], [In(0), *args, ALGO], module, inplace)

    def activation(self, n, x, kind: str, params: list[float], module=None, inplace=False) -> None:
        if kind == "relu":
            self.unary(n, x, "relu", "relu", module=module, inplace=inplace)
        else:
            self.unary(n, x, kind, "activation", kind, params, module=module, inplace=inplace)

    # ---- the walk --------------------------------------------------------------------------

    def run(self) -> None:
        for n in self.gm.graph.nodes:
            try:
                self.lower(n)
            except Unsupported as e:
                self._unsupported(n, str(e))
            except InvalidArgumentError as e:
                # A hyperparameter PyTorch would reject too: its own error, naming the node.
                raise InvalidArgumentError(
                    f"{_describe(self.gm, n)} at node '{n.name}': {e}"
                ) from e
            except Error:
                raise
            except (LookupError, TypeError, ValueError) as e:
                # Arguments of a shape no handler expects: reported with the node, not raised.
                self._unsupported(n, f"arguments ai3 cannot read ({type(e).__name__}: {e})")
            if n not in self._obj:
                self._new_object(n)
                if self.kind.get(n) == _CONST:
                    self._held.add(self._obj[n])

    def _unsupported(self, n: torch.fx.Node, why: str) -> None:
        self.unsupported.append((n.name, f"{_describe(self.gm, n)}: {why}"))
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
            _check_hooks(m)
            handler(self, n, m, _INPUT.bind(n)["input"])
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


def _check_hooks(m: nn.Module) -> None:
    """fx does not run a leaf module's hooks, and neither would ai3."""
    global_hooks = ("_global_forward_hooks", "_global_forward_pre_hooks")
    if (
        m._forward_hooks
        or m._forward_pre_hooks
        or any(getattr(_module, h, None) for h in global_hooks)
    ):
        raise Unsupported("forward hooks, which ai3 would not run")


# ---- module handlers: (lowerer, node, module, the input argument) -------------------------

#: A call on one tensor and nothing else: a module's, ``torch.relu(x)``, ``x.relu_()``.
_INPUT = Sig("input")


def _conv_module(lw: Lowerer, n, m: nn.Conv2d, x) -> None:
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
    lw.step(n, "conv2d", "conv2d", [x], args, m)


def _linear_module(lw: Lowerer, n, m: nn.Linear, x) -> None:
    lw.step(n, "linear", "linear", [x], [In(0), m.weight, m.bias, ALGO], m)


def _bn_module(lw: Lowerer, n, m: nn.BatchNorm2d, x) -> None:
    if m.training:
        raise Unsupported(
            "training mode (normalises with the batch's statistics); "
            "call .eval() before ai3.convert"
        )
    if m.running_mean is None or m.running_var is None:
        raise Unsupported(
            "BatchNorm without running statistics (track_running_stats=False), "
            "which normalises with the batch's statistics even in eval mode"
        )
    args = [In(0), m.weight, m.bias, m.running_mean, m.running_var, float(m.eps), ALGO]
    lw.step(n, "batchnorm2d", "batchnorm2d", [x], args, m)


def _layernorm_module(lw: Lowerer, n, m: nn.LayerNorm, x) -> None:
    args = [In(0), list(m.normalized_shape), m.weight, m.bias, float(m.eps), ALGO]
    lw.step(n, "layernorm", "layernorm", [x], args, m)


def _maxpool_module(lw: Lowerer, n, m: nn.MaxPool2d, x) -> None:
    if m.return_indices:
        raise Unsupported("return_indices=True")
    p = L.maxpool_spec_of(m)
    lw.unary(
        n,
        x,
        "maxpool2d",
        "maxpool2d",
        p.kernel,
        p.stride,
        p.padding,
        p.dilation,
        p.ceil_mode,
        module=m,
    )


def _avgpool_module(lw: Lowerer, n, m: nn.AvgPool2d, x) -> None:
    p, inc, div = L.avgpool_spec_of(m)
    lw.unary(
        n,
        x,
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
    def handler(lw: Lowerer, n, m, x) -> None:
        if getattr(m, "return_indices", False):
            raise Unsupported("return_indices=True")
        lw.unary(n, x, op, op, L.adaptive_size(m.output_size), module=m)

    return handler


def _flatten_module(lw: Lowerer, n, m: nn.Flatten, x) -> None:
    start, end = as_int("start_dim", m.start_dim), as_int("end_dim", m.end_dim)
    lw.unary(n, x, "flatten", "flatten", start, end, module=m)
    lw.view(n, x)


def _softmax_module(lw: Lowerer, n, m: nn.Softmax, x) -> None:
    if m.dim is None:
        raise Unsupported("Softmax without dim")
    lw.unary(n, x, "softmax", "softmax", as_int("dim", m.dim), module=m)


def _act_module(kind: str, params: Callable[[nn.Module], list[float]] = lambda m: []) -> Callable:
    def handler(lw: Lowerer, n, m, x) -> None:
        inplace = as_bool("inplace", getattr(m, "inplace", False))
        lw.activation(n, x, kind, params(m), module=m, inplace=inplace)

    return handler


def _gelu_approximate(approximate: Any) -> list[float]:
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate={approximate!r} (PyTorch takes 'none' or 'tanh')")
    return [1.0 if approximate == "tanh" else 0.0]


def _hardtanh_params(min_val: Any, max_val: Any) -> list[float]:
    return [as_float("min_val", min_val), as_float("max_val", max_val)]


def _dropout(lw: Lowerer, n, x, p: Any, training: Any, *, same: bool, module: bool) -> None:
    """Dropout is the identity (its input itself) in eval mode or with ``p == 0``;
    in training mode it drops elements at random, which ai3 does not."""
    p, training = as_float("p", p), as_bool("training", training)
    if not 0.0 <= p <= 1.0:
        raise Unsupported(f"p={p} (a probability between 0 and 1)")
    if training and p > 0:
        where = (
            "the module is in training mode"
            if module
            else "training=True (a forward's `training=self.training` is read when it is traced)"
        )
        raise Unsupported(
            f"{where}: dropout with p={p} drops elements at random; call .eval() before ai3.convert"
        )
    lw.alias(n, x, same=same and not training)


def _dropout_module(same: bool) -> Callable:
    def handler(lw: Lowerer, n, m, x) -> None:
        _dropout(lw, n, x, m.p, m.training, same=same, module=True)

    return handler


def _identity_module(lw: Lowerer, n, m, x) -> None:
    lw.alias(n, x, same=True)


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
    nn.Hardtanh: _act_module("hardtanh", lambda m: _hardtanh_params(m.min_val, m.max_val)),
    nn.Hardswish: _act_module("hardswish"),
    nn.Hardsigmoid: _act_module("hardsigmoid"),
    nn.SiLU: _act_module("silu"),
    nn.Sigmoid: _act_module("sigmoid"),
    nn.Tanh: _act_module("tanh"),
    nn.GELU: _act_module("gelu", lambda m: _gelu_approximate(m.approximate)),
    nn.Dropout: _dropout_module(same=True),
    # F.dropout2d views a 3-D input as a batch of one: its result is then a view.
    nn.Dropout2d: _dropout_module(same=False),
    nn.AlphaDropout: _dropout_module(same=True),
    nn.Identity: _identity_module,
}


def _swapped_module(lw: Lowerer, n, m, x) -> None:
    """A module ``ai3.swap_operation`` put in place: lowered as the PyTorch
    module it stands for. The step keeps the swapped module, so convert can
    keep its algorithm."""
    plain = m.to_torch()
    MODULES[type(plain)](lw, n, plain, x)
    lw.steps[-1].module = m


def _register_swapped() -> None:
    from .. import swap

    for cls in swap._WRAPPERS.values():
        MODULES[cls] = _swapped_module


_register_swapped()


# ---- function and method handlers: (lowerer, node) ----------------------------------------

_INPLACE = Sig("input, inplace", inplace=False)


def _act_fn(kind: str, sig: Sig = _INPUT, params=lambda b: [], inplace=False) -> Callable:
    """An activation: ``inplace`` for ``x.relu_()``-like calls, else read from the
    call's ``inplace`` argument when it has one."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        changes = inplace or as_bool("inplace", b.get("inplace", False))
        lw.activation(n, b["input"], kind, params(b), inplace=changes)

    return handler


def _flatten(lw: Lowerer, n, b: dict[str, Any]) -> None:
    start, end = as_int("start_dim", b["start_dim"]), as_int("end_dim", b["end_dim"])
    lw.unary(n, b["input"], "flatten", "flatten", start, end)
    lw.view(n, b["input"])


_FLATTEN = Sig("input, start_dim, end_dim", start_dim=0, end_dim=-1)

_MAXPOOL = Sig(
    "input, kernel_size, stride, padding, dilation, ceil_mode, return_indices",
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode=False,
    return_indices=False,
    fixed="return_indices",
)
#: ``torch.max_pool2d`` (ATen's): no ``return_indices``, and ``stride=[]`` means the kernel.
_TORCH_MAXPOOL = Sig(
    "input, kernel_size, stride, padding, dilation, ceil_mode",
    stride=(),
    padding=0,
    dilation=1,
    ceil_mode=False,
)


def _maxpool_fn(sig: Sig) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        p = L.pool_spec(
            b["kernel_size"],
            b["stride"],
            b["padding"],
            b["dilation"],
            as_bool("ceil_mode", b["ceil_mode"]),
        )
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

    return handler


_AVGPOOL = Sig(
    "input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override",
    stride=None,
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
)


def _avgpool_fn(lw: Lowerer, n) -> None:
    b = _AVGPOOL.bind(n)
    p = L.pool_spec(
        b["kernel_size"], b["stride"], b["padding"], 1, as_bool("ceil_mode", b["ceil_mode"])
    )
    div = b["divisor_override"]
    lw.unary(
        n,
        b["input"],
        "avgpool2d",
        "avgpool2d",
        p.kernel,
        p.stride,
        p.padding,
        p.ceil_mode,
        as_bool("count_include_pad", b["count_include_pad"]),
        None if div is None else as_int("divisor_override", div),
    )


def _adaptive_fn(op: str, sig: Sig) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        lw.unary(n, b["input"], op, op, L.adaptive_size(b["output_size"]))

    return handler


def _weights(lw: Lowerer, x: Any, *weights: Any) -> tuple[list[Any], list[Any]]:
    """The values a layer reading ``x`` with ``weights`` reads, and its weight arguments.

    Weights that are all module attributes stay constants the layer holds,
    prepared once. If any is a graph value (a model input, a computed
    tensor), every weight becomes an input the layer reads on every call,
    given as an :class:`In` placeholder (absent ones stay None)."""

    def held(w: Any) -> bool:
        return not isinstance(w, torch.fx.Node) or lw.resolve(w).op == "get_attr"

    if all(held(w) for w in weights):
        return [x], [lw.const_tensor(lw.resolve(w) if w is not None else None) for w in weights]
    inputs, args = [x], []
    for w in weights:
        if w is None:
            args.append(None)
        else:
            args.append(In(len(inputs)))
            inputs.append(w)
    return inputs, args


_CONV = Sig(
    "input, weight, bias, stride, padding, dilation, groups",
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
)


def _conv_fn(lw: Lowerer, n) -> None:
    """``F.conv2d`` / ``torch.conv2d``: weight and bias constants or graph values."""
    b = _CONV.bind(n)
    inputs, (w, bias) = _weights(lw, b["input"], b["weight"], b["bias"])
    if isinstance(w, In) and b["padding"] == "same":
        raise Unsupported("padding='same' with a weight known only at run time")
    s = L.conv_spec(
        w if isinstance(w, torch.Tensor) else None,
        b["stride"],
        b["padding"],
        b["dilation"],
        as_int("groups", b["groups"]),
    )
    args = [In(0), w, bias, s.stride, s.padding, s.dilation, s.groups, "zeros", ALGO]
    lw.step(n, "conv2d", "conv2d", inputs, args)


_LINEAR = Sig("input, weight, bias", bias=None)


def _linear_fn(lw: Lowerer, n) -> None:
    b = _LINEAR.bind(n)
    inputs, (w, bias) = _weights(lw, b["input"], b["weight"], b["bias"])
    lw.step(n, "linear", "linear", inputs, [In(0), w, bias, ALGO])


def _batchnorm_fn(sig: Sig) -> Callable:
    """``momentum`` only matters in training, and ``cudnn_enabled`` picks a kernel:
    both harmless here."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        if as_bool("training", b["training"]):
            raise Unsupported("training=True (statistics of the batch; ai3 runs inference)")
        if b["running_mean"] is None or b["running_var"] is None:
            raise Unsupported("batch norm without running statistics")
        inputs, (w, bias, mean, var) = _weights(
            lw, b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"]
        )
        args = [In(0), w, bias, mean, var, as_float("eps", b["eps"]), ALGO]
        lw.step(n, "batchnorm2d", "batchnorm2d", inputs, args)

    return handler


#: ``F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)``.
_F_BATCHNORM = Sig(
    "input, running_mean, running_var, weight, bias, training, momentum, eps",
    weight=None,
    bias=None,
    training=False,
    momentum=0.1,
    eps=1e-5,
)
#: ``torch.batch_norm``: the same arguments in ATen's order, all required.
_TORCH_BATCHNORM = Sig(
    "input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled"
)


def _layernorm_fn(sig: Sig) -> Callable:
    """``F.layer_norm`` / ``torch.layer_norm`` (whose extra ``cudnn_enable`` changes nothing)."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        inputs, (w, bias) = _weights(lw, b["input"], b["weight"], b["bias"])
        shape = as_ints("normalized_shape", b["normalized_shape"])
        args = [In(0), shape, w, bias, as_float("eps", b["eps"]), ALGO]
        lw.step(n, "layernorm", "layernorm", inputs, args)

    return handler


_LAYERNORM = "input, normalized_shape, weight, bias, eps"
_LN_DEFAULTS = {"weight": None, "bias": None, "eps": 1e-5}


def _softmax_fn(sig: Sig) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        if b["dim"] is None:
            raise Unsupported("softmax without dim (PyTorch's implicit choice is deprecated)")
        lw.unary(n, b["input"], "softmax", "softmax", as_int("dim", b["dim"]))

    return handler


_DROPOUT = Sig("input, p, training, inplace", p=0.5, training=True, inplace=False)


def _dropout_fn(same: bool) -> Callable:
    """``F.dropout`` / ``F.dropout2d``: ``inplace`` changes nothing when no element is dropped."""

    def handler(lw: Lowerer, n) -> None:
        b = _DROPOUT.bind(n)
        as_bool("inplace", b["inplace"])
        _dropout(lw, n, b["input"], b["p"], b["training"], same=same, module=False)

    return handler


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
    return isinstance(a, torch.fx.Node) and lw.kind.get(lw.resolve(a)) in _VALUES


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
    elif kind in ("add", "sub", "mul"):
        name = S.OPERATORS.get(n.target, kind)
        lw.kind[n] = S.BinOp(name, lw.size(a), lw.size(b))
    else:
        raise Unsupported("arithmetic on non-tensors")


#: Python's operators on tensors or sizes: two operands, nothing else.
_OPERATOR = Sig("a, b")
#: ``torch.add`` / ``torch.sub`` / ``torch.mul`` / ``torch.div``: ai3 implements none
#: of their options (``alpha`` other than 1, a ``rounding_mode``, ``out``).
_TORCH_BINARY = {
    torch.add: Sig("input, other, *, alpha, out", alpha=1, out=None, fixed="alpha out"),
    torch.sub: Sig("input, other, *, alpha, out", alpha=1, out=None, fixed="alpha out"),
    torch.mul: Sig("input, other, *, out", out=None, fixed="out"),
    torch.div: Sig(
        "input, other, *, rounding_mode, out",
        rounding_mode=None,
        out=None,
        fixed="rounding_mode out",
    ),
}


def _binary_fn(lw: Lowerer, n) -> None:
    sig = _TORCH_BINARY.get(n.target)
    if sig is None:
        b = _OPERATOR.bind(n)
        a, other = b["a"], b["b"]
    else:
        b = sig.bind(n)
        a, other = b["input"], b["other"]
    if n.target is operator.floordiv:
        if _is_tensor_arg(lw, a) or _is_tensor_arg(lw, other):
            raise Unsupported("floor division of tensors")
        lw.kind[n] = S.BinOp("floordiv", lw.size(a), lw.size(other))
        return
    _binary(lw, n, _BINARY_NAMES[n.target], a, other)


#: ``x.add(y)`` and friends: the tensor methods' options, as for the functions.
_METHOD_BINARY = {
    "add": Sig("input, other, *, alpha", alpha=1, fixed="alpha"),
    "sub": Sig("input, other, *, alpha", alpha=1, fixed="alpha"),
    "mul": Sig("input, other"),
    "div": Sig("input, other, *, rounding_mode", rounding_mode=None, fixed="rounding_mode"),
}


def _binary_method(kind: str) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = _METHOD_BINARY[kind].bind(n)
        _binary(lw, n, kind, b["input"], b["other"])

    return handler


_CAT = Sig("tensors, dim, *, out", dim=0, out=None, fixed="out")


def _cat_fn(lw: Lowerer, n) -> None:
    b = _CAT.bind(n)
    parts = b["tensors"]
    if not isinstance(parts, list | tuple):
        raise Unsupported(f"tensors={parts!r}: expected a list or tuple of tensors")
    lw.step(n, "cat", "cat", list(parts), [ALL_INPUTS, as_int("dim", b["dim"]), ALGO])


_TORCH_MEAN = Sig(
    "input, dim, keepdim, *, dtype, out", dim=None, keepdim=False, dtype=None, out=None,
    fixed="dtype out",
)  # fmt: skip
_METHOD_MEAN = Sig(
    "input, dim, keepdim, *, dtype", dim=None, keepdim=False, dtype=None, fixed="dtype"
)


def _mean_fn(sig: Sig) -> Callable:
    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        dims = [] if b["dim"] is None else as_ints("dim", b["dim"])
        lw.unary(n, b["input"], "mean", "mean", dims, as_bool("keepdim", b["keepdim"]))

    return handler


def _permute(sig: Sig) -> Callable:
    """``torch.permute(x, dims)`` / ``x.permute(*dims)`` (or ``x.permute(dims)``)."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        dims = b["dims"]
        if sig.varargs and len(dims) == 1 and isinstance(dims[0], list | tuple):
            dims = dims[0]
        lw.unary(n, b["input"], "permute", "permute", as_ints("dims", dims))
        lw.view(n, b["input"])

    return handler


_TRANSPOSE = Sig("input, dim0, dim1")


def _transpose(lw: Lowerer, n) -> None:
    b = _TRANSPOSE.bind(n)
    # The input's rank is unknown until run time, so the two axes go to Rust as they are.
    d0, d1 = as_int("dim0", b["dim0"]), as_int("dim1", b["dim1"])
    lw.unary(n, b["input"], "permute", "transpose", d0, d1)
    lw.view(n, b["input"])


def _reshape(sig: Sig, name: str) -> Callable:
    """``torch.reshape(x, shape)``, ``x.reshape(*shape)`` and ``x.view(*size)``:
    each size a constant or a symbolic size read from a tensor at run time."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        x, shape = b["input"], b[name]
        if sig.varargs and not shape:
            raise Unsupported("no shape given")
        if sig.varargs and len(shape) == 1:
            shape = shape[0]  # x.view((2, -1)), x.view(x.shape), x.view(n)
        if isinstance(shape, torch.fx.Node):
            if isinstance(lw.kind.get(lw.canonical(shape)), S.ShapeOf):
                raise Unsupported("reshape to another tensor's whole shape")
            shape = [shape]
        entries = shape if isinstance(shape, list | tuple) else [shape]
        exprs = [lw.size(e) for e in entries]
        data = lw.tensor(x)
        extra: list[torch.fx.Node] = []
        for e in exprs:
            for m in S.nodes_of(e):
                if m is not data and m not in extra:
                    extra.append(m)
        index = {data: 0, **{m: i + 1 for i, m in enumerate(extra)}}
        spec = [S.encode(e, index) for e in exprs]
        lw.step(n, "reshape", "reshape", [data], [ALL_INPUTS, spec, ALGO], shapes=extra)
        lw.view(n, x)

    return handler


def _pieces(sig: Sig, how: str, chunks: bool) -> Callable:
    """``chunk`` / ``split``: the pieces, which ``getitem`` nodes slice out."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        x, size, dim = b[sig.first], b[how], as_int("dim", b["dim"])
        t = lw.tensor(x)
        if chunks or not isinstance(size, list | tuple):
            k = as_int(how, size)
            if k <= 0:
                raise Unsupported(f"{how}={k} (must be positive)")
            lw.kind[n] = Pieces(t, dim, k, None, None) if chunks else Pieces(t, dim, None, k, None)
        else:
            sections = as_ints(how, size)
            if any(s < 0 for s in sections):
                raise Unsupported(f"{how}={sections} (sizes must not be negative)")
            lw.kind[n] = Pieces(t, dim, None, None, sections)
        lw.view(n, x)

    return handler


_GETITEM = Sig("a, b")


def _getitem(lw: Lowerer, n) -> None:
    b = _GETITEM.bind(n)
    src, idx = b["a"], b["b"]
    if isinstance(idx, torch.fx.Node):
        raise Unsupported("an index computed by the network")
    k = lw.kind.get(lw.canonical(src)) if isinstance(src, torch.fx.Node) else None
    if k == _OPAQUE:
        lw.kind[n] = _OPAQUE  # its source is already reported
    elif isinstance(k, S.ShapeOf) and isinstance(idx, int) and not isinstance(idx, bool):
        lw.kind[n] = S.Dim(k.node, idx)
    elif isinstance(k, Pieces) and isinstance(idx, int) and not isinstance(idx, bool):
        lw.check_current(src)  # the pieces are views of their input
        if k.sections is not None:
            count = len(k.sections)
            if not -count <= idx < count:
                raise Unsupported(f"index {idx} out of range for a split into {count} pieces")
            idx %= count
        elif idx < 0:
            raise Unsupported(
                f"index {idx} counted from the end of a chunk/split whose number of pieces "
                "depends on the input's size"
            )
        lw.unary(n, k.node, "slice", "slice", k.dim, idx, k.chunks, k.split_size, k.sections)
        lw.view(n, src)
    else:
        raise Unsupported("indexing (only chunk/split pieces and sizes can be indexed)")


_GETATTR = Sig("obj, name")


def _getattr_fn(lw: Lowerer, n) -> None:
    b = _GETATTR.bind(n)
    if b["name"] != "shape":
        raise Unsupported(f"attribute {b['name']!r}")
    lw.kind[n] = S.ShapeOf(lw.shape_source(b["obj"]))


_SIZE = Sig("input, dim", dim=None)


def _size_method(lw: Lowerer, n) -> None:
    b = _SIZE.bind(n)
    x = lw.shape_source(b["input"])
    dim = b["dim"]
    lw.kind[n] = S.ShapeOf(x) if dim is None else S.Dim(x, as_int("dim", dim))


#: ``x.contiguous()``: ``memory_format`` changes only the strides, never the values.
_CONTIGUOUS = Sig("input, *, memory_format", memory_format=torch.contiguous_format)


def _contiguous(lw: Lowerer, n) -> None:
    lw.alias(n, _CONTIGUOUS.bind(n)["input"], same=False)


_STOCHASTIC_DEPTH = Sig("input, p, mode, training", training=True)


def _stochastic_depth(lw: Lowerer, n) -> None:
    """torchvision's ``stochastic_depth``: the identity in eval mode or with ``p == 0``."""
    b = _STOCHASTIC_DEPTH.bind(n)
    if b["mode"] not in ("batch", "row"):
        raise Unsupported(f"mode={b['mode']!r} (torchvision takes 'batch' or 'row')")
    _dropout(lw, n, b["input"], b["p"], b["training"], same=True, module=False)


FUNCTIONS: dict[Any, Callable] = {
    torch.relu: _act_fn("relu"),
    torch.relu_: _act_fn("relu", inplace=True),
    F.relu: _act_fn("relu", _INPLACE),
    F.relu_: _act_fn("relu", inplace=True),
    F.relu6: _act_fn("relu6", _INPLACE),
    F.hardtanh: _act_fn(
        "hardtanh",
        Sig("input, min_val, max_val, inplace", min_val=-1.0, max_val=1.0, inplace=False),
        lambda b: _hardtanh_params(b["min_val"], b["max_val"]),
    ),
    F.hardswish: _act_fn("hardswish", _INPLACE),
    F.hardsigmoid: _act_fn("hardsigmoid", _INPLACE),
    F.silu: _act_fn("silu", _INPLACE),
    torch.sigmoid: _act_fn("sigmoid", Sig("input, *, out", out=None, fixed="out")),
    F.sigmoid: _act_fn("sigmoid"),
    torch.tanh: _act_fn("tanh", Sig("input, *, out", out=None, fixed="out")),
    F.tanh: _act_fn("tanh"),
    F.gelu: _act_fn(
        "gelu",
        Sig("input, approximate", approximate="none"),
        lambda b: _gelu_approximate(b["approximate"]),
    ),
    torch.flatten: lambda lw, n: _flatten(lw, n, _FLATTEN.bind(n)),
    F.max_pool2d: _maxpool_fn(_MAXPOOL),
    torch.max_pool2d: _maxpool_fn(_TORCH_MAXPOOL),
    F.avg_pool2d: _avgpool_fn,
    F.adaptive_avg_pool2d: _adaptive_fn("adaptiveavgpool2d", Sig("input, output_size")),
    F.adaptive_max_pool2d: _adaptive_fn(
        "adaptivemaxpool2d",
        Sig("input, output_size, return_indices", return_indices=False, fixed="return_indices"),
    ),
    F.linear: _linear_fn,
    torch.conv2d: _conv_fn,  # F.conv2d is the same function
    F.batch_norm: _batchnorm_fn(_F_BATCHNORM),
    torch.batch_norm: _batchnorm_fn(_TORCH_BATCHNORM),
    F.layer_norm: _layernorm_fn(Sig(_LAYERNORM, **_LN_DEFAULTS)),
    torch.layer_norm: _layernorm_fn(
        Sig(_LAYERNORM + ", cudnn_enable", **_LN_DEFAULTS, cudnn_enable=True)
    ),
    F.softmax: _softmax_fn(
        Sig("input, dim, _stacklevel, dtype", dim=None, _stacklevel=3, dtype=None, fixed="dtype")
    ),
    torch.softmax: _softmax_fn(Sig("input, dim, dtype", dtype=None, fixed="dtype")),
    F.dropout: _dropout_fn(same=True),
    F.dropout2d: _dropout_fn(same=False),
    torch.cat: _cat_fn,
    torch.concat: _cat_fn,
    torch.mean: _mean_fn(_TORCH_MEAN),
    torch.permute: _permute(Sig("input, dims")),
    torch.transpose: _transpose,
    torch.reshape: _reshape(Sig("input, shape"), "shape"),
    torch.chunk: _pieces(Sig("input, chunks, dim", dim=0), "chunks", True),
    torch.split: _pieces(
        Sig("tensor, split_size_or_sections, dim", dim=0), "split_size_or_sections", False
    ),
    operator.getitem: _getitem,
    builtins.getattr: _getattr_fn,
    operator.floordiv: _binary_fn,
    **{f: _binary_fn for f in _BINARY_NAMES},
}


METHODS: dict[str, Callable] = {
    "relu": _act_fn("relu"),
    "relu_": _act_fn("relu", inplace=True),
    "sigmoid": _act_fn("sigmoid"),
    "sigmoid_": _act_fn("sigmoid", inplace=True),
    "tanh": _act_fn("tanh"),
    "tanh_": _act_fn("tanh", inplace=True),
    "flatten": lambda lw, n: _flatten(lw, n, _FLATTEN.bind(n)),
    "softmax": _softmax_fn(Sig("input, dim, dtype", dtype=None, fixed="dtype")),
    "mean": _mean_fn(_METHOD_MEAN),
    "permute": _permute(Sig("input, *dims")),
    "transpose": _transpose,
    "view": _reshape(Sig("input, *size"), "size"),
    "reshape": _reshape(Sig("input, *shape"), "shape"),
    "contiguous": _contiguous,
    "chunk": _pieces(Sig("input, chunks, dim", dim=0), "chunks", True),
    "split": _pieces(Sig("input, split_size, dim", dim=0), "split_size", False),
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
    FUNCTIONS[stochastic_depth] = _stochastic_depth


_register_torchvision()
