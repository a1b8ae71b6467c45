"""Plans: the algorithm chosen for each layer, saved as JSON and applied later
without timing anything.

A plan lists its layers in forward order, each with its name, its signature
(operation, parameters, input shapes, dtype) and the chosen algorithm, plus
the machine it was made on and the network's input shapes. Applying it
(``convert(module, plan=...)``, ``swap_operation(..., plan=...)``) walks the
model's layers of the plan's operations in the same order and checks each
against the plan: a different layer or shape is a :class:`~ai3.PlanError`
naming the first mismatch. A plan made on another machine applies with a
warning (its choices may not be the fastest here).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PlanError
from .signature import layer_key, machine

#: The ``format`` field of a plan file, and the version this ai3 writes and reads.
FORMAT = "ai3-plan"
VERSION = 2


@dataclass
class PlanLayer:
    """One layer of a plan: its ``name`` (module path or graph node), ``op``,
    ``signature``, chosen ``algorithm`` and, from exploration, the
    ``measurements`` behind the choice (per algorithm)."""

    name: str
    op: str
    signature: dict[str, Any]
    algorithm: str
    measurements: dict[str, dict[str, Any]] | None = None


@dataclass
class Plan:
    """The algorithm of every layer of some operations of a network.

    Made by :func:`ai3.explore` (``report.plan``) or by a ``convert`` with
    ``'auto'`` (``model.plan()``); saved with :meth:`save`, read with
    :meth:`load`, applied with ``convert(module, plan=...)``.

    Example::

        plan = ai3.explore(net, (1, 3, 224, 224)).plan
        plan.save("net.plan.json")
        model = ai3.convert(net, plan="net.plan.json")   # times nothing
    """

    layers: list[PlanLayer]
    input_shapes: list[list[int]]
    dtype: str
    machine: dict[str, Any] = field(default_factory=machine)

    @property
    def ops(self) -> tuple[str, ...]:
        """The operations whose layers the plan chooses for, in order of first use."""
        return tuple(dict.fromkeys(layer.op for layer in self.layers))

    def algorithms(self) -> dict[str, str]:
        """Layer name -> chosen algorithm."""
        return {layer.name: layer.algorithm for layer in self.layers}

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-able data (what :meth:`save` writes)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "machine": self.machine,
            "dtype": self.dtype,
            "input_shapes": self.input_shapes,
            "layers": [
                {
                    "name": layer.name,
                    "op": layer.op,
                    "algorithm": layer.algorithm,
                    "signature": layer.signature,
                    **({"measurements": layer.measurements} if layer.measurements else {}),
                }
                for layer in self.layers
            ],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "plan") -> Plan:
        """Reads :meth:`to_dict`'s data; :class:`~ai3.PlanError` if it is not a plan."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise PlanError(f'{source} is not an ai3 plan (no "format": "{FORMAT}")')
        if data.get("version") != VERSION:
            raise PlanError(
                f"{source} is a version {data.get('version')!r} plan; this ai3 reads version {VERSION}"
            )
        try:
            layers = [
                PlanLayer(
                    name=str(x["name"]),
                    op=str(x["op"]),
                    signature=dict(x["signature"]),
                    algorithm=str(x["algorithm"]),
                    measurements=x.get("measurements"),
                )
                for x in data["layers"]
            ]
            return cls(
                layers=layers,
                input_shapes=[list(map(int, s)) for s in data["input_shapes"]],
                dtype=str(data["dtype"]),
                machine=dict(data["machine"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{source} is a malformed ai3 plan: {type(e).__name__}: {e}") from e

    def save(self, path: str | os.PathLike) -> None:
        """Writes the plan as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        """Reads a plan saved by :meth:`save`."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PlanError(f"cannot read the plan {os.fspath(path)!r}: {e}") from e
        return cls.from_dict(data, f"the plan {os.fspath(path)!r}")

    def __str__(self) -> str:
        width = max((len(layer.name) for layer in self.layers), default=4)
        lines = [f"ai3.Plan: {len(self.layers)} layer(s), input {self.input_shapes}, {self.dtype}"]
        for layer in self.layers:
            shapes = layer.signature.get("input_shapes", [[]])[0]
            lines.append(f"  {layer.name:<{width}}  {layer.op:<8} {layer.algorithm:<9} {shapes}")
        return "\n".join(lines)


def as_plan(plan: Plan | str | os.PathLike) -> Plan:
    """A :class:`Plan`, or one loaded from a path."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        return Plan.load(plan)
    raise PlanError(f"plan must be an ai3.Plan or a path to one, got {type(plan).__name__}")


def warn_if_foreign(plan: Plan, stacklevel: int = 3) -> None:
    """Warns when ``plan`` was made on a machine unlike this one."""
    here = machine()
    diff = [
        f"{k}: {plan.machine.get(k)!r} there, {here[k]!r} here"
        for k in here
        if plan.machine.get(k) != here[k]
    ]
    if diff:
        warnings.warn(
            "ai3: applying a plan made on another machine; its choices may not be the "
            f"fastest here ({'; '.join(diff)})",
            UserWarning,
            stacklevel=stacklevel,
        )


class FromPlan:
    """The selector value that takes each layer's algorithm from ``plan``, in order."""

    def __init__(self, plan: Plan, op: str):
        self.plan = plan
        self.op = op

    def __str__(self) -> str:
        return "plan"


def _shape_text(sig: dict[str, Any]) -> str:
    shapes = sig.get("input_shapes") or [[]]
    return "input " + ", ".join(str(list(s)) for s in shapes)


def match(plan: Plan, index: int, name: str, signature: dict[str, Any]) -> str:
    """The algorithm of the model's ``index``-th layer of the plan's operations,
    checked against the plan's layer there; :class:`~ai3.PlanError` otherwise."""
    if index >= len(plan.layers):
        raise PlanError(
            f"the plan does not fit the model: it lists {len(plan.layers)} layer(s) of "
            f"{list(plan.ops)}, the model has more (layer {index + 1}: '{name}' "
            f"{signature['op']}, {_shape_text(signature)})"
        )
    layer = plan.layers[index]
    mine, theirs = layer_key(signature), layer_key(layer.signature)
    if layer.name != name or mine != theirs:
        what = []
        if layer.name != name:
            what.append(f"name '{layer.name}' in the plan, '{name}' in the model")
        for k in ("op", "params", "input_shapes", "dtype", "device"):
            if mine.get(k) != theirs.get(k):
                what.append(f"{k} {theirs.get(k)} in the plan, {mine.get(k)} in the model")
        raise PlanError(
            f"the plan does not fit the model at layer {index + 1} ('{name}'): " + "; ".join(what)
        )
    return layer.algorithm


def check_complete(plan: Plan, used: int) -> None:
    """Every layer of the plan was matched by one of the model's."""
    if used != len(plan.layers):
        extra = plan.layers[used]
        raise PlanError(
            f"the plan does not fit the model: it lists {len(plan.layers)} layer(s) of "
            f"{list(plan.ops)}, the model has {used} (the first missing is '{extra.name}' "
            f"{extra.op}, {_shape_text(extra.signature)})"
        )
