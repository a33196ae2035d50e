#ifndef SPIO_THREAD_ASYNC_COPY_H_
#define SPIO_THREAD_ASYNC_COPY_H_

/// Per-thread asynchronous copies from global to shared memory (cp.async, sm_80+).
///
/// A thread issues copies, closes them into a group with cp_async_commit_group, and later waits
/// for its groups with cp_async_wait_group<N> or cp_async_wait_all. Waiting covers only the
/// calling thread's copies: a __syncthreads() must follow before other threads read the data.
/// Hazard: shared memory written by cp.async holds stale data until the wait returns.

#include "spio/macros.h"

namespace spio {

/// Starts an asynchronous 16-byte copy from global to shared memory, zero-filling past src_bytes,
/// where `enable` holds; elsewhere the instruction is predicated off. Unlike a branch around the
/// copy, the predicate leaves the addresses worked out on every path, so a compiler can keep them
/// out of a loop where they do not change instead of recomputing them under the branch.
///
/// Parameters:
///   L2_PREFETCH: 0, 128 or 256: with 128 or 256, L2 is asked to fetch that many bytes around the
///     source (PTX .L2::128B / .L2::256B), a hint for streaming reads; 0 gives no hint.
///   enable: whether to copy (a constant true, as in cp_async_16, costs nothing).
///   smem_dst: generic pointer to the 16-byte aligned destination in shared memory.
///   gmem_src: generic pointer to the 16-byte aligned source in global memory.
///   src_bytes: bytes to read from gmem_src, 0..16; the remaining 16 - src_bytes destination
///     bytes are set to zero (0 reads nothing: use it for padding outside the tensor).
/// Assumes:
///   the data are not read before a cp_async_wait_* covering this copy's group (and, by other
///   threads, before a __syncthreads() after that wait).
template <int L2_PREFETCH = 0>
SPIO_DEVICE void cp_async_16_if(bool enable, void *smem_dst, const void *gmem_src, int src_bytes) {
    static_assert(L2_PREFETCH == 0 || L2_PREFETCH == 128 || L2_PREFETCH == 256,
                  "cp_async_16 and cp_async_16_if need L2_PREFETCH 0, 128 or 256");
#if defined(__CUDA_ARCH__)
    const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    const unsigned long long gmem_addr =
        static_cast<unsigned long long>(__cvta_generic_to_global(gmem_src));
    const int on = enable;
#define SPIO_CP_ASYNC_16_ASM(HINT)                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n"                                \
                 "@p cp.async.cg.shared.global" HINT " [%0], [%1], 16, %2;\n}\n"           \
                 :                                                                          \
                 : "r"(smem_addr), "l"(gmem_addr), "r"(src_bytes), "r"(on)                  \
                 : "memory")
    if constexpr (L2_PREFETCH == 256) {
        SPIO_CP_ASYNC_16_ASM(".L2::256B");
    } else if constexpr (L2_PREFETCH == 128) {
        SPIO_CP_ASYNC_16_ASM(".L2::128B");
    } else {
        SPIO_CP_ASYNC_16_ASM("");
    }
#undef SPIO_CP_ASYNC_16_ASM
#else
    if (enable) {
        ::spio::emu::cp_async_16(smem_dst, gmem_src, src_bytes);
    }
#endif
}

/// Starts an asynchronous 16-byte copy from global to shared memory, zero-filling past src_bytes.
///
/// This is cp_async_16_if, always copying.
///
/// Parameters:
///   L2_PREFETCH: 0, 128 or 256, the L2 prefetch hint, as for cp_async_16_if.
///   smem_dst: generic pointer to the 16-byte aligned destination in shared memory.
///   gmem_src: generic pointer to the 16-byte aligned source in global memory.
///   src_bytes: bytes to read from gmem_src, 0..16; the rest of the 16 bytes are set to zero.
/// Assumes:
///   the data are not read before a cp_async_wait_* covering this copy's group (and, by other
///   threads, before a __syncthreads() after that wait).
template <int L2_PREFETCH = 0>
SPIO_DEVICE void cp_async_16(void *smem_dst, const void *gmem_src, int src_bytes) {
    cp_async_16_if<L2_PREFETCH>(true, smem_dst, gmem_src, src_bytes);
}

/// Closes the calling thread's copies issued since the last commit into one group.
SPIO_DEVICE void cp_async_commit_group() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    ::spio::emu::cp_async_commit_group();
#endif
}

/// Waits until at most N of the calling thread's most recent groups are still pending.
///
/// Parameters:
///   N: number of newest groups allowed to remain in flight (0 waits for all committed groups).
template <int N>
SPIO_DEVICE void cp_async_wait_group() {
    static_assert(N >= 0, "cp_async_wait_group needs N >= 0");
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
    ::spio::emu::cp_async_wait_group<N>();
#endif
}

/// Waits for all of the calling thread's copies, committed or not.
SPIO_DEVICE void cp_async_wait_all() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#else
    ::spio::emu::cp_async_wait_all();
#endif
}

/// Works out, once per block, the part of a thread's row-copy addresses that does not depend on
/// the row.
///
/// Thread `thread` handles elements thread + j * THREADS (j < N) of a row of Idx::size 16-byte
/// elements; for each of them `locate(idx, slot, col)` sets its offset in a shared-memory slot and
/// its offset in a global row.
///
/// Parameters:
///   Idx: the index type of a row's elements: Idx::size elements, Idx(i) the i-th.
///   THREADS: the stride between the elements of one thread.
///   N: the number of elements j a thread handles.
///   slot: slot[j] receives element j's offset in a shared-memory slot; -1 if the element lies
///     past Idx::size (the thread has no element j).
///   col: col[j] receives element j's offset in a global row; -1 if the element lies outside the
///     tensor (locate leaves it at -1), or past Idx::size.
///   thread: the calling thread's index (threadIdx.x).
///   locate: locate(idx, slot, col) sets the offsets of element idx, leaving col at -1 when the
///     element lies outside the tensor.
template <typename Idx, int THREADS, int N, typename Locate>
SPIO_DEVICE void plan_row_16(int (&slot)[N], int (&col)[N], int thread, Locate locate) {
    SPIO_UNROLL
    for (int j = 0; j < N; ++j) {
        const int i = thread + j * THREADS;
        slot[j] = -1;
        col[j] = -1;
        if (i < Idx::size) {
            locate(Idx(i), slot[j], col[j]);
        }
    }
}

/// Copies one row of 16-byte elements into shared memory with cp_async_16, following a per-thread
/// plan worked out once (plan_row_16).
///
/// This thread's element j goes to slot + dst[j] from base + row_offset + col[j]. No commit: the
/// copies join the thread's next cp_async_commit_group.
///
/// A branch around a missing element's copy (PREDICATED false) keeps a loop from reusing the
/// copy's shared-memory address work across steps (ptxas redoes it under the branch each time);
/// the predicate (PREDICATED true) lets it, for a few more registers. Which is faster depends on
/// the kernel: the WGrad kernel takes the predicate (150 -> 132 instructions a step on its 64c
/// 64x64 config, NVRTC 12.9, sm_90); FProp's loop came out longer on some configs.
///
/// Parameters:
///   L2_PREFETCH: as for cp_async_16.
///   PREDICATED: a missing element j skips its copy through the instruction's predicate
///     (cp_async_16_if) rather than a branch around it.
///   N: the number of elements j a thread handles, as in plan_row_16.
///   T: the type of a row's 16-byte elements.
///   slot: the shared-memory slot the row goes to.
///   dst: the plan's offsets in the slot (plan_row_16's slot); dst[j] < 0: the thread has no
///     element j.
///   col: the plan's offsets in the global row; col[j] < 0: element j is zero-filled, reading
///     nothing.
///   base: the global memory that rows are offset from.
///   row_offset: the row's offset from base.
///   row_inside: false when the row lies outside the tensor: every element is then zero-filled,
///     reading nothing.
///   fallback: the in-bounds address the instruction is given for a zero-filled element.
template <int L2_PREFETCH = 0, bool PREDICATED = false, int N, typename T>
SPIO_DEVICE void cp_async_row_16(T *slot, const int (&dst)[N], const int (&col)[N],
                                 const T *base, int row_offset, bool row_inside,
                                 const T *fallback) {
    SPIO_UNROLL
    for (int j = 0; j < N; ++j) {
        const bool has = dst[j] >= 0;
        if (PREDICATED || has) {
            const bool inside = row_inside && col[j] >= 0;
            const T *src = inside ? base + (row_offset + col[j]) : fallback;
            if constexpr (PREDICATED) {
                cp_async_16_if<L2_PREFETCH>(has, slot + (has ? dst[j] : 0), src, inside ? 16 : 0);
            } else {
                cp_async_16<L2_PREFETCH>(slot + dst[j], src, inside ? 16 : 0);
            }
        }
    }
}

/// Loads this thread's elements of a planned row (plan_row_16) into registers.
///
/// The same planned row as cp_async_row_16, through registers instead of cp.async (plain loads
/// and stores, no PTX): load_row_16 loads this thread's elements of a row into `held`,
/// store_row_16 stores them into a slot. Issuing the loads several steps before the stores keeps
/// rows in flight as cp.async groups do.
///
/// Parameters:
///   N: the number of elements j a thread handles, as in plan_row_16.
///   T: the type of a row's 16-byte elements.
///   held: held[j] receives element j: zero where col[j] < 0 or !row_inside, and for elements the
///     thread does not have (dst[j] < 0).
///   dst: the plan's offsets in the slot; dst[j] < 0: the thread has no element j.
///   col: the plan's offsets in the global row; col[j] < 0: element j lies outside the tensor.
///   base: the global memory that rows are offset from.
///   row_offset: the row's offset from base.
///   row_inside: false when the row lies outside the tensor (every element is then zero).
template <int N, typename T>
SPIO_DEVICE void load_row_16(T (&held)[N], const int (&dst)[N], const int (&col)[N], const T *base,
                             int row_offset, bool row_inside) {
    SPIO_UNROLL
    for (int j = 0; j < N; ++j) {
        held[j] = T{};
        if (row_inside && dst[j] >= 0 && col[j] >= 0) {
            held[j] = base[row_offset + col[j]];
        }
    }
}

/// Stores the elements that load_row_16 loaded into a slot in shared memory (plain stores).
///
/// Parameters:
///   N: the number of elements j a thread handles, as in plan_row_16.
///   T: the type of a row's 16-byte elements.
///   slot: the shared-memory slot the row goes to; element j goes to slot + dst[j].
///   dst: the plan's offsets in the slot; dst[j] < 0: the thread has no element j, and stores none.
///   held: the elements that load_row_16 loaded.
template <int N, typename T>
SPIO_DEVICE void store_row_16(T *slot, const int (&dst)[N], const T (&held)[N]) {
    SPIO_UNROLL
    for (int j = 0; j < N; ++j) {
        if (dst[j] >= 0) {
            slot[dst[j]] = held[j];
        }
    }
}

}  // namespace spio

#endif  // SPIO_THREAD_ASYNC_COPY_H_
