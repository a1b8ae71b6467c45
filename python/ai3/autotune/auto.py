"""The ``'auto'`` selector: time every algorithm that can run a layer, on the
layer's real input shape, and keep the fastest one whose output agrees with a
float64 reference.

How one layer is decided (:func:`measure` and :func:`choose`):

1. The registry lists the layer's algorithms, with why any cannot run it and
   the scratch memory each needs (``_core.Model.candidates``).
2. Each usable one runs once on a random input (a warm-up that also packs
   its weights) and its output is compared with the layer computed in float64;
   the error is the largest difference relative to the reference's largest
   magnitude.
3. The ones within the tolerance are timed in rounds, one call of each per
   round, so drift on a busy machine touches all alike; after three rounds an
   algorithm at over 1.5x the best time stops being timed. The median counts.
   One whose warm-up took over 4x the fastest warm-up is not raced at all (on
   a large layer a slow algorithm's call can take seconds): its warm-up time
   stands.
4. The fastest within the tolerance and ``max_workspace`` wins, except that
   ``'default'``'s choice stays unless the fastest is at least 5% faster.
5. When the choices differ from ``'default'``'s, the converted network runs
   both ways, call by call, and ``'default'``'s come back unless the chosen
   ones are faster in place too (:func:`.resolve._check_network`).

Measurements are cached on disk per layer signature and machine (see
:mod:`.cache`), so a second ``convert(..., 'auto')`` times nothing.
"""

from __future__ import annotations

import contextvars
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from .. import _core, threads
from ..errors import AlgorithmError, InvalidArgumentError
from . import cache
from .signature import digest, machine
from .timing import random_inputs

#: Largest relative error accepted by default, per dtype.
DEFAULT_TOLERANCE = {"float32": 1e-4, "float64": 1e-10}

#: Test hook: seconds slept inside every timed call of an algorithm (by name),
#: to make it artificially slow.
_DELAYS: dict[str, float] = {}

#: How much measuring was done, for tests and reports: ``layers_timed`` (layers
#: whose algorithms were run and timed), ``cache_hits`` (layers decided from
#: the disk cache alone).
STATS: Counter = Counter()

#: Told of the work as it goes (set by :func:`ai3.explore` for its progress bar):
#: ``add(n)`` when a layer's ``n`` algorithms are known, ``step(text)`` after each.
PROGRESS: contextvars.ContextVar[Any] = contextvars.ContextVar("ai3_explore_progress", default=None)

#: Rounds before a slow algorithm may drop out, and how much slower it must be.
_MIN_ROUNDS = 3
_DROP_FACTOR = 1.5
#: Another algorithm replaces ``'default'``'s choice only when it takes at most
#: this fraction of its time.
SWITCH_MARGIN = 0.95
#: An algorithm whose warm-up took this many times the fastest warm-up is not raced.
_WARM_DROP_FACTOR = 4.0
#: A layer is timed for at most about this long once it has had its minimum rounds.
_LAYER_BUDGET_S = 2.0


@dataclass(frozen=True)
class Auto:
    """The ``'auto'`` selector with its settings; ``'auto'`` is ``Auto()``.

    - ``tolerance``: the largest error accepted, relative to the largest
      magnitude of the float64 reference (default 1e-4 in float32, 1e-10 in
      float64);
    - ``max_workspace``: the most scratch bytes the chosen algorithm may need
      (default: no limit);
    - ``algorithms``: the algorithm names to choose among (default: all);
    - ``repeat``: the most timed calls per algorithm (the median counts);
    - ``cache``: read and write the disk cache of measurements;
    - ``measure_all``: time a layer even when a single algorithm can run it
      (:func:`ai3.explore` does, for its report); otherwise such a layer just
      gets that algorithm;
    - ``check_network``: when the choices differ from ``'default'``'s, time the
      whole network both ways, call by call, and keep ``'default'``'s unless
      the choices are faster there too (``convert`` only; a swapped layer is
      decided alone).

    Example::

        ai3.convert(net, {"conv2d": ai3.Auto(max_workspace=1 << 20)}, (1, 3, 224, 224))
    """

    tolerance: float | None = None
    max_workspace: int | None = None
    algorithms: tuple[str, ...] | None = None
    repeat: int = 7
    cache: bool = True
    measure_all: bool = False
    check_network: bool = True

    def __post_init__(self) -> None:
        if self.tolerance is not None and not self.tolerance > 0:
            raise InvalidArgumentError(f"Auto: tolerance must be positive, got {self.tolerance}")
        if self.max_workspace is not None and (
            not isinstance(self.max_workspace, int) or self.max_workspace < 0
        ):
            raise InvalidArgumentError(
                f"Auto: max_workspace must be a non-negative number of bytes, got {self.max_workspace!r}"
            )
        if not isinstance(self.repeat, int) or self.repeat < 1:
            raise InvalidArgumentError(f"Auto: repeat must be at least 1, got {self.repeat!r}")
        if self.algorithms is not None:
            if isinstance(self.algorithms, str) or not all(
                isinstance(a, str) for a in self.algorithms
            ):
                raise InvalidArgumentError(
                    f"Auto: algorithms must be a sequence of names, got {self.algorithms!r}"
                )
            object.__setattr__(self, "algorithms", tuple(self.algorithms))

    def __str__(self) -> str:
        return "auto"

    def tolerance_for(self, dtype: str) -> float:
        """The tolerance in force for ``dtype``."""
        return self.tolerance if self.tolerance is not None else DEFAULT_TOLERANCE[dtype]


def as_auto(algo: Any) -> Auto | None:
    """``'auto'`` and :class:`Auto` as an :class:`Auto`; anything else ``None``."""
    if isinstance(algo, Auto):
        return algo
    if isinstance(algo, str) and algo == "auto":
        return Auto()
    return None


def available(op: str) -> list[str]:
    """The algorithms of ``op`` this build can run at all (shape aside)."""
    return [
        r["algorithm"]
        for r in _core.algorithms()
        if r["op"] == op and r["device"] == "cpu" and r.get("unavailable") is None
    ]


@dataclass
class Node:
    """One node of a recipe, ready to be built on its own: its inputs and
    then its weights read from graph values (``weights``, by parameter name)
    become the inputs of a one-node model; ``shapes`` are theirs, in that order."""

    op: str
    params: dict[str, Any]
    num_inputs: int
    weights: list[str]
    shapes: list[list[int]]
    dtype: str

    def build(self, algorithm: str, dtype: str | None = None) -> _core.Model:
        """A model of this node alone running ``algorithm``, its inputs the values."""
        dtype = dtype or self.dtype
        to = getattr(torch, dtype)
        params = {k: v.to(to) if isinstance(v, torch.Tensor) else v for k, v in self.params.items()}
        params.update({k: self.num_inputs + j for j, k in enumerate(self.weights)})
        core = _core.Model(dtype, len(self.shapes), copy_weights=True)
        core.add(self.op, self.op, list(range(self.num_inputs)), params, algorithm)
        core.set_outputs([len(self.shapes)])
        return core

    def inputs(self, dtype: str | None = None) -> list[torch.Tensor]:
        """Random inputs of the node's shapes (fixed seed, the same values in every dtype)."""
        return random_inputs(self.shapes, getattr(torch, dtype or self.dtype))


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.numel() == 0:
        return 0.0
    scale = max(float(ref.abs().max()), 1e-300)
    return float((out.double() - ref).abs().max()) / scale


def admissible(m: dict[str, Any] | None, auto: Auto, dtype: str) -> bool:
    """Whether a measured algorithm may be chosen under ``auto``'s settings."""
    return m is not None and _within(m, auto, dtype) and m["seconds"] is not None


def _within(m: dict[str, Any], auto: Auto, dtype: str) -> bool:
    return (
        m.get("unusable") is None
        and m.get("error") is not None
        and m["error"] <= auto.tolerance_for(dtype)
        and (auto.max_workspace is None or m["workspace_bytes"] <= auto.max_workspace)
        and (auto.algorithms is None or m["algorithm"] in auto.algorithms)
    )


def measure(node: Node, signature: dict[str, Any], auto: Auto) -> dict[str, dict[str, Any]]:
    """Per algorithm: ``algorithm``, ``unusable`` (why it cannot run, or None),
    ``workspace_bytes``, ``error`` (relative to the float64 reference),
    ``seconds`` (median time; None where not timed) and ``calls`` (timed calls
    behind it; 1 is the warm-up alone, for an algorithm far slower than the
    fastest). Reads and extends the cache."""
    threads.sync()
    key = digest({"signature": signature, "machine": machine()})
    entry = cache.load(key) if auto.cache else None
    known: dict[str, dict[str, Any]] = dict(entry["algorithms"]) if entry else {}
    for c in node.build("default").candidates(node.shapes)[0]:
        name = c["algorithm"]
        if name not in known:
            known[name] = {
                "algorithm": name,
                "unusable": c["unusable"],
                "workspace_bytes": c["workspace_bytes"],
                "error": None,
                "seconds": None,
                "calls": 0,
            }
    dtype = node.dtype
    wanted = [
        m
        for m in known.values()
        if m["unusable"] is None
        and (auto.max_workspace is None or m["workspace_bytes"] <= auto.max_workspace)
        and (auto.algorithms is None or m["algorithm"] in auto.algorithms)
        and m["seconds"] is None
        and (m["error"] is None or m["error"] <= auto.tolerance_for(dtype))
    ]
    progress = PROGRESS.get()
    if progress is not None:
        progress.add(len(wanted))
    if not wanted:
        STATS["cache_hits"] += 1
        return known
    STATS["layers_timed"] += 1
    _time(node, wanted, auto, progress)
    if auto.cache:
        cache.store(key, {"signature": signature, "machine": machine(), "algorithms": known})
    return known


def _call(core: _core.Model, inputs: list[torch.Tensor], name: str) -> tuple[Any, float]:
    """One timed call (with the test hook's delay); returns the outputs and seconds."""
    delay = _DELAYS.get(name, 0.0)
    t = time.perf_counter()
    out = core.run(inputs)
    if delay:
        time.sleep(delay)
    return out, time.perf_counter() - t


def _time(node: Node, wanted: list[dict[str, Any]], auto: Auto, progress: Any = None) -> None:
    """Fills in ``error``, ``seconds`` and ``calls`` (timed calls behind
    ``seconds``) of the ``wanted`` measurements."""
    inputs = node.inputs()
    ref_algo = next(
        (a for a in ("direct", "gemm") if any(m["algorithm"] == a for m in wanted)), "default"
    )
    reference = torch.from_dlpack(node.build(ref_algo, "float64").run(node.inputs("float64"))[0])
    cores: dict[str, _core.Model] = {}
    warm: dict[str, float] = {}
    for m in wanted:
        m["seconds"], m["calls"] = None, 0
        name = m["algorithm"]
        try:
            core = node.build(name)
            out, warm[name] = _call(core, inputs, name)  # packs the weights, so it counts apart
            m["error"] = _error(torch.from_dlpack(out[0]), reference)
        except Exception as e:  # an algorithm that fails here is one the layer cannot use
            m["unusable"] = f"{type(e).__name__}: {e}"
            continue
        if m["error"] <= auto.tolerance_for(node.dtype):
            cores[name] = core
    # Far slower already in the warm-up: not raced; the warm-up time stands (an upper bound).
    best_warm = min((warm[n] for n in cores), default=0.0)
    times: dict[str, list[float]] = {n: [] for n in cores}
    racing = [n for n in cores if warm[n] <= _WARM_DROP_FACTOR * best_warm]
    start = time.perf_counter()
    for rnd in range(auto.repeat):
        for name in racing:
            times[name].append(_call(cores[name], inputs, name)[1])
        if rnd + 1 >= _MIN_ROUNDS:
            best = min(min(times[n]) for n in racing)
            racing = [n for n in racing if min(times[n]) <= _DROP_FACTOR * best]
            if time.perf_counter() - start > _LAYER_BUDGET_S:
                break
    for m in wanted:
        name = m["algorithm"]
        if times.get(name):
            m["seconds"], m["calls"] = statistics.median(times[name]), len(times[name])
        elif name in cores:
            m["seconds"], m["calls"] = warm[name], 1
        if progress is not None:
            progress.step(f"{node.op} {name}")


def choose(
    measured: dict[str, dict[str, Any]],
    auto: Auto,
    dtype: str,
    what: str,
    incumbent: str | None = None,
) -> str:
    """The fastest algorithm within the tolerance and the workspace limit;
    :class:`~ai3.AlgorithmError` listing why each was excluded when none is.

    ``incumbent`` (``'default'``'s choice for the layer) is kept unless the
    fastest beats it by :data:`SWITCH_MARGIN`: a few percent measured on a
    layer alone are within a shared machine's noise and need not hold inside
    the network, so switching for them can only lose on average."""
    fit = [m for m in measured.values() if _within(m, auto, dtype) and m["seconds"] is not None]
    if fit:
        best = min(fit, key=lambda m: m["seconds"])
        kept = next((m for m in fit if m["algorithm"] == incumbent), None)
        if kept is not None and best["seconds"] > SWITCH_MARGIN * kept["seconds"]:
            return kept["algorithm"]
        return best["algorithm"]
    reasons = []
    for m in measured.values():
        if m["unusable"] is not None:
            why = m["unusable"]
        elif auto.algorithms is not None and m["algorithm"] not in auto.algorithms:
            why = "not among the algorithms given"
        elif auto.max_workspace is not None and m["workspace_bytes"] > auto.max_workspace:
            why = f"needs {m['workspace_bytes']} bytes of workspace > max_workspace {auto.max_workspace}"
        elif m["error"] is not None and m["error"] > auto.tolerance_for(dtype):
            why = f"error {m['error']:.2e} > tolerance {auto.tolerance_for(dtype):.2e}"
        else:
            why = "not timed"
        reasons.append(f"{m['algorithm']}: {why}")
    raise AlgorithmError(f"{what}: 'auto' found no algorithm to use ({'; '.join(reasons)})")
