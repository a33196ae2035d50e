"""The benchmark layer table: its shapes, and the bytes each pass must move (hand-computed)."""

import pytest

from spio.bench.layers import (
    BATCH_SIZES,
    QUICK_BATCH_SIZES,
    layer_table,
    parse_layer,
    select_layers,
)
from spio.kernels.stats import Conv2dStats


def _layer(name):
    (layer,) = [layer for layer in layer_table() if layer.name == name]
    return layer


def test_table_has_every_design_layer_with_unique_names():
    names = [layer.name for layer in layer_table()]
    assert len(names) == len(set(names)) == 10
    shapes = {(l.c, l.h, l.w, l.r, l.s, l.padding) for l in layer_table()}  # noqa: E741
    assert (64, 64, 64, 3, 3, (1, 1)) in shapes  # ConvFirst-like, the seed's figure
    assert (96, 56, 56, 5, 5, (2, 2)) in shapes and (192, 28, 28, 5, 5, (2, 2)) in shapes
    assert (128, 32, 32, 1, 3, (0, 1)) in shapes and (128, 32, 32, 3, 1, (1, 0)) in shapes
    # timm regnetx_002 at 224x224: stride-1 gw8 convs of stage 3 (152c 14x14), stage 4 (368c 7x7)
    assert (152, 14, 14, 3, 3, (1, 1)) in shapes and (368, 7, 7, 3, 3, (1, 1)) in shapes
    assert BATCH_SIZES == (32, 64, 128, 256)
    assert QUICK_BATCH_SIZES == (32, 128)  # as `spio bench --help` says of --quick


def test_every_layer_keeps_its_spatial_size():
    for layer in layer_table():
        params = layer.params(32)
        assert (params.p, params.q) == (layer.h, layer.w), layer.name


@pytest.mark.parametrize(
    "name,n,fprop,dgrad,wgrad",
    [
        # x = y = 32*64*64*64*2 = 16,777,216; w = 64*8*3*3*2 = 9,216; dw fp32 = 18,432
        ("64c_64x64_3x3", 32, 33_563_648, 33_563_648, 33_572_864),
        # x = y = 256*96*56*56*2 = 154,140,672; w = 96*8*5*5*2 = 38,400; dw = 76,800
        ("96c_56x56_5x5", 256, 308_319_744, 308_319_744, 308_358_144),
        # x = y = 64*128*32*32*2 = 16,777,216; w = 128*8*1*3*2 = 6,144; dw = 12,288
        ("128c_32x32_1x3", 64, 33_560_576, 33_560_576, 33_566_720),
        # x = y = 128*368*7*7*2 = 4,616,192; w = 368*8*9*2 = 52,992; dw = 105,984
        ("368c_7x7_3x3", 128, 9_285_376, 9_285_376, 9_338_368),
    ],
)
def test_bytes_per_pass_match_hand_computed_values(name, n, fprop, dgrad, wgrad):
    stats = Conv2dStats(_layer(name).params(n))
    assert stats.bytes("fprop") == fprop
    assert stats.bytes("dgrad") == dgrad
    assert stats.bytes("wgrad") == wgrad


def test_flops_match_hand_computed_value():
    # 2 * N*P*Q*C * 8*R*S = 2 * 32*64*64*64 * 72
    assert Conv2dStats(_layer("64c_64x64_3x3").params(32)).flops == 1_207_959_552


def test_bf16_moves_the_same_bytes():
    layer = _layer("192c_28x28_5x5")
    for pass_ in ("fprop", "dgrad", "wgrad"):
        fp16 = Conv2dStats(layer.params(64, "fp16")).bytes(pass_)
        assert Conv2dStats(layer.params(64, "bf16")).bytes(pass_) == fp16


def test_select_layers_filters_by_name_and_rejects_unknown():
    assert [l.name for l in select_layers(layer_table(), ["5x5"])] == [  # noqa: E741
        "96c_56x56_5x5",
        "192c_28x28_5x5",
    ]
    assert select_layers(layer_table(), None) == layer_table()
    assert select_layers(layer_table(), []) == layer_table()  # empty: all of them
    # Any of several patterns selects a layer.
    assert [l.name for l in select_layers(layer_table(), ["5x5", "_1x3"])] == [  # noqa: E741
        "96c_56x56_5x5",
        "192c_28x28_5x5",
        "128c_32x32_1x3",
    ]
    with pytest.raises(ValueError, match="no benchmark layer matches"):
        select_layers(layer_table(), ["7x7_5x5"])
    # Every pattern must select a layer: one matching nothing is named, not dropped.
    with pytest.raises(ValueError, match=r"no benchmark layer matches \['7x7_5x5'\]; layers: "):
        select_layers(layer_table(), ["5x5", "7x7_5x5"])


def test_layers_by_name_or_shape():
    """A layer of the table by name, or any shape as C,H,W[,R,S[,PAD_H,PAD_W]], named like the
    table's rows (with its padding where that is not R//2, S//2)."""
    assert parse_layer("64c_64x64_3x3") == layer_table()[0]
    layer = parse_layer("64,64,60")
    assert (layer.c, layer.h, layer.w, layer.r, layer.s, layer.padding) == (
        64,
        64,
        60,
        3,
        3,
        (1, 1),
    )
    assert layer.name == "64c_64x60_3x3"
    five = parse_layer(" 96, 56, 56, 5, 1")
    assert (five.r, five.s, five.padding, five.name) == (5, 1, (2, 0), "96c_56x56_5x1")
    padded = parse_layer("48,100,100,3,3,0,2")
    assert (padded.padding, padded.name) == ((0, 2), "48c_100x100_3x3_pad0x2")
    assert parse_layer("48,100,100,3,3,1,1") == parse_layer("48,100,100")
    assert padded.params(4).output_shape == (4, 48, 98, 102)
    for bad in ("64,64", "64,64,60,3", "64,64,60,3,3,1", "a,b,c", "nope", "64,64,-1"):
        with pytest.raises(ValueError, match="C,H,W"):
            parse_layer(bad)


@pytest.mark.parametrize(
    "text,error",
    [
        ("60,32,32", "channels a positive multiple of 8, got 60"),
        ("64,32,32,7,3", "filter R in 1..5, got 7"),
        ("64,2,2,5,5,0,0", "non-empty output"),
    ],
)
def test_a_shape_spio_cannot_run_names_the_constraint(text, error):
    with pytest.raises(ValueError, match=error):
        parse_layer(text)


def test_params_of_a_layer_keep_height_width_dtype_and_bias():
    """A non-square layer's params have H and W in their places (P = 32 + 2 - 3 + 1 = 32 rows,
    Q = 48 columns), and the dtype and bias asked for."""
    layer = parse_layer("64,32,48")
    params = layer.params(2, "bf16", has_bias=True)
    assert (params.n, params.c, params.h, params.w) == (2, 64, 32, 48)
    assert params.output_shape == (2, 64, 32, 48)
    assert (params.dtype, params.has_bias) == ("bf16", True)
    default = layer.params(2)
    assert (default.dtype, default.has_bias) == ("fp16", False)
