"""Deciding a converted model's pending layers: those whose selector said
``'auto'`` (timed, see :mod:`.auto`) or ``plan=`` (looked up, see :mod:`.plan`).

``convert`` leaves such a layer's algorithm as a marker in the recipe
(its node's ``"algorithm"``) and lists the node's index under
``recipe["pending"]``. Once the input shapes are known (``sample_input_shape``, a plan's
shapes, or the first call), :func:`resolve` gives every pending layer its
algorithm, records what was measured under ``recipe["decisions"]`` and, when
'auto' changed 'default''s choices, the network check under
``recipe["network_check"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _core
from .auto import Auto, Node, admissible, available, choose, measure
from .plan import FromPlan, PlanLayer, check_complete, match
from .signature import node_signature
from .timing import interleaved_ms, random_inputs

#: The network check's rounds (at least, at most) and seconds (past the least).
_CHECK_ROUNDS = (5, 50)
_CHECK_SECONDS = 0.5


def settle_trivial(op: str, algo: Any) -> Any:
    """``'auto'`` for an operation with a single algorithm this build can run is
    that algorithm: nothing to time, and known without shapes."""
    if not isinstance(algo, Auto) or algo.measure_all:
        return algo
    names = [a for a in available(op) if algo.algorithms is None or a in algo.algorithms]
    return names[0] if len(names) == 1 else algo


def _value_shapes(
    recipe: dict[str, Any], rows: list[dict[str, Any]], input_shapes: list[list[int]]
) -> dict[int, list[int]]:
    """Every value id's shape: the inputs, the constants, the nodes' outputs."""
    shapes = {i: list(s) for i, s in enumerate(input_shapes)}
    rows_iter = iter(rows)
    for offset, node in enumerate(recipe["nodes"]):
        vid = recipe["num_inputs"] + offset
        constant = node["op"] == "constant"
        shapes[vid] = list(node["tensor"].shape) if constant else next(rows_iter)["output_shape"]
    return shapes


def rows_by_node(recipe: dict[str, Any], rows: list[dict[str, Any]]) -> dict[int, dict]:
    """Summary rows by node index (constants have none)."""
    it = iter(rows)
    return {i: next(it) for i, node in enumerate(recipe["nodes"]) if node["op"] != "constant"}


def _signature(recipe: dict[str, Any], index: int, shapes: dict[int, list[int]]) -> tuple:
    """Node ``index`` as a :class:`Node` with its name and signature."""
    step = recipe["nodes"][index]
    values = [*step["inputs"], *step["weights"].values()]
    node = Node(
        step["op"], step["params"], len(step["inputs"]), list(step["weights"]),
        [shapes[v] for v in values], recipe["dtype"],
    )  # fmt: skip
    sig = node_signature(node.op, node.params, node.weights, node.shapes, recipe["dtype"])
    return node, step["name"], sig


def resolve(
    recipe: dict[str, Any],
    input_shapes: list[list[int]],
    build: Callable[[dict[str, Any]], _core.Model],
) -> None:
    """Decides every pending node of ``recipe`` for these input shapes (in place).

    ``build`` makes the provisional model (pending nodes on ``'default'``)
    whose summary gives every node's input shapes."""
    pending = recipe.get("pending") or []
    if not pending:
        return
    dtype = recipe["dtype"]
    rows = build(recipe).summary(input_shapes)  # pending nodes on 'default'
    shapes = _value_shapes(recipe, rows, input_shapes)
    default_rows = rows_by_node(recipe, rows)
    used: dict[int, tuple[Any, int]] = {}
    decisions = []
    switched: dict[int, str] = {}  # node -> 'default''s algorithm, where 'auto' chose another
    check = False
    for index in pending:
        node, name, sig = _signature(recipe, index, shapes)
        step = recipe["nodes"][index]
        marker = step["algorithm"]
        measured = None
        if isinstance(marker, FromPlan):
            plan, i = used.get(id(marker.plan), (marker.plan, 0))
            algo = match(plan, i, name, sig)
            used[id(plan)] = (plan, i + 1)
        else:
            measured = measure(node, sig, marker)
            what = f"{node.op} at node '{name}' (input of shape {list(node.shapes[0])})"
            algo = choose(measured, marker, dtype, what, default_rows[index]["algorithm"])
            incumbent = default_rows[index]["algorithm"]
            if algo != incumbent and admissible(measured.get(incumbent), marker, dtype):
                switched[index] = incumbent
                check |= marker.check_network
        step["algorithm"] = algo
        decisions.append({"name": name, "op": node.op, "measurements": measured})
    for plan, n in used.values():
        check_complete(plan, n)
    recipe["pending"] = []
    if check:
        recipe["network_check"] = _check_network(recipe, switched, input_shapes, build)
    recipe["decisions"] = decisions
    recipe["decided_for"] = [list(s) for s in input_shapes]


def _check_network(
    recipe: dict[str, Any],
    switched: dict[int, str],
    input_shapes: list[list[int]],
    build: Callable[[dict[str, Any]], _core.Model],
) -> dict[str, Any]:
    """Times the network with 'auto''s choices against 'default''s, call by call,
    and goes back to 'default''s where 'auto''s are not faster. ``switched``
    maps each node where 'auto' chose another algorithm than 'default', and
    'default''s is admissible (within the tolerance, the workspace limit and
    the algorithms given), to 'default''s.

    A layer timed alone has its weights and input in cache; inside the network
    they often are not, so an algorithm with a larger footprint can win alone
    and lose in place. Returns what was measured and kept."""
    tuned = build(recipe)
    chosen = {i: recipe["nodes"][i]["algorithm"] for i in switched}
    for i, algo in switched.items():
        recipe["nodes"][i]["algorithm"] = algo
    baseline = build(recipe)
    inputs = random_inputs(input_shapes, getattr(torch, recipe["dtype"]))
    ms = interleaved_ms(
        {"auto": lambda: tuned.run(inputs), "default": lambda: baseline.run(inputs)},
        _CHECK_ROUNDS[0], _CHECK_ROUNDS[1], _CHECK_SECONDS,
    )  # fmt: skip
    kept = ms["auto"] < ms["default"]
    if kept:
        for i, algo in chosen.items():
            recipe["nodes"][i]["algorithm"] = algo
    return {"auto_ms": ms["auto"], "default_ms": ms["default"], "kept": kept,
            "layers": len(switched)}  # fmt: skip


def plan_layers(
    recipe: dict[str, Any], input_shapes: list[list[int]], core: _core.Model
) -> list[PlanLayer]:
    """The plan of a decided model: every layer of the operations 'auto' or a
    plan decided (else of every operation with a choice of algorithms), with
    the algorithm that runs for these shapes and any measurements."""
    decisions = recipe.get("decisions") or []
    ops = {d["op"] for d in decisions} or {
        node["op"] for node in recipe["nodes"] if len(available(node["op"])) > 1
    }
    measured = {d["name"]: d["measurements"] for d in decisions}
    rows = core.summary(input_shapes)
    shapes = _value_shapes(recipe, rows, input_shapes)
    algorithm_of = {i: r["algorithm"] for i, r in rows_by_node(recipe, rows).items()}
    layers = []
    for i, node in enumerate(recipe["nodes"]):
        if node["op"] in ops:
            _, name, sig = _signature(recipe, i, shapes)
            layers.append(PlanLayer(name, node["op"], sig, algorithm_of[i], measured.get(name)))
    return layers
