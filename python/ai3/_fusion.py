"""Convert-time rewrites: BatchNorm folded into the convolution before it,
a constant per-feature scale (ConvNeXt's layer scale) folded into the
linear or convolution layer whose output it scales, a residual ``conv(x) +
y`` (ResNet's skip) or ``linear(x) + y`` added by the layer as it writes its
output, a per-channel scale ``x * s`` read only by a 1x1 convolution
(squeeze-and-excitation) applied by that convolution (which scales its
weights per image, see ``ai3_kernels::cpu::blocked::scaled``), convolutions
between permutes to and from channels last made channels-last nodes (the
permutes dropped),
activations fused into the convolution, linear, (unfolded) batch norm or
elementwise arithmetic node that feeds them, and attention written out as
``softmax(q @ kᵀ * scale + mask) @ v`` made one ``attention`` node
(:func:`fuse_attention`, before algorithms are selected, so that selectors
see it as attention).

Each only fires when the intermediate values have no other reader, so the
rewritten network computes the same function. The algorithm the user chose
for the convolution is still the one that runs, and an activation that runs
the user's C++ (``'custom'``) is never fused away.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
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


def _shape(n: torch.fx.Node) -> list[str] | None:
    """The node's shape as torch.export (``val``) or shape propagation recorded
    it, each size as text (symbolic sizes compare by name), or None."""
    val = n.meta.get("val")
    shape = val.shape if isinstance(val, torch.Tensor) else None
    meta = n.meta.get("tensor_meta")
    if shape is None and meta is not None and hasattr(meta, "shape"):
        shape = meta.shape
    return None if shape is None else [str(d) for d in shape]


def _is_last_two_swapped(s: Step, rank: int) -> bool:
    """Whether a ``permute`` step swaps the last two dimensions of a tensor of ``rank``."""
    p = s.params
    if "dims" in p:
        return list(p["dims"]) == [*range(rank - 2), rank - 1, rank - 2]
    last = {rank - 2, rank - 1}
    return {d % rank for d in (p.get("dim0", 0), p.get("dim1", 0))} == last


def _attention_of(lw: Lowerer, steps: list[Step], mm: Step) -> tuple[Step, list[Step]] | None:
    """The ``attention`` step computing ``mm`` when ``mm`` is ``softmax(q @ kᵀ
    [* s | / s] [+ mask], -1) @ v`` with each intermediate read once and q, k,
    v of one known shape (no broadcasting), with the steps it replaces."""
    readers = _readers(lw, steps)
    producer = {s.node: s for s in steps}

    def only(n: Any, op: tuple[str, ...]) -> Step | None:
        src = lw.canonical(n)
        s = producer.get(src)
        return s if s is not None and s.op in op and readers[src] == 1 else None

    if len(mm.inputs) != 2 or mm.params:
        return None
    softmax = only(mm.inputs[0], ("softmax",))
    if softmax is None:
        return None
    gone, mask, scale = [softmax], None, 1.0
    x = only(softmax.inputs[0], ("add", "mul", "div", "matmul"))
    if x is not None and x.op == "add" and len(x.inputs) == 2 and not x.params:
        for i in (0, 1):
            inner = only(x.inputs[i], ("mul", "div", "matmul"))
            if inner is not None:
                gone.append(x)
                mask, x = x.inputs[1 - i], inner
                break
        else:
            return None
    if x is not None and x.op in ("mul", "div") and len(x.inputs) == 1:
        p = x.params
        if "scalar" not in p or "activation" in p or (x.op == "div" and p["scalar_first"]):
            return None
        scale = p["scalar"] if x.op == "mul" else 1.0 / p["scalar"]
        gone.append(x)
        x = only(x.inputs[0], ("matmul",))
    if x is None or x.op != "matmul" or len(x.inputs) != 2 or x.params:
        return None
    gone.append(x)
    q, kt, v = x.inputs[0], x.inputs[1], mm.inputs[1]
    shapes = [_shape(lw.canonical(t)) for t in (q, kt, v)]
    if any(s is None for s in shapes):
        return None
    sq, skt, sv = shapes
    r = len(sq)
    transpose = producer.get(lw.canonical(kt))
    if (
        r < 2
        or len(skt) != r
        or len(sv) != r
        or transpose is None
        or transpose.op != "permute"
        or not _is_last_two_swapped(transpose, r)
    ):
        return None
    k = transpose.inputs[0]
    sk = _shape(lw.canonical(k))
    if sk is None or not (sq[:-2] == sk[:-2] == sv[:-2] and sq[-1] == sk[-1] and sk[-2] == sv[-2]):
        return None
    if readers[lw.canonical(kt)] == 1:
        gone.append(transpose)
    params: dict[str, Any] = {"is_causal": False, "scale": scale, "enable_gqa": False}
    inputs = [q, k, v]
    if mask is not None:
        sm = _shape(lw.canonical(mask))
        scores = [*sq[:-1], sk[-2]]
        # The mask must broadcast to the scores without growing them.
        if (
            sm is None
            or len(sm) > r
            or any(m not in ("1", t) for m, t in zip(sm[::-1], scores[::-1], strict=False))
        ):
            return None
        src = lw.resolve(mask)
        if src.op == "get_attr":
            params["attn_mask"] = lw.fetch(src.target)
        else:
            inputs.append(mask)
    return Step(mm.node, "attention", inputs, params, mm.module), gone


def fuse_attention(lw: Lowerer) -> None:
    """Rewrites each explicit ``softmax(q @ kᵀ * scale + mask) @ v`` among
    ``lw.steps`` into one ``attention`` step, in place of its final matmul."""
    for mm in [s for s in lw.steps if s.op == "matmul"]:
        found = _attention_of(lw, lw.steps, mm)
        if found is None:
            continue
        attention, gone = found
        lw.steps[lw.steps.index(mm)] = attention
        for s in gone:
            lw.steps.remove(s)


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


def _permuted_dim(s: Step, d: int, rank: int) -> int:
    """The input dimension a ``permute`` step puts at its output dimension ``d``."""
    p = s.params
    if "dims" in p:
        return list(p["dims"])[d] % rank
    if "dim0" in p:
        d0, d1 = p["dim0"] % rank, p["dim1"] % rank
        return d1 if d == d0 else d0 if d == d1 else d
    return rank - 1 - d  # no dims: all of them reversed


def _layer_scale(
    lw: Lowerer, steps: list[Step], mul: Step
) -> tuple[Step, torch.Tensor, torch.fx.Node] | None:
    """For ``mul`` = ``gamma * y`` (either order) with ``gamma`` a constant of
    the network and ``y`` a linear or convolution's output, directly or
    through one ``permute``, each read by nothing else, where ``gamma``
    scales the layer's output features (the last dimension of a linear's
    output, the channels of a convolution's; or every element alike) and
    leaves ``y``'s shape as it is (ConvNeXt's layer scale): that layer and
    ``gamma`` as one factor per output feature, and ``y``."""
    if len(mul.inputs) != 2 or mul.params:
        return None
    readers = _readers(lw, steps)
    for k in (0, 1):
        const, y = lw.canonical(mul.inputs[k]), lw.canonical(mul.inputs[1 - k])
        if const.op != "get_attr" or y is const:
            continue
        gamma = lw.fetch(const.target)
        shape = _shape(y)
        if (
            not isinstance(gamma, torch.Tensor)
            or not gamma.is_floating_point()
            or shape is None
            or _shape(mul.node) != shape
            or gamma.dim() > len(shape)
            or readers[y] != 1
        ):
            continue
        rank = len(shape)
        g_shape = [1] * (rank - gamma.dim()) + list(gamma.shape)
        varying = [d for d in range(rank) if g_shape[d] != 1]
        prod = next((p for p in steps if p.node is y), None)
        through = None
        if prod is not None and prod.op == "permute" and len(prod.inputs) == 1:
            src = lw.canonical(prod.inputs[0])
            through, prod = prod, next((p for p in steps if p.node is src), None)
            if readers[src] != 1:
                continue
        if (
            prod is None
            or prod.op not in ("linear", "conv2d")
            or len(prod.inputs) != 1
            or "activation" in prod.params
            or not all(isinstance(w, torch.Tensor) or w is None for w in _weights(prod))
        ):
            continue
        feature = rank - 1 if prod.op == "linear" else 1
        if prod.op == "conv2d" and rank != 4:
            continue
        if len(varying) > 1:
            continue
        if varying:
            d = varying[0] if through is None else _permuted_dim(through, varying[0], rank)
            if d != feature:
                continue
        out_features = prod.params["weight"].shape[0]
        if gamma.numel() not in (1, out_features):
            continue
        return prod, gamma.detach().reshape(-1).expand(out_features), y
    return None


def _scale(layer: Step, gamma: torch.Tensor) -> None:
    """Multiplies ``layer``'s output features by ``gamma`` through its weight and bias."""
    weight, bias = layer.params["weight"], layer.params.get("bias")
    with torch.no_grad():
        g = gamma.double()
        w = weight.detach().double() * g.view(-1, *([1] * (weight.dim() - 1)))
        layer.params["weight"] = w.to(weight.dtype)
        if bias is not None:
            layer.params["bias"] = (bias.detach().double() * g).to(bias.dtype)


def _weights(s: Step) -> list[Any]:
    """The step's weight parameters (tensors, ``In`` placeholders or None)."""
    names = ("weight", "bias", "running_mean", "running_var")
    return [s.params.get(k) for k in names]


def _residual_layer(lw: Lowerer, steps: list[Step], add: Step) -> tuple[Step, int] | None:
    """For ``add`` = ``layer(x) + y`` or ``y + layer(x)`` of equal known
    shapes, ``layer`` a convolution (NCHW) or a linear layer, where the add
    is the layer's only reader and the layer holds its weights and has no
    activation yet: the layer and the index of ``y`` among the add's
    inputs."""
    if len(add.inputs) != 2 or add.params:
        return None
    shapes = [_shape(lw.canonical(i)) for i in add.inputs]
    if shapes[0] is None or shapes[0] != shapes[1]:
        return None
    readers = _readers(lw, steps)
    for k in (0, 1):
        src = lw.canonical(add.inputs[k])
        conv = next((p for p in steps if p.node is src), None)
        if (
            conv is not None
            and conv.op in ("conv2d", "linear")
            and not conv.params.get("channels_last")
            and len(conv.inputs) == 1
            and readers[src] == 1
            and lw.canonical(add.inputs[1 - k]) is not src
            and "activation" not in conv.params
            and all(isinstance(w, torch.Tensor) or w is None for w in _weights(conv))
        ):
            return conv, 1 - k
    return None


#: Pixels of the input, per output channel of the 1x1 convolution, from
#: which a squeeze-and-excitation scale is folded into it: the convolution
#: then scales its weights per image (fewer than a sixteenth of the input's
#: elements) instead of a ``mul`` node's pass over the input. Measured on a
#: 2-core Zen 4 with AVX-512 in efficientnet_b0 (the two conversions'
#: calls alternating in one process, per-node medians), the layers with at
#: least this many (32 -> 16 at 112x112 to 240 -> 40 at 28x28) took 0.77-0.96x
#: the time of the mul and the convolution at batch 1 and 0.75-0.93x at
#: batch 10; at 14x14 and 7x7 (from 240 -> 80 at 14x14 on), where the
#: weights are a third of the input or more, 1.00-1.16x: those keep the
#: ``mul``. Whole networks with this rule (the same measure, calls
#: alternating, 300 at batch 1, 40 at batch 10, two runs): efficientnet_b0
#: 0.95-0.98x the time at batch 1 and 0.96-0.98x at batch 10,
#: mobilenet_v3_large 0.96-0.98x at batch 1.
SCALED_PIXELS_PER_CHANNEL = 16


def _scaled_input(
    lw: Lowerer, steps: list[Step], mul: Step, algo_of: dict[int, Any]
) -> tuple[Step, Any, Any] | None:
    """For ``mul`` = ``x * s`` (either order) with ``s`` of shape ``[n or 1,
    c, 1, 1]`` scaling the channels of a 4-D ``x`` (squeeze-and-excitation),
    where the mul's only reader is a 1x1 convolution (stride 1, no padding,
    one group, held weights, no input scale yet, an algorithm of ai3's own)
    reading it as its input, with at least ``SCALED_PIXELS_PER_CHANNEL``
    pixels of ``x`` per output channel: that convolution, ``x`` and ``s``."""
    if len(mul.inputs) != 2 or mul.params:
        return None
    out = lw.canonical(mul.node)
    readers = [s for s in steps if any(lw.canonical(i) is out for i in s.inputs)]
    if len(readers) != 1 or _readers(lw, steps)[out] != 1:
        return None
    conv = readers[0]
    p = conv.params
    weight = p.get("weight")
    algo = algo_of.get(id(conv))
    if (
        conv.op != "conv2d"
        or lw.canonical(conv.inputs[0]) is not out
        or len(conv.inputs) > 2
        or p.get("channels_last")
        or p.get("input_scale")
        or not isinstance(weight, torch.Tensor)
        or weight.dim() != 4
        or tuple(weight.shape[2:]) != (1, 1)
        or not all(isinstance(w, torch.Tensor) or w is None for w in _weights(conv))
        or tuple(p.get("stride", (1, 1))) != (1, 1)
        or tuple(p.get("padding", (0, 0, 0, 0))) != (0, 0, 0, 0)
        or p.get("groups", 1) != 1
        or p.get("padding_mode", "zeros") != "zeros"
        or not isinstance(algo, str)
        or _core.runs_custom("conv2d", algo)
    ):
        return None
    for k in (0, 1):
        x, s = mul.inputs[k], mul.inputs[1 - k]
        sx, ss = _shape(lw.canonical(x)), _shape(lw.canonical(s))
        if (
            sx is not None
            and ss is not None
            and len(sx) == 4
            and lw.canonical(x) is not lw.canonical(s)
            and _shape(mul.node) == sx
            and ss[0] in ("1", sx[0])
            and ss[1:] == [sx[1], "1", "1"]
            and sx[2].isdigit()
            and sx[3].isdigit()
            and int(sx[2]) * int(sx[3]) >= SCALED_PIXELS_PER_CHANNEL * weight.shape[0]
        ):
            return conv, x, s
    return None


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
    for mul in [s for s in steps if s.op == "mul"]:
        # A mul that runs the user's C++ stays, as an activation does below.
        algo = algo_of[id(mul)]
        if not isinstance(algo, str) or _core.runs_custom("mul", algo):
            continue
        scaled = _layer_scale(lw, steps, mul)
        if scaled is not None:
            layer, gamma, y = scaled
            _scale(layer, gamma)
            lw.kind[mul.node] = Alias(y)
            steps.remove(mul)
    _channels_last(lw, steps, algo_of)
    for add in [s for s in steps if s.op == "add"]:
        found = _residual_layer(lw, steps, add)
        if found is None:
            continue
        layer, other = found
        # The layer moves to the add's place: the residual may be computed
        # after it (ResNet's downsample branch), and nothing else reads the
        # layer's output.
        layer.inputs.append(add.inputs[other])
        steps.remove(layer)
        steps[steps.index(add)] = layer
        lw.kind[add.node] = Alias(layer.node)
    for mul in [s for s in steps if s.op == "mul"]:
        # A mul that runs the user's C++ stays, as for the layer scale above.
        algo = algo_of[id(mul)]
        if not isinstance(algo, str) or _core.runs_custom("mul", algo):
            continue
        found = _scaled_input(lw, steps, mul, algo_of)
        if found is None:
            continue
        # The convolution reads x and multiplies its channels by s itself,
        # after its residual if it has one; nothing else read the product.
        conv, x, scale = found
        conv.inputs[0] = x
        conv.inputs.append(scale)
        conv.params["input_scale"] = True
        steps.remove(mul)
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


#: ``permute`` dimensions from channels last to NCHW, and back.
TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def _perm(s: Step) -> list[int] | None:
    """A ``permute`` step's full permutation, for a 4-D value; else None."""
    if s.op != "permute" or len(s.inputs) != 1:
        return None
    try:
        return [_permuted_dim(s, d, 4) for d in range(4)]
    except (TypeError, ValueError, IndexError):
        return None


def _channels_last(lw: Lowerer, steps: list[Step], algo_of: dict[int, Any]) -> None:
    """Keeps channels-last values channels last across convolutions and
    adds, dropping the permutes around them (ConvNeXt's blocks: a depthwise
    convolution on ``permute(y, (0, 3, 1, 2))`` whose output is permuted
    back by ``(0, 2, 3, 1)`` for the layer norm, and a residual add of two
    such permutes).

    In order, where ``P(v)`` is ``permute(v, (0, 3, 1, 2))``:

    - ``conv(P(y))`` becomes ``P(conv'(y))``, ``conv'`` a channels-last
      convolution (one input, no activation, held weights), where every
      reader of the convolution's output absorbs the permute (one of these
      three rules);
    - ``add(P(a), P(b))`` of equal shapes becomes ``P(add(a, b))`` where
      one of the two permutes has no other reader;
    - ``permute(P(y), (0, 2, 3, 1))`` is ``y``.

    Permutes left with no reader are dropped. The rewritten graph computes
    the same values: each rewritten node's old output is now the permute
    after it, which its readers read.
    """
    producer = {s.node: s for s in steps}
    scratch = torch.fx.Graph()
    taken = {n.name for n in lw.gm.graph.nodes}

    def source(n: torch.fx.Node, perm: list[int]) -> Step | None:
        p = producer.get(lw.canonical(n))
        return p if p is not None and _perm(p) == perm else None

    def readers_of(n: torch.fx.Node) -> list[Step]:
        return [s for s in steps if any(lw.canonical(i) is n for i in s.inputs)]

    def is_output(n: torch.fx.Node) -> bool:
        return any(lw.canonical(o) is n for o in lw.outputs)

    def conv_ok(s: Step, reads: torch.fx.Node | None = None) -> bool:
        """Whether ``s`` can be made channels last, reading a permute to
        NCHW (or, with ``reads``, ``reads`` once it is one)."""
        return (
            s.op == "conv2d"
            and len(s.inputs) == 1
            and "activation" not in s.params
            and not s.params.get("channels_last")
            and s.params.get("padding_mode", "zeros") == "zeros"
            and all(isinstance(w, torch.Tensor) or w is None for w in _weights(s))
            and (
                source(s.inputs[0], TO_NCHW) is not None
                if reads is None
                else lw.canonical(s.inputs[0]) is reads
            )
        )

    def add_ok(s: Step) -> bool:
        if s.op != "add" or len(s.inputs) != 2 or s.params:
            return False
        ps = [source(i, TO_NCHW) for i in s.inputs]
        if None in ps or _shape(ps[0].node) is None or _shape(ps[0].node) != _shape(ps[1].node):
            return False
        return any(readers_of(p.node) == [s] for p in ps)

    def absorbs(r: Step, n: torch.fx.Node) -> bool:
        """Whether reader ``r`` of ``n`` would take ``P(n')`` without a permute."""
        if _perm(r) == TO_NHWC:
            return True
        if r.op == "conv2d":
            return conv_ok(r, reads=n)
        if r.op == "add" and len(r.inputs) == 2 and not r.params:
            others = [i for i in r.inputs if lw.canonical(i) is not n]
            return len(others) == 1 and source(others[0], TO_NCHW) is not None
        return False

    def permute_after(s: Step, new_inputs: list[torch.fx.Node]) -> None:
        """``s`` reads ``new_inputs`` (channels last); a permute to NCHW after
        it takes its place for every reader."""
        old = s.node
        # A node of a graph of its own: the traced graph stays as it was.
        name, k = f"{old.name}_nchw", 1
        while name in taken:
            name, k = f"{old.name}_nchw{k}", k + 1
        taken.add(name)
        after = scratch.placeholder(name)
        after.meta = dict(old.meta)
        # ``old`` now holds the channels-last value: its recorded shape too.
        shape = _shape(old)
        old.meta = {}
        if shape is not None:
            val = after.meta.get("val")
            sizes = val.shape if isinstance(val, torch.Tensor) else after.meta["tensor_meta"].shape
            old.meta["tensor_meta"] = SimpleNamespace(shape=[sizes[d] for d in TO_NHWC])
        for r in readers_of(old):
            r.inputs = [after if lw.canonical(i) is old else i for i in r.inputs]
        lw.outputs = [after if lw.canonical(o) is old else o for o in lw.outputs]
        s.inputs = new_inputs
        step = Step(after, "permute", [old], {"dims": list(TO_NCHW)})
        steps.insert(steps.index(s) + 1, step)
        producer[after] = step
        algo_of[id(step)] = "default"

    i = 0
    while i < len(steps):
        s = steps[i]
        if conv_ok(s):
            readers = readers_of(s.node)
            if readers and not is_output(s.node) and all(absorbs(r, s.node) for r in readers):
                src = source(s.inputs[0], TO_NCHW)
                s.params["channels_last"] = True
                permute_after(s, [src.inputs[0]])
        elif add_ok(s):
            permute_after(s, [source(n, TO_NCHW).inputs[0] for n in s.inputs])
        elif _perm(s) == TO_NHWC and source(s.inputs[0], TO_NCHW) is not None:
            lw.kind[s.node] = Alias(source(s.inputs[0], TO_NCHW).inputs[0])
            steps.pop(i)
            continue
        i += 1
    while True:
        count = _readers(lw, steps)
        dead = [s for s in steps if s.op == "permute" and count[s.node] == 0]
        if not dead:
            return
        for s in dead:
            steps.remove(s)
