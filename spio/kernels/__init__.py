"""Kernel-side Python: layer params, stats, configs, kernel factories and the kernel cache.

Importing this package does not import torch or touch the GPU; the factories load on first access.
"""

import importlib
from typing import TYPE_CHECKING

from .conv2d_gw8_params import Conv2dGw8Params
from .stats import Conv2dStats

if TYPE_CHECKING:  # the names __getattr__ loads, as type checkers should see them
    from .conv2d_gw8_factory import conv2d_gw8_kernel_factory as conv2d_gw8_kernel_factory
    from .conv2d_gw8_wgrad_factory import (
        conv2d_gw8_wgrad_kernel_factory as conv2d_gw8_wgrad_kernel_factory,
    )

_LAZY = {
    "conv2d_gw8_kernel_factory": ".conv2d_gw8_factory",
    "conv2d_gw8_wgrad_kernel_factory": ".conv2d_gw8_wgrad_factory",
}

__all__ = ["Conv2dGw8Params", "Conv2dStats", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
