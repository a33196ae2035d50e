"""spio.compiler.occupancy: blocks per SM against hand-computed cases."""

import pytest

from spio.compiler.occupancy import LIMITS, blocks_per_sm


@pytest.mark.parametrize(
    "arch,threads,registers,smem,expected",
    [
        # 72 regs -> 2304 per warp -> 28 warps -> 7 blocks of 4 warps; smem and threads allow more.
        ("sm_90", 128, 72, 10880, 7),
        # Threads bind: 1536 / 256 = 6 (registers would allow 8, shared memory many).
        ("sm_86", 256, 32, 0, 6),
        # Shared memory binds: 100 KiB / (48 KiB + 1 KiB) = 2.
        ("sm_89", 64, 32, 48 * 1024, 2),
        # The block limit binds: 32 blocks of one warp.
        ("sm_80", 32, 16, 0, 32),
        # 255 regs round to 8192 per warp -> 8 warps -> one 256-thread block.
        ("sm_90", 256, 255, 0, 1),
        # Registers are allocated per warp in units of 256: 33 regs x 32 = 1056 -> 1280 per
        # warp; a quarter of the register file (16384) holds 12 such warps -> 48 warps -> 12
        # blocks of 4 warps (15 with 1056 per warp, 14 with 1152 in units of 128).
        ("sm_90", 128, 33, 0, 12),
        # A partial warp is allocated whole: 48 threads are 2 warps of 8192 registers, so 8
        # warps fit -> 4 blocks (8 if the block counted as one warp).
        ("sm_90", 48, 255, 0, 4),
        # A 0-register report counts as 1 register (256 per warp), not a division by zero.
        ("sm_80", 32, 0, 0, 32),
        # Each block also reserves 1 KiB: 100 KiB / (50 KiB + 1 KiB) = 1 (2 without it).
        ("sm_89", 64, 32, 50 * 1024, 1),
        # Shared memory per SM of each arch, where it binds with 1 KiB to spare per block:
        # 228 KiB / 114 KiB, 164 KiB / 82 KiB and 100 KiB / 50 KiB are 2 blocks.
        ("sm_90", 128, 32, 113 * 1024, 2),
        ("sm_80", 128, 32, 81 * 1024, 2),
        ("sm_86", 128, 32, 49 * 1024, 2),
        # Blocks per SM of each arch, where nothing else binds (one warp, 16 registers).
        ("sm_86", 32, 16, 0, 16),
        ("sm_89", 32, 16, 0, 24),
        ("sm_90", 32, 16, 0, 32),
        # Threads per SM, where they bind: 2048 // 1024 = 2 blocks on sm_80 and sm_90
        # (registers: 16 x 32 = 512 per warp -> 128 warps, and 32 regs -> 64 warps, allow 2+).
        ("sm_80", 1024, 16, 0, 2),
        ("sm_90", 1024, 32, 0, 2),
        # The rules of cuda_occupancy.h that a per-SM count misses (bugs fixed):
        # registers are per sub-partition: 80 regs -> 2560 per warp; each quarter's 16384
        # registers hold 6 warps -> 24 one-warp blocks (65536 // 2560 = 25 is too many);
        ("sm_90", 32, 80, 0, 24),
        # the warp slots bind in whole warps: 80 threads are 3 warps -> 64 // 3 = 21 blocks
        # (2048 // 80 = 25 counted threads);
        ("sm_90", 80, 16, 0, 21),
        # shared memory is allocated in 128-byte units: 54950 -> 55040 + 1 KiB = 56064 bytes,
        # and 164 KiB = 167936 bytes holds 2 (3 of the unrounded 55974).
        ("sm_80", 128, 32, 54950, 2),
        # ... in units of 128 bytes, not 256: 54900 -> 54912 + 1 KiB = 55936, and 3 fit (in
        # units of 256, 55040 + 1 KiB = 56064 and 2 would).
        ("sm_80", 128, 32, 54900, 3),
    ],
)
def test_blocks_per_sm(arch, threads, registers, smem, expected):
    """Each limit of the CUDA occupancy rules (threads, warps' registers, shared memory with its
    per-block reserve, blocks per SM) binds in some case, on every arch."""
    assert blocks_per_sm(LIMITS[arch], threads, registers, smem) == expected


def test_a_block_of_no_threads_is_refused():
    """It had been a ZeroDivisionError."""
    with pytest.raises(ValueError, match="a block of at least 1 thread, got 0"):
        blocks_per_sm(LIMITS["sm_90"], 0, 32, 0)
