"""The CPU feature ladder: every instruction-set level below the best this CPU
has runs the conv2d, pooling and linear grids against PyTorch, in a process of its own
with ``AI3_CPU_ISA`` capping the level (the level is fixed per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ai3 import _core

LEVELS = ["portable", "avx2", "avx512"]
TESTS = Path(__file__).parent


def test_the_level_is_known():
    import ai3

    assert ai3.cpu_isa() == _core.cpu_isa() in LEVELS


def _run(level: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, AI3_CPU_ISA=level)
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=1200
    )


def _machine_level() -> str:
    """The level this CPU gets uncapped (this process may run capped)."""
    env = {k: v for k, v in os.environ.items() if k != "AI3_CPU_ISA"}
    code = "from ai3 import _core; print(_core.cpu_isa())"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    return got.stdout.strip()


@pytest.mark.parametrize("level", ["portable", "avx2"])
def test_a_capped_level_is_used(level):
    best = _machine_level()
    want = LEVELS[min(LEVELS.index(level), LEVELS.index(best))]
    got = _run(level, "-c", "from ai3 import _core; print(_core.cpu_isa())")
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == want


def _pytest_passes(level: str, *args: str) -> None:
    """Runs pytest on ``args`` with the level capped at ``level``; asserts it passed."""
    got = _run(level, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *args)
    tail = (got.stdout + got.stderr)[-3000:]
    assert got.returncode == 0, tail
    assert " passed" in got.stdout, tail


@pytest.mark.slow
@pytest.mark.parametrize("level", ["portable", "avx2"])
def test_lower_levels_pass_the_conv_and_pool_grids(level):
    if LEVELS.index(level) >= LEVELS.index(_core.cpu_isa()):
        pytest.skip(f"this CPU's best level is {_core.cpu_isa()}: the main run covers {level}")
    _pytest_passes(
        level,
        str(TESTS / "test_conv2d.py"),
        str(TESTS / "test_layers.py"),
        "-k",
        "convert and (conv2d or depthwise or pointwise or pool or linear)",
    )


@pytest.mark.slow
def test_avx2_runs_the_blocked_layout_tests():
    """The blocked kernels have a register tile per level (AVX-512 and AVX2):
    on a CPU with AVX-512 the main run covers only the wider one, so the
    blocked-layout tests run again with the level capped at AVX2."""
    if LEVELS.index(_core.cpu_isa()) <= LEVELS.index("avx2"):
        pytest.skip(f"this CPU's best level is {_core.cpu_isa()}: the main run covers avx2")
    _pytest_passes("avx2", str(TESTS / "test_layouts.py"))
