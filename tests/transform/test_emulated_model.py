"""With SPIO_EMULATE=1 a transformed model runs forward and backward through the real kernels in
the CPU emulator; its outputs and gradients match the same model run by PyTorch in float64."""

import copy

import pytest
import torch
from torch import nn

from spio.layers import Conv2dGw8
from spio.transform import transform


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(16, 16, 3, padding=1, groups=2),
        nn.ReLU(),
        nn.Conv2d(16, 16, (5, 3), padding=(2, 1), groups=2, bias=False),
        nn.ReLU(),
        nn.Conv2d(16, 16, 1, groups=2),
    )


# Passes spio runs per layer (by index in the Sequential); None: all three (plain transform).
_MIXED = {0: ("fprop", "wgrad"), 2: ("dgrad",), 4: ("fprop", "dgrad", "wgrad")}


@pytest.mark.parametrize(
    "dtype, passes",
    [(torch.float16, None), (torch.bfloat16, None), (torch.float16, _MIXED)],
    ids=["fp16", "bf16", "fp16-mixed-passes"],
)
def test_transformed_model_matches_float64_pytorch(monkeypatch, dtype, passes):
    """The mixed case has each layer run some passes in spio and the others in PyTorch."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    reference = _model().double()
    include = None if passes is None else (lambda name, conv: passes[int(name)])
    model = transform(copy.deepcopy(reference).to(dtype), include=include)
    convs = [m for m in model.modules() if isinstance(m, Conv2dGw8)]
    assert len(convs) == 3
    if passes is not None:
        assert [m.spio_passes for m in convs] == list(passes.values())

    x = torch.randn(2, 16, 7, 6, generator=torch.Generator().manual_seed(1))
    x = x.to(dtype).to(memory_format=torch.channels_last)
    y = model(x)
    y_ref = reference(x.double())
    # Three layers of fp16/bf16 rounding: compare relative to the output's scale.
    eps = torch.finfo(dtype).eps
    scale = y_ref.abs().max().item()
    torch.testing.assert_close(y.double(), y_ref, atol=8 * eps * scale, rtol=8 * eps)

    y.float().square().sum().backward()
    y_ref.square().sum().backward()
    for (name, p), (_, p_ref) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        g_scale = p_ref.grad.abs().max().item()
        torch.testing.assert_close(
            p.grad.double(), p_ref.grad, atol=32 * eps * g_scale, rtol=16 * eps, msg=name
        )
