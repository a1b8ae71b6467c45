"""What ``'auto'`` buys over ``'default'``, end to end, and what exploring costs.

For each network and batch, in a process of its own (ai3 only; each process
starts from an empty measurement cache):

- ``convert(net)`` (``'default'``) and ``convert(net, 'auto')`` with the
  sample shape, timing the 'auto' conversion (it times every layer);
- both models called alternately, call by call (ABBA order), for at least
  ``--seconds`` and ``--rounds`` rounds: the medians and their ratio (auto /
  default).

``--explore`` also times ``python -m ai3 explore MODEL --batch 1`` (224x224)
as a user runs it, with an empty cache.

    python benches/auto.py                          # the performance table's networks
    python benches/auto.py --models resnet50 --batch 1 --explore resnet50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from host import cpu_name

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["alexnet", "vgg16", "resnet50", "densenet121", "squeezenet1_1", "googlenet"]


def one(model: str, batch: int, size: int, rounds: int, seconds: float) -> dict:
    import ai3
    import torch
    import torchvision

    torch.manual_seed(0)
    kwargs = {"aux_logits": False, "init_weights": False} if model == "googlenet" else {}
    net = torchvision.models.get_model(model, weights=None, **kwargs).eval()
    shape = (batch, 3, size, size)
    default = ai3.convert(net, None, shape)
    t = time.perf_counter()
    auto = ai3.convert(net, {"conv2d": "auto", "linear": "auto"}, shape)
    convert_s = time.perf_counter() - t
    x = torch.randn(shape)
    with torch.inference_mode():
        expected = net(x)
    err = float((auto(x) - expected).abs().max() / expected.abs().max().clamp_min(1e-12))
    default(x)
    times = {"default": [], "auto": []}
    start = time.perf_counter()
    n = 0
    pair = [("default", default), ("auto", auto)]
    while n < rounds or time.perf_counter() - start < seconds:
        # ABBA order, so that whatever favours the first (or second) call of a
        # round favours both models alike.
        for name, m in pair if n % 2 == 0 else pair[::-1]:
            t = time.perf_counter()
            m(x)
            times[name].append(time.perf_counter() - t)
        n += 1
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    chosen: dict[str, int] = {}
    for layer in auto.plan().layers:
        chosen[layer.algorithm] = chosen.get(layer.algorithm, 0) + 1
    changed = sum(
        1
        for r_auto, r_def in zip(auto.summary(), default.summary(), strict=True)
        if r_auto["algorithm"] != r_def["algorithm"]
    )
    return {
        "model": model,
        "batch": batch,
        "convert_auto_s": round(convert_s, 2),
        "default_ms": round(med["default"], 3),
        "auto_ms": round(med["auto"], 3),
        "ratio": round(med["auto"] / med["default"], 3),
        "rounds": n,
        "chosen": chosen,
        "layers_differing_from_default": changed,
        "network_check": auto._recipe.get("network_check"),
        "max_rel_error_vs_torch": err,
    }


def _machine() -> str:
    return f"{cpu_name()}, {os.cpu_count()} cores"


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--batch", nargs="+", type=int, default=[1, 10])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--explore", nargs="*", default=None, metavar="MODEL",
                   help="also time `python -m ai3 explore MODEL --batch 1`")  # fmt: skip
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "BATCH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        res = one(args.one[0], int(args.one[1]), args.size, args.rounds, args.seconds)
        print(json.dumps(res))
        return 0
    print(f"machine: {_machine()}")
    results = []
    print(
        "| network | batch | 'default' ms | 'auto' ms | auto/default | convert 'auto' s | layers changed |"
    )
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        for batch in args.batch:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "AI3_CACHE_DIR": cache}
                cmd = [sys.executable, __file__, "--one", model, str(batch), "--size", str(args.size),
                       "--rounds", str(args.rounds), "--seconds", str(args.seconds)]  # fmt: skip
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"| {model} | {batch} | failed: {out.stderr.strip().splitlines()[-1:]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(r)
            print(f"| {model} | {batch} | {r['default_ms']:.1f} | {r['auto_ms']:.1f} | "
                  f"{r['ratio']:.2f} | {r['convert_auto_s']:.1f} | "
                  f"{r['layers_differing_from_default']} |", flush=True)  # fmt: skip
    for model in args.explore or []:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "AI3_CACHE_DIR": os.path.join(tmp, "cache")}
            t = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "ai3", "explore", model, "--batch", "1", "--no-progress",
                 "--out", os.path.join(tmp, "out")],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            wall = time.perf_counter() - t
        status = "ok" if out.returncode == 0 else f"failed: {out.stderr[-300:]}"
        print(f"python -m ai3 explore {model} --batch 1: {wall:.1f} s ({status})")
        results.append({"explore": model, "seconds": round(wall, 1), "ok": out.returncode == 0})
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": _machine(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
