"""The table of kernel families: adding a kernel family means adding one entry here."""

from __future__ import annotations

from collections.abc import Callable

from . import conv2d_gw8_factory as fprop_dgrad
from . import conv2d_gw8_wgrad_factory as wgrad
from .conv2d_gw8_params import Conv2dGw8Params
from .kernel import Kernel


def _fprop(params: Conv2dGw8Params) -> list[Kernel]:
    return [fprop_dgrad.make_kernel(params, c) for c in fprop_dgrad.configs(params)]


def _dgrad(params: Conv2dGw8Params) -> list[Kernel]:
    return [
        fprop_dgrad.make_kernel(params, c, igrad=True)
        for c in fprop_dgrad.configs(params, igrad=True)
    ]


def _wgrad(params: Conv2dGw8Params) -> list[Kernel]:
    return [wgrad.make_kernel(params, c) for c in wgrad.configs(params)]


#: family name -> every kernel (one per tile config) of that family for a layer.
KERNEL_FAMILIES: dict[str, Callable[[Conv2dGw8Params], list[Kernel]]] = {
    "conv2d_gw8_fprop": _fprop,
    "conv2d_gw8_dgrad": _dgrad,
    "conv2d_gw8_wgrad": _wgrad,
}
