"""``ai3.convert``: trace a PyTorch network with ``torch.fx`` and rebuild it as
an :class:`ai3.Model` that runs entirely in Rust."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn

from . import _layers as L
from ._shapes import input_shapes_of_nodes
from .errors import DtypeError, UnsupportedOperationError
from .model import Model
from .selectors import AlgorithmicSelector, Selection, normalize_algos

__all__ = ["convert", "swap_backend"]

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def _resolve_dtype(module: nn.Module, dtype: Any) -> str:
    if dtype is None:
        param = next((p for p in module.parameters() if p.is_floating_point()), None)
        dtype = torch.float32 if param is None else param.dtype
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""), dtype)
    if dtype not in _DTYPES:
        raise DtypeError(
            f"convert: ai3 computes in float32 and float64, got dtype {dtype}; "
            "pass dtype=torch.float32 or dtype=torch.float64"
        )
    return _DTYPES[dtype]


def _bind(args: tuple, kwargs: dict, names: Sequence[str], defaults: dict[str, Any]) -> dict:
    bound = dict(defaults)
    bound.update(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


# Positional parameter names and defaults of the functions convert understands.
_SIGNATURES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "relu": (("input", "inplace"), {"inplace": False}),
    "flatten": (("input", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1}),
    "maxpool2d": (
        ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
        {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False},
    ),
    "avgpool2d": (
        (
            "input",
            "kernel_size",
            "stride",
            "padding",
            "ceil_mode",
            "count_include_pad",
            "divisor_override",
        ),
        {
            "stride": None,
            "padding": 0,
            "ceil_mode": False,
            "count_include_pad": True,
            "divisor_override": None,
        },
    ),
    "adaptiveavgpool2d": (("input", "output_size"), {}),
    "linear": (("input", "weight", "bias"), {"bias": None}),
}


class _Builder:
    """Turns fx nodes into the recipe an :class:`ai3.Model` is built from."""

    def __init__(self, gm: torch.fx.GraphModule, dtype: str):
        self.gm = gm
        self.dtype = getattr(torch, dtype)
        self.nodes: list[tuple[str, list]] = []
        self.values: dict[torch.fx.Node, int] = {}
        self.next_value = 0

    def weight(self, t: Any) -> Any:
        if isinstance(t, torch.fx.Node):
            obj: Any = self.gm
            for atom in str(t.target).split("."):
                obj = getattr(obj, atom)
            t = obj
        if t is None:
            return None
        # One private copy in the model's dtype, which the Rust side borrows without copying again.
        return t.detach().to(self.dtype).contiguous().clone()

    def add(self, method: str, node: torch.fx.Node, args: list) -> None:
        # Module nodes carry their module path ('features.0'); functions their fx name.
        name = str(node.target) if node.op == "call_module" else node.name
        self.nodes.append((method, [name, *args]))
        self.values[node] = self.next_value
        self.next_value += 1

    def input_of(self, node: torch.fx.Node, arg: Any) -> int:
        return self.values[arg]

    def module_node(self, node: torch.fx.Node, m: nn.Module, op: str, algo: str) -> None:
        x = self.input_of(node, node.args[0])
        if op == "conv2d":
            s = L.conv_spec_of(m)
            args = [x, self.weight(m.weight), self.weight(m.bias), s.stride, s.padding]
            args += [s.dilation, s.groups, s.padding_mode, algo]
        elif op == "linear":
            args = [x, self.weight(m.weight), self.weight(m.bias), algo]
        elif op == "relu":
            args = [x, algo]
        elif op == "maxpool2d":
            p = L.maxpool_spec_of(m)
            args = [x, p.kernel, p.stride, p.padding, p.dilation, p.ceil_mode, algo]
        elif op == "avgpool2d":
            p, include_pad, divisor = L.avgpool_spec_of(m)
            args = [x, p.kernel, p.stride, p.padding, p.ceil_mode, include_pad, divisor, algo]
        elif op == "adaptiveavgpool2d":
            args = [x, L.adaptive_size(m.output_size), algo]
        else:  # flatten
            args = [x, m.start_dim, m.end_dim, algo]
        self.add(op, node, args)

    def function_node(self, node: torch.fx.Node, op: str, algo: str) -> None:
        names, defaults = _SIGNATURES[op]
        b = _bind(node.args, dict(node.kwargs), names, defaults)
        x = self.input_of(node, b["input"])
        if op == "relu":
            args = [x, algo]
        elif op == "flatten":
            args = [x, b["start_dim"], b["end_dim"], algo]
        elif op == "maxpool2d":
            if b["return_indices"]:
                raise UnsupportedOperationError([(node.name, "max_pool2d(return_indices=True)")])
            p = L.pool_spec(
                b["kernel_size"], b["stride"], b["padding"], b["dilation"], b["ceil_mode"]
            )
            args = [x, p.kernel, p.stride, p.padding, p.dilation, p.ceil_mode, algo]
        elif op == "avgpool2d":
            p = L.pool_spec(b["kernel_size"], b["stride"], b["padding"], 1, b["ceil_mode"])
            args = [x, p.kernel, p.stride, p.padding, p.ceil_mode, b["count_include_pad"]]
            args += [b["divisor_override"], algo]
        elif op == "adaptiveavgpool2d":
            args = [x, L.adaptive_size(b["output_size"]), algo]
        else:  # linear
            args = [x, self.weight(b["weight"]), self.weight(b["bias"]), algo]
        self.add(op, node, args)


def _classify(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[str, str | None]:
    """``(kind, op)``: kind is 'op', 'identity', 'io', 'const' or 'unsupported'."""
    if node.op in ("placeholder", "output"):
        return "io", None
    if node.op == "get_attr":
        return "const", None
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        op = L.op_of_module(m)
        if op is not None:
            if op == "maxpool2d" and m.return_indices:
                return "unsupported", None
            return "op", op
        if isinstance(m, L.IDENTITY_MODULES):
            return "identity", None
        return "unsupported", None
    if node.op == "call_function":
        if node.target in L.FUNCTIONS:
            return "op", L.FUNCTIONS[node.target]
        if node.target in L.IDENTITY_FUNCTIONS:
            return "identity", None
        return "unsupported", None
    if node.op == "call_method" and node.target in L.METHODS:
        return "op", L.METHODS[node.target]
    return "unsupported", None


def _describe_target(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"{type(gm.get_submodule(node.target)).__name__} module '{node.target}'"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "get_attr":
        return f"attribute '{node.target}' used as an activation"
    target = node.target
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', target)}"


def convert(
    module: nn.Module,
    algos: Mapping[Any, AlgorithmicSelector] | None = None,
    sample_input_shape: Sequence[int] | None = None,
    *,
    dtype: torch.dtype | str | None = None,
) -> Model:
    """Converts ``module`` into an :class:`ai3.Model` run entirely by ai3.

    ``algos`` maps operation names (``'conv2d'``, ``'linear'``, ...) to
    selectors (see :mod:`ai3.selectors`); unnamed operations use
    ``'default'``. ``sample_input_shape`` lets function selectors see each
    layer's input shape. ``dtype`` (float32 or float64) defaults to the
    module's parameter dtype. Dropout and Identity are dropped (the model is for
    inference). Operations ai3 cannot run raise one
    :class:`ai3.UnsupportedOperationError` listing all of them.

    Example::

        model = ai3.convert(vgg16, {"conv2d": "winograd", "linear": "gemm"})
        y = model(torch.randn(1, 3, 224, 224))
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"convert: expected a torch.nn.Module, got {type(module).__name__}")
    dtype_name = _resolve_dtype(module, dtype)
    selectors = normalize_algos(algos)
    try:
        gm = torch.fx.symbolic_trace(module)
    except Exception as e:  # fx raises many types; all mean "cannot trace"
        raise UnsupportedOperationError(
            [(type(module).__name__, "torch.fx.symbolic_trace")],
            detail=f"tracing failed: {type(e).__name__}: {e}",
        ) from e

    graph_nodes = list(gm.graph.nodes)
    kinds = {n: _classify(gm, n) for n in graph_nodes}
    unsupported = [
        (n.name, _describe_target(gm, n)) for n in graph_nodes if kinds[n][0] == "unsupported"
    ]
    # A constant is fine as a weight argument, not as data flowing through the network.
    for n in graph_nodes:
        if kinds[n][0] == "op":
            data_arg = n.args[0] if n.args else n.kwargs.get("input")
            if isinstance(data_arg, torch.fx.Node) and kinds[data_arg][0] == "const":
                unsupported.append((data_arg.name, _describe_target(gm, data_arg)))
    if unsupported:
        raise UnsupportedOperationError(unsupported)

    # A module called several times is one module to its selector, as in swap_operation;
    # every call of a function counts on its own.
    counts: dict[str, int] = {}
    seen_modules: set[str] = set()
    for n in graph_nodes:
        if kinds[n][0] == "op":
            if n.op == "call_module":
                if n.target in seen_modules:
                    continue
                seen_modules.add(n.target)
            counts[kinds[n][1]] = counts.get(kinds[n][1], 0) + 1
    shapes = input_shapes_of_nodes(gm, sample_input_shape, getattr(torch, dtype_name))
    selections = {
        op: Selection(op, selectors[op], counts.get(op, 0), shapes is not None, allow_torch=False)
        for op in counts
    }

    b = _Builder(gm, dtype_name)
    placeholders = [n for n in graph_nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        b.values[n] = i
    b.next_value = len(placeholders)
    outputs: list[int] = []
    single_output = True
    module_algos: dict[str, str] = {}
    for n in graph_nodes:
        kind, op = kinds[n]
        if kind == "identity":
            b.values[n] = b.values[n.args[0]]
        elif kind == "op":
            m = gm.get_submodule(n.target) if n.op == "call_module" else None
            if m is not None and n.target in module_algos:
                algo = module_algos[n.target]
            else:
                algo = selections[op].next(m, shapes.get(n) if shapes else None)
                if m is not None:
                    module_algos[n.target] = algo
            if m is not None:
                b.module_node(n, m, op, algo)
            else:
                b.function_node(n, op, algo)
        elif n.op == "output":
            result = n.args[0]
            single_output = isinstance(result, torch.fx.Node)
            items = [result] if single_output else result
            if not isinstance(items, (list, tuple)) or not all(
                isinstance(r, torch.fx.Node) and r in b.values for r in items
            ):
                raise UnsupportedOperationError(
                    [
                        (
                            n.name,
                            f"output structure {type(result).__name__} (ai3 returns a tensor or a tuple)",
                        )
                    ]
                )
            outputs = [b.values[r] for r in items]

    recipe = {
        "dtype": dtype_name,
        "num_inputs": len(placeholders),
        "nodes": b.nodes,
        "outputs": outputs,
        "single_output": single_output,
        "sample_input_shape": tuple(sample_input_shape) if sample_input_shape else None,
    }
    return Model(recipe)


#: The reference paper's name for :func:`convert`.
swap_backend = convert
