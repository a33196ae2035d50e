"""Kernel-side Python: layer params, stats, and (later) configs, factories and the kernel cache.

Importing this package does not import torch or touch the GPU.
"""

from .conv2d_gw8_params import Conv2dGw8Params
from .stats import Conv2dStats

__all__ = ["Conv2dGw8Params", "Conv2dStats"]
