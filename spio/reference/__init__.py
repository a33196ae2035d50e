"""Float64 PyTorch references for every kernel, and tolerances derived from accumulation depth.

Every kernel test compares against these. Importing this package imports torch.
"""

from .conv2d_gw8 import (
    conv2d_gw8_bias_grad_ref,
    conv2d_gw8_dgrad_ref,
    conv2d_gw8_fprop_ref,
    conv2d_gw8_wgrad_ref,
)
from .tolerance import (
    Tolerance,
    accumulation_tolerance,
    conv2d_gw8_depth,
    conv2d_gw8_tolerance,
)

__all__ = [
    "Tolerance",
    "accumulation_tolerance",
    "conv2d_gw8_bias_grad_ref",
    "conv2d_gw8_depth",
    "conv2d_gw8_dgrad_ref",
    "conv2d_gw8_fprop_ref",
    "conv2d_gw8_tolerance",
    "conv2d_gw8_wgrad_ref",
]
