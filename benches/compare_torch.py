"""ai3 against PyTorch eager, side by side in one run.

Times each conv2d algorithm on the ai3 paper's four convolution shapes, linear
layers, and whole networks (converted with ``ai3.convert``, and with their
convolutions swapped by ``ai3.swap_conv2d``), each against PyTorch on the same
input in the same process (``torch.inference_mode()``, default thread counts), and
prints a Markdown table of milliseconds and ratios (ai3 / PyTorch; below 1 is
faster). ``--out DIR`` also writes ``DIR/results.md`` and, when matplotlib is
installed, ``DIR/results.png``.

    python benches/compare_torch.py                # everything
    python benches/compare_torch.py --only conv    # conv, linear, models or swap
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable

import ai3
import torch
from host import cpu_name
from torch import nn

#: Each case runs for at least this long (both sides together), in rounds.
MIN_SECONDS = 5.0
#: ... but stops after this many rounds.
MAX_ROUNDS = 200

#: The paper's evaluation shapes: batch 10, 3x3 kernels, padding 1.
CONV_SHAPES = [(3, 64, 224), (64, 128, 112), (256, 256, 28), (512, 512, 14)]
CONV_ALGOS = ["direct", "smm", "gemm", "winograd", "fft", "default"]
MODELS = ["alexnet", "vgg16", "resnet50", "densenet121", "squeezenet1_1", "googlenet"]


def timeit(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def compare(
    label: str,
    module: nn.Module,
    x: torch.Tensor,
    algos: dict,
    repeat: int,
    swap: bool = False,
) -> dict:
    """One row: PyTorch's time and ai3's, measured alternately so drift hits both:
    medians over at least ``repeat`` rounds and at least ``MIN_SECONDS``.

    ai3 runs ``convert(module, algos)``, or with ``swap`` a copy of ``module``
    whose convolutions ``swap_conv2d`` replaced (the rest stays PyTorch)."""
    module = module.eval()
    if swap:
        model = ai3.swap_conv2d(copy.deepcopy(module), algos.get("conv2d", "default"))
    else:
        model = ai3.convert(module, algos)
    with torch.inference_mode():
        t_torch, t_ai3 = [], []
        start = time.perf_counter()
        # At least `repeat` rounds and MIN_SECONDS of them, so that a short
        # case's median is not decided by one noisy second of a shared machine.
        while len(t_ai3) < repeat or (
            time.perf_counter() - start < MIN_SECONDS and len(t_ai3) < MAX_ROUNDS
        ):
            t_torch.append(timeit(lambda: module(x), 1))
            t_ai3.append(timeit(lambda: model(x), 1))
    tt, ta = statistics.median(t_torch), statistics.median(t_ai3)
    return {"case": label, "torch_ms": tt, "ai3_ms": ta, "ratio": ta / tt}


def conv_rows(repeat: int) -> list[dict]:
    rows = []
    for cin, cout, hw in CONV_SHAPES:
        conv = nn.Conv2d(cin, cout, 3, padding=1)
        x = torch.randn(10, cin, hw, hw)
        for algo in CONV_ALGOS:
            label = f"conv2d {cin}->{cout} {hw}x{hw} b10 [{algo}]"
            rows.append(compare(label, nn.Sequential(conv), x, {"conv2d": algo}, repeat))
            print(fmt(rows[-1]), flush=True)
    return rows


def linear_rows(repeat: int) -> list[dict]:
    layer = nn.Linear(4096, 4096)
    x = torch.randn(64, 4096)
    row = compare(
        "linear (64x4096)@(4096x4096) [gemm]", nn.Sequential(layer), x, {"linear": "gemm"}, repeat
    )
    print(fmt(row), flush=True)
    return [row]


def model_rows(repeat: int, swap: bool = False) -> list[dict]:
    """Whole torchvision networks (random weights) at batch 1 and 10, default
    algorithms: converted, or with ``swap`` their convolutions swapped."""
    import torchvision

    rows = []
    how = "swap_conv2d" if swap else "convert"
    for name in MODELS:
        for batch in (1, 10):
            net = getattr(torchvision.models, name)(weights=None)
            x = torch.randn(batch, 3, 224, 224)
            rows.append(compare(f"{name} b{batch} [{how}]", net, x, {}, repeat, swap=swap))
            print(fmt(rows[-1]), flush=True)
    return rows


def fmt(r: dict) -> str:
    return f"| {r['case']} | {r['torch_ms']:.2f} | {r['ai3_ms']:.2f} | {r['ratio']:.2f} |"


def machine() -> str:
    return (
        f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), ai3 {ai3.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["conv", "linear", "models", "swap"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", help="folder for results.md and results.png")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"machine: {machine()}\n\n| case | PyTorch ms | ai3 ms | ai3 / PyTorch |\n|---|---|---|---|"
    )
    rows: list[dict] = []
    if args.only in (None, "conv"):
        rows += conv_rows(args.repeat)
    if args.only in (None, "linear"):
        rows += linear_rows(args.repeat)
    if args.only in (None, "models"):
        rows += model_rows(args.repeat)
    if args.only in (None, "swap"):
        rows += model_rows(args.repeat, swap=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(
                f"Machine: {machine()}\n\n| case | PyTorch ms | ai3 ms | ai3 / PyTorch |\n|---|---|---|---|\n"
            )
            f.writelines(fmt(r) + "\n" for r in rows)
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not installed: no chart (pip install 'aithree[plots]')")
            return
        fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1))
        ax.barh([r["case"] for r in rows], [r["ratio"] for r in rows])
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xlabel("ai3 latency / PyTorch latency (lower is better)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "results.png"), dpi=120)


if __name__ == "__main__":
    main()
