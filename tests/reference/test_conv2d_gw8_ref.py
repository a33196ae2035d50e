"""The float64 references agree with F.conv2d and autograd, on random shapes and memory formats."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from spio.reference import (
    conv2d_gw8_bias_grad_ref,
    conv2d_gw8_dgrad_ref,
    conv2d_gw8_fprop_ref,
    conv2d_gw8_wgrad_ref,
)

shapes = st.fixed_dictionaries(
    {
        "n": st.integers(1, 3),
        "c": st.sampled_from([8, 16, 24]),
        "h": st.integers(1, 7),
        "w": st.integers(1, 7),
        "r": st.integers(1, 5),
        "s": st.integers(1, 5),
        "ph": st.integers(0, 3),
        "pw": st.integers(0, 3),
        "channels_last": st.booleans(),
        "seed": st.integers(0, 2**31 - 1),
    }
).filter(lambda d: d["h"] + 2 * d["ph"] >= d["r"] and d["w"] + 2 * d["pw"] >= d["s"])


def _autograd(d):
    """Inputs and F.conv2d/autograd results in float64 for one random shape."""
    gen = torch.Generator().manual_seed(d["seed"])
    x = torch.randn(d["n"], d["c"], d["h"], d["w"], dtype=torch.float64, generator=gen)
    w = torch.randn(d["c"], 8, d["r"], d["s"], dtype=torch.float64, generator=gen)
    b = torch.randn(d["c"], dtype=torch.float64, generator=gen)
    if d["channels_last"]:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    w.requires_grad_(True)
    b.requires_grad_(True)
    y = F.conv2d(x, w, b, padding=(d["ph"], d["pw"]), groups=d["c"] // 8)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=gen)
    if d["channels_last"]:
        dy = dy.to(memory_format=torch.channels_last)
    y.backward(dy)
    return x.detach(), w.detach(), b.detach(), y.detach(), dy, x.grad, w.grad, b.grad


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_references_match_autograd(d):
    x, w, b, y, dy, dx, dw, db = _autograd(d)
    pad = (d["ph"], d["pw"])
    torch.testing.assert_close(conv2d_gw8_fprop_ref(x, w, b, pad), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        conv2d_gw8_fprop_ref(x, w, None, pad), y - b.reshape(1, -1, 1, 1), rtol=1e-12, atol=1e-12
    )
    dx_ref = conv2d_gw8_dgrad_ref(dy, w, pad, (d["h"], d["w"]))
    torch.testing.assert_close(dx_ref, dx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        conv2d_gw8_wgrad_ref(x, dy, pad, d["r"], d["s"]), dw, rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(conv2d_gw8_bias_grad_ref(dy), db, rtol=1e-12, atol=1e-12)


def test_low_precision_inputs_are_widened_before_arithmetic():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 6, 5, generator=gen).to(torch.bfloat16)
    w = torch.randn(16, 8, 3, 3, generator=gen).to(torch.bfloat16)
    y = conv2d_gw8_fprop_ref(x, w, None, 1)
    assert y.dtype == torch.float64 and y.is_contiguous()
    expected = F.conv2d(x.double(), w.double(), padding=1, groups=2)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_gradients_of_low_precision_inputs_are_summed_in_float64():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 6, 5, generator=gen).to(torch.float16)
    w = torch.randn(16, 8, 3, 3, generator=gen).to(torch.float16)
    dy = torch.randn(2, 16, 6, 5, generator=gen).to(torch.float16)
    dx = conv2d_gw8_dgrad_ref(dy, w, 1, (6, 5))
    dw = conv2d_gw8_wgrad_ref(x, dy, 1, 3, 3)
    assert dx.dtype == dw.dtype == torch.float64
    xd, wd, dyd = x.double(), w.double(), dy.double()
    expected_dx = torch.nn.grad.conv2d_input(x.shape, wd, dyd, padding=1, groups=2)
    expected_dw = torch.nn.grad.conv2d_weight(xd, w.shape, dyd, padding=1, groups=2)
    torch.testing.assert_close(dx, expected_dx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, expected_dw, rtol=1e-12, atol=1e-12)
    # 3 x 1000.5 = 3001.5, which fp16 (spacing 2 above 2048) cannot hold.
    db = conv2d_gw8_bias_grad_ref(torch.full((3, 8, 1, 1), 1000.5, dtype=torch.float16))
    assert db.dtype == torch.float64 and db.tolist() == [3001.5] * 8


def test_references_are_not_trivially_zero():
    # Guards the comparisons above against a reference that returns zeros of the right shape.
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 8, 4, 4, dtype=torch.float64, generator=gen)
    w = torch.randn(8, 8, 3, 3, dtype=torch.float64, generator=gen)
    assert conv2d_gw8_fprop_ref(x, w, None, 1).abs().min() > 0
    assert conv2d_gw8_dgrad_ref(x, w, 1, (4, 4)).abs().min() > 0
    assert conv2d_gw8_wgrad_ref(x, x, 1, 3, 3).abs().min() > 0


def test_groups_do_not_mix():
    # Only group 1 of the input is non-zero: outputs of group 0 must stay exactly zero.
    x = torch.zeros(1, 16, 5, 5, dtype=torch.float64)
    x[:, 8:] = torch.randn(1, 8, 5, 5, dtype=torch.float64)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float64)
    y = conv2d_gw8_fprop_ref(x, w, None, 1)
    assert torch.all(y[:, :8] == 0) and torch.all(y[:, 8:] != 0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: conv2d_gw8_fprop_ref(torch.ones(1, 12, 4, 4), torch.ones(12, 8, 3, 3)), "8"),
        (lambda: conv2d_gw8_fprop_ref(torch.ones(1, 16, 4, 4), torch.ones(16, 4, 3, 3)), "(K, 8"),
        (
            lambda: conv2d_gw8_dgrad_ref(torch.ones(1, 8, 4, 4), torch.ones(8, 8, 3, 3), 1, (5, 4)),
            "does not match",
        ),
        (
            lambda: conv2d_gw8_wgrad_ref(torch.ones(1, 8, 4, 4), torch.ones(1, 8, 4, 4), 0, 3, 3),
            "does not match",
        ),
    ],
)
def test_reference_argument_errors(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)
