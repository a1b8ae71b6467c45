"""``ai3.Model``: a whole network held and run by ai3's Rust executor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import _core, threads
from .errors import DeviceError

__all__ = ["Model"]


def _build(recipe: dict[str, Any]) -> _core.Model:
    core = _core.Model(recipe["dtype"], recipe["num_inputs"], copy_weights=False)
    for method, args, kwargs in recipe["nodes"]:
        getattr(core, method)(*args, **kwargs)
    core.set_outputs(recipe["outputs"])
    return core


def _prepare_input(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise DeviceError(
                f"model: input of shape {list(x.shape)} is on {x.device}, but this model runs on the CPU"
            )
        # A tensor that requires grad cannot be exported; the model never records gradients.
        return x.detach()
    return x


class Model:
    """A network converted by :func:`ai3.convert`; every layer runs in Rust.

    Call it like the PyTorch module it came from: ``model(x)``. The GIL is
    released for the whole forward pass and no Python runs between layers, so
    several threads may call one model at once. Models pickle and deep-copy
    (their weights are kept with them).
    """

    def __init__(self, recipe: dict[str, Any]):
        self._recipe = recipe
        self._core = _build(recipe)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in; inputs must have it."""
        return getattr(torch, self._core.dtype)

    def __call__(self, *inputs: Any) -> Any:
        return self.predict(*inputs)

    def forward(self, *inputs: Any) -> Any:
        """Same as calling the model."""
        return self.predict(*inputs)

    def predict(self, *inputs: Any, out_type: Any = None) -> Any:
        """Runs the network. ``out_type`` may be ``torch.Tensor`` (the default) or
        ``numpy.ndarray``; outputs are returned without a copy."""
        threads.sync()
        capsules = self._core.run([_prepare_input(x) for x in inputs])
        outs = [torch.from_dlpack(c) for c in capsules]
        if out_type is not None and out_type is not torch.Tensor:
            if getattr(out_type, "__name__", "") == "ndarray":
                outs = [o.numpy() for o in outs]
            else:
                raise TypeError(f"out_type must be torch.Tensor or numpy.ndarray, got {out_type!r}")
        if self._recipe["single_output"]:
            return outs[0]
        return tuple(outs)

    def _shapes(self, input_shape: Any) -> list[list[int]]:
        shape = input_shape or self._recipe.get("sample_input_shape")
        if shape is None:
            raise ValueError("an input shape is needed (none was given to convert)")
        if len(shape) and isinstance(shape[0], Sequence):
            return [list(s) for s in shape]  # one shape per input
        return [list(shape)]

    def summary(self, input_shape: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """One dict per layer: name, op, the algorithm that runs for this input
        shape, input shapes and output shape. Defaults to the sample input shape
        given to ``convert``; give a list of shapes for a model with several inputs."""
        return self._core.summary(self._shapes(input_shape))

    def profile(self, *inputs: Any, repeat: int = 10) -> list[dict[str, Any]]:
        """Times every layer on these inputs: the :meth:`summary` rows, each with
        ``ms``, the layer's median time over ``repeat`` runs (after one warm-up run).

        >>> rows = model.profile(torch.randn(1, 3, 224, 224))
        >>> max(rows, key=lambda r: r["ms"])["name"]  # the slowest layer
        """
        if repeat < 1:
            raise ValueError(f"profile: repeat must be at least 1, got {repeat}")
        threads.sync()
        prepared = [_prepare_input(x) for x in inputs]
        _, times = self._core.profile(prepared, repeat)
        rows = self._core.summary([list(x.shape) for x in prepared])
        for row, t in zip(rows, times, strict=True):
            row["ms"] = t * 1e3
        return rows

    def memory_plan(self, input_shape: Sequence[int] | None = None) -> dict[str, int]:
        """What the memory planner decided for this input shape: ``arena_bytes``
        (one arena holds every intermediate value), ``intermediate_bytes`` (what
        they would take if none shared memory) and ``arenas_allocated`` (arenas
        created so far over all calls: one per thread running concurrently, and
        a new one only when the input shape grows)."""
        return self._core.memory_plan(self._shapes(input_shape))

    def __repr__(self) -> str:
        shape = self._recipe.get("sample_input_shape")
        lines = [f"ai3.Model(dtype={self._core.dtype}"]
        if shape is not None:
            lines[0] += f", input_shape={list(shape)})"
            for r in self.summary(shape):
                ins = ", ".join(str(s) for s in r["input_shapes"])
                op = r["op"] + (f"+{r['fused']}" if r["fused"] else "")
                lines.append(
                    f"  {r['name']:<28} {op:<18} {r['algorithm']:<9} {ins} -> {r['output_shape']}"
                )
        else:
            lines[0] += ")"
            # Without shapes only the requested algorithm is known ('default' resolves per shape).
            for method, args, _ in self._recipe["nodes"]:
                if method != "constant":
                    lines.append(f"  {args[0]:<28} {method:<18} {args[-1]}")
        return "\n".join(lines)

    def __reduce__(self):
        return (Model, (self._recipe,))

    def __deepcopy__(self, memo):
        import copy

        return Model(copy.deepcopy(self._recipe, memo))
