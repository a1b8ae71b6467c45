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
in place under ``torch.no_grad()`` instead.

A swapped module carries the hyperparameters of the module it replaced
(``stride``, ``padding`` as given, ...) and reads like it in its repr, plus
its algorithm. Swapping again finds already-swapped layers: it rebuilds them
with the new algorithm, and ``'torch'`` turns them back into plain PyTorch
modules, always with the same ``Parameter`` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import _core, _custom_ops
from . import _layers as L
from ._shapes import forward_order, input_shapes_of_modules
from .errors import DtypeError, ShapeError
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

    def __init__(self, orig: nn.Module, algorithm: str):
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
        return f"{base}, algorithm={self.algorithm!r}" if base else f"algorithm={self.algorithm!r}"


class Conv2d(_Swapped):
    """Stands in for ``nn.Conv2d``, sharing its weight and bias."""

    op = "conv2d"
    torch_type = nn.Conv2d

    def __init__(self, orig: nn.Conv2d, algorithm: str):
        super().__init__(orig, algorithm)
        self.spec = L.conv_spec_of(orig)
        # Fails now, not at the first forward, for an algorithm that cannot run this layer.
        dtype = {torch.float32: "float32", torch.float64: "float64"}.get(orig.weight.dtype)
        if dtype is not None:
            s = self.spec
            _core.Model(dtype, 1, copy_weights=False).conv2d(
                "probe", 0, orig.weight.detach(), None, s.stride, s.padding, s.dilation,
                s.groups, "zeros", algorithm,
            )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, batched = _as_batched(self.op, x)
        if x.dtype != self.weight.dtype:
            raise DtypeError(
                f"conv2d: input of shape {list(x.shape)} is {x.dtype} but the weight of shape "
                f"{list(self.weight.shape)} is {self.weight.dtype}"
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
            "conv2d",
            x,
            self.weight,
            self.bias,
            list(s.stride),
            [top, left],
            list(s.dilation),
            s.groups,
            self.algorithm,
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
        return _custom_ops.call("linear", x, self.weight, self.bias, self.algorithm)


class ReLU(_Swapped):
    """Stands in for ``nn.ReLU``; with ``inplace=True`` it writes the result into
    its input and returns it, as PyTorch's does (later readers see the change)."""

    op = "relu"
    torch_type = nn.ReLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _custom_ops.call("relu", x, self.algorithm)
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
            self.algorithm,
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
            self.algorithm,
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
        y = _custom_ops.call("adaptiveavgpool2d", x, size, self.algorithm)
        return y if batched else y.squeeze(0)


class Flatten(_Swapped):
    """Stands in for ``nn.Flatten``."""

    op = "flatten"
    torch_type = nn.Flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _custom_ops.call("flatten", x, self.start_dim, self.end_dim, self.algorithm)


_WRAPPERS: dict[str, type[_Swapped]] = {w.op: w for w in _Swapped.__subclasses__()}


def is_swapped(module: nn.Module) -> bool:
    """Whether ``module`` is one of ai3's swapped modules (``ai3.swap.Conv2d``, ...)."""
    return isinstance(module, _Swapped)


def swap_operation(
    op_type: type[nn.Module] | str,
    module: nn.Module,
    algos: AlgorithmicSelector | None = None,
    sample_input_shape: Sequence[int] | None = None,
    *,
    swap_with: Callable[[nn.Module, str], nn.Module] | None = None,
) -> nn.Module:
    """Replaces, in place, every module of ``op_type`` inside ``module`` with
    one running the selected ai3 algorithm; ``'torch'`` keeps a PyTorch module
    as it is.

    ``op_type`` is a module type (``nn.Conv2d``) or an operation name
    (``'conv2d'``). ``algos`` is a selector (a name, a list in forward order,
    or a function of the module, and of its input shape when
    ``sample_input_shape`` is given). ``swap_with(orig, algorithm)`` builds the
    replacement instead of ai3's own module.

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
    shapes = (
        input_shapes_of_modules(module, sample_input_shape, ordered)
        if sample_input_shape is not None
        else None
    )
    selection = Selection(op, "default" if algos is None else algos, len(ordered),
                          shapes is not None, allow_torch=True)  # fmt: skip
    build = swap_with or _WRAPPERS[op]
    replacement: dict[int, nn.Module] = {}
    for m in ordered:
        algo = selection.next(m, shapes.get(m) if shapes else None)
        if not is_swapped(m):
            if algo != "torch":
                replacement[id(m)] = build(m, algo)
        elif algo == "torch":
            replacement[id(m)] = m.to_torch()
        elif swap_with is not None or algo != m.algorithm:
            replacement[id(m)] = build(m.to_torch(), algo)
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
