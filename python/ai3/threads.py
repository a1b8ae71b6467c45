"""How many threads ai3's kernels use.

By default ai3 follows ``torch.get_num_threads()`` (checked on every call, so
``torch.set_num_threads`` applies to ai3 too). ``AI3_NUM_THREADS`` in the
environment, or :func:`set_num_threads`, fixes the count instead.

PyTorch's OpenMP threads keep spinning for milliseconds after each of
PyTorch's parallel regions. So that ai3 work run right after PyTorch work
(swapped layers, a converted model called between PyTorch calls) does not
share the cores with them, ai3 parks them (asleep on a condition variable)
while it runs, through the ``GOMP_parallel`` entry point of the OpenMP
runtime that ``libtorch_cpu`` links (found by the extension itself). Only
runs started from the thread that imported ai3 park: OpenMP gives each
calling thread a team of its own, and parking from every thread would start
one more spinning team per thread. A forked child never parks and rebuilds
ai3's pool on its first run. ``AI3_PARK_OPENMP=0`` turns parking off.
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


def cpu_isa() -> str:
    """The instruction-set level ai3's CPU kernels use: ``"avx512"``, ``"avx2"``
    (with FMA) or ``"portable"``. It is the best this CPU has, or lower when the
    ``AI3_CPU_ISA`` environment variable names a lower level; it is chosen once,
    when the first kernel runs, and fixed for the life of the process."""
    return _core.cpu_isa()


def sync() -> None:
    """Applies the configured count (or torch's) before a computation."""
    want = _pinned or torch.get_num_threads()
    if want != _core.get_num_threads():
        _core.set_num_threads(want)


def _parking_wanted() -> bool:
    """Whether to park PyTorch's OpenMP threads: its CPU backend is OpenMP and
    ``AI3_PARK_OPENMP`` is not ``0``."""
    if os.environ.get("AI3_PARK_OPENMP", "1").strip() == "0":
        return False
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


_pinned = _from_env()
_core._park_openmp(_parking_wanted())
