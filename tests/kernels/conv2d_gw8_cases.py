"""Shared cases for the conv2d_gw8 kernel tests: layers, config samples, and one checked run.

Layers are small enough for the CPU emulator yet cover what the kernels must get right: all
filter sizes, padding 0, R//2 and larger than R (negative DGrad padding), odd sizes, images
smaller than a tile, several groups per block with a partial last block, bias, fp16 and bf16.
"""

from __future__ import annotations

import random

import torch

from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels import conv2d_gw8_wgrad_factory as wg
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.reference import (
    conv2d_gw8_bias_grad_ref,
    conv2d_gw8_dgrad_ref,
    conv2d_gw8_fprop_ref,
    conv2d_gw8_wgrad_ref,
)
from spio.reference.tolerance import conv2d_gw8_tolerance

P = Conv2dGw8Params

#: Layers every CI run emulates (each with its default config and sampled configs).
CI_LAYERS = [
    P(n=1, c=16, h=6, w=5, padding=1, r=3, s=3, has_bias=True),
    P(n=2, c=8, h=9, w=20, padding=(0, 2), r=1, s=5),
    P(n=1, c=24, h=7, w=19, padding=4, r=3, s=3),  # padding > R: DGrad pads by R-1-4 < 0
    P(n=1, c=16, h=11, w=10, padding=(2, 1), r=5, s=2, dtype="bf16", has_bias=True),
    P(n=1, c=40, h=5, w=33, padding=(1, 0), r=2, s=4),  # 5 groups: partial group blocks
    P(n=2, c=8, h=4, w=4, padding=0, r=4, s=1, dtype="bf16"),
]

#: Wider sweep for `pytest -m slow`: every filter size and more shapes.
SLOW_LAYERS = [
    P(n=1, c=16, h=9, w=11, padding=(r // 2, s // 2), r=r, s=s, dtype=dtype, has_bias=bias)
    for r in range(1, 6)
    for s in range(1, 6)
    for dtype, bias in (("fp16", r % 2 == 1), ("bf16", s % 2 == 0))
] + [
    P(n=3, c=64, h=20, w=19, padding=1, r=3, s=3, has_bias=True),
    P(n=1, c=8, h=49, w=33, padding=2, r=5, s=5),
    P(n=2, c=128, h=6, w=5, padding=6, r=3, s=3, dtype="bf16"),
]


def sample_configs(configs: list, default, count: int, seed: int) -> list:
    """The default config plus `count` others drawn reproducibly."""
    others = [c for c in configs if c != default]
    return [default] + random.Random(seed).sample(others, min(count, len(others)))


def _torch_dtype(params: Conv2dGw8Params) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[params.dtype]


def make_inputs(params: Conv2dGw8Params, device: str, seed: int = 0):
    """Random x, w, bias and dy (never zeros) in the layer's dtype; bias fp32."""
    gen = torch.Generator().manual_seed(seed)
    dtype = _torch_dtype(params)
    x = torch.randn(params.input_shape, generator=gen).to(dtype)
    w = (torch.randn(params.weight_shape, generator=gen) / 3).to(dtype)
    dy = torch.randn(params.output_shape, generator=gen).to(dtype)
    bias = torch.randn(params.c, generator=gen) if params.has_bias else None
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return move(x), move(w), move(bias), move(dy)


def _poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device).contiguous(
        memory_format=torch.channels_last
    )


def check_fprop(params: Conv2dGw8Params, config, device: str, seed: int = 0) -> None:
    x, w, bias, _ = make_inputs(params, device, seed)
    out = _poisoned(params.output_shape, x.dtype, device)
    fd.fprop(x, w, bias, params, config, out=out)
    expected = conv2d_gw8_fprop_ref(
        x.cpu(), w.cpu(), None if bias is None else bias.cpu(), params.padding
    )
    tol = conv2d_gw8_tolerance(params, "fprop", x.cpu(), w.cpu())
    tol.assert_close(out.cpu(), expected, msg=f"fprop {params.encode()} {config}")


def check_dgrad(params: Conv2dGw8Params, config, device: str, seed: int = 0) -> None:
    _, w, _, dy = make_inputs(params, device, seed)
    out = _poisoned(params.input_shape, dy.dtype, device)
    fd.dgrad(dy, w, params, config, out=out)
    expected = conv2d_gw8_dgrad_ref(dy.cpu(), w.cpu(), params.padding, (params.h, params.w))
    tol = conv2d_gw8_tolerance(params, "dgrad", dy.cpu(), w.cpu())
    tol.assert_close(out.cpu(), expected, msg=f"dgrad {params.encode()} {config}")


def check_wgrad(params: Conv2dGw8Params, config, device: str, seed: int = 0) -> None:
    x, _, _, dy = make_inputs(params, device, seed)
    dw, dbias = wg.wgrad(x, dy, params, config)
    expected = conv2d_gw8_wgrad_ref(x.cpu(), dy.cpu(), params.padding, params.r, params.s)
    tol = conv2d_gw8_tolerance(params, "wgrad", x.cpu(), dy.cpu())
    tol.assert_close(dw.cpu(), expected, msg=f"wgrad {params.encode()} {config}")
    if params.has_bias:
        expected_bias = conv2d_gw8_bias_grad_ref(dy.cpu())
        bias_tol = conv2d_gw8_tolerance(params, "wgrad", dy.cpu(), torch.ones(1))
        bias_tol.assert_close(dbias.cpu(), expected_bias, msg=f"dbias {params.encode()} {config}")
    else:
        assert dbias is None
