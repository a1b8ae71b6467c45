"""Convert-time rewrites: BatchNorm folded into the convolution before it, and
activations fused into the convolution, linear, (unfolded) batch norm or
elementwise arithmetic node that feeds them.

Both only fire when the producer's value has no other reader, so the
rewritten network computes the same function. The algorithm the user chose
for the convolution is still the one that runs, and an activation that runs
the user's C++ (``'custom'``) is never fused away.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from . import _core
from ._lowering import Alias, Lowerer, Step

#: Activations a producer in ``PRODUCERS`` can apply to its own output.
FUSABLE = {
    "relu",
    "relu6",
    "hardtanh",
    "hardswish",
    "hardsigmoid",
    "silu",
    "sigmoid",
    "tanh",
    "gelu",
}


#: Nodes that can apply an activation to their own output as they write it.
PRODUCERS = ("conv2d", "linear", "batchnorm2d", "add", "sub", "mul", "div")


def _readers(lw: Lowerer, steps: list[Step]) -> dict[torch.fx.Node, int]:
    count: dict[torch.fx.Node, int] = defaultdict(int)
    for s in steps:
        for i in s.inputs:
            count[lw.canonical(i)] += 1
    for o in lw.outputs:
        count[lw.canonical(o)] += 1
    return count


def _producer(lw: Lowerer, steps: list[Step], s: Step, ops: tuple[str, ...]) -> Step | None:
    """The step producing ``s``'s single input, if it is one of ``ops`` and ``s`` is its only reader."""
    if len(s.inputs) != 1:
        return None
    src = lw.canonical(s.inputs[0])
    prod = next((p for p in steps if p.node is src), None)
    if prod is None or prod.op not in ops or _readers(lw, steps)[src] != 1:
        return None
    return prod


def _fold(conv: Step, bn: Step) -> None:
    weight, bias = conv.params["weight"], conv.params.get("bias")
    p = bn.params
    gamma, beta, mean, var = p.get("weight"), p.get("bias"), p["running_mean"], p["running_var"]
    with torch.no_grad():
        w = weight.detach().double()
        scale = 1.0 / torch.sqrt(var.detach().double() + p["eps"])
        if gamma is not None:
            scale = scale * gamma.detach().double()
        b = torch.zeros_like(scale) if bias is None else bias.detach().double()
        b = (b - mean.detach().double()) * scale
        if beta is not None:
            b = b + beta.detach().double()
        conv.params["weight"] = (w * scale.view(-1, 1, 1, 1)).to(weight.dtype)
        conv.params["bias"] = b.to(weight.dtype)


def _weights(s: Step) -> list[Any]:
    """The step's weight parameters (tensors, ``In`` placeholders or None)."""
    names = ("weight", "bias", "running_mean", "running_var")
    return [s.params.get(k) for k in names]


def apply(lw: Lowerer, algo_of: dict[int, Any]) -> list[Step]:
    """Folds and fuses in place; returns the steps that still run.
    ``algo_of`` maps ``id(step)`` to the algorithm chosen for it."""
    steps = list(lw.steps)
    for bn in [s for s in steps if s.op == "batchnorm2d"]:
        conv = _producer(lw, steps, bn, ("conv2d",))
        # Only weights held as tensors can be folded; graph values change per call.
        held = conv is not None and all(
            isinstance(a, torch.Tensor) or a is None for a in (*_weights(conv), *_weights(bn))
        )
        if held and "activation" not in conv.params:
            _fold(conv, bn)
            lw.kind[bn.node] = Alias(conv.node)
            steps.remove(bn)
    for act in [s for s in steps if s.op in FUSABLE]:
        prod = _producer(lw, steps, act, PRODUCERS)
        # An activation that runs the user's C++ must stay a node of its own, and
        # so must one whose algorithm is measured later ('auto' with a choice).
        algo = algo_of[id(act)]
        if not isinstance(algo, str) or _core.runs_custom(act.op, algo):
            continue
        if prod is not None and "activation" not in prod.params:
            prod.params["activation"] = (act.op, dict(act.params))
            lw.kind[act.node] = Alias(prod.node)
            steps.remove(act)
    return steps
