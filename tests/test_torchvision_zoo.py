"""Every torchvision classification model, converted whole at its native
image size (the crop size of its weights' transforms, read from torchvision's
metadata; nothing is downloaded; ``SMALLER`` lists the exceptions) with
random weights, batch 1, against PyTorch to 1e-3 of the output's scale. A
model that does not convert would be listed in ``NOT_YET`` with the reason,
as a strict expected failure."""

from __future__ import annotations

import ai3
import pytest
import torch
import torchvision
from torch import nn

#: Models that do not convert yet, and why (none now).
NOT_YET: dict[str, str] = {}

#: Models run below their native size, and why. The default weights of
#: ViT-H/14 and RegNetY-128GF are for 518x518 and 384x384 (ViT-H/14 about a
#: teraflop, 1369 tokens): minutes of CI on a slow machine together. Both run
#: at 224x224, the size of their other weights (IMAGENET1K_SWAG_LINEAR_V1), on
#: the same layers; the smaller ViTs and RegNets run at their default weights' sizes.
SMALLER: dict[str, int] = {"vit_h_14": 224, "regnet_y_128gf": 224}

NAMES = torchvision.models.list_models(module=torchvision.models)


def _native_size(name: str) -> int:
    return torchvision.models.get_model_weights(name).DEFAULT.transforms().crop_size[0]


def _test_size(name: str) -> int:
    """The native size, or the smaller one ``SMALLER`` gives."""
    return SMALLER.get(name, _native_size(name))


def _build(name: str, size: int) -> nn.Module:
    kwargs: dict = {}
    if name in ("googlenet", "inception_v3"):
        kwargs = {"aux_logits": False, "init_weights": True}
    if name.startswith("vit_"):
        kwargs["image_size"] = size  # built for the size its weights were trained at
    torch.manual_seed(0)
    net = torchvision.models.get_model(name, weights=None, **kwargs).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Linear) and not m.weight.any():
                nn.init.normal_(m.weight, std=0.02)  # zero-initialised heads: outputs all 0
    return net


def test_the_zoo_is_all_there():
    assert len(NAMES) >= 80  # torchvision 0.2x: 80 classification models
    assert set(NOT_YET) <= set(NAMES)
    assert set(SMALLER) <= set(NAMES)
    assert all(SMALLER[n] < _native_size(n) for n in SMALLER)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(raises=ai3.UnsupportedOperationError,
                                                 strict=True, reason=NOT_YET[n]))
        if n in NOT_YET else n
        for n in NAMES
    ],
)  # fmt: skip
def test_converts_and_matches_at_native_size(name):
    size = _test_size(name)
    net = _build(name, size)
    shape = (1, 3, size, size)
    model = ai3.convert(net, sample_input_shape=shape)
    x = torch.randn(shape)
    with torch.inference_mode():
        want = net(x)
    got = model(x)
    assert got.shape == want.shape
    scale = float(want.abs().max())
    assert scale > 0
    assert float((got - want).abs().max()) <= 1e-3 * scale
