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
    ],
)
def test_blocks_per_sm(arch, threads, registers, smem, expected):
    assert blocks_per_sm(LIMITS[arch], threads, registers, smem) == expected
