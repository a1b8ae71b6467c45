"""Real torchvision networks converted whole: each must match PyTorch to 1e-3
relative to the output's scale. Random weights (nothing can be downloaded),
with BatchNorm statistics randomised so that folding is really exercised."""

from __future__ import annotations

import threading

import ai3
import pytest
import torch
import torchvision
from torch import nn

#: (name, image size): small images where the network allows it, to keep CI fast.
NETWORKS = [
    ("alexnet", 64),
    ("vgg16", 32),
    ("resnet18", 64),
    ("resnet50", 64),
    ("resnet152", 64),
    ("densenet121", 64),
    ("googlenet", 64),
    ("squeezenet1_1", 64),
    ("mobilenet_v2", 64),
    ("mobilenet_v3_large", 64),
    ("efficientnet_b0", 64),
    ("shufflenet_v2_x1_0", 64),
    ("mnasnet1_0", 64),
    ("regnet_y_400mf", 64),
    ("convnext_tiny", 64),
    ("vit_b_16", 64),
]


def build(name: str, size: int | None = None) -> nn.Module:
    """A torchvision network with random weights and random BatchNorm statistics, in eval mode;
    ``size`` is the image size of networks built for one (ViT)."""
    kwargs = (
        {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    )
    if size is not None:
        kwargs["image_size"] = size
    net = getattr(torchvision.models, name)(weights=None, **kwargs)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Linear) and not m.weight.any():
                nn.init.normal_(m.weight, std=0.02)  # ViT's head starts at zero: outputs all 0
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return net.eval()


def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    scale = expected.abs().max().item()
    err = (actual - expected).abs().max().item()
    assert err <= 1e-3 * scale, f"max error {err:.3e} > 1e-3 * {scale:.3e}"


#: Networks built for one image size.
SIZED = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")


def run(name: str, size: int, algos=None, batch: int = 2) -> ai3.Model:
    net = build(name, size if name in SIZED else None)
    x = torch.randn(batch, 3, size, size)
    with torch.inference_mode():
        expected = net(x)
    model = ai3.convert(net, algos)
    check(model(x), expected)
    return model


@pytest.mark.parametrize("name,size", NETWORKS, ids=[n for n, _ in NETWORKS])
def test_network_matches_torch(name, size):
    run(name, size)


@pytest.mark.slow
def test_inception_v3_full_size():
    run("inception_v3", 299)


def _winograd_where_possible(m: nn.Conv2d) -> str:
    ok = m.kernel_size == (3, 3) and m.stride == (1, 1) and m.dilation == (1, 1)
    return "winograd" if ok else "gemm"


@pytest.mark.parametrize("algo", ["direct", "smm", "gemm", "default", _winograd_where_possible])
def test_resnet18_with_each_conv_algorithm(algo):
    model = run("resnet18", 32, {"conv2d": algo}, batch=1)
    rows = model.summary((1, 3, 32, 32))
    used = {r["algorithm"] for r in rows if r["op"] == "conv2d"}
    if isinstance(algo, str) and algo != "default":
        assert used == {algo}
    elif not isinstance(algo, str):
        assert used == {"winograd", "gemm"}


def test_batchnorm_is_folded_and_relu_fused():
    model = run("resnet18", 32, batch=1)
    rows = model.summary((1, 3, 32, 32))
    ops = [r["op"] for r in rows]
    assert "batchnorm2d" not in ops, "every BatchNorm of resnet18 follows a conv and must be folded"
    # Every ReLU follows a conv or a residual add, and is fused into it.
    assert "relu" not in ops
    assert ops.count("add") == 8
    assert all(r["fused"] == "relu" for r in rows if r["op"] == "add"), rows


def test_arena_is_reused_and_smaller_than_all_intermediates():
    net = build("resnet50")
    model = ai3.convert(net)
    x = torch.randn(1, 3, 64, 64)
    model(x)
    first = model.memory_plan(tuple(x.shape))
    model(x)
    second = model.memory_plan(tuple(x.shape))
    assert first["arenas_allocated"] == 1
    assert second == first, "a second call with the same shape must not allocate a new arena"
    assert first["arena_bytes"] < first["intermediate_bytes"] / 4
    # A different shape is re-planned and still correct.
    y = torch.randn(2, 3, 48, 48)
    with torch.inference_mode():
        check(model(y), net(y))


def test_one_model_called_from_four_threads():
    net = build("resnet18")
    model = ai3.convert(net)
    inputs = [torch.randn(1, 3, 32, 32) for _ in range(4)]
    with torch.inference_mode():
        expected = [net(x) for x in inputs]
    results: list[torch.Tensor | None] = [None] * 4
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(3):
                results[i] = model(inputs[i])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, expected, strict=True):
        check(got, want)
