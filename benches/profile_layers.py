"""Where ai3's time goes against ONNX Runtime's, layer by layer.

Profiles one network at one batch size in both engines (each in a process of its
own, the same weights and input as ``compare_engines.py``): ai3 with
``Model.profile``, ONNX Runtime with its own profiler. Nodes are grouped by input
and output shape (ONNX Runtime fuses and renames nodes, so names do not match, and
two layers of the same shapes cannot be told apart from its profile); each group
shows both engines' summed median times, largest difference (either way) first.
Summed over the whole network, per-node medians read below the median whole run
(0.2-0.3 ms of mobilenet_v2's 5 at batch 1 on a 2-core Zen 4): compare networks by
their end-to-end times.
Reorders into and out of a blocked layout count with the node they serve in ai3;
ONNX Runtime reports its own as separate nodes. Linear layers over more than two
dimensions are grouped as the 2-D products ONNX Runtime runs; where its graph
otherwise reshapes a layer's operands, the two engines' nodes land in different
groups, each shown against nothing.

    python benches/profile_layers.py --model resnet50 --batch 1
    python benches/profile_layers.py --model alexnet --batch 10 --out /tmp/alexnet_b10.md
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_engines import _build, export_onnx, machine  # noqa: E402


def _ai3(name: str, batch: int, threads: int, repeat: int) -> dict:
    import ai3
    import torch

    torch.set_num_threads(threads)
    net, x = _build(name, batch)
    model = ai3.convert(net, sample_input_shape=tuple(x.shape))
    with torch.inference_mode():
        total = _time(lambda: model(x), repeat)
        rows = model.profile(x, repeat=repeat)
    nodes = []
    for r in rows:
        i, o = (r["input_shapes"][0] if r["input_shapes"] else []), r["output_shape"]
        if r["op"] == "linear" and len(i) > 2:
            # As ONNX Runtime runs it: one 2-D product over the leading dimensions.
            i, o = [math.prod(i[:-1]), i[-1]], [math.prod(o[:-1]), o[-1]]
        what = f"{r['op']} {r['algorithm']}" + (f"+{r['fused']}" if r["fused"] else "")
        nodes.append({"in": i, "out": o, "what": what, "ms": r["ms"]})
    return {"total_ms": total, "nodes": nodes}


def _ort(name: str, batch: int, threads: int, repeat: int, onnx_path: str) -> dict:
    import onnxruntime as ort

    _, x = _build(name, batch)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x.numpy()}
    # Timed without the profiler, then profiled.
    total = _time(lambda: sess.run(None, feed), repeat)
    opts.enable_profiling = True
    sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    for _ in range(repeat + 1):
        sess.run(None, feed)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    times = collections.defaultdict(list)
    info = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        times[e["name"]].append(e["dur"] / 1e3)
        args = e["args"]
        shapes = [_first_shape(args, k) for k in ("input_type_shape", "output_type_shape")]
        info[e["name"]] = (*shapes, args["op_name"])
    nodes = []
    for node, ts in times.items():
        ts = sorted(ts[1:] or ts)  # the first run warms up
        i, o, op = info[node]
        nodes.append({"in": i, "out": o, "what": op, "ms": ts[len(ts) // 2]})
    return {"total_ms": total, "nodes": nodes}


def _first_shape(args: dict, key: str) -> list[int]:
    """The shape of a profiled node's first input or output (``[]`` if none)."""
    entries = args.get(key) or [{}]
    return next(iter(entries[0].values()), [])


def _time(fn, repeat: int) -> float:
    """Median milliseconds of ``fn`` over ``repeat`` timed calls, after two warm-ups."""
    fn()
    fn()
    ts = []
    for _ in range(max(repeat, 3)):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def _in_process(engine: str, args: list[str]) -> dict:
    got = subprocess.run(
        [sys.executable, __file__, "--worker", engine, *args], capture_output=True, text=True
    )
    if got.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{got.stderr[-3000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _shape(s: list[int]) -> str:
    return "x".join(map(str, s))


def compare(ai3_prof: dict, ort_prof: dict) -> list[dict]:
    """Groups both engines' nodes by (input shape, output shape)."""
    groups: dict = collections.defaultdict(lambda: {"ai3": [], "ort": []})
    for engine, prof in (("ai3", ai3_prof), ("ort", ort_prof)):
        for n in prof["nodes"]:
            groups[(_shape(n["in"]), _shape(n["out"]))][engine].append(n)
    rows = []
    for (i, o), g in groups.items():
        a, r = g["ai3"], g["ort"]
        rows.append(
            {
                "shapes": f"{i} -> {o}",
                "ai3_nodes": len(a),
                "ort_nodes": len(r),
                "ai3": ", ".join(sorted({n["what"] for n in a})),
                "ort": ", ".join(sorted({n["what"] for n in r})),
                "ai3_ms": sum(n["ms"] for n in a),
                "ort_ms": sum(n["ms"] for n in r),
            }
        )
    rows.sort(key=lambda r: -abs(r["ai3_ms"] - r["ort_ms"]))
    return rows


def markdown(name: str, batch: int, a: dict, o: dict, rows: list[dict], top: int) -> str:
    sum_a = sum(n["ms"] for n in a["nodes"])
    sum_o = sum(n["ms"] for n in o["nodes"])
    lines = [
        f"### {name}, batch {batch}",
        "",
        f"End to end: ai3 {a['total_ms']:.2f} ms, ONNX Runtime {o['total_ms']:.2f} ms "
        f"({a['total_ms'] / o['total_ms']:.2f}x). Nodes summed: ai3 {sum_a:.2f} ms, "
        f"ONNX Runtime {sum_o:.2f} ms. (A sum of per-node medians reads below the median "
        "whole run, each node's slow calls falling in different runs; ONNX Runtime's "
        "profiler adds its own cost to each node: compare networks end to end, layers "
        "below.)",
        "",
        "| input -> output | nodes (ai3 / ORT) | ai3 | ORT | ai3 ms | ORT ms | difference |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows[:top]:
        lines.append(
            f"| {r['shapes']} | {r['ai3_nodes']} / {r['ort_nodes']} | {r['ai3'] or '-'} "
            f"| {r['ort'] or '-'} | {r['ai3_ms']:.3f} | {r['ort_ms']:.3f} "
            f"| {r['ai3_ms'] - r['ort_ms']:+.3f} |"
        )
    rest = rows[top:]
    if rest:
        diff = sum(r["ai3_ms"] - r["ort_ms"] for r in rest)
        lines.append(f"| {len(rest)} more groups | | | | | | {diff:+.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", help="a torchvision model name")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 2))
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per node")
    ap.add_argument("--top", type=int, default=15, help="groups to list")
    ap.add_argument("--out", help="also write the Markdown table here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "ai3":
        print(json.dumps(_ai3(args.model, args.batch, args.threads, args.repeat)))
        return
    if args.worker == "ort":
        print(json.dumps(_ort(args.model, args.batch, args.threads, args.repeat, args.onnx)))
        return
    common = ["--model", args.model, "--batch", str(args.batch)]
    common += ["--threads", str(args.threads), "--repeat", str(args.repeat)]
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, f"{args.model}.onnx")
        why = export_onnx(args.model, args.batch, onnx_path)
        if why:
            raise SystemExit(why)
        o = _in_process("ort", [*common, "--onnx", onnx_path])
    a = _in_process("ai3", common)
    text = markdown(args.model, args.batch, a, o, compare(a, o), args.top)
    text += f"\nMachine: {machine(args.threads)}\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
