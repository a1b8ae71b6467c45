"""Capture with ``torch.export``, for networks ``torch.fx.symbolic_trace``
cannot trace (Hugging Face transformers and other code that branches on its
inputs), and the tensors such graphs compute from input shapes alone.

:func:`capture` exports the module on the user's ``example_inputs`` with every
dimension dynamic (``Dim.AUTO``), so the graph reads sizes at run time
(``aten.sym_size``) instead of baking in the example's. Its nodes are ATen
operations, which the handlers of :mod:`ai3._lowering` lower as they do the
``torch`` functions.

Such graphs also compute tensors from sizes and buffers only: position ids
(``arange(seq)``), attention masks built by comparing ``arange`` s, a slice of
a buffer. :class:`Derived` finds them (:func:`derived_nodes`) and computes
them with PyTorch once per input shape, caching the results; the ones the
network reads become extra inputs of the Rust graph, in the model's dtype: a
boolean attention mask as the additive mask ai3 takes, integer indices as
exact floats. Everything that depends on the inputs' values runs in Rust.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn

aten = torch.ops.aten

#: How many input shapes a model keeps the derived tensors of.
SHAPES_KEPT = 64


@dataclass
class Captured:
    """A captured graph: by :func:`capture` (ATen operations, parameters as
    ``get_attr``, with the structure its flat outputs are returned in), or by
    ``torch.fx`` (``exported=False``, no output structure)."""

    gm: torch.fx.GraphModule
    out_spec: Any
    #: The module the graph's ``nn_module_stack`` paths start from.
    root: nn.Module | None
    #: Whether torch.export captured it (else torch.fx traced it).
    exported: bool = True


def example_tuple(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    """``example_inputs`` as a tuple of tensors (a single tensor is one input)."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, list | tuple) and all(
        isinstance(x, torch.Tensor) for x in example_inputs
    ):
        return tuple(example_inputs)
    raise TypeError(
        "convert: example_inputs must be a tensor or a tuple of tensors, got "
        f"{type(example_inputs).__name__}"
    )


def capture(module: nn.Module, example_inputs: Sequence[torch.Tensor]) -> Captured:
    """``torch.export`` of ``module`` on ``example_inputs``, every dimension dynamic.

    A forward that takes ``use_cache`` (Hugging Face models) is called with
    ``use_cache=False``: the converted model returns no key/value cache.
    torch.export fixes dimensions of size 0 or 1 in the example (it
    specialises them), so an example with batch 2 keeps the batch free."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        params = {}
    root = _NoCache(module) if "use_cache" in params else module
    dims: Any = tuple({i: torch.export.Dim.AUTO for i in range(x.dim())} for x in example_inputs)
    if root is not module:
        dims = (dims,)  # the wrapper's *args
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            ep = torch.export.export(root, tuple(example_inputs), dynamic_shapes=dims, strict=False)
    finally:
        module.train(was_training)
    gm = ep.module()
    return Captured(gm, getattr(gm, "_out_spec", None), root)


class _NoCache(nn.Module):
    """Calls ``inner`` with ``use_cache=False``."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return self.inner(*args, use_cache=False)


def _is_tensor_node(n: torch.fx.Node) -> bool:
    return isinstance(n.meta.get("val"), torch.Tensor)


#: Calls that read only their argument's shape: their result does not depend on its values.
_SHAPE_READERS = {aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int}


def derived_nodes(gm: torch.fx.GraphModule) -> tuple[set[torch.fx.Node], list[torch.fx.Node]]:
    """The tensor nodes of an exported graph computed from input shapes and the
    module's tensors only, and among them those a node of the network (or the
    output) reads: the frontier, in graph order."""
    data: set[torch.fx.Node] = set()  # nodes whose value depends on an input's values
    derived: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            data.add(n)
        elif n.op == "call_function" and n.target not in _SHAPE_READERS:
            if any(a in data for a in n.all_input_nodes):
                data.add(n)
            elif _is_tensor_node(n) or (
                n.meta.get("val") is None and any(a in derived for a in n.all_input_nodes)
            ):
                derived.add(n)  # (or a check of such a tensor, which returns nothing)
        elif n.op == "call_module":
            data.add(n)
    frontier = [
        n
        for n in gm.graph.nodes
        if n in derived and _is_tensor_node(n) and any(u not in derived for u in n.users)
    ]
    return derived, frontier


def _embedding_indices(user: torch.fx.Node, n: torch.fx.Node) -> bool:
    return user.target == aten.embedding.default and len(user.args) > 1 and user.args[1] is n


def _attention_mask(user: torch.fx.Node, n: torch.fx.Node) -> bool:
    if user.target != aten.scaled_dot_product_attention.default:
        return False
    return (len(user.args) > 3 and user.args[3] is n) or user.kwargs.get("attn_mask") is n


def cast_of(n: torch.fx.Node) -> str | None:
    """How a derived tensor reaches the Rust graph: ``'float'`` (converted to
    the model's dtype), ``'index'`` (integers, read as embedding indices),
    ``'mask'`` (booleans, read as attention masks, made additive); None when
    a reader would need it in a dtype ai3 does not compute in."""
    dtype = n.meta["val"].dtype
    users = [u for u in n.users if u.op != "output"]
    if dtype.is_floating_point:
        return "float"
    if dtype == torch.bool:
        ok = all(_attention_mask(u, n) for u in users) and len(users) == len(n.users)
        return "mask" if ok else None
    ok = all(_embedding_indices(u, n) for u in users) and len(users) == len(n.users)
    return "index" if ok else None


def index_input(indices: torch.Tensor, dtype: torch.dtype, what: str) -> torch.Tensor:
    """Integer ``indices`` as exact floats of ``dtype`` (the dtype ai3 computes in),
    or an error naming ``what`` and the shape."""
    from .errors import DtypeError

    if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex():
        raise DtypeError(
            f"{what}: indices of shape {list(indices.shape)} are {indices.dtype}; "
            "embedding takes integer indices (torch.long or torch.int)"
        )
    exact = 2 ** {torch.float32: 24, torch.float64: 53}[dtype]  # every integer below is exact
    if indices.numel() and int(indices.abs().max()) >= exact:
        raise DtypeError(
            f"{what}: an index of {int(indices.abs().max())} (indices of shape "
            f"{list(indices.shape)}) is beyond what {dtype} holds exactly ({exact})"
        )
    return indices.to(dtype)


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask (True: attend) as ai3 adds it to the scores."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))


class Derived:
    """The tensors of an exported graph computed from input shapes alone, as a
    callable: given the model's inputs, it returns them in the model's dtype
    (see :func:`cast_of`), computing them with PyTorch once per input shape.
    Pickles with the model (the graph is kept as an fx ``GraphModule``)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        frontier: list[torch.fx.Node],
        casts: list[str],
        dtype: torch.dtype,
    ):
        graph = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        needed = set(frontier)
        for n in reversed(gm.graph.nodes):  # what they are computed from
            if n in needed:
                needed.update(n.all_input_nodes)
        for n in gm.graph.nodes:
            if n.op == "placeholder" or n in needed:
                env[n] = graph.node_copy(n, lambda a: env[a])
        graph.output(tuple(env[n] for n in frontier))
        self.module = torch.fx.GraphModule(gm, graph, "Derived")
        #: The dtypes of the network's inputs (integer ones are indices).
        self.input_dtypes = [n.meta["val"].dtype for n in gm.graph.nodes if n.op == "placeholder"]
        self.casts = casts
        self.dtype = dtype
        self._cache: OrderedDict[tuple, list[torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()  # models may be called from several threads

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _cache=OrderedDict(), _lock=threading.Lock())

    def __call__(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        key = tuple(tuple(getattr(x, "shape", ())) for x in inputs)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            out = self._compute(inputs)
            self._cache[key] = out
            if len(self._cache) > SHAPES_KEPT:
                self._cache.popitem(last=False)
            return out

    def _compute(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        from .errors import ShapeError

        try:
            with torch.no_grad():
                values = self.module(*inputs)
        except Exception as e:  # PyTorch's own error on these shapes, many types
            shapes = [list(getattr(x, "shape", ())) for x in inputs]
            raise ShapeError(
                f"model: the tensors the network computes from its input shapes "
                f"(position ids, masks) fail for inputs of shapes {shapes}: "
                f"{type(e).__name__}: {e}"
            ) from e
        out = []
        for v, cast in zip(values, self.casts, strict=True):
            if cast == "mask":
                out.append(additive(v, self.dtype))
            elif cast == "index":
                out.append(index_input(v, self.dtype, "embedding"))
            else:
                out.append(v.to(self.dtype).contiguous())
        return out

    def shapes(self, input_shapes: Sequence[Sequence[int]]) -> list[list[int]]:
        """The shapes of the derived tensors for inputs of these shapes."""
        zeros = [
            torch.zeros(tuple(s), dtype=d)
            for s, d in zip(input_shapes, self.input_dtypes, strict=True)
        ]
        return [list(t.shape) for t in self(zeros)]
