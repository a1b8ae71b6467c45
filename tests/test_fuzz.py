"""Property-based fuzzing of ai3 against PyTorch (``tests/fuzz_cases.py``).

The property: every case matches PyTorch, or both raise (ai3 with an
``ai3.Error``), or ai3 declines a configuration it documents as unsupported
(``fuzz_check.ACCEPTABLE``). Each case runs in a worker process
(``tests/fuzz_worker.py``), so an abort or a hang fails the case instead of
killing the test run. Hypothesis runs a fixed number of examples per family
from a fixed seed (``derandomize``); ``benches/fuzz.py`` runs long campaigns
from the same strategies.

Bugs found and not yet fixed are listed in ``tests/fuzz_known.py``: the
property skips cases that would only reach a listed abort or hang (each costs a
worker restart or a timeout) and accepts failures a listed bug explains; each
bug's reproducer runs below as ``xfail(strict=True)``, so a fix turns it into
an unexpected pass, and the entry is then removed.
"""

from __future__ import annotations

import json

import fuzz_cases
import fuzz_check
import fuzz_known
import pytest
import torch
from fuzz_worker import Worker
from hypothesis import HealthCheck, assume, given, settings

#: Examples per CI run, shared among the families by ``fuzz_cases.WEIGHTS``
#: (about a minute on two shared cores).
CI_EXAMPLES = 1500

fuzz_cases.set_conv_algorithms(fuzz_check.conv_algorithms())


@pytest.fixture(scope="session")
def worker():
    """One worker process for the whole session (restarted after an abort or a hang).

    Started here, so a worker that cannot start at all (ai3 not importable) is one
    fixture error, not a failing case for Hypothesis to shrink for many minutes.
    """
    with Worker(timeout=30.0) as w:
        yield w.start()


def _explain(case: dict, verdict: dict) -> str:
    return (
        f"verdict {verdict['verdict']}: {json.dumps({k: v for k, v in verdict.items() if k != 'verdict'})}\n"
        f"replay: python tests/fuzz_check.py '{json.dumps(case)}'"
    )


def check_case(worker: Worker, case: dict) -> dict:
    """Runs ``case``; fails unless its verdict is acceptable or a known bug explains it."""
    verdict = worker.run(case)
    if verdict["verdict"] not in fuzz_check.ACCEPTABLE:
        bug = fuzz_known.explain(case, verdict)
        assert bug is not None, _explain(case, verdict)
    return verdict


@pytest.mark.parametrize("family", fuzz_cases.FAMILIES)
def test_matches_pytorch(family, worker):
    @settings(
        max_examples=fuzz_cases.split(CI_EXAMPLES)[family],
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=fuzz_cases.cases(family))
    def prop(case):
        assume(fuzz_known.too_costly(case) is None)
        check_case(worker, case)

    prop()


class KnownBugFailure(AssertionError):
    """A reproducer failed the way its listed bug says (the expected failure)."""


@pytest.fixture(scope="module")
def quick_worker():
    """A worker with a short timeout for the reproducers (one of them hangs)."""
    with Worker(timeout=10.0) as w:
        yield w


# One test per open bug in tests/fuzz_known.py; none is defined while the list is
# empty (an empty parametrization would show as a skipped test).
if fuzz_known.KNOWN_BUGS:

    @pytest.mark.parametrize(
        "name",
        [
            pytest.param(
                name,
                marks=pytest.mark.xfail(strict=True, raises=KnownBugFailure, reason=bug.summary),
            )
            for name, bug in fuzz_known.KNOWN_BUGS.items()
        ],
    )
    def test_known_bug_reproducer(name, quick_worker):
        """The minimal reproducer of a listed bug, run through a worker. It is expected to
        fail the way the bug says; when the bug is fixed it passes (strict: reported as a
        failure, so the entry in ``tests/fuzz_known.py`` gets removed); failing any other
        way is a real failure."""
        bug = fuzz_known.KNOWN_BUGS[name]
        verdict = quick_worker.run(bug.repro)
        if verdict["verdict"] in fuzz_check.ACCEPTABLE:
            return
        if fuzz_known.explain(bug.repro, verdict) is bug:
            raise KnownBugFailure(_explain(bug.repro, verdict))
        raise AssertionError(f"{name} fails another way: {_explain(bug.repro, verdict)}")


# ---- the harness can fail ---------------------------------------------------------------------


def test_harness_catches_abort_hang_and_exit():
    with Worker(timeout=3.0, test_kinds=True) as w:
        assert w.run({"kind": "abort"})["verdict"] == "abort"
        assert w.run({"kind": "abort"})["signal"] == "SIGABRT"
        hang = w.run({"kind": "hang"})
        assert hang["verdict"] == "hang" and hang["seconds"] >= 3.0
        exited = w.run({"kind": "exit"})
        assert (exited["verdict"], exited["returncode"], exited["signal"]) == ("abort", 3, None)
        crashed = w.run({"kind": "raise"})
        assert crashed["verdict"] == "abort" and crashed["returncode"] == 1
        assert crashed["crash"] == "RuntimeError: a bug in the harness", crashed
        relu = {"kind": "activation", "name": "relu", "form": "module", "params": {}, "shape": [2, 3],
                "dtype": "float32", "layout": "contiguous", "mode": "convert", "context": "no_grad",
                "scale": 1.0, "specials": False, "seed": 0, "big": False, "algorithm": "direct"}  # fmt: skip
        w.timeout = 120.0  # this worker imports torch and ai3 at its first real case
        assert w.run(relu)["verdict"] == "match", "the worker did not come back after the failures"
        assert w.starts == 6


def test_checker_catches_wrong_answers_and_foreign_exceptions(monkeypatch):
    case = {"kind": "conv2d", "form": "module", "batched": True, "n": 2, "in_c": 3, "out_c": 4,
            "hw": [6, 5], "kernel": 3, "stride": 1, "padding": 1, "dilation": 1, "groups": 1,
            "bias": True, "padding_mode": "zeros", "algorithm": "direct", "dtype": "float64",
            "layout": "sliced", "mode": "convert", "context": "no_grad", "scale": 1.0,
            "specials": False, "seed": 3, "big": False}  # fmt: skip
    assert fuzz_check.run_case(case)["verdict"] == "match"
    run_ai3 = fuzz_check.run_ai3

    def off_by(delta):
        return lambda *a: [y + delta for y in run_ai3(*a)]

    monkeypatch.setattr(fuzz_check, "run_ai3", off_by(1e-6))
    assert fuzz_check.run_case(case)["verdict"] == "mismatch"
    monkeypatch.setattr(fuzz_check, "run_ai3", off_by(torch.tensor(float("nan"))))
    assert "NaN" in fuzz_check.run_case(case)["detail"]

    def foreign(*a):
        raise KeyError("not an ai3.Error")

    monkeypatch.setattr(fuzz_check, "run_ai3", foreign)
    assert fuzz_check.run_case(case)["verdict"] == "non_ai3_exception"

    def modifies(case, net, inputs, algos):
        inputs[0].mul_(2)
        return run_ai3(case, net, inputs, algos)

    monkeypatch.setattr(fuzz_check, "run_ai3", modifies)
    assert fuzz_check.run_case(case)["verdict"] == "input_modified"
