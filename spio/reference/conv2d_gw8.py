"""Float64 references for FProp, DGrad and WGrad of the group-width-8 stride-1 convolution.

Layout: every tensor is NCHW-shaped, as PyTorch shapes them: x (N, C, H, W), dy (N, K, P, Q),
weight (K, 8, R, S) with K == C, bias (K,). Any memory format is accepted (channels_last
included, which is how the kernels store NHWC); results are contiguous float64 tensors.

The references compute the sums directly, one filter tap at a time, instead of calling F.conv2d,
so that tests comparing them with F.conv2d and autograd check two independent implementations.
Inputs are cast to float64 before any arithmetic, so a test that feeds the kernel fp16 tensors and
the reference the same tensors measures only the kernel's accumulation and output rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GROUP_WIDTH = 8


def _pair(padding: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(padding, int):
        return (padding, padding)
    pad_h, pad_w = padding
    return (int(pad_h), int(pad_w))


def _grouped(t: torch.Tensor) -> torch.Tensor:
    """View (N, C, H, W) as float64 (N, G, 8, H, W)."""
    n, c, h, w = t.shape
    if c % GROUP_WIDTH:
        raise ValueError(f"conv2d_gw8 reference needs channels a multiple of 8, got {c}")
    return t.to(torch.float64).reshape(n, c // GROUP_WIDTH, GROUP_WIDTH, h, w)


def _grouped_weight(weight: torch.Tensor) -> torch.Tensor:
    """View weight (K, 8, R, S) as float64 (G, 8 out, 8 in, R, S)."""
    k, group_width, r, s = weight.shape
    if group_width != GROUP_WIDTH or k % GROUP_WIDTH:
        raise ValueError(
            f"conv2d_gw8 reference needs weight (K, 8, R, S) with K a multiple of 8, "
            f"got {tuple(weight.shape)}"
        )
    return weight.to(torch.float64).reshape(k // GROUP_WIDTH, GROUP_WIDTH, GROUP_WIDTH, r, s)


def _ungrouped(t: torch.Tensor) -> torch.Tensor:
    n, g, c8, h, w = t.shape
    return t.reshape(n, g * c8, h, w).contiguous()


def conv2d_gw8_fprop_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    padding: int | tuple[int, int] = 1,
) -> torch.Tensor:
    """y[n, k, p, q] = bias[k] + sum_{c, r, s} w[k, c, r, s] x[n, c, p + r - ph, q + s - pw].

    c runs over the 8 channels of the group of k.

    x is (N, C, H, W), w (C, 8, R, S); returns float64 (N, C, P, Q).
    """
    pad_h, pad_w = _pair(padding)
    wg = _grouped_weight(w)
    _, _, _, r, s = wg.shape
    xp = F.pad(_grouped(x), (pad_w, pad_w, pad_h, pad_h))
    n, g, _, hp, wp = xp.shape
    p, q = hp - r + 1, wp - s + 1
    y = torch.zeros(n, g, GROUP_WIDTH, p, q, dtype=torch.float64, device=x.device)
    for i in range(r):
        for j in range(s):
            y += torch.einsum("gkc,ngcpq->ngkpq", wg[..., i, j], xp[..., i : i + p, j : j + q])
    y = _ungrouped(y)
    if bias is not None:
        y += bias.to(torch.float64).reshape(1, -1, 1, 1)
    return y


def conv2d_gw8_dgrad_ref(
    dy: torch.Tensor,
    w: torch.Tensor,
    padding: int | tuple[int, int],
    input_hw: tuple[int, int],
) -> torch.Tensor:
    """dx = d(sum y * dy)/dx: every output gradient scattered back through every filter tap.

    dy is (N, K, P, Q), w (K, 8, R, S), input_hw the (H, W) of x; returns float64 (N, C, H, W).
    """
    pad_h, pad_w = _pair(padding)
    h, w_in = input_hw
    wg = _grouped_weight(w)
    _, _, _, r, s = wg.shape
    dyg = _grouped(dy)
    n, g, _, p, q = dyg.shape
    if (p, q) != (h + 2 * pad_h - r + 1, w_in + 2 * pad_w - s + 1):
        raise ValueError(
            f"conv2d_gw8 reference: dy of size {p}x{q} does not match input {h}x{w_in}, "
            f"filter {r}x{s}, padding {(pad_h, pad_w)}"
        )
    dxp = torch.zeros(
        n, g, GROUP_WIDTH, h + 2 * pad_h, w_in + 2 * pad_w, dtype=torch.float64, device=dy.device
    )
    for i in range(r):
        for j in range(s):
            dxp[..., i : i + p, j : j + q] += torch.einsum("gkc,ngkpq->ngcpq", wg[..., i, j], dyg)
    return _ungrouped(dxp[..., pad_h : pad_h + h, pad_w : pad_w + w_in])


def conv2d_gw8_wgrad_ref(
    x: torch.Tensor,
    dy: torch.Tensor,
    padding: int | tuple[int, int],
    r: int,
    s: int,
) -> torch.Tensor:
    """dw[k, c, r, s] = sum_{n, p, q} dy[n, k, p, q] x[n, c, p + r - ph, q + s - pw].

    x is (N, C, H, W), dy (N, C, P, Q); returns float64 (C, 8, R, S).
    """
    pad_h, pad_w = _pair(padding)
    xp = F.pad(_grouped(x), (pad_w, pad_w, pad_h, pad_h))
    dyg = _grouped(dy)
    _, g, _, p, q = dyg.shape
    if (p, q) != (xp.shape[-2] - r + 1, xp.shape[-1] - s + 1):
        raise ValueError(
            f"conv2d_gw8 reference: dy of size {p}x{q} does not match input "
            f"{tuple(x.shape[-2:])}, filter {r}x{s}, padding {(pad_h, pad_w)}"
        )
    dw = torch.empty(g, GROUP_WIDTH, GROUP_WIDTH, r, s, dtype=torch.float64, device=x.device)
    for i in range(r):
        for j in range(s):
            dw[..., i, j] = torch.einsum("ngkpq,ngcpq->gkc", dyg, xp[..., i : i + p, j : j + q])
    return dw.reshape(g * GROUP_WIDTH, GROUP_WIDTH, r, s)


def conv2d_gw8_bias_grad_ref(dy: torch.Tensor) -> torch.Tensor:
    """dbias[k] = sum_{n, p, q} dy[n, k, p, q]; returns float64 (K,)."""
    return dy.to(torch.float64).sum(dim=(0, 2, 3))
