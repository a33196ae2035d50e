"""The backward pass lays out an output gradient that is not NHWC once for both of its kernels
(emulated): DGrad and WGrad read the same NHWC copy of dy. Each had made its own, a second full
pass over dy on a GPU; a dy in another layout is common (a `.float()` or a reduction after the
layer passes its gradient back contiguous)."""

import torch
import torch.nn.functional as F

from spio.kernels.kernel import Kernel
from spio.layers import Conv2dGw8


def _dy_arguments(monkeypatch) -> dict[str, list[torch.Tensor]]:
    """The dy each DGrad and WGrad launch reads, by family, from now on. The tensors are kept:
    comparing addresses of freed copies would prove nothing (the allocator reuses them)."""
    seen: dict[str, list[torch.Tensor]] = {"conv2d_gw8_dgrad": [], "conv2d_gw8_wgrad": []}
    launch = Kernel.launch

    def spy(self, args, device):
        family = self.name.split("__")[0]
        if family in seen:  # DGrad: (dx, dy, w, bias, n); WGrad: (dw, dbias, x, dy, n)
            seen[family].append(args[1] if family == "conv2d_gw8_dgrad" else args[3])
        return launch(self, args, device)

    monkeypatch.setattr(Kernel, "launch", spy)
    return seen


def _storage(t: torch.Tensor) -> tuple[int, int]:
    return t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()


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
    (dgrad_dy,), (wgrad_dy,) = seen["conv2d_gw8_dgrad"], seen["conv2d_gw8_wgrad"]
    assert dgrad_dy is wgrad_dy  # one copy, read by both
    assert _storage(dgrad_dy) != _storage(dy)  # (a copy: dy was not NHWC)
    assert dgrad_dy.is_contiguous(memory_format=torch.channels_last)
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
    assert seen["conv2d_gw8_dgrad"][0] is seen["conv2d_gw8_wgrad"][0] is dy


def test_a_chunked_backward_lays_out_dy_a_chunk_at_a_time(monkeypatch):
    """Where activations pass MAX_TENSOR_BYTES the batch runs in chunks: each chunk's kernels read
    an NHWC copy of that chunk's slice of dy, never a copy of all of it (which would hold the
    whole dy again in memory through every chunk)."""
    from spio.functional import _kernels

    monkeypatch.setenv("SPIO_EMULATE", "1")
    conv = Conv2dGw8(16, 16, 3, padding=1, groups=2).half().to(memory_format=torch.channels_last)
    x = torch.randn(4, 16, 6, 7, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    image = 16 * 6 * 7 * 2
    monkeypatch.setattr(_kernels, "MAX_TENSOR_BYTES", image)  # one image a chunk
    # (A store of its own: the layers keyed by the call's signature, not by the limit, would
    # keep a chunked one for every later test of the process, or give this test a whole one.)
    monkeypatch.setattr(_kernels, "_layers", {})
    dy = torch.randn(4, 16, 6, 7, dtype=torch.float16)  # NCHW
    seen = _dy_arguments(monkeypatch)
    conv(x).backward(dy)
    read = seen["conv2d_gw8_dgrad"] + seen["conv2d_gw8_wgrad"]
    assert len(read) == 8  # 4 chunks, 2 kernels each
    assert all(t.shape[0] == 1 and t.untyped_storage().nbytes() == image for t in read)
