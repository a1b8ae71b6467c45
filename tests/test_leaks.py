"""No leaks: thousands of calls with changing shapes, and failing calls,
leave the process's resident memory flat."""

from __future__ import annotations

import copy
import sys

import ai3
import pytest
import torch
from conftest import assert_close
from torch import nn

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads resident memory from /proc"
)

#: 32 input shapes, more than a model keeps plans for, so plans and arenas
#: are made and dropped over and over.
SHAPES = [(b, 4, h, w) for b in (1, 2) for h in (9, 12, 15, 16) for w in (10, 13, 14, 17)]
CALLS = 10_000
#: Resident growth allowed over CALLS calls: one leaked output of the smallest
#: shape per call would be 10000 * 1.8 KB = 18 MB; allocator noise is far less.
SLACK = 8 * 2**20


def resident() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def growth(call) -> int:
    """Resident growth over CALLS calls of ``call(i)``, after a warm-up."""
    for i in range(2 * len(SHAPES)):
        call(i)
    start = resident()
    for i in range(CALLS):
        call(i)
    return resident() - start


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)
    ).eval()


def test_converted_model_does_not_leak():
    net = _net()
    model = ai3.convert(net)
    inputs = [torch.randn(s) for s in SHAPES]
    bad = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        for x in inputs[:3]:
            assert_close(model(x), net(x))

    def call(i: int) -> None:
        model(inputs[i % len(inputs)])
        if i % 10 == 0:  # the error path too
            with pytest.raises(ai3.ShapeError):
                model(bad)

    assert growth(call) < SLACK


def test_swapped_layer_does_not_leak():
    net = _net()
    swapped = ai3.swap_conv2d(copy.deepcopy(net))
    inputs = [torch.randn(s) for s in SHAPES]
    with torch.no_grad():
        for x in inputs[:3]:
            assert_close(swapped(x), net(x))

    def call(i: int) -> None:
        with torch.no_grad():
            swapped(inputs[i % len(inputs)])

    assert growth(call) < SLACK


def test_swapped_layer_with_autograd_does_not_leak():
    conv = ai3.swap_conv2d(nn.Conv2d(4, 8, 3, padding=1))
    inputs = [torch.randn(s, requires_grad=True) for s in SHAPES]

    def call(i: int) -> None:
        conv(inputs[i % len(inputs)]).sum().backward()

    assert growth(call) < SLACK
