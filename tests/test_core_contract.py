"""The contract between Python and Rust: one generic entry point,
``_core.Model.add(op, name, inputs, params, algorithm)``, whose parameters
travel by name and are checked in Rust against each operation's description
(``_core.operations()``); and the stub ``_core.pyi`` true to the extension."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import ai3
import pytest
import torch
import torch.nn.functional as F
from ai3 import _core
from conftest import assert_close

STUB = Path(ai3.__file__).with_name("_core.pyi")


def _stub_signatures() -> dict[str, list[str]]:
    """Parameter names of every function and ``Model`` method the stub declares."""
    tree = ast.parse(STUB.read_text())
    sigs: dict[str, list[str]] = {}

    def params(f: ast.FunctionDef) -> list[str]:
        return [a.arg for a in f.args.args + f.args.kwonlyargs if a.arg != "self"]

    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            sigs[node.name] = params(node)
        elif isinstance(node, ast.ClassDef) and node.name == "Model":
            for f in node.body:
                # A property's setter: the property is declared by its getter.
                setter = isinstance(f, ast.FunctionDef) and any(
                    isinstance(d, ast.Attribute) and d.attr == "setter" for d in f.decorator_list
                )
                if isinstance(f, ast.FunctionDef) and not setter:
                    sigs[f"Model.{f.name}"] = params(f)
    return sigs


def _extension_signatures() -> dict[str, list[str]]:
    sigs: dict[str, list[str]] = {}

    def params(f) -> list[str]:
        return [p for p in inspect.signature(f).parameters if p not in ("self", "$self")]

    for name, obj in vars(_core).items():
        if callable(obj) and not isinstance(obj, type) and not name.startswith("__"):
            sigs[name] = params(obj)
    for name, obj in vars(_core.Model).items():
        if name.startswith("__") and name != "__init__":
            continue
        if callable(obj):
            sigs[f"Model.{name}"] = params(obj)
        elif isinstance(obj, property) or type(obj).__name__ == "getset_descriptor":
            sigs[f"Model.{name}"] = []
    sigs["Model.__init__"] = params(_core.Model)
    return sigs


def test_the_stub_declares_exactly_what_the_extension_has():
    stub, ext = _stub_signatures(), _extension_signatures()
    assert sorted(stub) == sorted(ext)
    for name in ext:
        assert stub[name] == ext[name], name


def _conv_params(w, b=None, **kw):
    return {"weight": w, "bias": b, **kw}


def _one_node(op, params, n_inputs=1, algorithm="default", dtype="float32"):
    core = _core.Model(dtype, n_inputs)
    out = core.add(op, op, list(range(n_inputs)), params, algorithm)
    core.set_outputs([out])
    return core


def _run(core, *xs):
    return torch.from_dlpack(core.run(list(xs))[0])


def test_a_node_built_by_name_matches_pytorch():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3), torch.randn(6)
    params = _conv_params(w, b, stride=[2, 1], padding=[1, 1, 0, 2], groups=2)
    params["activation"] = ("hardtanh", {"min_val": -0.5, "max_val": 0.5})
    got = _run(_one_node("conv2d", params), x)
    want = F.hardtanh(F.conv2d(F.pad(x, (0, 2, 1, 1)), w, b, stride=(2, 1), groups=2), -0.5, 0.5)
    assert_close(got, want, torch.float32)


def test_defaults_are_pytorchs():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    got = _run(_one_node("maxpool2d", {"kernel_size": [2, 2]}), x)  # stride: the window
    assert_close(got, F.max_pool2d(x, 2), torch.float32)
    got = _run(_one_node("gelu", {}), x)
    assert_close(got, F.gelu(x), torch.float32)


def test_weights_given_as_graph_values_are_read_every_call():
    torch.manual_seed(0)
    core = _core.Model("float32", 3)
    out = core.add("linear", "fc", [0], {"weight": 1, "bias": 2})
    core.set_outputs([out])
    for _ in range(2):
        x, w, b = torch.randn(4, 5), torch.randn(3, 5), torch.randn(3)
        assert_close(_run(core, x, w, b), F.linear(x, w, b), torch.float32)
    assert core.summary([[4, 5], [3, 5], [3]])[0]["input_shapes"] == [[4, 5], [3, 5], [3]]


@pytest.mark.parametrize(
    "op, params, n_inputs, match",
    [
        ("conv3d", {}, 1, "'conv3d' is not an ai3 operation"),
        ("conv2d", {}, 1, "conv2d.*missing parameter 'weight'"),
        (
            "conv2d",
            {"weight": torch.ones(1, 1, 1, 1), "strides": [1, 1]},
            1,
            r'unknown parameter .strides.; its parameters are \["weight", "bias", "stride"',
        ),
        (
            "conv2d",
            {"weight": torch.ones(1, 1, 1, 1), "stride": "2"},
            1,
            r"conv2d.*'stride' must be list\[int\], got str",
        ),
        (
            "conv2d",
            {"weight": torch.ones(1, 1, 1, 1), "groups": True},
            1,
            "conv2d.*'groups' must be int, got bool",
        ),
        (
            "conv2d",
            {"weight": torch.ones(1, 1, 1, 1), "stride": [1, 2, 3]},
            1,
            "'stride' must have 2 values, got 3",
        ),
        (
            "conv2d",
            {"weight": torch.ones(1, 1, 1, 1), "stride": [-1, 1]},
            1,
            "'stride' must not be negative, got -1",
        ),
        (
            "conv2d",
            {"weight": torch.ones(1, 1, 1, 1), "padding_mode": "wrap"},
            1,
            "padding_mode must be",
        ),
        ("conv2d", {"weight": 2.5}, 1, r"conv2d.*'weight' must be tensor \| value id, got float"),
        ("linear", {"weight": torch.ones(2, 2)}, 3, r"linear: takes 1 to 2 input\(s\), got 3"),
        (
            "conv2d",
            {"weight": torch.ones(1, 1, 1, 1), "channels_last": True},
            2,
            "channels-last convolution takes no residual",
        ),
        ("add", {}, 1, r"expected 2 input\(s\) with scalar=None, got 1"),
        ("cat", {"dim": 0}, 0, r"cat: takes at least 1 input\(s\), got 0"),
        ("relu", {"activation": ("relu", {})}, 1, "relu.*unknown parameter 'activation'"),
        (
            "linear",
            {"weight": torch.ones(2, 2), "activation": ("swish", {})},
            1,
            "unknown activation 'swish'",
        ),
        (
            "linear",
            {"weight": torch.ones(2, 2), "activation": ("conv2d", {})},
            1,
            "not an activation",
        ),
        (
            "linear",
            {"weight": torch.ones(2, 2), "activation": ("gelu", {"approximate": "x"})},
            1,
            "approximate must be 'none' or 'tanh'",
        ),
        ("linear", {"weight": 0, "bias": torch.ones(2)}, 1, "all be tensors or all be value ids"),
        ("permute", {"dims": [0], "dim0": 0, "dim1": 1}, 1, "give either dims, or dim0 and dim1"),
        ("slice", {"dim": 0, "index": 0}, 1, "exactly one of chunks, split_size and sections"),
        ("reshape", {"shape": [("dim", 1, 0)]}, 1, "reads input 1 but the node has 1 input"),
    ],
)
def test_bad_parameters_name_the_operation(op, params, n_inputs, match):
    core = _core.Model("float32", max(n_inputs, 1))
    with pytest.raises(ai3.Error, match=match):
        core.add(op, op, list(range(n_inputs)), params)


def test_an_unknown_algorithm_is_an_algorithm_error():
    with pytest.raises(ai3.AlgorithmError, match="unknown algorithm 'fast'"):
        _one_node("relu", {}, algorithm="fast")


def test_operations_describe_every_selectable_operation():
    ops = {d["op"]: d for d in _core.operations()}
    assert set(ops) == set(ai3.SUPPORTED_ALGORITHMS)
    conv = ops["conv2d"]
    assert conv["inputs"] == (1, 3)  # the input, a fused residual, a fused input scale
    assert ("weight", "tensor | value id", True) in conv["params"]
    assert ops["cat"]["inputs"] == (1, None)
    for d in ops.values():
        names = [p[0] for p in d["params"]]
        assert len(names) == len(set(names)), d["op"]
