"""Lowering a ``torch.fx`` graph to ai3 operations (see :mod:`.lowerer`)."""

from .lowerer import ALGO, ALL_INPUTS, FUNCTIONS, METHODS, MODULES, Alias, In, Lowerer, Step

__all__ = [
    "ALGO",
    "ALL_INPUTS",
    "FUNCTIONS",
    "METHODS",
    "MODULES",
    "Alias",
    "In",
    "Lowerer",
    "Step",
]
