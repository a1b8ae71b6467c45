"""``ai3.Model``: a whole network held and run by ai3's Rust executor, and
``ai3.Summary``, the per-layer table that ``summary`` and ``profile`` return."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from . import _core, threads
from ._export import index_input
from .autotune.plan import Plan
from .autotune.resolve import plan_layers, resolve, rows_by_node
from .errors import DeviceError, Error, InvalidArgumentError
from .tensor import Tensor, _borrowed, _check_out_type

__all__ = ["Model", "Summary"]

_GRAD_WARNING = (
    "ai3.Model is inference-only: an input requires grad, but the output of a converted "
    "model has no grad_fn and no gradient flows back through it. To keep training working, "
    "swap layers in place with ai3.swap_operation instead of converting the network."
)


def add_node(core: _core.Model, node: dict[str, Any], algorithm: str | None = None) -> None:
    """Adds a recipe node (see ``ai3.convert``) to ``core``, running ``algorithm``
    (default: the node's own)."""
    if node["op"] == "constant":
        core.constant(node["name"], node["tensor"])
        return
    params = {**node["params"], **node["weights"]}
    algo = node["algorithm"] if algorithm is None else algorithm
    try:
        core.add(node["op"], node["name"], node["inputs"], params, algo)
    except OverflowError as e:  # a negative size or count, which Rust takes unsigned
        raise InvalidArgumentError(
            f"{node['op']} at node '{node['name']}': an argument is negative or too large ({e})"
        ) from e


def _build(recipe: dict[str, Any]) -> _core.Model:
    """The Rust model of ``recipe``; nodes still pending ('auto', a plan) run
    ``'default'`` in it, as a provisional model."""
    core = _core.Model(recipe["dtype"], recipe["num_inputs"], copy_weights=False)
    pending = set(recipe.get("pending") or [])
    for i, node in enumerate(recipe["nodes"]):
        add_node(core, node, "default" if i in pending else None)
    core.set_outputs(recipe["outputs"])
    core.blocked_layouts = recipe.get("blocked_layouts", True)
    return core


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _table(header: list[str], body: list[list[str]], right: set[int] = frozenset()) -> str:
    """Columns padded to their widest cell, two spaces apart; ``right``: right-aligned ones."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join(line(r) for r in [header, *body])


class Summary(Sequence):
    """What :meth:`Model.summary` and :meth:`Model.profile` return: one row per
    node of the graph, printed as an aligned table.

    ``rows`` holds the data, one dict per node with ``name``, ``op``,
    ``fused`` (what was fused into the node, joined by ``+`` in the order
    it applies: ``'mul'`` for a scale of its input's channels, ``'add'`` for
    a residual, the activation's name; or ``None``),
    ``algorithm`` (the one that runs for these shapes; ``'default'`` is
    resolved), ``input_shapes``, ``output_shape``, ``layout`` (the memory
    layout the node computes in: ``'NCHW'``, or ``'NCHW8c'``, channels in
    blocks of 8 side by side, which runs of depthwise and 1x1 convolutions
    keep between them, or ``'NHWC'`` for a convolution converted to read and
    write channels last, its shapes ``[n, h, w, c]``), ``reorders`` (the values reordered from one layout to
    the other for this node, e.g. ``"'features.0' -> NCHW8c"``) and, from
    ``profile``, ``ms`` (the node's median time in milliseconds, its reorders
    included). The summary also behaves as that list: ``len``, iteration and
    indexing give the row dicts.

    Example::

        >>> print(model.summary((1, 3, 32, 32)))
        name     op           algorithm  layout  input shapes     output shape
        conv1    conv2d+relu  direct     NCHW    [1, 3, 32, 32]   [1, 16, 32, 32]
        ...
    """

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: Any) -> Any:
        return self.rows[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Summary):
            return self.rows == other.rows
        if isinstance(other, list):
            return self.rows == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def total_ms(self) -> float | None:
        """The sum of the nodes' times (from ``profile``), else ``None``."""
        if not self.rows or "ms" not in self.rows[0]:
            return None
        return sum(r["ms"] for r in self.rows)

    def __str__(self) -> str:
        timed = self.total_ms is not None
        reordered = any(r.get("reorders") for r in self.rows)
        header = ["name", "op", "algorithm", "layout", "input shapes", "output shape"]
        if timed:
            header.append("ms")
        if reordered:
            header.append("reorders")
        body = []
        for r in self.rows:
            op = r["op"] + (f"+{r['fused']}" if r.get("fused") else "")
            ins = ", ".join(_shape_text(s) for s in r["input_shapes"])
            layout = r.get("layout", "NCHW")
            cells = [r["name"], op, r["algorithm"], layout, ins, _shape_text(r["output_shape"])]
            if timed:
                cells.append(f"{r['ms']:.3f}")
            if reordered:
                cells.append("; ".join(r.get("reorders", [])))
            body.append(cells)
        if timed:
            body.append(["total", "", "", "", "", "", f"{self.total_ms:.3f}"])
            if reordered:
                body[-1].append("")
        return _table(header, body, right={6} if timed else set())

    __repr__ = __str__


class Model:
    """A network converted by :func:`ai3.convert`; every layer runs in Rust.

    Call it like the PyTorch module it came from: ``model(x)`` (or
    ``model(x1, x2)`` for several inputs) returns ``torch.Tensor`` outputs.
    :meth:`predict` is the reference ai3's spelling: one input (a tuple for
    several) and an ``out_type``.

    The model is for inference only: no gradient flows through it (an input
    that requires grad gets a one-time warning; use :func:`ai3.swap_operation`
    to keep training). The GIL is released for the whole forward pass and no
    Python runs between layers, so several threads may call one model at
    once. Models pickle and deep-copy (their weights are kept with them).
    ``print(model)`` shows each node, its fused activation, the algorithm that
    runs and the shapes (see :meth:`summary`).
    """

    def __init__(self, recipe: dict[str, Any]):
        self._recipe = recipe
        self._decide_lock = threading.Lock()
        shape = recipe.get("sample_input_shape")
        if recipe.get("pending") and shape is not None:
            resolve(recipe, self._with_derived_shapes(self._as_shape_list(shape)), _build)
        self._core = _build(recipe)
        # The input shapes of the latest call, for repr and summary().
        self._last_shapes: list[Any] | None = None
        self._warned_grad = False

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in; inputs must have it."""
        return getattr(torch, self._core.dtype)

    @property
    def blocked_layouts(self) -> bool:
        """Whether runs of depthwise and 1x1 convolutions (with their
        activations, adds and global pooling) keep their values in the
        channel-blocked layout NCHW8c between them, reordering only at the
        run's edges, where that pays (the default, ``True``; float32 on a CPU
        with AVX2). ``False`` keeps every value NCHW. :meth:`summary` shows
        each node's layout and each reorder."""
        return self._core.blocked_layouts

    @blocked_layouts.setter
    def blocked_layouts(self, on: bool) -> None:
        self._recipe["blocked_layouts"] = bool(on)
        self._core.blocked_layouts = bool(on)

    def _prepare(self, inputs: Sequence[Any], stacklevel: int) -> tuple[list[Any], list[Any]]:
        """Checks the inputs and detaches them; returns them with their shapes.
        ``stacklevel`` is the user's frame as seen from here (1 = this method), so
        the warning points at the user's line."""
        derived = self._recipe.get("derived")
        expected = self._recipe["num_inputs"] - (len(derived.casts) if derived else 0)
        if derived is not None and len(inputs) != expected:
            raise InvalidArgumentError(f"model: expected {expected} input(s), got {len(inputs)}")
        indices = self._recipe.get("index_inputs") or ()
        prepared, shapes = [], []
        for i, x in enumerate(inputs):
            shapes.append(getattr(x, "shape", ()))
            if isinstance(x, torch.Tensor):
                if x.device.type != "cpu":
                    raise DeviceError(
                        f"model: input of shape {list(x.shape)} is on {x.device}, "
                        "but this model runs on the CPU"
                    )
                if x.requires_grad and torch.is_grad_enabled() and not self._warned_grad:
                    self._warned_grad = True
                    warnings.warn(_GRAD_WARNING, UserWarning, stacklevel=stacklevel)
                # A tensor that requires grad cannot be exported; the model records no gradients.
                x = x.detach()
                if i in indices:
                    x = index_input(x, self.dtype, f"model input {i} (embedding indices)")
            prepared.append(x)
        if derived is not None:
            extra = derived(prepared)
            prepared += extra
            shapes += [t.shape for t in extra]
        return prepared, shapes

    def _with_derived_shapes(self, shapes: list[list[int]]) -> list[list[int]]:
        """The shapes of every input of the Rust graph for user inputs of ``shapes``:
        these and those of the tensors computed from them (see :mod:`ai3._export`)."""
        derived = self._recipe.get("derived")
        if derived is None or len(shapes) != len(derived.input_dtypes):
            return shapes
        return shapes + derived.shapes(shapes)

    def _decide(self, shapes: list[Any]) -> None:
        """Decides the pending layers ('auto') for the first call's input shapes."""
        with self._decide_lock:
            if self._recipe.get("pending"):
                resolve(self._recipe, [list(s) for s in shapes], _build)
                self._core = _build(self._recipe)

    def _run(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        threads.sync()
        prepared, shapes = self._prepare(inputs, stacklevel=4)  # _prepare, _run, caller, user
        if self._recipe.get("pending"):
            self._decide(shapes)
        capsules = self._core.run([_borrowed(x) for x in prepared])
        # Only after a successful run, so that repr never shows shapes the model rejected.
        self._last_shapes = shapes[: len(inputs)]
        return [torch.from_dlpack(c) for c in capsules]

    def __call__(self, *inputs: Any) -> Any:
        """Runs the network on ``inputs`` (one per input of the network) and returns
        a ``torch.Tensor``, or a tuple of them for a network with several outputs.
        A network captured by ``torch.export`` returns its outputs in the structure
        its forward does (a Hugging Face ``ModelOutput``, a dict, ...)."""
        outs = self._run(inputs)
        spec = self._recipe.get("out_spec")
        if spec is not None:
            return torch.utils._pytree.tree_unflatten(outs, spec)
        return outs[0] if self._recipe["single_output"] else tuple(outs)

    #: Same as calling the model.
    forward = __call__

    def predict(self, input: Any, out_type: type | None = None) -> Any:
        """Runs the network on ``input`` (a tuple or list of inputs for a network
        with several) and returns the output as ``out_type``: ``ai3.Tensor`` (the
        default, as in the reference ai3), ``torch.Tensor`` or ``numpy.ndarray``.
        Nothing is copied. A network with several outputs gives a tuple.

        >>> model.predict(x, torch.Tensor)
        """
        if out_type is None:
            out_type = Tensor
        _check_out_type("predict", out_type)
        inputs = list(input) if isinstance(input, (tuple, list)) else [input]
        outs = [Tensor(o).to(out_type) for o in self._run(inputs)]
        return outs[0] if self._recipe["single_output"] else tuple(outs)

    def _known_shapes(self) -> list[list[int]] | None:
        shape = self._recipe.get("sample_input_shape")
        if shape is not None:
            return self._as_shape_list(shape)
        if self._last_shapes is None:
            return None
        return [list(s) for s in self._last_shapes]

    @staticmethod
    def _as_shape_list(shape: Any) -> list[list[int]]:
        if len(shape) and isinstance(shape[0], Sequence):
            return [list(s) for s in shape]  # one shape per input
        return [list(shape)]

    def _shapes(self, what: str, input_shape: Any) -> list[list[int]]:
        if input_shape is not None:
            shapes: list[list[int]] | None = self._as_shape_list(input_shape)
        else:
            shapes = self._known_shapes()
        if shapes is None:
            raise InvalidArgumentError(
                f"{what}: an input shape is needed: none was given here or to "
                "convert(sample_input_shape=...), and the model has not been called yet"
            )
        return self._with_derived_shapes(shapes)

    def summary(self, input_shape: Sequence[int] | None = None) -> Summary:
        """The nodes of the graph for this input shape, as a :class:`Summary`
        (prints as a table; ``.rows`` holds one dict per node). Defaults to the
        sample input shape given to ``convert``, or else the input shapes of the
        latest call; give a list of shapes for a model with several inputs.
        Layers whose ``'auto'`` choice waits for the first call show ``'auto'``."""
        rows = self._core.summary(self._shapes("summary", input_shape))
        pending = self._recipe.get("pending")
        if pending:
            by_node = rows_by_node(self._recipe, rows)
            for i in pending:
                by_node[i]["algorithm"] = "auto"
        return Summary(rows)

    def profile(self, *inputs: Any, repeat: int = 10) -> Summary:
        """Times every node on these inputs: the :meth:`summary` rows, each with
        ``ms``, the node's median time over ``repeat`` runs (after one warm-up run).

        >>> prof = model.profile(torch.randn(1, 3, 224, 224))
        >>> print(prof)                                  # the table, with an ms column
        >>> max(prof, key=lambda r: r["ms"])["name"]     # the slowest node
        """
        if repeat < 1:
            raise InvalidArgumentError(f"profile: repeat must be at least 1, got {repeat}")
        threads.sync()
        prepared, shapes = self._prepare(inputs, stacklevel=3)
        _, times = self._core.profile(prepared, repeat)
        self._last_shapes = shapes[: len(inputs)]
        rows = self._core.summary([list(s) for s in shapes])
        for row, t in zip(rows, times, strict=True):
            row["ms"] = t * 1e3
        return Summary(rows)

    def memory_plan(self, input_shape: Sequence[int] | None = None) -> dict[str, int]:
        """What the memory planner decided for this input shape: ``arena_bytes``
        (one arena holds every intermediate value), ``intermediate_bytes`` (what
        they would take if none shared memory), ``arenas_allocated`` (arenas
        created so far over all calls: one per thread running concurrently, and
        a new one only when the input shape grows), ``workspace_bytes`` (the
        most scratch memory one layer needs), and ``chunked_steps`` and
        ``chunk_images``: a batch of large images runs its first steps (layers
        and layout reorders, ``chunked_steps`` of them) ``chunk_images`` images
        at a time, so that each layer's output is still in cache when the next
        reads it (``chunked_steps`` is 0 when the whole batch runs together)."""
        return self._core.memory_plan(self._shapes("memory_plan", input_shape))

    def plan(self) -> Plan:
        """The algorithm each layer runs, as a :class:`ai3.Plan` to
        :meth:`~ai3.Plan.save` and apply to later conversions: every layer of
        the operations ``'auto'`` or a plan chose for (with the measurements
        behind each ``'auto'`` choice), or of every operation with a choice of
        algorithms when none did. Before the first call of a model converted
        with ``'auto'`` and no ``sample_input_shape``, nothing is chosen yet:
        that is an :class:`ai3.InvalidArgumentError`."""
        if self._recipe.get("pending"):
            raise InvalidArgumentError(
                "plan: the 'auto' layers are decided at the first call (or from convert's "
                "sample_input_shape); call the model once first"
            )
        shapes = self._recipe.get("decided_for") or self._known_shapes()
        if shapes is None:
            raise InvalidArgumentError(
                "plan: an input shape is needed: give convert a sample_input_shape, or call "
                "the model once first"
            )
        shapes = [list(s) for s in shapes]
        return Plan(plan_layers(self._recipe, shapes, self._core), shapes, self._core.dtype)

    def _requested_table(self) -> str:
        """Without shapes only the requested algorithm is known ('default' resolves per shape)."""
        steps = [s for s in self._recipe["nodes"] if s["op"] != "constant"]
        body = []
        for (name, op), step in zip(self._core.nodes(), steps, strict=True):
            act = step["params"].get("activation")
            body.append([name, op + (f"+{act[0]}" if act else ""), str(step["algorithm"])])
        return _table(["name", "op", "algorithm (requested)"], body)

    def __repr__(self) -> str:
        shapes = self._known_shapes()
        dtype = self._core.dtype
        if shapes is not None:
            try:
                table = str(self.summary(shapes))
            except Error:  # repr must not raise; fall back to what needs no shapes
                shapes = None
        if shapes is not None:
            shown = _shape_text(shapes[0]) if len(shapes) == 1 else str(shapes)
            head = f"ai3.Model(dtype={dtype}, input_shape={shown})"
            note = ""
        else:
            head = f"ai3.Model(dtype={dtype})"
            table = self._requested_table()
            note = (
                "\n  (shapes, and the algorithm that 'default' picks, are known after the "
                "first call, or from convert's sample_input_shape)"
            )
        body = "\n".join("  " + line for line in table.splitlines())
        return f"{head}\n{body}{note}"

    def __reduce__(self):
        return (Model, (self._recipe,))

    def __deepcopy__(self, memo):
        import copy

        with self._decide_lock:
            return Model(copy.deepcopy(self._recipe, memo))
