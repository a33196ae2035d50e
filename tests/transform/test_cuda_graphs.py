"""CUDA graphs (GPU only): a transformed model's training step captured in a CUDA graph replays
to what eager steps compute, with spio's kernels in the graph; and a model compiled in
torch.compile's "reduce-overhead" mode (which records CUDA graphs where Inductor finds it safe)
trains to the same results as eager mode."""

import pytest
import torch
from torch import nn

from spio.kernels.kernel import Kernel
from spio.transform import transform
from tests.conftest import spy_on_launches

pytestmark = pytest.mark.cuda

SHAPE = (4, 32, 12, 10)


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(32, 32, 3, padding=1, groups=4),
        nn.ReLU(),
        nn.Conv2d(32, 32, (3, 5), padding=(1, 2), groups=4, bias=False),
    )
    model = transform(model).cuda().half().to(memory_format=torch.channels_last)
    return model


def _input(seed: int) -> torch.Tensor:
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))
    return x.to(device="cuda", dtype=torch.float16, memory_format=torch.channels_last)


def _loss(y: torch.Tensor) -> torch.Tensor:
    return y.float().square().mean()


def _eager(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output and parameter gradients of one eager step, leaving every .grad alone."""
    y = model(x)
    return y, list(torch.autograd.grad(_loss(y), list(model.parameters())))


def test_captured_training_step_replays_eager_results(monkeypatch):
    model = _model()
    static_x = _input(0)

    def step() -> torch.Tensor:
        y = model(static_x)
        _loss(y).backward()
        return y

    # Warm up on a side stream, as PyTorch's CUDA-graph recipe does: the kernels are chosen,
    # compiled and loaded there, outside the capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)

    launch = Kernel.launch
    launched = spy_on_launches(monkeypatch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    monkeypatch.setattr(Kernel, "launch", launch)
    for kind in ("fprop", "dgrad", "wgrad"):
        assert any(kind in name for name in launched), launched
    static_grads = [p.grad for p in model.parameters()]

    outputs = []
    for seed in (1, 2):
        x = _input(seed)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        y_ref, grads_ref = _eager(model, x)
        torch.testing.assert_close(static_y, y_ref)
        torch.testing.assert_close(static_grads, grads_ref)
        outputs.append(static_y.clone())
    assert not torch.equal(outputs[0], outputs[1])  # each replay computed its own input


def test_compile_reduce_overhead_trains_like_eager():
    pytest.importorskip("triton")  # Inductor's GPU code generator
    torch._dynamo.reset()
    model = _model()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for seed in range(4):  # the first calls warm up and record; the later ones replay
        x = _input(seed)
        model.zero_grad(set_to_none=True)
        y = compiled(x)
        _loss(y).backward()
        y = y.clone()  # the graph's output memory is reused by the next replay
        grads = [p.grad.clone() for p in model.parameters()]
        y_ref, grads_ref = _eager(model, x)
        torch.testing.assert_close(y, y_ref)
        torch.testing.assert_close(grads, grads_ref)
