"""Per-call overhead: a converted model of one 1x1 convolution on a 1x8x8x8
input, against the same module in PyTorch eager (mean over many calls).

    python benches/overhead.py
"""

from __future__ import annotations

import time

import ai3
import torch
from torch import nn


def per_call_us(fn, calls: int = 3000) -> float:
    for _ in range(200):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    conv = nn.Conv2d(8, 8, 1).eval()
    x = torch.randn(1, 8, 8, 8)
    model = ai3.convert(nn.Sequential(conv))
    with torch.inference_mode():
        for _ in range(3):
            t, a = per_call_us(lambda: conv(x)), per_call_us(lambda: model(x))
            print(f"PyTorch eager {t:.1f} us, ai3 {a:.1f} us, ratio {a / t:.2f}")


if __name__ == "__main__":
    main()
