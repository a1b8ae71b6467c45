"""The timing pieces exploration shares: random inputs of given shapes, and
engines called alternately, call by call, with their medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def random_inputs(shapes: Sequence[Sequence[int]], dtype: torch.dtype) -> list[torch.Tensor]:
    """Standard normal inputs of ``shapes`` from a fixed seed, drawn in float64 so
    that every dtype gets the same values (the float64 reference reads them too)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(tuple(s), generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def interleaved_ms(
    engines: dict[str, Callable[[], Any]],
    rounds: int,
    max_rounds: int | None = None,
    seconds: float = 0.0,
) -> dict[str, float]:
    """Each engine's median time in milliseconds, after one warm-up call each.

    Every round calls each engine once, the order reversed every other round
    (ABBA), so machine drift and the position in a round touch all alike.
    At least ``rounds`` rounds; then more while under ``seconds``, up to
    ``max_rounds``."""
    for fn in engines.values():
        fn()
    order = list(engines.items())
    times: dict[str, list[float]] = {k: [] for k in engines}
    start = time.perf_counter()
    done = 0
    while done < rounds or (
        done < (max_rounds or rounds) and time.perf_counter() - start < seconds
    ):
        for k, fn in order if done % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
        done += 1
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}
