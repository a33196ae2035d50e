"""PyTorch-facing ops: importing this package registers the spio:: custom ops with torch.library."""

from .conv2d_gw8_op import conv2d_gw8_backward
from .eager import conv2d_gw8  # the op, without its dispatch cost in plain eager mode
from .onnx_export import onnx_translations

__all__ = ["conv2d_gw8", "conv2d_gw8_backward", "onnx_translations"]
