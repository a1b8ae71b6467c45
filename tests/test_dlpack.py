"""DLPack: tensors cross between PyTorch and Rust without copies, both ways,
and model outputs are fresh tensors that never alias each other."""

from __future__ import annotations

import gc
import threading

import ai3
import pytest
import torch
from ai3 import _core
from conftest import DTYPE_IDS, DTYPES, assert_close
from torch import nn


def _views(dtype):
    base = torch.randn(4, 6, 5, dtype=dtype)
    return {
        "contiguous": base,
        "transposed": base.transpose(0, 2),
        "sliced": base[1:, 2:5, ::2],
        "offset_row": base[2],
        "channels_last": torch.randn(2, 3, 4, 5, dtype=dtype).contiguous(
            memory_format=torch.channels_last
        ),
        "scalar": torch.tensor(3.5, dtype=dtype),
        "expanded": torch.randn(3, 1, dtype=dtype).expand(3, 4),
    }


VIEW_NAMES = list(_views(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("view", VIEW_NAMES)
def test_dlpack_zero_copy_both_ways(view, dtype):
    x = _views(dtype)[view]
    seen, capsule, copy_ptr = _core.dlpack_roundtrip(x)
    assert seen == x.data_ptr(), "Rust must borrow the torch tensor, not copy it"
    y = torch.from_dlpack(capsule)
    assert y.data_ptr() == copy_ptr, "torch must borrow Rust's tensor, not copy it"
    assert y.data_ptr() != x.data_ptr()
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(y, x)


def test_dlpack_exported_tensor_outlives_everything():
    x = torch.randn(3, 5)
    expected = x.clone()
    _, capsule, ptr = _core.dlpack_roundtrip(x)
    y = torch.from_dlpack(capsule)
    del capsule, x
    gc.collect()
    for _ in range(3):  # allocate and free, so freed memory would be reused
        torch.randn(3, 5) + 1
    assert y.data_ptr() == ptr
    assert torch.equal(y, expected)
    y.add_(1.0)  # writable, owned by the consumer now
    assert torch.equal(y, expected + 1.0)


@pytest.mark.parametrize("view", ["contiguous", "transposed", "sliced"])
def test_dlpack_capsule_is_borrowed_once(view):
    # The Python side hands torch tensors over as capsules (quicker than
    # __dlpack__); a capsule is consumed by the import and cannot be used twice.
    x = _views(torch.float32)[view]
    capsule = torch.utils.dlpack.to_dlpack(x)
    seen, out, _ = _core.dlpack_roundtrip(capsule)
    assert seen == x.data_ptr()
    assert torch.equal(torch.from_dlpack(out), x)
    with pytest.raises(TypeError, match="got a capsule that is not an unused 'dltensor'"):
        _core.dlpack_roundtrip(capsule)


def test_dlpack_rejects_unsupported_dtype():
    with pytest.raises(ai3.DtypeError):
        _core.dlpack_roundtrip(torch.zeros(3, dtype=torch.int64))


def _model(dtype=torch.float32):
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5))
    return net.to(dtype), ai3.convert(net.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_model_output_is_a_fresh_torch_tensor(dtype):
    net, model = _model(dtype)
    x = torch.randn(2, 3, 4, 4, dtype=dtype)
    a = model(x)
    assert type(a) is torch.Tensor
    assert a.dtype == dtype and a.device.type == "cpu"
    assert not a.requires_grad
    a_values = a.clone()
    b = model(torch.randn(2, 3, 4, 4, dtype=dtype))
    c = model(x)
    ptrs = {a.data_ptr(), b.data_ptr(), c.data_ptr(), x.data_ptr()}
    assert len(ptrs) == 4, "outputs must not alias each other or the input"
    assert torch.equal(a, a_values), "a later call overwrote an earlier output"
    assert torch.equal(a, c)
    a.mul_(0.0)  # writing to an output must not affect the model
    with torch.no_grad():
        assert_close(model(x), net(x), dtype)


def test_model_output_does_not_alias_input_for_elementwise_ops():
    model = ai3.convert(nn.Sequential(nn.ReLU()))
    x = torch.randn(3, 4)
    x_before = x.clone()
    y = model(x)
    assert y.data_ptr() != x.data_ptr()
    assert torch.equal(x, x_before)
    assert torch.equal(y, torch.relu(x))


def test_identity_model_returns_input_values():
    model = ai3.convert(nn.Sequential(nn.Dropout(), nn.Identity()).eval())
    x = torch.randn(2, 3)
    assert torch.equal(model(x), x)


def test_predict_out_types():
    np = pytest.importorskip("numpy", reason="numpy output needs numpy installed")
    net, model = _model()
    x = torch.randn(1, 3, 4, 4)
    t = model.predict(x, out_type=torch.Tensor)
    n = model.predict(x, out_type=np.ndarray)
    assert isinstance(t, torch.Tensor) and isinstance(n, np.ndarray)
    assert n.dtype == np.float32 and n.shape == tuple(t.shape)
    assert torch.equal(torch.from_numpy(n), t)
    with pytest.raises(TypeError):
        model.predict(x, out_type=list)


def test_input_requiring_grad_is_accepted():
    net, model = _model()
    x = torch.randn(1, 3, 4, 4, requires_grad=True)
    with torch.no_grad():
        assert_close(model(x), net(x))


def test_concurrent_calls_from_threads():
    """The GIL is released during a forward pass; concurrent calls give the right answers."""
    net, model = _model()
    xs = [torch.randn(2, 3, 4, 4) for _ in range(8)]
    results: list = [None] * len(xs)

    def work(i):
        for _ in range(5):
            results[i] = model(xs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with torch.no_grad():
        for x, r in zip(xs, results, strict=True):
            assert_close(r, net(x))
