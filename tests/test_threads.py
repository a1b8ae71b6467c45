"""ai3's thread count: follows torch by default, AI3_NUM_THREADS or
ai3.set_num_threads fix it; results do not depend on it."""

from __future__ import annotations

import os
import subprocess
import sys

import ai3
import pytest
import torch
from conftest import assert_close
from torch import nn


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    ai3.set_num_threads(None)
    torch.set_num_threads(before)


def test_follows_torch_by_default(restore_threads):
    ai3.set_num_threads(None)
    torch.set_num_threads(1)
    assert ai3.get_num_threads() == 1
    torch.set_num_threads(2)
    assert ai3.get_num_threads() == 2


@pytest.mark.parametrize("n", [1, 2, 3])
def test_results_do_not_depend_on_the_count(n, restore_threads):
    net = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 8, 3)).eval()
    x = torch.randn(3, 16, 20, 20)
    with torch.no_grad():
        expected = net(x)
    ai3.set_num_threads(n)
    assert ai3.get_num_threads() == n
    for algo in ("direct", "smm", "gemm", "winograd"):
        assert_close(ai3.convert(net, {"conv2d": algo})(x), expected)


def test_bad_counts_are_rejected(restore_threads):
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ai3.InvalidArgumentError):
            ai3.set_num_threads(bad)


def _printed(code: str, **env: str) -> str:
    """What a fresh interpreter running ``code`` with ``env`` added prints."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_environment_variable_fixes_the_count():
    code = "import torch, ai3; torch.set_num_threads(2); print(ai3.get_num_threads())"
    assert _printed(code, AI3_NUM_THREADS="1") == "1"
    env = {**os.environ, "AI3_NUM_THREADS": "1"}
    env["AI3_NUM_THREADS"] = "zero"
    bad = subprocess.run(
        [sys.executable, "-c", "import ai3"], env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "AI3_NUM_THREADS" in bad.stderr


def _torch_uses_openmp() -> bool:
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


@pytest.mark.skipif(
    not (_torch_uses_openmp() and sys.platform.startswith("linux")),
    reason="parking applies to PyTorch builds whose CPU backend is OpenMP, found through /proc",
)
def test_parks_torch_openmp_threads():
    from ai3 import _core

    assert _core._parks_openmp()
    # Work large enough to run parked, right after PyTorch's parallel work.
    net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(4, 8, 40, 40)
    model = ai3.convert(net)
    swapped = ai3.swap_conv2d(nn.Sequential(nn.BatchNorm2d(8).eval(), *net))
    with torch.no_grad():
        expected = net(x)
        for _ in range(3):
            assert_close(model(x), expected)
            assert_close(
                swapped(x),
                net(
                    nn.functional.batch_norm(
                        x, swapped[0].running_mean, swapped[0].running_var, eps=swapped[0].eps
                    )
                ),
            )
    with pytest.raises(ai3.ShapeError, match="conv2d"):
        model(torch.randn(4, 3, 40, 40))


def _script(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter; a hang fails the test instead of stalling the run."""
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout} s; output so far:\n{e.stdout}\n{e.stderr}")


#: Set-up shared by the thread and fork scripts: a converted network, a swapped
#: one and a plain conv, their PyTorch answers, and PyTorch's OpenMP team busy.
_SETUP = """
import copy, os, sys, threading
import torch, ai3
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1))
net = net.eval()
x = torch.randn(2, 8, 24, 24)
a = torch.randn(384, 384)
with torch.no_grad():
    want = net(x)
    want_mm = a @ a
    model = ai3.convert(net)
    swapped = ai3.swap_conv2d(copy.deepcopy(net))
    assert torch.allclose(model(x), want, atol=1e-4) and torch.allclose(swapped(x), want, atol=1e-4)

def close(got, expected):
    return torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
"""

_THREADS = (
    _SETUP
    + """
def tasks():
    return len(os.listdir("/proc/self/task"))

def calls_ai3(errors, converted_only=False):
    try:
        with torch.no_grad():
            for _ in range(20):
                if not close(model(x), want):
                    errors.append("converted model mismatch")
                if not converted_only and not close(swapped(x), want):
                    errors.append("swapped network mismatch")
    except Exception as e:
        errors.append(repr(e))

def calls_torch(errors):
    for _ in range(20):
        if not close(a @ a, want_mm):
            errors.append("torch mismatch")

# Only ai3 calls from 6 threads: they must start no OpenMP team of their own.
before = tasks()
errors, peak = [], []
at_end = threading.Barrier(7)
def worker():
    calls_ai3(errors, converted_only=True)
    at_end.wait()      # stay alive (an OpenMP team lives as long as its thread)
    at_end.wait()
threads = [threading.Thread(target=worker) for _ in range(6)]
for t in threads:
    t.start()
at_end.wait()
peak = tasks()
at_end.wait()
for t in threads:
    t.join()
print("threads", before, peak)

# Mixed: ai3 models and PyTorch ops from several threads at once.
mixed = [threading.Thread(target=calls_ai3, args=(errors,)) for _ in range(4)]
mixed += [threading.Thread(target=calls_torch, args=(errors,)) for _ in range(3)]
for t in mixed:
    t.start()
calls_ai3(errors)
for t in mixed:
    t.join()
print("errors", errors)
print("parks", ai3._core._parks_openmp())
"""
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_threads_calling_models_beside_torch():
    """Several Python threads run ai3 models while others run PyTorch ops:
    right answers, no hang, and ai3 starts no OpenMP team per calling thread
    (before, each thread that called a model got a team of its own)."""
    done = _script(_THREADS)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["errors"] == "[]"
    before, peak = map(int, lines["threads"].split())
    # The 6 Python threads themselves, nothing more: ai3's pool already existed.
    assert peak <= before + 6, f"{peak - before} threads appeared for 6 callers"
    assert lines["parks"] == str(_torch_uses_openmp())


_FORK = (
    _SETUP
    + """
with torch.no_grad():
    want_mm = a @ a          # PyTorch's OpenMP team has just run in the parent
    model(x)                 # ... and ai3's pool and parking too
    want_conv = net[0](x)    # the child must run no parallel PyTorch op: those hang
pid = os.fork()
if pid == 0:
    code = 3
    try:
        if sys.argv[1] == "set_num_threads":
            torch.set_num_threads(1)   # what DataLoader workers do
        with torch.no_grad():
            ok = close(model(x), want) and close(model(x[:1]), want[:1])
            conv = swapped[0]
            ok = ok and close(conv(x), want_conv)
        ok = ok and not ai3._core._parks_openmp()
        code = 0 if ok else 2
    finally:
        os._exit(code)
for _ in range(600):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exit", os.waitstatus_to_exitcode(status))
        break
    threading.Event().wait(0.1)
else:
    os.kill(pid, 9)
    print("child hung")
with torch.no_grad():
    print("parent", close(model(x), want))
"""
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
@pytest.mark.parametrize("child", ["set_num_threads", "plain"])
def test_a_forked_child_runs_models(child):
    """After ``os.fork()``, the child runs converted and swapped layers, with
    or without ``torch.set_num_threads(1)`` (before, without it, the child
    waited forever on the parent's pool threads)."""
    done = _script(_FORK.replace("sys.argv[1]", repr(child)))
    assert done.returncode == 0, done.stderr
    assert "child exit 0" in done.stdout, done.stdout + done.stderr
    assert "parent True" in done.stdout


def test_parking_can_be_turned_off():
    code = "import torch, ai3; print(ai3._core._parks_openmp())"
    assert _printed(code, AI3_PARK_OPENMP="0") == "False"
