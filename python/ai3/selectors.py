"""Algorithmic selectors: how a user says which algorithm each module uses.

A selector is one of

- a name (``'direct'``), used for every module of that operation; ``'auto'``
  (or an :class:`ai3.Auto` with settings) times the algorithms on each
  layer's input shape and keeps the fastest accurate one;
- a list of names, used in forward order (one per module; too short is an error);
- a function ``f(module) -> str``, or ``f(module, input_shape) -> str`` when a
  ``sample_input_shape`` is given so ai3 can tell it each module's input shape.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from . import _core
from .algorithms import DEFAULT_ALGOS, OPERATIONS
from .autotune.auto import Auto, as_auto
from .autotune.plan import FromPlan
from .errors import SelectorError

#: Anything that selects algorithms for one operation.
AlgorithmicSelector = str | Auto | Sequence[str | Auto] | Callable[..., str | Auto]


def op_name(op: Any) -> str:
    """Normalizes an operation given as a name (``'conv2d'``, ``'Conv2d'``,
    ``'MultiheadAttention'``: case and underscores do not matter) or a module type."""
    from ._layers import MODULE_TYPES

    if isinstance(op, str):
        squashed = {o.replace("_", ""): o for o in OPERATIONS}
        name = squashed.get(op.lower().replace("_", ""))
        if name is not None:
            return name
    elif isinstance(op, type):
        for name, types in MODULE_TYPES.items():
            if op in types:
                return name
    raise SelectorError(f"unknown operation {op!r}; ai3 knows {list(OPERATIONS)}")


def normalize_algos(algos: Mapping[Any, AlgorithmicSelector] | None) -> dict[str, Any]:
    """A selector for every operation: the user's where given, ``'default'`` elsewhere."""
    out: dict[str, Any] = dict(DEFAULT_ALGOS)
    if algos is None:
        return out
    if not isinstance(algos, Mapping):
        raise SelectorError(
            "algos must map operation names (e.g. 'conv2d') to selectors, "
            f"got {type(algos).__name__}"
        )
    for key, sel in algos.items():
        out[op_name(key)] = sel
    return out


def _arity(fn: Callable[..., str]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional)


class Selection:
    """Picks algorithms for the modules of one operation, in forward order.

    ``count`` is how many modules there are, so a list selector of the wrong
    length fails before anything is built.
    """

    def __init__(
        self,
        op: str,
        selector: AlgorithmicSelector,
        count: int,
        has_shapes: bool,
        allow_torch: bool,
    ):
        self.op = op
        self.selector = selector
        self.allow_torch = allow_torch
        self.index = 0
        if isinstance(selector, (str, Auto, FromPlan)):
            self.kind = "name"
        elif callable(selector):
            self.kind = "function"
            arity = _arity(selector)
            if arity == 2 and not has_shapes:
                raise SelectorError(
                    f"the {op} selector takes (module, input_shape), but no sample_input_shape "
                    "was given; pass sample_input_shape=... or a selector taking only the module"
                )
            if arity != 2 and has_shapes:
                raise SelectorError(
                    f"sample_input_shape was given, but the {op} selector takes {arity} "
                    "argument(s); a selector used with sample_input_shape takes "
                    "(module, input_shape)"
                )
            if arity not in (1, 2):
                raise SelectorError(
                    f"the {op} selector must take (module) or (module, input_shape), "
                    f"it takes {arity} required argument(s)"
                )
            self.with_shape = arity == 2
        elif isinstance(selector, Sequence):
            self.kind = "list"
            if len(selector) < count:
                raise SelectorError(
                    f"the {op} selector lists {len(selector)} algorithm(s) but the network "
                    f"has {count} {op} module(s); give one algorithm per module, in forward order"
                )
        else:
            raise SelectorError(
                f"the {op} selector must be a name, a list of names or a function, "
                f"got {type(selector).__name__}"
            )

    def next(self, module: nn.Module, input_shape: Sequence[int] | None) -> str | Auto | FromPlan:
        """The algorithm for the next module in forward order (validated by name);
        an :class:`Auto` for ``'auto'``, decided later on the layer's input shape."""
        if self.kind == "name":
            algo = self.selector
        elif self.kind == "list":
            algo = self.selector[self.index]  # type: ignore[index]
        elif self.with_shape:
            algo = self.selector(module, tuple(input_shape) if input_shape else None)  # type: ignore[operator]
        else:
            algo = self.selector(module)  # type: ignore[operator]
        self.index += 1
        if isinstance(algo, FromPlan):
            return algo
        auto = as_auto(algo)
        if auto is not None:
            for name in auto.algorithms or ():
                _core.check_algorithm(self.op, name)
            return auto
        if not isinstance(algo, str):
            raise SelectorError(
                f"the {self.op} selector returned {algo!r} for module {self.index} "
                "but must return an algorithm name (or an ai3.Auto)"
            )
        if algo == "torch":
            if not self.allow_torch:
                raise SelectorError(
                    f"{self.op}: 'torch' keeps the PyTorch module and only applies to "
                    "swap_operation; convert runs every operation in ai3"
                )
            return algo
        _core.check_algorithm(self.op, algo)
        return algo
