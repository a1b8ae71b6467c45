"""The fuzzer's cases: hypothesis strategies that draw plain-data cases.

A case is a JSON-serializable dict (``kind``, hyperparameters, input shapes,
``dtype``, ``layout``, ``mode``, ``algorithm``, ``seed``), so it can be sent to
a worker process, printed on failure and replayed. The checker that turns a
case into PyTorch modules and runs ai3 on them is :mod:`fuzz_check`; the
worker process and its harness are :mod:`fuzz_worker`. ``tests/test_fuzz.py``
runs a bounded number of cases with a fixed seed, ``benches/fuzz.py`` a long
campaign; both draw from :func:`cases`.

Extremes go into hyperparameters (strides, padding and dilation up to 10**12,
kernels larger than their inputs, 0-sized dimensions, negative values); four
cases in ten of the convolutions and pools draw from them, the others from the
usual small values, where a wrong answer rather than an error is what to look
for. Tensors stay small (a few thousand elements; one case in ten up to 70,000,
to reach the kernels' blocked and parallel paths), so a case costs
milliseconds. A convolution whose output would be large enough to be slow but
still allocatable (between about 2e5 elements and 1e10) is pulled back to a
small output by raising its stride: that range finds nothing the small and the
astronomically large (which must raise cleanly) do not, and costs seconds per
case.

The ``mode`` is drawn among ``convert``, ``swap`` and ``swap_convert`` where the
case's module is one ``ai3.swap_operation`` replaces (conv2d, linear, relu, the
max/avg/adaptive-avg pools, flatten, and graphs); other cases are converted.
This module imports hypothesis only: cases are plain data.
"""

from __future__ import annotations

import math

from hypothesis import assume
from hypothesis import strategies as st

#: conv2d algorithms drawn ('custom' only when compiled in: see :func:`set_conv_algorithms`).
CONV_ALGOS: list[str] = ["direct", "smm", "gemm", "winograd", "fft", "default"]

#: Dimensions of inputs, "nice" values first (hypothesis shrinks towards the front).
DIMS = [1, 2, 3, 4, 5, 0, 7, 8]

#: Huge hyperparameter values: powers of ten up to 10**12, and the 32-bit boundaries.
HUGE = [10**k for k in range(1, 13)] + [2**31 - 1, 2**31, 2**32 + 1]

#: The families of cases, each with its own strategy.
FAMILIES = (
    "conv2d",
    "pool",
    "adaptive",
    "linear",
    "activation",
    "binary",
    "cat",
    "flatten",
    "graph",
)

#: Activations ai3 converts (see ``python/ai3/_lowering.py``), with the forms they come in.
ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "relu": ("module", "function", "method"),
    "relu6": ("module", "function"),
    "hardtanh": ("module", "function"),
    "hardswish": ("module", "function"),
    "hardsigmoid": ("module", "function"),
    "silu": ("module", "function"),
    "sigmoid": ("module", "function", "method"),
    "tanh": ("module", "function", "method"),
    "gelu": ("module", "function"),
    "softmax": ("module", "function", "method"),
}


def set_conv_algorithms(names: list[str]) -> None:
    """Replaces :data:`CONV_ALGOS` (e.g. to add 'custom' when it is compiled in)."""
    CONV_ALGOS[:] = names


# ---- shared pieces ----------------------------------------------------------------------------

seeds = st.integers(0, 2**31 - 1)
dtypes = st.sampled_from(["float32", "float64"])
dims = st.sampled_from(DIMS)
small_pos = st.integers(1, 3)
huge = st.sampled_from(HUGE)


def weighted(*pairs: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, picked with the given integer weights. (``st.one_of``
    cannot weight: it draws each distinct strategy equally often, repeats included.)"""
    picks = [i for i, (w, _) in enumerate(pairs) for _ in range(w)]
    return st.sampled_from(picks).flatmap(lambda i: pairs[i][1])


#: An extreme case's stride or dilation: often small, often huge, sometimes invalid (0, -1).
step_values = weighted((5, small_pos), (4, huge), (1, st.sampled_from([0, -1])))
#: An extreme case's padding: often small, often huge, sometimes negative.
pad_values = weighted((5, st.integers(0, 2)), (4, huge), (1, st.just(-1)))
#: Whether a case draws its hyperparameters from the extremes (4 in 10) or the usual
#: small values (where a wrong answer, not an error, is what to look for).
extremes = st.integers(0, 9).map(lambda k: k < 4)
#: Magnitudes of inputs.
scales = st.sampled_from([1.0, 1e-3, 1e3])


#: Sizes of the occasional large case, which reaches the kernels' blocked and parallel
#: paths (ai3 splits work above 2**15 elements or 2**20 multiply-adds).
BIG_DIMS = [16, 33, 64, 1, 7]
#: The most elements of a large input.
BIG_NUMEL = 70_000


@st.composite
def shapes_of(draw, rank: int, big: bool) -> list[int]:
    """An input shape of ``rank``: small dims, or (``big``) up to :data:`BIG_NUMEL` elements."""
    if not big:
        return [draw(dims) for _ in range(rank)]
    shape = [draw(st.sampled_from(BIG_DIMS)) for _ in range(rank)]
    while math.prod(shape) > BIG_NUMEL:
        i = shape.index(max(shape))
        shape[i] = (shape[i] + 1) // 2
    return shape


def pair_of(values: st.SearchStrategy) -> st.SearchStrategy:
    """An int (both sides) or a pair of values drawn from ``values``."""
    return st.one_of(values, st.tuples(values, values).map(list))


def pair(v) -> tuple[int, int]:
    """``3`` -> ``(3, 3)``; ``[2, 3]`` -> ``(2, 3)``."""
    return (v, v) if isinstance(v, int) else (v[0], v[1])


@st.composite
def layouts(draw, rank: int) -> str:
    """How the input tensor is laid out in memory (see ``fuzz_check.make_input``)."""
    choices = ["contiguous", "sliced", "expanded"]
    if rank >= 2:
        choices.append("transposed")
    if rank == 4:
        choices.append("channels_last")
    return draw(st.sampled_from(choices))


@st.composite
def base(draw, kind: str, modes=("convert",), rank: int = 4) -> dict:
    """The fields every case has."""
    return {
        "kind": kind,
        "dtype": draw(dtypes),
        "layout": draw(layouts(rank)),
        "mode": draw(st.sampled_from(modes)),
        "context": draw(st.sampled_from(["inference_mode", "no_grad", "grad"])),
        "scale": draw(scales),
        "specials": draw(st.integers(0, 3)) == 0,  # a few NaN and infinities in the inputs
        "seed": draw(seeds),
        "big": draw(st.integers(0, 9)) == 0,  # a large input (see shapes_of)
    }


def conv_out(size: int, k: int, s: int, p_lo: int, p_hi: int, d: int) -> int:
    """PyTorch's output size of a convolution or pooling window along one axis
    (``floor``), or 0 when there is no window."""
    if s <= 0 or d <= 0 or k <= 0:
        return 0
    span = d * (k - 1) + 1
    padded = size + p_lo + p_hi
    return 0 if padded < span else (padded - span) // s + 1


def _pull_back(size: int, k: int, s: int, p_lo: int, p_hi: int, d: int, limit: int) -> int:
    """A stride ``>= s`` that gives at most ``limit`` outputs along the axis."""
    span = max(d, 1) * (k - 1) + 1
    padded = size + p_lo + p_hi
    if s <= 0 or padded < span:
        return s
    return max(s, math.ceil((padded - span + 1) / limit))


def _too_slow(numel: int, work: int) -> bool:
    """The output is too large to be quick but small enough that PyTorch may compute it."""
    return (numel > 200_000 or work > 50_000_000) and numel < 10**10


# ---- conv2d -----------------------------------------------------------------------------------


@st.composite
def conv2d_cases(draw) -> dict:
    """A convolution: module (every padding mode) or ``F.conv2d``; any algorithm."""
    form = draw(st.sampled_from(["module", "function"]))
    case = draw(
        base("conv2d", ("convert", "swap", "swap_convert") if form == "module" else ("convert",))
    )
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    per_group = [1, 2, 3, 1, 2, 3, 0] if not case["big"] else [8, 5, 16, 1]
    in_c = groups * draw(st.sampled_from(per_group))
    out_c = groups * draw(st.sampled_from(per_group))
    if draw(st.integers(0, 19)) == 0:  # groups that do not divide the channels
        in_c += 1
    n = draw(st.sampled_from([1, 2, 3, 1, 2, 3, 0]))
    h, w = draw(shapes_of(2, case["big"]))
    if case["big"]:
        h, w = min(h, 40), min(w, 40)
    if draw(extremes):
        kernel = draw(pair_of(st.one_of(st.integers(1, 5), st.sampled_from([7, 9, 12]))))
        stride = draw(pair_of(step_values))
        dilation = draw(pair_of(step_values))
        padding = draw(st.one_of(pair_of(pad_values), st.sampled_from(["same", "valid"])))
    else:
        kernel = draw(pair_of(st.integers(1, 3)))
        stride = draw(pair_of(st.integers(1, 2)))
        dilation = draw(pair_of(st.integers(1, 2)))
        padding = draw(
            weighted((3, pair_of(st.integers(0, 2))), (1, st.sampled_from(["same", "valid"])))
        )
    mode = (
        draw(st.sampled_from(["zeros", "reflect", "replicate", "circular"]))
        if form == "module"
        else "zeros"
    )
    case.update(
        form=form,
        batched=draw(st.booleans().map(lambda b: b or n != 1)),
        n=n,
        in_c=in_c,
        out_c=out_c,
        hw=[h, w],
        kernel=kernel,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        bias=draw(st.booleans()),
        padding_mode=mode,
        algorithm=draw(st.sampled_from(CONV_ALGOS)),
    )
    if case["algorithm"] in ("winograd", "fft"):
        case["specials"] = False  # mixing transforms spread NaN/inf by design
    _keep_conv_small(case)
    return case


def _keep_conv_small(case: dict) -> None:
    """Raises the stride of a convolution whose output would be slow (see the module doc)."""
    if isinstance(case["padding"], str):
        return
    (kh, kw), (sh, sw) = pair(case["kernel"]), pair(case["stride"])
    (ph, pw), (dh, dw) = pair(case["padding"]), pair(case["dilation"])
    h, w = case["hw"]
    oh, ow = conv_out(h, kh, sh, ph, ph, dh), conv_out(w, kw, sw, pw, pw, dw)
    numel = max(case["n"], 1) * max(case["out_c"], 1) * oh * ow
    work = numel * max(case["in_c"] // max(case["groups"], 1), 1) * kh * kw
    if _too_slow(numel, work):
        case["stride"] = [
            _pull_back(h, kh, sh, ph, ph, dh, 8),
            _pull_back(w, kw, sw, pw, pw, dw, 8),
        ]


# ---- pools ------------------------------------------------------------------------------------


@st.composite
def pool_cases(draw) -> dict:
    """MaxPool2d / AvgPool2d, as modules or ``F.*`` functions."""
    op = draw(st.sampled_from(["maxpool2d", "avgpool2d"]))
    form = draw(st.sampled_from(["module", "function"]))
    case = draw(base(op, ("convert", "swap", "swap_convert") if form == "module" else ("convert",)))
    extreme = draw(extremes)
    if extreme:
        kernel = draw(pair_of(weighted((6, st.integers(1, 4)), (3, huge), (1, st.just(0)))))
        stride = draw(st.one_of(st.none(), pair_of(step_values)))
    else:
        kernel = draw(pair_of(st.integers(1, 3)))
        stride = draw(st.one_of(st.none(), pair_of(st.integers(1, 3))))
    kh, kw = pair(kernel)
    # PyTorch wants padding <= kernel / 2; mostly respect it, sometimes not.
    if extreme and draw(st.integers(0, 4)) == 0:
        padding = draw(pair_of(pad_values))
    else:
        padding = [draw(st.integers(0, max(kh // 2, 0))), draw(st.integers(0, max(kw // 2, 0)))]
        if extreme and draw(st.booleans()):
            padding = [draw(st.sampled_from([0, kh // 2])), draw(st.sampled_from([0, kw // 2]))]
    case.update(
        op=op,
        form=form,
        shape=[
            draw(st.sampled_from([1, 2, 0])),
            draw(st.sampled_from([1, 2, 3, 0]) if not case["big"] else st.just(16)),
            *draw(shapes_of(2, case["big"])),
        ],
        batched=draw(st.booleans()),
        kernel=kernel,
        stride=stride,
        padding=padding,
        ceil_mode=draw(st.booleans()),
        algorithm=draw(st.sampled_from(["direct", "default"])),
    )
    # PyTorch's max pooling visits every tap of every window: a window of 10**9
    # taps over many outputs would take it hours (ai3 only visits taps inside
    # the input). Kernels past 2**31 PyTorch refuses at once, so those stay.
    if op == "maxpool2d" and max(kh, kw) < 2**31:
        assume(kh * kw * max(math.prod(case["shape"]), 1) <= 4 * 10**9)
    if op == "maxpool2d":
        case["dilation"] = draw(
            pair_of(st.one_of(small_pos, huge) if extreme else st.integers(1, 2))
        )
    else:
        case["count_include_pad"] = draw(st.booleans())
        case["divisor_override"] = draw(
            weighted(
                (6, st.none()), (3, st.sampled_from([1, 3, 10**12])), (1, st.sampled_from([0, -2]))
            )
        )
    if not case["batched"]:
        case["shape"] = case["shape"][1:]
    return case


@st.composite
def adaptive_cases(draw) -> dict:
    """AdaptiveAvgPool2d (swappable) / AdaptiveMaxPool2d, modules or functions."""
    op = draw(st.sampled_from(["adaptiveavgpool2d", "adaptivemaxpool2d"]))
    form = draw(st.sampled_from(["module", "function"]))
    swappable = op == "adaptiveavgpool2d" and form == "module"
    case = draw(base(op, ("convert", "swap", "swap_convert") if swappable else ("convert",)))
    size = st.sampled_from([1, 2, 3, 5, 7, 0, 16])
    output = draw(
        st.one_of(size, st.tuples(st.one_of(size, st.none()), st.one_of(size, st.none())).map(list))
    )
    shape = [
        draw(st.sampled_from([1, 2, 0])),
        draw(st.sampled_from([1, 2, 3])),
        *draw(shapes_of(2, case["big"])),
    ]
    case.update(
        op=op,
        form=form,
        shape=shape,
        output_size=output,
        algorithm=draw(st.sampled_from(["direct", "default"])),
    )
    if draw(st.booleans()):
        case["shape"] = shape[1:]
    return case


# ---- linear, activations, flatten -------------------------------------------------------------


@st.composite
def linear_cases(draw) -> dict:
    """``nn.Linear`` / ``F.linear`` over inputs of rank 1 to 4."""
    form = draw(st.sampled_from(["module", "function"]))
    rank = draw(st.integers(1, 4))
    case = draw(
        base(
            "linear",
            ("convert", "swap", "swap_convert") if form == "module" else ("convert",),
            rank,
        )
    )
    in_f = draw(st.sampled_from([1, 3, 8, 0, 17] if not case["big"] else [1030, 64, 257]))
    lead = [
        draw(st.sampled_from([1, 2, 3, 0] if not case["big"] else [1, 33, 5]))
        for _ in range(rank - 1)
    ]
    if case["big"]:
        while math.prod(lead) * in_f > BIG_NUMEL:
            lead[lead.index(max(lead))] //= 2
    last = in_f if draw(st.integers(0, 19)) else in_f + 1  # rarely a mismatch
    case.update(
        form=form,
        in_f=in_f,
        out_f=draw(st.sampled_from([1, 4, 0, 9] if not case["big"] else [65, 130, 1])),
        bias=draw(st.booleans()),
        shape=[*lead, last],
        algorithm=draw(st.sampled_from(["gemm", "default"])),
    )
    return case


@st.composite
def activation_params(draw, name: str, rank: int) -> dict:
    """Hyperparameters of an activation."""
    if name == "hardtanh":
        lo = draw(st.sampled_from([-1.0, -2.5, 0.0, 0.5, -1e30]))
        hi = draw(st.sampled_from([1.0, 3.0, 0.25, 1e30]))
        return {"min_val": lo, "max_val": hi}
    if name == "gelu":
        return {"approximate": draw(st.sampled_from(["none", "tanh"]))}
    if name == "softmax":
        return {"dim": draw(st.integers(-rank, rank - 1)) if rank else 0}
    return {}


@st.composite
def activation_cases(draw) -> dict:
    """One activation on an input of rank 1 to 4, as a module, function or method."""
    name = draw(st.sampled_from(sorted(ACTIVATIONS)))
    form = draw(st.sampled_from(ACTIVATIONS[name]))
    rank = draw(st.integers(1, 4))
    swappable = name == "relu" and form == "module"
    case = draw(
        base("activation", ("convert", "swap", "swap_convert") if swappable else ("convert",), rank)
    )
    case.update(
        name=name,
        form=form,
        params=draw(activation_params(name, rank)),
        shape=draw(shapes_of(rank, case["big"])),
        algorithm=draw(st.sampled_from(["direct", "default"])),
    )
    case["scale"] = draw(st.sampled_from([3.0, 1e-3, 1e3]))  # reach the activations' bends
    return case


@st.composite
def flatten_cases(draw) -> dict:
    """``nn.Flatten`` / ``torch.flatten`` with any start and end dims."""
    rank = draw(st.integers(1, 4))
    form = draw(st.sampled_from(["module", "function"]))
    case = draw(
        base(
            "flatten",
            ("convert", "swap", "swap_convert") if form == "module" else ("convert",),
            rank,
        )
    )
    case.update(
        form=form,
        shape=draw(shapes_of(rank, case["big"])),
        start_dim=draw(st.integers(-rank, rank - 1)),
        end_dim=draw(st.integers(-rank, rank - 1)),
        algorithm=draw(st.sampled_from(["direct", "default"])),
    )
    return case


# ---- binary ops, cat --------------------------------------------------------------------------


@st.composite
def broadcast_shapes(draw, big: bool) -> tuple[list[int], list[int]]:
    """Two shapes that broadcast (rarely, two that do not)."""
    rank = draw(st.integers(0, 4))
    full = draw(shapes_of(rank, big))

    def operand() -> list[int]:
        r = draw(st.integers(0, rank))
        return [1 if draw(st.integers(0, 2)) == 0 else d for d in full[rank - r :]]

    a, b = operand(), operand()
    if a and draw(st.integers(0, 19)) == 0:
        a[-1] += 1  # rarely, shapes that do not broadcast
    return a, b


@st.composite
def binary_cases(draw) -> dict:
    """add/sub/mul/div: tensor with tensor (broadcasting) or with a scalar, as an operator,
    a ``torch.*`` function or a tensor method, with ``alpha`` and ``rounding_mode``."""
    case = draw(base("binary"))
    op = draw(st.sampled_from(["add", "sub", "mul", "div"]))
    form = draw(st.sampled_from(["operator", "function", "method"]))
    a, b = draw(broadcast_shapes(case["big"]))
    operand = draw(st.sampled_from(["tensor", "tensor", "scalar"]))
    case.update(op=op, form=form, shapes=[a, b] if operand == "tensor" else [a])
    case["layout"] = draw(layouts(len(a)))
    if operand == "scalar":
        case["scalar"] = draw(
            st.sampled_from([2, 0.5, -3, 0, 0.0, 1e30, -1e-30, float("inf"), float("nan")])
        )
        case["scalar_first"] = form == "operator" and draw(st.booleans())
    options: dict = {}
    if form != "operator" and op in ("add", "sub") and draw(st.integers(0, 3)) == 0:
        options["alpha"] = draw(st.sampled_from([1, 2, 0.5, -1]))
    if form != "operator" and op == "div" and draw(st.integers(0, 3)) == 0:
        options["rounding_mode"] = draw(st.sampled_from([None, "trunc", "floor"]))
    case["options"] = options
    case["algorithm"] = draw(st.sampled_from(["direct", "default"]))
    return case


@st.composite
def cat_cases(draw) -> dict:
    """``torch.cat`` / ``torch.concat`` of 1 to 4 tensors along any dim (some of them
    0-sized there), rarely with a mismatch or the legacy empty 1-D piece."""
    case = draw(base("cat"))
    rank = draw(st.integers(1, 4))
    common = draw(shapes_of(rank, case["big"]))
    dim = draw(st.integers(-rank, rank - 1))
    count = draw(st.integers(1, 4))
    shapes = []
    for _ in range(count):
        s = list(common)
        s[dim] = draw(st.sampled_from([1, 2, 0, 3]))
        shapes.append(s)
    if draw(st.integers(0, 14)) == 0:
        shapes[-1][(dim + 1) % rank] += 1  # sizes differ off the cat dim
    if draw(st.integers(0, 14)) == 0:
        shapes.insert(draw(st.integers(0, len(shapes))), [0])  # PyTorch skips empty 1-D tensors
    if draw(st.integers(0, 19)) == 0:
        dim = draw(st.sampled_from([rank, -rank - 1]))  # out of range
    case.update(
        shapes=shapes,
        dim=dim,
        fn=draw(st.sampled_from(["cat", "concat"])),
        algorithm=draw(st.sampled_from(["direct", "default"])),
    )
    case["layout"] = draw(layouts(rank))
    return case


# ---- small graphs -----------------------------------------------------------------------------


@st.composite
def graph_cases(draw) -> dict:
    """2 to 5 nodes chaining convolutions, pools, activations, BatchNorm, residual
    arithmetic and concatenations with shape-compatible choices; optionally a
    flatten and a linear layer at the end. Node ``i`` is value ``i + 1``; value 0
    is the input."""
    case = draw(base("graph", ("convert", "swap", "swap_convert")))
    n = draw(st.sampled_from([1, 2, 0]))
    if case["big"]:
        shapes = [
            [
                n,
                draw(st.sampled_from([8, 16])),
                draw(st.integers(16, 33)),
                draw(st.integers(16, 33)),
            ]
        ]
    else:
        shapes = [[n, draw(st.integers(1, 4)), draw(st.integers(1, 9)), draw(st.integers(1, 9))]]
    nodes: list[dict] = []
    for _ in range(draw(st.integers(2, 5))):
        src = draw(st.integers(0, len(shapes) - 1))
        _, c, h, w = shapes[src]
        kinds = ["conv", "act", "binary", "bn"]
        if h >= 2 and w >= 2:
            kinds += ["maxpool", "avgpool"]
        kinds += ["adaptive", "cat"]
        kind = draw(st.sampled_from(kinds))
        node: dict = {"op": kind, "src": src}
        if kind == "conv":
            groups = draw(st.sampled_from([g for g in (1, 2, c) if c % g == 0]))
            k = draw(st.integers(1, min(3, h, w) if min(h, w) >= 1 else 1))
            pad = draw(st.integers(0, k // 2 + 1))
            stride = draw(st.sampled_from([1, 1, 2, 10**12]))
            out_c = groups * draw(st.integers(1, 3))
            algos = [a for a in CONV_ALGOS if a != "winograd" or (k == 3 and stride == 1)]
            node.update(
                in_c=c,
                out_c=out_c,
                kernel=k,
                stride=stride,
                padding=pad,
                groups=groups,
                bias=draw(st.booleans()),
                padding_mode=draw(
                    st.sampled_from(["zeros", "zeros", "reflect", "replicate", "circular"])
                )
                if pad < min(h, w)
                else "zeros",
                algorithm=draw(st.sampled_from(algos)),
            )
            out = [
                n,
                out_c,
                conv_out(h, k, stride, pad, pad, 1),
                conv_out(w, k, stride, pad, pad, 1),
            ]
        elif kind in ("maxpool", "avgpool"):
            k = draw(st.integers(1, min(3, h, w)))
            s = draw(st.integers(1, 2))
            p = draw(st.integers(0, k // 2))
            node.update(kernel=k, stride=s, padding=p, ceil_mode=draw(st.booleans()))
            oh, ow = (
                _pool_out(h, k, s, p, node["ceil_mode"]),
                _pool_out(w, k, s, p, node["ceil_mode"]),
            )
            out = [n, c, oh, ow]
        elif kind == "adaptive":
            size = draw(st.integers(1, 3))
            node.update(size=size, max=draw(st.booleans()))
            out = [n, c, size, size]
        elif kind == "act":
            name = draw(st.sampled_from(sorted(ACTIVATIONS)))
            node.update(
                name=name,
                form=draw(st.sampled_from(ACTIVATIONS[name])),
                params=draw(activation_params(name, 4)),
            )
            out = list(shapes[src])
        elif kind == "bn":
            node.update(c=c)
            out = list(shapes[src])
        elif kind == "binary":
            same = [i for i, s in enumerate(shapes) if s == shapes[src]]
            other = draw(st.sampled_from(same + [None]))
            node.update(fn=draw(st.sampled_from(["add", "sub", "mul", "div"])), other=other)
            if other is None:
                node["scalar"] = draw(st.sampled_from([2.0, -0.5, 3]))
            out = list(shapes[src])
        else:  # cat along channels with a value of the same batch and spatial size
            same = [i for i, s in enumerate(shapes) if s[0] == n and s[2:] == shapes[src][2:]]
            other = draw(st.sampled_from(same))
            node.update(other=other)
            out = [n, c + shapes[other][1], h, w]
        if min(out[2:]) < 1:
            continue  # a window that does not fit: skip this node
        nodes.append(node)
        shapes.append(out)
    if not nodes:
        nodes.append({"op": "act", "src": 0, "name": "relu", "form": "module", "params": {}})
        shapes.append(list(shapes[0]))
    tail = draw(st.sampled_from(["none", "none", "linear", "pair"]))
    if tail == "linear":
        _, c, h, w = shapes[-1]
        nodes.append(
            {
                "op": "linear",
                "src": len(shapes) - 1,
                "in_f": c * h * w,
                "out_f": draw(st.integers(1, 5)),
                "algorithm": draw(st.sampled_from(["gemm", "default"])),
            }
        )
    case["others"] = draw(st.sampled_from(["direct", "default"]))  # pools, relu, flatten
    case.update(
        input=shapes[0],
        nodes=nodes,
        outputs=[len(nodes)] if tail != "pair" else [len(nodes), draw(st.integers(1, len(nodes)))],
    )
    case["specials"] = False  # NaN through winograd/fft and BatchNorm folding would be noise here
    return case


def _pool_out(size: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    """PyTorch's pooled size (with ``ceil_mode``'s rule that the last window starts inside)."""
    span = size + 2 * p - k
    if span < 0:
        return 0
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


# ---- everything -------------------------------------------------------------------------------

STRATEGIES = {
    "conv2d": conv2d_cases,
    "pool": pool_cases,
    "adaptive": adaptive_cases,
    "linear": linear_cases,
    "activation": activation_cases,
    "binary": binary_cases,
    "cat": cat_cases,
    "flatten": flatten_cases,
    "graph": graph_cases,
}


#: Share of each family in a campaign (``benches/fuzz.py``) and in the CI test's budget.
WEIGHTS = {
    "conv2d": 0.30,
    "graph": 0.15,
    "pool": 0.12,
    "adaptive": 0.05,
    "linear": 0.08,
    "activation": 0.08,
    "binary": 0.08,
    "cat": 0.07,
    "flatten": 0.07,
}


def split(total: int, families: tuple[str, ...] = FAMILIES) -> dict[str, int]:
    """``total`` examples shared among ``families`` by :data:`WEIGHTS` (each at least 1)."""
    weight = sum(WEIGHTS[f] for f in families)
    return {f: max(1, round(total * WEIGHTS[f] / weight)) for f in families}


def cases(family: str) -> st.SearchStrategy[dict]:
    """The cases of one family. Families are drawn separately (hypothesis's
    ``one_of`` would starve the larger strategies of examples)."""
    return STRATEGIES[family]()
