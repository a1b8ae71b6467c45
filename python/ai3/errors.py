"""The exceptions ai3 raises. All derive from :class:`ai3.Error`, and each
also from the builtin a PyTorch user would expect (``ValueError`` for bad
shapes or arguments, ``TypeError`` for bad dtypes, ``MemoryError`` for memory
the system refuses)."""

from __future__ import annotations

__all__ = [
    "Error",
    "ShapeError",
    "DtypeError",
    "InvalidArgumentError",
    "AlgorithmError",
    "SelectorError",
    "PlanError",
    "DeviceError",
    "CustomError",
    "InternalError",
    "OutOfMemoryError",
    "UnsupportedOperationError",
]


class Error(Exception):
    """Base class of every exception raised by ai3."""


class ShapeError(Error, ValueError):
    """An input or weight has a shape the operation cannot take."""


class DtypeError(Error, TypeError):
    """A tensor has a dtype ai3 does not compute in, or dtypes disagree."""


class InvalidArgumentError(Error, ValueError):
    """A hyperparameter is out of range (stride 0, groups not dividing channels, ...)."""


class AlgorithmError(Error, ValueError):
    """An algorithm is unknown, not compiled in, or cannot handle the configuration."""


class SelectorError(Error, ValueError):
    """An algorithmic selector does not fit the modules it selects for."""


class PlanError(Error, ValueError):
    """A saved plan cannot be read, or does not fit the model it is applied to."""


class DeviceError(Error, RuntimeError):
    """A tensor lives on a device ai3 cannot use here."""


class CustomError(Error, RuntimeError):
    """The user's C++ implementation (algorithm ``'custom'``) threw an exception;
    the message is the exception's ``what()``."""


class InternalError(Error, RuntimeError):
    """A bug in ai3 (reported instead of crashing). Please file it."""


class OutOfMemoryError(Error, MemoryError):
    """The system refused memory ai3 asked for: an output, the arena of
    intermediate values, a padded copy of the input, prepared weights or a
    kernel's scratch. The message names the operation, the shapes and the bytes
    asked for, e.g. ``conv2d: cannot allocate 64.0 TB (64000384000576 bytes)
    for the output of shape [1, 4, 2000006, 2000006]; input shape [1, 3, 8, 8]``.

    The process keeps running. As for any program (PyTorch included), Linux
    refuses at once a request larger than the memory and swap there are; a
    smaller one may be granted and fail only when the pages are touched."""


class UnsupportedOperationError(Error, NotImplementedError):
    """``convert`` met operations it cannot run; ``nodes`` lists every one of them."""

    def __init__(self, nodes: list[tuple[str, str]], detail: str = ""):
        self.nodes = list(nodes)
        lines = [f"  {name}: {target}" for name, target in self.nodes]
        msg = f"ai3 cannot convert {len(self.nodes)} operation(s):\n" + "\n".join(lines)
        if detail:
            msg += f"\n{detail}"
        super().__init__(msg)
