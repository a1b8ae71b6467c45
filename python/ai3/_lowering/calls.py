"""Reading the arguments of a traced call, the one way every lowering handler
does it: :class:`Sig` binds a node's arguments to the parameters of the
PyTorch function, method or module it calls, and rejects what ai3 would
otherwise ignore (an unknown keyword, an extra positional argument, a
non-default value of a parameter ai3 does not implement, a value known only
at run time where ai3 needs a number).
"""

from __future__ import annotations

import inspect
import numbers
import operator
from typing import Any

import torch.fx


class Unsupported(Exception):
    """Raised by a handler for a node ai3 cannot run; the message describes it."""


#: Parameters that take values of the network (tensors, or sizes read from
#: tensors). Every other parameter must be a constant when the model is converted.
VALUE_PARAMS = frozenset(
    {"input", "other", "tensor", "tensors", "weight", "bias", "running_mean", "running_var"}
    | {"a", "b", "obj", "shape", "size", "query", "key", "value", "attn_mask", "condition", "mat2"}
    | {"indices", "mat1"}
    | {f"{x}_{w}" for x in ("q", "k", "v", "out") for w in ("weight", "bias")}
)


def has_node(v: Any) -> bool:
    """Whether ``v`` holds an fx node anywhere (in a list, dict or slice)."""
    if isinstance(v, torch.fx.Node):
        return True
    if isinstance(v, list | tuple):
        return any(has_node(x) for x in v)
    if isinstance(v, dict):
        return any(has_node(x) for x in v.values())
    if isinstance(v, slice):
        return any(has_node(x) for x in (v.start, v.stop, v.step))
    return False


def _is_default(v: Any, default: Any) -> bool:
    if v is default:
        return True
    plain = (bool, int, float, str)
    return isinstance(v, plain) and isinstance(default, plain) and v == default


class Sig:
    """The parameters of a PyTorch call, written as in Python.

    ``Sig("input, dim, _stacklevel, dtype", dim=None, _stacklevel=3,
    dtype=None, fixed="dtype")`` is ``F.softmax``: parameters in positional
    order (``*`` starts the keyword-only ones, ``*name`` collects extra
    positional arguments, as in ``x.view(*size)``), defaults as keywords, and
    ``fixed`` naming the parameters ai3 does not implement: a call is lowered
    only while each of them has its default value. Parameters a handler
    neither reads nor fixes are the harmless ones (``_stacklevel``,
    ``cudnn_enabled``, ``memory_format``).
    """

    def __init__(self, params: str, *, fixed: str = "", **defaults: Any):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        built = []
        self.varargs: str | None = None
        for name in (p.strip() for p in params.split(",")):
            if name == "*":
                kind = inspect.Parameter.KEYWORD_ONLY
            elif name.startswith("*"):
                self.varargs = name[1:]
                built.append(inspect.Parameter(self.varargs, inspect.Parameter.VAR_POSITIONAL))
                kind = inspect.Parameter.KEYWORD_ONLY
            else:
                default = defaults.get(name, inspect.Parameter.empty)
                built.append(inspect.Parameter(name, kind, default=default))
        unknown = set(defaults) - {p.name for p in built}
        self.fixed = tuple(fixed.split())
        if unknown or set(self.fixed) - set(defaults):
            raise ValueError(f"Sig({params!r}): defaults or fixed name unknown parameters")
        self.signature = inspect.Signature(built)
        #: The first parameter: the tensor a method is called on, or a function's input.
        self.first = built[0].name
        self.defaults = defaults

    def __repr__(self) -> str:
        return f"Sig{self.signature}"

    def bind(self, n: torch.fx.Node) -> dict[str, Any]:
        """The node's arguments by parameter name, defaults filled in.

        Raises :class:`Unsupported` for arguments that do not fit the
        signature, for a graph value given where a constant is needed, and
        for a fixed parameter that is not at its default."""
        args, kwargs = list(n.args), dict(n.kwargs)
        if self.varargs is not None and self.varargs in kwargs:
            # ``x.view(size=(2, 3))`` is ``x.view((2, 3))``.
            args.append(kwargs.pop(self.varargs))
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise Unsupported(f"arguments that do not fit {self.signature}: {e}") from None
        bound.apply_defaults()
        b = dict(bound.arguments)
        for name in self.fixed:
            if not _is_default(b[name], self.defaults[name]):
                raise Unsupported(
                    f"{name}={b[name]!r} (ai3 implements only {name}={self.defaults[name]!r})"
                )
        for name, v in b.items():
            if name not in VALUE_PARAMS and has_node(v):
                raise Unsupported(
                    f"{name}={v!r} is computed by the network; ai3 needs its value "
                    "when it converts the model"
                )
        return b


#: A call on one tensor and nothing else: a module's, ``torch.relu(x)``, ``x.relu_()``.
INPUT = Sig("input")


# ---- constant arguments ---------------------------------------------------------------------


def as_int(name: str, v: Any) -> int:
    """``v`` as an int (not a bool), else :class:`Unsupported` naming ``name``."""
    if not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            pass
    raise Unsupported(f"{name}={v!r}: expected an int")


def as_ints(name: str, v: Any) -> list[int]:
    """An int or a sequence of ints, as a list."""
    if isinstance(v, list | tuple):
        return [as_int(name, x) for x in v]
    return [as_int(name, v)]


def as_float(name: str, v: Any) -> float:
    """A real number (not a bool) as a float."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    raise Unsupported(f"{name}={v!r}: expected a number")


def as_bool(name: str, v: Any) -> bool:
    """A bool (or 0 / 1)."""
    if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise Unsupported(f"{name}={v!r}: expected True or False")
