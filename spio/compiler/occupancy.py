"""Theoretical occupancy: how many blocks of a compiled kernel fit on one SM of an arch.

From ptxas' register count, the block's threads and its shared memory, under the per-SM limits of
the CUDA C++ Programming Guide ("Technical Specifications per Compute Capability") and the
allocation rules of the toolkit's cuda_occupancy.h: registers go to warps in units of 256, each
warp's within one of the four sub-partitions (a quarter of the register file each); shared
memory goes to blocks in units of 128 bytes, plus 1 KiB reserved per block; threads count as
whole warps. No GPU is needed; scripts/resource_report.py and scripts/sass_loop.py report it
next to their counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SmLimits:
    threads: int
    blocks: int
    shared_bytes: int  # per SM, usable by blocks
    registers: int = 65536


#: Per-SM limits by arch; each block also reserves 1 KiB of shared memory on these archs. The
#: experimental sm_100 and sm_120 (spio's kernels are untested there) as the Programming Guide
#: gives compute capabilities 10.0 and 12.0 (12.0's threads and shared memory also as its GPUs
#: report them); on a GPU, the limits it reports come first (spio.kernels.perf_model).
LIMITS = {
    "sm_80": SmLimits(threads=2048, blocks=32, shared_bytes=164 * 1024),
    "sm_86": SmLimits(threads=1536, blocks=16, shared_bytes=100 * 1024),
    "sm_89": SmLimits(threads=1536, blocks=24, shared_bytes=100 * 1024),
    "sm_90": SmLimits(threads=2048, blocks=32, shared_bytes=228 * 1024),
    "sm_100": SmLimits(threads=2048, blocks=32, shared_bytes=228 * 1024),
    "sm_120": SmLimits(threads=1536, blocks=24, shared_bytes=100 * 1024),
}
RESERVED_SHARED_PER_BLOCK = 1024


def limits_of(arch: str) -> SmLimits:
    """The per-SM limits of `arch`; sm_90's for an arch without an entry (a newer one)."""
    return LIMITS.get(arch, LIMITS["sm_90"])


REGISTER_ALLOCATION_UNIT = 256  # registers, per warp
SHARED_ALLOCATION_UNIT = 128  # bytes, per block
SUB_PARTITIONS = 4  # each holds a quarter of the register file; a warp's registers lie in one


def blocks_per_sm(limits: SmLimits, threads: int, registers: int, shared_bytes: int) -> int:
    """Resident blocks per SM allowed by threads, registers and shared memory (0 where one
    block needs more than an SM has)."""
    if threads < 1:
        raise ValueError(f"blocks_per_sm needs a block of at least 1 thread, got {threads}")
    warps = math.ceil(threads / 32)
    per_warp = (
        math.ceil(max(registers, 1) * 32 / REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    )
    warps_by_registers = (limits.registers // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS
    by_registers = warps_by_registers // warps
    per_block = math.ceil(shared_bytes / SHARED_ALLOCATION_UNIT) * SHARED_ALLOCATION_UNIT
    by_shared = limits.shared_bytes // (per_block + RESERVED_SHARED_PER_BLOCK)
    by_threads = (limits.threads // 32) // warps  # whole warps: a partial warp takes a slot
    return min(limits.blocks, by_registers, by_shared, by_threads)
