"""Memory the system refuses and sizes that overflow.

A refused allocation is ``ai3.OutOfMemoryError`` (an ``ai3.Error`` and a
``MemoryError``) naming the operation, the shapes and the bytes asked for; a
size that overflows 64 bits is ``ai3.ShapeError``. The process keeps running.

Every allocation asked for here is terabytes, far beyond any machine's memory
and swap, which Linux refuses at once; nothing large is ever touched. Cases that
once aborted the process run in a child process, so a regression fails its test
instead of killing the test run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap

import ai3
import pytest
import torch
from conftest import assert_close
from torch import nn

CONV_ALGOS = ["direct", "smm", "gemm", "winograd", "fft", "default"]


def run_isolated(code: str, *args) -> dict:
    """Runs ``code`` in a fresh Python with this ai3 on its path (``ARGS`` holds
    ``args``); its last line of output must be JSON. A process that dies
    (an abort on a failed allocation) fails the calling test with its stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    prelude = f"import json, sys\nARGS = json.loads({json.dumps(json.dumps(args))})\n"
    ran = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert ran.returncode == 0, (
        f"the process died (exit code {ran.returncode}):\n{ran.stderr[-4000:]}"
    )
    return json.loads(ran.stdout.strip().splitlines()[-1])


#: Child code: runs ``attempt(path)`` for each path, describes what it raised,
#: then checks that ai3 still computes, and prints all of it as JSON.
DESCRIBE = """
import ai3, torch
from torch import nn

def describe(fn):
    try:
        fn()
    except Exception as e:
        return {
            "type": type(e).__name__,
            "oom": isinstance(e, ai3.OutOfMemoryError),
            "shape": isinstance(e, ai3.ShapeError),
            "ai3": isinstance(e, ai3.Error),
            "memory": isinstance(e, MemoryError),
            "msg": str(e),
        }
    return None

def alive():
    layer = nn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        return bool(torch.allclose(ai3.convert(layer)(x), layer(x), atol=1e-4))
"""


@functools.cache
def _conv_children(layer: str) -> dict:
    """``conv_in_child`` for every algorithm of ``CONV_ALGOS``, in one child
    process (each child costs seconds to import torch)."""
    return run_isolated(
        DESCRIBE
        + f"""
layer = {layer}
x = torch.randn(1, 3, 8, 8)
got = {{}}
for algo in ARGS[0]:
    got[algo] = {{
        "convert": describe(lambda: ai3.convert(layer, {{"conv2d": algo}})(x)),
        "swap": describe(lambda: ai3.swap_conv2d(nn.Sequential(layer), algo)(x)),
    }}
print(json.dumps({{"algos": got, "alive": alive()}}))
""",
        CONV_ALGOS,
    )


def conv_in_child(layer: str, algo: str) -> dict:
    """``convert`` and ``swap_conv2d`` of ``layer`` (its source) with ``algo`` on a
    1x3x8x8 input, in a child process: what each raised or returned, and whether
    the child could still compute afterwards. One child runs every algorithm of
    a layer, so an abort fails every algorithm's test of that layer."""
    got = _conv_children(layer)
    return {**got["algos"][algo], "alive": got["alive"]}


def check_oom(got: dict | None, *parts: str) -> None:
    """``got`` (from DESCRIBE) is an OutOfMemoryError whose message has every part."""
    assert got is not None, "no exception"
    assert got["oom"] and got["ai3"] and got["memory"], got
    for part in parts:
        assert part in got["msg"], f"{part!r} not in {got['msg']!r}"


def conv_out(size: int, k: int, padding: int, stride: int = 1, dilation: int = 1) -> int:
    return (size + 2 * padding - dilation * (k - 1) - 1) // stride + 1


@pytest.mark.parametrize("algo", CONV_ALGOS)
def test_conv2d_with_padding_of_a_million_raises_out_of_memory(algo):
    """``nn.Conv2d(3, 4, 3, padding=10**6)`` on 1x3x8x8 asks for a 64 TB output.
    It used to abort the process ("memory allocation of ... bytes failed")."""
    layer = nn.Conv2d(3, 4, 3, padding=10**6)
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(RuntimeError):  # PyTorch refuses it too, at once
        layer(x)
    got = conv_in_child("nn.Conv2d(3, 4, 3, padding=10**6)", algo)
    side = conv_out(8, 3, 10**6)
    nbytes = 1 * 4 * side * side * 4
    for path in ("convert", "swap"):
        check_oom(
            got[path],
            "conv2d",
            f"({nbytes} bytes)",
            "64.0 TB",
            f"[1, 4, {side}, {side}]",
            "[1, 3, 8, 8]",
        )
    assert got["alive"]


@pytest.mark.parametrize("algo", ["direct", "smm", "fft", "gemm", "default"])
def test_conv2d_whose_scratch_is_too_large(algo):
    """With padding and dilation of 10**6 the output is 8x8, as PyTorch
    computes it, but a padded copy of the input (direct, SMM) or its spectra
    (FFT) would take terabytes: those raise OutOfMemoryError naming the
    buffer; im2col + GEMM reads around the padding and computes it, and
    'default' picks GEMM there."""
    layer = nn.Conv2d(3, 4, 3, padding=10**6, dilation=10**6)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        expected = layer(x)
    assert expected.shape == (1, 4, 8, 8)
    if algo in ("gemm", "default"):
        assert_close(ai3.convert(layer, {"conv2d": algo})(x), expected)
        assert_close(ai3.swap_conv2d(nn.Sequential(layer), algo)(x), expected)
        return
    got = conv_in_child("nn.Conv2d(3, 4, 3, padding=10**6, dilation=10**6)", algo)
    buffer = "FFT input spectra" if algo == "fft" else "padded input copy"
    for path in ("convert", "swap"):
        check_oom(got[path], "conv2d", buffer, "bytes)", "[1, 3, 8, 8]", "[4, 3, 3, 3]")
    assert got["alive"]


@pytest.mark.parametrize("algo", CONV_ALGOS)
def test_conv2d_sizes_that_overflow_are_shape_errors(algo):
    """padding=10**18: the output would have about 1.6e37 elements. PyTorch
    raises ("Storage size calculation overflowed"); so does ai3, with a
    ShapeError naming the shapes, before allocating anything."""
    layer = nn.Conv2d(3, 4, 3, padding=10**18)
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(RuntimeError):
        layer(x)
    got = conv_in_child("nn.Conv2d(3, 4, 3, padding=10**18)", algo)
    for path in ("convert", "swap"):
        err = got[path]
        assert err is not None and err["shape"] and err["ai3"], err
        assert "conv2d" in err["msg"] and "[1, 3, 8, 8]" in err["msg"], err


def test_conv2d_huge_dilation_matches_pytorchs_errors():
    """dilation=10**12 alone: the kernel is larger than the input, for PyTorch
    and ai3 alike. A dilation whose window overflows 64 bits is refused when
    the layer is converted."""
    x = torch.randn(1, 3, 8, 8)
    layer = nn.Conv2d(3, 4, 3, dilation=10**12)
    with pytest.raises(RuntimeError):
        layer(x)
    with pytest.raises(ai3.ShapeError, match="larger than the padded input"):
        ai3.convert(layer)(x)
    with pytest.raises(ai3.InvalidArgumentError, match="dilation"):
        ai3.convert(nn.Conv2d(3, 4, 3, dilation=10**19))


def test_linear_output_too_large():
    """10**6 rows into 10**7 features: a 40 TB output, refused by PyTorch too."""
    layer = nn.Linear(2, 10**7)
    with pytest.raises(RuntimeError):
        layer(torch.randn(10**6, 2))
    got = run_isolated(
        DESCRIBE
        + """
layer = nn.Linear(2, 10**7)
x = torch.randn(10**6, 2)
print(json.dumps({
    "convert": describe(lambda: ai3.convert(layer)(x)),
    "swap": describe(lambda: ai3.swap_linear(nn.Sequential(layer))(x)),
    "alive": alive(),
}))
"""
    )
    for path in ("convert", "swap"):
        check_oom(
            got[path],
            "linear",
            "40.0 TB (40000000000000 bytes)",
            "[1000000, 10000000]",
            "[1000000, 2]",
        )
    assert got["alive"]


def test_broadcast_too_large_or_overflowing():
    """[2^21, 1, 1] + [1, 2^21, 1] is 16 TB of float32: OutOfMemoryError (PyTorch
    raises too). Adding [1, 1, 2^21] makes 2^65 bytes: a ShapeError before
    anything is allocated."""
    n = 1 << 21
    with pytest.raises(RuntimeError):
        torch.randn(n, 1, 1) + torch.randn(1, n, 1)
    got = run_isolated(
        DESCRIBE
        + """
class Add(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)

class Add3(nn.Module):
    def forward(self, x, y, z):
        return x + y + z

n = ARGS[0]
x, y, z = torch.randn(n, 1, 1), torch.randn(1, n, 1), torch.randn(1, 1, n)
print(json.dumps({
    "two": describe(lambda: ai3.convert(Add())(x, y)),
    "three": describe(lambda: ai3.convert(Add3())(x, y, z)),
    "alive": alive(),
}))
""",
        n,
    )
    check_oom(got["two"], "add", "17.6 TB (17592186044416 bytes)", f"[{n}, {n}, 1]")
    three = got["three"]
    assert three is not None and three["shape"] and three["ai3"], three
    assert f"[{n}, {n}, {n}]" in three["msg"], three
    assert got["alive"]


def test_pooling_output_too_large_or_overflowing():
    """An adaptive pooling output of 10^6 x 10^6 (4 TB; PyTorch refuses it too),
    and one of 10^10 x 10^10, whose size overflows."""
    x = torch.randn(1, 1, 4, 4)
    for size in (10**6, 10**10):
        with pytest.raises(RuntimeError):
            nn.AdaptiveAvgPool2d((size, size))(x)
    got = run_isolated(
        DESCRIBE
        + """
x = torch.randn(1, 1, 4, 4)
pool = lambda size: nn.AdaptiveAvgPool2d((size, size))
print(json.dumps({
    "big": describe(lambda: ai3.convert(pool(10**6))(x)),
    "swap": describe(lambda: ai3.swap_operation(nn.AdaptiveAvgPool2d, nn.Sequential(pool(10**6)))(x)),
    "overflow": describe(lambda: ai3.convert(pool(10**10))(x)),
    "alive": alive(),
}))
"""
    )
    for case in ("big", "swap"):
        check_oom(got[case], "adaptiveavgpool2d", "4.0 TB (4000000000000 bytes)", "[1, 1, 4, 4]")
    overflow = got["overflow"]
    assert overflow is not None and overflow["shape"] and overflow["ai3"], overflow
    assert got["alive"]


def test_pooling_window_that_overflows_is_refused():
    """A dilation whose window (dilation * (kernel - 1) + 1) overflows 64 bits."""
    pool = nn.MaxPool2d(5, dilation=5 * 10**18)
    with pytest.raises(RuntimeError):
        pool(torch.randn(1, 1, 4, 4))
    with pytest.raises(ai3.InvalidArgumentError, match="dilation"):
        ai3.convert(pool)
