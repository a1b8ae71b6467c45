"""The handler tables the walk dispatches on, and :func:`register`, the one way
to fill them.

A handler lowers one fx node by calling the :class:`~.lowerer.Lowerer`
(``lw.step``, ``lw.unary``, ``lw.alias``, ...) or raises
:class:`~.calls.Unsupported`:

- a module handler, ``handler(lw, node, module, x)``, for a ``call_module``
  node, keyed by the module's class (``x`` is the input argument);
- a function handler, ``handler(lw, node)``, for a ``call_function`` node,
  keyed by the function (``F.relu``, ``operator.add``);
- a method handler, ``handler(lw, node)``, for a ``call_method`` node, keyed
  by the method's name (``"relu"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: ``call_module`` handlers by module class: ``handler(lw, node, module, x)``.
MODULES: dict[type, Callable] = {}
#: ``call_function`` handlers by function: ``handler(lw, node)``.
FUNCTIONS: dict[Any, Callable] = {}
#: ``call_method`` handlers by method name: ``handler(lw, node)``.
METHODS: dict[str, Callable] = {}


def register(
    *,
    modules: Mapping[type, Callable] | None = None,
    functions: Mapping[Any, Callable] | None = None,
    methods: Mapping[str, Callable] | None = None,
) -> None:
    """Adds handlers to the tables.

    An operation has one handler: registering a key that already has one
    raises :class:`ValueError` (and registers nothing), so two family modules
    cannot silently claim the same operation."""
    pairs = ((MODULES, modules or {}), (FUNCTIONS, functions or {}), (METHODS, methods or {}))
    for table, handlers in pairs:
        taken = [key for key in handlers if key in table]
        if taken:
            raise ValueError(f"lowering handlers already registered for {taken!r}")
    for table, handlers in pairs:
        table.update(handlers)
