"""Where a converted network's time goes by kind of layer, and at what rate.

Converts one torchvision network (random weights, the input of
``compare_engines.py``), times each node with ``Model.profile`` (the median of
``--repeat`` runs, then the middle of ``--runs`` such profiles) and sums the nodes
by kind: 1x1 convolutions, depthwise convolutions, other convolutions, linear
layers, then every other operation by name. Convolutions and linear layers also
show their floating-point operations (a multiply-accumulate is two) and the rate
they ran at, which says how near each kind is to the core's multiply-accumulate
rate. The whole network's median call is printed beside the nodes' sum.

    python benches/layer_kinds.py --model mobilenet_v2 --batch 1
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time


def product_macs(module, out_numel: int) -> int:
    """Multiply-adds of a convolution or linear layer (as the direct algorithm
    does them) that made ``out_numel`` outputs; 0 for any other module."""
    import torch

    if isinstance(module, torch.nn.Conv2d):
        kh, kw = module.kernel_size
        return out_numel * (module.in_channels // module.groups) * kh * kw
    if isinstance(module, torch.nn.Linear):
        return out_numel * module.in_features
    return 0


def kind_and_flops(net, row: dict) -> tuple[str, float]:
    """The kind of a profiled node and its floating-point operations (0 if not
    counted), from the torch module its name points at."""
    import torch

    op = row["op"].split("+")[0]
    try:
        module = net.get_submodule(row["name"])
    except AttributeError:
        module = None
    out = row["output_shape"]
    if op == "conv2d" and isinstance(module, torch.nn.Conv2d):
        kh, kw = module.kernel_size
        macs = product_macs(module, math.prod(out))
        if module.groups > 1 and module.groups == module.in_channels:
            kind = "depthwise conv"
        elif (kh, kw) == (1, 1):
            kind = "1x1 conv"
        else:
            kind = f"{kh}x{kw} conv"
        return kind, 2.0 * macs
    if op == "linear" and isinstance(module, torch.nn.Linear):
        return "linear", 2.0 * product_macs(module, math.prod(out))
    return op, 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v2", help="a torchvision model name")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 2))
    ap.add_argument("--repeat", type=int, default=30, help="timed runs per profile")
    ap.add_argument("--runs", type=int, default=3, help="profiles; each node's middle one counts")
    args = ap.parse_args()

    import ai3
    import torch

    # The shared network builder; the path is changed here, not on import, so that
    # importing this module (the tests do) leaves sys.path alone.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare_engines import _build

    torch.set_num_threads(args.threads)
    ai3.set_num_threads(args.threads)
    net, x = _build(args.model, args.batch)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    with torch.inference_mode():
        profiles = [model.profile(x, repeat=args.repeat) for _ in range(args.runs)]
        for _ in range(5):
            model(x)
        calls = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            model(x)
            calls.append((time.perf_counter() - start) * 1e3)
    calls.sort()

    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for i, row in enumerate(profiles[0]):
        ms = sorted(p[i]["ms"] for p in profiles)[len(profiles) // 2]
        kind, flops = kind_and_flops(net, row)
        k = kinds[kind]
        k[0] += 1
        k[1] += ms
        k[2] += flops
    total = sum(k[1] for k in kinds.values())
    print(
        f"{args.model}, batch {args.batch}, {args.threads} threads: nodes summed {total:.3f} ms; "
        f"whole calls median {calls[len(calls) // 2]:.3f} ms, fastest {calls[0]:.3f} ms"
    )
    print()
    print("| kind | nodes | ms | share | GFLOP | GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for kind, (n, ms, flops) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        rate = f"{flops / ms / 1e6:.1f}" if flops and ms > 0 else ""
        gflop = f"{flops / 1e9:.3f}" if flops else ""
        print(f"| {kind} | {n} | {ms:.3f} | {ms / total:.0%} | {gflop} | {rate} |")


if __name__ == "__main__":
    main()
