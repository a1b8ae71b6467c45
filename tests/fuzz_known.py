"""Bugs the fuzzer found that are not fixed yet, each with a minimal reproducer.

``tests/test_fuzz.py`` runs every reproducer as ``xfail(strict=True)``: when a
fix lands the reproducer passes, the test reports an unexpected pass, and the
entry here is deleted. Until then the property test accepts a failing case
that an entry's ``matches`` explains, and skips cases an entry's ``costly``
flags (an abort costs a worker restart, a hang its timeout).
``benches/fuzz.py`` counts every failure, listed or not.

Replay a reproducer in this process (with its backtrace)::

    PYTHONPATH=python python tests/fuzz_check.py "$(python -c 'import sys; sys.path.insert(0, "tests"); import fuzz_known, json; print(json.dumps(fuzz_known.KNOWN_BUGS["linear_zero_features"].repro))')"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: Fields a reproducer takes unless it says otherwise.
_BASE = {
    "dtype": "float32",
    "layout": "contiguous",
    "mode": "convert",
    "context": "no_grad",
    "scale": 1.0,
    "specials": False,
    "seed": 0,
    "big": False,
    "algorithm": "default",
}


def conv(**kw) -> dict:
    """A conv2d case: ``nn.Conv2d(1, 1, 3)`` on a 1x1x5x5 input unless ``kw`` says otherwise."""
    return {**_BASE, "kind": "conv2d", "form": "module", "batched": True, "n": 1, "in_c": 1,
            "out_c": 1, "hw": [5, 5], "kernel": 3, "stride": 1, "padding": 0, "dilation": 1,
            "groups": 1, "bias": False, "padding_mode": "zeros", **kw}  # fmt: skip


def case(kind: str, **kw) -> dict:
    """A case of ``kind`` with the default fields."""
    return {**_BASE, "kind": kind, **kw}


@dataclass(frozen=True)
class KnownBug:
    """A bug: what it is, a minimal case that shows it, which failures it explains and
    (optionally) which cases the CI property skips because of it."""

    summary: str
    repro: dict
    matches: Callable[[dict, dict], bool]
    costly: Callable[[dict], bool] | None = None


def _err(v: dict) -> str:
    return v.get("ai3_error", "")


KNOWN_BUGS: dict[str, KnownBug] = {
    # None open: every bug the fuzzer found so far is fixed, each with a regression
    # test (tests/test_fuzz_regressions.py, tests/test_memory.py, test_first_contact.py).
}


def explain(case: dict, verdict: dict) -> KnownBug | None:
    """The listed bug that explains a failing ``verdict`` of ``case``, if any."""
    return next((b for b in KNOWN_BUGS.values() if b.matches(case, verdict)), None)


def too_costly(case: dict) -> str | None:
    """The name of a listed bug that makes ``case`` an abort or a hang, if any."""
    return next((n for n, b in KNOWN_BUGS.items() if b.costly and b.costly(case)), None)
