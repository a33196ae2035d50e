"""PyTorch-facing ops: importing this package registers the spio:: custom ops with torch.library."""

from .conv2d_gw8_op import conv2d_gw8_backward
from .eager import conv2d_gw8  # the op, without its dispatch cost in plain eager mode

__all__ = ["conv2d_gw8", "conv2d_gw8_backward"]
