"""The emulator's checks at their boundaries: one byte past a tensor or a shared buffer, the
first byte of a region, a second ldmatrix matrix or commit group, a store into a copy in flight,
an atomic out of bounds. Each test failed to catch a planted bug in the runtime's check
(mutation testing, 2026-12-06) that test_hazards.py let pass."""

import pytest
import torch

from spio.emulator import EmulatorError, load_module

KILL = r"""
#include "spio/thread/async_copy.h"
#include "spio/thread/bulk_copy.h"
#include "spio/warp/ldmatrix.h"

/// thread 0 initialises the mbarrier at `bar` for one arrival and fences the init for the copy
/// engine.
__device__ void init_by_thread_0(unsigned long long *bar) {
    if (threadIdx.x == 0) {
        spio::mbarrier_init(bar, 1);
        spio::fence_mbarrier_init();
    }
}

/// thread 0 stores one byte at out[n]: one past the end of a byte tensor.
extern "C" __global__ void byte_past_end(unsigned char *out, int n) {
    if (threadIdx.x == 0) out[n] = 1;
}

/// a 16-byte read whose first bytes lie inside the dynamic shared buffer, its last past it.
extern "C" __global__ void dyn_vector_read(float *out, int offset) {
    extern __shared__ __align__(16) float d[];
    const int i = threadIdx.x;
    d[i] = float(i);
    __syncthreads();
    if (i == 0) {
        *reinterpret_cast<float4 *>(out) = *reinterpret_cast<const float4 *>(d + offset);
    }
}

/// thread 0 reads one byte of dynamic shared memory no thread wrote (byte 0 of the buffer).
extern "C" __global__ void dyn_first_byte(int *out, int fill) {
    extern __shared__ unsigned char b[];
    if (fill && threadIdx.x == 0) b[0] = 3;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = b[0];
}

/// announces `announced` bytes, copies 256.
extern "C" __global__ void under_announced(float *out, const float *in, int announced) {
    __shared__ __align__(16) float buf[64];
    __shared__ __align__(8) unsigned long long bar;
    init_by_thread_0(&bar);
    __syncthreads();
    if (threadIdx.x == 0) {
        spio::mbarrier_arrive_expect_tx(&bar, announced);
        spio::cp_async_bulk_g2s(buf, in, 256, &bar);
    }
    spio::mbarrier_wait_parity(&bar, 0);
    out[threadIdx.x] = buf[threadIdx.x];
}

/// `arrivals` threads arrive on an mbarrier initialised for one arrival (each announcing 0).
extern "C" __global__ void extra_arrival(int *out, int arrivals) {
    __shared__ __align__(8) unsigned long long bar;
    init_by_thread_0(&bar);
    __syncthreads();
    if (threadIdx.x < arrivals) spio::mbarrier_arrive_expect_tx(&bar, 0);
    __syncthreads();
    out[threadIdx.x] = 1;
}
/// thread 0 inits an mbarrier for `threads` arrivals; every thread then arrives and waits.
/// `order` 0: nothing orders the init before the other threads' arrivals; 1: a __syncthreads
/// does; 2: a __syncwarp does (one warp).
extern "C" __global__ void init_order(int *out, int threads, int order) {
    __shared__ __align__(8) unsigned long long bar;
    if (threadIdx.x == 0) spio::mbarrier_init(&bar, threads);
    if (order == 1) __syncthreads();
    if (order == 2) __syncwarp();
    spio::mbarrier_arrive_expect_tx(&bar, 0);
    spio::mbarrier_wait_parity(&bar, 0);
    out[threadIdx.x] = 1;
}

/// thread 0 inits an mbarrier and announces 16 bytes; thread 32 (another warp) issues the bulk
/// copy, after a __syncthreads where `ordered`, else unordered with the init.
extern "C" __global__ void bulk_by_other(float *out, const float *x, int ordered) {
    __shared__ __align__(16) float dst[4];
    __shared__ __align__(8) unsigned long long bar;
    init_by_thread_0(&bar);
    if (threadIdx.x == 0) spio::mbarrier_arrive_expect_tx(&bar, 16);
    if (ordered) __syncthreads();
    if (threadIdx.x == 32) spio::cp_async_bulk_g2s(dst, x, 16, &bar);
    __syncthreads();
    spio::mbarrier_wait_parity(&bar, 0);
    if (threadIdx.x < 4) out[threadIdx.x] = dst[threadIdx.x];
}

/// lanes 0..15 exit, then the others shuffle on the full warp (index order: they exit first).
extern "C" __global__ void exit_then_shuffle(int *out) {
    const int lane = threadIdx.x;
    if (lane < 16) return;
    out[lane] = __shfl_xor_sync(0xffffffffu, lane, 1);
}

/// lane 0 syncs with lane 1 only, lane 1 (and every other) with the whole warp.
extern "C" __global__ void overlapping_syncwarps(int *out, int bad) {
    const int lane = threadIdx.x;
    __syncwarp(bad && lane == 0 ? 0x3u : 0xffffffffu);
    out[lane] = lane;
}

/// ldmatrix_x2: row `bad_row` (of 16: lanes 8..15 give matrix 1's rows) 8 bytes off.
extern "C" __global__ void ldm_x2_alignment(unsigned *out, int bad_row) {
    __shared__ __align__(16) unsigned short rows[16][16];
    const int lane = threadIdx.x;
    for (int k = 0; k < 8; ++k) rows[lane / 2][8 * (lane % 2) + k] = 8 * lane + k;
    __syncthreads();
    unsigned d[2];
    spio::ldmatrix_x2(d, &rows[lane % 16][lane == bad_row ? 4 : 0]);
    out[2 * lane] = d[0];
    out[2 * lane + 1] = d[1];
}

/// two commit groups; wait_group<1> completes the first only: reading the second's
/// destination before a wait covering it is a stale read (`fixed` waits for both).
extern "C" __global__ void two_groups(float *out, const float *in, int fixed) {
    __shared__ __align__(16) float s[2][64 * 4];
    const int i = threadIdx.x;
    spio::cp_async_16(&s[0][4 * i], in + 4 * i, 16);
    spio::cp_async_commit_group();
    spio::cp_async_16(&s[1][4 * i], in + 256 + 4 * i, 16);
    spio::cp_async_commit_group();
    if (fixed) {
        spio::cp_async_wait_group<0>();
    } else {
        spio::cp_async_wait_group<1>();
    }
    out[i] = s[0][4 * i] + s[1][4 * i];
    spio::cp_async_wait_all();
}

/// thread i stores to the chunk its own cp.async is still filling (`bug` 1), or after the wait.
extern "C" __global__ void store_into_copy(float *out, const float *in, int bug) {
    __shared__ __align__(16) float s[64 * 4];
    const int i = threadIdx.x;
    spio::cp_async_16(&s[4 * i], in + 4 * i, 16);
    spio::cp_async_commit_group();
    if (bug) s[4 * i] = -1.f;
    spio::cp_async_wait_all();
    if (!bug) s[4 * i] = -1.f;
    out[i] = s[4 * i + 1];
}
/// every thread adds 1 atomically to d[index] of `n` dynamic ints.
extern "C" __global__ void dyn_atomic(int *out, int index) {
    extern __shared__ int d[];
    if (threadIdx.x == 0) d[0] = 0;
    __syncthreads();
    atomicAdd(&d[index], 1);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = d[0];
}

/// thread 0 copies x[offset..offset+3] by cp.async (x has 6 floats: offset 4 runs 8 bytes past).
extern "C" __global__ void cp_async_tail(float *out, const float *x, int offset) {
    __shared__ __align__(16) float s[4];
    if (threadIdx.x == 0) {
        spio::cp_async_16(s, x + offset, 16);
        spio::cp_async_wait_all();
        out[0] = s[0];
    }
}

/// thread 0 reads an initialised mbarrier's word with a plain load (`peek` 1).
extern "C" __global__ void peek_mbarrier(unsigned long long *out, int peek) {
    __shared__ __align__(8) unsigned long long bar;
    init_by_thread_0(&bar);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = peek ? bar : 1ull;
}
"""


@pytest.fixture(scope="module")
def kernels():
    return load_module(KILL, name="emu_test_boundaries")


def test_a_one_byte_store_just_past_a_tensor_is_out_of_bounds(kernels):
    fn = kernels.get_function("byte_past_end")
    out = torch.zeros(7, dtype=torch.uint8)
    fn.launch(1, 32, (out, 6))
    assert out[6] == 1
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access: writes 1 bytes"):
        fn.launch(1, 32, (torch.zeros(7, dtype=torch.uint8), 7))


def test_a_vector_read_running_past_dynamic_shared_memory_is_out_of_bounds(kernels):
    fn = kernels.get_function("dyn_vector_read")
    out = torch.zeros(4)
    fn.launch(1, 64, (out, 60), shared_mem_bytes=256)  # floats 60..63: the last 16 bytes
    assert out.tolist() == [60, 61, 62, 63]
    with pytest.raises(EmulatorError, match="out-of-bounds shared-memory access: reads 16 bytes"):
        fn.launch(1, 62, (torch.zeros(4), 60), shared_mem_bytes=248)  # 8 of its 16 bytes past


def test_a_read_of_the_first_unwritten_dynamic_byte_is_reported(kernels):
    fn = kernels.get_function("dyn_first_byte")
    out = torch.zeros(1, dtype=torch.int32)
    fn.launch(1, 32, (out, 1), shared_mem_bytes=16)
    assert out.item() == 3
    message = r"reads shared address .*, which no thread of this block has written"
    with pytest.raises(EmulatorError, match=message):
        fn.launch(1, 32, (out, 0), shared_mem_bytes=16)


def test_bulk_copies_moving_more_than_announced_are_reported(kernels):
    fn = kernels.get_function("under_announced")
    x = torch.randn(64)
    out = torch.zeros(64)
    fn.launch(1, 64, (out, x, 256))
    assert torch.equal(out, x)
    message = "moved 16 bytes more than mbarrier_arrive_expect_tx announced"
    with pytest.raises(EmulatorError, match=message):
        fn.launch(1, 64, (torch.zeros(64), x, 240))


def test_more_arrivals_than_mbarrier_init_allowed_are_reported(kernels):
    fn = kernels.get_function("extra_arrival")
    out = torch.zeros(32, dtype=torch.int32)
    fn.launch(1, 32, (out, 1))
    message = "whose phase has had all 1 arrivals mbarrier_init allowed"
    with pytest.raises(EmulatorError, match=message):
        fn.launch(1, 32, (torch.zeros(32, dtype=torch.int32), 2))


def test_a_shuffle_naming_lanes_that_exited_is_reported_as_such(kernels):
    with pytest.raises(EmulatorError, match=r"waits for lanes that have exited \(0xffff\)"):
        out = torch.zeros(32, dtype=torch.int32)
        kernels.get_function("exit_then_shuffle").launch(1, 32, (out,))


def test_the_same_collective_on_overlapping_masks_is_divergent(kernels):
    fn = kernels.get_function("overlapping_syncwarps")
    out = torch.zeros(32, dtype=torch.int32)
    fn.launch(1, 32, (out, 0))
    assert out.tolist() == list(range(32))
    message = r"lane 1 reaches __syncwarp \(mask 0xffffffff\) .* divergent"
    with pytest.raises(EmulatorError, match=message):
        fn.launch(1, 32, (torch.zeros(32, dtype=torch.int32), 1))


@pytest.mark.parametrize("bad_row", [8, 15])
def test_every_ldmatrix_x2_row_address_must_be_16_byte_aligned(kernels, bad_row):
    with pytest.raises(EmulatorError, match="ldmatrix row address: .* is not 16-byte aligned"):
        out = torch.zeros(64, dtype=torch.int32)
        kernels.get_function("ldm_x2_alignment").launch(1, 32, (out, bad_row))


def test_reading_a_group_that_wait_group_left_in_flight_is_stale(kernels):
    fn = kernels.get_function("two_groups")
    x = torch.randn(512)
    out = torch.zeros(64)
    fn.launch(1, 64, (out, x, 1))
    assert torch.equal(out, x[:256:4] + x[256::4])
    with pytest.raises(EmulatorError, match="before a cp_async_wait_group/cp_async_wait_all"):
        fn.launch(1, 64, (torch.zeros(64), x, 0))


def test_a_store_into_a_cp_async_destination_in_flight_is_reported(kernels):
    fn = kernels.get_function("store_into_copy")
    x = torch.randn(256)
    out = torch.zeros(64)
    fn.launch(1, 64, (out, x, 0))
    assert torch.equal(out, x[1::4])
    message = r"writes shared address .* the destination of an async copy"
    with pytest.raises(EmulatorError, match=message):
        fn.launch(1, 64, (torch.zeros(64), x, 1))


def test_an_atomic_just_past_dynamic_shared_memory_is_out_of_bounds(kernels):
    fn = kernels.get_function("dyn_atomic")
    out = torch.zeros(1, dtype=torch.int32)
    fn.launch(1, 32, (out, 0), shared_mem_bytes=16)
    assert out.item() == 32
    with pytest.raises(EmulatorError, match="out-of-bounds atomic"):
        fn.launch(1, 32, (out, 4), shared_mem_bytes=16)


def test_a_cp_async_reading_past_a_tensor_is_out_of_bounds(kernels):
    fn = kernels.get_function("cp_async_tail")
    x = torch.randn(8)
    out = torch.zeros(1)
    fn.launch(1, 32, (out, x, 4))
    assert out.item() == x[4].item()
    message = "out-of-bounds global-memory access: cp_async_16 reads 16 bytes"
    with pytest.raises(EmulatorError, match=message):
        fn.launch(1, 32, (torch.zeros(1), torch.randn(6), 4))


def test_a_plain_read_of_an_mbarrier_is_reported(kernels):
    fn = kernels.get_function("peek_mbarrier")
    out = torch.zeros(1, dtype=torch.int64)
    fn.launch(1, 32, (out, 0))
    with pytest.raises(EmulatorError, match="a byte of an mbarrier"):
        fn.launch(1, 32, (out, 1))


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_an_mbarrier_used_before_its_init_is_ordered_is_reported(kernels, seed):
    """Another thread's arrival on an mbarrier in the barrier interval of its init, with nothing
    ordering the two, may meet the barrier's word before the init on a GPU. The emulator had
    reported it only where its thread order ran that thread first (not in index order, as
    `spio check` and SPIO_EMULATE=1 run: a WGrad TMA kernel initialising its barrier after the
    block barrier passed there)."""
    fn = kernels.get_function("init_order")
    said = r"mbarrier_arrive_expect_tx on the mbarrier at 0x[0-9a-f]+, which "
    said += r"thread \(0,0,0\) initialised in this barrier interval: no __syncthreads"
    if seed is not None:  # (a shuffled order may run an arrival before the init itself)
        said = f"(?:{said}|which mbarrier_init has not initialised)"
    with pytest.raises(EmulatorError, match=said):
        fn.launch(1, 64, (torch.zeros(64, dtype=torch.int32), 64, 0), seed=seed)
    for threads, order in [(64, 1), (32, 2)]:  # a __syncthreads, or a __syncwarp of its warp
        out = torch.zeros(threads, dtype=torch.int32)
        fn.launch(1, threads, (out, threads, order), seed=seed)
        assert out.tolist() == [1] * threads


@pytest.mark.parametrize("seed", [None, 1, 3])
def test_a_bulk_copy_issued_before_its_mbarriers_init_is_ordered_is_reported(kernels, seed):
    """The copy's issue, by another thread than the init's, is a use of the barrier too (it had
    been left out of the check: index order passed it)."""
    fn = kernels.get_function("bulk_by_other")
    x = torch.randn(4)
    said = r"cp_async_bulk_g2s on the mbarrier at 0x[0-9a-f]+, which thread \(0,0,0\) initial"
    if seed is not None:
        said = f"(?:{said}|which mbarrier_init has not initialised)"
    with pytest.raises(EmulatorError, match=said):
        fn.launch(1, 64, (torch.zeros(4), x, 0), seed=seed)
    out = torch.zeros(4)
    fn.launch(1, 64, (out, x, 1), seed=seed)
    assert torch.equal(out, x)
