"""The backward pass lays out an output gradient that is not NHWC once for both of its kernels
(emulated): DGrad and WGrad read the same NHWC copy of dy. Each had made its own, a second full
pass over dy on a GPU; a dy in another layout is common (a `.float()` or a reduction after the
layer passes its gradient back contiguous)."""

import torch
import torch.nn.functional as F

from spio.kernels.kernel import Kernel
from spio.layers import Conv2dGw8


def _dy_arguments(monkeypatch) -> dict[str, list[int]]:
    """data_ptr of the dy each DGrad and WGrad launch reads, by family, from now on."""
    seen: dict[str, list[int]] = {"conv2d_gw8_dgrad": [], "conv2d_gw8_wgrad": []}
    launch = Kernel.launch

    def spy(self, args, device):
        family = self.name.split("__")[0]
        if family in seen:  # DGrad: (dx, dy, w, bias, n); WGrad: (dw, dbias, x, dy, n)
            dy = args[1] if family == "conv2d_gw8_dgrad" else args[3]
            seen[family].append(dy.data_ptr())
        return launch(self, args, device)

    monkeypatch.setattr(Kernel, "launch", spy)
    return seen


def test_backward_lays_out_a_contiguous_dy_once_for_both_kernels(monkeypatch):
    monkeypatch.setenv("SPIO_EMULATE", "1")
    torch.manual_seed(0)
    conv = Conv2dGw8(16, 16, 3, padding=1, groups=2, bias=True).half()
    conv = conv.to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 6, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    dy = torch.randn(2, 16, 6, 7, dtype=torch.float16)  # contiguous (NCHW), not NHWC
    seen = _dy_arguments(monkeypatch)
    conv(x).backward(dy)
    assert len(seen["conv2d_gw8_dgrad"]) == 1 and len(seen["conv2d_gw8_wgrad"]) == 1, seen
    assert seen["conv2d_gw8_dgrad"] == seen["conv2d_gw8_wgrad"]  # one copy, read by both
    assert dy.data_ptr() not in seen["conv2d_gw8_dgrad"]  # (a copy: dy was not NHWC)
    # ... and the gradients are still right.
    xd = x.detach().double().requires_grad_()
    w = conv.weight.detach().double().requires_grad_()
    b = conv.bias.detach().double().requires_grad_()
    F.conv2d(xd, w, b, padding=1, groups=2).backward(dy.double())  # float64 reference
    torch.testing.assert_close(x.grad.double(), xd.grad, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(conv.weight.grad.double(), w.grad, atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(conv.bias.grad.double(), b.grad, atol=5e-2, rtol=2e-2)


def test_an_nhwc_dy_is_read_as_given(monkeypatch):
    monkeypatch.setenv("SPIO_EMULATE", "1")
    conv = Conv2dGw8(16, 16, 3, padding=1, groups=2).half().to(memory_format=torch.channels_last)
    x = torch.randn(1, 16, 5, 4, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    dy = torch.randn(1, 16, 5, 4, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    seen = _dy_arguments(monkeypatch)
    conv(x).backward(dy)
    assert seen["conv2d_gw8_dgrad"] == seen["conv2d_gw8_wgrad"] == [dy.data_ptr()]
