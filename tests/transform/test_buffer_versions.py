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
