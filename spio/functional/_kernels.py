"""TEMPORARY SEAM between the conv2d_gw8 custom ops and spio's CUDA kernels (not built yet).

The custom ops in `spio.functional.conv2d_gw8_op` call these three functions for CUDA tensors, and
for CPU tensors when SPIO_EMULATE=1. The FProp/DGrad and WGrad kernel issues replace the bodies with
kernel launches (via the kernel factories and the emulator); the signatures are the contract:

- The ops have already validated every argument (see `Conv2dGw8Params.from_tensors`): tensors are
  NCHW-shaped, on one device, input/weight/grad_output in params.dtype (fp16 or bf16), bias fp32
  or params.dtype. They may be in any memory format and may be non-contiguous (e.g. an expanded
  grad_output); converting to the layout a kernel needs is the seam's job.
- Each function returns a new tensor of the stated shape on the input's device. Its memory format
  does not matter: the op copies to the format the caller expects only if the strides differ, so
  returning channels_last for channels_last inputs avoids that copy.
- Never return a view of an argument.
"""

from __future__ import annotations

import torch

from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

_NOT_BUILT = "spio's CUDA kernels are not built yet (issue: {})"


def fprop(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    params: Conv2dGw8Params,
) -> torch.Tensor:
    """y = conv2d_gw8(input, weight, bias) in params.dtype, shape params.output_shape."""
    raise NotImplementedError(_NOT_BUILT.format("FProp/DGrad"))


def dgrad(
    grad_output: torch.Tensor,
    weight: torch.Tensor,
    params: Conv2dGw8Params,
) -> torch.Tensor:
    """dx from dy (shape params.output_shape) in params.dtype, shape params.input_shape."""
    raise NotImplementedError(_NOT_BUILT.format("FProp/DGrad"))


def wgrad(
    input: torch.Tensor,
    grad_output: torch.Tensor,
    params: Conv2dGw8Params,
) -> torch.Tensor:
    """dw from x and dy, accumulated and returned in fp32, shape params.weight_shape."""
    raise NotImplementedError(_NOT_BUILT.format("WGrad"))
