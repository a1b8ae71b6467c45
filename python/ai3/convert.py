"""``ai3.convert``: trace a PyTorch network with ``torch.fx`` and rebuild it as
an :class:`ai3.Model` that runs entirely in Rust.

The pipeline: trace (``torch.fx``) -> lower each node (:mod:`ai3._lowering`)
-> choose algorithms (:mod:`ai3.selectors`) -> fold BatchNorm and fuse
activations (:mod:`ai3._fusion`) -> a recipe the Rust graph is built from.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn

from . import _fusion, swap
from ._export import Captured, Derived, capture, cast_of, derived_nodes, example_tuple
from ._lowering import MODULES, In, Lowerer, Step
from ._shapes import input_shapes_of_nodes, trace
from .autotune.auto import Auto
from .autotune.plan import FromPlan, Plan, as_plan, check_complete, warn_if_foreign
from .autotune.resolve import settle_trivial
from .errors import DtypeError, SelectorError, UnsupportedOperationError
from .model import Model
from .selectors import AlgorithmicSelector, Selection, normalize_algos, op_name

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


#: Operations chosen for by another operation's selector: a multi-head
#: attention node runs the attention algorithm ``{"attention": ...}`` names.
_SELECTED_AS = {"multihead_attention": "attention"}


def _select(
    lw: Lowerer,
    selectors: dict[str, Any],
    shapes,
    named: frozenset[str] = frozenset(),
) -> dict[int, str]:
    """The algorithm of every step (by index), in forward order.

    A module called several times is one module to its selector, as in
    swap_operation; every call of a function counts on its own. A swapped
    module keeps its algorithm unless its operation is in ``named`` (the
    operations the user gave selectors for), where it counts like any other.
    """

    def kept(s: Step) -> bool:
        return swap.is_swapped(s.module) and s.op not in named

    def selected_as(s: Step) -> str:
        """The operation whose selector chooses for ``s``: ``attention``'s for
        ``multihead_attention`` nodes, unless the user named that operation."""
        alias = _SELECTED_AS.get(s.op)
        return alias if alias is not None and s.op not in named else s.op

    counts: dict[str, int] = {}
    seen: set[str] = set()
    for s in lw.steps:
        if kept(s):
            continue
        if s.node.op == "call_module":
            if s.node.target in seen:
                continue
            seen.add(s.node.target)
        counts[selected_as(s)] = counts.get(selected_as(s), 0) + 1
    selections = {
        op: Selection(op, selectors[op], n, shapes is not None, allow_torch=False)
        for op, n in counts.items()
    }
    by_module: dict[str, str] = {}
    chosen: dict[int, str] = {}
    for i, s in enumerate(lw.steps):
        if kept(s):
            chosen[i] = s.module.algorithm  # type: ignore[union-attr]
            continue
        key = s.node.target if s.node.op == "call_module" else None
        if key in by_module:
            chosen[i] = by_module[key]
            continue
        algo = selections[selected_as(s)].next(s.module, shapes.get(s.node) if shapes else None)
        chosen[i] = algo
        if key is not None:
            by_module[key] = algo
    return chosen


class _Recipe:
    """Accumulates the nodes the Rust graph is built from.

    A node is a dict: ``op``, ``name``, ``inputs`` (value ids), ``params``
    (by name), ``weights`` (weight parameters read from graph values: name ->
    value id) and ``algorithm``; a constant is ``{"op": "constant", "name",
    "tensor"}``. :func:`ai3.model.add_node` builds one."""

    def __init__(self, lw: Lowerer, dtype: str):
        self.lw = lw
        self.dtype = getattr(torch, dtype)
        self.nodes: list[dict[str, Any]] = []
        self.ids: dict[torch.fx.Node, int] = {}
        self.next_id = 0
        #: Nodes whose algorithm is decided once input shapes are known
        #: (see :mod:`ai3.autotune.resolve`).
        self.pending: list[int] = []

    def tensor(self, t: Any) -> Any:
        # One private copy in the model's dtype, which the Rust side borrows without copying again.
        if isinstance(t, torch.Tensor):
            return t.detach().to(self.dtype).contiguous().clone()
        if isinstance(t, list):
            return [self.tensor(x) for x in t]
        if isinstance(t, tuple):
            return tuple(self.tensor(x) for x in t)
        return t

    def value(self, n: torch.fx.Node) -> int:
        n = self.lw.canonical(n)
        if n not in self.ids:
            if n.op != "get_attr":
                raise UnsupportedOperationError([(n.name, "value used before it is computed")])
            tensor = self.tensor(self.lw.fetch(n.target))
            self.nodes.append({"op": "constant", "name": n.name, "tensor": tensor})
            self.ids[n] = self.next_id
            self.next_id += 1
        return self.ids[n]

    def add(self, s: Step, algo: str | Auto | FromPlan) -> None:
        """Appends ``s``; an algorithm not yet known (``'auto'``, a plan's) is left
        as its marker and the node listed in :attr:`pending`."""
        ids = [self.value(i) for i in s.inputs]
        params = {k: self.tensor(v) for k, v in s.params.items() if not isinstance(v, In)}
        weights = {k: ids[v.k] for k, v in s.params.items() if isinstance(v, In)}
        name = str(s.node.target) if s.node.op == "call_module" else s.node.name
        if not isinstance(algo, str):
            self.pending.append(len(self.nodes))
        self.nodes.append(
            {
                "op": s.op,
                "name": name,
                "inputs": [ids[i] for i in s.data_inputs()],
                "params": params,
                "weights": weights,
                "algorithm": algo,
            }
        )
        self.ids[s.node] = self.next_id
        self.next_id += 1


def convert(
    module: nn.Module,
    algos: Mapping[Any, AlgorithmicSelector] | None = None,
    sample_input_shape: Sequence[int] | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    plan: Plan | str | os.PathLike | None = None,
    example_inputs: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> Model:
    """Converts ``module`` into an :class:`ai3.Model` run entirely by ai3.

    ``algos`` maps operation names (``'conv2d'``, ``'linear'``, ...) to
    selectors (see :mod:`ai3.selectors`); unnamed operations use
    ``'default'``. ``sample_input_shape`` lets function selectors see each
    layer's input shape. ``dtype`` (float32 or float64) defaults to the
    module's parameter dtype.

    The model is for inference: Dropout and Identity are dropped, BatchNorm
    uses its running statistics and is folded into the convolution before it,
    a constant per-feature scale of a layer's output (ConvNeXt's layer scale)
    into that layer, and activations are fused into the convolution or linear
    layer feeding them. Call ``module.eval()`` first: Dropout and BatchNorm in
    training mode (random, and batch statistics) are unsupported. Operations ai3
    cannot run raise one :class:`ai3.UnsupportedOperationError` listing all
    of them, and so does any argument ai3 does not implement (``dtype=``,
    ``out=``, ``rounding_mode=``, ...): none is ignored.

    In-place operations (``nn.ReLU(inplace=True)``, ``x.relu_()``) are
    computed out of place, and every later reader of the changed tensor
    reads the new value, as in PyTorch. ai3 never writes into the tensors
    given to the model: an in-place operation on an input of ``forward``
    leaves the caller's tensor unchanged (the outputs are still PyTorch's).
    A view or alias of the changed memory (``x.view(...)``, ``chunk``,
    ``contiguous``) read after the change, and an in-place change of a
    module's tensor, are unsupported.

    Modules swapped by :func:`ai3.swap_operation` are converted as the
    operation they stand for and keep their algorithm, unless ``algos`` names
    that operation: then the selector decides for them too.

    ``'auto'`` (or an :class:`ai3.Auto`) times every algorithm that can run a
    layer on its input shape and keeps the fastest accurate one: at convert
    time with ``sample_input_shape``, else at the first call (those choices
    then stay for other shapes). Measurements are cached on disk, so a second
    conversion times nothing; ``model.plan()`` gives the choices as a
    :class:`ai3.Plan`. ``plan`` (a :class:`ai3.Plan` or the path of a saved
    one) applies saved choices without timing: the model's layers must match
    the plan's, on the plan's input shapes unless ``sample_input_shape`` is
    given, or :class:`ai3.PlanError` names the first that does not.

    A network ``torch.fx`` cannot trace (Hugging Face transformers, code
    that branches on its inputs) is captured with ``torch.export`` when
    ``example_inputs`` (a tensor, or a tuple with one per input of
    ``forward``) are given: every dimension stays dynamic, so the model
    follows the batch size and sequence length of each call (dimensions of
    size 1 in the example are fixed by torch.export: give a batch of 2).
    Integer inputs (token ids) are read as embedding indices. Tensors the
    network computes from input shapes alone (position ids, causal masks)
    are computed with PyTorch once per input shape and cached. A forward
    that takes ``use_cache`` is captured with ``use_cache=False``. The
    example inputs also serve as ``sample_input_shape``.

    Example::

        model = ai3.convert(resnet50, {"conv2d": "winograd", "linear": "gemm"})
        y = model(torch.randn(1, 3, 224, 224))
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"convert: expected a torch.nn.Module, got {type(module).__name__}")
    if module._forward_hooks or module._forward_pre_hooks:
        # fx traces the module's forward, not its __call__, so its hooks would be lost.
        raise UnsupportedOperationError([(type(module).__name__, "forward hooks")])
    dtype_name = _resolve_dtype(module, dtype)
    examples = None if example_inputs is None else example_tuple(example_inputs)
    if examples is not None and sample_input_shape is None:
        shapes_of = [list(x.shape) for x in examples]
        sample_input_shape = shapes_of[0] if len(shapes_of) == 1 else shapes_of
    selectors = normalize_algos(algos)
    named = frozenset(op_name(k) for k in algos) if algos else frozenset()
    if plan is not None:
        plan = as_plan(plan)
        both = sorted(named & set(plan.ops))
        if both:
            raise SelectorError(
                f"convert: the plan chooses the algorithms of {both}; do not also give "
                "selectors for them"
            )
        warn_if_foreign(plan)
        for op in plan.ops:
            selectors[op] = FromPlan(plan, op)
        named |= frozenset(plan.ops)
    # The shapes pending layers are decided for: the user's, else the plan's.
    decide_for: Any = tuple(sample_input_shape) if sample_input_shape else None
    if decide_for is None and plan is not None:
        decide_for = [tuple(s) for s in plan.input_shapes]
    if swap.is_swapped(module) or type(module) in MODULES:
        # A layer passed on its own is traced as one call of it, with its
        # module semantics (padding modes, ...), not through its forward.
        module = nn.Sequential(OrderedDict([(type(module).__name__.lower(), module)]))
    captured = _capture(module, sample_input_shape, examples)
    lw, frontier, casts = _lower(captured)
    if lw.unsupported and examples is not None and not captured.exported:
        # What torch.fx traced has operations ai3 cannot lower (torch.arange, ...):
        # torch.export records them as ATen operations, or computes them from shapes.
        try:
            captured = capture(module, examples)
        except Exception:  # then the operations fx found are the error to report
            pass
        else:
            lw, frontier, casts = _lower(captured)
    if lw.unsupported:
        raise UnsupportedOperationError(lw.unsupported)
    gm = captured.gm
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index_inputs = _index_inputs(lw, placeholders, captured.exported)
    shapes = input_shapes_of_nodes(
        gm, sample_input_shape, getattr(torch, dtype_name), examples if captured.exported else None
    )
    _fusion.fuse_attention(lw)
    chosen = _select(lw, selectors, shapes, named)
    algo_of = {id(s): settle_trivial(s.op, chosen[i]) for i, s in enumerate(lw.steps)}
    running = _fusion.apply(lw, algo_of)

    recipe = _Recipe(lw, dtype_name)
    for n in placeholders + frontier:
        recipe.ids[n] = recipe.next_id
        recipe.next_id += 1
    for s in running:
        recipe.add(s, algo_of[id(s)])
    if plan is not None and not any(isinstance(algo_of[id(s)], FromPlan) for s in running):
        check_complete(plan, 0)
    dtype_t = getattr(torch, dtype_name)
    return Model(
        {
            "dtype": dtype_name,
            "num_inputs": len(placeholders) + len(frontier),
            "nodes": recipe.nodes,
            "outputs": [recipe.value(o) for o in lw.outputs],
            "single_output": lw.single_output,
            "sample_input_shape": decide_for,
            "pending": recipe.pending,
            "index_inputs": index_inputs,
            "derived": Derived(gm, frontier, casts, dtype_t) if frontier else None,
            "out_spec": captured.out_spec,
        }
    )


def _lower(captured: Captured) -> tuple[Lowerer, list[torch.fx.Node], list[str | None]]:
    """The lowered graph, the tensors it reads that are computed from input shapes
    alone (see :mod:`ai3._export`) and how each reaches the Rust graph."""
    gm = captured.gm
    derived, frontier = derived_nodes(gm) if captured.exported else (set(), [])
    lw = Lowerer(gm, captured.root, derived, frontier)
    lw.run()
    casts = [cast_of(n) for n in frontier]
    for n, cast in zip(frontier, casts, strict=True):
        if cast is None:
            readers = ", ".join(u.name for u in n.users)
            lw.unsupported.append(
                (
                    n.name,
                    f"a {n.meta['val'].dtype} tensor computed from input shapes, read by "
                    f"{readers} (ai3 computes in one float dtype)",
                )
            )
    return lw, frontier, casts


def _capture(module: nn.Module, sample_input_shape: Any, examples: Any) -> Captured:
    """The graph of ``module``: traced by ``torch.fx``, else, given example inputs,
    captured by ``torch.export`` (:mod:`ai3._export`)."""
    try:
        return Captured(trace(module, sample_input_shape), None, None, exported=False)
    except Exception as e:  # fx raises many types; all mean "cannot trace"
        fx_error = e
    if examples is None:
        raise UnsupportedOperationError(
            [(type(module).__name__, "torch.fx.symbolic_trace")],
            detail=(
                f"tracing failed: {type(fx_error).__name__}: {fx_error}; give "
                "convert(..., example_inputs=...) to capture it with torch.export instead"
            ),
        ) from fx_error
    try:
        return capture(module, examples)
    except Exception as e:  # torch.export's own errors, many types
        raise UnsupportedOperationError(
            [(type(module).__name__, "torch.export")],
            detail=f"torch.fx failed ({type(fx_error).__name__}), and torch.export "
            f"failed: {type(e).__name__}: {e}",
        ) from e


#: Operations that move elements without computing: integer indices may pass them.
_MOVES = frozenset({"reshape", "flatten", "permute", "expand", "index", "slice", "cat"})


def _index_inputs(lw: Lowerer, placeholders: list[torch.fx.Node], exported: bool) -> list[int]:
    """The positions of the inputs that are embedding indices (token ids), which
    the model converts from integers: those a captured graph takes as integers
    (read, through reshapes and slices, only as indices), or those a traced
    graph reads only that way."""
    reach: dict[torch.fx.Node, torch.fx.Node] = {p: p for p in placeholders}
    readers: dict[torch.fx.Node, set[str]] = {p: set() for p in placeholders}
    for s in lw.steps:
        for i in s.data_inputs():
            origin = reach.get(lw.canonical(s.inputs[i]))
            if origin is None or (s.op in ("reshape", "expand") and i > 0):
                continue  # (reshape and expand read only the shapes of their other inputs)
            readers[origin].add(s.op if (s.op in _MOVES or (s.op, i) == ("embedding", 0)) else "")
            if s.op in _MOVES:
                reach[s.node] = origin
    found, misread = [], []
    for i, p in enumerate(placeholders):
        val = p.meta.get("val")
        integer = isinstance(val, torch.Tensor) and not val.is_floating_point()
        only_indices = readers[p] <= _MOVES | {"embedding"}  # (or only its shape is read)
        if integer and not only_indices:
            misread.append(
                (
                    p.name,
                    f"an integer input of shape {list(val.shape)} read other than as embedding indices (ai3 computes in one float dtype)",
                )
            )
        elif integer or (not exported and only_indices and "embedding" in readers[p]):
            found.append(i)
    if misread:
        raise UnsupportedOperationError(misread)
    return found


#: The reference paper's name for :func:`convert`.
swap_backend = convert
