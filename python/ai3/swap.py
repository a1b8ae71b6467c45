"""``ai3.swap_operation``: replace modules of one operation in place with thin
modules that run ai3's algorithms through ``torch.library`` custom operators.

The replacements share the original ``Parameter`` objects, so optimizers
keep working; they train (gradients equal PyTorch's), compile with
``torch.compile(fullgraph=True)``, pickle and deep-copy.

A swapped layer packs or transforms its weights (Winograd's filter transform,
for one) on its first call and reuses them while PyTorch reports the weights
unchanged: the same tensors, storage and version counter. Every in-place
update PyTorch tracks (optimizer steps, ``load_state_dict``, ``nn.init``,
``with torch.no_grad(): w.mul_(2)``) and every new ``.data`` rebuilds them.
Writes through ``w.data`` in place (``w.data.mul_(2)``) bypass the version
counter, as they bypass autograd's checks, and are not seen: update weights
in place under ``torch.no_grad()`` instead. Weights made under
``torch.inference_mode()`` (inference tensors) have no version counter at
all, so those layers re-pack them on every call, and swapping them warns.

A swapped module carries the hyperparameters of the module it replaced
(``stride``, ``padding`` as given, ...) and reads like it in its repr, plus
its algorithm. Swapping again finds already-swapped layers: it rebuilds them
with the new algorithm, and ``'torch'`` turns them back into plain PyTorch
modules, always with the same ``Parameter`` objects.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import _core, _custom_ops
from . import _layers as L
from ._shapes import forward_order, input_shapes_of_modules
from .autotune.auto import Auto
from .autotune.plan import FromPlan, Plan, as_plan, warn_if_foreign
from .errors import DtypeError, PlanError, SelectorError, ShapeError
from .selectors import AlgorithmicSelector, Selection, op_name

__all__ = [
    "swap_operation",
    "is_swapped",
    "swap_conv2d",
    "swap_linear",
    "swap_relu",
    "swap_maxpool2d",
    "swap_avgpool2d",
    "swap_adaptiveavgpool2d",
    "swap_flatten",
    "Conv2d",
    "Linear",
    "ReLU",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
    "Flatten",
]


def _as_batched(op: str, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if x.dim() == 4:
        return x, True
    if x.dim() == 3:
        return x.unsqueeze(0), False
    raise ShapeError(
        f"{op}: expected a 3-D (unbatched) or 4-D (batched) input, got shape {list(x.shape)}"
    )


#: Attributes every ``nn.Module`` has; anything else on a PyTorch module is a
#: hyperparameter (``stride``, ``ceil_mode``, ...) its swapped form keeps.
_MODULE_INTERNALS = frozenset(nn.Module().__dict__)


class _Swapped(nn.Module):
    """Common base: remembers the algorithm, the operation it stands for and
    the PyTorch module it replaced.

    The replaced module's hyperparameters are copied onto the swapped one
    (``in_channels``, ``stride``, ``padding`` as given, ...), so it reads like
    the PyTorch module, and :meth:`to_torch` can rebuild that module.
    """

    op: str = ""
    #: The PyTorch module type this class stands in for.
    torch_type: type[nn.Module] = nn.Module

    def __init__(self, orig: nn.Module, algorithm: str | Auto):
        super().__init__()
        self.algorithm = algorithm
        self._hyper = {k: v for k, v in vars(orig).items() if k not in _MODULE_INTERNALS}
        for k, v in self._hyper.items():
            if not k.startswith("_"):
                setattr(self, k, v)
        for name, p in orig._parameters.items():
            self.register_parameter(name, p)
        self.train(orig.training)

    def to_torch(self) -> nn.Module:
        """The plain PyTorch module this one stands for, with the same
        hyperparameters and sharing the same ``Parameter`` objects."""
        m = self.torch_type.__new__(self.torch_type)
        nn.Module.__init__(m)
        for k, v in self._hyper.items():
            setattr(m, k, v)
        for name, p in self._parameters.items():
            m.register_parameter(name, p)
        m.train(self.training)
        return m

    def extra_repr(self) -> str:
        base = self.torch_type.extra_repr(self)
        algo = repr(str(self.algorithm))  # an ai3.Auto still to decide shows as 'auto'
        return f"{base}, algorithm={algo}" if base else f"algorithm={algo}"

    def _algo(self, x: torch.Tensor) -> str:
        """The algorithm; ``'auto'`` is decided here, on the first input's shape."""
        if not isinstance(self.algorithm, str):
            self.algorithm = decide_module(self, tuple(x.shape), self.algorithm)
        return self.algorithm


class Conv2d(_Swapped):
    """Stands in for ``nn.Conv2d``, sharing its weight and bias."""

    op = "conv2d"
    torch_type = nn.Conv2d

    def __init__(self, orig: nn.Conv2d, algorithm: str):
        super().__init__(orig, algorithm)
        self.spec = L.conv_spec_of(orig)
        # Fails now, not at the first forward, for an algorithm that cannot run this layer.
        dtype = {torch.float32: "float32", torch.float64: "float64"}.get(orig.weight.dtype)
        if dtype is not None and isinstance(algorithm, str):
            s = self.spec
            params = {"weight": orig.weight.detach(), "stride": s.stride, "padding": s.padding}
            params.update(dilation=s.dilation, groups=s.groups)
            _core.Model(dtype, 1, copy_weights=False).add("conv2d", "probe", [0], params, algorithm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, batched = _as_batched(self.op, x)
        algo = self._algo(x)
        weight = self.weight
        if x.dtype != weight.dtype:
            raise DtypeError(
                f"conv2d: input of shape {list(x.shape)} is {x.dtype} but the weight of shape "
                f"{list(weight.shape)} is {weight.dtype}"
            )
        s = self.spec
        top, bottom, left, right = s.padding
        if s.padding_mode != "zeros":
            x = F.pad(x, (left, right, top, bottom), mode=s.padding_mode)
            top = bottom = left = right = 0
        elif top != bottom or left != right:
            # Asymmetric 'same' padding: the extra zeros go bottom/right, as in PyTorch.
            x = F.pad(x, (0, right - left, 0, bottom - top))
        y = _custom_ops.call(
            "conv2d", x, weight, self.bias, s.stride, (top, left), s.dilation, s.groups, algo
        )
        return y if batched else y.squeeze(0)


class Linear(_Swapped):
    """Stands in for ``nn.Linear``, sharing its weight and bias."""

    op = "linear"
    torch_type = nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:
            raise DtypeError(
                f"linear: input of shape {list(x.shape)} is {x.dtype} but the weight of shape "
                f"{list(self.weight.shape)} is {self.weight.dtype}"
            )
        return _custom_ops.call("linear", x, self.weight, self.bias, self._algo(x))


class ReLU(_Swapped):
    """Stands in for ``nn.ReLU``; with ``inplace=True`` it writes the result into
    its input and returns it, as PyTorch's does (later readers see the change)."""

    op = "relu"
    torch_type = nn.ReLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _custom_ops.call("relu", x, self._algo(x))
        return x.copy_(y) if self.inplace else y


class MaxPool2d(_Swapped):
    """Stands in for ``nn.MaxPool2d``."""

    op = "maxpool2d"
    torch_type = nn.MaxPool2d

    def __init__(self, orig: nn.MaxPool2d, algorithm: str):
        super().__init__(orig, algorithm)
        self.spec = L.maxpool_spec_of(orig)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, batched = _as_batched(self.op, x)
        p = self.spec
        y = _custom_ops.call(
            "maxpool2d",
            x,
            list(p.kernel),
            list(p.stride),
            list(p.padding),
            list(p.dilation),
            p.ceil_mode,
            self._algo(x),
        )
        return y if batched else y.squeeze(0)


class AvgPool2d(_Swapped):
    """Stands in for ``nn.AvgPool2d``."""

    op = "avgpool2d"
    torch_type = nn.AvgPool2d

    def __init__(self, orig: nn.AvgPool2d, algorithm: str):
        super().__init__(orig, algorithm)
        self.spec, self._include_pad, self._divisor = L.avgpool_spec_of(orig)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, batched = _as_batched(self.op, x)
        p = self.spec
        y = _custom_ops.call(
            "avgpool2d",
            x,
            list(p.kernel),
            list(p.stride),
            list(p.padding),
            p.ceil_mode,
            self._include_pad,
            self._divisor,
            self._algo(x),
        )
        return y if batched else y.squeeze(0)


class AdaptiveAvgPool2d(_Swapped):
    """Stands in for ``nn.AdaptiveAvgPool2d``."""

    op = "adaptiveavgpool2d"
    torch_type = nn.AdaptiveAvgPool2d

    def __init__(self, orig: nn.AdaptiveAvgPool2d, algorithm: str):
        super().__init__(orig, algorithm)
        self._size = L.adaptive_size(orig.output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, batched = _as_batched(self.op, x)
        oh, ow = self._size
        size = [x.shape[2] if oh is None else oh, x.shape[3] if ow is None else ow]
        y = _custom_ops.call("adaptiveavgpool2d", x, size, self._algo(x))
        return y if batched else y.squeeze(0)


class Flatten(_Swapped):
    """Stands in for ``nn.Flatten``."""

    op = "flatten"
    torch_type = nn.Flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _custom_ops.call("flatten", x, self.start_dim, self.end_dim, self._algo(x))


_WRAPPERS: dict[str, type[_Swapped]] = {w.op: w for w in _Swapped.__subclasses__()}


def decide_module(module: nn.Module, input_shape: tuple[int, ...], marker: Auto | FromPlan) -> str:
    """The algorithm ``'auto'`` (or a one-layer plan) picks for ``module`` alone on
    inputs of ``input_shape``: the module converted on its own, decided as in
    :func:`ai3.convert`."""
    from .convert import convert  # convert imports this module

    orig = module.to_torch() if is_swapped(module) else module
    op = L.op_of_module(orig)
    dtype = next((p.dtype for p in orig.parameters() if p.is_floating_point()), torch.float32)
    if isinstance(marker, FromPlan):
        model = convert(orig, sample_input_shape=input_shape, dtype=dtype, plan=marker.plan)
    else:
        model = convert(orig, {op: marker}, sample_input_shape=input_shape, dtype=dtype)
    return model.summary(input_shape)[0]["algorithm"]


def _from_plan(
    plan: Plan, op: str, modules: list[nn.Module], names: dict[int, str], shapes: dict
) -> list[str]:
    """The plan's algorithm for each of ``modules`` (forward order), each checked
    against the plan's layer of the same rank among those of ``op``."""
    layers = [layer for layer in plan.layers if layer.op == op]
    if len(layers) != len(modules):
        raise PlanError(
            f"the plan does not fit the model: it lists {len(layers)} {op} layer(s), the "
            f"model has {len(modules)}"
        )
    chosen = []
    for i, (m, layer) in enumerate(zip(modules, layers, strict=True)):
        name = names.get(id(m), "")
        if layer.name != name:
            raise PlanError(
                f"the plan does not fit the model at {op} layer {i + 1}: name '{layer.name}' "
                f"in the plan, '{name}' in the model"
            )
        # The layer alone, checked against a one-layer plan under the name convert gives it.
        alone = type(m.to_torch() if is_swapped(m) else m).__name__.lower()
        one = Plan([replace(layer, name=alone)], plan.input_shapes, plan.dtype, plan.machine)
        try:
            chosen.append(decide_module(m, shapes[m], FromPlan(one, op)))
        except PlanError as e:
            raise PlanError(f"{op} layer {i + 1} ('{name}'): {e}") from e
    return chosen


def is_swapped(module: nn.Module) -> bool:
    """Whether ``module`` is one of ai3's swapped modules (``ai3.swap.Conv2d``, ...)."""
    return isinstance(module, _Swapped)


def _warn_if_inference_tensors(op: str, modules) -> None:
    """Warns once when swapped layers' parameters are inference tensors (made
    under ``torch.inference_mode()``): PyTorch gives them no version counter,
    so nothing says when they change, and such a layer re-packs its weights
    on every call."""
    n = sum(
        1
        for m in modules
        if is_swapped(m) and any(p.is_inference() for p in m.parameters(recurse=False))
    )
    if n:
        warnings.warn(
            f"ai3: {n} swapped {op} layer(s) have weights that are inference tensors "
            "(made under torch.inference_mode()), which have no version counter: "
            "they re-pack their weights on every call. Build or load the network "
            "outside torch.inference_mode() and run it inside.",
            UserWarning,
            stacklevel=_caller_level(),
        )


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning raised in this module at the
    first frame outside it (``swap_conv2d`` and the other shorthands add one)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


def swap_operation(
    op_type: type[nn.Module] | str,
    module: nn.Module,
    algos: AlgorithmicSelector | None = None,
    sample_input_shape: Sequence[int] | None = None,
    *,
    swap_with: Callable[[nn.Module, str], nn.Module] | None = None,
    plan: Plan | str | os.PathLike | None = None,
) -> nn.Module:
    """Replaces, in place, every module of ``op_type`` inside ``module`` with
    one running the selected ai3 algorithm; ``'torch'`` keeps a PyTorch module
    as it is.

    ``op_type`` is a module type (``nn.Conv2d``) or an operation name
    (``'conv2d'``). ``algos`` is a selector (a name, a list in forward order,
    or a function of the module, and of its input shape when
    ``sample_input_shape`` is given). ``swap_with(orig, algorithm)`` builds the
    replacement instead of ai3's own module.

    ``'auto'`` (or an :class:`ai3.Auto`) times the algorithms on each layer's
    input shape and keeps the fastest accurate one: now with
    ``sample_input_shape``, else at each layer's first call (give
    ``sample_input_shape`` when the network is then compiled). ``plan`` (an
    :class:`ai3.Plan` or the path of one) takes each layer's algorithm from
    the plan's layers of this operation, checked against them (on the plan's
    input shape unless ``sample_input_shape`` is given).

    Layers swapped earlier are found again and counted in forward order like
    plain ones: they are rebuilt with the new algorithm from the same
    ``Parameter`` objects, and ``'torch'`` turns them back into the plain
    PyTorch module (same Parameters, same hyperparameters). A function
    selector sees such a layer as it is; it has the PyTorch module's
    attributes (``in_channels``, ``kernel_size``, ...).

    Returns ``module``, changed in place. When ``module`` itself is of
    ``op_type`` it cannot be replaced in place and the replacement is
    returned instead, so use the return value. (The reference returns None.)

    Example::

        net = ai3.swap_operation(nn.Conv2d, net, ["direct", "smm"])
        net = ai3.swap_conv2d(net, "torch")  # back to nn.Conv2d
    """
    op = op_name(op_type)
    if not isinstance(module, nn.Module):
        raise TypeError(f"swap_operation: expected a torch.nn.Module, got {type(module).__name__}")
    targets: list[nn.Module] = []
    for m in module.modules():
        if L.op_of_module(m) == op or (is_swapped(m) and m.op == op):
            targets.append(m)  # modules() yields each module once
    ordered = forward_order(module, targets)
    if plan is not None:
        if algos is not None:
            raise SelectorError(f"swap_operation: give algos or a plan for {op}, not both")
        plan = as_plan(plan)
        warn_if_foreign(plan)
        if sample_input_shape is None:
            sample_input_shape = plan.input_shapes[0]
    shapes = (
        input_shapes_of_modules(module, sample_input_shape, ordered)
        if sample_input_shape is not None
        else None
    )
    selection = Selection(op, "default" if algos is None else algos, len(ordered),
                          shapes is not None, allow_torch=True)  # fmt: skip
    build = swap_with or _WRAPPERS[op]
    replacement: dict[int, nn.Module] = {}
    planned = (
        _from_plan(plan, op, ordered, {id(m): n for n, m in module.named_modules()}, shapes)
        if plan is not None and shapes is not None
        else None
    )
    for i, m in enumerate(ordered):
        if planned is not None:
            algo = planned[i]
        else:
            algo = selection.next(m, shapes.get(m) if shapes else None)
        if isinstance(algo, Auto) and shapes is not None:
            algo = decide_module(m, shapes[m], algo)
        if not is_swapped(m):
            if algo != "torch":
                replacement[id(m)] = build(m, algo)
        elif algo == "torch":
            replacement[id(m)] = m.to_torch()
        elif swap_with is not None or algo != m.algorithm:
            replacement[id(m)] = build(m.to_torch(), algo)
    _warn_if_inference_tensors(op, replacement.values())
    if id(module) in replacement:
        return replacement[id(module)]
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in replacement:
                setattr(parent, name, replacement[id(child)])
    return module


def _shorthand(op: str) -> Callable[..., nn.Module]:
    def swap(
        module: nn.Module,
        algos: AlgorithmicSelector | None = None,
        sample_input_shape: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> nn.Module:
        return swap_operation(op, module, algos, sample_input_shape, **kwargs)

    swap.__name__ = f"swap_{op}"
    swap.__doc__ = f"``swap_operation('{op}', module, algos, sample_input_shape)``."
    return swap


swap_conv2d = _shorthand("conv2d")
swap_linear = _shorthand("linear")
swap_relu = _shorthand("relu")
swap_maxpool2d = _shorthand("maxpool2d")
swap_avgpool2d = _shorthand("avgpool2d")
swap_adaptiveavgpool2d = _shorthand("adaptiveavgpool2d")
swap_flatten = _shorthand("flatten")
