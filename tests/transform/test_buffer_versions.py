"""spio's stand-in forward (scan_modules, precompile, where_faster) restores the buffers it ran
over without bumping their autograd version counters, so a forward already taken still runs its
backward afterwards: e.g. a multi-crop step (DINO, SwAV) that forwards the global crops, then
precompiles or scans the model for the local crops' batch shape, then takes one backward."""

import pytest
import torch
from torch import nn

import spio
from spio.transform import scan_modules, transform


def _model() -> nn.Module:
    torch.manual_seed(0)
    return transform(
        nn.Sequential(
            nn.Conv2d(16, 16, 3, padding=1, groups=2),
            nn.BatchNorm2d(16),  # saves its running statistics for the backward
            nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1, groups=2),
        )
    )


def _scan(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scan_modules(model, x)


def _precompile(model, x):
    spio.precompile(model, x, progress=False)


@pytest.mark.parametrize("call", [_scan, _precompile], ids=["scan_modules", "precompile"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_a_pending_backward_survives_a_stand_in_forward(call, training):
    model = _model().train(training)
    reference = _model().train(training)
    x = torch.randn(2, 16, 8, 8, requires_grad=True)
    y = model(x)
    versions = [b._version for b in model.buffers()]
    running = [b.clone() for b in model.buffers()]
    call(model, torch.randn(1, 16, 4, 4))  # another batch shape, as a later crop would have
    assert [b._version for b in model.buffers()] == versions
    assert all(torch.equal(a, b) for a, b in zip(running, model.buffers(), strict=True))
    y.square().sum().backward()  # raised "modified by an inplace operation" before the fix
    x_ref = x.detach().clone().requires_grad_()
    reference(x_ref).square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


class _RunningMean(nn.Module):
    """Keeps a running mean by setting a new tensor in the buffer's place, a common pattern."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.register_buffer("mean", torch.zeros(16))

    def forward(self, x):
        y = self.conv(x)
        if self.training:
            self.mean = 0.9 * self.mean + 0.1 * y.detach().mean((0, 2, 3))
        return y - self.mean[:, None, None]


@pytest.mark.parametrize("call", [_scan, _precompile], ids=["scan_modules", "precompile"])
def test_a_buffer_the_forward_replaces_is_put_back(call):
    """The stand-in forward had restored the values of the buffer objects it saw, so a buffer
    the forward replaced kept the new tensor: the model's running mean moved."""
    model = transform(_RunningMean())
    buffer = model.mean
    call(model, torch.randn(2, 16, 8, 8))
    assert model.mean is buffer and torch.equal(buffer, torch.zeros(16))


@pytest.mark.parametrize("call", [_scan, _precompile], ids=["scan_modules", "precompile"])
def test_a_model_built_under_inference_mode_is_scanned(call):
    """Its buffers are inference tensors, which the restore's copy_ had refused outside
    inference mode (a RuntimeError from every scan, precompile and where_faster)."""
    with torch.inference_mode():
        model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2), nn.BatchNorm2d(16))
    model = transform(model.eval())
    with torch.no_grad():
        call(model, torch.randn(2, 16, 8, 8))
    assert model[1].running_mean.is_inference()
