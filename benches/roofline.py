"""Engines' times read against the machine's ceilings.

For each network and batch of a ``compare_engines.py`` result, counts the
multiply-adds and weight bytes of each of its convolutions and linear layers
(products as the direct algorithm does them) and sets them against the f32
peak and memory read bandwidth that ``cargo bench -p ai3-benches --bench peak``
measured on the same machine:

- compute floor: the network's FLOP at the multiply-add peak, the least time
  an engine that does every product takes (an engine can undercut it only by
  doing fewer, as Winograd does for 3x3 convolutions);
- layer floor: layer after layer, the longer of its FLOP at the peak and its
  weights read once at the bandwidth (what binds where weights do not stay
  in the caches between calls: AlexNet's and VGG's classifiers at batch 1);
- each engine's time against the layer floor (the floor over the time: 100%
  is an engine at the machine's ceiling), and what 0.9x the best of ONNX
  Runtime and OpenVINO would ask of ai3 in the same terms.

    cargo bench -p ai3-benches --bench peak | tail -1 > /tmp/peak.json
    python benches/roofline.py benches/results/engines_X_b1.json --peak /tmp/peak.json

The share of 3x3 stride-1 products is listed apart: only those have a cheaper
algorithm (Winograd) among ai3's; 1x1 and linear products have none.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

#: Engines listed, in order, when the result has them.
ENGINES = ["eager", "compile", "ort", "openvino", "ai3", "ai3_swap"]


def _sibling(name: str):
    """Another script of benches/ as a module, loaded from its file, so that
    sys.path is left alone (benches/transformers.py would hide the package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"ai3_benches_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count(net, x, peak_gflops: float, read_gbs: float) -> dict:
    """Multiply-adds of ``net``'s convolutions and linear layers on ``x`` (all,
    and those of 3x3 stride-1 dense convolutions), its parameters' bytes, and its
    layer floor in ms: layer after layer, the longer of its FLOP at
    ``peak_gflops`` and its weights read at ``read_gbs``."""
    import torch

    macs = {"all": 0, "winograd": 0, "floor_ms": 0.0}

    product_macs = _sibling("layer_kinds").product_macs

    def hook(m, _inputs, out):
        n = product_macs(m, out.numel())
        dense_3x3 = isinstance(m, torch.nn.Conv2d) and m.groups == 1
        if dense_3x3 and m.kernel_size == (3, 3) and m.stride == (1, 1):
            macs["winograd"] += n
        macs["all"] += n
        weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
        macs["floor_ms"] += max(2 * n / peak_gflops / 1e6, weight_bytes / read_gbs / 1e6)

    handles = [
        m.register_forward_hook(hook)
        for m in net.modules()
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
    ]
    with torch.inference_mode():
        net(x)
    for h in handles:
        h.remove()
    weight_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    return {**macs, "weight_bytes": weight_bytes}


def rows(results: list[dict], peak_gflops: float, read_gbs: float) -> list[dict]:
    """One row a network and batch: its counts, floors and engines' shares."""
    out = []
    for r in results:
        net, x = _sibling("compare_engines")._build(r["model"], r["batch"])
        c = count(net, x, peak_gflops, read_gbs)
        gflop = 2 * c["all"] / 1e9
        floor_ms = c["floor_ms"]
        ms = {e: v["ms"] for e, v in r["results"].items() if v.get("ok") and "ms" in v}
        best = min((ms[e] for e in ("ort", "openvino") if e in ms), default=None)
        out.append(
            {
                "model": r["model"],
                "batch": r["batch"],
                "gflop": gflop,
                "winograd_share": c["winograd"] / max(c["all"], 1),
                "compute_floor_ms": gflop / peak_gflops * 1e3,
                "weight_mb": c["weight_bytes"] / 1e6,
                "floor_ms": floor_ms,
                "ms": ms,
                # 0.9x the best engine's time, against the floor.
                "target_share": floor_ms / (0.9 * best) if best else None,
            }
        )
    return out


def table(rs: list[dict], peak_gflops: float, read_gbs: float) -> str:
    """The Markdown table of ``rows``."""
    labels = _sibling("compare_engines").LABELS
    engines = [e for e in ENGINES if any(e in r["ms"] for r in rs)]
    head = (
        ["network", "GFLOP", "3x3 s1 share", "compute floor ms", "weights MB", "layer floor ms"]
        + [f"{labels[e]} ms (floor / time)" for e in engines]
        + ["0.9x best of ORT, OpenVINO asks"]
    )
    lines = [
        f"Peak {peak_gflops:.0f} GFLOP/s (f32 multiply-add, every thread), "
        f"memory read {read_gbs:.1f} GB/s.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rs:
        cells = [
            f"{r['model']} b{r['batch']}",
            f"{r['gflop']:.2f}",
            f"{r['winograd_share']:.0%}",
            f"{r['compute_floor_ms']:.1f}",
            f"{r['weight_mb']:.0f}",
            f"{r['floor_ms']:.1f}",
        ]
        for e in engines:
            ms = r["ms"].get(e)
            cells.append(f"{ms:.1f} ({r['floor_ms'] / ms:.0%})" if ms else "-")
        t = r["target_share"]
        cells.append(f"{t:.0%}" if t else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="compare_engines.py JSON files")
    ap.add_argument("--peak", required=True, help="the peak benchmark's last line, as a file")
    ap.add_argument("--out", help="also write the Markdown table here")
    args = ap.parse_args()
    with open(args.peak) as f:
        peak = json.load(f)
    if not (peak.get("peak_gflops", 0) > 0 and peak.get("read_gbs", 0) > 0):
        sys.exit(f"roofline: {args.peak} has no positive peak_gflops and read_gbs: {peak}")
    results = []
    for path in args.results:
        with open(path) as f:
            results += json.load(f)["rows"]
    rs = rows(results, peak["peak_gflops"], peak["read_gbs"])
    text = table(rs, peak["peak_gflops"], peak["read_gbs"])
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
