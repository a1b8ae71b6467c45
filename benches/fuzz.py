"""A long fuzzing campaign of ai3 against PyTorch.

Draws cases from the strategies of ``tests/fuzz_cases.py`` (hypothesis, seeded
with ``--seed``), runs each in one of ``--workers`` worker processes
(``tests/fuzz_worker.py``: an abort or a hang is a verdict, not a dead run),
prints the first case of each new failure class as it is found, then a
summary (counts per verdict, per family, and the distinct failure classes) and writes every failing case with its verdict to ``--out`` for
replay::

    python benches/fuzz.py --examples 20000 --workers 2 --seed 1
    python benches/fuzz.py --replay fuzz_failures.json       # run them again
    python tests/fuzz_check.py '<one case as JSON>'          # in-process, with a backtrace

The property: every case matches PyTorch, or both raise (ai3 with an
``ai3.Error``), or ai3 declines a configuration it documents as unsupported.
Exit status 1 when any case failed it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import queue
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
if importlib.util.find_spec("ai3") is None:  # not installed: the source tree's development build
    sys.path.insert(1, str(ROOT / "python"))

import fuzz_cases  # noqa: E402
import fuzz_known  # noqa: E402
from fuzz_check import ACCEPTABLE, conv_algorithms  # noqa: E402
from fuzz_worker import MEMORY_LIMIT, Worker  # noqa: E402

fuzz_cases.set_conv_algorithms(conv_algorithms())
_DONE = object()


def family(case: dict) -> str:
    """The case's family for the summary (``conv2d[fft]``, ``maxpool2d``, ``binary``, ...)."""
    kind = case["kind"]
    if kind == "conv2d":
        return f"conv2d[{case['algorithm']}]"
    if kind == "activation":
        return f"activation[{case['name']}]"
    return kind


def failure_class(case: dict, verdict: dict) -> str:
    """A short key grouping failures with the same cause."""
    v = verdict["verdict"]
    if v in ("abort", "hang"):
        crash = verdict.get("crash", "")
        crash = crash.split(" of ")[0] if crash.startswith("memory allocation") else crash
        return (
            f"{v} {case['kind']}/{case.get('mode')}: {crash[:100] or verdict.get('signal') or ''}"
        )
    err = verdict.get("ai3_error") or verdict.get("detail") or verdict.get("torch_error") or ""
    return f"{v} {case['kind']}/{case.get('mode')}: {err.split(':')[0]}"


def generate(examples: int, seed: int, families: tuple[str, ...], out: queue.Queue) -> None:
    """Puts ``examples`` cases drawn by hypothesis (seeded), shared among ``families`` by
    ``fuzz_cases.WEIGHTS``, on ``out``, then a stop mark."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    try:
        for fam, count in fuzz_cases.split(examples, families).items():

            @hseed(seed)
            @settings(
                max_examples=count,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(fuzz_cases.cases(fam))
            def draw(case):
                out.put(case)

            draw()
    finally:
        out.put(_DONE)


def campaign(args: argparse.Namespace) -> int:
    families = tuple(args.families.split(",")) if args.families else fuzz_cases.FAMILIES
    if args.replay:
        records = json.loads(Path(args.replay).read_text())
        cases = [r.get("case", r) for r in records]
        todo: queue.Queue = queue.Queue()
        for c in cases:
            todo.put(c)
        todo.put(_DONE)
        total = len(cases)
    else:
        todo = queue.Queue(maxsize=4 * args.workers)
        threading.Thread(
            target=generate, args=(args.examples, args.seed, families, todo), daemon=True
        ).start()
        total = args.examples

    results: list[tuple[dict, dict]] = []
    seen: set[str] = set()
    lock = threading.Lock()
    start = time.monotonic()

    def consume() -> None:
        with Worker(
            timeout=args.timeout, memory_limit=args.memory_limit, threads=args.threads
        ) as w:
            while True:
                case = todo.get()
                if case is _DONE:
                    todo.put(_DONE)  # let the other consumers stop too
                    return
                verdict = w.run(case)
                with lock:
                    results.append((case, verdict))
                    done = len(results)
                    key = failure_class(case, verdict)
                    if args.replay or (verdict["verdict"] not in ACCEPTABLE and key not in seen):
                        seen.add(key)
                        print(
                            f"[{done}] {verdict['verdict']}: {json.dumps(case)}\n    {_short(verdict)}",
                            flush=True,
                        )
                    if done % args.progress == 0:
                        bad = sum(v["verdict"] not in ACCEPTABLE for _, v in results)
                        rate = done / (time.monotonic() - start)
                        print(
                            f"... {done}/{total} cases, {bad} failing, {rate:.1f} cases/s",
                            flush=True,
                        )

    threads = [threading.Thread(target=consume) for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    return report(results, elapsed, args)


def _short(verdict: dict) -> str:
    shown = {k: v for k, v in verdict.items() if k not in ("stderr", "traceback")}
    if "stderr" in verdict:
        shown["stderr"] = verdict["stderr"][-400:]
    return json.dumps(shown)


def report(results: list[tuple[dict, dict]], elapsed: float, args: argparse.Namespace) -> int:
    """Prints the summary, writes the failures; returns the exit status."""
    verdicts = Counter(v["verdict"] for _, v in results)
    by_family: dict[str, Counter] = {}
    for case, v in results:
        by_family.setdefault(family(case), Counter())[v["verdict"]] += 1
    columns = sorted(verdicts, key=lambda k: (k not in ACCEPTABLE, k))
    width = max([len(f) for f in by_family] + [6])
    print()
    print(f"{'family':<{width}} " + " ".join(f"{c:>17}" for c in columns))
    for fam in sorted(by_family):
        print(f"{fam:<{width}} " + " ".join(f"{by_family[fam][c]:>17}" for c in columns))
    print(f"{'total':<{width}} " + " ".join(f"{verdicts[c]:>17}" for c in columns))
    unique = len({json.dumps(c, sort_keys=True) for c, _ in results})
    failures = [(c, v) for c, v in results if v["verdict"] not in ACCEPTABLE]
    classes = Counter(failure_class(c, v) for c, v in failures)
    source = f"replay of {args.replay}" if args.replay else f"seed {args.seed}"
    print(f"\n{len(results)} cases ({unique} distinct) in {elapsed:.0f} s, {source}: "
          f"{len(failures)} failing, {verdicts['abort']} aborts, {verdicts['hang']} hangs, "
          f"{verdicts['mismatch']} mismatches")  # fmt: skip
    if classes:
        print("failure classes:")
        for key, count in classes.most_common():
            print(f"  {count:>6}  {key}")
        names = {id(b): n for n, b in fuzz_known.KNOWN_BUGS.items()}
        known = Counter(names.get(id(fuzz_known.explain(c, v)), "NEW (not in tests/fuzz_known.py)")
                        for c, v in failures)  # fmt: skip
        print("by the bugs listed in tests/fuzz_known.py:")
        for name, count in known.most_common():
            print(f"  {count:>6}  {name}")
    if failures and args.out:
        Path(args.out).write_text(
            json.dumps([{"case": c, "verdict": v} for c, v in failures], indent=1)
        )
        print(
            f"failing cases written to {args.out} (replay: python benches/fuzz.py --replay {args.out})"
        )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000, help="cases to run (default 20000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes in parallel")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds per case before 'hang'"
    )
    parser.add_argument(
        "--families", default="", help=f"comma-separated subset of {','.join(fuzz_cases.FAMILIES)}"
    )
    parser.add_argument(
        "--memory-limit", type=int, default=MEMORY_LIMIT, help="worker address-space limit, bytes"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="ai3 threads per worker (PyTorch runs on 1)"
    )
    parser.add_argument("--out", default="fuzz_failures.json", help="where failing cases go")
    parser.add_argument("--replay", default="", help="run the cases of a failures file instead")
    parser.add_argument(
        "--progress", type=int, default=500, help="print a progress line every N cases"
    )
    return campaign(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
