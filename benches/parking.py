"""What parking PyTorch's OpenMP threads buys: each network timed with
parking on and off, alternately, call by call, in one process.

ai3 parks PyTorch's idle OpenMP workers while it runs (see ``ai3/threads.py``)
so that their spinning after a PyTorch parallel region does not share the
cores with ai3's kernels. This measures three uses, each with parking on and
off: a converted network called in a loop, a converted network called right
after a PyTorch op on its input (a preprocessing step), and a network whose
convolutions ``swap_conv2d`` replaced (PyTorch layers run between them).

    python benches/parking.py                     # the benchmark networks, batch 1 and 10
    python benches/parking.py --models resnet50 --batch 10
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import ai3
import torch
import torchvision
from ai3 import _core
from compare_torch import MIN_SECONDS, MODELS, machine


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def on_off(fn, repeat: int) -> tuple[float, float]:
    """Median milliseconds of ``fn`` with parking on and off, alternating."""
    on, off = [], []
    fn()
    start = time.perf_counter()
    while len(on) < repeat or time.perf_counter() - start < MIN_SECONDS:
        _core._park_openmp(True)
        on.append(timed(fn))
        _core._park_openmp(False)
        off.append(timed(fn))
    _core._park_openmp(True)
    return statistics.median(on), statistics.median(off)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not _core._park_openmp(True):
        raise SystemExit("parking is unavailable here (PyTorch's backend is not OpenMP)")
    torch.manual_seed(0)
    print(f"machine: {machine()}\n")
    print("| network | use | parking on ms | parking off ms | off / on |\n|---|---|---|---|---|")
    for name in args.models:
        net = getattr(torchvision.models, name)(weights=None).eval()
        converted = ai3.convert(net)
        swapped = ai3.swap_conv2d(copy.deepcopy(net))
        for batch in args.batch:
            x = torch.randn(batch, 3, 224, 224)
            uses = {
                "convert": lambda m=converted, x=x: m(x),
                "torch op, then convert": lambda m=converted, x=x: m(x * 0.5 + 0.1),
                "swap_conv2d": lambda m=swapped, x=x: m(x),
            }
            with torch.inference_mode():
                for use, fn in uses.items():
                    on, off = on_off(fn, args.repeat)
                    print(
                        f"| {name} b{batch} | {use} | {on:.2f} | {off:.2f} | {off / on:.2f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
