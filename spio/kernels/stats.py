"""Bytes that must move and FLOPs per pass of a conv2d_gw8 layer, for effective-bandwidth figures.

"Bytes that must move" counts each tensor a pass reads or writes exactly once: what an ideal kernel
would transfer to and from DRAM. Effective bandwidth = those bytes / measured kernel time, so a
kernel that re-reads halos or spills shows up as lower bandwidth.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from . import conv2d_gw8_params
from .conv2d_gw8_params import (
    ACTIVATION_BYTES,
    FP32_BYTES,
    GROUP_WIDTH,
    Conv2dGw8Params,
    check_params,
)

#: The three passes of training, by name.
PASSES = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True)
class Conv2dStats:
    """Bytes moved and FLOPs of FProp, DGrad and WGrad for one `Conv2dGw8Params`."""

    params: Conv2dGw8Params

    def __post_init__(self) -> None:
        check_params(self.params, "Conv2dStats")

    @property
    def input_bytes(self) -> int:
        """Size of x (or dx) in bytes."""
        return math.prod(self.params.input_shape) * ACTIVATION_BYTES

    @property
    def output_bytes(self) -> int:
        """Size of y (or dy) in bytes."""
        return math.prod(self.params.output_shape) * ACTIVATION_BYTES

    @property
    def weight_elements(self) -> int:
        return math.prod(self.params.weight_shape)

    @property
    def weight_bytes(self) -> int:
        """Size of w in the activation dtype."""
        return self.weight_elements * ACTIVATION_BYTES

    @property
    def weight_grad_bytes(self) -> int:
        """Size of dw counted in fp32, whatever dtype spio writes it in (the weight's, as PyTorch
        does; the performance models' features were made with this count)."""
        return conv2d_gw8_params.weight_grad_bytes(self.params)

    @property
    def bias_bytes(self) -> int:
        """Size of the fp32 bias, or 0 without one."""
        return self.params.c * FP32_BYTES if self.params.has_bias else 0

    @property
    def fprop_bytes(self) -> int:
        """FProp reads x, w (and bias) and writes y."""
        return self.input_bytes + self.weight_bytes + self.output_bytes + self.bias_bytes

    @property
    def dgrad_bytes(self) -> int:
        """DGrad reads dy and w and writes dx."""
        return self.output_bytes + self.weight_bytes + self.input_bytes

    @property
    def wgrad_bytes(self) -> int:
        """WGrad reads x and dy and writes dw (and dbias; fp32)."""
        return self.input_bytes + self.output_bytes + self.weight_grad_bytes + self.bias_bytes

    @property
    def macs(self) -> int:
        """Multiply-accumulates of one pass: every output element sums 8 * R * S products."""
        p = self.params
        return p.n * p.p * p.q * p.c * GROUP_WIDTH * p.r * p.s

    @property
    def flops(self) -> int:
        """FLOPs of one pass (2 per multiply-accumulate); the same for all three passes."""
        return 2 * self.macs

    def bytes(self, pass_: str) -> int:
        """Bytes that must move in pass_ ("fprop", "dgrad" or "wgrad")."""
        return getattr(self, f"{_check_pass(pass_)}_bytes")

    def arithmetic_intensity(self, pass_: str) -> float:
        """FLOPs per byte moved in pass_."""
        return self.flops / self.bytes(pass_)

    def effective_bandwidth(self, seconds: float, pass_: str) -> float:
        """Bytes per second of pass_ when its kernel took `seconds`."""
        return self.bytes(pass_) / _check_seconds(seconds, "effective_bandwidth")

    def throughput(self, seconds: float, pass_: str) -> float:
        """FLOP/s of pass_ when its kernel took `seconds`."""
        seconds = _check_seconds(seconds, "throughput")
        _check_pass(pass_)
        return self.flops / seconds


def _check_seconds(seconds: Any, where: str) -> float:
    """`seconds` if it is a positive time: TypeError for what is not a real number (a string, None,
    a bool), ValueError for zero, negatives and NaN."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"{where} needs seconds as a number, got {seconds!r}")
    value = float(seconds)
    if not value > 0:
        raise ValueError(f"{where} needs a positive time, got {seconds}")
    return value


def _check_pass(pass_: str) -> str:
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {', '.join(PASSES)}, got {pass_!r}")
    return pass_
