"""Cases the fuzzer (tests/test_fuzz.py) found where ai3 raised, hung or ran
for hours while PyTorch computed; each is compared with PyTorch at test time."""

from __future__ import annotations

import copy
import time

import ai3
import pytest
import torch
from conftest import assert_close
from torch import nn


def both(module: nn.Module, *inputs: torch.Tensor) -> None:
    """ai3 (converted, and swapped where the op swaps) gives PyTorch's answer."""
    with torch.no_grad():
        expected = module(*inputs)
        got = ai3.convert(module)(*inputs)
    assert got.shape == expected.shape
    if expected.isnan().all():
        assert got.isnan().all()
    else:
        assert_close(got, expected)


@pytest.mark.parametrize("in_f,out_f", [(3, 0), (0, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_with_no_features(in_f, out_f, bias):
    """nn.Linear(3, 0) gives an empty output and nn.Linear(0, 4) the bias."""
    layer = nn.Linear(in_f, out_f, bias=bias)
    if bias:
        nn.init.uniform_(layer.bias)
    both(nn.Sequential(layer, nn.ReLU()), torch.randn(2, in_f))
    with torch.no_grad():
        assert_close(
            ai3.swap_operation("linear", layer)(torch.randn(2, in_f)), layer(torch.randn(2, in_f))
        )


@pytest.mark.parametrize("size", [0, (0, 3), (2, 0)])
@pytest.mark.parametrize("pool", [nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d])
def test_adaptive_pool_to_no_output(pool, size):
    both(pool(size), torch.randn(1, 2, 5, 5))


def test_adaptive_average_of_an_empty_plane_is_nan():
    """PyTorch computes an output size of 1 as a mean, NaN over an empty plane
    (it refuses an empty plane for other sizes, and so does ai3)."""
    both(nn.AdaptiveAvgPool2d(1), torch.randn(1, 3, 0))
    both(nn.AdaptiveAvgPool2d((1, 1)), torch.randn(2, 1, 0, 3))
    for pool in (nn.AdaptiveAvgPool2d((2, 1)), nn.AdaptiveMaxPool2d(1)):
        with pytest.raises(RuntimeError):
            pool(torch.randn(2, 4, 0))
        with pytest.raises(ai3.ShapeError, match="empty spatial plane"):
            ai3.convert(pool)(torch.randn(2, 4, 0))


@pytest.mark.parametrize(
    "pool",
    [
        nn.AvgPool2d(3, padding=(0, 1), ceil_mode=True),
        nn.AvgPool2d(3, padding=1, ceil_mode=True, count_include_pad=False),
        nn.MaxPool2d(3, padding=1, ceil_mode=True),
        nn.MaxPool2d(4, stride=3, padding=2, ceil_mode=True),
    ],
)
def test_ceil_mode_window_larger_than_the_padded_input(pool):
    """PyTorch takes one clipped window; ai3 raised ShapeError."""
    both(pool, torch.randn(1, 2, 1, 1))
    both(pool, torch.randn(2, 1, 2, 1))


def test_cat_skips_legacy_empty_inputs():
    class Net(nn.Module):
        def forward(self, e, x):
            return torch.cat([e, x, e], 0)

    both(Net(), torch.empty(0), torch.randn(2, 3))


def test_empty_batch_with_an_empty_plane():
    both(nn.Conv2d(3, 3, 2, padding=1), torch.randn(0, 3, 0, 7))
    both(nn.Conv2d(3, 3, 1, padding=(0, 1)), torch.randn(0, 3, 4, 0))
    # Other padding modes refuse the empty plane, in PyTorch and ai3.
    conv = nn.Conv2d(6, 6, 2, padding=1, padding_mode="replicate")
    with pytest.raises(RuntimeError):
        conv(torch.randn(0, 6, 0, 1))
    with pytest.raises(ai3.ShapeError, match="empty spatial plane"):
        ai3.convert(conv)(torch.randn(0, 6, 0, 1))


def test_max_pool_with_a_huge_kernel_is_instant():
    """Max pooling visited every tap of the kernel, inside the input or not:
    kernel 10**12 on a 1x1 input would have run for hours (PyTorch refuses a
    kernel that large; 2 * 10**9 it takes, and ai3 took 10 s there)."""
    pool = nn.MaxPool2d(2 * 10**9, padding=10**9)
    x = torch.randn(1, 1, 1, 1)
    start = time.perf_counter()
    got = ai3.convert(pool)(x)
    assert time.perf_counter() - start < 1
    assert_close(got, pool(x))


@pytest.mark.parametrize("stride", [10**3, 10**6])
def test_huge_padding_with_a_huge_stride_computes(stride):
    """PyTorch computes a 3x3 (or 1x1) output; the default algorithm once copied
    the padded input (terabytes) and aborted."""
    both(nn.Conv2d(1, 2, 3, padding=stride, stride=stride), torch.randn(1, 1, 5, 5))


@pytest.mark.parametrize(
    "padding,stride",
    [((1, 100_000), (100, 10**6)), ((50, 3), (60, 1)), (100, 300), ((0, 10**5), (2, 10**5))],
)
def test_fft_with_huge_padding_transforms_only_what_outputs_read(padding, stride):
    """The FFT algorithm transformed the whole padded plane (42 x 200007 in
    the case the fuzzer found: 24 s, past its time limit) for outputs that
    read a few columns of it, or padding alone (the bias)."""
    conv = nn.Conv2d(16, 16, (9, 3), stride, padding, dilation=2, groups=2).double()
    x = torch.randn(2, 16, 40, 7, dtype=torch.float64)
    start = time.perf_counter()
    with torch.no_grad():
        got = ai3.convert(conv, {"conv2d": "fft"})(x)
        assert time.perf_counter() - start < 5
        assert_close(got, conv(x))


@pytest.mark.parametrize("in_f,out_f", [(0, 4), (3, 0)])
def test_swapped_linear_with_no_features_trains(in_f, out_f):
    """The backward of a swapped linear reshaped with -1, ambiguous on 0 elements."""
    layer = nn.Linear(in_f, out_f)
    swapped = ai3.swap_operation("linear", copy.deepcopy(layer))
    x = torch.randn(1, 3, in_f, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    layer(x).sum().backward()
    swapped(x2).sum().backward()
    assert_close(x2.grad, x.grad)
    assert_close(swapped.weight.grad, layer.weight.grad)
    assert_close(swapped.bias.grad, layer.bias.grad)


@pytest.mark.parametrize("batch", [0, 2])
def test_pool_padding_is_bounded_by_the_kernel_not_the_dilated_window(batch):
    """PyTorch wants padding <= kernel_size / 2 whatever the dilation; ai3 measured
    it against the dilated window and computed what PyTorch refuses."""
    pool = nn.MaxPool2d(3, padding=2, dilation=2)
    x = torch.randn(batch, 2, 9, 9)
    with pytest.raises(RuntimeError, match="half of kernel size"):
        pool(x)
    with pytest.raises(ai3.InvalidArgumentError, match="half of kernel_size"):
        ai3.convert(pool)(x)
