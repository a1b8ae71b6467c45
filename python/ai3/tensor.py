"""``ai3.Tensor``: the output of :meth:`ai3.Model.predict`, a thin holder that converts
to a PyTorch tensor or a NumPy array without copying."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.dlpack import to_dlpack

__all__ = ["Tensor"]


def _is_ndarray_type(t: Any) -> bool:
    # Compared by module and name so that numpy is only imported when it is asked for.
    return getattr(t, "__module__", None) == "numpy" and getattr(t, "__name__", "") == "ndarray"


def _borrowed(x: Any) -> Any:
    """What ``_core`` is handed for an input: a DLPack capsule of a torch tensor
    (``to_dlpack`` takes 0.4 us where ``x.__dlpack__()`` takes 3.4), else ``x``
    itself, whose ``__dlpack__`` the extension calls (and whose errors it words)."""
    if type(x) is torch.Tensor:
        try:
            return to_dlpack(x)
        except (RuntimeError, BufferError, TypeError):
            pass
    return x


def _check_out_type(what: str, out_type: Any) -> None:
    """Raises TypeError unless ``out_type`` is one of the output types ai3 converts to."""
    if out_type is Tensor or out_type is torch.Tensor or _is_ndarray_type(out_type):
        return
    got = repr(out_type) if isinstance(out_type, type) else f"a {type(out_type).__name__} object"
    raise TypeError(
        f"{what}: out_type must be torch.Tensor, numpy.ndarray or ai3.Tensor, got {got}"
    )


class Tensor:
    """An output of :meth:`ai3.Model.predict`, held without a copy.

    ai3 hands its outputs to PyTorch through DLPack; this object keeps the
    resulting ``torch.Tensor`` and gives it back on request, so every
    conversion shares the same memory:

    - ``t.torch()`` returns the tensor itself (no copy);
    - ``t.numpy()`` returns a NumPy array over the same memory;
    - ``t.to(torch.Tensor)`` / ``t.to(numpy.ndarray)`` do the same by type;
    - ``torch.from_dlpack(t)`` and ``numpy.asarray(t)`` work as well.

    ``model.predict(x)`` returns this type, as in the reference ai3, while
    ``model(x)`` returns a ``torch.Tensor`` like a PyTorch module.

    Example::

        y = model.predict(x)           # ai3.Tensor
        probs = y.torch().softmax(1)   # torch.Tensor, same memory
        array = y.numpy()              # numpy.ndarray, same memory
    """

    __slots__ = ("_data",)

    def __init__(self, data: torch.Tensor):
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"ai3.Tensor: expected a torch.Tensor, got {type(data).__name__}")
        self._data = data

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions, as a tuple of ints."""
        return tuple(self._data.shape)

    @property
    def dtype(self) -> torch.dtype:
        """The element type, as a ``torch.dtype``."""
        return self._data.dtype

    @property
    def device(self) -> torch.device:
        """Where the data lives."""
        return self._data.device

    def torch(self) -> torch.Tensor:
        """The data as a ``torch.Tensor``; the same object on every call, not a copy."""
        return self._data

    def numpy(self) -> Any:
        """The data as a ``numpy.ndarray`` sharing this tensor's memory."""
        return self._data.numpy()

    def to(self, out_type: type) -> Any:
        """The data as ``out_type``: ``torch.Tensor``, ``numpy.ndarray`` or ``ai3.Tensor``
        (this object). None of them copies. Any other type is a ``TypeError``."""
        _check_out_type("ai3.Tensor.to", out_type)
        if out_type is torch.Tensor:
            return self._data
        if out_type is Tensor:
            return self
        return self._data.numpy()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._data.__dlpack_device__()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        array = self._data.numpy()
        if dtype is not None and array.dtype != dtype:
            if copy is False:
                raise ValueError(f"ai3.Tensor: converting {array.dtype} to {dtype} needs a copy")
            return array.astype(dtype)
        return array.copy() if copy else array

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"ai3.Tensor(shape={list(self.shape)}, dtype={dtype})"
