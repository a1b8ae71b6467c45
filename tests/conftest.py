"""Shared helpers for ai3's test suite.

Reference values always come from PyTorch, computed at test time. Tolerances
are per dtype and scaled by the largest magnitude of the expected output, so
a test on values around 1e3 is as strict, relatively, as one around 1.
"""

from __future__ import annotations

import copy
import os
import random

import ai3
import pytest
import torch
from torch import nn


class Fn(nn.Module):
    """Wraps a function of the input (fx traces through it)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Two(nn.Module):
    """Wraps a function of two inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


#: (atol, rtol) per dtype; atol is multiplied by max(|expected|, 1).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-10, 1e-10),
}

DTYPES = [torch.float32, torch.float64]
DTYPE_IDS = ["f32", "f64"]


# Outputs and arenas are not zeroed: filled with NaN here, any element a kernel
# leaves unwritten fails the comparison against PyTorch.
ai3._core._poison_unfilled(True)


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """'auto' measurements go to a folder of this run, never the user's cache."""
    os.environ["AI3_CACHE_DIR"] = str(tmp_path_factory.mktemp("ai3-cache"))


@pytest.fixture(autouse=True)
def seed():
    """Every test starts from the same random state."""
    torch.manual_seed(0)
    random.seed(0)
    yield 0


def tolerance(expected: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[float, float]:
    """(atol, rtol) for comparing against ``expected`` in ``dtype``."""
    dtype = dtype or expected.dtype
    atol, rtol = TOLERANCES[dtype]
    scale = max(float(expected.detach().abs().max()), 1.0) if expected.numel() else 1.0
    return atol * scale, rtol


def assert_close(
    actual, expected, dtype: torch.dtype | None = None, *, factor: float = 1.0
) -> None:
    """``actual`` equals the PyTorch reference ``expected`` within ``dtype``'s tolerance.

    Checks type, shape and dtype exactly, then values with
    ``atol = TOL[dtype] * max(|expected|) * factor`` and ``rtol = TOL[dtype] * factor``.
    """
    assert isinstance(actual, torch.Tensor), f"expected a torch.Tensor, got {type(actual).__name__}"
    dtype = dtype or expected.dtype
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != expected {expected.dtype}"
    atol, rtol = tolerance(expected, dtype)
    torch.testing.assert_close(
        actual.detach(), expected.detach(), atol=atol * factor, rtol=rtol * factor
    )


def run_convert(module: nn.Module, x: torch.Tensor, algos=None, **kwargs) -> torch.Tensor:
    """Output of ``ai3.convert(module, algos)(x)``."""
    model = ai3.convert(module, algos, **kwargs)
    assert isinstance(model, ai3.Model)
    return model(x)


def reference(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """PyTorch's output, computed on a deep copy so the module can be swapped afterwards."""
    with torch.no_grad():
        return copy.deepcopy(module)(x)


def swapped_types(module: nn.Module) -> list[str]:
    """Type names of every submodule, for checking what a swap replaced."""
    return [type(m).__name__ for m in module.modules()]
