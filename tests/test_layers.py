"""The non-conv layers (linear, relu, pooling, adaptive pooling, flatten), as
modules through ``convert`` and ``swap_operation`` and as functions through
``convert``, in f32 and f64."""

from __future__ import annotations

import ai3
import pytest
import torch
import torch.nn.functional as F
from ai3 import swap
from conftest import DTYPE_IDS, DTYPES, assert_close, reference
from torch import nn

PATHS = ["convert", "swap"]


def check_layer(
    op: str, layer: nn.Module, x: torch.Tensor, algo: str, path: str, dtype: torch.dtype
) -> None:
    """Runs ``layer`` wrapped in a Sequential through ai3 and compares with PyTorch."""
    net = nn.Sequential(layer).to(dtype)
    x = x.to(dtype)
    expected = reference(net, x)
    if path == "convert":
        # Parameterless layers have no dtype of their own: say which one to compute in.
        model = ai3.convert(net, {op: algo}, dtype=dtype)
        assert model.dtype == dtype
        out = model(x)
    else:
        swapped = ai3.swap_operation(op, net, algo)
        assert isinstance(swapped[0], swap._WRAPPERS[op]), type(swapped[0])
        assert swapped[0].algorithm == algo
        out = swapped(x)
    assert_close(out, expected, dtype)


# ---- linear -------------------------------------------------------------------------------

LINEAR_SHAPES = [(7,), (3, 7), (2, 3, 7), (2, 1, 3, 7)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["gemm", "default"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("shape", LINEAR_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_linear(shape, bias, algo, dtype, path):
    check_layer("linear", nn.Linear(7, 5, bias=bias), torch.randn(shape), algo, path, dtype)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    ("fin", "fout", "batch"),
    [
        (1, 1, 1),
        (130, 67, 9),
        (300, 257, 4),
        (1030, 40, 1),
        (513, 20, 2),
        (3, 40, 1),
        (5, 17, 2),
        (50, 33, 130),
    ],
)
def test_linear_sizes(fin, fout, batch, dtype, path):
    """Sizes that are not multiples of any plausible block size; one and two
    rows (a batch through a classifier, its reduction read in four stretches:
    long ones with a remainder, and ones shorter than four) and more rows
    than one task's block."""
    check_layer("linear", nn.Linear(fin, fout), torch.randn(batch, fin), "gemm", path, dtype)


@pytest.mark.parametrize("path", PATHS)
def test_linear_noncontiguous_input(path):
    x = torch.randn(7, 4).t()  # (4, 7), transposed view
    assert not x.is_contiguous()
    check_layer("linear", nn.Linear(7, 3), x, "gemm", path, torch.float32)


# ---- relu ---------------------------------------------------------------------------------

RELU_SHAPES = [(5,), (3, 4), (2, 3, 4, 5), (2, 3, 5, 4, 2)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["direct", "default"])
@pytest.mark.parametrize("shape", RELU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_relu(shape, algo, dtype, path):
    x = torch.randn(shape)
    x.view(-1)[::3] = 0.0  # exact zeros too
    check_layer("relu", nn.ReLU(), x, algo, path, dtype)


@pytest.mark.parametrize("path", PATHS)
def test_relu_noncontiguous_input(path):
    x = torch.randn(2, 3, 6, 5).transpose(1, 3)
    check_layer("relu", nn.ReLU(), x, "direct", path, torch.float32)


@pytest.mark.parametrize("path", PATHS)
def test_relu_inplace_module(path):
    """nn.ReLU(inplace=True) gives the same values (ai3 may or may not write in place)."""
    check_layer(
        "relu", nn.ReLU(inplace=True), torch.randn(2, 3, 4, 4), "direct", path, torch.float32
    )


# ---- maxpool2d ----------------------------------------------------------------------------

MAXPOOL_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=3),
    dict(kernel_size=(2, 3)),
    dict(kernel_size=2, stride=None),
    dict(kernel_size=3, stride=1),
    dict(kernel_size=3, stride=2),
    dict(kernel_size=3, stride=(2, 1)),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 5), stride=2, padding=(1, 2)),
    dict(kernel_size=2, dilation=2),
    dict(kernel_size=3, stride=2, padding=1, dilation=(2, 1)),
    dict(kernel_size=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=3, padding=1, dilation=2, ceil_mode=True),
]


def _ids(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items()).replace(" ", "")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["direct", "default"])
@pytest.mark.parametrize("kwargs", MAXPOOL_CASES, ids=_ids)
def test_maxpool2d(kwargs, algo, dtype, path):
    x = torch.randn(2, 3, 11, 13)
    check_layer("maxpool2d", nn.MaxPool2d(**kwargs), x, algo, path, dtype)


@pytest.mark.parametrize("path", PATHS)
def test_maxpool2d_all_negative_with_padding(path):
    """Padding must never win a max (it is -inf, not 0)."""
    x = -torch.rand(1, 2, 6, 7) - 1.0
    check_layer("maxpool2d", nn.MaxPool2d(3, 2, padding=1), x, "direct", path, torch.float32)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", ["unbatched", "channels_last", "transposed"])
def test_maxpool2d_layouts(layout, path):
    if layout == "unbatched":
        x = torch.randn(3, 10, 9)
    elif layout == "channels_last":
        x = torch.randn(2, 3, 10, 9).contiguous(memory_format=torch.channels_last)
    else:
        x = torch.randn(2, 3, 9, 10).transpose(2, 3)
    check_layer("maxpool2d", nn.MaxPool2d(3, 2, 1), x, "direct", path, torch.float32)


# ---- avgpool2d ----------------------------------------------------------------------------

AVGPOOL_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=3),
    dict(kernel_size=(3, 2)),
    dict(kernel_size=3, stride=1),
    dict(kernel_size=3, stride=(1, 2)),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=(3, 5), stride=2, padding=(1, 2), count_include_pad=False),
    dict(kernel_size=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, divisor_override=3),
    dict(kernel_size=3, stride=2, padding=1, divisor_override=5),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=2),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["direct", "default"])
@pytest.mark.parametrize("kwargs", AVGPOOL_CASES, ids=_ids)
def test_avgpool2d(kwargs, algo, dtype, path):
    x = torch.randn(2, 3, 11, 13)
    check_layer("avgpool2d", nn.AvgPool2d(**kwargs), x, algo, path, dtype)


@pytest.mark.parametrize("path", PATHS)
def test_avgpool2d_unbatched(path):
    check_layer(
        "avgpool2d", nn.AvgPool2d(3, 2, 1), torch.randn(3, 9, 8), "direct", path, torch.float32
    )


# ---- adaptiveavgpool2d --------------------------------------------------------------------

ADAPTIVE_SIZES = [1, 3, (2, 3), (None, 3), (4, None), (None, None), 5, (11, 7), (14, 9)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["direct", "default"])
@pytest.mark.parametrize("size", ADAPTIVE_SIZES, ids=str)
def test_adaptiveavgpool2d(size, algo, dtype, path):
    x = torch.randn(2, 3, 11, 7)  # 11 and 7 are divided by none of the sizes above
    check_layer("adaptiveavgpool2d", nn.AdaptiveAvgPool2d(size), x, algo, path, dtype)


@pytest.mark.parametrize("path", PATHS)
def test_adaptiveavgpool2d_unbatched(path):
    x = torch.randn(3, 10, 9)
    check_layer("adaptiveavgpool2d", nn.AdaptiveAvgPool2d((4, 2)), x, "direct", path, torch.float32)


# ---- flatten ------------------------------------------------------------------------------

FLATTEN_DIMS = [(1, -1), (0, -1), (1, 2), (2, -1), (-3, -2), (0, 0), (-1, -1), (3, 3), (0, 2)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("algo", ["direct", "default"])
@pytest.mark.parametrize(("start", "end"), FLATTEN_DIMS)
def test_flatten(start, end, algo, dtype, path):
    x = torch.randn(2, 3, 4, 5)
    check_layer("flatten", nn.Flatten(start, end), x, algo, path, dtype)


@pytest.mark.parametrize("path", PATHS)
def test_flatten_noncontiguous(path):
    x = torch.randn(2, 5, 4, 3).permute(0, 3, 2, 1)
    check_layer("flatten", nn.Flatten(), x, "direct", path, torch.float32)


# ---- functional forms through convert -----------------------------------------------------


class Functional(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class WithLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6 * 6))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return F.linear(torch.flatten(x, 1), self.w, self.b)


def _fx_functions():
    # Each entry: id, function of x (traced by fx). Lambdas are fine: fx traces through them.
    return [
        ("torch.relu", lambda x: torch.relu(x)),
        ("F.relu", lambda x: F.relu(x)),
        ("F.relu_inplace_kw", lambda x: F.relu(x, inplace=False)),
        ("x.relu", lambda x: x.relu()),
        ("torch.flatten", lambda x: torch.flatten(x)),
        ("torch.flatten_1", lambda x: torch.flatten(x, 1)),
        ("torch.flatten_kw", lambda x: torch.flatten(x, start_dim=2, end_dim=-1)),
        ("x.flatten_1", lambda x: x.flatten(1)),
        ("x.flatten", lambda x: x.flatten()),
        ("F.max_pool2d", lambda x: F.max_pool2d(x, 2)),
        ("F.max_pool2d_full", lambda x: F.max_pool2d(x, 3, 2, 1, 1, True)),
        ("F.max_pool2d_kw", lambda x: F.max_pool2d(x, kernel_size=3, stride=1, dilation=2)),
        ("F.avg_pool2d", lambda x: F.avg_pool2d(x, 2)),
        ("F.avg_pool2d_full", lambda x: F.avg_pool2d(x, 3, 2, 1, True, False)),
        ("F.avg_pool2d_kw", lambda x: F.avg_pool2d(x, kernel_size=3, divisor_override=4)),
        ("F.adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (2, 3))),
        ("F.adaptive_avg_pool2d_int", lambda x: F.adaptive_avg_pool2d(x, 1)),
        ("F.adaptive_avg_pool2d_none", lambda x: F.adaptive_avg_pool2d(x, (None, 4))),
        ("chain", lambda x: torch.flatten(F.max_pool2d(F.relu(x), 2), 1).relu()),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fn", [f for _, f in _fx_functions()], ids=[i for i, _ in _fx_functions()])
def test_functional_forms_convert(fn, dtype):
    net = Functional(fn)
    x = torch.randn(2, 3, 6, 6, dtype=dtype)
    expected = fn(x)
    out = ai3.convert(net, dtype=dtype)(x)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_functional_linear_convert(dtype):
    net = WithLinear().to(dtype)
    x = torch.randn(2, 1, 6, 6, dtype=dtype)
    expected = reference(net, x)
    assert_close(ai3.convert(net)(x), expected, dtype)


def test_functional_convert_uses_model_dtype_by_default():
    """A parameterless net converts as float32, and the computation is really done."""
    net = Functional(lambda x: F.avg_pool2d(x, 2))
    model = ai3.convert(net)
    assert model.dtype == torch.float32
    x = torch.randn(1, 2, 4, 4)
    assert_close(model(x), F.avg_pool2d(x, 2))


# ---- special values -----------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("op", "module"),
    [
        ("relu", nn.ReLU()),
        ("maxpool2d", nn.MaxPool2d(2)),
        ("maxpool2d", nn.MaxPool2d(3, 1, 1)),
        ("avgpool2d", nn.AvgPool2d(2)),
        ("adaptiveavgpool2d", nn.AdaptiveAvgPool2d(3)),
    ],
    ids=["relu", "maxpool2", "maxpool3-pad", "avgpool2", "adaptive3"],
)
@pytest.mark.parametrize("special", ["nan_first", "nan_last", "neg_inf", "pos_inf"])
def test_special_values(op, module, special, path):
    """NaN propagates and infinities are kept, as in PyTorch."""
    x = torch.randn(1, 2, 6, 6)
    if special == "nan_first":
        x[0, 0, 0, 0] = float("nan")
    elif special == "nan_last":
        x[0, 1, 3, 3] = float("nan")
    elif special == "neg_inf":
        x[0, 0] = float("-inf")
    else:
        x[0, 1, 2, 4] = float("inf")
    net = nn.Sequential(module)
    expected = net(x)
    if path == "convert":
        out = ai3.convert(net)(x)
    else:
        out = ai3.swap_operation(op, net, "direct")(x)
    assert torch.equal(out.isnan(), expected.isnan())
    assert torch.equal(out.isinf(), expected.isinf())
    finite = expected.isfinite()
    assert torch.equal(out[~finite].nan_to_num(), expected[~finite].nan_to_num())
    assert_close(out[finite], expected[finite])


@pytest.mark.parametrize("path", PATHS)
def test_linear_noncontiguous_weight(path):
    lin = nn.Linear(6, 4)
    lin.weight = nn.Parameter(torch.randn(6, 4).t())  # e.g. tied to another layer's transpose
    assert not lin.weight.is_contiguous()
    check_layer("linear", lin, torch.randn(3, 6), "gemm", path, torch.float32)
