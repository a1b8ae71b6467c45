"""Errors: the right ai3 exception (also an instance of the builtin a PyTorch
user expects), raised before anything crashes, with a message that says which
operation and which shapes."""

from __future__ import annotations

import ai3
import pytest
import torch
import torch.nn.functional as F
from torch import nn

PATHS = ["convert", "swap"]


def layer(op: str) -> tuple[nn.Module, tuple[int, ...]]:
    """A layer of ``op`` and a valid input shape for it."""
    return {
        "conv2d": (nn.Conv2d(3, 4, 3), (1, 3, 6, 6)),
        "linear": (nn.Linear(6, 4), (2, 6)),
        "relu": (nn.ReLU(), (1, 3, 6, 6)),
        "maxpool2d": (nn.MaxPool2d(2), (1, 3, 6, 6)),
        "avgpool2d": (nn.AvgPool2d(2), (1, 3, 6, 6)),
        "adaptiveavgpool2d": (nn.AdaptiveAvgPool2d(2), (1, 3, 6, 6)),
        "flatten": (nn.Flatten(), (1, 3, 6, 6)),
    }[op]


OPS = ["conv2d", "linear", "relu", "maxpool2d", "avgpool2d", "adaptiveavgpool2d", "flatten"]


def runner(op: str, path: str, module: nn.Module, dtype=None):
    net = nn.Sequential(module)
    if path == "convert":
        return ai3.convert(net, dtype=dtype)
    return ai3.swap_operation(op, net, "default")


def check_exception(err: BaseException, cls: type, builtin: type) -> None:
    assert isinstance(err, cls), type(err)
    assert isinstance(err, ai3.Error), type(err).__mro__
    assert isinstance(err, builtin), type(err).__mro__


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", [torch.int64, torch.float16, torch.int32], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_unsupported_input_dtype(op, bad, path):
    module, shape = layer(op)
    f = runner(op, path, module)
    x = torch.ones(shape).to(bad)
    with pytest.raises(ai3.DtypeError) as info:
        f(x)
    check_exception(info.value, ai3.DtypeError, TypeError)
    msg = str(info.value)
    assert str(bad).replace("torch.", "") in msg, msg


@pytest.mark.parametrize("path", PATHS)
def test_unsupported_input_dtype_message_names_operation(path):
    """Errors carry the operation name (ARCHITECTURE.md), so a user can tell which layer failed."""
    missing = []
    for op in OPS:
        module, shape = layer(op)
        with pytest.raises(ai3.DtypeError) as info:
            runner(op, path, module)(torch.ones(shape, dtype=torch.int64))
        if op not in str(info.value):
            missing.append(f"{op}: {info.value}")
    assert not missing, "messages that do not name their operation:\n" + "\n".join(missing)


@pytest.mark.parametrize("op", OPS)
def test_model_dtype_mismatch(op):
    module, shape = layer(op)
    model = runner(op, "convert", module, dtype=torch.float32)
    with pytest.raises(ai3.DtypeError) as info:
        model(torch.ones(shape, dtype=torch.float64))
    check_exception(info.value, ai3.DtypeError, TypeError)
    msg = str(info.value)
    assert "float64" in msg and "float32" in msg, msg


@pytest.mark.parametrize("op", ["conv2d", "linear"])
def test_swapped_dtype_mismatch(op):
    module, shape = layer(op)
    f = runner(op, "swap", module)
    with pytest.raises(ai3.DtypeError) as info:
        f(torch.ones(shape, dtype=torch.float64))
    msg = str(info.value)
    assert op in msg and "float64" in msg and "float32" in msg, msg


def test_convert_unsupported_model_dtype():
    with pytest.raises(ai3.DtypeError):
        ai3.convert(nn.Sequential(nn.Conv2d(1, 1, 1)), dtype=torch.float16)
    with pytest.raises(ai3.DtypeError):
        ai3.convert(nn.Sequential(nn.Conv2d(1, 1, 1)).half())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(6, 6), (1, 1, 3, 6, 6), (6,)], ids=str)
@pytest.mark.parametrize("op", ["conv2d", "maxpool2d", "avgpool2d", "adaptiveavgpool2d"])
def test_wrong_rank(op, shape, path):
    module, _ = layer(op)
    f = runner(op, path, module)
    with pytest.raises(ai3.ShapeError) as info:
        f(torch.ones(shape))
    check_exception(info.value, ai3.ShapeError, ValueError)
    assert op in str(info.value)
    assert str(list(shape)) in str(info.value), str(info.value)


@pytest.mark.parametrize("path", PATHS)
def test_linear_feature_mismatch(path):
    f = runner("linear", path, nn.Linear(6, 4))
    with pytest.raises(ai3.ShapeError) as info:
        f(torch.ones(2, 5))
    msg = str(info.value)
    assert "[2, 5]" in msg and "[4, 6]" in msg, msg


@pytest.mark.parametrize("path", PATHS)
def test_conv_channel_mismatch(path):
    f = runner("conv2d", path, nn.Conv2d(3, 4, 3))
    with pytest.raises(ai3.ShapeError) as info:
        f(torch.ones(1, 2, 6, 6))
    check_exception(info.value, ai3.ShapeError, ValueError)
    msg = str(info.value)
    assert "conv2d" in msg and "[1, 2, 6, 6]" in msg and "[4, 3, 3, 3]" in msg, msg


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", OPS)
def test_empty_batch_gives_an_empty_output(op, path):
    """As in PyTorch: detection heads with no boxes run layers on a batch of 0."""
    module, shape = layer(op)
    x = torch.ones((0, *shape[1:]))
    with torch.no_grad():
        expected = module(x)
    got = runner(op, path, module)(x)
    assert got.shape == expected.shape and got.dtype == expected.dtype


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["conv2d", "maxpool2d", "avgpool2d", "adaptiveavgpool2d"])
def test_empty_plane(op, path):
    """An image with no rows has no windows; PyTorch refuses it too."""
    module, shape = layer(op)
    x = torch.ones((1, shape[1], 0, shape[3]))
    with pytest.raises(RuntimeError):
        module(x)
    with pytest.raises(ai3.ShapeError) as info:
        runner(op, path, module)(x)
    check_exception(info.value, ai3.ShapeError, ValueError)
    assert op in str(info.value) and "[1, 3, 0, 6]" in str(info.value), str(info.value)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("op", "module"),
    [
        ("conv2d", nn.Conv2d(3, 4, 5)),
        ("conv2d", nn.Conv2d(3, 4, 3, dilation=3, padding=1)),
        ("maxpool2d", nn.MaxPool2d(5)),
        ("avgpool2d", nn.AvgPool2d((7, 3), padding=1)),
    ],
    ids=["conv5", "conv3-dil3-pad1", "maxpool5", "avgpool7x3-pad1"],
)
def test_window_larger_than_padded_input(op, module, path):
    f = runner(op, path, module)
    x = torch.ones(1, 3, 4, 4)
    with pytest.raises(RuntimeError):  # PyTorch itself refuses: the reference has no output
        module(x)
    with pytest.raises(ai3.ShapeError) as info:
        f(x)
    check_exception(info.value, ai3.ShapeError, ValueError)
    assert "[1, 3, 4, 4]" in str(info.value), str(info.value)


@pytest.mark.parametrize("path", PATHS)
def test_groups_not_dividing(path):
    conv = nn.Conv2d(4, 6, 3, groups=2)
    conv.groups = 4  # 6 output channels cannot be split in 4 groups
    with pytest.raises((ai3.InvalidArgumentError, ai3.ShapeError)) as info:
        runner("conv2d", path, conv)(torch.ones(1, 4, 6, 6))
    assert isinstance(info.value, ValueError) and isinstance(info.value, ai3.Error)
    assert "groups" in str(info.value)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("attr", [("stride", (0, 1)), ("dilation", (1, 0))], ids=str)
def test_nonpositive_hyperparameters(attr, path):
    conv = nn.Conv2d(3, 4, 3)
    setattr(conv, *attr)
    with pytest.raises(ai3.InvalidArgumentError) as info:
        runner("conv2d", path, conv)(torch.ones(1, 3, 6, 6))
    assert isinstance(info.value, ValueError)
    assert attr[0] in str(info.value)


def test_device_error():
    model = ai3.convert(nn.Sequential(nn.Linear(3, 4)))
    with pytest.raises(ai3.DeviceError) as info:
        model(torch.zeros(2, 3, device="meta"))
    check_exception(info.value, ai3.DeviceError, RuntimeError)


def test_convert_non_module():
    with pytest.raises(TypeError):
        ai3.convert(lambda x: x)
    with pytest.raises(TypeError):
        ai3.swap_conv2d("not a module", "direct")


def test_maxpool_return_indices_is_unsupported():
    with pytest.raises(ai3.UnsupportedOperationError):
        ai3.convert(nn.Sequential(nn.MaxPool2d(2, return_indices=True)))


class ManyUnsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.gn = nn.GroupNorm(2, 4)
        self.up = nn.Upsample(scale_factor=2)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        x = self.gn(self.conv(x))
        x = torch.cumsum(x, 1)
        x = self.up(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def test_unsupported_operations_listed_together():
    with pytest.raises(ai3.UnsupportedOperationError) as info:
        ai3.convert(ManyUnsupported())
    err = info.value
    check_exception(err, ai3.UnsupportedOperationError, NotImplementedError)
    assert len(err.nodes) == 3, err.nodes
    names = [name for name, _ in err.nodes]
    assert names == ["gn", "cumsum", "up"], names
    targets = " ".join(t for _, t in err.nodes)
    assert "GroupNorm" in targets and "Upsample" in targets and "cumsum" in targets, targets
    msg = str(err)
    assert "3 operation" in msg
    for name in names:
        assert name in msg


def test_untraceable_module_is_unsupported():
    class DataDependent(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # fx cannot trace control flow on values
                return torch.relu(x)
            return x

    with pytest.raises(ai3.UnsupportedOperationError) as info:
        ai3.convert(DataDependent())
    assert len(info.value.nodes) == 1


def test_exception_hierarchy():
    pairs = [
        (ai3.ShapeError, ValueError),
        (ai3.DtypeError, TypeError),
        (ai3.InvalidArgumentError, ValueError),
        (ai3.AlgorithmError, ValueError),
        (ai3.SelectorError, ValueError),
        (ai3.DeviceError, RuntimeError),
        (ai3.InternalError, RuntimeError),
        (ai3.OutOfMemoryError, MemoryError),
        (ai3.UnsupportedOperationError, NotImplementedError),
    ]
    for cls, builtin in pairs:
        assert issubclass(cls, ai3.Error) and issubclass(cls, builtin), cls
    err = ai3.UnsupportedOperationError([("a", "x"), ("b", "y")], "more")
    assert err.nodes == [("a", "x"), ("b", "y")]
    assert "2 operation" in str(err) and "more" in str(err)
