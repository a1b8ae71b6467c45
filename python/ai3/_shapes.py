"""Input shapes of layers, found by running the network once on zeros of
``sample_input_shape`` in eval mode (so BatchNorm statistics are untouched)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp


@contextlib.contextmanager
def _eval_no_grad(module: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


def _zeros(module: nn.Module, shape: Sequence[int], dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is None:
        p = next((p for p in module.parameters() if p.is_floating_point()), None)
        dtype = torch.float32 if p is None else p.dtype
    return torch.zeros(tuple(shape), dtype=dtype)


def input_shapes_of_nodes(
    gm: torch.fx.GraphModule,
    sample_input_shape: Sequence[int] | None,
    dtype: torch.dtype,
    examples: Sequence[torch.Tensor] | None = None,
) -> dict[torch.fx.Node, tuple[int, ...]] | None:
    """For each fx node, the shape of its first argument; ``None`` without a sample shape.
    A network with several inputs takes a sequence of shapes, one per input. The
    network runs on zeros of these shapes, in the dtypes of ``examples`` when
    given (a graph captured by torch.export, which is in eval mode already)."""
    if sample_input_shape is None:
        return None
    shapes = sample_input_shape
    if not (len(shapes) and all(isinstance(s, Sequence) for s in shapes)):
        shapes = [shapes]
    with torch.no_grad() if examples else _eval_no_grad(gm):
        try:
            # ShapeProp prints the traceback of a failing node itself; the error below says it.
            with contextlib.redirect_stderr(io.StringIO()):
                dtypes = [x.dtype for x in examples] if examples else [dtype] * len(shapes)
                inputs = [_zeros(gm, s, d) for s, d in zip(shapes, dtypes, strict=True)]
                ShapeProp(gm).propagate(*inputs)
        except Exception as e:  # the network's own error on these shapes (an assertion, ...)
            from .errors import ShapeError

            cause = e.__cause__ or e
            raise ShapeError(
                f"convert: the network fails on sample_input_shape {list(shapes)}: "
                f"{type(cause).__name__}: {cause}"
            ) from e
    shapes = {}
    for n in gm.graph.nodes:
        arg = n.args[0] if n.args else None
        meta = arg.meta.get("tensor_meta") if isinstance(arg, torch.fx.Node) else None
        if meta is not None and hasattr(meta, "shape"):
            shapes[n] = tuple(meta.shape)
    return shapes


def input_shapes_of_modules(
    module: nn.Module, sample_input_shape: Sequence[int], targets: Iterable[nn.Module]
) -> dict[nn.Module, tuple[int, ...]]:
    """The input shape each of ``targets`` sees on its first call."""
    shapes: dict[nn.Module, tuple[int, ...]] = {}

    def hook(m: nn.Module, args: tuple) -> None:
        if m not in shapes and args and isinstance(args[0], torch.Tensor):
            shapes[m] = tuple(args[0].shape)

    handles = [t.register_forward_pre_hook(hook) for t in set(targets)]
    try:
        with _eval_no_grad(module):
            module(_zeros(module, sample_input_shape, None))
    finally:
        for h in handles:
            h.remove()
    return shapes


class Tracer(torch.fx.Tracer):
    """``torch.fx`` tracer that keeps ai3's swapped modules as leaves: their
    ``forward`` branches on the input, which fx cannot trace, and each stands
    for one operation anyway."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        from .swap import is_swapped  # swap imports this module

        return is_swapped(m) or super().is_leaf_module(m, module_qualified_name)

    def __init__(self, shapes: dict[nn.Module, tuple[int, ...]] | None = None):
        super().__init__()
        #: Input shapes of the modules whose decomposition needs one.
        self.shapes = shapes or {}

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        """Modules with a decomposition (``nn.MultiheadAttention``, Swin's
        blocks) are traced as their functional form (see :mod:`ai3._decompose`);
        one that cannot be stays a single node, reported with the reason."""
        from ._decompose import DECOMPOSITIONS, decompose

        if type(m) not in DECOMPOSITIONS:
            return super().call_module(m, forward, args, kwargs)
        out = decompose(m, args, kwargs, self.shapes.get(m))
        if out is not NotImplemented:
            return out
        name = self.path_of_module(m)
        return self.create_proxy("call_module", name, args, kwargs)


def trace(module: nn.Module, sample_input_shape: Any = None) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace(module)`` with swapped modules as leaves, and
    modules with a decomposition traced as it (those that need their input
    shape get it from one run on ``sample_input_shape``)."""
    from ._decompose import NEEDS_SHAPES

    shapes = None
    targets = [m for m in module.modules() if isinstance(m, NEEDS_SHAPES)]
    if targets and sample_input_shape is not None:
        shapes = input_shapes_of_modules(module, sample_input_shape, targets)
    tracer = Tracer(shapes)
    graph = tracer.trace(module)
    return torch.fx.GraphModule(tracer.root, graph, type(module).__name__)


def forward_order(module: nn.Module, targets: Sequence[nn.Module]) -> list[nn.Module]:
    """``targets`` in the order the forward pass first calls them.

    Uses fx tracing (no computation), with swapped modules as leaves; modules
    fx cannot see keep their registration order after the ones it can.
    """
    if not targets:
        return []
    try:
        gm = trace(module)
    except Exception:  # untraceable forward: registration order is the best we know
        return list(targets)
    order: list[nn.Module] = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            m = gm.get_submodule(n.target)
            if m in targets and m not in order:
                order.append(m)
    order += [t for t in targets if t not in order]
    return order
