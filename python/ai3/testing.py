"""A packaged correctness suite for ai3's algorithms, and for your own.

``python -m ai3 test`` runs every operation that can be selected per
algorithm (conv2d, linear, relu, maxpool2d, avgpool2d, adaptiveavgpool2d,
flatten) over a grid of hyperparameters, for every algorithm in the registry,
and compares each result with PyTorch's::

    python -m ai3 test                                   # everything, float32
    python -m ai3 test --op conv2d --algorithm custom    # your C++ conv2d
    python -m ai3 test --dtype float64 --quick -v        # a small subset, one line per case

Each case builds the PyTorch module (random weights, seeded per case), wraps
it in a one-module ``nn.Sequential``, runs it through
``ai3.convert(seq, {op: algorithm})`` and through
``ai3.swap_operation(op, seq, algorithm)``, and compares both outputs with
PyTorch's output computed at run time in float64 from the same inputs and
weights. An element passes when ``|ai3 - torch| <= tol * max(max|torch|, 1) +
tol * |torch|`` with ``tol`` 1e-4 for float32 and 1e-10 for float64 (the
tolerances of ai3's own tests); NaN and infinities must sit where PyTorch puts
them.

Outcomes of a case:

- ``PASS``;
- ``FAIL``: a mismatch (the message gives the largest error and the tolerance),
  an input modified in place, or any exception other than
  :class:`ai3.AlgorithmError` (its type and message); one failing case never
  stops the others;
- ``UNSUPPORTED``: ai3 raised :class:`ai3.AlgorithmError`, i.e. the algorithm
  declined this configuration (``winograd`` on a 5x5 kernel); not a failure.

An algorithm that is not available in this build (``custom`` when no C++ was
compiled in) is reported as ``unavailable`` with a numbered note under the
table giving the reason once; that is an error only when it was asked for by
name.

The same from Python::

    report = ai3.testing.run(ops=["conv2d"], algorithms=["custom"])
    assert report.ok, report.failures
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch
from torch import nn

from . import _core
from ._test_grid import GRIDS, Case, cases, operations
from .algorithms import algorithm_table
from .convert import convert
from .errors import AlgorithmError, InvalidArgumentError
from .swap import swap_operation

__all__ = [
    "PASS",
    "FAIL",
    "UNSUPPORTED",
    "TOLERANCES",
    "Case",
    "CaseResult",
    "Unavailable",
    "Report",
    "GRIDS",
    "cases",
    "operations",
    "compare",
    "run",
    "add_arguments",
    "run_cli",
    "main",
]

#: A case's outcome: it matched PyTorch.
PASS = "PASS"
#: A case's outcome: a mismatch, or an exception other than :class:`ai3.AlgorithmError`.
FAIL = "FAIL"
#: A case's outcome: the algorithm raised :class:`ai3.AlgorithmError` for this configuration.
UNSUPPORTED = "UNSUPPORTED"

#: The tolerance per dtype, used both as ``rtol`` and, scaled by ``max(max|expected|, 1)``,
#: as ``atol``.
TOLERANCES: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float64: 1e-10}

_DTYPE_NAMES = {"float32": torch.float32, "float64": torch.float64}


# ---- printing unavailable reasons --------------------------------------------------------------

_OP = "<op>"


def _reason_notes(pairs: Iterable[tuple[str, str]]) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Numbers each distinct unavailability reason once, for notes under a table.

    ``pairs``: (operation, reason). Reasons that differ only by the operation's own name
    (``custom conv2d is not implemented ...``) share one note, in which the name reads
    ``<op>``. Returns the note number of each pair and the note lines
    (``[1] conv2d, linear: <reason>``); a note for one operation keeps its reason verbatim.
    """
    groups: dict[str, tuple[list[str], str]] = {}  # template -> (operations, first reason)
    template_of: dict[tuple[str, str], str] = {}
    for op, reason in pairs:
        template = re.sub(rf"\b{re.escape(op)}\b", _OP, reason)
        ops, _ = groups.setdefault(template, ([], reason))
        if op not in ops:
            ops.append(op)
        template_of[(op, reason)] = template
    number = {t: i + 1 for i, t in enumerate(groups)}
    notes = [
        f"[{number[t]}] {', '.join(ops)}: {first if len(ops) == 1 else t}"
        for t, (ops, first) in groups.items()
    ]
    return {pair: number[t] for pair, t in template_of.items()}, notes


# ---- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case for one algorithm, reached one way (``via``: ``'convert'`` or
    ``'swap'``). ``status`` is :data:`PASS`, :data:`FAIL` or :data:`UNSUPPORTED`;
    ``message`` says why for the latter two."""

    op: str
    algorithm: str
    case: str
    via: str
    status: str
    message: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        """One line of output: status, operation, algorithm, path, case and message."""
        text = f"{self.status:<11} {self.op} [{self.algorithm}] via {self.via}: {self.case}"
        return f"{text}\n    {self.message}" if self.message else text


@dataclass(frozen=True)
class Unavailable:
    """An algorithm the registry lists but this build cannot run, and why.
    ``requested``: it was named explicitly, which makes the run fail."""

    op: str
    algorithm: str
    reason: str
    requested: bool


@dataclass
class Report:
    """Everything a run found: per-case results, unavailable algorithms, the time taken."""

    dtype: torch.dtype
    results: list[CaseResult] = field(default_factory=list)
    unavailable: list[Unavailable] = field(default_factory=list)
    seconds: float = 0.0
    #: The (operation, algorithm) pairs in the order they were planned, for the summary.
    order: list[tuple[str, str]] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseResult]:
        """The results with status :data:`FAIL`."""
        return [r for r in self.results if r.status == FAIL]

    @property
    def requested_unavailable(self) -> list[Unavailable]:
        """Algorithms asked for by name that this build cannot run."""
        return [u for u in self.unavailable if u.requested]

    @property
    def ok(self) -> bool:
        """No case failed and every algorithm asked for by name was available."""
        return not self.failures and not self.requested_unavailable

    @property
    def exit_code(self) -> int:
        """0 when :attr:`ok`, else 1."""
        return 0 if self.ok else 1

    def summary(self) -> list[dict[str, Any]]:
        """Per (operation, algorithm): counts of passed, failed and unsupported results, or
        the reason it is unavailable."""

        def empty(op: str, algorithm: str) -> dict[str, Any]:
            return {"op": op, "algorithm": algorithm, PASS: 0, FAIL: 0, UNSUPPORTED: 0}

        rows = {key: empty(*key) for key in self.order}
        for r in self.results:
            rows.setdefault((r.op, r.algorithm), empty(r.op, r.algorithm))[r.status] += 1
        for u in self.unavailable:
            rows[(u.op, u.algorithm)] = {
                "op": u.op,
                "algorithm": u.algorithm,
                "unavailable": u.reason,
            }
        return list(rows.values())

    def format_summary(self) -> str:
        """The summary as a text table, each unavailability reason once in a numbered note
        under it, and a closing verdict."""
        note_of, notes = _reason_notes((u.op, u.reason) for u in self.unavailable)
        lines = [
            f"{'operation':<18} {'algorithm':<10} {'passed':>6} {'failed':>6} {'unsupported':>11}"
        ]
        for row in self.summary():
            head = f"{row['op']:<18} {row['algorithm']:<10}"
            if "unavailable" in row:
                number = note_of[(row["op"], row["unavailable"])]
                lines.append(f"{head} unavailable, note [{number}]")
            else:
                lines.append(f"{head} {row[PASS]:>6} {row[FAIL]:>6} {row[UNSUPPORTED]:>11}")
        if notes:
            lines.append("unavailable in this build:")
            lines += [f"  {note}" for note in notes]
        counts = {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, UNSUPPORTED)}
        dtype = str(self.dtype).replace("torch.", "")
        lines.append(
            f"{len(self.results)} results ({dtype}): {counts[PASS]} passed, {counts[FAIL]} failed, "
            f"{counts[UNSUPPORTED]} unsupported in {self.seconds:.1f} s"
        )
        for u in self.requested_unavailable:
            number = note_of[(u.op, u.reason)]
            lines.append(f"error: {u.op} algorithm {u.algorithm!r} is unavailable [{number}]")
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


# ---- running -----------------------------------------------------------------------------------


def compare(got: Any, expected: torch.Tensor, dtype: torch.dtype) -> str | None:
    """``None`` when ``got`` matches the reference ``expected``, else what is wrong.

    ``got`` must be a tensor of ``expected``'s shape in ``dtype``; NaN and infinities must
    be where ``expected`` has them; every finite element must satisfy
    ``|got - expected| <= tol * max(max|expected|, 1) + tol * |expected|``
    with ``tol = TOLERANCES[dtype]``.
    """
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, expected a torch.Tensor"
    if tuple(got.shape) != tuple(expected.shape):
        return f"shape {list(got.shape)}, expected {list(expected.shape)}"
    if got.dtype != dtype:
        return f"dtype {got.dtype}, expected {dtype}"
    g = got.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    if not torch.equal(g.isnan(), e.isnan()):
        return (
            f"NaN in {int(g.isnan().sum())} element(s), PyTorch has {int(e.isnan().sum())}; "
            "they are not in the same places"
        )
    finite = e.isfinite()
    special = ~finite & ~e.isnan()
    if not torch.equal(g[special], e[special]) or not bool(g[finite].isfinite().all()):
        return "infinities differ from PyTorch's"
    if not bool(finite.any()):
        return None
    tol = TOLERANCES[dtype]
    ef, gf = e[finite], g[finite]
    atol = tol * max(float(ef.abs().max()), 1.0)
    err = (gf - ef).abs()
    excess = err - (atol + tol * ef.abs())
    if float(excess.max()) <= 0:
        return None
    worst = int(excess.argmax())
    index = tuple(int(i) for i in finite.nonzero()[worst])
    return (
        f"max |ai3 - torch| = {float(err.max()):.3e}, tolerance {atol:.1e} + {tol:.0e} * |torch|; "
        f"worst at {list(index)}: got {float(gf[worst]):.8g}, expected {float(ef[worst]):.8g} "
        f"({int((excess > 0).sum())} of {ef.numel()} elements outside)"
    )


def _reference(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """PyTorch's output for ``x``, computed in float64 on a copy of ``module``."""
    with torch.no_grad():
        return copy.deepcopy(module).to(torch.float64)(x.to(torch.float64))


def _via_convert(op: str, algorithm: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model = convert(nn.Sequential(copy.deepcopy(module)), {op: algorithm}, dtype=x.dtype)
    return model(x)


def _via_swap(op: str, algorithm: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    original = copy.deepcopy(module)
    seq = swap_operation(op, nn.Sequential(original), algorithm)
    if seq[0] is original:
        raise AssertionError(
            f"swap_operation({op!r}, ..., {algorithm!r}) did not replace {original}"
        )
    with torch.no_grad():
        return seq(x)


_PATHS: dict[str, Callable[[str, str, nn.Module, torch.Tensor], torch.Tensor]] = {
    "convert": _via_convert,
    "swap": _via_swap,
}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int64 if x.dtype == torch.float64 else torch.int32)


def _run_case(
    case: Case,
    algorithm: str,
    via: str,
    dtype: torch.dtype,
    references: dict[tuple[Case, torch.dtype], torch.Tensor],
) -> CaseResult:
    start = time.perf_counter()

    def result(status: str, message: str = "") -> CaseResult:
        seconds = time.perf_counter() - start
        return CaseResult(case.op, algorithm, case.description, via, status, message, seconds)

    try:
        with warnings.catch_warnings():
            # PyTorch's own note on even kernels with padding='same'; not about ai3.
            warnings.filterwarnings("ignore", message="Using padding='same' with even kernel")
            module, x = case.build(dtype)
            if (case, dtype) not in references:
                references[(case, dtype)] = _reference(module, x)
            expected = references[(case, dtype)]
            before = x.clone()
            got = _PATHS[via](case.op, algorithm, module, x)
        problem = compare(got, expected, dtype)
        if problem is None and not torch.equal(_bits(x), _bits(before)):
            problem = "the input was modified in place"
    except AlgorithmError as e:
        return result(UNSUPPORTED, str(e))
    except Exception as e:  # any other error is this case's failure, not the run's
        return result(FAIL, f"{type(e).__name__}: {e}")
    return result(PASS) if problem is None else result(FAIL, problem)


def _plan(
    ops: Iterable[str] | None, algorithms: Iterable[str] | None
) -> list[tuple[str, str, str | None]]:
    """(op, algorithm, unavailable reason) to run; raises InvalidArgumentError for bad names."""
    selectable = dict(_core.selectable())
    testable = operations()
    if ops is not None:
        ops = list(dict.fromkeys(ops))
        for op in ops:
            if op not in selectable:
                raise InvalidArgumentError(
                    f"unknown operation {op!r}; valid operations: {', '.join(testable)}"
                )
            if op not in testable:
                raise InvalidArgumentError(
                    f"the suite has no cases for {op!r}; valid operations: {', '.join(testable)}"
                )
    chosen_ops = list(ops) if ops is not None else testable
    # The suite runs on the CPU: an algorithm counts by its CPU row; one with
    # rows on other devices only is reported unavailable, with why.
    rows: dict[str, list[tuple[str, str | None]]] = {op: [] for op in chosen_ops}
    elsewhere: dict[tuple[str, str], str] = {}
    for row in algorithm_table():
        if row["op"] not in rows:
            continue
        if row["device"] == "cpu":
            rows[row["op"]].append((row["algorithm"], row["unavailable"]))
        else:
            why = row["unavailable"] or "the suite runs on the CPU"
            elsewhere.setdefault(
                (row["op"], row["algorithm"]), f"runs on {row['device']} only: {why}"
            )
    for (op, algo), why in elsewhere.items():
        if all(algo != a for a, _ in rows[op]):
            rows[op].append((algo, why))
    if algorithms is None:
        return [(op, algo, why) for op in chosen_ops for algo, why in rows[op]]

    algorithms = list(dict.fromkeys(algorithms))
    valid = {op: [n for n in selectable[op] if n != "torch"] for op in chosen_ops}
    for algo in algorithms:
        if not any(algo in names for names in valid.values()):
            listing = "; ".join(f"{op}: {', '.join(names)}" for op, names in valid.items())
            known = any(algo in names for names in selectable.values())
            if not known:
                what = "unknown algorithm"
            elif len(chosen_ops) == 1:
                what = f"{chosen_ops[0]} has no algorithm"
            else:
                what = f"none of {', '.join(chosen_ops)} has an algorithm"
            raise InvalidArgumentError(f"{what} {algo!r}; valid algorithms: {listing}")
    plan = []
    for op in chosen_ops:
        picked = [a for a in algorithms if a in valid[op]]
        if not picked and ops is not None:
            raise InvalidArgumentError(
                f"{op} has none of the algorithms {', '.join(algorithms)}; "
                f"its algorithms: {', '.join(valid[op])}"
            )
        reasons = dict(rows[op])
        plan += [(op, a, reasons.get(a)) for a in picked]
    return plan


def run(
    ops: Iterable[str] | None = None,
    algorithms: Iterable[str] | None = None,
    dtype: torch.dtype | str = torch.float32,
    quick: bool = False,
    verbose: bool = False,
    stream: TextIO | None = None,
) -> Report:
    """Runs the suite and returns its :class:`Report`.

    ``ops``: operation names (default: every one the suite covers). ``algorithms``:
    algorithm names, applied to each operation that has them (default: every algorithm in
    the registry for each operation; naming one makes its unavailability an error).
    ``dtype``: ``torch.float32`` or ``torch.float64`` (or their names). ``quick``: a small
    subset of the cases. ``verbose``: one line per result on ``stream``, instead of failures
    only. ``stream``: where to write (default: ``sys.stdout`` at the time of the call; pass
    ``io.StringIO()`` to keep quiet); the summary table is written last.

    Raises :class:`ai3.InvalidArgumentError` for unknown operation, algorithm or dtype names.
    The global random state is restored afterwards.
    """
    if isinstance(dtype, str):
        if dtype.replace("torch.", "") not in _DTYPE_NAMES:
            raise InvalidArgumentError(f"dtype must be float32 or float64, got {dtype!r}")
        dtype = _DTYPE_NAMES[dtype.replace("torch.", "")]
    if dtype not in TOLERANCES:
        raise InvalidArgumentError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    requested = algorithms is not None
    plan = _plan(ops, algorithms)

    out = sys.stdout if stream is None else stream

    def write(text: str) -> None:
        print(text, file=out, flush=True)

    report = Report(dtype, order=[(op, algorithm) for op, algorithm, _ in plan])
    references: dict[tuple[Case, torch.dtype], torch.Tensor] = {}
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        for op, algorithm, reason in plan:
            if reason is not None:
                report.unavailable.append(Unavailable(op, algorithm, reason, requested))
                if verbose or requested:
                    write(f"UNAVAILABLE {op} [{algorithm}] (why: in the notes under the summary)")
                continue
            for case in cases(op, quick):
                for via in _PATHS:
                    res = _run_case(case, algorithm, via, dtype, references)
                    report.results.append(res)
                    if verbose or res.status == FAIL:
                        write(res.line())
    report.seconds = time.perf_counter() - start
    write(report.format_summary())
    return report


# ---- command line ------------------------------------------------------------------------------

#: The help text of ``python -m ai3 test``, wrapped to 79 columns (printed as it is).
DESCRIPTION = textwrap.fill(
    "Runs ai3's correctness suite: every case of each operation's hyperparameter grid, for "
    "each algorithm, through ai3.convert and ai3.swap_operation, compared with PyTorch. "
    "Exit code 0: all passed; 1: a case failed or a named algorithm is unavailable; "
    "2: bad arguments.",
    width=79,
)

#: The examples under ``python -m ai3 test --help``, laid out by hand.
EXAMPLES = """\
examples:
  python -m ai3 test                                  everything, float32
  python -m ai3 test --op conv2d --algorithm custom   your C++ conv2d
  python -m ai3 test --dtype float64 --quick -v       a small subset, one line per case
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options of ``python -m ai3 test`` to ``parser``."""
    parser.add_argument(
        "--op", dest="ops", action="extend", nargs="+", metavar="OP",
        help=f"operations to test (default: all of {', '.join(GRIDS)})",
    )  # fmt: skip
    parser.add_argument(
        "--algorithm", dest="algorithms", action="extend", nargs="+", metavar="ALGO",
        help="algorithms to test (default: every one in the registry for each operation); "
        "one named here that this build lacks is an error",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=list(_DTYPE_NAMES), default="float32",
        help="the dtype ai3 computes in (default: float32)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a small subset of the cases")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")


def run_cli(args: argparse.Namespace, stream: TextIO | None = None) -> int:
    """Runs the suite for parsed ``python -m ai3 test`` options; returns the exit code
    (0: all passed, 1: a failure or a requested algorithm unavailable, 2: bad names)."""
    stream = sys.stdout if stream is None else stream
    try:
        report = run(args.ops, args.algorithms, args.dtype, args.quick, args.verbose, stream)
    except InvalidArgumentError as e:
        print(f"python -m ai3 test: error: {e}", file=sys.stderr)
        return 2
    return report.exit_code


def main(argv: list[str] | None = None) -> int:
    """``python -m ai3 test`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m ai3 test",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))
