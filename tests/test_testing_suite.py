"""The packaged correctness suite (``ai3.testing``, ``python -m ai3 test``): it passes on
ai3's own algorithms, it can fail, and it rejects bad arguments and unavailable algorithms."""

from __future__ import annotations

import io
import subprocess
import sys

import ai3
import pytest
import torch
from ai3 import testing
from ai3.__main__ import main


def _custom_row(op: str) -> dict:
    return next(r for r in ai3.algorithm_table() if r["op"] == op and r["algorithm"] == "custom")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_quick_conv2d_direct_and_gemm_pass(dtype):
    out = io.StringIO()
    report = testing.run(["conv2d"], ["direct", "gemm"], dtype=dtype, quick=True, stream=out)
    assert report.results, "the quick conv2d grid ran no case"
    assert {r.algorithm for r in report.results} == {"direct", "gemm"}
    assert {r.via for r in report.results} == {"convert", "swap"}
    assert all(r.status == testing.PASS for r in report.results), report.failures
    assert report.ok and report.exit_code == 0
    assert out.getvalue().rstrip().endswith("OK")


def test_unsupported_is_not_a_failure():
    report = testing.run(["conv2d"], ["winograd"], quick=True, stream=io.StringIO())
    unsupported = [r for r in report.results if r.status == testing.UNSUPPORTED]
    assert unsupported, "winograd should decline the 5x5 and strided quick cases"
    assert all("winograd" in r.message for r in unsupported)
    assert report.ok


def test_perturbed_reference_fails(monkeypatch, capsys):
    """With the reference off by 1e-2, every case is a FAIL naming the error and the
    tolerance, and ``python -m ai3 test`` exits 1."""
    reference = testing._reference
    monkeypatch.setattr(testing, "_reference", lambda m, x: reference(m, x) + 1e-2)
    report = testing.run(["conv2d"], ["direct"], quick=True, stream=io.StringIO())
    assert report.results and all(r.status == testing.FAIL for r in report.results)
    assert "max |ai3 - torch| = 1.000e-02" in report.results[0].message
    assert "tolerance" in report.results[0].message
    assert not report.ok and report.exit_code == 1

    assert main(["test", "--op", "relu", "--quick"]) == 1
    printed = capsys.readouterr().out
    assert "FAIL" in printed and "FAILED" in printed


def test_wrong_algorithm_and_exceptions_are_failures(monkeypatch):
    """A stand-in algorithm that drops the bias, and one that raises on one case: each bad
    case is a FAIL with its message, and the other cases still run."""
    convert_path = testing._PATHS["convert"]

    def no_bias(op, algorithm, module, x):
        if module.bias is None:
            return convert_path(op, algorithm, module, x)
        return torch.nn.functional.conv2d(x, module.weight, None, module.stride, module.padding,
                                          module.dilation, module.groups)  # fmt: skip

    monkeypatch.setitem(testing._PATHS, "convert", no_bias)
    cases = testing.cases("conv2d")
    report = testing.run(["conv2d"], ["gemm"], stream=io.StringIO())
    convert_results = [r for r in report.results if r.via == "convert"]
    assert len(convert_results) == len(cases)
    with_bias = {c.description for c in cases if dict(c.kwargs).get("bias", True)}
    for r in convert_results:
        assert r.status == (testing.FAIL if r.case in with_bias else testing.PASS), r
    assert all(r.status == testing.PASS for r in report.results if r.via == "swap")
    assert report.exit_code == 1

    def raises_on_strided(op, algorithm, module, x):
        if module.stride != (1, 1):
            raise RuntimeError("kernel exploded")
        return convert_path(op, algorithm, module, x)

    monkeypatch.setitem(testing._PATHS, "convert", raises_on_strided)
    quick = testing.cases("conv2d", quick=True)
    strided = [c.description for c in quick if dict(c.kwargs).get("stride", 1) != 1]
    assert 0 < len(strided) < len(quick)
    report = testing.run(["conv2d"], ["direct"], quick=True, stream=io.StringIO())
    assert [r.case for r in report.failures] == strided
    assert all(r.message == "RuntimeError: kernel exploded" for r in report.failures)
    assert len(report.results) == 2 * len(quick)
    passed = [r for r in report.results if r.status == testing.PASS]
    assert len(passed) == len(report.results) - len(strided)


def test_input_modified_in_place_fails(monkeypatch):
    convert_path = testing._PATHS["convert"]

    def scribbles(op, algorithm, module, x):
        y = convert_path(op, algorithm, module, x)
        x.mul_(2)
        return y

    monkeypatch.setitem(testing._PATHS, "convert", scribbles)
    report = testing.run(["relu"], quick=True, stream=io.StringIO())
    bad = [r for r in report.results if r.via == "convert"]
    assert bad and all(r.message == "the input was modified in place" for r in bad)


def test_unknown_op_exits_2_naming_valid_ops():
    proc = subprocess.run(
        [sys.executable, "-m", "ai3", "test", "--op", "nosuchop"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "nosuchop" in proc.stderr
    for op in testing.operations():
        assert op in proc.stderr


def test_unknown_algorithm_exits_2(capsys):
    assert main(["test", "--op", "relu", "--algorithm", "gemm"]) == 2
    err = capsys.readouterr().err
    assert "relu has no algorithm 'gemm'" in err and "direct" in err
    with pytest.raises(ai3.InvalidArgumentError, match="unknown algorithm 'nosuch'"):
        testing.run(algorithms=["nosuch"], stream=io.StringIO())


def test_requested_unavailable_custom_is_an_error(capsys):
    row = _custom_row("conv2d")
    if row["unavailable"] is None:
        pytest.skip("a custom conv2d is compiled into this build, so it is not unavailable")
    code = main(["test", "--op", "conv2d", "--algorithm", "custom"])
    out = capsys.readouterr().out
    assert code != 0
    assert row["unavailable"] in out
    assert "unavailable" in out and "FAILED" in out


def test_unrequested_unavailable_is_reported_not_failed():
    # The suite runs on the CPU: linear's cuBLAS row does not make its CPU gemm unavailable.
    unavailable = {
        (r["op"], r["algorithm"]): r["unavailable"]
        for r in ai3.algorithm_table()
        if r["op"] in ("linear", "relu") and r["unavailable"] and r["device"] == "cpu"
    }
    out = io.StringIO()
    report = testing.run(["linear", "relu"], quick=True, stream=out)
    assert {(u.op, u.algorithm): u.reason for u in report.unavailable} == unavailable
    assert not any(u.requested for u in report.unavailable)
    assert report.ok
    text = out.getvalue()
    # Each reason is given once, in a numbered note under the table ("[1] relu, linear: ..."),
    # with the operation's own name written <op> when several operations share it.
    notes = {}
    for line in text.splitlines():
        head, sep, reason = line.strip().partition(": ")
        if line.startswith("  [") and sep:
            number, _, ops = head.partition(" ")
            notes.update({op: (number, reason) for op in ops.split(", ")})
    for (op, algo), reason in unavailable.items():
        number, note = notes[op]
        assert note.replace("<op>", op) == reason
        row = next(line for line in text.splitlines() if line.split()[:2] == [op, algo])
        assert row.endswith(f"unavailable, note {number}")
        assert text.count(note) == 1


def test_verbose_prints_one_line_per_result():
    out = io.StringIO()
    report = testing.run(["flatten"], ["direct"], quick=True, verbose=True, stream=out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("PASS")]
    assert len(lines) == len(report.results) > 0


def test_grid_covers_the_required_hyperparameters():
    conv = [dict(c.kwargs) | {"args": c.args, "x": c.input_shape} for c in testing.cases("conv2d")]
    kernels = {c["args"][2] for c in conv}
    assert {1, 3, 5, (1, 3)} <= kernels
    assert {1, 3} <= {c["args"][0] for c in conv} and {1, 3} <= {c["args"][1] for c in conv}
    assert {2, (2, 1)} <= {c.get("stride", 1) for c in conv}
    assert {0, 1, (1, 2), "same"} <= {c.get("padding", 0) for c in conv}
    assert 2 in {c.get("dilation", 1) for c in conv}
    assert any(c.get("groups", 1) == c["args"][0] > 1 for c in conv)  # depthwise
    assert any(1 < c.get("groups", 1) < c["args"][0] for c in conv)
    assert {True, False} <= {c.get("bias", True) for c in conv}
    assert {1, 2} <= {c["x"][0] for c in conv if len(c["x"]) == 4}
    assert any(len(c["x"]) == 3 for c in conv)
    for op in testing.operations():
        assert 0 < len(testing.cases(op, quick=True)) < len(testing.cases(op))


def test_gpu_only_algorithms_are_reported_unavailable_on_the_cpu():
    out = io.StringIO()
    report = testing.run(["conv2d"], ["implicit gemm", "gemm"], quick=True, stream=out)
    (gpu,) = report.unavailable
    assert (gpu.op, gpu.algorithm, gpu.requested) == ("conv2d", "implicit gemm", True)
    assert gpu.reason.startswith("runs on cuda only: this build of ai3 has no CUDA backend")
    assert any(r.algorithm == "gemm" and r.status == testing.PASS for r in report.results)
