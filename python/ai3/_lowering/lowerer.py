"""The walk: an fx graph lowered node by node, and what it records.

Each fx node becomes a :class:`Step` (one ai3 node), an alias of another
value (Dropout, Identity, ``contiguous``), a symbolic size (``x.size(0)``),
or the pieces of a ``chunk``/``split`` that later ``getitem`` nodes slice.
Nodes ai3 cannot run are collected, so one error can list all of them.

The walk looks each node up in the tables of :mod:`.registry` and calls its
handler; the handlers, grouped by family, are in the other modules of this
package. In-place operations (``F.relu(x, inplace=True)``, ``x.relu_()``)
are computed out of place; the lowerer follows PyTorch's aliasing so that
later readers of the changed tensor read the new value, and reports the
cases it cannot follow (a view or alias of the changed memory read
afterwards, a module tensor changed in place).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.nn.modules import module as _module

from .. import _sizes as S
from .._decompose import DECOMPOSITIONS, why_not
from ..errors import Error, InvalidArgumentError
from .calls import INPUT, Unsupported
from .registry import FUNCTIONS, METHODS, MODULES


@dataclass(frozen=True)
class In:
    """A weight parameter read from the step's input ``k``, a graph value
    (``F.conv2d(x, w)`` with ``w`` an argument of ``forward``)."""

    k: int


@dataclass
class Step:
    """One ai3 node: ``core.add(op, name, inputs, params, algorithm)``.

    ``inputs`` are the fx nodes it reads. A weight read from one of them is
    ``In(k)`` in ``params``; the others are the node's inputs, in order.
    ``params`` are the operation's parameters by name (see
    ``ai3._core.operations()``); ``None`` leaves one out."""

    node: torch.fx.Node
    op: str
    inputs: list[torch.fx.Node]
    params: dict[str, Any] = field(default_factory=dict)
    module: nn.Module | None = None

    def data_inputs(self) -> list[int]:
        """Indices in :attr:`inputs` of the node's inputs (those not read as weights)."""
        weights = {p.k for p in self.params.values() if isinstance(p, In)}
        return [i for i in range(len(self.inputs)) if i not in weights]


@dataclass(frozen=True)
class Alias:
    """The node's value is another node's value."""

    node: torch.fx.Node


@dataclass(frozen=True)
class Pieces:
    """The tuple returned by ``chunk`` / ``split`` / ``unbind``; only ``getitem``
    may read it. ``unbind``'s pieces drop the dimension (``squeeze``)."""

    node: torch.fx.Node
    dim: int
    chunks: int | None
    split_size: int | None
    sections: list[int] | None
    squeeze: bool = False


_TENSOR = "tensor"
_CONST = "const"
#: The value of a node that could not be lowered: readers go on without another error.
OPAQUE = "opaque"
#: A tensor computed from input shapes alone that only other such tensors read.
_DERIVED = "derived"
_VALUES = (_TENSOR, _CONST, OPAQUE)


def _describe(gm: torch.fx.GraphModule, n: torch.fx.Node) -> str:
    if n.op == "call_module":
        return f"{type(gm.get_submodule(n.target)).__name__} module '{n.target}'"
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    t = n.target
    mod = getattr(t, "__module__", None) or ""
    return f"{mod}.{getattr(t, '__name__', t)}".lstrip(".")


class Lowerer:
    """Walks an fx graph once, producing steps, aliases and the unsupported list.

    Besides each node's value, it tracks PyTorch's aliasing: every tensor
    node denotes a tensor object (an alias such as Dropout in eval mode
    denotes its input's object), objects live in a storage (a view shares
    its base's), an in-place change gives the changed object a new value
    (read by every later reader), and makes the other objects of that
    storage stale: ai3 computed them as copies, so reading one afterwards is
    unsupported.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        root: nn.Module | None = None,
        derived: set[torch.fx.Node] | None = None,
        frontier: list[torch.fx.Node] | None = None,
    ):
        self.gm = gm
        #: For a graph captured by torch.export: the module it came from (each
        #: node's module is found through its ``nn_module_stack``), the nodes
        #: computed from input shapes alone, and those among them the network
        #: reads, which become inputs (see :mod:`ai3._export`).
        self.root = root
        self.derived = derived or set()
        self.frontier = frontier or []
        self.kind: dict[torch.fx.Node, Any] = {}
        self.steps: list[Step] = []
        self.unsupported: list[tuple[str, str]] = []
        self.outputs: list[torch.fx.Node] = []
        self.single_output = True
        self._obj: dict[torch.fx.Node, int] = {}  # the tensor object a node denotes
        self._storage: list[int] = []  # object -> the storage it lives in
        self._version: dict[int, torch.fx.Node] = {}  # object -> its value after in-place changes
        self._stale: dict[int, torch.fx.Node] = {}  # object -> the in-place node it missed
        self._held: set[int] = set()  # storages of module attributes

    # ---- values ----------------------------------------------------------------------------

    def canonical(self, n: torch.fx.Node) -> torch.fx.Node:
        """Follows aliases to the node that really produces the value."""
        k = self.kind.get(n)
        while isinstance(k, Alias):
            n = k.node
            k = self.kind.get(n)
        return n

    def resolve(self, n: torch.fx.Node) -> torch.fx.Node:
        """The node whose value ``n`` holds now: in-place changes and aliases followed."""
        o = self._obj.get(n)
        changed = self._version.get(o) if o is not None else None
        return self.canonical(n if changed is None else changed)

    def tensor(self, arg: Any) -> torch.fx.Node:
        """The producing node of a tensor argument, or :class:`Unsupported`."""
        if not isinstance(arg, torch.fx.Node):
            raise Unsupported(f"expected a tensor argument, got {type(arg).__name__}")
        self.check_current(arg)
        return self.shape_source(arg)

    def check_current(self, arg: torch.fx.Node) -> None:
        """Raises :class:`Unsupported` if ``arg`` shares memory that an in-place
        operation changed through another tensor since ``arg`` was computed."""
        mutator = self._stale.get(self._obj.get(arg, -1))
        if mutator is not None:
            raise Unsupported(
                f"reads '{arg.name}' after the in-place '{mutator.name}' changed its memory "
                "through another view or alias (ai3 computes in-place operations out of "
                "place and follows the change only through the tensor it was applied to)"
            )

    def shape_source(self, arg: Any) -> torch.fx.Node:
        """Like :meth:`tensor`, for reading only the shape (which no in-place change alters)."""
        if not isinstance(arg, torch.fx.Node):
            raise Unsupported(f"expected a tensor argument, got {type(arg).__name__}")
        n = self.resolve(arg)
        if self.kind.get(n) not in _VALUES:
            raise Unsupported(f"'{arg.name}' is not a tensor ai3 can read here")
        return n

    def const_tensor(self, arg: Any) -> torch.Tensor | None:
        """A weight given as a get_attr node (or None)."""
        if arg is None:
            return None
        if isinstance(arg, torch.Tensor):
            return arg
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
            return self.fetch(arg.target)
        raise Unsupported("weights must be module attributes")

    def fetch(self, target: str) -> Any:
        obj: Any = self.gm
        for atom in str(target).split("."):
            obj = getattr(obj, atom)
        return obj

    def size(self, arg: Any) -> S.SizeExpr:
        """A size argument: an int or a symbolic size node."""
        if isinstance(arg, torch.fx.Node):
            k = self.kind.get(self.canonical(arg))
            e = S.as_size(k)
        else:
            e = S.as_size(arg)
        if e is None:
            raise Unsupported(f"expected a size, got {arg!r}")
        return e

    def is_value(self, a: Any) -> bool:
        """Whether ``a`` is a tensor of the graph (an input, a module tensor, a computed
        one, or one that could not be lowered), not a number or a symbolic size."""
        return isinstance(a, torch.fx.Node) and self.kind.get(self.resolve(a)) in _VALUES

    def weight_args(self, x: Any, *weights: Any) -> tuple[list[Any], list[Any]]:
        """The values a layer reading ``x`` with ``weights`` reads, and its weight arguments.

        Weights that are all module attributes stay constants the layer holds,
        prepared once. If any is a graph value (a model input, a computed
        tensor), every weight becomes an input the layer reads on every call,
        given as an :class:`In` placeholder (absent ones stay None)."""

        def held(w: Any) -> bool:
            return not isinstance(w, torch.fx.Node) or self.resolve(w).op == "get_attr"

        if all(held(w) for w in weights):
            return [x], [
                self.const_tensor(self.resolve(w) if w is not None else None) for w in weights
            ]
        inputs, args = [x], []
        for w in weights:
            if w is None:
                args.append(None)
            else:
                args.append(In(len(inputs)))
                inputs.append(w)
        return inputs, args

    # ---- aliasing --------------------------------------------------------------------------

    def _new_object(self, n: torch.fx.Node, storage: int | None = None) -> None:
        o = len(self._storage)
        self._obj[n] = o
        self._storage.append(o if storage is None else storage)

    def view(self, n: torch.fx.Node, base: torch.fx.Node) -> None:
        """``n`` may share ``base``'s memory (a view, or a copy PyTorch makes only
        for some strides: ``reshape``, ``contiguous``)."""
        self._new_object(n, self._storage[self._obj[base]])

    def alias(self, n: torch.fx.Node, x: Any, *, same: bool) -> None:
        """``n``'s value is ``x``'s: the very same tensor (``same``, as Identity) or
        possibly a view of it (as ``contiguous``)."""
        self.kind[n] = Alias(self.tensor(x))
        if same:
            self._obj[n] = self._obj[x]
        else:
            self.view(n, x)

    def _check_mutable(self, x: Any) -> None:
        if isinstance(x, torch.fx.Node) and self._storage[self._obj[x]] in self._held:
            raise Unsupported(
                f"changes '{x.name}', a tensor of the module, in place "
                "(ai3 holds the module's tensors constant)"
            )

    def _mutated(self, n: torch.fx.Node, x: torch.fx.Node) -> None:
        """``n`` changed ``x``'s tensor in place and returned it."""
        o = self._obj[x]
        self._obj[n] = o
        self._version[o] = n
        storage = self._storage[o]
        for other, s in enumerate(self._storage):
            if s == storage and other != o:
                self._stale.setdefault(other, n)

    # ---- steps -----------------------------------------------------------------------------

    def step(
        self,
        n: torch.fx.Node,
        op: str,
        inputs: list[Any],
        params: dict[str, Any] | None = None,
        module: nn.Module | None = None,
        inplace: bool = False,
        shapes: tuple[Any, ...] = (),
    ) -> None:
        """Adds the ai3 node computing ``n`` from ``inputs``, and from ``shapes``:
        tensors it reads only the shapes of. ``inplace``: ``n`` changes ``inputs[0]``."""
        if inplace:
            self._check_mutable(inputs[0])
        read = [self.tensor(i) for i in inputs] + [self.shape_source(i) for i in shapes]
        if module is None:
            module = self._module_of(n)
        self.steps.append(Step(n, op, read, dict(params or {}), module))
        self.kind[n] = _TENSOR
        if inplace:
            self._mutated(n, inputs[0])

    def _module_of(self, n: torch.fx.Node) -> nn.Module | None:
        """The innermost module a node of an exported graph was computed in, for
        selectors that take the module (fx graphs name it in ``call_module``)."""
        stack = n.meta.get("nn_module_stack")
        if self.root is None or not stack:
            return None
        path = next(reversed(stack.values()))[0]
        try:
            return self.root.get_submodule(path)
        except AttributeError:
            return None

    def partial(self, n: torch.fx.Node, what: str) -> torch.fx.Node:
        """A node standing for an intermediate value of ``n``'s lowering, for
        a handler that computes ``n`` in several steps (not in the graph)."""
        return torch.fx.Node(n.graph, f"{n.name}_{what}", "call_function", _intermediate, (), {})

    def unary(self, n, x, op: str, module=None, inplace=False, **params) -> None:
        """A step reading only ``x``, with these parameters."""
        self.step(n, op, [x], params, module, inplace)

    # ---- the walk --------------------------------------------------------------------------

    def run(self) -> None:
        for n in self.gm.graph.nodes:
            try:
                self.lower(n)
            except Unsupported as e:
                self._unsupported(n, str(e))
            except InvalidArgumentError as e:
                # A hyperparameter PyTorch would reject too: its own error, naming the node.
                raise InvalidArgumentError(
                    f"{_describe(self.gm, n)} at node '{n.name}': {e}"
                ) from e
            except Error:
                raise
            except (LookupError, TypeError, ValueError) as e:
                # Arguments of a shape no handler expects: reported with the node, not raised.
                self._unsupported(n, f"arguments ai3 cannot read ({type(e).__name__}: {e})")
            if n not in self._obj:
                self._new_object(n)
                if self.kind.get(n) == _CONST:
                    self._held.add(self._obj[n])

    def _unsupported(self, n: torch.fx.Node, why: str) -> None:
        self.unsupported.append((n.name, f"{_describe(self.gm, n)}: {why}"))
        self.kind[n] = OPAQUE  # keep going to find every unsupported node

    def lower(self, n: torch.fx.Node) -> None:
        if n.op == "placeholder" or n in self.frontier:
            self.kind[n] = _TENSOR
        elif n in self.derived:
            self.kind[n] = _DERIVED
        elif n.op == "call_module" and n.target == "_guards_fn":
            pass  # torch.export's checks of the input shapes: the operations check them too
        elif n.op == "get_attr":
            if not isinstance(self.fetch(n.target), torch.Tensor):
                raise Unsupported("non-tensor attribute")
            self.kind[n] = _CONST
        elif n.op == "output":
            self.lower_output(n)
        elif n.op == "call_module":
            m = self.gm.get_submodule(n.target)
            if type(m) in DECOMPOSITIONS:  # traced as functional code when it can be
                raise Unsupported(why_not(m, tuple(n.args), dict(n.kwargs)) or "no decomposition")
            handler = _handler(MODULES, type(m))
            _check_hooks(m)
            handler(self, n, m, INPUT.bind(n)["input"])
        elif n.op == "call_function":
            _handler(FUNCTIONS, n.target)(self, n)
        elif n.op == "call_method":
            _handler(METHODS, n.target)(self, n)
        else:
            raise Unsupported(f"fx op {n.op}")

    def lower_output(self, n: torch.fx.Node) -> None:
        result = n.args[0]
        self.single_output = isinstance(result, torch.fx.Node)
        items = [result] if self.single_output else result
        if not isinstance(items, list | tuple):
            raise Unsupported(
                f"output structure {type(result).__name__} (ai3 returns a tensor or a tuple)"
            )
        self.outputs = [self.tensor(r) for r in items]


def _intermediate() -> None:
    """The target of the nodes :meth:`Lowerer.partial` makes (never called)."""


def _handler(table: dict[Any, Callable], key: Any) -> Callable:
    """The handler ``key`` has in one of the :mod:`.registry` tables."""
    handler = table.get(key)
    if handler is None:
        raise Unsupported("no ai3 implementation")
    return handler


def _check_hooks(m: nn.Module) -> None:
    """fx does not run a leaf module's hooks, and neither would ai3."""
    global_hooks = ("_global_forward_hooks", "_global_forward_pre_hooks")
    if (
        m._forward_hooks
        or m._forward_pre_hooks
        or any(getattr(_module, h, None) for h in global_hooks)
    ):
        raise Unsupported("forward hooks, which ai3 would not run")
