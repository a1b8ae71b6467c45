"""How many threads ai3's kernels use.

By default ai3 follows ``torch.get_num_threads()`` (checked on every call, so
``torch.set_num_threads`` applies to ai3 too). ``AI3_NUM_THREADS`` in the
environment, or :func:`set_num_threads`, fixes the count instead.

PyTorch's OpenMP threads keep spinning for milliseconds after each of
PyTorch's parallel regions. So that ai3 work run right after PyTorch work
(swapped layers, a converted model called between PyTorch calls) does not
share the cores with them, ai3 parks them (asleep on a condition variable)
while it runs, through the ``GOMP_parallel`` entry point of the runtime
PyTorch loaded. ``AI3_PARK_OPENMP=0`` turns this off.
"""

from __future__ import annotations

import ctypes
import os
import re

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


#: File names of OpenMP runtimes that export ``GOMP_parallel``: GNU's, LLVM's, Intel's.
_OPENMP_RUNTIME = re.compile(r"^lib(gomp|omp|iomp5)([-.].*)?\.so(\..*)?$")


def _loaded_libraries() -> list[str]:
    """Paths of the shared libraries mapped into this process (Linux; else empty)."""
    try:
        with open("/proc/self/maps") as maps:
            fields = [line.split(None, 5) for line in maps]
    except OSError:
        return []
    return sorted({f[5].strip() for f in fields if len(f) == 6 and f[5].startswith("/")})


def _torch_openmp_parallel() -> int | None:
    """Address of ``GOMP_parallel`` in the OpenMP runtime that runs PyTorch's
    CPU kernels, or None: another parallel backend, no such runtime loaded, or
    ``AI3_PARK_OPENMP=0``."""
    if os.environ.get("AI3_PARK_OPENMP", "1").strip() == "0":
        return None
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    runtimes = [p for p in _loaded_libraries() if _OPENMP_RUNTIME.match(os.path.basename(p))]
    torch_dir = os.path.dirname(torch.__file__)
    # PyTorch's own copy first: other packages may have loaded other runtimes.
    runtimes.sort(key=lambda p: not p.startswith(torch_dir))
    for path in runtimes:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            return ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


_pinned = _from_env()
_core._set_openmp_parallel(_torch_openmp_parallel())
