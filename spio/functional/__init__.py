"""PyTorch-facing ops: importing this package registers the spio:: custom ops with torch.library."""

from .conv2d_gw8_op import conv2d_gw8, conv2d_gw8_backward

__all__ = ["conv2d_gw8", "conv2d_gw8_backward"]
