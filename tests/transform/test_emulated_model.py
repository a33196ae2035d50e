"""With SPIO_EMULATE=1 a transformed model runs forward and backward through the real kernels in
the CPU emulator; its outputs and gradients match the same model run by PyTorch in float64."""

import copy

import pytest
import torch
from torch import nn

from spio.layers import Conv2dGw8
from spio.transform import transform
from tests.conftest import spy_on_launches


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
    """The mixed case has each layer run some passes in spio and the others in PyTorch: the
    kernels launched are each layer's passes that spio runs, no more, no fewer."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    launched = spy_on_launches(monkeypatch, names=True)
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
    # (layer, pass) of each conv kernel launched, the layer told by its filter size; the first
    # layer's DGrad is never asked for (x needs no gradient).
    filters = {"r3_s3": 0, "r5_s3": 2, "r1_s1": 4}
    ran = {
        (filters[f"{part}"], name.split("__")[0].removeprefix("conv2d_gw8_"))
        for name in launched
        if not name.startswith("sum_slots")
        for part in filters
        if f"_{part}_" in name
    }
    wanted = {
        (i, pass_)
        for i in (0, 2, 4)
        for pass_ in (passes or {}).get(i, ("fprop", "dgrad", "wgrad"))
        if (i, pass_) != (0, "dgrad")
    }
    assert ran == wanted, launched


@pytest.mark.parametrize("wrt", ["input", "weight"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gradient_penalty_matches_float64_pytorch(monkeypatch, dtype, wrt):
    """Double backward through a transformed model, with spio's kernels in both backward passes,
    against float64 PyTorch: a penalty on the norm of the input gradient (as in WGAN-GP or R1),
    or of the first layer's weight gradient (which takes the other half of the formulas)."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    # The penalty is sensitive to rounding its weights and input (on this model, rounding them
    # to fp16 alone moves the first layer's gradient by 75 eps of its scale), so the float64
    # reference gets the model's rounded weights and input: what is compared is the arithmetic.
    model = _model().to(dtype)
    reference = copy.deepcopy(model).double()
    model = transform(model)
    x = torch.randn(2, 16, 7, 6, generator=torch.Generator().manual_seed(2)).to(dtype)

    def penalty(net, x):
        """The penalty, and the input it took (whose .grad the penalty's backward fills)."""
        x = x.clone().requires_grad_()
        of = x if wrt == "input" else net[0].weight
        (g,) = torch.autograd.grad(net(x).double().square().sum(), of, create_graph=True)
        return g.double().square().sum(), x

    gp, x_model = penalty(model, x.to(memory_format=torch.channels_last))
    launched = spy_on_launches(monkeypatch)
    gp.backward()
    for kind in ("fprop", "dgrad", "wgrad"):  # the second backward runs all three passes
        assert f"conv2d_gw8_{kind}" in launched, launched
    gp_ref, x_ref = penalty(reference, x.double())
    gp_ref.backward()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(gp, gp_ref, atol=0, rtol=8 * eps)
    pairs = [(name, p.grad, p_ref.grad) for (name, p), (_, p_ref) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    )] + [("input", x_model.grad, x_ref.grad)]  # fmt: skip
    for name, grad, grad_ref in pairs:
        g_scale = grad_ref.abs().max().item()
        torch.testing.assert_close(
            grad.double(), grad_ref, atol=8 * eps * g_scale, rtol=8 * eps, msg=name
        )
