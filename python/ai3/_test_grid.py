"""The hyperparameter grids of :mod:`ai3.testing`: one list of cases per
operation that can be selected per algorithm (the suite's runner, results and
command line live in :mod:`ai3.testing`)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import _core
from .errors import InvalidArgumentError

__all__ = ["Case", "GRIDS", "cases", "operations"]


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class Case:
    """One configuration of one operation: ``module_type(*args, **kwargs)`` applied to a
    random input of ``input_shape``.

    ``special`` puts NaN and infinities into the input; ``quick`` marks the cases of the
    ``--quick`` subset. Every case runs through both :func:`ai3.convert` and
    :func:`ai3.swap_operation`.
    """

    op: str
    module_type: type[nn.Module]
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    input_shape: tuple[int, ...]
    quick: bool = False
    special: bool = False

    @property
    def description(self) -> str:
        """E.g. ``Conv2d(3, 8, kernel_size=3, padding=1) x[2, 3, 9, 9]``."""
        params = [_fmt(a) for a in self.args] + [f"{k}={_fmt(v)}" for k, v in self.kwargs]
        desc = f"{self.module_type.__name__}({', '.join(params)}) x{list(self.input_shape)}"
        return desc + (" with nan/inf" if self.special else "")

    @property
    def seed(self) -> int:
        """The random seed of this case: the same weights and input for every algorithm."""
        return zlib.crc32(f"{self.op}:{self.description}".encode())

    def build(self, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor]:
        """The PyTorch module (random weights, in eval mode) and the input, both in ``dtype``."""
        torch.manual_seed(self.seed)
        module = self.module_type(*self.args, **dict(self.kwargs)).to(dtype).eval()
        x = torch.randn(self.input_shape, dtype=dtype)
        if self.special:
            flat = x.view(-1)
            n = flat.numel()
            flat[0] = float("nan")
            flat[n // 2] = float("inf")
            flat[(2 * n) // 3] = float("-inf")
            flat[n - 1] = float("nan")
        return module, x


def _case(
    op: str,
    module_type: type[nn.Module],
    *args: Any,
    x: Sequence[int],
    quick: bool = False,
    special: bool = False,
    **kwargs: Any,
) -> Case:
    return Case(op, module_type, args, tuple(kwargs.items()), tuple(x), quick, special)


def _conv2d() -> list[Case]:
    c = nn.Conv2d
    op = "conv2d"
    return [
        # channels, kernel sizes, odd and even planes, bias
        _case(op, c, 1, 1, 3, x=(1, 1, 7, 7), quick=True),
        _case(op, c, 3, 8, 3, padding=1, x=(2, 3, 9, 9), quick=True),
        _case(op, c, 3, 8, 3, bias=False, x=(2, 3, 8, 8)),
        _case(op, c, 4, 6, 1, x=(2, 4, 6, 6)),
        _case(op, c, 3, 4, 5, padding=2, x=(1, 3, 11, 10), quick=True),
        _case(op, c, 4, 6, (1, 3), padding=(0, 1), x=(2, 4, 7, 8)),
        _case(op, c, 4, 6, (3, 1), x=(1, 4, 8, 7)),
        _case(op, c, 2, 3, (2, 4), x=(1, 2, 9, 9)),
        _case(op, c, 16, 16, 3, padding=1, x=(1, 16, 13, 11)),
        _case(op, c, 32, 24, 3, padding=1, x=(1, 32, 12, 12)),
        _case(op, c, 3, 5, 3, x=(1, 3, 3, 3)),  # the kernel covers the input: 1x1 output
        _case(op, c, 1, 3, 7, padding=3, x=(1, 1, 10, 12)),
        # stride
        _case(op, c, 3, 8, 3, stride=2, padding=1, x=(2, 3, 9, 9), quick=True),
        _case(op, c, 3, 4, 3, stride=2, x=(1, 3, 10, 10)),
        _case(op, c, 4, 6, 3, stride=(2, 1), x=(2, 4, 9, 8)),
        _case(op, c, 4, 4, 1, stride=2, x=(1, 4, 7, 7)),
        _case(op, c, 3, 4, 5, stride=2, padding=2, x=(1, 3, 12, 11)),
        # padding
        _case(op, c, 3, 4, 3, padding=(1, 2), x=(2, 3, 7, 9)),
        _case(op, c, 3, 4, 3, padding="same", x=(1, 3, 8, 9)),
        _case(op, c, 3, 4, 4, padding="same", x=(1, 3, 7, 8)),  # asymmetric 'same'
        _case(op, c, 3, 4, 3, padding="same", dilation=2, x=(1, 3, 9, 9)),
        _case(op, c, 3, 4, 3, padding="valid", x=(1, 3, 6, 7)),
        _case(op, c, 3, 4, 3, padding=1, padding_mode="reflect", x=(1, 3, 7, 7)),
        _case(op, c, 3, 4, 3, padding=(2, 1), padding_mode="circular", x=(1, 3, 6, 7)),
        _case(op, c, 3, 4, 3, padding=1, padding_mode="replicate", x=(1, 3, 5, 6)),
        # dilation
        _case(op, c, 3, 4, 3, dilation=2, x=(2, 3, 9, 9)),
        _case(op, c, 3, 4, 3, padding=1, dilation=(2, 1), x=(1, 3, 9, 8)),
        # groups
        _case(op, c, 4, 6, 3, padding=1, groups=2, x=(2, 4, 7, 7), quick=True),
        _case(op, c, 4, 4, 3, padding=1, groups=4, x=(2, 4, 8, 8)),  # depthwise
        _case(op, c, 3, 6, 3, groups=3, bias=False, x=(1, 3, 7, 9)),  # depthwise, multiplier 2
        _case(op, c, 16, 16, 3, padding=1, groups=16, x=(1, 16, 10, 10)),
        _case(
            op, c, 4, 6, 3, stride=2, padding=1, dilation=2, groups=2, bias=False, x=(2, 4, 11, 10)
        ),  # fmt: skip
        # unbatched (3-D) input
        _case(op, c, 3, 8, 3, padding=1, x=(3, 9, 9), quick=True),
        _case(op, c, 4, 4, 3, stride=2, groups=4, x=(4, 8, 7)),
    ]


def _linear() -> list[Case]:
    c = nn.Linear
    op = "linear"
    return [
        _case(op, c, 8, 5, x=(8,), quick=True),  # 1-D input
        _case(op, c, 8, 5, bias=False, x=(8,)),
        _case(op, c, 8, 5, x=(1, 8)),
        _case(op, c, 7, 3, x=(4, 7), quick=True),
        _case(op, c, 7, 3, bias=False, x=(4, 7)),
        _case(op, c, 6, 4, x=(2, 3, 6), quick=True),  # 3-D input
        _case(op, c, 6, 4, bias=False, x=(2, 2, 3, 6)),
        _case(op, c, 1, 1, x=(3, 1)),
        _case(op, c, 1, 9, x=(2, 1)),
        _case(op, c, 70, 45, x=(33, 70)),
        _case(op, c, 130, 17, x=(5, 130)),
    ]


def _relu() -> list[Case]:
    c = nn.ReLU
    op = "relu"
    return [
        _case(op, c, x=(2, 3, 7, 9), quick=True),
        _case(op, c, x=(3, 8, 8)),
        _case(op, c, x=(17,)),
        _case(op, c, x=(4, 33)),
        _case(op, c, x=(2, 3, 4, 5, 2)),
        _case(op, c, x=(2, 3, 6, 6), special=True),
    ]


def _maxpool2d() -> list[Case]:
    c = nn.MaxPool2d
    op = "maxpool2d"
    return [
        _case(op, c, 2, x=(2, 3, 8, 8), quick=True),
        _case(op, c, 2, x=(1, 2, 7, 9)),
        _case(op, c, 3, stride=1, padding=1, x=(2, 3, 7, 7)),
        _case(op, c, 3, stride=2, x=(1, 2, 9, 10)),
        _case(op, c, (2, 3), stride=(1, 2), padding=(1, 1), x=(1, 2, 8, 9)),
        _case(op, c, 3, stride=2, ceil_mode=True, x=(1, 3, 8, 8), quick=True),
        _case(op, c, 2, stride=2, padding=1, ceil_mode=True, x=(1, 2, 5, 5)),
        _case(op, c, 3, stride=2, padding=1, dilation=2, x=(2, 2, 9, 9)),
        _case(op, c, (3, 2), stride=(2, 1), dilation=(1, 2), ceil_mode=True, x=(1, 2, 10, 8)),
        _case(op, c, 2, x=(3, 8, 6), quick=True),  # unbatched
        _case(op, c, 3, stride=1, padding=1, x=(1, 2, 6, 6), special=True),
    ]


def _avgpool2d() -> list[Case]:
    c = nn.AvgPool2d
    op = "avgpool2d"
    return [
        _case(op, c, 2, x=(2, 3, 8, 8), quick=True),
        _case(op, c, 2, x=(1, 2, 7, 9)),
        _case(op, c, 3, stride=1, padding=1, x=(2, 3, 7, 7)),
        _case(op, c, 3, stride=1, padding=1, count_include_pad=False, x=(2, 3, 7, 7), quick=True),
        _case(op, c, (3, 2), stride=(2, 1), padding=(1, 0), x=(1, 2, 9, 8)),
        _case(op, c, 3, stride=2, ceil_mode=True, x=(1, 3, 8, 8)),
        _case(op, c, 3, stride=2, padding=1, ceil_mode=True, x=(1, 2, 6, 6)),
        _case(
            op, c, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False, x=(1, 2, 6, 7)
        ),  # fmt: skip
        _case(op, c, 2, stride=2, padding=1, ceil_mode=True, x=(1, 2, 5, 5)),
        _case(op, c, 3, stride=1, padding=1, divisor_override=3, x=(1, 2, 6, 6), quick=True),
        _case(op, c, 2, divisor_override=5, ceil_mode=True, x=(1, 2, 5, 7)),
        _case(op, c, 3, x=(3, 9, 6)),  # unbatched
        _case(op, c, 2, x=(1, 2, 6, 6), special=True),
    ]


def _adaptiveavgpool2d() -> list[Case]:
    c = nn.AdaptiveAvgPool2d
    op = "adaptiveavgpool2d"
    return [
        _case(op, c, 1, x=(2, 3, 7, 7), quick=True),  # global
        _case(op, c, (2, 2), x=(1, 3, 8, 8)),  # smaller, dividing
        _case(op, c, (8, 6), x=(1, 2, 8, 6)),  # equal
        _case(op, c, 3, x=(2, 3, 7, 7), quick=True),  # not dividing: overlapping windows
        _case(op, c, (5, 3), x=(1, 2, 6, 8)),
        _case(op, c, (6, 5), x=(1, 2, 4, 4)),  # larger than the input
        _case(op, c, (None, 2), x=(1, 2, 5, 7)),
        _case(op, c, (3, None), x=(1, 2, 5, 7)),
        _case(op, c, 4, x=(3, 9, 10), quick=True),  # unbatched
        _case(op, c, 3, x=(1, 2, 6, 6), special=True),
    ]


def _flatten() -> list[Case]:
    c = nn.Flatten
    op = "flatten"
    return [
        _case(op, c, x=(2, 3, 4, 5), quick=True),
        _case(op, c, 0, -1, x=(2, 3, 4, 5)),
        _case(op, c, 2, 3, x=(2, 3, 4, 5), quick=True),
        _case(op, c, 1, 2, x=(2, 3, 4, 5)),
        _case(op, c, 1, 1, x=(2, 3, 4)),
        _case(op, c, -3, -2, x=(3, 4, 5)),
        _case(op, c, x=(4, 6)),
        _case(op, c, x=(2, 3, 4, 5), special=True),
    ]


#: The cases of every operation that can be selected per algorithm.
GRIDS: dict[str, tuple[Case, ...]] = {
    "conv2d": tuple(_conv2d()),
    "linear": tuple(_linear()),
    "relu": tuple(_relu()),
    "maxpool2d": tuple(_maxpool2d()),
    "avgpool2d": tuple(_avgpool2d()),
    "adaptiveavgpool2d": tuple(_adaptiveavgpool2d()),
    "flatten": tuple(_flatten()),
}


def operations() -> list[str]:
    """The operations the suite has cases for, in the registry's order."""
    return [op for op, _ in _core.selectable() if op in GRIDS]


def cases(op: str, quick: bool = False) -> list[Case]:
    """The cases of ``op`` (all of them, or the ``--quick`` subset)."""
    if op not in GRIDS:
        raise InvalidArgumentError(
            f"no test cases for operation {op!r}; the suite covers {', '.join(operations())}"
        )
    return [c for c in GRIDS[op] if c.quick or not quick]
