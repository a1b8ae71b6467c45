"""ai3 against the engines a user would pick instead for CPU inference.

Engines: PyTorch eager, ``torch.compile`` (inductor), ONNX Runtime, OpenVINO, ai3's
``convert`` with ``'default'`` and ai3's ``swap_conv2d`` (the rest stays PyTorch).
Each engine runs in a process of its own, so one engine's idle thread pool (ONNX
Runtime's and OpenMP's spin after each call) never slows another; the engines take
turns in rounds whose order reverses every round (ABBA), with a pause between turns,
so drift on a shared machine hits all of them alike. Every engine gets the same
thread count, the same random weights (seed 0) and the same input; each reports its
output's largest error relative to PyTorch eager's.

    pip install 'aithree[bench]'      # onnxruntime, openvino, onnx, onnxscript
    python benches/compare_engines.py                          # every network, batch 1 and 10
    python benches/compare_engines.py --models resnet50 --batch 1 --engines eager ai3 ort
    python benches/compare_engines.py --out benches/results/engines.json   # also .md, .png
    python benches/compare_engines.py --busy-core --batch 1    # another process on one core

An engine that is not installed, or that fails on a network, is reported as such
and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from host import cpu_name

MODELS = [
    "squeezenet1_1",
    "resnet50",
    "mobilenet_v2",
    "efficientnet_b0",
    "googlenet",
    "densenet121",
    "vgg16",
    "alexnet",
    "convnext_tiny",
]
ENGINES = ["eager", "compile", "ort", "openvino", "ai3", "ai3_swap"]
LABELS = {
    "eager": "PyTorch eager",
    "compile": "torch.compile",
    "ort": "ONNX Runtime",
    "openvino": "OpenVINO",
    "ai3": "ai3 convert",
    "ai3_swap": "ai3 swap_conv2d",
}


# --- worker side: one engine, one network, one batch -------------------------------


def _build(name: str, batch: int):
    import torch
    import torchvision

    torch.manual_seed(0)
    net = getattr(torchvision.models, name)(weights=None).eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 224, 224, generator=gen)
    return net, x


def _engine(engine: str, name: str, batch: int, onnx_path: str, threads: int):
    """A no-argument callable that runs one forward pass and returns a float32
    numpy array, built for ``engine``."""
    import torch

    torch.set_num_threads(threads)
    net, x = _build(name, batch)
    if engine == "eager":
        return lambda: net(x).numpy()
    if engine == "compile":
        compiled = torch.compile(net)
        return lambda: compiled(x).numpy()
    if engine == "ai3":
        import ai3

        # The input's shape lets convert prove what it fuses (residual adds).
        model = ai3.convert(net, sample_input_shape=tuple(x.shape))
        return lambda: model(x).numpy()
    if engine == "ai3_swap":
        import ai3

        ai3.swap_conv2d(net, "default")
        return lambda: net(x).numpy()
    xn = x.numpy()
    if engine == "ort":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        feed_name = sess.get_inputs()[0].name
        return lambda: sess.run(None, {feed_name: xn})[0]
    if engine == "openvino":
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(
            core.read_model(onnx_path),
            "CPU",
            {
                "INFERENCE_NUM_THREADS": threads,
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_PRECISION_HINT": "f32",
            },  # fmt: skip
        )
        request = compiled.create_infer_request()

        def run():
            request.infer({0: xn})
            return request.get_output_tensor(0).data.copy()

        return run
    raise ValueError(f"unknown engine {engine!r}")


def worker(engine: str, name: str, batch: int, onnx_path: str, threads: int) -> None:
    """Builds the engine, answers ``run SECONDS`` lines with per-call milliseconds
    until ``quit``. All traffic is one JSON line each way."""
    import torch

    out = sys.stdout
    sys.stdout = sys.stderr  # engines' chatter must not corrupt the protocol
    try:
        start = time.perf_counter()
        # Built outside inference mode, as a user builds a network before
        # running it under torch.inference_mode(): parameters made inside it
        # are inference tensors, which PyTorch gives no version counter, so
        # swapped layers would rebuild their packed weights on every call.
        fn = _engine(engine, name, batch, onnx_path, threads)
        with torch.inference_mode():
            got = fn()  # warm-up (compiles for torch.compile)
            fn()
            setup = time.perf_counter() - start
            net, x = _build(name, batch)
            torch.set_num_threads(threads)
            want = net(x).numpy()
        err = float(abs(got - want).max() / max(abs(want).max(), 1e-30))
        out.write(json.dumps({"ok": True, "error": err, "setup_s": setup}) + "\n")
    except Exception as e:  # reported, the other engines go on
        out.write(json.dumps({"ok": False, "why": f"{type(e).__name__}: {e}"[:300]}) + "\n")
        out.flush()
        return
    out.flush()
    with torch.inference_mode():
        for line in sys.stdin:
            if line.startswith("quit"):
                return
            budget = float(line.split()[1])
            times = []
            start = time.perf_counter()
            while not times or time.perf_counter() - start < budget:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            out.write(json.dumps(times) + "\n")
            out.flush()


# --- driver side ---------------------------------------------------------------------


def export_onnx(name: str, batch: int, path: str) -> str | None:
    """Exports the network for ONNX Runtime and OpenVINO; the reason on failure."""
    import torch

    net, x = _build(name, batch)
    try:
        with torch.no_grad():
            torch.onnx.export(net, (x,), path, dynamo=True, optimize=True, verbose=False)
    except Exception as e:
        return f"ONNX export failed: {type(e).__name__}: {e}"[:300]
    return None


def busy_core(cpu: int) -> subprocess.Popen:
    """A process that keeps CPU ``cpu`` busy until killed: a pure Python loop
    pinned there, standing for other work on a shared machine."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def run_case(
    name: str,
    batch: int,
    engines: list[str],
    rounds: int,
    turn_s: float,
    threads: int,
    busy_cpu: int | None = None,
) -> dict:
    """Times every engine on one network and batch (with another process busy on
    CPU ``busy_cpu`` while timing, if given); returns per-engine results."""
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, f"{name}_b{batch}.onnx")
        if {"ort", "openvino"} & set(engines):
            why = export_onnx(name, batch, onnx_path)
            if why:
                for e in {"ort", "openvino"} & set(engines):
                    results[e] = {"ok": False, "why": why}
        procs = {}
        for e in engines:
            if e in results:
                continue
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            procs[e] = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    e,
                    name,
                    str(batch),
                    onnx_path,
                    str(threads),
                ],  # fmt: skip
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            # Built one at a time: building (compiling, exporting) loads the machine.
            hello = procs[e].stdout.readline()
            results[e] = json.loads(hello) if hello else {"ok": False, "why": "worker died"}
            if not results[e]["ok"]:
                procs.pop(e).wait()
        live = [e for e in engines if e in procs]
        times: dict[str, list[float]] = {e: [] for e in live}
        hog = busy_core(busy_cpu) if busy_cpu is not None else None
        try:
            for r in range(rounds):
                for e in live if r % 2 == 0 else reversed(live):
                    time.sleep(0.2)  # lets the previous engine's spinning threads park
                    procs[e].stdin.write(f"run {turn_s}\n")
                    procs[e].stdin.flush()
                    times[e] += json.loads(procs[e].stdout.readline())
        finally:
            if hog:
                hog.kill()
                hog.wait()
        for e in live:
            procs[e].stdin.write("quit\n")
            procs[e].stdin.close()
            procs[e].wait()
            results[e]["ms"] = statistics.median(times[e])
            results[e]["calls"] = len(times[e])
    return results


def fmt_row(name: str, batch: int, res: dict, engines: list[str]) -> str:
    def cell(e):
        r = res.get(e, {})
        return f"{r['ms']:.1f}" if "ms" in r else "failed"

    best = min((res[e]["ms"] for e in ("ort", "openvino") if "ms" in res.get(e, {})), default=None)
    ratios = []
    for e in ("ai3", "ai3_swap"):
        if e in engines:
            ratios.append(f"{res[e]['ms'] / best:.2f}" if best and "ms" in res.get(e, {}) else "-")
    eager = res.get("eager", {}).get("ms")
    vs_eager = [
        f"{res[e]['ms'] / eager:.2f}" if eager and "ms" in res.get(e, {}) else "-"
        for e in ("ai3", "ai3_swap")
        if e in engines
    ]
    return "| " + " | ".join([f"{name} b{batch}", *map(cell, engines), *ratios, *vs_eager]) + " |"


def header(engines: list[str]) -> str:
    ai3_cols = [e for e in ("ai3", "ai3_swap") if e in engines]
    cols = (
        ["network"]
        + [f"{LABELS[e]} ms" for e in engines]
        + [f"{LABELS[e]} / best of ORT, OpenVINO" for e in ai3_cols]
        + [f"{LABELS[e]} / eager" for e in ai3_cols]
    )
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def machine(threads: int) -> dict:
    import torch

    info = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    for mod in ("onnxruntime", "openvino", "ai3"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    return info


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install 'aithree[plots]')")
        return
    labels, series = [], {}
    ran = {e for row in rows for e, r in row["results"].items() if "ms" in r}
    engines = [e for e in ENGINES if e != "eager" and e in ran]
    for row in rows:
        eager = row["results"].get("eager", {}).get("ms")
        if not eager:
            continue
        labels.append(f"{row['model']} b{row['batch']}")
        for e in engines:
            ms = row["results"].get(e, {}).get("ms")
            series.setdefault(e, []).append(ms / eager if ms else 0.0)
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(labels) + 1.5))
    height = 0.8 / max(len(series), 1)
    for i, (e, vals) in enumerate(series.items()):
        ax.barh([j + i * height for j in range(len(labels))], vals, height, label=LABELS[e])
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(labels))], labels)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xlabel("latency / PyTorch eager latency (lower is better)")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        engine, name, batch, onnx_path, threads = sys.argv[2:7]
        worker(engine, name, int(batch), onnx_path, int(threads))
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 10])
    ap.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    ap.add_argument("--rounds", type=int, default=6, help="turns per engine (default 6)")
    ap.add_argument("--turn", type=float, default=1.0, help="seconds per turn (default 1)")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 2) or 1)
    ap.add_argument(
        "--busy-core",
        action="store_true",
        help="while timing, another process keeps the last CPU busy (a shared machine)",
    )
    ap.add_argument("--out", help="JSON file; a .md table and a .png chart go beside it")
    args = ap.parse_args()
    if args.out:
        # Made (and its folder checked) now, not after the whole run.
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    info = machine(args.threads)
    busy_cpu = max(os.sched_getaffinity(0)) if args.busy_core else None
    if busy_cpu is not None:
        info["busy_core"] = busy_cpu
    print(f"machine: {info}\n")
    table = [header(args.engines)]
    print(table[0], flush=True)
    rows = []
    for name in args.models:
        for batch in args.batch:
            res = run_case(
                name, batch, args.engines, args.rounds, args.turn, args.threads, busy_cpu
            )
            rows.append({"model": name, "batch": batch, "results": res})
            table.append(fmt_row(name, batch, res, args.engines))
            print(table[-1], flush=True)
            for e, r in res.items():
                if not r["ok"]:
                    print(f"  {LABELS[e]}: {r['why']}", flush=True)
                elif r["error"] > 1e-3:
                    print(f"  {LABELS[e]}: output differs from eager by {r['error']:.1e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": info, "rows": rows}, f, indent=1)
        base = os.path.splitext(args.out)[0]
        with open(base + ".md", "w") as f:
            f.write(f"Machine: {info}\n\n" + "\n".join(table) + "\n")
        plot(rows, base + ".png")


if __name__ == "__main__":
    main()
