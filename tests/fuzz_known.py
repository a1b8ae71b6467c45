"""Bugs the fuzzer found that are not fixed yet, each with a minimal reproducer.

``tests/test_fuzz.py`` runs every reproducer as ``xfail(strict=True)``: when a
fix lands the reproducer passes, the test reports an unexpected pass, and the
entry here is deleted. Until then the property test accepts a failing case
that an entry's ``matches`` explains, and skips cases an entry's ``costly``
flags (an abort costs a worker restart, a hang its timeout).
``benches/fuzz.py`` counts every failure, listed or not.

Replay a reproducer in this process (with its backtrace)::

    PYTHONPATH=python python tests/fuzz_check.py "$(python -c 'import sys; sys.path.insert(0, "tests"); import fuzz_known, json; print(json.dumps(fuzz_known.KNOWN_BUGS["linear_zero_features"].repro))')"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: Fields a reproducer takes unless it says otherwise.
_BASE = {
    "dtype": "float32",
    "layout": "contiguous",
    "mode": "convert",
    "context": "no_grad",
    "scale": 1.0,
    "specials": False,
    "seed": 0,
    "big": False,
    "algorithm": "default",
}


def conv(**kw) -> dict:
    """A conv2d case: ``nn.Conv2d(1, 1, 3)`` on a 1x1x5x5 input unless ``kw`` says otherwise."""
    return {**_BASE, "kind": "conv2d", "form": "module", "batched": True, "n": 1, "in_c": 1,
            "out_c": 1, "hw": [5, 5], "kernel": 3, "stride": 1, "padding": 0, "dilation": 1,
            "groups": 1, "bias": False, "padding_mode": "zeros", **kw}  # fmt: skip


def case(kind: str, **kw) -> dict:
    """A case of ``kind`` with the default fields."""
    return {**_BASE, "kind": kind, **kw}


@dataclass(frozen=True)
class KnownBug:
    """A bug: what it is, a minimal case that shows it, which failures it explains and
    (optionally) which cases the CI property skips because of it."""

    summary: str
    repro: dict
    matches: Callable[[dict, dict], bool]
    costly: Callable[[dict], bool] | None = None


def _err(v: dict) -> str:
    return v.get("ai3_error", "")


def _padded_bytes(c: dict) -> int:
    """Bytes of a convolution's zero-padded input (ai3 materializes it; FFT more)."""
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


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (v[0], v[1])


def _pool_window(c: dict) -> int:
    if c.get("kind") != "maxpool2d":
        return 0
    k, d = c["kernel"], c["dilation"]
    k = max(k) if isinstance(k, list) else k
    d = max(d) if isinstance(d, list) else d
    return k * max(d, 1)


KNOWN_BUGS: dict[str, KnownBug] = {
    "huge_padding_aborts": KnownBug(
        "conv2d with padding 10**6 aborts the process ('memory allocation of ... bytes "
        "failed' in Tensor::zeros / the padded copy) instead of raising an ai3.Error; with "
        "stride 10**6 too PyTorch computes a 3x3 output",
        conv(padding=10**6, stride=10**6),
        lambda c, v: (
            v["verdict"] == "abort" and v.get("crash", "").startswith("memory allocation of")
        ),
        lambda c: _padded_bytes(c) > 10**8,
    ),
    "huge_padding_capacity_overflow": KnownBug(
        "conv2d with padding and stride 10**12 panics ('capacity overflow' in "
        "Padded::new), reported as ai3.InternalError; PyTorch computes a 1x1 output",
        conv(padding=10**12, stride=10**12),
        lambda c, v: "capacity overflow" in _err(v),
    ),
    "maxpool_huge_kernel_hangs": KnownBug(
        "maxpool2d takes time proportional to the kernel size, not the input: kernel "
        "10**12 with padding 5*10**11 on a 1x1 input runs for hours (kernel 10**8: 0.5 s); "
        "avgpool2d clips its windows and is instant",
        case(
            "maxpool2d",
            op="maxpool2d",
            form="module",
            shape=[1, 1, 1, 1],
            batched=True,
            kernel=10**12,
            stride=None,
            padding=[5 * 10**11] * 2,
            ceil_mode=False,
            dilation=1,
        ),  # fmt: skip
        lambda c, v: v["verdict"] == "hang" and c["kind"] == "maxpool2d",
        lambda c: _pool_window(c) >= 10**8,
    ),
    "linear_zero_features": KnownBug(
        "linear with 0 in or out features raises ShapeError ('weight of shape [0, 3] has "
        "no elements'); PyTorch returns an empty output (0 out) or the bias (0 in)",
        case("linear", form="module", in_f=3, out_f=0, bias=True, shape=[2, 3]),
        lambda c, v: (
            v["verdict"] == "ai3_only_raises"
            and "linear: weight of shape" in _err(v)
            and "has no elements" in _err(v)
        ),
    ),
    "adaptive_zero_output_size": KnownBug(
        "adaptive pools with output_size 0 (in either dim) raise InvalidArgumentError; "
        "PyTorch returns an empty tensor",
        case(
            "adaptiveavgpool2d",
            op="adaptiveavgpool2d",
            form="module",
            shape=[1, 1, 5, 5],
            output_size=0,
        ),
        lambda c, v: (
            v["verdict"] == "ai3_only_raises" and "output_size must be positive" in _err(v)
        ),
    ),
    "ceil_mode_window_past_input": KnownBug(
        "max/avg pools with ceil_mode=True whose window is larger than the padded input "
        "raise ShapeError; PyTorch computes one window, clipped to the input (AvgPool2d(3, "
        "padding=(0, 1), ceil_mode=True) on 1x1 gives 1/3 of the value)",
        case(
            "avgpool2d",
            op="avgpool2d",
            form="module",
            shape=[1, 2, 1, 1],
            batched=True,
            kernel=3,
            stride=None,
            padding=[0, 1],
            ceil_mode=True,
            count_include_pad=True,
            divisor_override=None,
            scale=1.0,
        ),  # fmt: skip
        lambda c, v: (
            v["verdict"] == "ai3_only_raises" and "is larger than the padded input" in _err(v)
        ),
    ),
    "cat_legacy_empty": KnownBug(
        "torch.cat skips empty 1-D tensors whatever the rank of the others (legacy behaviour): "
        "torch.cat([torch.empty(0), x]) is x; ai3 raises ShapeError",
        case("cat", shapes=[[0], [2, 3]], dim=0, fn="cat"),
        lambda c, v: (
            c["kind"] == "cat" and [0] in c["shapes"] and v["verdict"] == "ai3_only_raises"
        ),
    ),
    "adaptive_empty_plane": KnownBug(
        "adaptive pools over an empty plane raise ShapeError; PyTorch returns NaN (avg) "
        "for AdaptiveAvgPool2d(1) on a (1, 3, 0) input",
        case(
            "adaptiveavgpool2d",
            op="adaptiveavgpool2d",
            form="module",
            shape=[1, 3, 0],
            output_size=1,
        ),
        lambda c, v: c["kind"].startswith("adaptive") and "empty spatial plane" in _err(v),
    ),
    "conv_empty_batch_empty_plane": KnownBug(
        "conv2d on an empty batch with an empty plane ([0, 3, 0, 7], padding 1) raises "
        "ShapeError; PyTorch returns the empty output (it rejects empty planes only for "
        "non-empty batches)",
        conv(n=0, in_c=3, out_c=3, hw=[0, 7], kernel=2, padding=1),
        lambda c, v: (
            c["kind"] == "conv2d"
            and v["verdict"] == "ai3_only_raises"
            and "empty spatial plane" in _err(v)
        ),
    ),
}


def explain(case: dict, verdict: dict) -> KnownBug | None:
    """The listed bug that explains a failing ``verdict`` of ``case``, if any."""
    return next((b for b in KNOWN_BUGS.values() if b.matches(case, verdict)), None)


def too_costly(case: dict) -> str | None:
    """The name of a listed bug that makes ``case`` an abort or a hang, if any."""
    return next((n for n, b in KNOWN_BUGS.items() if b.costly and b.costly(case)), None)
