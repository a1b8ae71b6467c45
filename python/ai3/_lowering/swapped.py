"""Modules that ``ai3.swap_operation`` put in place, lowered as the PyTorch
modules they stand for."""

from __future__ import annotations

from .. import swap
from .lowerer import Lowerer
from .registry import MODULES, register


def _swapped_module(lw: Lowerer, n, m, x) -> None:
    """Lowered through the handler of the plain module; the step keeps the
    swapped module, so convert can keep its algorithm."""
    plain = m.to_torch()
    MODULES[type(plain)](lw, n, plain, x)
    lw.steps[-1].module = m


register(modules=dict.fromkeys(swap._WRAPPERS.values(), _swapped_module))
