"""Tiled tensor maps: the descriptors of sm_90's bulk tensor copies (TMA), for GPU and emulator.

A tiled tensor map describes a tensor in global memory (its address, element size, extents and
byte strides, innermost dim first) and the box one copy moves into shared memory. A kernel takes
it by value (`const __grid_constant__ spio::TensorMap`, spio/thread/bulk_copy.h) and copies a box
at integer coordinates with one instruction; elements outside the tensor land as zeros, negative
coordinates included. With a swizzle of S bytes (32, 64 or 128) the 16-byte chunk bits [4, 4 +
log2(S/16)) of each landing shared-memory address are XORed with its bits [7, 7 + log2(S/16)):
CU_TENSOR_MAP_SWIZZLE_32B/64B/128B as CUTLASS encodes them (Swizzle<B, 4, 3>; the driver names the
modes, not their bits). The emulator and spio's buffer layouts assume this pattern; a GPU run of
the tensor-copy kernels against the others checks it.

On a GPU the driver encodes the map (cuTensorMapEncodeTiled, an opaque 128 bytes). The emulator
cannot call the driver, so it gets the same facts in a layout of its own (`emulator_bytes`, read
by spio/emulator/runtime's cp_async_bulk_tensor_g2s). Both come from one validated TensorMap, so
every rule the driver states is checked here, on any machine, with an error naming it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

#: Bytes of a tensor map (CU_TENSOR_MAP_NUM_QWORDS * 8); a kernel parameter of 64-byte alignment.
TENSOR_MAP_BYTES = 128

#: The swizzle spans, in bytes, and their CUtensorMapSwizzle values (cuda.h).
SWIZZLE_MODES = {0: 0, 32: 1, 64: 2, 128: 3}

#: The L2 promotion spans, in bytes, and their CUtensorMapL2promotion values (cuda.h): how much
#: L2 fetches from DRAM at once for a copy's sectors (0: what it fetches for plain loads). The
#: emulator has no L2: its maps leave it out.
L2_PROMOTIONS = {0: 0, 64: 1, 128: 2, 256: 3}

#: CUtensorMapDataType of each element size: the copies move bits, so unsigned integers stand for
#: every type of that size (fp16 and bf16 are UINT16).
DATA_TYPES = {1: 0, 2: 1, 4: 2, 8: 4}

#: The first 8 bytes of an emulator map: "SPIOTMAP" (a driver-encoded map is refused by them).
EMULATOR_MAGIC = int.from_bytes(b"SPIOTMAP", "little")

MAX_RANK = 5


@dataclass(frozen=True)
class TensorMap:
    """A tiled tensor map: `dims` (elements) and `strides` (bytes, of dims[1:]) innermost first,
    `box` the elements one copy moves along each dim, `swizzle` the span in bytes (0: none),
    `l2_promotion` the L2 promotion in bytes (L2_PROMOTIONS; 0: none)."""

    address: int
    element_bytes: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 0
    l2_promotion: int = 0

    def __post_init__(self) -> None:
        numbers = {
            "address": self.address,
            "element_bytes": self.element_bytes,
            "swizzle": self.swizzle,
            "l2_promotion": self.l2_promotion,
        }
        for field in ("dims", "strides", "box"):
            numbers |= {f"{field}[{i}]": v for i, v in enumerate(getattr(self, field))}
        for what, value in numbers.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"a tensor map's {what} must be an int, got {value!r}")
        rank = len(self.dims)
        if not 1 <= rank <= MAX_RANK:
            raise ValueError(f"a tensor map has 1 to {MAX_RANK} dims, got {rank}")
        if len(self.strides) != rank - 1 or len(self.box) != rank:
            raise ValueError(
                f"a tensor map of {rank} dims needs {rank - 1} strides and {rank} box extents, "
                f"got {len(self.strides)} and {len(self.box)}"
            )
        if self.element_bytes not in DATA_TYPES:
            raise ValueError(f"element_bytes must be 1, 2, 4 or 8, got {self.element_bytes}")
        if self.address <= 0 or self.address % 16:
            raise ValueError(
                f"a tensor map's global address must be 16-byte aligned, got {self.address:#x}"
            )
        for i, d in enumerate(self.dims):
            if not 1 <= d <= 1 << 32:
                raise ValueError(f"tensor map dim {i} must be 1..2^32 elements, got {d}")
        for i, s in enumerate(self.strides):
            if s <= 0 or s % 16 or s >= 1 << 40:
                raise ValueError(
                    f"tensor map stride {i + 1} must be a positive multiple of 16 bytes below "
                    f"2^40, got {s}"
                )
        for i, b in enumerate(self.box):
            if not 1 <= b <= 256:
                raise ValueError(f"tensor map box dim {i} must be 1..256 elements, got {b}")
        inner = self.box[0] * self.element_bytes
        if inner % 16:
            raise ValueError(
                f"a tensor map box's inner dim must span a multiple of 16 bytes, got {inner}"
            )
        if self.swizzle not in SWIZZLE_MODES:
            raise ValueError(f"swizzle must be 0, 32, 64 or 128 bytes, got {self.swizzle}")
        if self.swizzle and inner > self.swizzle:
            raise ValueError(
                f"a {self.swizzle}-byte swizzle needs a box inner dim of at most {self.swizzle} "
                f"bytes, got {inner}"
            )
        if self.l2_promotion not in L2_PROMOTIONS:
            raise ValueError(
                f"l2_promotion must be 0, 64, 128 or 256 bytes, got {self.l2_promotion}"
            )

    @classmethod
    def of_tensor(
        cls,
        t: Any,
        order: tuple[int, ...],
        box: tuple[int, ...],
        swizzle: int = 0,
        l2_promotion: int = 0,
    ):
        """The map of torch tensor `t` with dims `order` (t's dim indices, innermost first, the
        first of stride 1), boxes of `box` elements, `swizzle` and `l2_promotion` as the
        class's. A dim of extent 1 is only ever read at index 0, so its stride, which PyTorch
        leaves free (a tensor contiguous in a memory format may report any), is taken as the
        dense one: the stride below it times its extent."""
        if t.numel() == 0:
            raise ValueError("a tensor map needs a non-empty tensor")
        if sorted(order) != list(range(t.dim())):
            raise ValueError(
                f"a tensor map's order must name each of the tensor's {t.dim()} dims once, "
                f"got {order}"
            )
        if t.stride(order[0]) != 1 and t.shape[order[0]] != 1:
            raise ValueError(
                f"a tensor map's innermost dim must have stride 1: dim {order[0]} of a tensor "
                f"with strides {tuple(t.stride())}"
            )
        size = t.element_size()
        strides = []
        below = size * t.shape[order[0]]  # the dense stride of the next dim, in bytes
        for d in order[1:]:
            stride = t.stride(d) * size if t.shape[d] != 1 else below
            strides.append(stride)
            below = stride * t.shape[d]
        return cls(
            address=t.data_ptr(),
            element_bytes=size,
            dims=tuple(t.shape[d] for d in order),
            strides=tuple(strides),
            box=tuple(box),
            swizzle=swizzle,
            l2_promotion=l2_promotion,
        )

    @property
    def box_bytes(self) -> int:
        """The bytes one copy lands in shared memory (zeros outside the tensor included)."""
        n = self.element_bytes
        for b in self.box:
            n *= b
        return n

    def cuda_bytes(self) -> bytes:
        """The map as the driver encodes it (cuTensorMapEncodeTiled)."""
        from . import driver

        return driver.encode_tensor_map_tiled(
            DATA_TYPES[self.element_bytes],
            self.address,
            self.dims,
            self.strides,
            self.box,
            SWIZZLE_MODES[self.swizzle],
            L2_PROMOTIONS[self.l2_promotion],
        )

    def emulator_bytes(self) -> bytes:
        """The map in the emulator's layout: 16 little-endian 64-bit words: the magic, the
        address, rank | element bytes << 8 | swizzle bytes << 16, dims 0-4 (1 where unused),
        strides of dims 1-4 (0 where unused), box dims 0-4 as 32-bit halves (1 where unused),
        one zero word. (No L2 promotion: the emulator has no L2.)"""
        rank = len(self.dims)
        dims = list(self.dims) + [1] * (MAX_RANK - rank)
        strides = list(self.strides) + [0] * (MAX_RANK - rank)
        box = list(self.box) + [1] * (MAX_RANK - rank)
        words = [
            EMULATOR_MAGIC,
            self.address,
            rank | self.element_bytes << 8 | self.swizzle << 16,
            *dims,
            *strides[: MAX_RANK - 1],
            box[0] | box[1] << 32,
            box[2] | box[3] << 32,
            box[4],
            0,
        ]
        assert len(words) == TENSOR_MAP_BYTES // 8
        return struct.pack("<16Q", *words)

    def argument(self, device: Any) -> Any:
        """The kernel argument for a launch on `device` (a torch.device): the driver's encoding
        as a by-value parameter on a GPU, the emulator's layout on the CPU."""
        if device.type == "cuda":
            from . import driver

            return driver.Bytes(self.cuda_bytes())
        return self.emulator_bytes()
