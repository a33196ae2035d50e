"""ONNX export of spio's convolutions, which have no ONNX translation of their own.

While torch.onnx.export runs (either exporter), a Conv2dGw8 layer or a
spio.functional.conv2d_gw8 call records PyTorch's convolution, an ONNX Conv, instead of spio's op
(`onnx_exporting`, `exported_conv2d`). A graph that already holds the op (an ExportedProgram made
with torch.export.export) exports with `onnx_translations()` as the exporter's
custom_translation_table.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from spio.kernels.conv2d_gw8_params import GROUP_WIDTH

from . import _kernels
from ._kernels import check_passes
from .checks import autocast_operands, check_args


def onnx_exporting() -> bool:
    """True while torch.onnx.export runs, with either of its exporters (dynamo's from torch 2.7,
    or TorchScript's). A dict lookup where torch.onnx was never imported (no export can be
    running). Dynamo's own tracing reads it as False: where the dynamo exporter falls back to
    strict tracing, the graph holds spio's op (onnx_translations translates it)."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


def exported_conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: int,
    padding_y: int,
    padding_x: int,
    dilation: int,
    groups: int,
    passes: int,
) -> Tensor:
    """What torch.onnx.export records for a conv2d_gw8 call: inside an autocast region, the
    operands cast as the op's autocast kernel casts them; the op's argument checks; then
    PyTorch's convolution (the bias cast to the input's dtype)."""
    check_passes(passes)
    input, weight, bias = autocast_operands(input, weight, bias)
    check_args(input, weight, bias, stride, padding_y, padding_x, dilation, groups)
    return _kernels.torch_fprop(input, weight, bias, (padding_y, padding_x))


def onnx_translations() -> dict[Any, Callable[..., Any]]:
    """The custom_translation_table for torch.onnx.export (dynamo=True) of a graph holding
    spio's op, e.g. an ExportedProgram: torch.ops.spio.conv2d_gw8 as an ONNX Conv (opset 18,
    `group` = C / 8; the bias cast to the input's type). Needs onnxscript, as that exporter does.

        program = torch.export.export(model, (x,))
        torch.onnx.export(program, custom_translation_table=spio.functional.onnx_translations())
    """
    from onnxscript import opset18 as op

    def conv2d_gw8(input, weight, bias=None, stride=1, padding_y=0, padding_x=0, dilation=1,
                   groups=1, passes=7):  # fmt: skip
        # The exported graph's arguments were checked when it was made (the op's fake impl).
        group = weight.shape[0] // GROUP_WIDTH
        pads = [padding_y, padding_x, padding_y, padding_x]
        if bias is None:
            return op.Conv(input, weight, group=group, pads=pads)
        return op.Conv(input, weight, op.CastLike(bias, input), group=group, pads=pads)

    return {torch.ops.spio.conv2d_gw8.default: conv2d_gw8}
