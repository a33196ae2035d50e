"""On a GPU: a training step of a transformed model under autocast, timm's benchmark's own step
(scripts/timm_benchmark.py; fp32 parameters, channels_last or not), makes no call that waits for
the GPU. A wait per layer would stall the stream at every spio call and cost whole-model
throughput that per-pass kernel timings never show. PyTorch's sync debug mode raises on every
synchronising call it makes (a copy to the host, a stream or device synchronise, `.item()`, a
data-dependent shape); CUDA graph capture (tests/transform/test_cuda_graphs.py) checks the same
of fp16 models without autocast."""

import types

import pytest
import torch
from torch import nn

from spio.layers import Conv2dGw8
from spio.transform import precompile, transform
from tests.conftest import load_script, spy_on_launches

pytestmark = pytest.mark.cuda


def _block(c: int) -> nn.Module:
    """A RegNet-like block: 1x1, BN, ReLU, grouped 3x3 without bias, BN, ReLU, 1x1; and a
    grouped 5x3 with a bias after it (both grouped convolutions are spio's)."""
    return nn.Sequential(
        nn.Conv2d(c, c, 1, bias=False),
        nn.BatchNorm2d(c),
        nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1, groups=c // 8, bias=False),
        nn.BatchNorm2d(c),
        nn.ReLU(),
        nn.Conv2d(c, c, 1, bias=False),
        nn.Conv2d(c, c, (5, 3), padding=(2, 1), groups=c // 8),
    )


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_autocast_training_step_never_waits_for_the_gpu(monkeypatch, dtype, channels_last):
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = transform(_block(32)).cuda().to(memory_format=fmt)
    assert sum(isinstance(m, Conv2dGw8) for m in model.modules()) == 2
    x = torch.randn(8, 32, 20, 18, device="cuda").contiguous(memory_format=fmt)

    # timm_benchmark.py's own training step: autocast forward, a loss, backward, grads dropped.
    args = types.SimpleNamespace(bench="train", amp_dtype=str(dtype).removeprefix("torch."))
    step = load_script("timm_benchmark")._step_fn(model, args, x)

    with torch.autocast("cuda", dtype=dtype):
        precompile(model, x, progress=False)
    step()  # kernels chosen and loaded, PyTorch's own first-call work done
    torch.cuda.synchronize()
    launched = spy_on_launches(monkeypatch)  # (a step of PyTorch's convolutions proves nothing)
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert {"conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad"} <= set(launched)


def test_sync_debug_mode_catches_a_wait():
    """The check can fail: a copy to the host under the same mode raises."""
    y = torch.ones(3, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            y.sum().item()
    finally:
        torch.cuda.set_sync_debug_mode("default")
