"""spio.cuda.tensor_map: the driver's rules checked on any machine, the emulator's layout, and maps
of PyTorch tensors. (What the driver is passed: tests/cuda/test_driver.py, against a fake
driver; what the emulator does with a map: tests/emulator/test_tensor_copy.py.)"""

import struct

import pytest
import torch

from spio.cuda.tensor_map import EMULATOR_MAGIC, TensorMap


def make(**changes):
    args = dict(
        address=0x1000,
        element_bytes=2,
        dims=(64, 66, 64, 128),
        strides=(128, 8448, 540672),
        box=(64, 34, 1, 1),
        swizzle=128,
    )
    args.update(changes)
    return TensorMap(**args)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(dims=(), strides=(), box=()), "1 to 5 dims, got 0"),
        (dict(dims=(1,) * 6, strides=(16,) * 5, box=(8,) * 6), "1 to 5 dims, got 6"),
        (dict(strides=(128, 8448)), "needs 3 strides and 4 box extents, got 2 and 4"),
        (dict(box=(64, 34, 1)), "needs 3 strides and 4 box extents, got 3 and 3"),
        (dict(element_bytes=3), "element_bytes must be 1, 2, 4 or 8, got 3"),
        (dict(address=0x1008), "16-byte aligned, got 0x1008"),
        (dict(address=0), "16-byte aligned, got 0x0"),
        (dict(dims=(64, 0, 64, 128)), "dim 1 must be 1..2^32 elements, got 0"),
        (dict(dims=(64, 66, (1 << 32) + 1, 128)), "dim 2 must be 1..2^32 elements"),
        (dict(strides=(128, 8440, 540672)), "stride 2 must be a positive multiple of 16"),
        (dict(strides=(128, 8448, 1 << 40)), "stride 3 must be a positive multiple of 16"),
        (dict(box=(64, 257, 1, 1)), "box dim 1 must be 1..256 elements, got 257"),
        (dict(box=(64, 34, 0, 1)), "box dim 2 must be 1..256 elements, got 0"),
        (dict(box=(4, 34, 1, 1), swizzle=0), "multiple of 16 bytes, got 8"),
        (dict(swizzle=16), "swizzle must be 0, 32, 64 or 128 bytes, got 16"),
        (dict(swizzle=64), "64-byte swizzle needs a box inner dim of at most 64 bytes, got 128"),
        (dict(l2_promotion=32), "l2_promotion must be 0, 64, 128 or 256 bytes, got 32"),
        (dict(l2_promotion=512), "l2_promotion must be 0, 64, 128 or 256 bytes, got 512"),
    ],
)
def test_each_driver_rule_is_checked_and_named(changes, message):
    with pytest.raises(ValueError, match=message.replace("^", r"\^").replace("(", r"\(")):
        make(**changes)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(address=16.0), "address must be an int, got 16.0"),
        (dict(element_bytes=True), "element_bytes must be an int, got True"),
        (dict(dims=(64, 66, 64.0, 128)), r"dims\[2\] must be an int, got 64.0"),
        (dict(box=(64, "34", 1, 1)), r"box\[1\] must be an int, got '34'"),
        (dict(swizzle=None), "swizzle must be an int, got None"),
        (dict(l2_promotion=128.0), "l2_promotion must be an int, got 128.0"),
    ],
)
def test_fields_of_another_type_are_refused_by_name(changes, message):
    """They had passed, to fail later in struct or the driver."""
    with pytest.raises(TypeError, match=message):
        make(**changes)


def test_a_valid_map_and_its_box_bytes():
    m = make()
    assert m.box_bytes == 64 * 34 * 2
    assert make(box=(32, 34, 1, 1), swizzle=64).box_bytes == 32 * 34 * 2
    assert make(box=(8, 10, 1, 1), swizzle=0).box_bytes == 160


def test_emulator_layout():
    m = make()
    w = struct.unpack("<16Q", m.emulator_bytes())
    assert w[0] == EMULATOR_MAGIC and m.emulator_bytes()[:8] == b"SPIOTMAP"
    assert w[1] == 0x1000
    assert w[2] == 4 | 2 << 8 | 128 << 16
    assert w[3:8] == (64, 66, 64, 128, 1)
    assert w[8:12] == (128, 8448, 540672, 0)
    assert w[12:15] == (64 | 34 << 32, 1 | 1 << 32, 1)
    assert w[15] == 0
    one = struct.unpack("<16Q", TensorMap(0x2000, 4, (12,), (), (4,)).emulator_bytes())
    assert one[2] == 1 | 4 << 8 and one[3:8] == (12, 1, 1, 1, 1) and one[8:12] == (0,) * 4
    assert one[12:15] == (4 | 1 << 32, 1 | 1 << 32, 1)


def test_of_tensor_reads_a_channels_last_tensor_as_c_w_h_n():
    x = torch.zeros(3, 16, 5, 7, dtype=torch.half).to(memory_format=torch.channels_last)
    m = TensorMap.of_tensor(x, (1, 3, 2, 0), (16, 9, 1, 1), swizzle=32)
    assert m.address == x.data_ptr() and m.element_bytes == 2
    assert m.dims == (16, 7, 5, 3)
    assert m.strides == (16 * 2, 7 * 16 * 2, 5 * 7 * 16 * 2)
    assert m.box == (16, 9, 1, 1) and m.swizzle == 32


def test_of_tensor_refuses_a_strided_innermost_dim_and_empty_tensors():
    x = torch.zeros(3, 16, 5, 7, dtype=torch.half)  # contiguous NCHW: C has stride 35
    with pytest.raises(ValueError, match="innermost dim must have stride 1: dim 1 of a tensor"):
        TensorMap.of_tensor(x, (1, 3, 2, 0), (16, 9, 1, 1))
    with pytest.raises(ValueError, match="non-empty"):
        TensorMap.of_tensor(torch.zeros(0, 8, dtype=torch.half), (1, 0), (8, 1))


@pytest.mark.parametrize("order", [(1, 3, 2), (1, 3, 2, 2), (1, 3, 2, 4)])
def test_of_tensor_needs_each_dim_once(order):
    """A dim left out had given a map of image 0 alone; one named twice, a map of nonsense."""
    x = torch.zeros(2, 16, 4, 4, dtype=torch.half).to(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match=r"must name each of the tensor's 4 dims once, got \("):
        TensorMap.of_tensor(x, order, (16,) + (1,) * (len(order) - 1))


def test_l2_promotion_is_kept_and_left_out_of_the_emulator_layout():
    """The emulator has no L2: a map's promotion is the driver's alone (test_driver.py)."""
    x = torch.zeros(3, 16, 5, 7, dtype=torch.half).to(memory_format=torch.channels_last)
    m = TensorMap.of_tensor(x, (1, 3, 2, 0), (16, 9, 1, 1), swizzle=32, l2_promotion=256)
    assert m.l2_promotion == 256 and make().l2_promotion == 0
    assert make(l2_promotion=128).emulator_bytes() == make().emulator_bytes()


def test_argument_on_the_cpu_is_the_emulator_layout():
    m = make()
    assert m.argument(torch.device("cpu")) == m.emulator_bytes()


def test_of_tensor_takes_dense_strides_for_dims_of_extent_1():
    """PyTorch leaves a size-1 dim's stride free: a tensor contiguous in channels_last may report
    one the driver would refuse (not a multiple of 16 bytes). Such a dim is only read at index
    0, so the map gets the dense stride instead; the other strides are the tensor's."""
    x = torch.empty_strided((2, 16, 1, 7), (112, 1, 3, 16), dtype=torch.half)
    assert x.is_contiguous(memory_format=torch.channels_last)
    m = TensorMap.of_tensor(x, (1, 3, 2, 0), (16, 7, 1, 1))
    assert m.dims == (16, 7, 1, 2)
    assert m.strides == (32, 7 * 32, 7 * 32)
    one = torch.empty_strided((1, 8, 4, 4), (5, 1, 32, 8), dtype=torch.half)
    m = TensorMap.of_tensor(one, (1, 3, 2, 0), (8, 4, 1, 1))
    assert m.strides == (16, 64, 256)
