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


def test_parking_can_be_turned_off():
    code = "import torch, ai3; print(ai3._core._parks_openmp())"
    assert _printed(code, AI3_PARK_OPENMP="0") == "False"
