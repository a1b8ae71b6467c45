"""conv2d: every algorithm, both dtypes, through ``convert`` and ``swap_conv2d``.

The grid varies one hyperparameter at a time around a base layer (so every
value of every axis is covered for every algorithm), plus a few random
combinations drawn with a fixed seed.
"""

from __future__ import annotations

import copy
import random

import ai3
import pytest
import torch
from ai3 import swap
from conftest import DTYPE_IDS, DTYPES, assert_close
from torch import nn

ALGOS = ["direct", "smm", "gemm", "winograd", "fft", "default"]

BASE = dict(
    in_c=4,
    out_c=6,
    kernel=3,
    stride=1,
    padding=1,
    dilation=1,
    groups=1,
    bias=True,
    mode="zeros",
    layout="contiguous",
)

AXES = {
    "channels": [(1, 1), (3, 5), (4, 6), (8, 2)],
    "kernel": [1, 3, 5, (2, 3)],
    "stride": [1, 2, (1, 2)],
    "padding": [0, 1, (1, 2), "same", "valid"],
    "dilation": [1, 2],
    "groups": [1, 2, "depthwise"],
    "bias": [True, False],
    "mode": ["zeros", "reflect", "replicate", "circular"],
    "layout": ["contiguous", "transposed", "sliced", "channels_last", "unbatched"],
}

H, W = 9, 11  # non-square, so a height/width mix-up cannot pass


def _kernel_pair(k):
    return (k, k) if isinstance(k, int) else tuple(k)


def _valid(cfg: dict, algo: str) -> bool:
    groups = cfg["in_c"] if cfg["groups"] == "depthwise" else cfg["groups"]
    if cfg["in_c"] % groups or cfg["out_c"] % groups:
        return False
    if cfg["padding"] == "same" and cfg["stride"] != 1:
        return False
    if algo == "winograd":
        if _kernel_pair(cfg["kernel"]) != (3, 3) or cfg["stride"] != 1 or cfg["dilation"] != 1:
            return False
    kh, kw = _kernel_pair(cfg["kernel"])
    if cfg["dilation"] * (kh - 1) + 1 > H or cfg["dilation"] * (kw - 1) + 1 > W:
        return False
    return True


def _cases() -> list:
    rng = random.Random(1234)
    cases = []
    for algo in ALGOS:
        seen = set()
        configs = []
        for axis, values in AXES.items():
            for v in values:
                cfg = dict(BASE)
                if axis == "channels":
                    cfg["in_c"], cfg["out_c"] = v
                else:
                    cfg[axis] = v
                if _valid(cfg, algo):
                    configs.append(cfg)
        random_combos = 0
        while random_combos < 8:
            cfg = dict(BASE)
            for axis, values in AXES.items():
                v = rng.choice(values)
                if axis == "channels":
                    cfg["in_c"], cfg["out_c"] = v
                else:
                    cfg[axis] = v
            if _valid(cfg, algo):
                configs.append(cfg)
                random_combos += 1
        for cfg in configs:
            key = tuple(sorted((k, str(v)) for k, v in cfg.items()))
            if key in seen:
                continue
            seen.add(key)
            cid = "-".join(f"{k}={v}" for k, v in cfg.items() if BASE.get(k) != v) or "base"
            cases.append(pytest.param(algo, cfg, id=f"{algo}-{cid}".replace(" ", "")))
    return cases


CASES = _cases()


def make_conv(cfg: dict, dtype: torch.dtype) -> nn.Conv2d:
    groups = cfg["in_c"] if cfg["groups"] == "depthwise" else cfg["groups"]
    out_c = 2 * cfg["in_c"] if cfg["groups"] == "depthwise" else cfg["out_c"]
    conv = nn.Conv2d(
        cfg["in_c"],
        out_c,
        cfg["kernel"],
        stride=cfg["stride"],
        padding=cfg["padding"],
        dilation=cfg["dilation"],
        groups=groups,
        bias=cfg["bias"],
        padding_mode=cfg["mode"],
    )
    return conv.to(dtype)


def make_input(cfg: dict, dtype: torch.dtype, n: int = 2) -> torch.Tensor:
    c, layout = cfg["in_c"], cfg["layout"]
    if layout == "contiguous":
        x = torch.randn(n, c, H, W, dtype=dtype)
    elif layout == "transposed":
        x = torch.randn(n, c, W, H, dtype=dtype).transpose(2, 3)
        assert not x.is_contiguous()
    elif layout == "sliced":
        x = torch.randn(n, c + 1, 2 * H, W + 3, dtype=dtype)[:, 1:, ::2, 2:-1]
        assert not x.is_contiguous()
    elif layout == "channels_last":
        x = torch.randn(n, c, H, W, dtype=dtype).contiguous(memory_format=torch.channels_last)
        assert not x.is_contiguous() or c == 1
    elif layout == "unbatched":
        x = torch.randn(c, H, W, dtype=dtype)
    else:  # pragma: no cover
        raise AssertionError(layout)
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("algo", "cfg"), CASES)
def test_conv2d_convert(algo, cfg, dtype):
    conv = make_conv(cfg, dtype)
    x = make_input(cfg, dtype)
    x_before = x.clone()
    with torch.no_grad():
        expected = conv(x)
    model = ai3.convert(nn.Sequential(conv), {"conv2d": algo})
    out = model(x)
    assert_close(out, expected, dtype)
    assert torch.equal(x, x_before), "convert's model modified its input"
    if algo != "default":
        shape = [1, *x.shape] if x.dim() == 3 else list(x.shape)
        assert [r["algorithm"] for r in model.summary(shape)] == [algo]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("algo", "cfg"), CASES)
def test_conv2d_swap(algo, cfg, dtype):
    conv = make_conv(cfg, dtype)
    x = make_input(cfg, dtype)
    with torch.no_grad():
        expected = copy.deepcopy(conv)(x)
    net = ai3.swap_conv2d(nn.Sequential(conv), algo)
    assert isinstance(net[0], swap.Conv2d)
    assert net[0].algorithm == algo
    assert net[0].weight is conv.weight, "the swapped module must share the Parameter"
    out = net(x)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("path", ["convert", "swap"])
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(kernel_size=3, stride=2), "stride"),
        (dict(kernel_size=3, dilation=2), "dilation"),
        (dict(kernel_size=5), "3x3"),
        (dict(kernel_size=1), "3x3"),
    ],
    ids=["stride2", "dilation2", "kernel5", "kernel1"],
)
def test_winograd_rejects_unsupported_config(kwargs, needle, path):
    net = nn.Sequential(nn.Conv2d(3, 4, **kwargs))
    with pytest.raises(ai3.AlgorithmError) as info:
        if path == "convert":
            ai3.convert(net, {"conv2d": "winograd"})(torch.randn(1, 3, 12, 12))
        else:
            ai3.swap_conv2d(net, "winograd")(torch.randn(1, 3, 12, 12))
    assert needle in str(info.value), str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("algo", ALGOS)
def test_conv2d_larger_problem(algo):
    """A layer big enough to exercise blocking / tiling paths of the kernels."""
    conv = nn.Conv2d(24, 40, 3, padding=1)
    x = torch.randn(3, 24, 30, 29)
    with torch.no_grad():
        expected = conv(x)
    assert_close(ai3.convert(nn.Sequential(conv), {"conv2d": algo})(x), expected)


@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "winograd", "fft"])
def test_conv2d_algorithms_agree_with_each_other(algo):
    """Every algorithm gives the same output as 'direct' (and as torch) in f64."""
    conv = nn.Conv2d(5, 7, 3, padding=1).double()
    x = torch.randn(2, 5, 13, 10, dtype=torch.float64)
    direct = ai3.convert(nn.Sequential(conv), {"conv2d": "direct"})(x)
    other = ai3.convert(nn.Sequential(conv), {"conv2d": algo})(x)
    assert_close(other, direct, torch.float64)
    with torch.no_grad():
        assert_close(other, conv(x), torch.float64)


EXTRA_CONFIGS = [
    dict(kernel_size=1, stride=3),
    dict(kernel_size=3, padding=3),
    dict(kernel_size=3, stride=5, padding=2),
    dict(kernel_size=2, padding="same", dilation=2, padding_mode="reflect"),
    dict(kernel_size=(1, 5), padding=(0, 2), padding_mode="circular"),
    dict(kernel_size=(5, 1), padding="same", padding_mode="replicate"),
    dict(kernel_size=4, padding="same", padding_mode="circular"),
]


@pytest.mark.parametrize("path", ["convert", "swap"])
@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "fft"])
@pytest.mark.parametrize("kwargs", EXTRA_CONFIGS, ids=lambda k: str(k).replace(" ", ""))
def test_conv2d_edge_configs(kwargs, algo, path):
    conv = nn.Conv2d(3, 4, **kwargs).double()
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = conv(x)
    if path == "convert":
        out = ai3.convert(nn.Sequential(conv), {"conv2d": algo})(x)
    else:
        out = ai3.swap_conv2d(nn.Sequential(copy.deepcopy(conv)), algo)(x)
    assert_close(out, expected, torch.float64)


@pytest.mark.parametrize("path", ["convert", "swap"])
@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "winograd", "fft"])
def test_conv2d_channels_last_weights(algo, path):
    """``net.to(memory_format=torch.channels_last)`` makes the weights non-contiguous."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3))
    net = net.to(memory_format=torch.channels_last)
    assert not net[0].weight.is_contiguous()
    x = torch.randn(2, 3, 9, 9).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = net(x)
    if path == "convert":
        out = ai3.convert(net, {"conv2d": algo})(x)
    else:
        out = ai3.swap_conv2d(copy.deepcopy(net), algo)(x)
    assert_close(out, expected)


@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "winograd", "fft"])
def test_conv2d_tiny_image(algo):
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(1, 3, 1, 1)
    with torch.no_grad():
        expected = conv(x)
    assert_close(ai3.convert(nn.Sequential(conv), {"conv2d": algo})(x), expected)


DEPTHWISE = [
    # (channels, multiplier, kernel, stride, padding, dilation, (h, w))
    (8, 1, 3, 1, 1, 1, (7, 7)),
    (8, 1, 3, 2, 1, 1, (14, 13)),
    (4, 2, 3, 2, 1, 1, (9, 11)),
    (6, 1, 5, 2, 2, 1, (15, 16)),
    (6, 1, 5, 1, 2, 1, (1, 40)),
    (4, 1, 3, 3, (0, 2), 1, (10, 9)),
    (4, 3, 3, 1, 2, 2, (9, 11)),
    (5, 1, (3, 5), (2, 1), (1, 2), 1, (12, 7)),
    (3, 1, 3, (1, 4), 1, 1, (8, 21)),
    (3, 1, 3, (1, 5), 1, 1, (8, 21)),  # column stride past the depthwise path's limit
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("path", ["convert", "swap"])
@pytest.mark.parametrize("algo", ["direct", "default"])
@pytest.mark.parametrize("case", DEPTHWISE, ids=lambda c: str(c).replace(" ", ""))
def test_depthwise_grid(case, algo, path, dtype):
    """Depthwise layers (MobileNet's and EfficientNet's): strides, dilations,
    multipliers, asymmetric kernels and padding, with a fused activation on
    the convert path, against PyTorch."""
    c, mult, k, stride, padding, dilation, (h, w) = case
    conv = nn.Conv2d(c, c * mult, k, stride, padding, dilation, groups=c).to(dtype)
    net = nn.Sequential(conv, nn.ReLU6()).eval()
    x = torch.randn(2, c, h, w, dtype=dtype)
    with torch.no_grad():
        expected = net(x)
    if path == "convert":
        model = ai3.convert(net, {"conv2d": algo})
        assert model.summary([2, c, h, w])[0]["fused"] == "relu6"
    else:
        model = ai3.swap_conv2d(copy.deepcopy(net), algo)
    assert_close(model(x), expected, dtype)


POINTWISE = [
    # (in_channels, out_channels, stride, padding, groups, (h, w), batch)
    (3, 5, 1, 0, 1, (1, 1), 1),
    (17, 13, 1, 0, 1, (7, 7), 2),
    (300, 40, 1, 0, 1, (5, 9), 1),  # several reduction blocks
    (24, 36, 1, 0, 1, (17, 19), 3),  # several pixel blocks, row tails
    (64, 200, 1, 0, 1, (3, 3), 1),  # several channel blocks
    (12, 18, 2, 0, 1, (9, 11), 2),
    (16, 8, (1, 3), 0, 2, (8, 8), 2),
    (8, 12, 1, 0, 4, (6, 5), 1),
    (6, 10, 2, (1, 2), 1, (7, 6), 1),  # padding: zero columns
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("path", ["convert", "swap"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("algo", ["gemm", "default"])
@pytest.mark.parametrize("case", POINTWISE, ids=lambda c: str(c).replace(" ", ""))
def test_pointwise_grid(case, algo, bias, path, dtype):
    """1x1 layers (the GEMM algorithm's tiled path in f32): tile row and
    column tails, several reduction, pixel and channel blocks, strides,
    padding, groups, with and without bias, with a fused activation on the
    convert path, against PyTorch."""
    ic, oc, stride, padding, groups, (h, w), n = case
    conv = nn.Conv2d(ic, oc, 1, stride, padding, groups=groups, bias=bias).to(dtype)
    net = nn.Sequential(conv, nn.ReLU6()).eval()
    x = torch.randn(n, ic, h, w, dtype=dtype)
    with torch.no_grad():
        expected = net(x)
    if path == "convert":
        model = ai3.convert(net, {"conv2d": algo})
        assert model.summary([n, ic, h, w])[0]["fused"] == "relu6"
    else:
        model = ai3.swap_conv2d(copy.deepcopy(net), algo)
    assert_close(model(x), expected, dtype)
