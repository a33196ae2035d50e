"""Conv2dStats against hand-computed byte and FLOP counts."""

import pytest
from hypothesis import given

from spio.kernels import Conv2dGw8Params, Conv2dStats
from spio.kernels.conv2d_gw8_params import image_bytes, weight_grad_bytes
from tests.kernels.test_conv2d_gw8_params import layers


def test_hand_computed_3x3():
    # N=2, C=16, 4x5 input, 3x3 filter, padding 1 -> 4x5 output.
    stats = Conv2dStats(Conv2dGw8Params(2, 16, 4, 5))
    x = 2 * 16 * 4 * 5 * 2  # 1280 bytes
    y = 2 * 16 * 4 * 5 * 2  # 1280 bytes
    w = 16 * 8 * 3 * 3 * 2  # 2304 bytes
    dw = 16 * 8 * 3 * 3 * 4  # 4608 bytes, fp32
    assert stats.fprop_bytes == x + w + y == 4864
    assert stats.dgrad_bytes == y + w + x == 4864
    assert stats.wgrad_bytes == x + y + dw == 7168
    # 2 * N * P * Q * C * 8 * R * S
    assert stats.flops == 2 * 2 * 4 * 5 * 16 * 8 * 9 == 92160
    assert stats.bytes("wgrad") == 7168


def test_bias_and_valid_padding_bf16():
    # N=1, C=8, 6x6 input, 5x3 filter, padding (0, 1): output 2x6.
    stats = Conv2dStats(Conv2dGw8Params(1, 8, 6, 6, (0, 1), r=5, s=3, has_bias=True, dtype="bf16"))
    x = 1 * 8 * 6 * 6 * 2  # 576
    y = 1 * 8 * 2 * 6 * 2  # 192
    w = 8 * 8 * 5 * 3 * 2  # 1920
    assert stats.fprop_bytes == x + w + y + 8 * 4 == 2720
    assert stats.dgrad_bytes == 2688  # bias plays no part
    assert stats.wgrad_bytes == x + y + 8 * 8 * 15 * 4 + 8 * 4 == 4640  # dbias, fp32
    assert stats.flops == 2 * 1 * 2 * 6 * 8 * 8 * 15 == 23040


def test_effective_bandwidth_and_throughput():
    stats = Conv2dStats(Conv2dGw8Params(2, 16, 4, 5))
    assert stats.effective_bandwidth(1e-6, "fprop") == pytest.approx(4864e6)
    assert stats.effective_bandwidth(2.0, "wgrad") == pytest.approx(3584.0)
    assert stats.throughput(0.5, "dgrad") == pytest.approx(184320.0)
    assert stats.arithmetic_intensity("fprop") == pytest.approx(92160 / 4864)


def test_seed_intensity_figure():
    # DESIGN: a 3x3 gw8 conv does 72 MACs per output element, about 36 FLOP/B in FProp.
    stats = Conv2dStats(Conv2dGw8Params(256, 64, 64, 64))
    assert stats.macs / (256 * 64 * 64 * 64) == 72
    assert 35 < stats.arithmetic_intensity("fprop") < 37


@pytest.mark.parametrize("method", ["effective_bandwidth", "throughput"])
@pytest.mark.parametrize("seconds", [0, -1.0, float("nan")])
def test_a_time_that_is_not_positive_is_refused(method, seconds):
    with pytest.raises(ValueError, match="positive time"):
        getattr(Conv2dStats(Conv2dGw8Params(1, 8, 3, 3)), method)(seconds, "fprop")


@pytest.mark.parametrize("call", ["bytes", "throughput"])
def test_an_unknown_pass_is_refused(call):
    stats = Conv2dStats(Conv2dGw8Params(1, 8, 3, 3))
    with pytest.raises(ValueError, match="fprop, dgrad, wgrad, got 'bprop'"):
        stats.bytes("bprop") if call == "bytes" else stats.throughput(1.0, "bprop")


def test_kernel_factories_are_lazy_re_exports():
    import subprocess
    import sys

    code = (
        "import sys, spio.kernels as k;"
        " assert 'spio.kernels.conv2d_gw8_factory' not in sys.modules;"
        " assert k.conv2d_gw8_kernel_factory.configs and k.conv2d_gw8_wgrad_kernel_factory.configs"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_arithmetic_intensity_divides_by_the_bytes_of_its_own_pass():
    # N=2, C=16, 4x5, 3x3: 92160 FLOPs in every pass; FProp and DGrad move 4864 bytes, WGrad
    # 7168 (dw in fp32), as worked out in test_hand_computed_3x3.
    stats = Conv2dStats(Conv2dGw8Params(2, 16, 4, 5))
    assert stats.arithmetic_intensity("wgrad") == pytest.approx(92160 / 7168)
    assert stats.arithmetic_intensity("dgrad") == pytest.approx(92160 / 4864)


@given(params=layers(max_padding=2, dtypes=("fp16", "bf16")))
def test_byte_counts_agree_with_the_params_modules(params):
    """The layer's sizes, written once (conv2d_gw8_params's shapes and element sizes): the
    stats' counts, the params module's size limits and WGrad's slot columns give the same
    numbers, and the hand-written ones."""
    from spio.kernels.conv2d_gw8_wgrad_factory import slot_columns

    stats = Conv2dStats(params)
    n, c, h, w, p, q = params.n, params.c, params.h, params.w, params.p, params.q
    r, s, has_bias = params.r, params.s, params.has_bias
    assert stats.input_bytes == n * c * h * w * 2 and stats.output_bytes == n * c * p * q * 2
    assert n * image_bytes(params) == max(stats.input_bytes, stats.output_bytes)
    assert stats.weight_elements == c * 8 * r * s
    assert stats.weight_grad_bytes == weight_grad_bytes(params) == c * 8 * r * s * 4
    assert slot_columns(params) == (stats.weight_elements, c if has_bias else 0)
