"""Derived tolerances accept a faithful fp32-accumulating kernel and reject typical kernel bugs."""

import pytest
import torch
import torch.nn.functional as F

from spio.kernels import Conv2dGw8Params
from spio.reference import (
    Tolerance,
    accumulation_tolerance,
    conv2d_gw8_depth,
    conv2d_gw8_dgrad_ref,
    conv2d_gw8_fprop_ref,
    conv2d_gw8_tolerance,
    conv2d_gw8_wgrad_ref,
)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _inputs(params, seed):
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[params.dtype]
    x = torch.randn(params.input_shape, generator=gen).to(dt)
    w = torch.randn(params.weight_shape, generator=gen).to(dt)
    dy = torch.randn(params.output_shape, generator=gen).to(dt)
    return x, w, dy


def _emulated_kernel(params, x, w, dy):
    """What a correct kernel produces: fp32 accumulation of the rounded inputs, rounded output."""
    g = params.groups
    pad = params.padding
    x32, w32, dy32 = x.float(), w.float(), dy.float()
    y = F.conv2d(x32, w32, padding=pad, groups=g).to(x.dtype)
    dx = torch.nn.grad.conv2d_input(x.shape, w32, dy32, padding=pad, groups=g).to(x.dtype)
    dw = torch.nn.grad.conv2d_weight(x32, w.shape, dy32, padding=pad, groups=g)
    return y, dx, dw


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(2, 16, 9, 7, 1, 3, 3), (3, 8, 6, 10, (2, 0), 5, 1)])
def test_faithful_kernel_passes_and_bugs_fail(dtype, shape):
    n, c, h, w_, pad, r, s = shape
    params = Conv2dGw8Params(n, c, h, w_, pad, r, s, dtype=dtype)
    x, w, dy = _inputs(params, seed=hash(shape) % 1000)
    y, dx, dw = _emulated_kernel(params, x, w, dy)

    tol_f = conv2d_gw8_tolerance(params, "fprop", x, w)
    tol_d = conv2d_gw8_tolerance(params, "dgrad", dy, w)
    tol_w = conv2d_gw8_tolerance(params, "wgrad", x, dy)
    y_ref = conv2d_gw8_fprop_ref(x, w, None, pad)
    dx_ref = conv2d_gw8_dgrad_ref(dy, w, pad, (h, w_))
    dw_ref = conv2d_gw8_wgrad_ref(x, dy, pad, r, s)
    tol_f.assert_close(y, y_ref)
    tol_d.assert_close(dx, dx_ref)
    tol_w.assert_close(dw, dw_ref)

    # A missing filter tap, a zeroed output row, a transposed tap (the DGrad bug), a rounded dw.
    w_missing = w.clone()
    w_missing[..., r // 2, s // 2] = 0
    with pytest.raises(AssertionError):
        tol_f.assert_close(_emulated_kernel(params, x, w_missing, dy)[0], y_ref)
    y_bad = y.clone()
    y_bad[:, :, -1] = 0
    with pytest.raises(AssertionError):
        tol_f.assert_close(y_bad, y_ref)
    w_t = w.reshape(c // 8, 8, 8, r, s).transpose(1, 2).reshape(w.shape)
    with pytest.raises(AssertionError):
        tol_d.assert_close(_emulated_kernel(params, x, w_t, dy)[1], dx_ref)
    with pytest.raises(AssertionError):
        tol_w.assert_close(dw.to(torch.float16), dw_ref)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("scale", [1e-3, 1e-4, 1e-6])
def test_small_outputs_correctly_rounded_pass(dtype, scale):
    """Outputs near or below the output dtype's smallest normal number are rounded on a fixed
    grid (fp16's subnormals, 2**-24 apart), not a relative one: the float64 reference rounded
    to fp16 had failed at input scale 1e-4 (9 x the tolerance) with no absolute floor. A
    missing tap still fails."""
    params = Conv2dGw8Params(2, 16, 8, 8, dtype=dtype)
    x, w, dy = (t * scale for t in _inputs(params, seed=5))
    x, w, dy = x.to(DTYPES[dtype]), w.to(DTYPES[dtype]), dy.to(DTYPES[dtype])
    y_ref = conv2d_gw8_fprop_ref(x, w, None, 1)
    dx_ref = conv2d_gw8_dgrad_ref(dy, w, 1, (8, 8))
    tol_f = conv2d_gw8_tolerance(params, "fprop", x, w)
    tol_f.assert_close(y_ref.to(x.dtype), y_ref)
    conv2d_gw8_tolerance(params, "dgrad", dy, w).assert_close(dx_ref.to(x.dtype), dx_ref)
    if scale >= 1e-4:  # (at 1e-6 the products themselves are below fp16's grid)
        w_missing = w.clone()
        w_missing[..., 1, 1] = 0
        with pytest.raises(AssertionError):
            tol_f.assert_close(conv2d_gw8_fprop_ref(x, w_missing, None, 1), y_ref)


def test_tolerance_is_tight_for_fprop():
    params = Conv2dGw8Params(2, 16, 8, 8)
    x, w, _ = _inputs(params, seed=3)
    tol = conv2d_gw8_tolerance(params, "fprop", x, w)
    # Output rms is about sqrt(72); the bound must stay below 1 % of it.
    assert tol.atol < 1e-4 * 72**0.5
    assert tol.rtol == torch.finfo(torch.float16).eps


def test_accumulation_tolerance_formula():
    tol = accumulation_tolerance(torch.bfloat16, depth=100, scale=2.0, safety=3.0)
    assert tol.rtol == 2.0**-7
    assert tol.atol == pytest.approx(3.0 * 2.0**-24 * 1000 * 2.0)


def test_pass_tolerance_from_depth_output_dtype_and_operand_rms():
    # P = 6, Q = 3: WGrad sums N*P*Q = 36 products, FProp 8*R*S = 72; rms(a) * rms(b) = 2 * 3.
    params = Conv2dGw8Params(2, 16, 6, 5, padding=(1, 0), r=3, s=3, dtype="bf16")
    a = torch.full((2, 16, 6, 5), -2.0, dtype=torch.bfloat16)
    b = torch.full((16, 8, 3, 3), 3.0, dtype=torch.bfloat16)
    fprop = conv2d_gw8_tolerance(params, "fprop", a, b)
    assert fprop.rtol == 2.0**-7  # bf16 output
    assert fprop.atol == pytest.approx(2.0 * 2.0**-24 * 72**1.5 * 6)
    wgrad = conv2d_gw8_tolerance(params, "wgrad", a, b)
    assert wgrad.rtol == 2.0**-23  # dw is fp32, whatever the activations are
    assert wgrad.atol == pytest.approx(2.0 * 2.0**-24 * 216 * 6)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_operand_leaves_the_tolerance_finite(bad):
    """The operands' scale is that of their finite elements: one inf had made atol infinite
    (any finite error passed) and one NaN raised."""
    params = Conv2dGw8Params(2, 16, 6, 5, padding=(1, 0), r=3, s=3, dtype="bf16")
    a = torch.full((2, 16, 6, 5), -2.0, dtype=torch.bfloat16)
    b = torch.full((16, 8, 3, 3), 3.0, dtype=torch.bfloat16)
    want = conv2d_gw8_tolerance(params, "fprop", a, b)
    a[0, 0, 0, 0] = bad
    assert conv2d_gw8_tolerance(params, "fprop", a, b) == want


def test_depth():
    params = Conv2dGw8Params(4, 32, 10, 12, padding=(0, 1), r=3, s=5)
    assert conv2d_gw8_depth(params, "fprop") == 8 * 15
    assert conv2d_gw8_depth(params, "dgrad") == 8 * 15
    assert conv2d_gw8_depth(params, "wgrad") == 4 * 8 * 10
    with pytest.raises(ValueError, match="got 'x'"):
        conv2d_gw8_depth(params, "x")


@pytest.mark.parametrize("depth, scale", [(0, 1.0), (4, 0.0), (4, float("nan"))])
def test_accumulation_tolerance_rejects(depth, scale):
    with pytest.raises(ValueError):
        accumulation_tolerance(torch.float16, depth, scale)


def test_assert_close_message():
    with pytest.raises(AssertionError, match="layer L3"):
        Tolerance(1e-3, 0.0).assert_close(
            torch.ones(3), torch.zeros(3, dtype=torch.float64), "layer L3"
        )
