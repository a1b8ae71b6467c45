"""One description per operation: which PyTorch modules and functions it
covers, and how their hyperparameters become ai3's. Used by both ``convert``
and ``swap_operation`` so the two never disagree on semantics."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .errors import InvalidArgumentError

#: PyTorch module types handled by each operation.
MODULE_TYPES: dict[str, tuple[type[nn.Module], ...]] = {
    "conv2d": (nn.Conv2d,),
    "linear": (nn.Linear,),
    "relu": (nn.ReLU,),
    "maxpool2d": (nn.MaxPool2d,),
    "avgpool2d": (nn.AvgPool2d,),
    "adaptiveavgpool2d": (nn.AdaptiveAvgPool2d,),
    "flatten": (nn.Flatten,),
}

#: Modules that are the identity in inference and are dropped by ``convert``.
IDENTITY_MODULES: tuple[type[nn.Module], ...] = (nn.Dropout, nn.Identity)


def op_of_module(module: nn.Module) -> str | None:
    """The ai3 operation that implements ``module``, if any (exact type match)."""
    for op, types in MODULE_TYPES.items():
        if type(module) in types:
            return op
    return None


def pair(v: int | Sequence[int], what: str = "value") -> tuple[int, int]:
    """``3`` -> ``(3, 3)``; ``(2, 3)`` -> ``(2, 3)``. Anything else (a float, a
    triple, a negative value) is an :class:`~ai3.InvalidArgumentError`, never
    rounded, cut or wrapped around."""
    items = list(v) if isinstance(v, Sequence) and not isinstance(v, str) else [v]
    try:
        t = tuple(operator.index(x) for x in items if not isinstance(x, bool | str))
    except TypeError:
        t = ()
    if len(t) != len(items) or len(t) not in (1, 2):
        raise InvalidArgumentError(f"{what} must be an int or a pair of ints, got {v!r}")
    if min(t) < 0:
        raise InvalidArgumentError(f"{what} must be non-negative, got {v!r}")
    return (t[0], t[-1])


@dataclass(frozen=True)
class ConvSpec:
    """A conv2d layer's hyperparameters in ai3's form (padding per side)."""

    stride: tuple[int, int]
    padding: tuple[int, int, int, int]  # top, bottom, left, right
    dilation: tuple[int, int]
    groups: int
    padding_mode: str


def conv_spec(
    weight: torch.Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    padding_mode: str = "zeros",
) -> ConvSpec:
    """Normalizes PyTorch's conv2d arguments, resolving ``'same'`` and ``'valid'``.

    ``weight`` is only read for ``'same'`` padding (its kernel size); it may be
    None otherwise (a weight known only at run time)."""
    stride, dilation = pair(stride, "conv2d: stride"), pair(dilation, "conv2d: dilation")
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0, 0, 0, 0)
        elif padding == "same" and stride != (1, 1):
            # As PyTorch's F.conv2d: 'same' has no meaning once outputs are strided.
            raise InvalidArgumentError(
                f"conv2d: padding='same' is not supported for strided convolutions (stride {stride})"
            )
        elif padding == "same" and weight is not None:
            kh, kw = weight.shape[2], weight.shape[3]
            # PyTorch puts the odd extra row/column of 'same' at the bottom/right.
            th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
            pad = (th // 2, th - th // 2, tw // 2, tw - tw // 2)
        elif padding == "same":
            raise InvalidArgumentError(
                "conv2d: padding='same' needs the weight's kernel size when the model is built"
            )
        else:
            raise InvalidArgumentError(
                f"conv2d: padding must be 'same', 'valid', an int or a pair, got {padding!r}"
            )
    else:
        ph, pw = pair(padding, "conv2d: padding")
        pad = (ph, ph, pw, pw)
    return ConvSpec(stride, pad, dilation, int(groups), padding_mode)


def conv_spec_of(m: nn.Conv2d) -> ConvSpec:
    """The :class:`ConvSpec` of a module."""
    return conv_spec(m.weight, m.stride, m.padding, m.dilation, m.groups, m.padding_mode)


@dataclass(frozen=True)
class PoolSpec:
    """A pooling window in ai3's form."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool


def pool_spec(kernel, stride, padding, dilation, ceil_mode, op: str = "pooling") -> PoolSpec:
    """Normalizes PyTorch's pooling arguments (``stride=None`` means the kernel
    size); ``op`` names the operation in errors."""
    k = pair(kernel, f"{op}: kernel_size")
    empty = stride is None or (isinstance(stride, Sequence) and len(stride) == 0)
    s = k if empty else pair(stride, f"{op}: stride")
    pad, dil = pair(padding, f"{op}: padding"), pair(dilation, f"{op}: dilation")
    return PoolSpec(k, s, pad, dil, bool(ceil_mode))


def maxpool_spec_of(m: nn.MaxPool2d) -> PoolSpec:
    """The window of an ``nn.MaxPool2d``."""
    if m.return_indices:
        raise InvalidArgumentError("maxpool2d: return_indices=True is not supported by ai3")
    return pool_spec(m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, "maxpool2d")


def avgpool_spec_of(m: nn.AvgPool2d) -> tuple[PoolSpec, bool, int | None]:
    """The window, ``count_include_pad`` and ``divisor_override`` of an ``nn.AvgPool2d``."""
    spec = pool_spec(m.kernel_size, m.stride, m.padding, 1, m.ceil_mode, "avgpool2d")
    return spec, bool(m.count_include_pad), divisor_override(m.divisor_override)


def divisor_override(v: int | None) -> int | None:
    """An average pool's ``divisor_override``: ``None`` or a positive int.
    PyTorch also divides by a negative one; ai3 refuses it."""
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise InvalidArgumentError(f"avgpool2d: divisor_override must be a positive int, got {v!r}")
    return v


def adaptive_size(output_size) -> tuple[int | None, int | None]:
    """``7`` -> ``(7, 7)``; ``(None, 3)`` stays, ``None`` meaning "keep that input size"."""
    if output_size is None or isinstance(output_size, int):
        return (output_size, output_size)
    t = tuple(output_size)
    if len(t) != 2:
        raise InvalidArgumentError(
            f"adaptiveavgpool2d: output_size must be an int or a pair, got {output_size!r}"
        )
    return t  # type: ignore[return-value]


#: PyTorch functions (and tensor methods by name) that map to an ai3 operation.
FUNCTIONS: dict[Any, str] = {
    torch.relu: "relu",
    F.relu: "relu",
    torch.flatten: "flatten",
    F.max_pool2d: "maxpool2d",
    F.avg_pool2d: "avgpool2d",
    F.adaptive_avg_pool2d: "adaptiveavgpool2d",
    F.linear: "linear",
}

#: Functions that are the identity in inference.
IDENTITY_FUNCTIONS: tuple[Any, ...] = (F.dropout,)

#: Tensor methods fx records as ``call_method``.
METHODS: dict[str, str] = {"relu": "relu", "flatten": "flatten"}
