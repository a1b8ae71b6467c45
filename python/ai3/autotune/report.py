"""What :func:`ai3.explore` returns: per layer and algorithm, the measurements;
printed as a table, saved as CSV and JSON, drawn as a PNG (with matplotlib)."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .plan import Plan

#: What to install for :meth:`Report.plot`.
PLOTS_HINT = "pip install 'aithree[plots]' (matplotlib) to draw the report"


@dataclass
class AlgorithmResult:
    """One algorithm on one layer: median ``ms``, ``gflops``, ``workspace_bytes``,
    ``error`` (relative to the float64 reference), or ``unusable`` (why it
    cannot run the layer). ``ms`` is None when it was not timed (unusable,
    beyond the tolerance or the workspace limit)."""

    algorithm: str
    ms: float | None
    gflops: float | None
    workspace_bytes: int
    error: float | None
    unusable: str | None


@dataclass
class LayerResult:
    """One layer: ``name``, ``op``, ``params`` (weights by shape), the activation
    ``fused`` into it, ``input_shape``, PyTorch's own ``torch_ms`` for it (None
    for a function call), the ``chosen`` algorithm and every algorithm's result."""

    name: str
    op: str
    params: dict[str, Any]
    fused: Any
    input_shape: list[int]
    torch_ms: float | None
    chosen: str
    algorithms: list[AlgorithmResult] = field(default_factory=list)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _params_text(op: str, params: dict[str, Any]) -> str:
    """A short description: the weight's shape, else the operation."""
    w = params.get("weight")
    if isinstance(w, dict) and "tensor" in w:
        return "x".join(map(str, w["tensor"]))
    return op


@dataclass
class Report:
    """The result of :func:`ai3.explore`.

    ``layers`` holds a :class:`LayerResult` per layer, ``end_to_end_ms`` the
    network's median latency per engine (``'ai3 (best plan)'``,
    ``"ai3 ('default')"``, ``'PyTorch eager'``), ``plan`` the :class:`ai3.Plan`
    of the choices. ``print(report)`` shows a table in milliseconds; a ``*``
    marks each layer's choice and ``x`` an algorithm that cannot run it.
    """

    layers: list[LayerResult]
    end_to_end_ms: dict[str, float]
    plan: Plan

    def algorithm_names(self) -> list[str]:
        """Every algorithm that appears, in first-seen order."""
        return list(dict.fromkeys(a.algorithm for layer in self.layers for a in layer.algorithms))

    def __str__(self) -> str:
        names = [
            n
            for n in self.algorithm_names()
            if any(
                a.algorithm == n and a.unusable is None for la in self.layers for a in la.algorithms
            )
        ]
        header = ["layer", "op", "weight", "input", "torch", *names, "chosen"]
        body = []
        for layer in self.layers:
            by = {a.algorithm: a for a in layer.algorithms}
            cells = []
            for n in names:
                a = by.get(n)
                if a is None or a.unusable is not None:
                    cells.append("x")
                else:
                    cells.append(_ms(a.ms) + ("*" if n == layer.chosen else ""))
            body.append(
                [layer.name, layer.op, _params_text(layer.op, layer.params),
                 "x".join(map(str, layer.input_shape)), _ms(layer.torch_ms), *cells, layer.chosen]
            )  # fmt: skip
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        right = set(range(4, len(header) - 1))
        lines = [
            "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in [header, *body]
        ]  # fmt: skip
        out = ["per-layer median latency, ms (* chosen, x cannot run)", *lines]
        if self.end_to_end_ms:
            out.append("")
            out.append("end to end, ms (interleaved run):")
            width = max(len(k) for k in self.end_to_end_ms)
            for k, v in self.end_to_end_ms.items():
                out.append(f"  {k:<{width}}  {v:.3f}")
        return "\n".join(out)

    __repr__ = __str__

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (what :meth:`save_json` writes)."""
        return {
            "layers": [asdict(layer) for layer in self.layers],
            "end_to_end_ms": self.end_to_end_ms,
            "plan": self.plan.to_dict(),
        }

    def save_json(self, path: str | os.PathLike) -> None:
        """Writes :meth:`to_dict` as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    def save_csv(self, path: str | os.PathLike) -> None:
        """One row per (layer, algorithm), then one per end-to-end engine."""
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["layer", "op", "input_shape", "torch_ms", "algorithm", "ms", "gflops",
                        "workspace_bytes", "max_error", "chosen", "unusable"])  # fmt: skip
            for layer in self.layers:
                for a in layer.algorithms:
                    w.writerow([
                        layer.name, layer.op, "x".join(map(str, layer.input_shape)),
                        layer.torch_ms, a.algorithm, a.ms, a.gflops, a.workspace_bytes,
                        a.error, a.algorithm == layer.chosen, a.unusable or "",
                    ])  # fmt: skip
            for k, v in self.end_to_end_ms.items():
                w.writerow(["(network)", "", "", "", k, v, "", "", "", "", ""])

    def plot(self, path: str | os.PathLike) -> None:
        """Draws per-layer grouped bars of each algorithm's latency, PyTorch's
        time marked, into ``path`` (PNG). Needs matplotlib (``aithree[plots]``)."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError(f"Report.plot needs matplotlib: {PLOTS_HINT}") from e
        timed = {a.algorithm for la in self.layers for a in la.algorithms if a.ms is not None}
        names = [n for n in self.algorithm_names() if n in timed]
        n = len(self.layers)
        fig, ax = plt.subplots(figsize=(max(7.0, 0.7 * n + 3), 4.5))
        width = 0.8 / max(len(names), 1)
        for j, name in enumerate(names):
            xs, ys, edges = [], [], []
            for i, layer in enumerate(self.layers):
                a = next((a for a in layer.algorithms if a.algorithm == name), None)
                if a is not None and a.ms is not None:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(a.ms)
                    edges.append("black" if name == layer.chosen else "none")
            ax.bar(xs, ys, width, label=name, edgecolor=edges, linewidth=1.5)
        torch_x = [i for i, la in enumerate(self.layers) if la.torch_ms is not None]
        if torch_x:
            ax.scatter(torch_x, [self.layers[i].torch_ms for i in torch_x], marker="_", s=400,
                       color="black", linewidths=2, zorder=3, label="PyTorch")  # fmt: skip
        ax.set_xticks(range(n))
        ax.set_xticklabels([la.name for la in self.layers], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("median latency (ms)")
        ax.set_yscale("log")
        ax.set_title("ai3 explore: per-layer latency per algorithm (outlined: chosen)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    def save(self, folder: str | os.PathLike) -> dict[str, Path]:
        """Writes ``report.csv``, ``report.json``, ``plan.json`` and (with
        matplotlib) ``report.png`` into ``folder``; returns what it wrote by kind."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = {
            "csv": out / "report.csv",
            "json": out / "report.json",
            "plan": out / "plan.json",
        }
        self.save_csv(written["csv"])
        self.save_json(written["json"])
        self.plan.save(written["plan"])
        try:
            self.plot(out / "report.png")
            written["png"] = out / "report.png"
        except ImportError:
            pass
        return written
