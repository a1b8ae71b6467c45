"""What identifies a layer and a machine: the keys of the decision cache and of
plans.

A layer's signature is everything that decides which algorithm is fastest:
the operation, its parameters (weights by shape only), the activation fused
into it, its input shapes, the dtype and the device. The machine description adds what
the same layer's timings depend on beyond the layer: the CPU, its vector
instruction set, the thread count and ai3's version.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from collections.abc import Sequence
from typing import Any

import torch

from .. import threads

#: The parameter naming a node's fused activation: part of the timing
#: signature (the epilogue runs inside the timed kernel), not of a plan's layer
#: (a swapped layer and a converted one with a fused ReLU are the same layer).
_FUSED = "activation"
#: Operations whose bias is also an epilogue: ``convert`` gives a convolution
#: one when it folds the BatchNorm after it, which the same layer swapped alone
#: does not have.
_BIASED = ("conv2d", "linear")


def describe_arg(a: Any) -> Any:
    """A JSON-able description of one argument of a node: tensors by shape."""
    if isinstance(a, torch.Tensor):
        return {"tensor": list(a.shape)}
    if isinstance(a, (list, tuple)):
        return [describe_arg(x) for x in a]
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    return repr(a)


def node_signature(
    op: str,
    params: dict[str, Any],
    weights: Sequence[str],
    input_shapes: Sequence[Sequence[int]],
    dtype: str,
) -> dict[str, Any]:
    """The signature of a recipe node of ``op`` with these parameters (tensors
    by shape) and weight parameters read from graph values (``weights``);
    ``input_shapes`` are its inputs' and then those weights'. The node's name
    is not part of it: two layers alike in everything else share their timings.
    """
    described = {k: describe_arg(v) for k, v in params.items()}
    described.update(dict.fromkeys(weights, "value"))
    return {
        "op": op,
        "params": dict(sorted(described.items())),
        "input_shapes": [list(s) for s in input_shapes],
        "dtype": dtype,
        "device": "cpu",  # every ai3 model runs on the CPU so far
    }


def layer_key(signature: dict[str, Any]) -> dict[str, Any]:
    """The part of a signature a plan matches a layer on: all but the epilogue
    (the fused activation and the bias)."""
    params = {k: v for k, v in signature["params"].items() if k != _FUSED}
    if signature["op"] in _BIASED:
        params["bias"] = "bias?"
    return {**signature, "params": params}


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What this machine's timings depend on besides the layer."""
    from .. import __version__

    return {
        "cpu": _cpu_model(),
        "arch": platform.machine(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "system": platform.system(),
        "threads": threads.get_num_threads(),
        "ai3": __version__,
    }


def digest(obj: Any) -> str:
    """A stable hex digest of a JSON-able object."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
