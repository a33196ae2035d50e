"""A light eager path to spio's kernels for Conv2dGw8 modules.

A torch.library custom op pays its dispatch (schema parsing, fake-tensor plumbing, autograd
wrapper) on every call, tens of microseconds on a host CPU: comparable to the kernel itself for
small layers. Outside torch.compile, Conv2dGw8 calls this autograd.Function instead, which goes
straight to the same kernel seam (`spio.functional._kernels`). Under torch.compile the module uses
the custom op, whose fake and autograd registrations the compiler needs. Both compute the same
thing; the tests compare them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

from . import _kernels
from .conv2d_gw8_op import check_args, memory_format

# Validated layer parameters by call signature: a model calls each layer with the same shapes
# again and again, and validation costs more than the rest of the host path.
_validated: dict[tuple, Conv2dGw8Params] = {}


def _params(input: Tensor, weight: Tensor, bias: Tensor | None, pad_y: int, pad_x: int):
    key = (
        input.shape,
        input.dtype,
        input.device,
        weight.shape,
        weight.dtype,
        weight.device,
        None if bias is None else (bias.shape, bias.dtype, bias.device),
        pad_y,
        pad_x,
    )
    params = _validated.get(key)
    if params is None:
        check_args(input, weight, bias, 1, pad_y, pad_x, 1, 1)
        params = Conv2dGw8Params.from_tensors(input, weight, bias, padding=(pad_y, pad_x))
        _validated[key] = params
    return params


def _in_format(t: Tensor, fmt: torch.memory_format) -> Tensor:
    """t in memory format fmt (the kernels return channels_last)."""
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


class _Conv2dGw8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None, params: Conv2dGw8Params):
        need_weight = ctx.needs_input_grad[1]
        ctx.save_for_backward(input if need_weight else None, weight)
        ctx.params = params
        ctx.input_format = memory_format(input)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _in_format(_kernels.fprop(input, weight, bias, params), ctx.input_format)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        input, weight = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        params = ctx.params
        dx = dw = db = None
        if need_input:
            dx = _in_format(_kernels.dgrad(grad_output, weight, params), ctx.input_format)
        if need_weight:  # the bias gradient comes from the same pass over dy
            dw, db = _kernels.wgrad(input, grad_output, params, with_bias=need_bias)
            dw = dw.to(weight.dtype)
        if need_bias:
            if db is None:
                db = grad_output.sum(dim=(0, 2, 3), dtype=torch.float32)
            db = db.to(ctx.bias_dtype)
        return dx, dw, db, None


def conv2d_gw8_eager(
    input: Tensor, weight: Tensor, bias: Tensor | None, padding_y: int, padding_x: int
) -> Tensor:
    """spio::conv2d_gw8 for tensors that run spio's kernels, without the custom-op dispatch.

    Autocast is applied as the custom op applies it: input and weight to the region's dtype, bias
    to fp32. Validation is the custom op's own.
    """
    device_type = input.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        input, weight = input.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(torch.float32)
    params = _params(input, weight, bias, padding_y, padding_x)
    return _Conv2dGw8.apply(input, weight, bias, params)
