"""Converted transformers against PyTorch eager, side by side in one run:
torchvision's ViT-B/16 and Swin-T (random weights, native 224x224 images) at batch 1 and 8,
the two engines called alternately (ABBA), median milliseconds each.

    python benches/transformers.py
    python benches/transformers.py --out benches/results/transformers.json
"""

from __future__ import annotations

import argparse
import json

import ai3
import torch
import torchvision
from ai3.autotune.timing import interleaved_ms
from host import cpu_name
from torch import nn

MODELS = ["vit_b_16", "swin_t"]
BATCHES = [1, 8]


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    net = getattr(torchvision.models, name)(weights=None)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Linear) and not m.weight.any():
                nn.init.normal_(m.weight, std=0.02)  # ViT's zero-initialised head
    return net.eval()


def _engines(net: nn.Module, model: ai3.Model, x: torch.Tensor) -> dict:
    return {"torch": lambda: net(x), "ai3": lambda: model(x)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--models", nargs="+", default=MODELS)
    args = ap.parse_args()
    rows = []
    print(f"torch {torch.__version__}, {ai3.get_num_threads()} threads, float32")
    print("| model | batch | PyTorch ms | ai3 ms | ai3 / PyTorch | max rel. error |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.models:
        net = build(name)
        model = ai3.convert(net, sample_input_shape=(1, 3, 224, 224))  # Swin needs it
        for batch in BATCHES:
            x = torch.randn(batch, 3, 224, 224)
            with torch.inference_mode():
                want = net(x)
                err = float((model(x) - want).abs().max() / want.abs().max())
                ms = interleaved_ms(_engines(net, model, x), 5, 30, 20.0)
            rows.append({"model": name, "batch": batch, **ms, "error": err})
            print(
                f"| {name} | {batch} | {ms['torch']:.1f} | {ms['ai3']:.1f} | "
                f"{ms['ai3'] / ms['torch']:.2f} | {err:.1e} |",
                flush=True,
            )
    if args.out:
        machine = {"cpu": cpu_name(),
                   "threads": ai3.get_num_threads(), "torch": torch.__version__}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
