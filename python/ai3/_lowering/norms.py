"""Normalisation layers, in inference: ``nn.BatchNorm2d`` (running statistics),
``nn.LayerNorm``, and their functions (weights constants or graph values)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .calls import Sig, Unsupported, as_bool, as_float, as_ints
from .lowerer import Lowerer
from .registry import register


def _bn_module(lw: Lowerer, n, m: nn.BatchNorm2d, x) -> None:
    if m.training:
        raise Unsupported(
            "training mode (normalises with the batch's statistics); "
            "call .eval() before ai3.convert"
        )
    if m.running_mean is None or m.running_var is None:
        raise Unsupported(
            "BatchNorm without running statistics (track_running_stats=False), "
            "which normalises with the batch's statistics even in eval mode"
        )
    params = {"weight": m.weight, "bias": m.bias, "eps": float(m.eps)}
    params.update(running_mean=m.running_mean, running_var=m.running_var)
    lw.step(n, "batchnorm2d", [x], params, m)


def _layernorm_module(lw: Lowerer, n, m: nn.LayerNorm, x) -> None:
    params = {"normalized_shape": list(m.normalized_shape), "eps": float(m.eps)}
    lw.step(n, "layernorm", [x], {**params, "weight": m.weight, "bias": m.bias}, m)


def _batchnorm_fn(sig: Sig) -> Callable:
    """``momentum`` only matters in training, and ``cudnn_enabled`` picks a kernel:
    both harmless here."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        if as_bool("training", b["training"]):
            raise Unsupported("training=True (statistics of the batch; ai3 runs inference)")
        if b["running_mean"] is None or b["running_var"] is None:
            raise Unsupported("batch norm without running statistics")
        inputs, (w, bias, mean, var) = lw.weight_args(
            b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"]
        )
        params = {"weight": w, "bias": bias, "eps": as_float("eps", b["eps"])}
        lw.step(n, "batchnorm2d", inputs, {**params, "running_mean": mean, "running_var": var})

    return handler


#: ``F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)``.
_F_BATCHNORM = Sig(
    "input, running_mean, running_var, weight, bias, training, momentum, eps",
    weight=None,
    bias=None,
    training=False,
    momentum=0.1,
    eps=1e-5,
)
#: ``torch.batch_norm``: the same arguments in ATen's order, all required.
_TORCH_BATCHNORM = Sig(
    "input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled"
)


def _layernorm_fn(sig: Sig) -> Callable:
    """``F.layer_norm`` / ``torch.layer_norm`` (whose extra ``cudnn_enable`` changes nothing)."""

    def handler(lw: Lowerer, n) -> None:
        b = sig.bind(n)
        inputs, (w, bias) = lw.weight_args(b["input"], b["weight"], b["bias"])
        shape = as_ints("normalized_shape", b["normalized_shape"])
        params = {"normalized_shape": shape, "eps": as_float("eps", b["eps"])}
        lw.step(n, "layernorm", inputs, {**params, "weight": w, "bias": bias})

    return handler


_LAYERNORM = "input, normalized_shape, weight, bias, eps"
_LN_DEFAULTS = {"weight": None, "bias": None, "eps": 1e-5}
_TORCH_LAYERNORM = Sig(_LAYERNORM + ", cudnn_enable", **_LN_DEFAULTS, cudnn_enable=True)


register(
    modules={nn.BatchNorm2d: _bn_module, nn.LayerNorm: _layernorm_module},
    functions={
        F.batch_norm: _batchnorm_fn(_F_BATCHNORM),
        torch.batch_norm: _batchnorm_fn(_TORCH_BATCHNORM),
        F.layer_norm: _layernorm_fn(Sig(_LAYERNORM, **_LN_DEFAULTS)),
        torch.layer_norm: _layernorm_fn(_TORCH_LAYERNORM),
        torch.ops.aten.layer_norm.default: _layernorm_fn(_TORCH_LAYERNORM),
    },
)
