"""nn.Module classes that run spio's kernels, and make_conv2d. Importing this imports torch."""

from .conv2d_gw8 import Conv2dGw8, make_conv2d

__all__ = ["Conv2dGw8", "make_conv2d"]
