"""A batch of large images runs the network's first layers a few images at a
time, so that each layer's output is still in cache when the next reads it
(``memory_plan()``'s ``chunked_steps`` and ``chunk_images``). The results must
be those of PyTorch whatever the batch, the chunks and the values that outlive
the chunked layers."""

from __future__ import annotations

import ai3
import pytest
import torch
from conftest import assert_close, reference
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    """Large early layers (64 x 128 x 128 floats an image, 16 MiB for 4
    images) with a skip, then small ones; the stem's output is read again
    after the flatten, which ends the chunked run."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.dw = nn.Conv2d(64, 64, 3, padding=1, groups=64)
        self.pw = nn.Conv2d(64, 20, 1)
        self.fc = nn.Linear(20 * 32 * 32, 10)

    def forward(self, x):
        a = F.relu(self.stem(x))
        b = F.relu6(self.dw(a)) + a
        c = F.max_pool2d(self.pw(b), 4)
        f = self.fc(torch.flatten(c, 1))
        return torch.cat([f, a.mean((2, 3))], 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 4, 5])
def test_chunked_runs_match_pytorch(batch, dtype):
    torch.manual_seed(batch)
    net = Net().eval().to(dtype)
    x = torch.randn(batch, 3, 128, 128, dtype=dtype)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    plan = model.memory_plan(tuple(x.shape))
    if batch == 1:
        assert plan["chunked_steps"] == 0 and plan["chunk_images"] == 1, plan
    else:
        # The stem, depthwise, add and what runs blocked around them, but
        # not the flatten or what follows it.
        assert 3 <= plan["chunked_steps"] < len(model.summary(tuple(x.shape))) + 4, plan
        assert 1 <= plan["chunk_images"] < batch, plan
    # A second call reuses the arena and gives the same result.
    assert_close(model(x), reference(net, x))


def test_small_images_run_the_whole_batch():
    net = Net().eval()
    x = torch.randn(4, 3, 32, 32)
    net.fc = nn.Linear(20 * 8 * 8, 10)
    model = ai3.convert(net)
    assert_close(model(x), reference(net, x))
    plan = model.memory_plan(tuple(x.shape))
    assert plan["chunked_steps"] == 0 and plan["chunk_images"] == 4, plan
