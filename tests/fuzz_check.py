"""The fuzzer's checker: builds the PyTorch module and inputs a case describes
(deterministic random weights and inputs from the case's seed), runs PyTorch
and ai3 (``ai3.convert``, ``ai3.swap_operation``, or a swap then a convert)
and says how they compare.

Verdicts (:data:`ACCEPTABLE` ones and failures):

- ``match``: same shape, dtype, NaN and infinities, values within tolerance
  (and, for a swapped network run with gradients, the same gradients of the
  inputs and parameters);
- ``match_float64``: a float32 case that matches PyTorch's float64 answer on the
  same data (rounded to float32) where PyTorch's float32 answer differs or
  PyTorch's float32 kernel failed (its float32 ``GELU(+inf)`` is NaN; oneDNN
  cannot create a primitive for some grouped, dilated channels-last layers);
- ``both_raise``: PyTorch raised and ai3 raised an :class:`ai3.Error`;
- ``both_raise_torch``: PyTorch raised, and so did the PyTorch code of a swapped
  network, with the same error;
- ``unsupported``: ai3 raised :class:`ai3.AlgorithmError` or
  :class:`ai3.UnsupportedOperationError` for a configuration it documents as
  unsupported (:func:`documented_unsupported`), PyTorch computed;
- ``stricter_on_empty``: an input is empty, PyTorch computed without checking its
  arguments, ai3 raised :class:`ai3.InvalidArgumentError`, and PyTorch raises too
  once the empty sizes are made 1;
- ``lenient_on_empty``: an input is empty, PyTorch refused it (pools reject zero
  channels) but computes once the empty sizes are made 1, and ai3 returned an
  empty tensor;
- ``torch_rejects``: PyTorch refused to build the module (nothing to compare);
- ``torch_oom``: PyTorch could not allocate its output, ai3 computed one;
- ``torch_limit``: PyTorch refused a size it cannot represent (:data:`TORCH_LIMITS`),
  ai3 computed;
- failures: ``mismatch``, ``ai3_only_raises`` (an ai3.Error where PyTorch
  computed, outside the documented unsupported configurations),
  ``torch_only_raises`` (ai3 answered where PyTorch raised),
  ``non_ai3_exception`` (ai3's path raised something not an ai3.Error),
  ``input_modified``; the harness adds ``abort``, ``hang`` and
  ``harness_error``.

Run one case in this process (to see a crash's backtrace)::

    PYTHONPATH=python python tests/fuzz_check.py '{"kind": "conv2d", ...}'
"""

from __future__ import annotations

import copy
import json
import math
import operator
import re
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import ai3
import torch
import torch.nn.functional as F
from torch import nn

#: Verdicts that do not fail the property.
ACCEPTABLE = frozenset(
    {
        "match",
        "match_float64",
        "both_raise",
        "both_raise_torch",
        "unsupported",
        "stricter_on_empty",
        "lenient_on_empty",
        "torch_rejects",
        "torch_oom",
        "torch_limit",
    }
)

#: PyTorch's errors for sizes it cannot represent (its pools take 32-bit ints, for one):
#: ai3 answering there is not a failure, though nothing checks its answer.
TORCH_LIMITS = ("value cannot be converted to type int without overflow",)

#: Tolerance per dtype, as in ai3's own tests: ``|ai3 - torch| <= tol * max|torch| + tol * |torch|``.
TOLERANCES = {torch.float32: 1e-4, torch.float64: 1e-10}


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _arg(v):
    """A hyperparameter as PyTorch takes it: lists become tuples."""
    return tuple(_arg(x) for x in v) if isinstance(v, list) else v


# ---- inputs -----------------------------------------------------------------------------------


def make_input(case: dict, shape: list[int], gen: torch.Generator) -> torch.Tensor:
    """A random input of ``shape`` in the case's dtype, scale and layout.

    Layouts: ``contiguous``; ``transposed`` (last two dims swapped in memory);
    ``channels_last``; ``sliced`` (every other element of a larger tensor, at an
    offset, the elements in between NaN so a stride mix-up shows);
    ``expanded`` (a dim of stride 0). A layout the rank cannot have falls back
    to contiguous. With ``specials``, a few elements are NaN or infinite.
    """
    dtype = getattr(torch, case["dtype"])
    x = torch.randn(shape, generator=gen, dtype=torch.float64).mul_(case["scale"]).to(dtype)
    if case.get("specials") and x.numel():
        flat = x.view(-1)
        for v in (math.nan, math.inf, -math.inf)[: 1 + int(torch.randint(3, (1,), generator=gen))]:
            flat[int(torch.randint(flat.numel(), (1,), generator=gen))] = v
    layout, rank = case["layout"], len(shape)
    if layout == "transposed" and rank >= 2:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "channels_last" and rank == 4:
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "sliced" and rank >= 1:
        big = torch.full([2 * d + 1 for d in shape], math.nan, dtype=dtype)
        view = big[tuple(slice(1, None, 2) for _ in shape)]
        view.copy_(x)
        return view
    if layout == "expanded":
        for d, size in enumerate(shape):
            if size >= 2:
                return x.narrow(d, 0, 1).expand(shape)
    return x


# ---- modules ----------------------------------------------------------------------------------


class Net(nn.Module):
    """A network whose forward is ``body(self, *inputs)``; fx traces through ``body``.
    :func:`net_class` makes subclasses with a fixed number of inputs."""

    def __init__(self, body: Callable, **modules: Any):
        super().__init__()
        self.body = body
        for name, m in modules.items():
            setattr(self, name, m)


_NET_CLASSES: dict[int, type[Net]] = {}


def net_class(arity: int) -> type[Net]:
    """A :class:`Net` subclass whose forward takes ``arity`` named inputs (fx and
    ``ai3.convert`` need a fixed signature)."""
    if arity not in _NET_CLASSES:
        names = ", ".join(f"x{i}" for i in range(arity))
        ns: dict[str, Any] = {}
        exec(f"def forward(self, {names}):\n    return self.body(self, {names})\n", ns)
        _NET_CLASSES[arity] = type(f"Net{arity}", (Net,), {"forward": ns["forward"]})
    return _NET_CLASSES[arity]


def _uniform(gen: torch.Generator, shape: list[int], fan_in: int) -> nn.Parameter:
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    return nn.Parameter(
        torch.rand(shape, generator=gen, dtype=torch.float64).mul_(2 * bound).sub_(bound)
    )


def _activation_module(name: str, p: dict) -> nn.Module:
    return {
        "relu": lambda: nn.ReLU(),
        "relu6": lambda: nn.ReLU6(),
        "hardtanh": lambda: nn.Hardtanh(p["min_val"], p["max_val"]),
        "hardswish": lambda: nn.Hardswish(),
        "hardsigmoid": lambda: nn.Hardsigmoid(),
        "silu": lambda: nn.SiLU(),
        "sigmoid": lambda: nn.Sigmoid(),
        "tanh": lambda: nn.Tanh(),
        "gelu": lambda: nn.GELU(approximate=p["approximate"]),
        "softmax": lambda: nn.Softmax(dim=p["dim"]),
    }[name]()


def _activation_fn(name: str, p: dict, form: str) -> Callable:
    if form == "method":
        if name == "softmax":
            return lambda x: x.softmax(p["dim"])
        return lambda x: getattr(x, name)()
    return {
        "relu": F.relu,
        "relu6": F.relu6,
        "hardtanh": lambda x: F.hardtanh(x, p["min_val"], p["max_val"]),
        "hardswish": F.hardswish,
        "hardsigmoid": F.hardsigmoid,
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "gelu": lambda x: F.gelu(x, approximate=p["approximate"]),
        "softmax": lambda x: F.softmax(x, p["dim"]),
    }[name]


_OPERATORS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
}


def _binary_fn(case: dict) -> Callable:
    op, form, opts = case["op"], case["form"], case["options"]
    if "scalar" in case:
        s = case["scalar"]
        if form == "operator":
            f = _OPERATORS[op]
            return (lambda a: f(s, a)) if case["scalar_first"] else (lambda a: f(a, s))
        if form == "function":
            return lambda a: getattr(torch, op)(a, s, **opts)
        return lambda a: getattr(a, op)(s, **opts)
    if form == "operator":
        return _OPERATORS[op]
    if form == "function":
        return lambda a, b: getattr(torch, op)(a, b, **opts)
    return lambda a, b: getattr(a, op)(b, **opts)


def _single(case: dict, gen: torch.Generator) -> tuple[nn.Module, list[list[int]], dict]:
    """The network of a one-operation case, its input shapes and the algorithms
    per operation (``ai3.convert``'s ``algos`` and the swap's)."""
    kind, form = case["kind"], case.get("form")
    algo = case.get("algorithm", "default")
    body1 = net_class(1)
    if kind == "conv2d":
        n, c, (h, w) = case["n"], case["in_c"], case["hw"]
        shape = [n, c, h, w] if case["batched"] else [c, h, w]
        args = dict(
            stride=_arg(case["stride"]),
            padding=_arg(case["padding"]),
            dilation=_arg(case["dilation"]),
            groups=case["groups"],
        )
        kh, kw = _pair(case["kernel"])
        if form == "module":
            m = nn.Conv2d(
                c,
                case["out_c"],
                (kh, kw),
                bias=case["bias"],
                padding_mode=case["padding_mode"],
                **args,
            )
            return body1(lambda self, x: self.m(x), m=m), [shape], {"conv2d": algo}
        cin = c // case["groups"] if case["groups"] > 0 else c
        net = body1(lambda self, x: F.conv2d(x, self.weight, self.bias, **args))
        net.weight = _uniform(gen, [case["out_c"], cin, kh, kw], cin * kh * kw)
        net.bias = _uniform(gen, [case["out_c"]], cin * kh * kw) if case["bias"] else None
        return net, [shape], {"conv2d": algo}
    if kind in ("maxpool2d", "avgpool2d"):
        k, s, p, ceil = (
            _arg(case["kernel"]),
            _arg(case["stride"]),
            _arg(case["padding"]),
            case["ceil_mode"],
        )
        if kind == "maxpool2d":
            d = _arg(case["dilation"])
            if form == "module":
                m = nn.MaxPool2d(k, s, p, d, ceil_mode=ceil)
                return body1(lambda self, x: self.m(x), m=m), [case["shape"]], {kind: algo}
            net = body1(lambda self, x: F.max_pool2d(x, k, s, p, d, ceil_mode=ceil))
            return net, [case["shape"]], {kind: algo}
        inc, div = case["count_include_pad"], case["divisor_override"]
        if form == "module":
            m = nn.AvgPool2d(k, s, p, ceil, inc, div)
            return body1(lambda self, x: self.m(x), m=m), [case["shape"]], {kind: algo}
        net = body1(lambda self, x: F.avg_pool2d(x, k, s, p, ceil, inc, div))
        return net, [case["shape"]], {kind: algo}
    if kind in ("adaptiveavgpool2d", "adaptivemaxpool2d"):
        size = _arg(case["output_size"])
        avg = kind == "adaptiveavgpool2d"
        if form == "module":
            m = nn.AdaptiveAvgPool2d(size) if avg else nn.AdaptiveMaxPool2d(size)
            return body1(lambda self, x: self.m(x), m=m), [case["shape"]], {kind: algo}
        fn = F.adaptive_avg_pool2d if avg else F.adaptive_max_pool2d
        return body1(lambda self, x: fn(x, size)), [case["shape"]], {kind: algo}
    if kind == "linear":
        if form == "module":
            m = nn.Linear(case["in_f"], case["out_f"], bias=case["bias"])
            return body1(lambda self, x: self.m(x), m=m), [case["shape"]], {"linear": algo}
        net = body1(lambda self, x: F.linear(x, self.weight, self.bias))
        net.weight = _uniform(gen, [case["out_f"], case["in_f"]], case["in_f"])
        net.bias = _uniform(gen, [case["out_f"]], case["in_f"]) if case["bias"] else None
        return net, [case["shape"]], {"linear": algo}
    if kind == "activation":
        name, p = case["name"], case["params"]
        if form == "module":
            m = _activation_module(name, p)
            return body1(lambda self, x: self.m(x), m=m), [case["shape"]], {name: algo}
        fn = _activation_fn(name, p, form)
        return body1(lambda self, x: fn(x)), [case["shape"]], {name: algo}
    if kind == "flatten":
        s, e = case["start_dim"], case["end_dim"]
        if form == "module":
            m = nn.Flatten(s, e)
            return body1(lambda self, x: self.m(x), m=m), [case["shape"]], {"flatten": algo}
        return body1(lambda self, x: torch.flatten(x, s, e)), [case["shape"]], {"flatten": algo}
    if kind == "binary":
        fn = _binary_fn(case)
        net = net_class(len(case["shapes"]))(lambda self, *xs: fn(*xs))
        return net, case["shapes"], {case["op"]: algo}
    if kind == "cat":
        fn, dim = getattr(torch, case["fn"]), case["dim"]
        net = net_class(len(case["shapes"]))(lambda self, *xs: fn(list(xs), dim))
        return net, case["shapes"], {"cat": algo}
    raise ValueError(f"unknown case kind {kind!r}")


def _graph(case: dict, gen: torch.Generator) -> tuple[nn.Module, list[list[int]], dict]:
    """The network of a ``graph`` case; algorithms are lists in forward order."""
    mods: dict[str, nn.Module] = {}
    algos: dict[str, list[str]] = {}
    for i, node in enumerate(case["nodes"]):
        op, name = node["op"], f"n{i}"
        if op == "conv":
            mods[name] = nn.Conv2d(
                node["in_c"], node["out_c"], node["kernel"], node["stride"], node["padding"],
                groups=node["groups"], bias=node["bias"], padding_mode=node["padding_mode"],
            )  # fmt: skip
            algos.setdefault("conv2d", []).append(node["algorithm"])
        elif op == "maxpool":
            mods[name] = nn.MaxPool2d(
                node["kernel"], node["stride"], node["padding"], ceil_mode=node["ceil_mode"]
            )
        elif op == "avgpool":
            mods[name] = nn.AvgPool2d(
                node["kernel"], node["stride"], node["padding"], node["ceil_mode"]
            )
        elif op == "adaptive":
            mods[name] = (nn.AdaptiveMaxPool2d if node["max"] else nn.AdaptiveAvgPool2d)(
                node["size"]
            )
        elif op == "bn":
            bn = nn.BatchNorm2d(node["c"])
            with torch.no_grad():
                for t, lo, hi in (
                    (bn.running_mean, -1, 1),
                    (bn.running_var, 0.5, 2),
                    (bn.weight, 0.5, 1.5),
                    (bn.bias, -1, 1),
                ):
                    t.copy_(torch.rand(t.shape, generator=gen) * (hi - lo) + lo)
            mods[name] = bn
        elif op == "act" and node["form"] == "module":
            mods[name] = _activation_module(node["name"], node["params"])
        elif op == "linear":
            mods[name] = nn.Sequential(nn.Flatten(), nn.Linear(node["in_f"], node["out_f"]))
            algos.setdefault("linear", []).append(node["algorithm"])
    for op in (
        "relu",
        "maxpool2d",
        "avgpool2d",
        "adaptiveavgpool2d",
        "adaptivemaxpool2d",
        "flatten",
    ):
        algos[op] = case["others"]
    nodes, outputs = case["nodes"], case["outputs"]

    def body(self, x):
        values = [x]
        for i, node in enumerate(nodes):
            v, op = values[node["src"]], node["op"]
            if op == "act" and node["form"] != "module":
                y = _activation_fn(node["name"], node["params"], node["form"])(v)
            elif op == "binary":
                other = node["scalar"] if node["other"] is None else values[node["other"]]
                y = _OPERATORS[node["fn"]](v, other)
            elif op == "cat":
                y = torch.cat([v, values[node["other"]]], 1)
            else:
                y = getattr(self, f"n{i}")(v)
            values.append(y)
        return values[outputs[0]] if len(outputs) == 1 else tuple(values[k] for k in outputs)

    return net_class(1)(body, **mods), [case["input"]], algos


def build(case: dict) -> tuple[nn.Module, list[torch.Tensor], dict]:
    """The case's network (eval mode, in its dtype), inputs and algorithms per operation.
    Raises what PyTorch's constructors raise for a configuration they refuse."""
    torch.manual_seed(case["seed"])
    gen = torch.Generator().manual_seed(case["seed"])
    net, shapes, algos = (_graph if case["kind"] == "graph" else _single)(case, gen)
    net = net.to(getattr(torch, case["dtype"])).eval()
    inputs = [make_input(case, list(s), gen) for s in shapes]
    return net, inputs, algos


# ---- running ----------------------------------------------------------------------------------


def conv_algorithms() -> list[str]:
    """The conv2d algorithms to fuzz: every one this build can run, and 'default'."""
    rows = [r for r in ai3.algorithm_table() if r["op"] == "conv2d" and not r["unavailable"]]
    return [r["algorithm"] for r in rows] + ["default"]


def padded_bytes(c: dict) -> int:
    """Bytes of a convolution's zero-padded input (direct, SMM and FFT copy it)."""
    if c.get("kind") != "conv2d" or c["padding"] == "valid":
        return 0
    h, w = c["hw"]
    if c["padding"] == "same":  # PyTorch's total: dilation * (kernel - 1) per axis
        (kh, kw), (dh, dw) = (_pair(c["kernel"]), _pair(c["dilation"]))
        extra = (max(dh, 0) * (kh - 1), max(dw, 0) * (kw - 1))
    else:
        ph, pw = _pair(c["padding"])
        extra = (2 * ph, 2 * pw)
    if min(extra) < 0:
        return 0
    return max(c["n"], 1) * max(c["in_c"], 1) * (h + extra[0]) * (w + extra[1]) * 4


def documented_unsupported(case: dict) -> str | None:
    """Why ai3 documents the case's configuration as unsupported, or ``None``."""
    if case["kind"] == "conv2d" and case["algorithm"] in ("direct", "smm", "fft"):
        if padded_bytes(case) > 10**8:
            # README: these algorithms copy the padded input ('default' and gemm do not).
            return "direct, smm and fft copy the padded input: one too large is refused"
    if case["kind"] == "conv2d" and case["algorithm"] == "winograd":
        if (
            _pair(case["kernel"]) != (3, 3)
            or _pair(case["stride"]) != (1, 1)
            or _pair(case["dilation"]) != (1, 1)
        ):
            return "winograd runs 3x3 kernels with stride 1 and dilation 1"
    if case["kind"] == "conv2d" and case["in_c"] == 0:
        # PyTorch returns a tensor with no channels, not one of out_channels
        # (bias alone); ai3 refuses rather than copy that (README, "Differences").
        return "conv2d with no input channels is refused"
    if case["kind"] == "conv2d" and case["padding_mode"] != "zeros":
        pads = case["padding"]
        if not isinstance(pads, str) and min(_pair(pads)) < 0:
            # PyTorch crops the input there (F.pad with negative sizes).
            return "negative padding (cropping) is refused"
    if case["kind"] == "avgpool2d" and (case.get("divisor_override") or 1) < 0:
        return "a negative divisor_override is refused (PyTorch divides by it)"
    if case["kind"] == "binary":
        opts = case["options"]
        if opts.get("alpha", 1) != 1 or opts.get("rounding_mode") is not None:
            return "alpha other than 1 and rounding_mode are not implemented"
    return None


def _swap_all(net: nn.Module, algos: dict) -> nn.Module:
    for op, algo in algos.items():
        if op in ai3.swap._WRAPPERS:
            net = ai3.swap_operation(op, net, algo)
    return net


def _context(case: dict):
    return {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}.get(
        case["context"], nullcontext
    )()


def _outputs(y: Any) -> list[Any]:
    return list(y) if isinstance(y, tuple) else [y]


def run_torch(case: dict, net: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """PyTorch's outputs, on a copy of the network."""
    with torch.no_grad():
        return _outputs(copy.deepcopy(net)(*inputs))


def run_ai3(case: dict, net: nn.Module, inputs: list[torch.Tensor], algos: dict) -> list[Any]:
    """ai3's outputs for the case's mode, on a copy of the network."""
    net = copy.deepcopy(net)
    dtype = getattr(torch, case["dtype"])
    mode = case["mode"]
    if mode == "convert":
        model = ai3.convert(net, algos, dtype=dtype)
    elif mode == "swap":
        model = _swap_all(net, algos)
    else:  # swap_convert: swapped modules keep their algorithms
        model = ai3.convert(_swap_all(net, algos), dtype=dtype)
    with _context(case):
        return _outputs(model(*inputs))


def _same_error(a: BaseException, b: BaseException) -> bool:
    """The same exception type and message, shapes and numbers aside (a swapped layer
    batches a 3-D input before PyTorch's padding sees it)."""

    def norm(e: BaseException) -> str:
        return re.sub(r"\[[^\]]*\]|\d+", "#", _describe(e))

    return type(a) is type(b) and norm(a) == norm(b)


def _describe(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300] if msg else ''}"


def compare(
    got: Any, expected: torch.Tensor, floor: float = 0.0
) -> tuple[str | None, float, float]:
    """(what differs or None, largest absolute error, largest error relative to
    ``max|expected|``). The absolute tolerance scales with ``max(max|expected|, floor)``."""
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, expected a tensor", math.inf, math.inf
    if tuple(got.shape) != tuple(expected.shape):
        return f"shape {list(got.shape)}, expected {list(expected.shape)}", math.inf, math.inf
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}", math.inf, math.inf
    if (
        expected.numel() == 0
    ):  # nothing to compare (its shape may overflow any new tensor's strides)
        return None, 0.0, 0.0
    g, e = got.detach().double(), expected.detach().double()
    if not torch.equal(g.isnan(), e.isnan()):
        return (
            f"NaN at {int(g.isnan().sum())} places, PyTorch at {int(e.isnan().sum())}",
            math.inf,
            math.inf,
        )
    inf = e.isinf()
    if not torch.equal(g.isinf(), inf) or not torch.equal(g[inf], e[inf]):
        return "infinities differ from PyTorch's", math.inf, math.inf
    fin = e.isfinite()
    if not bool(fin.any()):
        return None, 0.0, 0.0
    gf, ef = g[fin], e[fin]
    tol = TOLERANCES[expected.dtype]
    top = max(float(ef.abs().max()), floor)
    err = (gf - ef).abs()
    max_abs = float(err.max())
    max_rel = max_abs / top if top else (0.0 if max_abs == 0 else math.inf)
    excess = err - (tol * top + tol * ef.abs() + torch.finfo(expected.dtype).tiny)
    if float(excess.max()) > 0:
        i = int(excess.argmax())
        return (
            f"value {float(gf[i])!r}, PyTorch {float(ef[i])!r} (tolerance {tol} of max|out| {top:.3g})",
            max_abs,
            max_rel,
        )
    return None, max_abs, max_rel


def nonempty_twin(case: dict) -> dict:
    """The case with every 0 in its input sizes (and channels, features) made positive."""
    twin = copy.deepcopy(case)

    def fill(v):
        if isinstance(v, list):
            return [fill(x) for x in v]
        return 1 if v == 0 else v

    for key in ("shape", "shapes", "hw", "n", "input", "in_f", "out_f"):
        if key in twin:
            twin[key] = fill(twin[key])
    if twin["kind"] == "conv2d":  # channels: a positive multiple of groups
        g = twin["groups"] if twin["groups"] > 0 else 1
        twin["in_c"], twin["out_c"] = twin["in_c"] or g, twin["out_c"] or g
    return twin


def _torch_error_on_nonempty_twin(case: dict) -> str | None:
    """PyTorch's error on :func:`nonempty_twin`, or None when it computes.

    PyTorch skips some argument checks when an input is empty (a convolution with
    dilation 0 on an empty batch returns an empty tensor), and refuses some empty
    inputs outright (pools with zero channels). The twin tells an argument PyTorch
    rejects from an emptiness it rejects."""
    try:
        net, inputs, _ = build(nonempty_twin(case))
        run_torch(case, net, inputs)
    except Exception as e:
        return _describe(e)
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def run_case(case: dict) -> dict:
    """Runs one case and returns its verdict (a JSON-serializable dict)."""
    start = time.perf_counter()
    verdict = _verdict(case)
    verdict["seconds"] = round(time.perf_counter() - start, 4)
    return verdict


def _verdict(case: dict) -> dict:
    try:
        net, inputs, algos = build(case)
    except (ValueError, RuntimeError, AssertionError) as e:
        return {"verdict": "torch_rejects", "torch_error": _describe(e)}
    torch_error = ai3_error = None
    try:
        expected = run_torch(case, net, inputs)
    except Exception as e:
        torch_error = e
    before = [_bits(x).clone() for x in inputs]
    try:
        got = run_ai3(case, net, inputs, algos)
    except Exception as e:
        ai3_error = e
    out: dict[str, Any] = {}
    if torch_error is not None:
        out["torch_error"] = _describe(torch_error)
    if ai3_error is not None:
        out["ai3_error"] = _describe(ai3_error)
        if not isinstance(ai3_error, ai3.Error):
            out["traceback"] = "".join(traceback.format_exception(ai3_error)[-6:])
    if any(not torch.equal(_bits(x), b) for x, b in zip(inputs, before, strict=True)):
        return {"verdict": "input_modified", **out}
    if torch_error is not None and ai3_error is not None:
        if isinstance(ai3_error, ai3.Error):
            return {"verdict": "both_raise", **out}
        if _same_error(ai3_error, torch_error):
            # PyTorch code inside a swapped network (the padding of a swapped conv, a
            # layer left to PyTorch) raised PyTorch's own error: the same as PyTorch.
            return {"verdict": "both_raise_torch", **out}
        return {"verdict": "non_ai3_exception", **out}
    empty_input = any(x.numel() == 0 for x in inputs)
    if ai3_error is not None:
        if not isinstance(ai3_error, ai3.Error):
            return {"verdict": "non_ai3_exception", **out}
        reason = documented_unsupported(case)
        refusals = (
            ai3.AlgorithmError,
            ai3.UnsupportedOperationError,
            ai3.ShapeError,
            ai3.InvalidArgumentError,
            ai3.OutOfMemoryError,
        )
        if reason and isinstance(ai3_error, refusals):
            return {"verdict": "unsupported", "reason": reason, **out}
        if empty_input and isinstance(ai3_error, ai3.InvalidArgumentError):
            twin_error = _torch_error_on_nonempty_twin(case)
            if twin_error is not None:
                return {"verdict": "stricter_on_empty", "twin_torch_error": twin_error, **out}
        return {"verdict": "ai3_only_raises", **out}
    if torch_error is not None:
        if "can't allocate memory" in str(torch_error):
            return {"verdict": "torch_oom", **out}
        if any(m in str(torch_error) for m in TORCH_LIMITS):
            return {"verdict": "torch_limit", **out}
        if (
            empty_input
            and all(isinstance(g, torch.Tensor) and g.numel() == 0 for g in got)
            and _torch_error_on_nonempty_twin(case) is None
        ):
            return {"verdict": "lenient_on_empty", **out}
        if case["dtype"] == "float32" and _matches_float64_reference(case, net, inputs, got):
            # PyTorch's float32 kernel failed (oneDNN's "could not create a primitive"),
            # its float64 one computes what ai3 did.
            return {"verdict": "match_float64", **out}
        return {"verdict": "torch_only_raises", **out}
    if len(got) != len(expected):
        return {"verdict": "mismatch", "detail": f"{len(got)} outputs, expected {len(expected)}"}
    worst_abs = worst_rel = 0.0
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        problem, a, r = compare(g, e, floor=_floor(case))
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        if problem:
            if e.dtype == torch.float32 and _matches_float64_reference(case, net, inputs, got):
                return {
                    "verdict": "match_float64",
                    "detail": f"output {k}: {problem}",
                    "max_abs": a,
                    "max_rel": r,
                }
            return {
                "verdict": "mismatch",
                "detail": f"output {k}: {problem}",
                "max_abs": a,
                "max_rel": r,
            }
    if case["mode"] == "swap" and case["context"] == "grad":
        bad = check_gradients(case, net, inputs, algos)
        if bad is not None:
            return bad
    return {"verdict": "match", "max_abs": worst_abs, "max_rel": worst_rel}


def _floor(case: dict) -> float:
    """The smallest magnitude the absolute tolerance scales with: the inputs' scale, at
    most 1. An output that cancels to 0 (a strided 1x1 convolution reading only
    padding) is exact in PyTorch but carries FFT's or Winograd's rounding, which
    scales with the inputs, not with the output."""
    return min(float(case.get("scale", 1.0)), 1.0)


def _matches_float64_reference(
    case: dict, net: nn.Module, inputs: list[torch.Tensor], got: list
) -> bool:
    """Whether ai3's float32 outputs match PyTorch's outputs computed in float64 from
    the same (float32) weights and inputs, rounded to float32.

    PyTorch's float32 kernels have their own slips: ``GELU`` of +inf is NaN in
    float32 (inf in float64 and in the tanh form); an ai3 answer equal to PyTorch's
    more precise one is not a failure, and is counted apart (``match_float64``)."""
    try:
        expected = run_torch(case, copy.deepcopy(net).double(), [x.double() for x in inputs])
    except Exception:
        return False
    floor = _floor(case)
    return all(compare(g, e.float(), floor)[0] is None for g, e in zip(got, expected, strict=True))


def _gradients(net: nn.Module, inputs: list[torch.Tensor], gen_seed: int) -> dict[str, Any]:
    """Gradients of a random linear function of ``net``'s outputs with respect to
    its inputs and parameters, by name."""
    xs = [x.detach().requires_grad_() for x in inputs]
    outs = _outputs(net(*xs))
    gen = torch.Generator().manual_seed(gen_seed)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs)
    named = [(f"input {i}", x) for i, x in enumerate(xs)]
    named += [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return {}
    grads = torch.autograd.grad(loss, [t for _, t in named], allow_unused=True)
    return {n: g for (n, _), g in zip(named, grads, strict=True)}


def check_gradients(
    case: dict, net: nn.Module, inputs: list[torch.Tensor], algos: dict
) -> dict | None:
    """For a swapped network run with gradients: ``None`` when the gradients equal
    PyTorch's, else the verdict saying which differ."""
    seed = case["seed"] + 1
    expected = _gradients(copy.deepcopy(net), inputs, seed)
    try:
        got = _gradients(_swap_all(copy.deepcopy(net), algos), inputs, seed)
    except Exception as e:
        verdict = "ai3_only_raises" if isinstance(e, ai3.Error) else "non_ai3_exception"
        return {"verdict": verdict, "detail": "in backward", "ai3_error": _describe(e)}
    for name, e in expected.items():
        g = got.get(name)
        if (g is None) != (e is None):
            return {
                "verdict": "mismatch",
                "detail": f"gradient of {name}: {g is None=} {e is None=}",
            }
        if e is None:
            continue
        # Gradients sum terms that may cancel (x / x has none): tolerance relative to 1 at least.
        problem, a, r = compare(g, e, floor=1.0)
        if problem:
            return {
                "verdict": "mismatch",
                "detail": f"gradient of {name}: {problem}",
                "max_abs": a,
                "max_rel": r,
            }
    return None


def main(argv: list[str]) -> int:
    """Runs the cases given as JSON arguments (or JSON lines on stdin) in this process."""
    texts = argv or [line for line in sys.stdin if line.strip()]
    for text in texts:
        case = json.loads(text)
        case = case.get("case", case)  # a failure record from benches/fuzz.py works too
        print(json.dumps(run_case(case)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
