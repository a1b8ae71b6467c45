"""What ai3 can run: the algorithm registry as seen from Python, and which
backends this build uses. Everything here is read from the Rust registry."""

from __future__ import annotations

from . import _core

__all__ = [
    "SUPPORTED_ALGORITHMS",
    "DEFAULT_ALGOS",
    "OPERATIONS",
    "algorithm_table",
    "using_cudnn",
    "using_cublas",
    "using_sycl",
    "using_mps_and_metal",
]

_SELECTABLE: dict[str, list[str]] = dict(_core.selectable())

#: Operation names, as used in ``convert``'s selector mapping.
OPERATIONS: tuple[str, ...] = tuple(_SELECTABLE)

#: For each operation, the algorithm names a selector may give it: the algorithms the
#: registry knows (some may be unavailable in this build, see :func:`algorithm_table`),
#: ``'custom'`` where the user's C++ can implement the operation, ``'default'``
#: (ai3's rule per layer) and ``'auto'`` (measured per layer, see :class:`ai3.Auto`).
#: Swapping also accepts ``'torch'`` (keep PyTorch's module).
SUPPORTED_ALGORITHMS: dict[str, list[str]] = {
    op: [*names, "auto"] for op, names in _SELECTABLE.items()
}

#: The selector used for an operation that ``convert`` or ``swap_operation`` is not told about.
DEFAULT_ALGOS: dict[str, str] = {op: "default" for op in _SELECTABLE}


def algorithm_table() -> list[dict]:
    """Every (operation, algorithm, device) ai3 knows, with a summary and, when it
    cannot run in this build, the reason (``unavailable``)."""
    return [dict(row) for row in _core.algorithms()]


def using_cudnn() -> bool:
    """Whether cuDNN's algorithms are available (not yet: the CUDA backend is not built)."""
    return False


def using_cublas() -> bool:
    """Whether cuBLAS is used for linear layers (not yet)."""
    return False


def using_sycl() -> bool:
    """Whether SYCL implementations are available (no SYCL backend is built)."""
    return False


def using_mps_and_metal() -> bool:
    """Whether Metal Performance Shaders and Metal implementations are available (no)."""
    return False
