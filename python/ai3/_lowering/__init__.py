"""Lowering a ``torch.fx`` graph to ai3 operations.

:class:`Lowerer` walks the graph once: each fx node becomes a :class:`Step`
(one ai3 node), an :class:`Alias` of another value, a symbolic size, or the
:class:`Pieces` of a ``chunk``/``split``; nodes ai3 cannot run are collected,
so one error can list all of them. Each node is lowered by the handler its
target has in one of three tables, ``MODULES`` (by module class),
``FUNCTIONS`` (by function) and ``METHODS`` (by tensor method name).

The package:

- ``lowerer.py``: the records, the walk and its dispatch, the in-place and
  alias tracking, and the helpers handlers call (``lw.step``, ``lw.unary``,
  ``lw.alias``, ``lw.view``, ``lw.weight_args``, ...);
- ``registry.py``: the three tables and :func:`register`;
- ``calls.py``: :class:`Sig`, which binds a node's arguments to the
  parameters of the call, so that an argument ai3 does not implement makes
  the node unsupported instead of being ignored; ``as_int`` and friends;
- the handlers, by family: ``attention.py`` (scaled dot-product attention),
  ``conv_linear.py``, ``einsum.py`` (as permutes, reshapes and
  matmuls), ``norms.py``, ``pooling.py`` (and ``mean``, ``sum``), ``activations.py`` (and softmax), ``elementwise.py``
  (arithmetic, ``cat``), ``embedding.py``, ``shapes.py`` (flatten, permute, reshape/view,
  chunk/split, getitem, sizes), ``identity.py`` (Dropout, Identity,
  ``contiguous``), ``swapped.py`` (modules ``ai3.swap_operation`` put in).

To lower a new operation, add a handler to the module of its family (or a
new module, imported below), read its arguments with a :class:`Sig`, and
register it in that module's ``register(modules=..., functions=...,
methods=...)`` call: a module handler is ``handler(lw, node, module, x)``,
a function or method handler ``handler(lw, node)``. A handler raises
:class:`Unsupported` for a call it cannot honour.
"""

from __future__ import annotations

# The handler modules fill the tables as they are imported.
from . import (  # noqa: F401
    activations,
    attention,
    conv_linear,
    einsum,
    elementwise,
    embedding,
    identity,
    norms,
    pooling,
    shapes,
    swapped,
)
from .calls import Sig, Unsupported
from .lowerer import Alias, In, Lowerer, Pieces, Step
from .registry import FUNCTIONS, METHODS, MODULES, register

__all__ = [
    "FUNCTIONS",
    "METHODS",
    "MODULES",
    "Alias",
    "In",
    "Lowerer",
    "Pieces",
    "Sig",
    "Step",
    "Unsupported",
    "register",
]
