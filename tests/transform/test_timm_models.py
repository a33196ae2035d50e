"""spio.transform on real timm models, on the CPU.

timm is optional, and these tests skip without it. CI has no timm: timm imports torchvision, and
PyPI's torchvision wheels are CUDA builds that do not load beside the CPU build of torch that CI
installs. Run them where timm is installed (`pip install timm`).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from spio.layers import Conv2dGw8
from spio.transform import scan_modules, transform
from tests.conftest import spy_on_launches

timm = pytest.importorskip("timm")

#: RegNets of group width 8: the 3x3 conv of every block but each stage's first (stride 2).
MODELS = ("regnetx_002", "regnety_002")

#: timm zero-initialises each RegNet block's last BatchNorm (zero_init_last), which zeroes the
#: gradient reaching the block's grouped conv: the gradient checks would compare zeros.
NONZERO_GRADS = {"zero_init_last": False}


def _eligible_names(model: nn.Module) -> list[str]:
    """The convolutions spio should take, by the rules written out here rather than asked of
    spio: exactly nn.Conv2d, 8 channels a group, C == K, stride and dilation 1, R and S in
    1..5, zero padding."""
    names = []
    for name, m in model.named_modules():
        if type(m) is not nn.Conv2d:
            continue
        if (
            m.in_channels == m.out_channels == 8 * m.groups
            and m.stride == (1, 1)
            and m.dilation == (1, 1)
            and all(1 <= k <= 5 for k in m.kernel_size)
            and m.padding_mode == "zeros"
        ):
            names.append(name)
    return names


@pytest.mark.parametrize("name", MODELS)
def test_transform_takes_exactly_the_eligible_convs_of_a_timm_model(name, caplog):
    """Every other module keeps its type, and the parameters are the model's own objects."""
    model = timm.create_model(name)
    expected = _eligible_names(model)
    assert len(expected) >= 5, expected  # the model still has group-width-8 convs to take
    types_before = {n: type(m) for n, m in model.named_modules()}
    params_before = dict(model.named_parameters())
    convs = sum(type(m) is nn.Conv2d for m in model.modules())
    with caplog.at_level("INFO", logger="spio"):
        assert transform(model) is model
    assert f"replaced {len(expected)} of {convs} nn.Conv2d modules" in caplog.text
    for n, m in model.named_modules():
        assert type(m) is (Conv2dGw8 if n in expected else types_before[n]), n
    assert all(p is params_before[n] for n, p in model.named_parameters())


@pytest.mark.parametrize("name", MODELS)
def test_a_transformed_timm_model_keeps_its_outputs_and_gradients(name):
    """On float64 CPU tensors spio's layers run the PyTorch reference: the same numbers."""
    torch.manual_seed(0)
    reference = timm.create_model(name, **NONZERO_GRADS).double()
    model = transform(copy.deepcopy(reference))
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    y, y_ref = model(x), reference(x)
    torch.testing.assert_close(y, y_ref)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    grads = dict(model.named_parameters())
    for m in model.modules():
        if isinstance(m, Conv2dGw8):
            assert m.weight.grad.abs().max() > 0
    for n, p in reference.named_parameters():
        torch.testing.assert_close(grads[n].grad, p.grad, msg=n)
    # scan_modules meets the eligible layers at the sizes their inputs have.
    met = set()
    eligible = [dict(reference.named_modules())[n] for n in _eligible_names(reference)]
    hooks = [
        m.register_forward_pre_hook(lambda m, a: met.add((m.in_channels, *a[0].shape[2:])))
        for m in eligible
    ]
    with torch.no_grad():
        reference(x)
    for h in hooks:
        h.remove()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        params = scan_modules(model.float(), x.float())
    assert {(p.c, p.h, p.w) for p in params} == met
    assert {(p.r, p.s, p.dtype) for p in params} == {(3, 3, "bf16")}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_kernels_run_every_pass_of_a_timm_models_layers(monkeypatch, device):
    """regnetx_002 under bf16 autocast, on the GPU or (cpu) with SPIO_EMULATE=1 in the CPU
    emulator: every transformed layer runs spio's kernels in FProp, DGrad and WGrad, and each
    layer's output, input gradient and weight gradient match float64 PyTorch on the same
    layer's own inputs (per layer, so that rounding does not pile up through the network)."""
    monkeypatch.setenv("SPIO_EMULATE", "1" if device == "cpu" else "0")
    torch.manual_seed(0)
    model = transform(timm.create_model("regnetx_002", **NONZERO_GRADS)).eval()
    model = model.to(device=device, memory_format=torch.channels_last)
    layers = [m for m in model.modules() if isinstance(m, Conv2dGw8)]
    seen = {}

    def keep_input(module, args, output):
        seen[module] = {"x": args[0].detach().cpu(), "y": output.detach().cpu()}

    def keep_dy(module, grad_input, grad_output):
        seen[module]["dy"] = grad_output[0].detach().cpu()
        seen[module]["dx"] = grad_input[0].detach().cpu()

    hooks = [m.register_forward_hook(keep_input) for m in layers]
    hooks += [m.register_full_backward_hook(keep_dy) for m in layers]
    x = torch.randn(2, 3, 64, 64).to(device=device, memory_format=torch.channels_last)
    x.requires_grad_()
    launched = spy_on_launches(monkeypatch)
    try:
        with torch.autocast(device, dtype=torch.bfloat16):
            y = model(x)
        y.float().square().sum().backward()
    finally:
        for h in hooks:
            h.remove()
    assert set(seen) == set(layers)
    # Each layer's three passes ran kernels (sum_slots may follow WGrad's).
    passes = ("conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad")
    assert all(launched.count(p) == len(layers) for p in passes), launched

    eps = torch.finfo(torch.bfloat16).eps
    for i, m in enumerate(layers):
        rec = seen[m]
        assert rec["y"].dtype == torch.bfloat16
        assert rec["dy"].abs().max() > 0, f"layer {i} gets no gradient to check"
        x64 = rec["x"].to(torch.bfloat16).double().requires_grad_()  # as autocast hands it over
        w64 = m.weight.detach().cpu().to(torch.bfloat16).double().requires_grad_()
        y64 = F.conv2d(x64, w64, None, 1, m._spio_padding, 1, m.groups)
        if m.bias is not None:
            y64 = y64 + m.bias.detach().cpu().double().view(1, -1, 1, 1)
        scale = y64.abs().max().item()
        torch.testing.assert_close(
            rec["y"].double(), y64, atol=4 * eps * scale, rtol=4 * eps, msg=f"layer {i} y"
        )
        dx64, dw64 = torch.autograd.grad(y64, (x64, w64), rec["dy"].double())
        dx_scale = dx64.abs().max().item()
        torch.testing.assert_close(
            rec["dx"].double(), dx64, atol=4 * eps * dx_scale, rtol=4 * eps, msg=f"layer {i} dx"
        )
        # Summed in fp32, then rounded to bf16 as the op hands it back to autocast's cast.
        dw_scale = dw64.abs().max().item()
        torch.testing.assert_close(
            m.weight.grad.cpu().double(),
            dw64,
            atol=2 * eps * dw_scale,
            rtol=eps,
            msg=f"layer {i} dw",
        )
