"""Attention algorithms against each other: ai3's ``naive`` and ``flash``
(and PyTorch's ``F.scaled_dot_product_attention`` for reference) at
sequence lengths 64 to 8192, one ``attention`` node each.

Time: the three engines called alternately (ABBA) in one process, median
per engine. Peak memory: each algorithm in its own fresh process, the rise
of the process's peak resident memory (``VmHWM``, reset through
``/proc/self/clear_refs`` just before) over its resident memory before
the call: the scratch and output one call needs (Linux only).

    python benches/attention.py                     # table to stdout
    python benches/attention.py --out benches/results/attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import ai3
import torch
import torch.nn.functional as F
from ai3 import _core
from ai3.autotune.timing import interleaved_ms
from host import cpu_name

LENGTHS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
HEADS, DIM = 8, 64


def _node(algo: str) -> _core.Model:
    core = _core.Model("float32", 3)
    core.set_outputs([core.add("attention", "attention", [0, 1, 2], {}, algo)])
    return core


def _inputs(length: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, HEADS, length, DIM, generator=g) for _ in range(3)]


def _peak_rise_mb(algo: str, length: int) -> float:
    """Run in a child process: peak RSS rise (MB) of one call of ``algo``."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", algo, str(length)],
        capture_output=True, text=True, check=True, env=os.environ,
    )  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def _child(algo: str, length: int) -> None:
    xs = _inputs(length)
    core = _node(algo)
    with torch.inference_mode():
        core.run(_inputs(16))  # starts the thread pool, whose stacks are not the algorithm's
        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak (VmHWM) to the current size
        core.run(xs)
    print((_status_kb("VmHWM") - before) / 1024)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _engines(xs: list[torch.Tensor]) -> dict:
    naive, flash = _node("naive"), _node("flash")
    return {
        "naive": lambda: naive.run(xs),
        "flash": lambda: flash.run(xs),
        "torch": lambda: F.scaled_dot_product_attention(*xs),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    ap.add_argument("--child", nargs=2)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    rows = []
    print(f"heads {HEADS}, head dim {DIM}, batch 1, float32, {ai3.get_num_threads()} threads")
    print("| length | naive ms | flash ms | torch SDPA ms | flash/naive | naive MB | flash MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        rounds = 3 if length >= 4096 else 10
        with torch.inference_mode():
            ms = interleaved_ms(_engines(_inputs(length)), rounds, 50, 3.0)
        mem = {a: _peak_rise_mb(a, length) for a in ("naive", "flash")}
        row = {"length": length, **{f"{k}_ms": v for k, v in ms.items()},
               **{f"{k}_peak_mb": v for k, v in mem.items()}}  # fmt: skip
        rows.append(row)
        print(
            f"| {length} | {ms['naive']:.2f} | {ms['flash']:.2f} | {ms['torch']:.2f} | "
            f"{ms['flash'] / ms['naive']:.2f} | {mem['naive']:.1f} | {mem['flash']:.1f} |",
            flush=True,
        )
    if args.out:
        machine = {"cpu": cpu_name(), "threads": ai3.get_num_threads(),
                   "torch": torch.__version__}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "heads": HEADS, "dim": DIM, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
