"""Kernel sources of the emulator tests, built once per session.

Every source here also compiles with NVRTC for sm_80..sm_90 (test_nvrtc.py), so the host branch of
a primitive cannot hide a broken PTX branch. Fragments are packed by hand from the PTX ISA layouts
(g = lane >> 2, t = lane % 4) and checked against torch matrix products.
"""

import shutil
import types

import pytest

from tests.conftest import forget_toolchain_memos

PRIMITIVES = r"""
#include "spio/warp/mma.h"
#include "spio/warp/ldmatrix.h"
#include "spio/thread/async_copy.h"

__device__ __forceinline__ unsigned pack2(unsigned short lo, unsigned short hi) {
    return unsigned(lo) | (unsigned(hi) << 16);
}

/// One warp: D (16x8 f32) = A (16xK, row-major 16-bit bits) * B (K x 8, stored [n][k]) + C.
template <int K, bool BF16>
__device__ void mma_test(float *d, const unsigned short *a, const unsigned short *b,
                         const float *c) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    float cr[4], dr[4];
    for (int i = 0; i < 4; ++i) cr[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + (i % 2)];
    if (K == 8) {
        unsigned ar[2];
        for (int i = 0; i < 2; ++i) {
            const int row = g + 8 * i, col = 2 * t;
            ar[i] = pack2(a[row * K + col], a[row * K + col + 1]);
        }
        const unsigned br = pack2(b[g * K + 2 * t], b[g * K + 2 * t + 1]);
        if (BF16) spio::mma_m16n8k8_bf16(dr, ar, br, cr);
        else spio::mma_m16n8k8_f16(dr, ar, br, cr);
    } else {
        unsigned ar[4], br[2];
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
            ar[i] = pack2(a[row * K + col], a[row * K + col + 1]);
        }
        for (int i = 0; i < 2; ++i) {
            const int k = 2 * t + 8 * i;
            br[i] = pack2(b[g * K + k], b[g * K + k + 1]);
        }
        if (BF16) spio::mma_m16n8k16_bf16(dr, ar, br, cr);
        else spio::mma_m16n8k16_f16(dr, ar, br, cr);
    }
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + (i % 2)] = dr[i];
}

extern "C" __global__ void mma_k8_f16(float *d, const unsigned short *a, const unsigned short *b,
                                      const float *c) { mma_test<8, false>(d, a, b, c); }
extern "C" __global__ void mma_k8_bf16(float *d, const unsigned short *a, const unsigned short *b,
                                       const float *c) { mma_test<8, true>(d, a, b, c); }
extern "C" __global__ void mma_k16_f16(float *d, const unsigned short *a, const unsigned short *b,
                                       const float *c) { mma_test<16, false>(d, a, b, c); }
extern "C" __global__ void mma_k16_bf16(float *d, const unsigned short *a, const unsigned short *b,
                                        const float *c) { mma_test<16, true>(d, a, b, c); }

/// ldmatrix of `mats` 8x8 matrices (input [4][8][8] 16-bit): matrix j row r lives at
/// smem[j][perm(r)] with a 24-element row pitch; each lane writes its 4 result registers.
template <int N, bool TRANS>
__device__ void ldm_test(unsigned *out, const unsigned short *m) {
    __shared__ __align__(16) unsigned short smem[4][8][24];
    const int lane = threadIdx.x;
    for (int i = lane; i < 4 * 8 * 8; i += 32) {
        const int j = i / 64, r = (i / 8) % 8, c = i % 8;
        smem[j][(r * 3) % 8][8 * (j % 2) + c] = m[i];
    }
    __syncthreads();
    // (Lanes 8N and above give no address; theirs wrap around to the N matrices.)
    const int j = spio::ldmatrix_matrix<N>(lane), r = spio::ldmatrix_row<1>(lane);
    const void *row = &smem[j][(r * 3) % 8][8 * (j % 2)];
    unsigned d[4] = {0, 0, 0, 0};
    if (N == 1 && !TRANS) spio::ldmatrix_x1(reinterpret_cast<unsigned (&)[1]>(d), row);
    if (N == 2 && !TRANS) spio::ldmatrix_x2(reinterpret_cast<unsigned (&)[2]>(d), row);
    if (N == 4 && !TRANS) spio::ldmatrix_x4(d, row);
    if (N == 1 && TRANS) spio::ldmatrix_x1_trans(reinterpret_cast<unsigned (&)[1]>(d), row);
    if (N == 2 && TRANS) spio::ldmatrix_x2_trans(reinterpret_cast<unsigned (&)[2]>(d), row);
    if (N == 4 && TRANS) spio::ldmatrix_x4_trans(d, row);
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = d[i];
}

#define LDM_KERNEL(name, n, trans)                                                   \
    extern "C" __global__ void name(unsigned *o, const unsigned short *m) {          \
        ldm_test<n, trans>(o, m);                                                    \
    }
LDM_KERNEL(ldm_x1, 1, false)
LDM_KERNEL(ldm_x2, 2, false)
LDM_KERNEL(ldm_x4, 4, false)
LDM_KERNEL(ldm_x1_trans, 1, true)
LDM_KERNEL(ldm_x2_trans, 2, true)
LDM_KERNEL(ldm_x4_trans, 4, true)

/// A (16x16 row-major f16) * B (16x8 row-major f16): A by ldmatrix_x4, B by ldmatrix_x2_trans.
extern "C" __global__ void ldm_mma_k16(float *d, const unsigned short *a, const unsigned short *b) {
    __shared__ __align__(16) unsigned short as[16][16];
    __shared__ __align__(16) unsigned short bs[16][8];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) as[i / 16][i % 16] = a[i];
    for (int i = lane; i < 128; i += 32) bs[i / 8][i % 8] = b[i];
    __syncthreads();
    unsigned ar[4], br[2];
    // A's matrices: rows 0-7 and 8-15 of columns 0-7, then of columns 8-15.
    const int a_col = 8 * (spio::ldmatrix_matrix<4>(lane) / 2);
    spio::ldmatrix_x4(ar, &as[spio::ldmatrix_row<2>(lane)][a_col]);
    spio::ldmatrix_x2_trans(br, &bs[spio::ldmatrix_row<2>(lane)][0]);
    float c[4] = {0.f, 0.f, 0.f, 0.f}, dr[4];
    spio::mma_m16n8k16_f16(dr, ar, br, c);
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + (i % 2)] = dr[i];
}

/// Thread i copies 16-byte chunk i with src_bytes[i] bytes (rest zero-filled) via cp.async.
extern "C" __global__ void cp_async_fill(unsigned char *out, const unsigned char *src,
                                         const int *src_bytes, int n) {
    __shared__ __align__(16) unsigned char smem[128 * 16];
    const int i = threadIdx.x;
    if (i < n) spio::cp_async_16(&smem[16 * i], src + 16 * i, src_bytes[i]);
    spio::cp_async_commit_group();
    spio::cp_async_wait_all();
    __syncthreads();
    if (i < n) {
        for (int b = 0; b < 16; ++b) out[16 * i + b] = smem[16 * i + b];
    }
}

/// Two groups, wait_group<1> then wait_group<0>: snapshots of the second chunk before and after.
extern "C" __global__ void cp_async_groups(float *out, const float *src) {
    __shared__ __align__(16) float smem[2][32][4];
    const int i = threadIdx.x;
    spio::cp_async_16(&smem[0][i][0], src + 4 * i, 16);
    spio::cp_async_commit_group();
    spio::cp_async_16(&smem[1][i][0], src + 128 + 4 * i, 16);
    spio::cp_async_commit_group();
    spio::cp_async_wait_group<1>();
    for (int k = 0; k < 4; ++k) out[i * 12 + k] = smem[0][i][k];
    for (int k = 0; k < 4; ++k) out[i * 12 + 4 + k] = smem[1][i][k];  // not yet waited for
    spio::cp_async_wait_group<0>();
    for (int k = 0; k < 4; ++k) out[i * 12 + 8 + k] = smem[1][i][k];
}

extern "C" __global__ void shuffles(int *out, const int *in, int width, int delta) {
    const int lane = threadIdx.x;
    const int v = in[lane];
    out[lane * 4 + 0] = __shfl_sync(0xffffffffu, v, (lane * 7 + delta) & 31, width);
    out[lane * 4 + 1] = __shfl_up_sync(0xffffffffu, v, delta, width);
    out[lane * 4 + 2] = __shfl_down_sync(0xffffffffu, v, delta, width);
    out[lane * 4 + 3] = __shfl_xor_sync(0xffffffffu, v, delta, width);
}

/// 8-byte shuffles move the whole value: an xor of 64-bit integers and an index of doubles.
extern "C" __global__ void shuffle_wide(long long *out, const long long *in, double *dout,
                                        const double *din) {
    const int lane = threadIdx.x;
    out[lane] = __shfl_xor_sync(0xffffffffu, in[lane], 5);
    dout[lane] = __shfl_sync(0xffffffffu, din[lane], (lane * 3) & 31);
}

/// Lanes below `leave` exit; the others record __activemask(), then sync among themselves (so
/// that none has exited when another asks).
extern "C" __global__ void active_lanes(unsigned *out, int leave) {
    const int lane = threadIdx.x;
    if (lane < leave) return;
    out[lane] = __activemask();
    __syncwarp(0xffffffffu << leave);
}

/// One thread applies each atomic kind once and records the old values it returns.
extern "C" __global__ void atomic_kinds(int *iv, unsigned *uv, unsigned long long *lv,
                                        double *dv, long long *old, double *dold) {
    old[0] = atomicAdd(&iv[0], 5);
    old[1] = atomicMax(&iv[1], 7);
    old[2] = atomicMax(&iv[2], -9);
    old[3] = atomicMin(&iv[3], -9);
    old[4] = atomicMin(&iv[4], 7);
    old[5] = atomicAdd(&uv[0], 0xfffffff0u);
    old[6] = atomicExch(&uv[1], 77u);
    old[7] = atomicCAS(&uv[2], 5u, 9u);
    old[8] = atomicCAS(&uv[3], 5u, 9u);
    old[9] = static_cast<long long>(atomicAdd(&lv[0], 1ull << 40));
    dold[0] = atomicAdd(&dv[0], 0.25);
}

/// One thread copies `nbytes` bytes from src + offset by cp.async (the rest zero-filled).
extern "C" __global__ void cp_async_at(float *out, const float *src, int offset, int nbytes) {
    __shared__ __align__(16) float smem[4];
    spio::cp_async_16(smem, src + offset, nbytes);
    spio::cp_async_commit_group();
    spio::cp_async_wait_all();
    for (int k = 0; k < 4; ++k) out[k] = smem[k];
}

/// cp.async, then wait_group<0> with the copy committed (`commit` 1) or left in no group.
extern "C" __global__ void cp_async_uncommitted(float *out, const float *src, int commit) {
    __shared__ __align__(16) float smem[32][4];
    const int i = threadIdx.x;
    spio::cp_async_16(smem[i], src + 4 * i, 16);
    if (commit) spio::cp_async_commit_group();
    spio::cp_async_wait_group<0>();
    for (int k = 0; k < 4; ++k) out[4 * i + k] = smem[i][k];
    spio::cp_async_wait_all();
}

extern "C" __global__ void shuffle_float(float *out, const float *in) {
    const int lane = threadIdx.x;
    float v = in[lane];
    for (int m = 16; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    out[lane] = v;
}

extern "C" __global__ void atomic_scatter(float *out, const int *index, const float *value, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&out[index[i]], value[i]);
}

/// Each thread takes the next ticket of a global counter: the tickets give the order in which the
/// threads ran.
extern "C" __global__ void ticket(unsigned *order, unsigned *counter) {
    order[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(counter, 1u);
}

extern "C" __global__ void dynamic_shared(float *out, const float *in, int n) {
    extern __shared__ __align__(16) float dyn[];
    const int i = threadIdx.x;
    dyn[i] = in[i] * 2.0f;
    __syncthreads();
    out[i] = dyn[n - 1 - i];
}

/// Thread i commits 8 groups (group k: one copy, chunk k of the thread), then `empties` empty
/// groups, then cp.async.wait_group N, and snapshots all 8 chunks (chunk k of thread i at
/// out[((k * 32) + i) * 4 ..]); copies still pending read as the emulator's poison when unchecked.
template <int N>
__device__ void cp_async_wait_n_test(float *out, const float *src, int empties) {
    __shared__ __align__(16) float smem[8][32][4];
    const int i = threadIdx.x;
    for (int k = 0; k < 8; ++k) {
        spio::cp_async_16(&smem[k][i][0], src + (k * 32 + i) * 4, 16);
        spio::cp_async_commit_group();
    }
    for (int e = 0; e < empties; ++e) spio::cp_async_commit_group();
    spio::cp_async_wait_group<N>();
    for (int k = 0; k < 8; ++k) {
        for (int e = 0; e < 4; ++e) out[(k * 32 + i) * 4 + e] = smem[k][i][e];
    }
    spio::cp_async_wait_all();
}

#define CP_ASYNC_WAIT_N_KERNEL(n)                                                           \
    extern "C" __global__ void cp_async_wait_n##n(float *out, const float *src, int empties) { \
        cp_async_wait_n_test<n>(out, src, empties);                                         \
    }
CP_ASYNC_WAIT_N_KERNEL(0)
CP_ASYNC_WAIT_N_KERNEL(1)
CP_ASYNC_WAIT_N_KERNEL(2)
CP_ASYNC_WAIT_N_KERNEL(3)
CP_ASYNC_WAIT_N_KERNEL(6)

/// The predicated form: thread i fills its 16-byte chunk with the byte pattern 0xA5, then copies
/// src_bytes[i] bytes into it with cp_async_16_if(enable[i], ...). A disabled copy writes nothing
/// (no zero-fill either): the chunk keeps 0xA5.
extern "C" __global__ void cp_async_if_fill(unsigned char *out, const unsigned char *src,
                                            const int *enable, const int *src_bytes) {
    __shared__ __align__(16) unsigned char smem[64 * 16];
    const int i = threadIdx.x;
    for (int b = 0; b < 16; ++b) smem[16 * i + b] = 0xA5;
    __syncthreads();
    spio::cp_async_16_if(enable[i] != 0, &smem[16 * i], src + 16 * i, src_bytes[i]);
    spio::cp_async_commit_group();
    spio::cp_async_wait_all();
    __syncthreads();
    for (int b = 0; b < 16; ++b) out[16 * i + b] = smem[16 * i + b];
}
"""

HAZARDS = r"""
#include "spio/thread/async_copy.h"
#include "spio/warp/ldmatrix.h"

/// Each thread reads its neighbour's shared value; `fixed` puts the barrier in.
extern "C" __global__ void neighbour(float *out, const float *in, int fixed) {
    __shared__ float s[128];
    const int i = threadIdx.x;
    s[i] = in[i];
    if (fixed) __syncthreads();
    out[i] = s[(i + 1) % 128];
}

/// cp.async staging; `fixed` puts the wait in.
extern "C" __global__ void staged(float *out, const float *in, int fixed) {
    __shared__ __align__(16) float s[64 * 4];
    const int i = threadIdx.x;
    spio::cp_async_16(&s[4 * i], in + 4 * i, 16);
    spio::cp_async_commit_group();
    if (fixed) spio::cp_async_wait_all();
    __syncthreads();
    out[i] = s[(4 * i + 5) % 256];
}

/// A pipeline's tail: each thread uses its staged chunk, then prefetches the next one, which no
/// step reads; `fixed` waits for that copy before the thread exits.
extern "C" __global__ void prefetch_tail(float *out, const float *in, int fixed) {
    __shared__ __align__(16) float s[2][64 * 4];
    const int i = threadIdx.x;
    spio::cp_async_16(&s[0][4 * i], in + 4 * i, 16);
    spio::cp_async_wait_all();
    out[i] = s[0][4 * i];
    spio::cp_async_16(&s[1][4 * i], in + 256 + 4 * i, 16);
    spio::cp_async_commit_group();
    if (fixed) spio::cp_async_wait_all();
}

/// out[i + shift] = in[i] for i < n: shift 1 writes one element past the end.
extern "C" __global__ void shifted_write(float *out, const float *in, int n, int shift) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i + shift] = in[i];
}

/// Thread 0 clears the first `n_clear` floats of `out` and copies `n_copy` floats of `in` after
/// them. clang hands memset and memcpy in a checked build to the runtime, which checks them (GCC
/// leaves them to the C library, unchecked).
extern "C" __global__ void clear_then_copy(float *out, const float *in, int n_clear, int n_copy) {
    if (threadIdx.x == 0) {
        memset(out, 0, n_clear * sizeof(float));
        memcpy(out + n_clear, in, n_copy * sizeof(float));
    }
}

/// Lanes 0..15 leave before a full-warp shuffle.
extern "C" __global__ void early_exit(int *out, int leave) {
    const int lane = threadIdx.x;
    if (leave && lane < 16) return;
    out[lane] = __shfl_xor_sync(0xffffffffu, lane, 1);
}

/// out[i] = x[i + shift] + y[i] for i < n: shift 1 reads one element past the end of x.
extern "C" __global__ void read_ahead(float *out, const float *x, const float *y, int n,
                                      int shift) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i + shift] + y[i];
}

/// Thread i reads chunk i + 1 of a cp.async-filled buffer, then refills its own chunk i by
/// cp.async: thread i - 1 may still have to read it unless `fixed` puts a barrier in between
/// (the refill's wait comes after a barrier either way).
extern "C" __global__ void refill(float *out, const float *in, int fixed) {
    __shared__ __align__(16) float s[64 * 4];
    const int i = threadIdx.x;
    spio::cp_async_16(&s[4 * i], in + 4 * i, 16);
    spio::cp_async_wait_all();
    __syncthreads();
    const float v = i < 63 ? s[4 * (i + 1)] : 0.f;
    if (fixed) __syncthreads();
    spio::cp_async_16(&s[4 * i], in + 256 + 4 * i, 16);
    spio::cp_async_commit_group();
    __syncthreads();
    spio::cp_async_wait_all();
    out[i] = v + s[4 * i];
}

/// out[0] = the sum of in[0..127]: thread 0 adds them up (`fixed` 1), or every thread adds its
/// own to the shared total with a plain read-modify-write (a lost update).
extern "C" __global__ void shared_sum(float *out, const float *in, int fixed) {
    __shared__ float total;
    __shared__ float s[128];
    const int i = threadIdx.x;
    s[i] = in[i];
    if (i == 0) total = 0.f;
    __syncthreads();
    if (!fixed) {
        total += s[i];
    } else if (i == 0) {
        for (int k = 0; k < 128; ++k) total += s[k];
    }
    __syncthreads();
    if (i == 0) out[0] = total;
}

/// Lanes 0..15 write; then the whole warp syncs (`full` 1), or each half only itself (`full` 0,
/// a race); lanes 16..31 read what lanes 0..15 wrote.
extern "C" __global__ void half_syncwarp(int *out, int full) {
    __shared__ int s[32];
    const int lane = threadIdx.x;
    if (lane < 16) s[lane] = lane + 100;
    if (full) {
        __syncwarp();
    } else if (lane < 16) {
        __syncwarp(0x0000ffffu);
    } else {
        __syncwarp(0xffff0000u);
    }
    out[lane] = lane >= 16 ? s[lane - 16] : 0;
}

/// Every lane reads a counter, the warp syncs, and lane 0 increments it (reading it again):
/// legal, in shared memory (`global_mem` 0) or global memory (1).
extern "C" __global__ void reread_after_syncwarp(int *count, int global_mem) {
    __shared__ int s;
    int *c = global_mem ? count : &s;
    if (!global_mem && threadIdx.x == 0) s = 7;
    __syncthreads();
    const int seen = *c;
    __syncwarp();
    if (threadIdx.x == 0) *c += 1;
    __syncwarp();
    count[1 + threadIdx.x] = seen + *c;
}

/// Lanes 0..7 stage the rows of an 8x8 16-bit matrix by cp.async; after a __syncthreads the warp
/// loads it with ldmatrix_x1, the copies waited for before the barrier (`fixed` 1) or not.
extern "C" __global__ void ldm_staged(unsigned *out, const unsigned short *m, int fixed) {
    __shared__ __align__(16) unsigned short rows[8][8];
    const int lane = threadIdx.x;
    if (lane < 8) spio::cp_async_16(rows[lane], m + 8 * lane, 16);
    spio::cp_async_commit_group();
    if (fixed) spio::cp_async_wait_all();
    __syncthreads();
    unsigned d[1];
    spio::ldmatrix_x1(d, rows[lane % 8]);
    out[lane] = d[0];
    spio::cp_async_wait_all();
}

/// ldmatrix_x1 of an 8x8 matrix whose row `bad_row` address is 8 bytes off (-1: none is).
extern "C" __global__ void ldm_row_alignment(unsigned *out, int bad_row) {
    __shared__ __align__(16) unsigned short rows[8][16];
    const int lane = threadIdx.x;
    for (int k = 0; k < 4; ++k) rows[lane / 4][4 * (lane % 4) + k] = 4 * lane + k;
    __syncthreads();
    unsigned d[1];
    spio::ldmatrix_x1(d, &rows[lane % 8][lane == bad_row ? 4 : 0]);
    out[lane] = d[0];
}

/// Thread i stages chunk i by cp.async, waits, and reads chunk i - 1: after a __syncthreads
/// (`fixed` 1), or racing with thread i - 1's copy, which only its own wait made visible.
extern "C" __global__ void landed_neighbour(float *out, const float *in, int fixed) {
    __shared__ __align__(16) float s[64 * 4];
    const int i = threadIdx.x;
    spio::cp_async_16(&s[4 * i], in + 4 * i, 16);
    spio::cp_async_commit_group();
    spio::cp_async_wait_all();
    if (fixed) __syncthreads();
    out[i] = i > 0 ? s[4 * (i - 1)] : 0.f;
}

/// Threads 2k and 2k + 1 both store to s[k] (`fixed` 0: a write-write race), or only 2k does.
extern "C" __global__ void pair_store(float *out, const float *in, int fixed) {
    __shared__ float s[64];
    const int i = threadIdx.x;
    if (!fixed || i % 2 == 0) s[i / 2] = in[i];
    __syncthreads();
    if (i < 64) out[i] = s[i];
}

/// Thread 0 reads s, then thread 40 (another warp) overwrites it, after a __syncthreads (`fixed`
/// 1) or with none in between (a race).
extern "C" __global__ void read_then_store(float *out, int fixed) {
    __shared__ float s;
    const int i = threadIdx.x;
    if (i == 0) s = 1.f;
    __syncthreads();
    const float v = i == 0 ? s : 0.f;
    if (fixed) __syncthreads();
    if (i == 40) s = 2.f;
    out[i] = v;
}

/// Lanes 0 and 1 read s; lane 2 then overwrites it after a __syncwarp with both (`fixed` 1), or
/// with lane 0 only (a race with lane 1's read).
extern "C" __global__ void reader_pair(int *out, int fixed) {
    __shared__ int s;
    const int lane = threadIdx.x;
    if (lane == 0) s = 5;
    __syncthreads();
    const int v = lane < 2 ? s : 0;
    if (fixed ? lane < 3 : lane == 0 || lane == 2) __syncwarp(fixed ? 0x7u : 0x5u);
    if (lane == 2) s = 6;
    out[lane] = v;
}

/// Warp 1 exits while warp 0 waits at a __syncthreads: the exits release the barrier.
extern "C" __global__ void exit_then_barrier(float *out, const float *in) {
    __shared__ float s[32];
    const int i = threadIdx.x;
    if (i >= 32) return;
    s[i] = in[i];
    __syncthreads();
    out[i] = s[31 - i];
}

/// Lanes 0..15 wait at a __syncthreads, lanes 16..31 at a __syncwarp for the whole warp.
extern "C" __global__ void split_barriers(int *out) {
    const int lane = threadIdx.x;
    if (lane < 16) {
        __syncthreads();
    } else {
        __syncwarp();
    }
    out[lane] = lane;
}

/// out[0..3] = x[offset..offset + 3], copied as one float4.
extern "C" __global__ void vector_copy(float *out, const float *x, int offset) {
    *reinterpret_cast<float4 *>(out) = *reinterpret_cast<const float4 *>(x + offset);
}

/// out[0..3] = the 16 bytes at `offset` bytes into 64 bytes of shared memory, read as one uint4
/// (`store`: written there as one uint4, then read back as words).
extern "C" __global__ void shared_vector(unsigned *out, int offset, int store) {
    __shared__ uint4 s[4];
    unsigned *words = reinterpret_cast<unsigned *>(s);
    for (int i = 0; i < 16; ++i) words[i] = i;
    uint4 *at = reinterpret_cast<uint4 *>(reinterpret_cast<char *>(s) + offset);
    if (store) {
        *at = make_uint4(100, 101, 102, 103);
        for (int i = 0; i < 4; ++i) out[i] = words[offset / 4 + i];
    } else {
        const uint4 v = *at;
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    }
}

/// 16 bytes of 8-byte alignment, legal at any 8-byte boundary.
struct Pair {
    long long a, b;
};

/// out[1..2] = x[1..2], copied as one Pair at an 8-byte (not 16-byte) boundary.
extern "C" __global__ void struct_copy(long long *out, const long long *x) {
    *reinterpret_cast<Pair *>(out + 1) = *reinterpret_cast<const Pair *>(x + 1);
}

/// out[0..1] = the Pair of shared memory at an 8-byte boundary, read as one.
extern "C" __global__ void struct_read(long long *out, const long long *x) {
    __shared__ Pair s[3];
    long long *words = reinterpret_cast<long long *>(s);
    for (int i = 0; i < 6; ++i) words[i] = x[i];
    const Pair p = *reinterpret_cast<const Pair *>(words + 1);
    out[0] = p.a, out[1] = p.b;
}

/// Each half of the warp works on its own mask: a __syncwarp, a shuffle and a ballot. `bad` 1:
/// the upper half names the whole warp in its __syncwarp, which the lower half never joins;
/// `bad` 2: the shuffle reads the lane 16 away, in the other half, outside its mask.
extern "C" __global__ void warp_halves(unsigned *out, int bad) {
    __shared__ unsigned s[32];
    const int lane = threadIdx.x;
    const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    s[lane] = lane;
    __syncwarp(bad == 1 && lane >= 16 ? 0xffffffffu : mask);
    out[3 * lane] = s[lane ^ 1];
    out[3 * lane + 1] = __shfl_xor_sync(mask, lane, bad == 2 ? 16 : 2);
    out[3 * lane + 2] = __ballot_sync(mask, lane & 1);
}

/// Thread i copies src[4i..4i+3] by cp.async, then overwrites src[4i] before its wait (`bug` 1),
/// or thread i - 1 overwrites it after a __syncthreads but before thread i's wait (`bug` 2): the
/// copy may read the old value or the new. `bug` 0 overwrites after the waits and a barrier.
/// out[i] = s[4i].
extern "C" __global__ void source_overwritten(float *out, float *src, int bug) {
    __shared__ __align__(16) float s[64 * 4];
    const int i = threadIdx.x, next = (i + 1) % blockDim.x;
    spio::cp_async_16(&s[4 * i], src + 4 * i, 16);
    spio::cp_async_commit_group();
    if (bug == 1) src[4 * i] = -1.f;
    __syncthreads();
    if (bug == 2) src[4 * next] = -1.f;
    __syncthreads();
    spio::cp_async_wait_all();
    __syncthreads();
    if (bug == 0) src[4 * next] = -1.f;
    out[i] = s[4 * i];
}

/// Every thread adds 1 to a shared counter atomically, and thread 0 reads it after a
/// __syncthreads (`bug` 0), or after a __syncwarp in a one-warp block (`bug` 3). `bug` 1: every
/// thread reads it right after its own atomic, racing with the others' atomics; `bug` 2: thread 1
/// sets it with a plain store instead, racing with them. out[0] = the count.
extern "C" __global__ void shared_count(int *out, int bug) {
    __shared__ int c;
    const int i = threadIdx.x;
    if (i == 0) c = 0;
    __syncthreads();
    if (bug == 2 && i == 1) {
        c = 100;
    } else {
        atomicAdd(&c, 1);
    }
    if (bug == 1) out[i] = c;
    if (bug == 3) {
        __syncwarp();
    } else {
        __syncthreads();
    }
    if (bug != 1 && i == 0) out[0] = c;
}

/// Lanes 0 and 1 read g[0]; lane 0 then stores to it after a __syncwarp of lanes 0 and 1
/// (`fixed` 1), or of lanes 0 and 2 (a race with lane 1's read). The other lanes take no part.
extern "C" __global__ void reader_pair_global(int *g, int fixed) {
    const int lane = threadIdx.x;
    const int v = lane < 2 ? g[0] : 0;
    if (fixed ? lane < 2 : lane == 0 || lane == 2) __syncwarp(fixed ? 0x3u : 0x5u);
    if (lane == 0) g[0] = v + 1;
}
"""

SHARED_OOB = r"""
/// Writes s[i + shift]: shift 1 indexes one element past the static shared array.
extern "C" __global__ void shared_index(float *out, const float *in, int shift) {
    __shared__ float s[128];
    const int i = threadIdx.x;
    s[i + shift] = in[i];
    __syncthreads();
    out[i] = s[i];
}

/// Reads d[i + shift] of 128 dynamic floats: shift 1 reads one element past the end.
extern "C" __global__ void dynamic_read_index(float *out, const float *in, int shift) {
    extern __shared__ float d[];
    const int i = threadIdx.x;
    d[i] = in[i];
    __syncthreads();
    out[i] = d[i + shift];
}

/// Same with dynamic shared memory of 128 floats.
extern "C" __global__ void dynamic_index(float *out, const float *in, int shift) {
    extern __shared__ float d[];
    const int i = threadIdx.x;
    d[i + shift] = in[i];
    __syncthreads();
    out[i] = d[i];
}
"""

GLOBAL_RACES = r"""
#include "spio/thread/async_copy.h"

/// Thread 0 of block b stores in[b] + in[0] to out[b]; `bug` 1: every block stores to out[0].
extern "C" __global__ void store_per_block(float *out, const float *in, int bug) {
    if (threadIdx.x == 0) out[bug ? 0 : blockIdx.x] = in[blockIdx.x] + in[0];
}

/// Block b stores in[b] plus the previous element: in[b - 1], or (`bug` 1) out[b - 1], which
/// block b - 1 stores in the same launch.
extern "C" __global__ void prefix_step(float *out, const float *in, int bug) {
    const int b = blockIdx.x;
    if (threadIdx.x == 0) out[b] = in[b] + (b == 0 ? 0.f : bug ? out[b - 1] : in[b - 1]);
}

/// Block b stores element b + 1 to x[b]: from a copy y, or (`bug` 1) from x itself, which block
/// b + 1 overwrites in the same launch.
extern "C" __global__ void shift_down(float *x, const float *y, int n, int bug) {
    const int b = blockIdx.x;
    if (threadIdx.x == 0 && b + 1 < n) x[b] = bug ? x[b + 1] : y[b + 1];
}

/// Every block adds 1 to total[0] without an atomic (a lost update on a GPU).
extern "C" __global__ void add_one(float *total) {
    if (threadIdx.x == 0) total[0] += 1.0f;
}

/// Every thread counts itself into counts[0] atomically. `bug` 1: the last block's thread 0 also
/// reads the count with a plain load; `bug` 2: block 0's thread 0 first sets it with a plain store;
/// `bug` 3: block 0's thread 0 reads it with a plain load, before the other blocks' atomics.
extern "C" __global__ void count_threads(unsigned *counts, int bug) {
    if (bug == 2 && blockIdx.x == 0 && threadIdx.x == 0) counts[0] = 0;
    __syncthreads();
    atomicAdd(&counts[0], 1u);
    __syncthreads();
    if (bug == 1 && blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) counts[1] = counts[0];
    if (bug == 3 && blockIdx.x == 0 && threadIdx.x == 0) counts[1] = counts[0];
}

/// Block b stores b to row b of buf (4 floats), then copies a row by cp.async: its own, or (`bug`
/// 1) row b + 1, which block b + 1 stores in the same launch. out[b] = the row copied.
extern "C" __global__ void row_handoff(float *out, float *buf, int bug) {
    __shared__ __align__(16) float s[4];
    const int b = blockIdx.x, i = threadIdx.x;
    if (i < 4) buf[4 * b + i] = float(b);
    __syncthreads();
    if (i == 0) {
        spio::cp_async_16(s, buf + 4 * (bug ? (b + 1) % gridDim.x : b), 16);
        spio::cp_async_commit_group();
        spio::cp_async_wait_all();
    }
    __syncthreads();
    if (i < 4) out[4 * b + i] = s[i];
}

/// Thread 0 of block b stores b to out[index + b], or (`collide` 1) every block to out[index].
extern "C" __global__ void store_at(float *out, int index, int collide) {
    if (threadIdx.x == 0) out[index + (collide ? 0 : blockIdx.x)] = float(blockIdx.x);
}

/// Thread i stores i to buf[i], then reads its neighbour's element: after a __syncthreads
/// (`fixed` 1), or racing with the neighbour's store.
extern "C" __global__ void global_neighbour(float *out, float *buf, int fixed) {
    const int i = threadIdx.x;
    buf[i] = float(i);
    if (fixed) __syncthreads();
    out[i] = buf[(i + 1) % blockDim.x];
}
"""

BULK = r"""
#include "spio/thread/bulk_copy.h"

/// Thread 0 initialises `n` mbarriers expecting `count` arrivals each and fences the
/// initialisation; then the block syncs, so that every thread may use them.
__device__ void init_mbarriers(unsigned long long *bar, int n, unsigned count) {
    if (threadIdx.x == 0) {
        for (int k = 0; k < n; ++k) spio::mbarrier_init(&bar[k], count);
        spio::fence_mbarrier_init();
    }
    __syncthreads();
}

/// Streams `rows` rows of 64 floats through two shared buffers with bulk copies, one mbarrier per
/// buffer; thread i writes out[row * 64 + i] = row's element (i * 5) % 64. `bug`: 0 none, 1 read
/// before the wait, 2 announce 16 bytes more than copied, 3 skip the last wait, 4 wait on the
/// wrong parity.
extern "C" __global__ void bulk_rows(float *out, const float *in, int rows, int bug) {
    __shared__ __align__(16) float buf[2][64];
    __shared__ __align__(8) unsigned long long bar[2];
    const int i = threadIdx.x;
    init_mbarriers(bar, 2, 1);
    const auto load = [&](int row) {
        spio::mbarrier_arrive_expect_tx(&bar[row % 2], 256 + (bug == 2 ? 16 : 0));
        spio::cp_async_bulk_g2s(buf[row % 2], in + 64 * row, 256, &bar[row % 2]);
    };
    if (i == 0) {
        for (int row = 0; row < 2 && row < rows; ++row) load(row);
    }
    for (int row = 0; row < rows; ++row) {
        const bool skip = bug == 1 || (bug == 3 && row == rows - 1);
        if (!skip) spio::mbarrier_wait_parity(&bar[row % 2], ((row / 2) & 1) ^ (bug == 4));
        out[row * 64 + i] = buf[row % 2][(i * 5) % 64];
        __syncthreads();  // every thread is done with the buffer before it is refilled
        if (i == 0 && row + 2 < rows) {
            spio::fence_proxy_async_shared();
            load(row + 2);
        }
    }
}

/// The last thread fills buf through bar[0]; every thread waits and reads it; the last thread then
/// refills it through bar[1], after a __syncthreads (`fixed` 1) or while the others may still be
/// reading (`fixed` 0). out[i] = in[(i * 5) % 64] + in[64 + i].
extern "C" __global__ void bulk_refill(float *out, const float *in, int fixed) {
    __shared__ __align__(16) float buf[64];
    __shared__ __align__(8) unsigned long long bar[2];
    const int i = threadIdx.x, last = blockDim.x - 1;
    init_mbarriers(bar, 2, 1);
    if (i == last) {
        spio::mbarrier_arrive_expect_tx(&bar[0], 256);
        spio::cp_async_bulk_g2s(buf, in, 256, &bar[0]);
    }
    __syncthreads();
    spio::mbarrier_wait_parity(&bar[0], 0);
    const float v = buf[(i * 5) % 64];
    if (fixed) __syncthreads();
    if (i == last) {
        spio::fence_proxy_async_shared();
        spio::mbarrier_arrive_expect_tx(&bar[1], 256);
        spio::cp_async_bulk_g2s(buf, in + 64, 256, &bar[1]);
    }
    spio::mbarrier_wait_parity(&bar[1], 0);
    out[i] = v + buf[i];
}

/// Only thread 0 waits for the bulk copy; the others read the data with no wait of their own,
/// after a __syncthreads (`fixed` 1) or with nothing in between (`fixed` 0).
extern "C" __global__ void bulk_one_waiter(float *out, const float *in, int fixed) {
    __shared__ __align__(16) float buf[64];
    __shared__ __align__(8) unsigned long long bar;
    const int i = threadIdx.x;
    init_mbarriers(&bar, 1, 1);
    if (i == 0) {
        spio::mbarrier_arrive_expect_tx(&bar, 256);
        spio::cp_async_bulk_g2s(buf, in, 256, &bar);
        spio::mbarrier_wait_parity(&bar, 0);
    }
    if (fixed) __syncthreads();
    out[i] = buf[(i * 5) % 64];
}

/// An mbarrier expecting two arrivals: in each of two phases threads 0 and 1 each announce and
/// bulk-copy half of a 64-float row; every thread waits and reads.
/// out[64 * phase + i] = in[64 * phase + (i * 5) % 64].
extern "C" __global__ void bulk_two_arrivals(float *out, const float *in) {
    __shared__ __align__(16) float buf[64];
    __shared__ __align__(8) unsigned long long bar;
    const int i = threadIdx.x;
    init_mbarriers(&bar, 1, 2);
    for (int phase = 0; phase < 2; ++phase) {
        if (i < 2) {
            spio::fence_proxy_async_shared();
            spio::mbarrier_arrive_expect_tx(&bar, 128);
            spio::cp_async_bulk_g2s(buf + 32 * i, in + 64 * phase + 32 * i, 128, &bar);
        }
        spio::mbarrier_wait_parity(&bar, phase);
        out[64 * phase + i] = buf[(i * 5) % 64];
        __syncthreads();
    }
}

/// Warp 0 waits on an mbarrier while warp 1 first runs `steps` rounds of shuffles; then thread 32
/// announces 16 bytes and bulk-copies them from `in` (`arrive` 1), or never does (a deadlock).
/// out[i] = in[i % 4] for warp 0.
extern "C" __global__ void late_producer(float *out, const float *in, int steps, int arrive) {
    __shared__ __align__(16) float buf[4];
    __shared__ __align__(8) unsigned long long bar;
    const int i = threadIdx.x;
    init_mbarriers(&bar, 1, 1);
    if (i < 32) {
        spio::mbarrier_wait_parity(&bar, 0);
        out[i] = buf[i % 4];
        return;
    }
    unsigned v = i;
    for (int k = 0; k < steps; ++k) v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[i] = float(v % 7);
    if (i == 32 && arrive) {
        spio::mbarrier_arrive_expect_tx(&bar, 16);
        spio::cp_async_bulk_g2s(buf, in, 16, &bar);
        spio::mbarrier_wait_parity(&bar, 0);
    }
}

/// Thread 0 bulk-copies in[0..63]; thread 1 overwrites in[0] before the barrier that comes before
/// anyone waits (`bug` 1: the copy may read the old value or the new), or after every thread's
/// wait and a __syncthreads (`bug` 0). out[i] = buf[i].
extern "C" __global__ void bulk_source_overwritten(float *out, float *in, int bug) {
    __shared__ __align__(16) float buf[64];
    __shared__ __align__(8) unsigned long long bar;
    const int i = threadIdx.x;
    init_mbarriers(&bar, 1, 1);
    if (i == 0) {
        spio::mbarrier_arrive_expect_tx(&bar, 256);
        spio::cp_async_bulk_g2s(buf, in, 256, &bar);
    }
    if (bug && i == 1) in[0] = -1.f;
    __syncthreads();
    spio::mbarrier_wait_parity(&bar, 0);
    out[i] = buf[i];
    __syncthreads();
    if (!bug && i == 1) in[0] = -1.f;
}

/// Thread 0 starts a bulk copy that no thread waits for.
extern "C" __global__ void bulk_unwaited(const float *in) {
    __shared__ __align__(16) float buf[64];
    __shared__ __align__(8) unsigned long long bar;
    init_mbarriers(&bar, 1, 1);
    if (threadIdx.x == 0) {
        spio::mbarrier_arrive_expect_tx(&bar, 256);
        spio::cp_async_bulk_g2s(buf, in, 256, &bar);
    }
}
"""

SOURCES = {
    "primitives": PRIMITIVES,
    "hazards": HAZARDS,
    "shared_oob": SHARED_OOB,
    "global_races": GLOBAL_RACES,
}


@pytest.fixture(scope="session")
def emu_sources() -> dict[str, str]:
    return SOURCES


@pytest.fixture
def cuda_include(tmp_path, monkeypatch):
    """An empty folder (tmp_path/include) as the emulator's CUDA headers, its cached lookups
    cleared before the test and after it."""
    from spio.emulator import build

    folder = tmp_path / "include"
    folder.mkdir()
    monkeypatch.setattr(build.paths, "find_cuda_include", lambda: folder)
    forget_toolchain_memos()  # (the emulator's headers' folder and identity among them)
    yield folder
    forget_toolchain_memos()


def _find_clang() -> str | None:
    """A clang++ on PATH that the emulator takes (clang 16 or newer): plain, or the newest
    versioned name (Debian's clang++-16)."""
    from spio.emulator import build

    for name in ("clang++", *(f"clang++-{version}" for version in range(30, 15, -1))):
        if shutil.which(name):
            try:
                build.check_flags(name)
            except build.EmulatorBuildError:  # too old
                continue
            return name
    return None


#: A clang++ the emulator takes, where one is installed: the checked kernels' tests run with it
#: too, as CXX=clang++ would build them (its ThreadSanitizer instrumentation calls more, and
#: other, callbacks).
CLANG = _find_clang()
#: The host compilers the test kernels are built with: the default (CXX, else g++) and clang++.
COMPILERS = ["default", *(["clang"] if CLANG else [])]


def load(source: str, name: str, compiler: str = "default"):
    """`source` built for the emulator by `compiler` (one of COMPILERS) and loaded."""
    from spio.emulator import load_module

    if compiler == "default":
        return load_module(source, name=name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CXX", CLANG)
        return load_module(source, name=name)


def _built_by_each_compiler(fixture: str, source: str, name: str):
    """A session fixture named `fixture`: `source` built by each of COMPILERS, as library `name`."""

    @pytest.fixture(scope="session", params=COMPILERS, name=fixture)
    def built(request):
        return load(source, name, request.param)

    return built


prims = _built_by_each_compiler("prims", PRIMITIVES, "emu_test_primitives")


class OnGpu:
    """A source's kernels compiled by NVRTC for this GPU, launched like the emulator's: tensor
    arguments are copied to the GPU and, after the launch, back into the tensors given, so that a
    test runs unchanged on either. `seed` (the emulator's thread order) has no meaning here."""

    def __init__(self, source: str, name: str):
        import torch

        from spio.compiler import compile_cubin
        from spio.cuda import driver

        self.device = torch.cuda.current_device()
        arch = driver.device_attributes(self.device)["arch"]
        self.module = driver.Module.load(compile_cubin(source, arch, name=name).cubin, self.device)

    def get_function(self, name: str):
        import torch

        function = self.module.get_function(name)

        def launch(grid, block, args, shared_mem_bytes=0, seed=None):
            on_gpu = [a.cuda(self.device) if isinstance(a, torch.Tensor) else a for a in args]
            stream = torch.cuda.current_stream(self.device).cuda_stream
            function.launch(grid, block, on_gpu, shared_mem_bytes=shared_mem_bytes, stream=stream)
            torch.cuda.synchronize(self.device)
            for given, used in zip(args, on_gpu, strict=True):
                if isinstance(given, torch.Tensor):
                    given.copy_(used.cpu())

        return types.SimpleNamespace(launch=launch)


@pytest.fixture(
    scope="session",
    params=[
        "emulator",
        *(["emulator-clang"] if CLANG else []),
        pytest.param("gpu", marks=pytest.mark.cuda),
    ],
)
def prims_and_gpu(request):
    """The primitives' kernels in the emulator (built by each of COMPILERS) and, where there is
    one, on the GPU: the same test on both shows the emulator does what the hardware does."""
    if request.param == "gpu":
        return OnGpu(PRIMITIVES, "emu_test_primitives.cu")
    compiler = "clang" if request.param == "emulator-clang" else "default"
    return load(PRIMITIVES, "emu_test_primitives", compiler)


hazards = _built_by_each_compiler("hazards", HAZARDS, "emu_test_hazards")
bulk = _built_by_each_compiler("bulk", BULK, "emu_test_bulk")
global_races = _built_by_each_compiler("global_races", GLOBAL_RACES, "emu_test_global_races")
shared_oob = _built_by_each_compiler("shared_oob", SHARED_OOB, "emu_test_shared_oob")


BENCH = r"""
#include <cuda_fp16.h>
#include "spio/warp/mma.h"
#include "spio/warp/ldmatrix.h"
#include "spio/thread/async_copy.h"

/// Benchmark kernel of conv-like work: a 3x3 grouped (group width 8) fp16 conv, N=1, C=K=64,
/// 32x32, padding 1, NHWC input/output, weights [K][3][3][8].
/// Tiling: one block per output row, 256 threads = 8 warps, warp w computes channel group w.
/// Each warp: 2 strips of 16 output pixels x 9 taps, one mma.sync m16n8k8 per strip and tap
/// (A = 16 shifted input pixels x 8 channels by ldmatrix_x2, B = the 8x8 tap by ldmatrix_x1).
/// Staging: 3 padded input rows and all weights by cp.async (zero-fill outside the image),
/// one wait_all and one __syncthreads. Launch: grid 32, block 256, no dynamic shared memory.
#define BH 32
#define BW 32
#define BC 64

extern "C" __global__ void __launch_bounds__(256) conv_gw8_bench(__half *y, const __half *x,
                                                                 const __half *w) {
    __shared__ __align__(16) __half xs[3][BW + 2][BC];
    __shared__ __align__(16) __half ws[BC][9][8];
    const int row = blockIdx.x, tid = threadIdx.x;
    for (int id = tid; id < 3 * (BW + 2) * 8; id += 256) {
        const int r = id / ((BW + 2) * 8), col = (id / 8) % (BW + 2), grp = id % 8;
        const int iy = row + r - 1, ix = col - 1;
        const bool ok = iy >= 0 && iy < BH && ix >= 0 && ix < BW;
        const __half *src = ok ? x + (iy * BW + ix) * BC + 8 * grp : x;
        spio::cp_async_16(&xs[r][col][8 * grp], src, ok ? 16 : 0);
    }
    for (int id = tid; id < BC * 9; id += 256) {
        spio::cp_async_16(&ws[id / 9][id % 9][0], w + 8 * id, 16);
    }
    spio::cp_async_commit_group();
    spio::cp_async_wait_all();
    __syncthreads();
    const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
    for (int s = 0; s < 2; ++s) {
        const int x0 = 16 * s;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int r = 0; r < 3; ++r) {
            for (int q = 0; q < 3; ++q) {
                unsigned a[2], b[1];
                spio::ldmatrix_x2(a, &xs[r][x0 + (lane % 16) + q][8 * warp]);
                spio::ldmatrix_x1(b, &ws[8 * warp + (lane % 8)][r * 3 + q][0]);
                spio::mma_m16n8k8_f16(acc, a, b[0], acc);
            }
        }
        for (int i = 0; i < 4; ++i) {
            const int px = x0 + g + 8 * (i / 2), ch = 8 * warp + 2 * t + (i % 2);
            y[(row * BW + px) * BC + ch] = __float2half(acc[i]);
        }
    }
}
"""


@pytest.fixture(scope="session")
def bench_source() -> str:
    return BENCH


@pytest.fixture(scope="session")
def bench():
    from spio.emulator import load_module

    return load_module(BENCH, name="emu_test_bench")
