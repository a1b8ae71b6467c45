"""``torch.library`` custom operators behind swapped modules.

Each operator runs ai3's kernel in its eager implementation, has a fake
(meta) implementation so ``torch.compile(fullgraph=True)`` can trace it, and
an autograd formula written with ATen's own backward operators so gradients
equal PyTorch's. Inputs reach the operators already batched (4-D) and with
symmetric zero padding: the swapped modules handle the rest in plain torch.
"""

import math
import weakref
from collections.abc import Callable
from typing import Any, List, Optional  # torch.library's schema inference needs these spellings

import torch

from . import _core, threads
from .errors import DtypeError
from .tensor import _borrowed

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}

#: The eager implementation of each ``torch.ops.ai3`` operator, by name.
_EAGER: dict = {}


def _operator(name: str) -> Callable:
    """Registers the decorated function as the custom operator ``ai3::<name>``
    and keeps it for :func:`call`."""

    def register(fn: Callable):
        _EAGER[name] = fn
        return torch.library.custom_op(f"ai3::{name}", mutates_args=())(fn)

    return register


#: Tensor types the eager implementation may see directly (not fake or
#: traced tensors, nor other subclasses with their own dispatch).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _functorch_active() -> bool:
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active()) if active is not None else True


def call(name: str, *args):
    """``torch.ops.ai3.<name>(*args)``.

    Under ``torch.inference_mode()`` there is nothing for the dispatcher to
    record (no autograd, no tracing), so on plain tensors outside
    ``torch.compile`` and functorch transforms the eager implementation runs
    directly: the same computation without the dispatcher's ~13 us per call."""
    # is_compiling first: under torch.compile it is the only check dynamo can trace.
    if (
        not torch.compiler.is_compiling()
        and torch.is_inference_mode_enabled()
        and not _functorch_active()
    ):
        for a in args:  # a loop: all() over a generator costs a microsecond more
            if isinstance(a, torch.Tensor) and type(a) not in _PLAIN:
                break
        else:
            return _EAGER[name](*args)
    return getattr(torch.ops.ai3, name)(*args)


#: Built models of weightless operators, per (operator, dtype, configuration).
_BY_CONFIG: dict = {}
_BY_CONFIG_LIMIT = 256
#: Built models of operators with weights, per ``id`` of the first weight:
#: ``(weakref to it, key, model)``; an entry leaves with its weight.
_BY_WEIGHT: dict = {}


def _stamp(t: Optional[torch.Tensor]):
    """What identifies a weight's current contents to PyTorch: its storage and
    version counter (bumped by every in-place update: optimizer steps,
    ``load_state_dict``, ``nn.init``), shape, strides and dtype. Raises
    RuntimeError for an inference tensor, which has no version counter."""
    if t is None:
        return None
    return (id(t), t.data_ptr(), t._version, t.shape, t.stride(), t.dtype)


def _built(dtype: str, build) -> "_core.Model":
    model = _core.Model(dtype, 1, copy_weights=False)
    model.set_outputs([build(model)])
    return model


def _model_for(op: str, dtype: str, build, weights: tuple, config: tuple) -> "_core.Model":
    """The one-node ai3 model for this call, reused across calls.

    A model packs or transforms its weights on first use (Winograd's filter
    transform, GEMM packing), so it is kept and reused while its weights are
    unchanged, and rebuilt when PyTorch reports that one changed. Inference
    tensors carry no version counter, so layers whose weights are inference
    tensors build a fresh model each call.
    """
    if not weights:
        key = (op, dtype, config)
        model = _BY_CONFIG.get(key)
        if model is None:
            if len(_BY_CONFIG) >= _BY_CONFIG_LIMIT:
                _BY_CONFIG.clear()
            model = _BY_CONFIG[key] = _built(dtype, build)
        return model
    try:
        key = (op, dtype, config, tuple([_stamp(w) for w in weights]))
    except RuntimeError:  # an inference tensor: nothing tells whether it changed
        return _built(dtype, build)
    first = weights[0]
    entry = _BY_WEIGHT.get(id(first))
    if entry is not None and entry[0]() is first and entry[1] == key:
        return entry[2]
    model = _built(dtype, build)
    wid = id(first)

    def forget(ref, wid=wid):
        current = _BY_WEIGHT.get(wid)
        if current is not None and current[0] is ref:
            del _BY_WEIGHT[wid]

    _BY_WEIGHT[wid] = (weakref.ref(first, forget), key, model)
    return model


def _run(op: str, x: torch.Tensor, weights: dict, algorithm: str, **params: Any) -> torch.Tensor:
    """Runs ``x`` through a one-node ai3 model of ``op`` with these weights and
    parameters (by name), borrowing the weights (no copies). Models are reused
    while ``weights`` are unchanged and ``params`` equal (see :func:`_model_for`).
    Each operator passes its parameters in one fixed order, so they key the
    cache as given."""
    name = _DTYPE_NAMES.get(x.dtype)
    if name is None:
        raise DtypeError(
            f"{op}: input of shape {list(x.shape)} has unsupported dtype {x.dtype}; "
            "ai3 computes in float32 and float64"
        )
    threads.sync()

    def build(model):
        held = {k: _detached(w) for k, w in weights.items()}
        return model.add(op, op, [0], {**held, **params}, algorithm)

    config = (algorithm, tuple(params.items()))
    model = _model_for(op, name, build, tuple(weights.values()), config)
    return torch.from_dlpack(model.run([_borrowed(x.detach())])[0])


def _out_len(size: int, k: int, s: int, p: int, d: int, ceil: bool = False) -> int:
    span = d * (k - 1) + 1
    room = size + 2 * p - span
    out = (-(-room // s) if ceil else room // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


# ---- conv2d -------------------------------------------------------------------------------


@_operator("conv2d")
def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
    algorithm: str,
) -> torch.Tensor:
    """ai3's conv2d on batched input with symmetric zero padding ``(h, w)``.

    The output is channels last when the input is (see
    :func:`_channels_last`), as PyTorch's convolution returns it: the
    depthwise kernel reads and writes that layout in place, the others
    compute NCHW and the result is copied."""
    ph, pw = padding
    out = _run(
        "conv2d",
        x,
        {"weight": weight, "bias": bias},
        algorithm,
        stride=tuple(stride),
        padding=(ph, ph, pw, pw),
        dilation=tuple(dilation),
        groups=groups,
    )
    if _channels_last(x) and not out.is_contiguous(memory_format=torch.channels_last):
        out = out.contiguous(memory_format=torch.channels_last)
    return out


def _channels_last(x: torch.Tensor) -> bool:
    """Whether a 4-D value is laid out channels last (and not also plain
    contiguous, as one with a single channel or a 1x1 plane is)."""
    return (
        x.dim() == 4
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
    )


@conv2d.register_fake
def _(x, weight, bias, stride, padding, dilation, groups, algorithm):
    n, _, h, w = x.shape
    oc, _, kh, kw = weight.shape
    oh = _out_len(h, kh, stride[0], padding[0], dilation[0])
    ow = _out_len(w, kw, stride[1], padding[1], dilation[1])
    fmt = torch.channels_last if _channels_last(x) else torch.contiguous_format
    return torch.empty((n, oc, oh, ow), dtype=x.dtype, device=x.device, memory_format=fmt)


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.conf = (stride, padding, dilation, groups)


def _conv2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.conf
    mask = [
        ctx.needs_input_grad[0],
        ctx.needs_input_grad[1],
        ctx.has_bias and ctx.needs_input_grad[2],
    ]
    gx, gw, gb = torch.ops.aten.convolution_backward(
        grad,
        x,
        weight,
        [weight.shape[0]] if ctx.has_bias else None,
        stride,
        padding,
        dilation,
        False,
        [0, 0],
        groups,
        mask,
    )
    return gx, gw, gb, None, None, None, None, None


conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup)


# ---- linear -------------------------------------------------------------------------------


@_operator("linear")
def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], algorithm: str
) -> torch.Tensor:
    """ai3's fully connected layer over the last dimension."""
    return _run("linear", x, {"weight": weight, "bias": bias}, algorithm)


@linear.register_fake
def _(x, weight, bias, algorithm):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    # Rows spelled out: -1 is ambiguous when a layer has no in or out features.
    rows = math.prod(grad.shape[:-1])
    g2 = grad.reshape(rows, weight.shape[0])
    gx = (grad @ weight) if ctx.needs_input_grad[0] else None
    gw = (g2.t() @ x.reshape(rows, weight.shape[1])) if ctx.needs_input_grad[1] else None
    gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb, None


linear.register_autograd(_linear_backward, setup_context=_linear_setup)


# ---- relu ---------------------------------------------------------------------------------


@_operator("relu")
def relu(x: torch.Tensor, algorithm: str) -> torch.Tensor:
    """ai3's ReLU."""
    return _run("relu", x, {}, algorithm)


@relu.register_fake
def _(x, algorithm):
    return torch.empty_like(x)


def _relu_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _relu_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    return torch.ops.aten.threshold_backward(grad, out, 0), None


relu.register_autograd(_relu_backward, setup_context=_relu_setup)


# ---- maxpool2d ----------------------------------------------------------------------------


@_operator("maxpool2d")
def maxpool2d(
    x: torch.Tensor,
    kernel: List[int],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    ceil_mode: bool,
    algorithm: str,
) -> torch.Tensor:
    """ai3's max pooling on batched input."""
    return _run(
        "maxpool2d",
        x,
        {},
        algorithm,
        kernel_size=tuple(kernel),
        stride=tuple(stride),
        padding=tuple(padding),
        dilation=tuple(dilation),
        ceil_mode=ceil_mode,
    )


@maxpool2d.register_fake
def _(x, kernel, stride, padding, dilation, ceil_mode, algorithm):
    n, c, h, w = x.shape
    oh = _out_len(h, kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
    ow = _out_len(w, kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
    return x.new_empty((n, c, oh, ow))


def _maxpool_setup(ctx, inputs, output):
    x, kernel, stride, padding, dilation, ceil_mode, _ = inputs
    ctx.save_for_backward(x)
    ctx.conf = (kernel, stride, padding, dilation, ceil_mode)


def _maxpool_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    kernel, stride, padding, dilation, ceil_mode = ctx.conf
    _, idx = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)
    gx = torch.ops.aten.max_pool2d_with_indices_backward(
        grad, x, kernel, stride, padding, dilation, ceil_mode, idx
    )
    return gx, None, None, None, None, None, None


maxpool2d.register_autograd(_maxpool_backward, setup_context=_maxpool_setup)


# ---- avgpool2d ----------------------------------------------------------------------------


@_operator("avgpool2d")
def avgpool2d(
    x: torch.Tensor,
    kernel: List[int],
    stride: List[int],
    padding: List[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Optional[int],
    algorithm: str,
) -> torch.Tensor:
    """ai3's average pooling on batched input."""
    return _run(
        "avgpool2d",
        x,
        {},
        algorithm,
        kernel_size=tuple(kernel),
        stride=tuple(stride),
        padding=tuple(padding),
        ceil_mode=ceil_mode,
        count_include_pad=count_include_pad,
        divisor_override=divisor_override,
    )


@avgpool2d.register_fake
def _(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, algorithm):
    n, c, h, w = x.shape
    oh = _out_len(h, kernel[0], stride[0], padding[0], 1, ceil_mode)
    ow = _out_len(w, kernel[1], stride[1], padding[1], 1, ceil_mode)
    return x.new_empty((n, c, oh, ow))


def _avgpool_setup(ctx, inputs, output):
    x, kernel, stride, padding, ceil_mode, include_pad, divisor, _ = inputs
    ctx.save_for_backward(x)
    ctx.conf = (kernel, stride, padding, ceil_mode, include_pad, divisor)


def _avgpool_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    gx = torch.ops.aten.avg_pool2d_backward(grad, x, *ctx.conf)
    return gx, None, None, None, None, None, None, None


avgpool2d.register_autograd(_avgpool_backward, setup_context=_avgpool_setup)


# ---- adaptiveavgpool2d --------------------------------------------------------------------


@_operator("adaptiveavgpool2d")
def adaptiveavgpool2d(x: torch.Tensor, output_size: List[int], algorithm: str) -> torch.Tensor:
    """ai3's adaptive average pooling on batched input (sizes already resolved)."""
    return _run("adaptiveavgpool2d", x, {}, algorithm, output_size=tuple(output_size))


@adaptiveavgpool2d.register_fake
def _(x, output_size, algorithm):
    return x.new_empty((x.shape[0], x.shape[1], *output_size))


def _adaptive_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _adaptive_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.ops.aten._adaptive_avg_pool2d_backward(grad, x), None, None


adaptiveavgpool2d.register_autograd(_adaptive_backward, setup_context=_adaptive_setup)


# ---- flatten ------------------------------------------------------------------------------


@_operator("flatten")
def flatten(x: torch.Tensor, start_dim: int, end_dim: int, algorithm: str) -> torch.Tensor:
    """ai3's flatten (a copy: custom operators may not return views)."""
    return _run("flatten", x, {}, algorithm, start_dim=start_dim, end_dim=end_dim)


@flatten.register_fake
def _(x, start_dim, end_dim, algorithm):
    shape = list(x.shape)
    start = start_dim % len(shape)
    end = end_dim % len(shape)
    merged = 1
    for d in shape[start : end + 1]:
        merged = merged * d
    return x.new_empty((*shape[:start], merged, *shape[end + 1 :]))


def _flatten_setup(ctx, inputs, output):
    ctx.in_shape = inputs[0].shape


def _flatten_backward(ctx, grad):
    return grad.reshape(ctx.in_shape), None, None, None


flatten.register_autograd(_flatten_backward, setup_context=_flatten_setup)

__all__ = ["conv2d", "linear", "relu", "maxpool2d", "avgpool2d", "adaptiveavgpool2d", "flatten"]
