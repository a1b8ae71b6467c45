"""``ai3.explore``: time every algorithm of every layer of a network, next to
PyTorch, and return a :class:`~ai3.autotune.report.Report` holding the best
plan."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from ..errors import InvalidArgumentError
from .auto import PROGRESS, Auto
from .report import AlgorithmResult, LayerResult, Report
from .timing import interleaved_ms, random_inputs

#: The operations :func:`explore` times by default: those with a choice of algorithms.
DEFAULT_OPS = ("conv2d", "linear")


class _Bar:
    """The progress bar over layers x algorithms (tqdm), or nothing."""

    def __init__(self, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=0, unit="algo", desc="exploring", leave=True)

    def add(self, n: int) -> None:
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def step(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _torch_layer_ms(module: nn.Module, name: str, shapes, dtype, repeat: int) -> float | None:
    """PyTorch's own time for the submodule ``name`` (None for a function call)."""
    try:
        sub = module.get_submodule(name)
    except AttributeError:
        return None
    if sub is module or not isinstance(sub, nn.Module):
        return None
    xs = random_inputs(shapes[:1], dtype)
    with torch.inference_mode():
        return interleaved_ms({"torch": lambda: sub(*xs)}, repeat)["torch"]


def _flops(sig: dict[str, Any], output_shape: Sequence[int]) -> float | None:
    """Multiply-adds x 2 of a conv2d or linear layer: each output element sums
    one weight row (``in_channels/groups x kernel`` or ``in_features``)."""
    if sig["op"] not in ("conv2d", "linear"):
        return None
    w = sig["params"].get("weight")
    wshape = w["tensor"] if isinstance(w, dict) else sig["input_shapes"][1]
    row = 1
    for d in wshape[1:]:
        row *= d
    out = 1
    for d in output_shape:
        out *= d
    return 2.0 * out * row


def explore(
    module: nn.Module,
    sample_input_shape: Sequence[int],
    ops: Sequence[str] = DEFAULT_OPS,
    algorithms: Sequence[str] | None = None,
    *,
    repeat: int = 7,
    tolerance: float | None = None,
    max_workspace: int | None = None,
    dtype: torch.dtype | None = None,
    cache: bool = True,
    progress: bool = True,
    compare: bool = True,
) -> Report:
    """Times every algorithm that can run each layer of ``ops`` on its input
    shape (from ``sample_input_shape``), next to PyTorch, and picks the fastest
    whose error against a float64 reference is within ``tolerance`` and whose
    scratch memory is within ``max_workspace`` bytes.

    Returns a :class:`~ai3.autotune.report.Report`: per layer its parameters,
    input shape and PyTorch's time, per algorithm its median latency,
    GFLOP/s, workspace and error (or why it cannot run), the choice, and
    (with ``compare``) the end-to-end latency of the network with the best
    plan, with ``'default'`` and in PyTorch eager, measured in one interleaved
    run. ``print(report)`` shows the table; ``report.plan`` is the
    :class:`ai3.Plan` to save and deploy; ``report.save(folder)`` writes the
    CSV, the JSON report, the plan and (with matplotlib) a PNG.

    ``algorithms`` restricts the candidates; ``repeat`` is the most timed
    calls per algorithm; measurements come from and go to the disk cache
    unless ``cache=False``; ``progress`` shows a progress bar.

    Example::

        report = ai3.explore(torchvision.models.resnet18(), (1, 3, 224, 224))
        print(report)
        report.plan.save("resnet18.plan.json")
    """
    from ..convert import convert
    from ..selectors import op_name

    if not isinstance(module, nn.Module):
        raise TypeError(f"explore: expected a torch.nn.Module, got {type(module).__name__}")
    if sample_input_shape is None:
        raise InvalidArgumentError("explore: sample_input_shape is required")
    ops = tuple(op_name(op) for op in ops)
    if not ops:
        raise InvalidArgumentError("explore: ops must name at least one operation")
    auto = Auto(
        tolerance=tolerance,
        max_workspace=max_workspace,
        algorithms=tuple(algorithms) if algorithms is not None else None,
        repeat=repeat,
        cache=cache,
        measure_all=True,
    )
    module = module.eval()
    bar = _Bar(progress)
    token = PROGRESS.set(bar)
    try:
        best = convert(module, {op: auto for op in ops}, sample_input_shape, dtype=dtype)
    finally:
        PROGRESS.reset(token)
        bar.close()
    plan = best.plan()
    tdtype = best.dtype
    rows = {r["name"]: r for r in best.summary(plan.input_shapes)}
    layers = []
    with torch.inference_mode() if compare else nullcontext():
        for layer in plan.layers:
            sig = layer.signature
            flops = _flops(sig, rows[layer.name]["output_shape"])
            results = []
            for name, m in (layer.measurements or {}).items():
                ms = None if m["seconds"] is None else m["seconds"] * 1e3
                results.append(
                    AlgorithmResult(
                        algorithm=name,
                        ms=ms,
                        gflops=None if not ms or flops is None else flops / ms / 1e6,
                        workspace_bytes=m["workspace_bytes"],
                        error=m["error"],
                        unusable=m["unusable"],
                    )
                )
            layers.append(
                LayerResult(
                    name=layer.name,
                    op=layer.op,
                    params=sig["params"],
                    fused=sig["params"].get("activation"),
                    input_shape=sig["input_shapes"][0],
                    torch_ms=(
                        _torch_layer_ms(module, layer.name, sig["input_shapes"], tdtype, repeat)
                        if compare
                        else None
                    ),
                    chosen=layer.algorithm,
                    algorithms=results,
                )
            )
        end_to_end = {}
        if compare:
            default = convert(module, None, sample_input_shape, dtype=dtype)
            xs = random_inputs(plan.input_shapes, tdtype)
            end_to_end = interleaved_ms(
                {
                    "ai3 (best plan)": lambda: best(*xs),
                    "ai3 ('default')": lambda: default(*xs),
                    "PyTorch eager": lambda: module(*xs),
                },
                rounds=max(repeat, 3),
            )
    return Report(layers=layers, end_to_end_ms=end_to_end, plan=plan)
