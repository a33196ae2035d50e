"""Test tolerances derived from accumulation depth and dtypes, instead of hand-picked constants.

Model of a kernel's error. The kernels compute out = round_out(sum_{i<D} a_i * b_i [+ bias]) with
a_i, b_i already fp16/bf16 and the sum in fp32 (the reference sees the same rounded inputs,
cast to float64, so input rounding is not part of the error). Then:

1. Products are exact: an fp16 x fp16 product has 22 significant bits and bf16 x bf16 16, both
   within fp32's 24.
2. Each of the D fp32 additions rounds with relative error at most u = eps32 / 2 of the partial sum.
   With zero-mean random inputs of term scale sigma = rms(a) * rms(b), partial sums have size about
   sqrt(k) * sigma. Round-to-nearest errors would add up like a random walk, but tensor cores may
   truncate (all errors one sign), so we budget the biased case: sum_k u * sqrt(k) * sigma
   <= u * D**1.5 * sigma. That is absolute, hence `atol`.
3. The single rounding of the result to the output dtype is at most eps_out / 2 relative, so
   `rtol = eps_out` (twice that, for the bias add and slack); below the smallest normal number
   the output's spacing stops shrinking (fp16's subnormals are 2**-24 apart), so `atol` adds
   that spacing, twice the half-spacing a rounding may err by. Small outputs (gradients of
   size 1e-4 and less in fp16) had failed correct kernels, even the reference rounded to fp16.

`safety` multiplies atol. For FProp with fp16 output the atol term is tiny and rtol dominates; for
WGrad (fp32 output, depth N*P*Q) atol dominates. A wrong tap, channel or row changes outputs by
O(sigma * sqrt(depth)) and fails by orders of magnitude. The biased budget grows as D**1.5
against outputs of size sqrt(D) * sigma: fine for the test and check layers (WGrad's largest,
D = 16,384, allows 0.25 sigma against |dw| ~ 128 sigma), loose at training sizes (N = 128 at
64x64, D ~ 5e5: ~6 % of |dw|, where one image row missing from dw changes it by less), so the
kernels' correctness rests on the small layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spio.kernels.conv2d_gw8_params import GROUP_WIDTH, Conv2dGw8Params, torch_dtype


@dataclass(frozen=True)
class Tolerance:
    """atol and rtol for assert_close: |actual - expected| <= atol + rtol * |expected|."""

    atol: float
    rtol: float

    def assert_close(self, actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
        """Compare actual (any dtype) with a float64 expected tensor under this tolerance."""
        torch.testing.assert_close(
            actual.to(torch.float64),
            expected.to(torch.float64),
            atol=self.atol,
            rtol=self.rtol,
            msg=(lambda default: f"{msg}\n{default}\n{self}") if msg else None,
        )


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def accumulation_tolerance(
    out_dtype: torch.dtype,
    depth: int,
    scale: float,
    acc_dtype: torch.dtype = torch.float32,
    safety: float = 2.0,
) -> Tolerance:
    """Tolerance for sums of `depth` products of term size `scale`, accumulated in acc_dtype.

    atol = safety * eps(acc) / 2 * depth**1.5 * scale (biased accumulation error) plus the
    spacing of out_dtype's subnormals; rtol = eps(out_dtype) (final rounding). See the module
    docstring for the reasoning.
    """
    if depth < 1:
        raise ValueError(f"accumulation_tolerance needs depth >= 1, got {depth}")
    if not scale > 0:
        raise ValueError(f"accumulation_tolerance needs a positive scale, got {scale}")
    atol = safety * _eps(acc_dtype) / 2 * depth**1.5 * scale
    return Tolerance(atol=atol + torch.finfo(out_dtype).smallest_normal * _eps(out_dtype),
                     rtol=_eps(out_dtype))  # fmt: skip


def _rms(t: torch.Tensor) -> float:
    """The root mean square of t's finite elements (0 where none is): an inf or NaN placed in
    an input must not make the tolerance infinite, which would pass any finite error."""
    finite = t.to(torch.float64)
    finite = finite[finite.isfinite()]
    return math.sqrt(finite.square().mean().item()) if finite.numel() else 0.0


def conv2d_gw8_depth(params: Conv2dGw8Params, pass_: str) -> int:
    """Products summed into one output element: 8*R*S for FProp and DGrad, N*P*Q for WGrad."""
    if pass_ in ("fprop", "dgrad"):
        return GROUP_WIDTH * params.r * params.s
    if pass_ == "wgrad":
        return params.n * params.p * params.q
    raise ValueError(f"pass must be one of fprop, dgrad, wgrad, got {pass_!r}")


def conv2d_gw8_tolerance(
    params: Conv2dGw8Params,
    pass_: str,
    a: torch.Tensor,
    b: torch.Tensor,
    safety: float = 2.0,
    out_dtype: torch.dtype | None = None,
) -> Tolerance:
    """Tolerance for one kernel pass whose product operands are a and b.

    FProp: a = x, b = w; DGrad: a = dy, b = w; WGrad: a = x, b = dy. Outputs are in the
    activation dtype, except WGrad, whose dw is fp32 unless `out_dtype` says otherwise (a half
    model's gradients, rounded once). Assumes zero-mean random inputs.
    """
    depth = conv2d_gw8_depth(params, pass_)
    if out_dtype is None:
        out_dtype = torch.float32 if pass_ == "wgrad" else torch_dtype(params.dtype)
    scale = max(_rms(a) * _rms(b), torch.finfo(torch.float32).tiny)
    return accumulation_tolerance(out_dtype, depth, scale, safety=safety)
