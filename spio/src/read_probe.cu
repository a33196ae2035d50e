/// Read-bandwidth probe: how fast this GPU reads through the load paths spio's kernels use. A
/// diagnostic for scripts/read_probe.py; the convolutions do not use it.
///
/// What it computes: block b reads the Probe::region_bytes bytes at in + b * Probe::region_stride
/// bytes, in 16-byte chunks, and thread t of block b writes the XOR of the 32-bit words it read to
/// out[b * Probe::threads + t] (so no load can be dropped). Four ways to read (SPIO_PROBE_MODE):
///   0 (ldg)      each thread keeps Probe::depth 16-byte loads in flight in registers, striding
///                over the region's chunks with the block's other threads;
///   1 (cp.async) each thread streams its chunks (the same ones) through a ring of Probe::depth
///                shared-memory slots of its own, Probe::depth - 1 copies in flight, waiting only
///                for its own copies: no barriers;
///   2 (rows)     the block streams the region in rows of Probe::row_bytes through a ring of
///                Probe::depth row buffers, one cp.async group, wait and __syncthreads per row,
///                as the convolution kernels stream input rows; with Probe::groups > 0 each row's
///                chunks land grouped as the convolutions stage them (chunk c, pixel c / groups
///                of channel group c % groups, at (c % groups) * pitch + c / groups, the pitch
///                the row's pixels rounded up to odd), not in order;
///   3 (bulk)     the same rows, each copied by thread 0 with one bulk copy (cp.async.bulk, the
///                copy engine of Hopper's TMA) and waited for on the row buffer's mbarrier, all
///                Probe::depth buffers in flight; sm_90 and newer (spio/thread/bulk_copy.h).
/// Comparing them (and torch's own kernels) separates the memory system's read ceiling from the
/// cost of cp.async and of the row-by-row structure, and tells whether the bulk copy engine reads
/// faster than per-thread copies.
///
/// Launch contract: grid = Probe::blocks blocks of Probe::threads threads; dynamic shared memory
/// Probe::depth * Probe::threads * 16 bytes (mode 1), Probe::depth * Probe::stage_chunks * 16
/// (mode 2: row_bytes, or with groups groups * pitch chunks a buffer),
/// Probe::depth * (Probe::row_bytes + 8) (mode 3: the buffers, then one mbarrier each), or none
/// (mode 0). region_bytes and row_bytes are multiples of 16, region_bytes of row_bytes in modes
/// 2 and 3 (spio.bench.probe.Probe checks them).
/// Arguments: (unsigned *out, const uint4 *in).

#include "spio/macros.h"
#include "spio/thread/async_copy.h"

#include "read_probe_gen.h"
#if SPIO_PROBE_MODE == 3
#include "spio/thread/bulk_copy.h"
#endif

namespace {

/// The XOR of the four 32-bit words of v.
SPIO_DEVICE unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

}  // namespace

extern "C" __global__ void __launch_bounds__(Probe::threads)
    spio_read_probe(unsigned *out, const uint4 *in) {
    constexpr int THREADS = Probe::threads;
    constexpr int DEPTH = Probe::depth;
    constexpr int CHUNKS = Probe::region_bytes / 16;
    const uint4 *region = in + static_cast<long long>(blockIdx.x) * (Probe::region_stride / 16);
    const int t = threadIdx.x;
    unsigned acc = 0;

#if SPIO_PROBE_MODE == 0
    for (int base = t; base < CHUNKS; base += THREADS * DEPTH) {
        uint4 v[DEPTH];
        SPIO_UNROLL
        for (int k = 0; k < DEPTH; ++k) {
            const int i = base + k * THREADS;
            v[k] = i < CHUNKS ? region[i] : make_uint4(0u, 0u, 0u, 0u);
        }
        SPIO_UNROLL
        for (int k = 0; k < DEPTH; ++k) {
            acc ^= fold(v[k]);
        }
    }
#elif SPIO_PROBE_MODE == 1
    extern __shared__ uint4 smem[];
    uint4 *ring = smem + t * DEPTH;
    const int mine = (CHUNKS - t + THREADS - 1) / THREADS;  // chunks t, t + THREADS, ...
    SPIO_UNROLL
    for (int k = 0; k < DEPTH - 1; ++k) {
        if (k < mine) {
            spio::cp_async_16(ring + k, region + t + k * THREADS, 16);
        }
        spio::cp_async_commit_group();
    }
    for (int k = 0; k < mine; ++k) {
        spio::cp_async_wait_group<DEPTH - 2>();
        acc ^= fold(ring[k % DEPTH]);  // used before the next iteration's copy refills its slot
        const int next = k + DEPTH - 1;
        if (next < mine) {
            spio::cp_async_16(ring + next % DEPTH, region + t + next * THREADS, 16);
        }
        spio::cp_async_commit_group();
    }
#elif SPIO_PROBE_MODE == 3
    extern __shared__ uint4 smem[];
    constexpr int ROW_CHUNKS = Probe::row_bytes / 16;
    constexpr int ROWS = Probe::region_bytes / Probe::row_bytes;
    unsigned long long *bars = reinterpret_cast<unsigned long long *>(smem + DEPTH * ROW_CHUNKS);
    if (t == 0) {
        SPIO_UNROLL
        for (int k = 0; k < DEPTH; ++k) {
            spio::mbarrier_init(bars + k, 1);
        }
        spio::fence_mbarrier_init();
    }
    __syncthreads();
    // Thread 0 copies row `row` into buffer row % DEPTH, whose barrier counts its bytes.
    const auto load_row = [&](int row) {
        unsigned long long *bar = bars + row % DEPTH;
        spio::mbarrier_arrive_expect_tx(bar, Probe::row_bytes);
        spio::cp_async_bulk_g2s(smem + (row % DEPTH) * ROW_CHUNKS, region + row * ROW_CHUNKS,
                                Probe::row_bytes, bar);
    };
    if (t == 0) {
        for (int row = 0; row < DEPTH && row < ROWS; ++row) {
            load_row(row);
        }
    }
    for (int row = 0; row < ROWS; ++row) {
        // The buffer's (row / DEPTH)-th fill: its phases alternate parity 0, 1, 0, ...
        spio::mbarrier_wait_parity(bars + row % DEPTH, (row / DEPTH) & 1);
        const uint4 *stage = smem + (row % DEPTH) * ROW_CHUNKS;
        for (int c = t; c < ROW_CHUNKS; c += THREADS) {
            acc ^= fold(stage[c]);
        }
        __syncthreads();  // every thread is done with the buffer before thread 0 refills it
        if (t == 0 && row + DEPTH < ROWS) {
            spio::fence_proxy_async_shared();
            load_row(row + DEPTH);
        }
    }
#else
    extern __shared__ uint4 smem[];
    constexpr int ROW_CHUNKS = Probe::row_bytes / 16;
    constexpr int ROWS = Probe::region_bytes / Probe::row_bytes;
    constexpr bool GROUPED = Probe::groups > 0;
    constexpr int GROUPS = GROUPED ? Probe::groups : 1;
    constexpr int STAGE_CHUNKS = Probe::stage_chunks;  // a row buffer, as Probe sizes it
    // Where chunk c of a row lands in its buffer: in order, or grouped (see above).
    const auto slot = [](int c) {
        return GROUPED ? (c % GROUPS) * Probe::pitch + c / GROUPS : c;
    };
    const auto load_row = [&](int row) {
        uint4 *stage = smem + (row % DEPTH) * STAGE_CHUNKS;
        for (int c = t; c < ROW_CHUNKS; c += THREADS) {
            spio::cp_async_16(stage + slot(c), region + row * ROW_CHUNKS + c, 16);
        }
    };
    SPIO_UNROLL
    for (int row = 0; row < DEPTH - 1; ++row) {
        if (row < ROWS) {
            load_row(row);
        }
        spio::cp_async_commit_group();
    }
    for (int row = 0; row < ROWS; ++row) {
        spio::cp_async_wait_group<DEPTH - 2>();
        __syncthreads();  // row is visible to all; every thread is done with row - 1's buffer
        if (row + DEPTH - 1 < ROWS) {
            load_row(row + DEPTH - 1);
        }
        spio::cp_async_commit_group();
        const uint4 *stage = smem + (row % DEPTH) * STAGE_CHUNKS;
        for (int c = t; c < ROW_CHUNKS; c += THREADS) {
            acc ^= fold(stage[slot(c)]);
        }
    }
#endif
    out[blockIdx.x * THREADS + t] = acc;
}
