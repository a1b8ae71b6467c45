"""How many threads ai3's kernels use.

By default ai3 follows ``torch.get_num_threads()`` (checked on every call, so
``torch.set_num_threads`` applies to ai3 too). ``AI3_NUM_THREADS`` in the
environment, or :func:`set_num_threads`, fixes the count instead.
"""

from __future__ import annotations

import os

import torch

from . import _core
from .errors import InvalidArgumentError

__all__ = ["get_num_threads", "set_num_threads"]

_pinned: int | None = None


def _from_env() -> int | None:
    value = os.environ.get("AI3_NUM_THREADS")
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        raise InvalidArgumentError(
            f"AI3_NUM_THREADS must be a positive integer, got {value!r}"
        ) from None
    if n < 1:
        raise InvalidArgumentError(f"AI3_NUM_THREADS must be a positive integer, got {value!r}")
    return n


def set_num_threads(n: int | None) -> None:
    """Uses ``n`` threads for ai3's kernels; ``None`` goes back to following torch."""
    global _pinned
    if n is not None and (not isinstance(n, int) or n < 1):
        raise InvalidArgumentError(f"set_num_threads: expected a positive int, got {n!r}")
    _pinned = n
    sync()


def get_num_threads() -> int:
    """The number of threads ai3's kernels use."""
    sync()
    return _core.get_num_threads()


def sync() -> None:
    """Applies the configured count (or torch's) before a computation."""
    want = _pinned or torch.get_num_threads()
    if want != _core.get_num_threads():
        _core.set_num_threads(want)


_pinned = _from_env()
