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

    counts: dict[str, int] = {}
    seen: set[str] = set()
    for s in lw.steps:
        if kept(s):
            continue
        if s.node.op == "call_module":
            if s.node.target in seen:
                continue
            seen.add(s.node.target)
        counts[s.op] = counts.get(s.op, 0) + 1
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
        algo = selections[s.op].next(s.module, shapes.get(s.node) if shapes else None)
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
) -> Model:
    """Converts ``module`` into an :class:`ai3.Model` run entirely by ai3.

    ``algos`` maps operation names (``'conv2d'``, ``'linear'``, ...) to
    selectors (see :mod:`ai3.selectors`); unnamed operations use
    ``'default'``. ``sample_input_shape`` lets function selectors see each
    layer's input shape. ``dtype`` (float32 or float64) defaults to the
    module's parameter dtype.

    The model is for inference: Dropout and Identity are dropped, BatchNorm
    uses its running statistics and is folded into the convolution before it,
    and activations are fused into the convolution or linear layer feeding
    them. Call ``module.eval()`` first: Dropout and BatchNorm in training
    mode (random, and batch statistics) are unsupported. Operations ai3
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
    try:
        gm = trace(module, sample_input_shape)
    except Exception as e:  # fx raises many types; all mean "cannot trace"
        raise UnsupportedOperationError(
            [(type(module).__name__, "torch.fx.symbolic_trace")],
            detail=f"tracing failed: {type(e).__name__}: {e}",
        ) from e

    lw = Lowerer(gm)
    lw.run()
    if lw.unsupported:
        raise UnsupportedOperationError(lw.unsupported)
    shapes = input_shapes_of_nodes(gm, sample_input_shape, getattr(torch, dtype_name))
    chosen = _select(lw, selectors, shapes, named)
    algo_of = {id(s): settle_trivial(s.op, chosen[i]) for i, s in enumerate(lw.steps)}
    running = _fusion.apply(lw, algo_of)

    recipe = _Recipe(lw, dtype_name)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in placeholders:
        recipe.ids[n] = recipe.next_id
        recipe.next_id += 1
    for s in running:
        recipe.add(s, algo_of[id(s)])
    if plan is not None and not any(isinstance(algo_of[id(s)], FromPlan) for s in running):
        check_complete(plan, 0)
    return Model(
        {
            "dtype": dtype_name,
            "num_inputs": len(placeholders),
            "nodes": recipe.nodes,
            "outputs": [recipe.value(o) for o in lw.outputs],
            "single_output": lw.single_output,
            "sample_input_shape": decide_for,
            "pending": recipe.pending,
        }
    )


#: The reference paper's name for :func:`convert`.
swap_backend = convert
