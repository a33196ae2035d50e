#ifndef SPIO_ABLATION_H_
#define SPIO_ABLATION_H_

/// Switches for finding where a kernel's time goes on a GPU. scripts/ablate_kernel.py defines them
/// in a copy of a kernel's generated header, which the kernel includes before this one; production
/// kernels never set them, and get the defaults below.
///
/// Ablations (each makes the results wrong; only the time means something):
///   SPIO_ABLATE_LOADS   no input-row copies (shared memory keeps whatever it holds); FProp/DGrad
///                       still copy their weights, and SPIO_LOAD_VIA_REGS's loads stay
///   SPIO_ABLATE_MMA     no mma (the ldmatrix loads stay)
///   SPIO_ABLATE_STORES  results are written only under a condition the compiler cannot prove
///                       false, so the work that produces them stays (FProp/DGrad still stage
///                       output rows in shared memory)
///   SPIO_ABLATE_SYNC    no barrier per row (warps race ahead of each other's copies)
///   SPIO_ABLATE_COMPUTE FProp/DGrad: the input pipeline alone (row copies, waits and barriers):
///                       no ldmatrix, mma, output staging or stores. loads-only keeps all but the
///                       mma and the global stores, so the two tell the pipeline's own read rate
///                       from what the work beside it costs it
/// Variants (the results stay right):
///   SPIO_L2_PREFETCH    0, 128 or 256: the L2 prefetch hint of the input copies (cp_async_16)
///   SPIO_STORE_STREAMING  FProp/DGrad write their output chunks with st.global.cs (streaming:
///                       evict first), not plain stores: do the output's 67 MB, which pass
///                       through the 60 MB L2, crowd out the input rows being read?
///   SPIO_STAGGER_NS     block b first sleeps (b % 16) * SPIO_STAGGER_NS ns (stagger_start), so
///                       that blocks streaming the same rows of their images in lockstep drift
///                       apart: a test for DRAM channel camping on power-of-2 image strides
///   SPIO_LOAD_VIA_REGS  input rows travel through registers (plain 16-byte loads, STAGES - 1
///                       rows ahead, stored to shared memory a step before use) instead of
///                       cp.async; FProp/DGrad need STAGES - 1 to divide R
///   SPIO_WGRAD_UNMASKED WGrad has no careful steps and no column masks: x's products with the
///                       zeros a tile holds outside the output are added too, as if they were
///                       output pixels. Right for finite inputs (inf or NaN in x then spreads to
///                       more taps than in PyTorch); for timing what the careful steps cost, and
///                       for counting the instructions of a full step (scripts/sass_loop.py)
///   SPIO_UNROLL_BY_R    FProp/DGrad's main loop is unrolled by R steps only, as before the
///                       unroll to a multiple of the stages (each step then divides its row for
///                       its stage and output buffer): for timing what the longer unroll gains
///   SPIO_COPY_UNDER_BRANCH  WGrad's row copies the older way: a copy that a thread has no
///                       element for is skipped by a branch around it, not by its predicate
///                       (spio/thread/async_copy.h), and the steps past the last skip their
///                       copies by a branch instead of copying zeros: for timing what the two
///                       gain

#include "spio/macros.h"

#ifndef SPIO_ABLATE_LOADS
#define SPIO_ABLATE_LOADS 0
#endif
#ifndef SPIO_ABLATE_MMA
#define SPIO_ABLATE_MMA 0
#endif
#ifndef SPIO_ABLATE_STORES
#define SPIO_ABLATE_STORES 0
#endif
#ifndef SPIO_ABLATE_SYNC
#define SPIO_ABLATE_SYNC 0
#endif
#ifndef SPIO_ABLATE_COMPUTE
#define SPIO_ABLATE_COMPUTE 0
#endif
#ifndef SPIO_L2_PREFETCH
#define SPIO_L2_PREFETCH 0
#endif
#ifndef SPIO_STAGGER_NS
#define SPIO_STAGGER_NS 0
#endif
#ifndef SPIO_STORE_STREAMING
#define SPIO_STORE_STREAMING 0
#endif
#ifndef SPIO_LOAD_VIA_REGS
#define SPIO_LOAD_VIA_REGS 0
#endif
#ifndef SPIO_WGRAD_UNMASKED
#define SPIO_WGRAD_UNMASKED 0
#endif
#ifndef SPIO_UNROLL_BY_R
#define SPIO_UNROLL_BY_R 0
#endif
#ifndef SPIO_COPY_UNDER_BRANCH
#define SPIO_COPY_UNDER_BRANCH 0
#endif

namespace spio {

/// Delays the start of block `block` by (block % 16) * SPIO_STAGGER_NS ns; nothing by default.
///
/// Parameters:
///   block: the calling block's index, e.g. blockIdx.x.
SPIO_DEVICE void stagger_start(unsigned block) {
#if SPIO_STAGGER_NS
    __nanosleep((block % 16) * SPIO_STAGGER_NS);
#else
    (void)block;
#endif
}

/// Stores the 16 bytes `v` at `dst` in global memory.
///
/// With SPIO_STORE_STREAMING the store is st.global.cs (cache streaming, likely read once:
/// evicted first), by default a plain store.
///
/// Parameters:
///   dst: the destination, in global memory.
///   v: the 16 bytes to store.
/// Assumes:
///   dst is 16-byte aligned.
SPIO_DEVICE void store_output_16(void *dst, uint4 v) {
#if SPIO_STORE_STREAMING && defined(__CUDA_ARCH__)
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :
                 : "l"(__cvta_generic_to_global(dst)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
#else
    *static_cast<uint4 *>(dst) = v;
#endif
}

}  // namespace spio

#endif  // SPIO_ABLATION_H_
