#ifndef SPIO_THREAD_BULK_COPY_H_
#define SPIO_THREAD_BULK_COPY_H_

/// Bulk asynchronous copies between global and shared memory (sm_90): into shared memory completed
/// through an mbarrier, out of it through bulk groups.
///
/// One thread copies a whole contiguous block of bytes with one instruction (cp.async.bulk, the
/// copy engine Hopper's TMA uses), instead of every thread copying 16 bytes. Completion is tracked
/// by an mbarrier in shared memory: a phase of the barrier completes when its expected arrivals
/// have arrived and the bytes announced with mbarrier_arrive_expect_tx have landed. Threads wait
/// for a phase by its parity (0 for the barrier's first phase, then 1, 0, ...).
///
/// Typical use, with one barrier per buffer and a barrier count of 1:
///   thread 0: mbarrier_init(bar, 1) for each barrier, then fence_mbarrier_init(); __syncthreads()
///   thread 0: mbarrier_arrive_expect_tx(bar, bytes); cp_async_bulk_g2s(dst, src, bytes, bar)
///   all:      mbarrier_wait_parity(bar, use & 1); read dst; __syncthreads() before a refill
///   thread 0: fence_proxy_async_shared() before refilling a buffer that threads have read.
/// Hazard: dst holds stale data until a wait on the copy's phase returns.
///
/// Tensor copies (cp_async_bulk_tensor_4d_g2s) move a box of a tensor described by a TensorMap,
/// zero-filling what lies outside the tensor and optionally swizzling the 16-byte chunks.
/// cp_async_bulk_tensor_4d_s2g copies such a box back out, leaving out what lies outside the
/// tensor; it completes by bulk groups, per issuing thread, as cp.async's groups do:
///   all:      write src; fence_proxy_async_shared(); __syncthreads()
///   thread 0: cp_async_bulk_tensor_4d_s2g(map, ..., src); cp_async_bulk_commit_group()
///   thread 0: cp_async_bulk_wait_group_read<0>() before a barrier after which src is rewritten;
///             cp_async_bulk_wait_group<0>() before the block ends.
///
/// GPU code needs sm_90 or newer (PTX ISA 8.0); the emulator runs it anywhere.

#include "spio/macros.h"

namespace spio {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "spio/thread/bulk_copy.h needs sm_90 or newer (cp.async.bulk and mbarrier tx-counts)"
#endif

/// Initialises the mbarrier at `bar` for `count` arrivals per phase; its first phase has parity 0.
///
/// Parameters:
///   bar: the mbarrier, in shared memory.
///   count: the arrivals that complete each phase.
/// Assumes:
///   bar is 8-byte aligned. Make it visible with fence_mbarrier_init() and a barrier before other
///   threads use it.
SPIO_DEVICE void mbarrier_init(unsigned long long *bar, unsigned count) {
#if defined(__CUDA_ARCH__)
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
#else
    ::spio::emu::mbarrier_init(bar, count);
#endif
}

/// Orders this thread's mbarrier_init before the copy engine's use of the barriers.
SPIO_DEVICE void fence_mbarrier_init() {
#if defined(__CUDA_ARCH__)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
    ::spio::emu::fence_mbarrier_init();
#endif
}

/// Orders this thread's earlier shared-memory accesses (and those it synchronised with) before
/// later bulk copies, its own and, after a barrier, other threads'.
///
/// Issue it before refilling a buffer that threads have read, and after writing a buffer that a
/// bulk copy will read.
SPIO_DEVICE void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
    ::spio::emu::fence_proxy_async_shared();
#endif
}

/// Arrives on `bar` once and announces `bytes` more bytes of bulk copies for its current phase.
///
/// Parameters:
///   bar: the mbarrier, in shared memory.
///   bytes: how many more bytes of bulk copies the current phase waits for.
SPIO_DEVICE void mbarrier_arrive_expect_tx(unsigned long long *bar, unsigned bytes) {
#if defined(__CUDA_ARCH__)
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    unsigned long long state;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
                 : "=l"(state)
                 : "r"(addr), "r"(bytes)
                 : "memory");
    asm volatile("" ::"l"(state));  // the state is not needed (NVRTC warns of it set, not used)
#else
    ::spio::emu::mbarrier_arrive_expect_tx(bar, bytes);
#endif
}

/// Starts copying `bytes` from global `src` to shared `dst` in one bulk copy.
///
/// Parameters:
///   dst: the destination, in shared memory.
///   src: the source, in global memory.
///   bytes: the number of bytes, a multiple of 16; they count towards the current phase of `bar`.
///   bar: the mbarrier, in shared memory, that tracks the copy's completion.
/// Assumes:
///   dst and src are both 16-byte aligned. dst holds stale data until a wait on the copy's phase
///   returns.
SPIO_DEVICE void cp_async_bulk_g2s(void *dst, const void *src, unsigned bytes,
                                   unsigned long long *bar) {
#if defined(__CUDA_ARCH__)
    const unsigned dst_addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const unsigned bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    const unsigned long long src_addr =
        static_cast<unsigned long long>(__cvta_generic_to_global(src));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        :
        : "r"(dst_addr), "l"(src_addr), "r"(bytes), "r"(bar_addr)
        : "memory");
#else
    ::spio::emu::cp_async_bulk_g2s(dst, src, bytes, bar);
#endif
}

/// Tests whether the phase of `bar` with parity `parity` has completed, waiting a little if not.
///
/// Parameters:
///   bar: the mbarrier, in shared memory.
///   parity: the parity of the phase (0 for the barrier's first phase, then 1, 0, ...).
/// Returns:
///   true once the phase has completed (its copies' data are then visible to the calling thread);
///   false if it has not yet, after waiting a little.
SPIO_DEVICE bool mbarrier_try_wait_parity(unsigned long long *bar, unsigned parity) {
#if defined(__CUDA_ARCH__)
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    unsigned done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
    return done != 0;
#else
    return ::spio::emu::mbarrier_try_wait_parity(bar, parity);
#endif
}

/// Returns the shared-memory address of `p`: the address tensor copies swizzle by.
///
/// Parameters:
///   p: a pointer into shared memory.
/// Returns:
///   the shared-memory address of p. (The emulator's shared memory is host memory: its low bits
///   stand for it.)
SPIO_DEVICE unsigned shared_address(const void *p) {
#if defined(__CUDA_ARCH__)
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
#else
    return static_cast<unsigned>(reinterpret_cast<unsigned long long>(p));
#endif
}

/// Returns `p` moved up to the next multiple of ALIGN bytes of shared-memory address.
///
/// E.g. to a swizzle's repeat (a GPU promises dynamic shared memory 16 bytes).
///
/// Parameters:
///   ALIGN: the alignment in bytes, a multiple of 16 and of sizeof(T).
///   T: the element type of p.
///   p: a pointer into shared memory.
/// Returns:
///   p plus (ALIGN - shared_address(p) % ALIGN) % ALIGN bytes (p itself when already aligned).
///   An offset from `p`, not an address made from an integer, so that the compiler still knows
///   that accesses through it are to shared memory.
/// Assumes:
///   p is 16-byte aligned.
template <unsigned ALIGN, class T>
SPIO_DEVICE T *align_shared(T *p) {
    static_assert(ALIGN % 16 == 0 && ALIGN % sizeof(T) == 0, "align_shared: ALIGN of whole T");
    return p + (ALIGN - shared_address(p) % ALIGN) % ALIGN / sizeof(T);
}

/// A tiled tensor map (spio.cuda.tensor_map.TensorMap): the driver's opaque 128 bytes on a GPU, the
/// emulator's own layout of the same facts on the CPU. A kernel takes it by value as
/// `const __grid_constant__ spio::TensorMap`, so that its address is a parameter's.
struct alignas(64) TensorMap {
    unsigned long long words[16];
};

/// Starts copying the box of `map` at element coordinates (c0, c1, c2, c3) to shared `dst`.
///
/// Elements outside the tensor land as zeros, negative coordinates included.
///
/// Parameters:
///   dst: the destination, in shared memory.
///   map: the tensor map (see TensorMap).
///   c0, c1, c2, c3: the box's element coordinates, innermost first.
///   bar: the mbarrier, in shared memory; all the box's bytes count towards its current phase.
/// Assumes:
///   dst is 128-byte aligned; with a swizzled map, aligned to the swizzle's 8-span repeat so that
///   the pattern starts at dst.
SPIO_DEVICE void cp_async_bulk_tensor_4d_g2s(void *dst, const TensorMap *map, int c0, int c1,
                                             int c2, int c3, unsigned long long *bar) {
#if defined(__CUDA_ARCH__)
    const unsigned dst_addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const unsigned bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
        :
        : "r"(dst_addr), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
          "r"(c2), "r"(c3), "r"(bar_addr)
        : "memory");
#else
    const int coords[4] = {c0, c1, c2, c3};
    ::spio::emu::cp_async_bulk_tensor_g2s(dst, map, 4, coords, bar);
#endif
}

/// Starts copying the box of `map` at element coordinates (c0, c1, c2, c3) from shared `src` to
/// the tensor.
///
/// Elements outside the tensor are not written. The copy joins this thread's open bulk group
/// (cp_async_bulk_commit_group closes it).
///
/// Parameters:
///   map: the tensor map (see TensorMap).
///   c0, c1, c2, c3: the box's element coordinates, innermost first.
///   src: the box in shared memory, laid out, aligned and swizzled as cp_async_bulk_tensor_4d_g2s
///     lands a box.
/// Assumes:
///   the threads that wrote `src` have each ordered their writes before it with
///   fence_proxy_async_shared() and a barrier; `src` is not written again before
///   cp_async_bulk_wait_group_read has waited for the copy's group.
SPIO_DEVICE void cp_async_bulk_tensor_4d_s2g(const TensorMap *map, int c0, int c1, int c2, int c3,
                                             const void *src) {
#if defined(__CUDA_ARCH__)
    const unsigned src_addr = static_cast<unsigned>(__cvta_generic_to_shared(src));
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
        " [%0, {%1, %2, %3, %4}], [%5];\n"
        :
        : "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
          "r"(src_addr)
        : "memory");
#else
    const int coords[4] = {c0, c1, c2, c3};
    ::spio::emu::cp_async_bulk_tensor_s2g(map, 4, coords, src);
#endif
}

/// Closes this thread's open bulk group: the bulk copies to global memory it issued since the
/// last commit (an empty group if none).
SPIO_DEVICE void cp_async_bulk_commit_group() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
    ::spio::emu::cp_async_bulk_commit_group();
#endif
}

/// Waits until at most N of this thread's newest committed bulk groups still read their shared
/// memory.
///
/// The older groups' sources may then be written again (after a barrier, by other threads).
///
/// Parameters:
///   N: the number of newest groups that may still be reading, N >= 0.
template <int N>
SPIO_DEVICE void cp_async_bulk_wait_group_read() {
    static_assert(N >= 0, "cp_async_bulk_wait_group_read needs N >= 0");
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#else
    ::spio::emu::cp_async_bulk_wait_group(N, true);
#endif
}

/// Waits until at most N of this thread's newest committed bulk groups are incomplete.
///
/// The older groups have then also written global memory.
///
/// Parameters:
///   N: the number of newest groups that may still be incomplete, N >= 0.
template <int N>
SPIO_DEVICE void cp_async_bulk_wait_group() {
    static_assert(N >= 0, "cp_async_bulk_wait_group needs N >= 0");
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#else
    ::spio::emu::cp_async_bulk_wait_group(N, false);
#endif
}

/// Waits until the phase of `bar` with parity `parity` has completed.
///
/// Parameters:
///   bar: the mbarrier, in shared memory.
///   parity: the parity of the phase, as for mbarrier_try_wait_parity.
SPIO_DEVICE void mbarrier_wait_parity(unsigned long long *bar, unsigned parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

/// COUNT mbarriers at `bars`, one per buffer that copies fill, with each thread's next parities.
///
/// Each barrier completes a phase when its buffer's copies have landed; per thread, bit b holds
/// the parity of the phase it waits for next on barrier b.
///
/// Parameters:
///   COUNT: the number of buffers, 1 to 32.
/// Assumes:
///   the barriers are 8-byte aligned shared memory. Every thread waits for every fill of a
///   buffer, in order: buffer b's k-th fill is then its phase of parity k % 2.
template <int COUNT>
class BufferBarriers {
  public:
    static_assert(COUNT >= 1 && COUNT <= 32, "BufferBarriers keeps one parity bit a barrier");
    /// Uses the COUNT mbarriers at `bars`; the thread waits first for each one's phase of parity 0.
    ///
    /// Parameters:
    ///   bars: the first of COUNT consecutive mbarriers, 8-byte aligned in shared memory.
    SPIO_DEVICE explicit BufferBarriers(unsigned long long *bars) : bars_(bars) {}
    /// The barrier of buffer b (for mbarrier_arrive_expect_tx and the copies).
    SPIO_DEVICE unsigned long long *operator[](int b) const { return bars_ + b; }
    /// Initialises the barriers for one arrival a phase and orders that before the copies this
    /// thread issues next (and, after a barrier, before the other threads' waits).
    ///
    /// Assumes:
    ///   one thread calls it.
    SPIO_DEVICE void init() const {
        for (int b = 0; b < COUNT; ++b) {
            mbarrier_init(bars_ + b, 1);
        }
        fence_mbarrier_init();
        fence_proxy_async_shared();
    }
    /// Waits until buffer b's next fill has landed.
    ///
    /// Parameters:
    ///   b: the buffer, 0 <= b < COUNT.
    SPIO_DEVICE void wait(int b) {
        mbarrier_wait_parity(bars_ + b, (phases_ >> b) & 1);
        phases_ ^= 1u << b;
    }

  private:
    unsigned long long *bars_;
    unsigned phases_ = 0;
};

}  // namespace spio

#endif  // SPIO_THREAD_BULK_COPY_H_
