/// Weight gradient of the grouped 2-D convolution with group width 8, stride 1 (and the bias
/// gradient alongside).
///
/// What it computes (NHWC activations, fp32 results; g is the group, k and c index inside it):
///   dw[8g + k, c, r, s] += sum_{n, p, q} dy[n, p, q, 8g + k] * x[n, p + r - PAD_H, q + s - PAD_W, 8g + c]
///   dbias[8g + k]       += sum_{n, p, q} dy[n, p, q, 8g + k]
/// Inputs outside x are zero. Only products of output pixels' dy reach the sums: where a tile runs
/// past the output or its steps reach dy rows outside the tile (its neighbours' rows, held as zeros
/// in shared memory), x is kept from meeting those zeros ("careful" steps, at the main loop), so an
/// inf or NaN in x makes dw non-finite at the taps PyTorch's does, no more. dw and dbias are
/// accumulated with atomicAdd: the caller zeroes them. The sum order across blocks varies from
/// launch to launch, so results may differ in the last bits of fp32 rounding, never more. With
/// SPIO_WGRAD_PARTIALS each warp instead stores its sums to its part of a slot of DWPart /
/// DBiasPart (a slot per dy tile and run of Block::warp_x8 * 8 columns, each warp of it writing its
/// group's channels; no atomics, nothing to zero; each tap's 8 x 8 (k by c) innermost in a slot,
/// so that a store instruction's lanes touch 8 sectors, half of each, which the next element's
/// store fills) and the caller sums the slots (sum_slots.cu): a second pass, with a result that
/// does not depend on launch order.
///
/// Tiling: a block owns Block::c8 groups, Block::y rows and Block::x columns of dy, for Block::n
/// images in turn. Per image it streams the Block::y + R - 1 rows of x that the tile touches, one
/// row per step (cp.async, STAGES = Block::stages x-row buffers, so STAGES - 1 steps are in flight
/// while one is computed), together with one new row of dy (zeros in the last R - 1 steps of an
/// image), into shared memory. Step i pairs x row i with the dy rows i - r (r = 0..R-1) kept in a
/// ring of R + STAGES - 1 row slots (the spare slots receive the next rows while the others are
/// read; rows outside the tile or image are zero). The row buffers are group-major ([c8][x], the
/// pitch padded to odd) or, in a build with swizzled rows, pixel-major with each pixel's groups
/// permuted by a key of the pixel (SmemX, SmemDy; conv2d_gw8_factory.stage_layout); the code is
/// the same, as all its addresses come from them. Each warp owns one group and Block::warp_x8
/// runs of 8 dy columns. For a run it loads, per filter column s, B = the 8 pixels x 8 channels of
/// x shifted by s (ldmatrix .trans), and, per pair of filter rows (r0, r1), A = the 8 channels x
/// 8 pixels of dy rows i - r0 and i - r1 stacked into a 16x8 matrix (ldmatrix.x2 .trans);
/// mma.sync.m16n8k8 then adds the taps (r0, s) and (r1, s) of the pixels' products into a 16x8
/// fp32 accumulator: the pixels are the reduction dimension. With Block::mma_k == 16 one
/// mma.sync.m16n8k16 takes two consecutive runs (16 pixels) at once. An odd R pairs its last row
/// with an all-zero row. The bias gradient is one more mma of the dy rows i
/// with an all-ones B. At the end each warp adds its accumulators to dw (and dbias) atomically, or
/// with SPIO_WGRAD_PARTIALS stores them to its slot. Which elements of the mma's matrices a lane
/// holds comes from the generated fragment classes (XFrag: x's B; DwFrag: the accumulators),
/// which rows' addresses it gives to ldmatrix from spio::ldmatrix_row and ldmatrix_matrix.
///
/// Synchronisation: one __syncthreads after the dy slots are zeroed (before the first copies land
/// in them), then one per step; every step index commits exactly one cp.async group (past the
/// last step: zeros, into slots no step reads again, or an empty group in the prologue; waited
/// for before the block exits). At the top of step t every thread waits for its copies of step t
/// (wait_group STAGES - 2), the barrier publishes them and guarantees that step t - 1's reads are
/// over, so step t + STAGES - 1's rows can be copied into the slots step t - 1 read last (x: STAGES
/// slots; dy: R + STAGES - 1 slots, of which step t reads R). (The timing variant
/// SPIO_LOAD_VIA_REGS moves rows through registers instead; its comment is at its code.) A build
/// with SPIO_LOAD_VIA_TMA (sm_90; the generated header sets it, with swizzled rows) brings each
/// step's x row and dy row in by two tensor copies that thread 0 issues, waited for on an mbarrier
/// a stage instead of cp.async.wait_group; the barrier per step keeps its role. Such a kernel
/// takes two more arguments, x's and dy's tensor maps (conv2d_gw8_wgrad_factory.row_boxes).
///
/// Launch contract: grid = ceil(images / Block::n) * (the blocks of one image's tiles: BlockIdx
/// without its n) blocks, Block::threads threads (one warp per group and run of
/// Block::warp_x8 * 8 columns: WarpIdx), SmemX::num_bytes + SmemDy::num_bytes bytes of dynamic
/// shared memory (SmemDy: the R + STAGES - 1 ring slots and the zero row); a SPIO_LOAD_VIA_TMA
/// build SPIO_TMA_ALIGN - 16 bytes more, to align its buffers, and 8 * Block::stages for its
/// mbarriers after them (conv2d_gw8_wgrad_factory.shared_mem_bytes).
/// Arguments: (float *dw, float *dbias or null, const uint4 *x, const uint4 *dy, int images), x
/// and dy NHWC; dw and dbias zeroed by the caller (with SPIO_WGRAD_PARTIALS: the DWPart and
/// DBiasPart buffers, one slot per warp of the grid's dy tiles, unzeroed). The batch size `images`
/// is given at launch: the generated x, dy, partial-sum buffers and BlockIdx leave their outermost
/// extents open, so one build serves every batch size that Block::n divides, and another
/// (Block::ragged, whose last block of images is partly empty and checks each image against
/// `images`) the others. The generated header (conv2d_gw8_wgrad_gen.h) defines the rest, the
/// kernel's symbol SPIO_KERNEL_ENTRY (spio_<pass, layer and config>:
/// spio.kernels.kernel.entry_symbol) among it.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "spio/thread/async_copy.h"
#include "spio/warp/ldmatrix.h"
#include "spio/warp/mma.h"

#include "conv2d_gw8_wgrad_gen.h"
// After the generated header, where scripts/ablate_kernel.py defines its switches.
#include "spio/ablation.h"
#if SPIO_LOAD_VIA_TMA
#include "spio/thread/bulk_copy.h"
#endif

namespace {

/// Pixels one mma sums over: 8 (m16n8k8) or, with Block::mma_k == 16, 16 (m16n8k16, two runs).
constexpr int PIXELS = Block::mma_k;
/// 8-pixel runs of one mma.
constexpr int RUNS_PER_MMA = PIXELS / 8;
using Elem = SPIO_WGRAD_ELEMENT;
#if SPIO_WGRAD_HAS_BIAS
/// A B register of two ones: the pixel sums of A (the bias gradient).
constexpr unsigned kOnes = SPIO_WGRAD_BF16 ? 0x3F803F80u : 0x3C003C00u;
#endif

/// Adds A * B into acc, the product summing over the pixels: with PIXELS == 8 one m16n8k8 (A 16 x
/// 8 pixels, B 8 pixels x 8); with PIXELS == 16 one m16n8k16 over two consecutive 8-pixel runs,
/// whose A fragment is the two runs' k8 A registers in order and whose B is the two runs' B
/// registers. (A build calls the mma_pixels of its PIXELS; [[maybe_unused]] keeps NVRTC quiet on
/// the other.)
[[maybe_unused]] SPIO_DEVICE void mma_pixels(float (&acc)[4], const unsigned (&a)[1][2],
                                             const unsigned (&b)[1]) {
    spio::mma_m16n8k8<Elem>(acc, a[0], b[0], acc);
}
[[maybe_unused]] SPIO_DEVICE void mma_pixels(float (&acc)[4], const unsigned (&a)[2][2],
                                             const unsigned (&b)[2]) {
    const unsigned a4[4] = {a[0][0], a[0][1], a[1][0], a[1][1]};
    spio::mma_m16n8k16<Elem>(acc, a4, b, acc);
}

}  // namespace

// Min. 1 block per SM: with the thread count alone, ptxas (NVRTC 12.9 and 13.0) capped registers
// below the need of some register-heavy configs and spilled; this way it never spills them.
extern "C" __global__ void __launch_bounds__(Block::threads, 1)
    SPIO_KERNEL_ENTRY(float *dw, float *dbias, const uint4 *x, const uint4 *dy, int images
#if SPIO_LOAD_VIA_TMA
                      ,
                      const __grid_constant__ spio::TensorMap x_map,
                      const __grid_constant__ spio::TensorMap dy_map
#endif
    ) {
    constexpr int R = Conv::r;
    constexpr int S = Conv::s;
    constexpr int PAIRS = (R + 1) / 2;
    constexpr int ROWS = Block::y + R - 1;  // x rows per tile and image
    constexpr int STAGES = Block::stages;
    constexpr int SLOTS = R + STAGES - 1;   // dy ring slots; slot SLOTS is the all-zero row
    constexpr int ZERO_SLOT = SLOTS;

    spio::stagger_start(blockIdx.x);  // nothing unless timing with SPIO_STAGGER_NS

    extern __shared__ uint4 dynamic_smem[];
#if SPIO_LOAD_VIA_TMA
    // Tensor copies swizzle by shared-memory address bits: the row buffers start at a multiple of
    // the pattern's repeat, SPIO_TMA_ALIGN bytes (the factory leaves room to round up to it).
    uint4 *const smem = spio::align_shared<SPIO_TMA_ALIGN>(dynamic_smem);
#else
    uint4 *const smem = dynamic_smem;
#endif
    const SmemX smem_x(smem);
    const SmemDy smem_dy(smem + SmemX::size);

    const BlockIdx block(blockIdx.x);
    const int block_n = block.n() * Block::n;
    const int block_c8 = block.c8() * Block::c8;
    const int block_y = block.y() * Block::y;
    const int block_x = block.x() * Block::x;

    // Zero every dy slot: rows above the first image's tile are read before any copy lands there,
    // and the spare zero row is never written again.
    for (int i = threadIdx.x; i < SmemDy::size; i += Block::threads) {
        smem[SmemX::size + i] = make_uint4(0, 0, 0, 0);
    }
#if SPIO_LOAD_VIA_TMA
    // Each thread orders its zeros before the tensor copies that will land in the same slots
    // (the copies write through the async proxy); the barrier below then orders them for thread 0.
    spio::fence_proxy_async_shared();
#endif

    constexpr int STEPS = Block::n * ROWS;
#if !SPIO_LOAD_VIA_TMA
    // Copies: thread tid copies elements tid + j * Block::threads of each step's x row and dy row.
    // The part of an element's addresses that does not depend on the step is worked out once,
    // here: its offset in a slot (-1: this thread has no element j) and in a row (-1: outside the
    // image or the channels, so it is zero-filled). Per step only the row's offset and bounds
    // remain.
    constexpr int X_LOADS = (XLoadIdx::size + Block::threads - 1) / Block::threads;
    constexpr int DY_LOADS = (DyLoadIdx::size + Block::threads - 1) / Block::threads;
    int x_dst[X_LOADS];
    int x_col[X_LOADS];
    spio::plan_row_16<XLoadIdx, Block::threads>(
        x_dst, x_col, threadIdx.x, [&](const XLoadIdx &idx, int &dst, int &col) {
            const int x = block_x + idx.x() - Conv::pad_w;
            const int c8 = block_c8 + idx.c8();
            dst = static_cast<int>(smem_x.stage(0).c8(idx.c8()).x(idx.x()).get() -
                                   smem_x.stage(0).get());
            if (x >= 0 && x < Input::X && c8 < Input::C8) {
                col = x * Input::stride_x + c8 * Input::stride_c8;
            }
        });
    int dy_dst[DY_LOADS];
    int dy_col[DY_LOADS];
    spio::plan_row_16<DyLoadIdx, Block::threads>(
        dy_dst, dy_col, threadIdx.x, [&](const DyLoadIdx &idx, int &dst, int &col) {
            const int x = block_x + idx.x();
            const int c8 = block_c8 + idx.c8();
            dst = static_cast<int>(smem_dy.slot(0).c8(idx.c8()).x(idx.x()).get() -
                                   smem_dy.slot(0).get());
            if (x < DOutput::X && c8 < DOutput::K8) {
                col = x * DOutput::stride_x + c8 * DOutput::stride_k8;
            }
        });
#endif

#if SPIO_LOAD_VIA_TMA
    static_assert(!SPIO_LOAD_VIA_REGS, "SPIO_LOAD_VIA_TMA and SPIO_LOAD_VIA_REGS exclude each other");
    // Without the barrier per step a warp could wait for a stage's next phase while thread 0
    // refills it for the one after, or refill slots while others read them.
    static_assert(!SPIO_ABLATE_SYNC, "SPIO_LOAD_VIA_TMA needs the barrier per step");
    // Rows by tensor copies (sm_90): thread 0 copies step t's x row (a box of x_map: the block's
    // groups across its Block::x + S - 1 columns) into x stage t % STAGES and its dy row (of
    // dy_map, Block::x columns) into dy slot t % SLOTS; both land swizzled as SmemX and SmemDy lay
    // them out, with zeros outside x and dy (rows above and below, images past the batch). A dy
    // row that is no row of the tile (the last R - 1 steps of an image) is copied from row
    // DOutput::Y, outside dy, so it lands as zeros too. Both count towards the mbarrier of x
    // stage t % STAGES (stage_full; they follow the dy slots).
    constexpr unsigned STEP_BYTES = (XLoadIdx::size + DyLoadIdx::size) * 16;
    spio::BufferBarriers<STAGES> stage_full(
        reinterpret_cast<unsigned long long *>(smem + SmemX::size + SmemDy::size));
    const bool issuer = threadIdx.x == 0;
    const auto load_step = [&](int t) {  // thread 0 only
        const int n = block_n + t / ROWS;
        const int i = t % ROWS;
        const int stage = t % STAGES;
        spio::mbarrier_arrive_expect_tx(stage_full[stage], SPIO_ABLATE_LOADS ? 0 : STEP_BYTES);
        if (!SPIO_ABLATE_LOADS) {
            spio::cp_async_bulk_tensor_4d_g2s(smem_x.stage(stage).get(), &x_map, block_c8 * 8,
                                              block_x - Conv::pad_w, block_y + i - Conv::pad_h, n,
                                              stage_full[stage]);
            const int p = i < Block::y ? block_y + i : DOutput::Y;
            spio::cp_async_bulk_tensor_4d_g2s(smem_dy.slot(t % SLOTS).get(), &dy_map,
                                              block_c8 * 8, block_x, p, n, stage_full[stage]);
        }
    };
    if (issuer) {
        stage_full.init();
    }
    (void)x;
    (void)dy;
#else
    // Copies step t's x row and dy row (zero outside the image or tile, and for t past the last
    // step) into their slots; no commit.
    const auto load_step = [&](int t) {
        const int n = block_n + t / ROWS;
        const int i = t % ROWS;
        const bool image_inside = (!Block::ragged || n < images) && t < STEPS;
        const int y = block_y + i - Conv::pad_h;
        const bool x_row_inside = image_inside && y >= 0 && y < Input::Y;
        // Predicated copies (a thread with no element j skips it by the instruction's predicate,
        // not a branch): fewer instructions a step here (spio/thread/async_copy.h).
        constexpr bool kPredicated = !SPIO_COPY_UNDER_BRANCH;
        if (!SPIO_ABLATE_LOADS) {
            spio::cp_async_row_16<SPIO_L2_PREFETCH, kPredicated>(
                smem_x.stage(t % STAGES).get(), x_dst, x_col, x,
                n * Input::stride_n + y * Input::stride_y, x_row_inside, x);
        }
        const int p = block_y + i;
        const bool dy_row_inside = image_inside && i < Block::y && p < DOutput::Y;
        if (!SPIO_ABLATE_LOADS) {
            spio::cp_async_row_16<SPIO_L2_PREFETCH, kPredicated>(
                smem_dy.slot(t % SLOTS).get(), dy_dst, dy_col, dy,
                n * DOutput::stride_n + p * DOutput::stride_y, dy_row_inside, dy);
        }
    };
#endif  // SPIO_LOAD_VIA_TMA

    const int lane = threadIdx.x % 32;
    const WarpIdx warp(threadIdx.x / 32);
    const int warp_x = warp.x8() * (Block::warp_x8 * 8);  // first dy column of this warp in the tile

    float acc[PAIRS][S][4];
#if SPIO_WGRAD_HAS_BIAS
    float bias_acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#endif
    SPIO_UNROLL
    for (int pair = 0; pair < PAIRS; ++pair) {
        SPIO_UNROLL
        for (int s = 0; s < S; ++s) {
            SPIO_UNROLL
            for (int e = 0; e < 4; ++e) {
                acc[pair][s][e] = 0.0f;
            }
        }
    }

    __syncthreads();  // the zeroed dy slots are visible before copies start landing in them
    // x times a dy pixel that is no output pixel must not reach the sums: that dy is a zero in
    // shared memory, and inf or NaN in x times zero is NaN where PyTorch forms no product at all.
    // Steps whose dy rows include such pixels are `careful`: their runs (a second copy of the
    // code) keep those rows out. Columns past the output are masked (below). The other steps run
    // with no check at all.
    // - Rows: step i pairs x row i with dy rows i - r, r = 0..R-1. They are all output rows of
    //   the tile (0 <= i - r < rows_in) for i in R-1 .. rows_in-1; the steps before and after are
    //   careful. There a pair with both dy rows outside is skipped, and a pair with one row inside
    //   and one outside, whose rows share x and so cannot be masked in it, makes its products
    //   apart and adds only the inside row's half to the sums.
    // - Columns: in the last column tile, when the tile width does not divide the output's,
    //   this lane's x pixels paired with dy columns past the output are masked to zero, in every
    //   step (a third copy of the runs, full but for the masks, serves that tile's steps that
    //   are not careful). cols_left counts the output columns from this lane's first pixel of
    //   run 0 on (a run's B register holds its pixels XFrag::x(lane, 0) and XFrag::x(lane, 1),
    //   in its low and high halves; `next`, the second's distance from the first, is 1).
    const int rows_in = DOutput::Y % Block::y == 0 || block_y + Block::y <= DOutput::Y
                            ? Block::y
                            : DOutput::Y - block_y;
    constexpr bool kPartialColumns = DOutput::X % Block::x != 0;
    const bool mask_columns =
        !SPIO_WGRAD_UNMASKED && kPartialColumns && block_x + Block::x > DOutput::X;
    const int cols_left = DOutput::X - (block_x + warp_x + XFrag::x(lane, 0));
    const int next = XFrag::x(lane, 1) - XFrag::x(lane, 0);

    // One step's work, once its x row and dy row are in shared memory.
    const auto compute_step = [&](int t) {
        // What does not change along the row is worked out once per step, not once per run: each
        // tap pair's dy rows, and this lane's addresses in x's row and in the pair's dy slots
        // (runs then add constant offsets).
        const int i = t % ROWS;
        const bool careful = !SPIO_WGRAD_UNMASKED && (i < R - 1 || i >= rows_in);
        // Whether dy row i - r is an output row of the tile (0 <= i - r < rows_in).
        const auto row_in = [&](int r) {
            return static_cast<unsigned>(i - r) < static_cast<unsigned>(rows_in);
        };
        // This lane's row addresses (ldmatrix_row, ldmatrix_matrix): of B, a pixel of x; of A,
        // a pixel of dy row i - r0 (matrix 0) or i - r1 (matrix 1).
        const int pixel = warp_x + spio::ldmatrix_row<1>(lane);
        const SmemX x_lane = smem_x.stage(t % STAGES).c8(warp.c8()).x(pixel);
        SmemDy dy_lane[PAIRS];
        SPIO_UNROLL
        for (int pair = 0; pair < PAIRS; ++pair) {
            const int r0 = 2 * pair;
            const int r1 = 2 * pair + 1;
            // Ring slot of the dy row of step t - r; t + SLOTS - r >= 0, so unsigned % is exact.
            const int slot0 = static_cast<unsigned>(t + SLOTS - r0) % SLOTS;
            const int slot1 = r1 < R ? static_cast<int>(static_cast<unsigned>(t + SLOTS - r1) % SLOTS)
                                     : ZERO_SLOT;
            const int lane_slot = spio::ldmatrix_matrix<2>(lane) == 0 ? slot0 : slot1;
            dy_lane[pair] = smem_dy.slot(lane_slot).c8(warp.c8()).x(pixel);
        }
        // careful_runs: the rows' checks (and the columns' masks where kPartialColumns: they
        // keep every column on a tile that is not the last); masked_runs: the columns' masks.
        const auto runs = [&](bool careful_runs, bool masked_runs) {
            SPIO_UNROLL
            for (int run = 0; run < Block::warp_x8; run += RUNS_PER_MMA) {
                // B operands: x pixels first + s .. first + s + 7 of this row, `first` being a
                // run's first dy column (x's tile starts PAD_W left), for each run of this mma;
                // zero where keep_cols masks a dy column past the output.
                unsigned keep_cols[RUNS_PER_MMA];
                SPIO_UNROLL
                for (int sub = 0; sub < RUNS_PER_MMA; ++sub) {
                    const int first = (run + sub) * 8;
                    keep_cols[sub] = !(kPartialColumns && (careful_runs || masked_runs))
                                         ? 0xFFFFFFFFu
                                         : (first < cols_left ? 0x0000FFFFu : 0u) |
                                               (first + next < cols_left ? 0xFFFF0000u : 0u);
                }
                unsigned b[S][RUNS_PER_MMA];
                SPIO_UNROLL
                for (int s = 0; s < S; ++s) {
                    SPIO_UNROLL
                    for (int sub = 0; sub < RUNS_PER_MMA; ++sub) {
                        unsigned reg[1];
                        spio::ldmatrix_x1_trans(reg, x_lane.x((run + sub) * 8 + s).get());
                        b[s][sub] = reg[0] & keep_cols[sub];
                    }
                }
                SPIO_UNROLL
                for (int pair = 0; pair < PAIRS; ++pair) {
                    // Whether dy rows i - r0 and i - r1 are output rows of the tile (r1 == R, the
                    // spare all-zero row of an odd R: as row r0; its sums are dropped).
                    const int r0 = 2 * pair;
                    const int r1 = 2 * pair + 1;
                    const bool row0_in = !careful_runs || row_in(r0);
                    const bool row1_in = !careful_runs || (r1 < R ? row_in(r1) : row0_in);
                    if (!row0_in && !row1_in && !(SPIO_WGRAD_HAS_BIAS && pair == 0)) {
                        continue;  // both dy rows are zeros
                    }
                    unsigned a[RUNS_PER_MMA][2];
                    SPIO_UNROLL
                    for (int sub = 0; sub < RUNS_PER_MMA; ++sub) {
                        spio::ldmatrix_x2_trans(a[sub], dy_lane[pair].x((run + sub) * 8).get());
                    }
                    if ((row0_in || row1_in) && !SPIO_ABLATE_MMA) {
                        SPIO_UNROLL
                        for (int s = 0; s < S; ++s) {
                            if (row0_in != row1_in) {
                                // The products alone, then the inside row's half of them into
                                // the sums (accumulator elements 0-1: filter row r0, 2-3: r1).
                                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                mma_pixels(part, a, b[s]);
                                SPIO_UNROLL
                                for (int e = 0; e < 4; ++e) {
                                    if (e < 2 ? row0_in : row1_in) {
                                        acc[pair][s][e] += part[e];
                                    }
                                }
                            } else {
                                mma_pixels(acc[pair][s], a, b[s]);
                            }
                        }
                    }
#if SPIO_WGRAD_HAS_BIAS
                    if (pair == 0 && !SPIO_ABLATE_MMA) {
                        unsigned ones[RUNS_PER_MMA];
                        SPIO_UNROLL
                        for (int sub = 0; sub < RUNS_PER_MMA; ++sub) {
                            ones[sub] = kOnes;
                        }
                        mma_pixels(bias_acc, a, ones);  // rows 0-7: the sums of dy row i
                    }
#endif
                }
            }
        };
        if (careful) {  // copies of the runs, each built for its constants
            runs(true, false);
        } else if (mask_columns) {
            runs(false, true);
        } else {
            runs(false, false);
        }
    };

#if SPIO_LOAD_VIA_REGS
    // The timing variant SPIO_LOAD_VIA_REGS (spio/ablation.h): the x and dy rows of step t are
    // loaded with plain 16-byte loads into register slot t % DEPTH at the end of step
    // t - 1 - DEPTH and stored into their slots at the end of step t - 1, so DEPTH = STAGES - 1
    // steps are in flight, as with cp.async. The step loop is unrolled by DEPTH so that the
    // register slots are indexed by constants.
    constexpr int DEPTH = STAGES - 1;
    uint4 held_x[DEPTH][X_LOADS];
    uint4 held_dy[DEPTH][DY_LOADS];
    const auto load_step_regs = [&](int t, uint4(&hx)[X_LOADS], uint4(&hdy)[DY_LOADS]) {
        const int n = block_n + t / ROWS;
        const int i = t % ROWS;
        const bool image_inside = !Block::ragged || n < images;
        const int y = block_y + i - Conv::pad_h;
        const bool x_row_inside = image_inside && y >= 0 && y < Input::Y;
        spio::load_row_16(hx, x_dst, x_col, x, n * Input::stride_n + y * Input::stride_y,
                          x_row_inside);
        const int p = block_y + i;
        const bool dy_row_inside = image_inside && i < Block::y && p < DOutput::Y;
        spio::load_row_16(hdy, dy_dst, dy_col, dy, n * DOutput::stride_n + p * DOutput::stride_y,
                          dy_row_inside);
    };
    const auto store_step_regs = [&](int t, const uint4(&hx)[X_LOADS],
                                     const uint4(&hdy)[DY_LOADS]) {
        spio::store_row_16(smem_x.stage(t % STAGES).get(), x_dst, hx);
        spio::store_row_16(smem_dy.slot(t % SLOTS).get(), dy_dst, hdy);
    };
    SPIO_UNROLL
    for (int t = 0; t < DEPTH; ++t) {
        if (t < STEPS) {
            load_step_regs(t, held_x[t], held_dy[t]);
        }
    }
    store_step_regs(0, held_x[0], held_dy[0]);
    if (DEPTH < STEPS) {
        load_step_regs(DEPTH, held_x[0], held_dy[0]);
    }
    for (int t0 = 0; t0 < STEPS; t0 += DEPTH) {
        SPIO_UNROLL
        for (int u = 0; u < DEPTH; ++u) {
            const int t = t0 + u;
            if (t < STEPS) {
                if (!SPIO_ABLATE_SYNC) {
                    __syncthreads();  // step t's rows are in; step t - 1's reads are over
                }
                compute_step(t);
                // Step t + 1's rows into their slots (free since the barrier above), then step
                // t + 1 + DEPTH's loads into the register slot that frees.
                const int slot = (u + 1) % DEPTH;  // a constant once the loop is unrolled
                if (t + 1 < STEPS) {
                    store_step_regs(t + 1, held_x[slot], held_dy[slot]);
                }
                if (t + 1 + DEPTH < STEPS) {
                    load_step_regs(t + 1 + DEPTH, held_x[slot], held_dy[slot]);
                }
            }
        }
    }
#elif SPIO_LOAD_VIA_TMA
    if (issuer) {
        SPIO_UNROLL
        for (int t = 0; t < STAGES - 1; ++t) {
            if (t < STEPS) {
                load_step(t);
            }
        }
    }
    for (int t = 0; t < STEPS; ++t) {
        stage_full.wait(t % STAGES);
        if (!SPIO_ABLATE_SYNC) {
            __syncthreads();
        }
        // Every warp is done with step t - 1's slots: thread 0 refills them, ordering the
        // threads' reads before the copies' writes (the async proxy's).
        if (issuer && t + STAGES - 1 < STEPS) {
            spio::fence_proxy_async_shared();
            load_step(t + STAGES - 1);
        }
        compute_step(t);
    }
#else
    SPIO_UNROLL
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < STEPS) {
            load_step(t);
        }
        spio::cp_async_commit_group();
    }
    for (int t = 0; t < STEPS; ++t) {
        spio::cp_async_wait_group<STAGES - 2>();
        if (!SPIO_ABLATE_SYNC) {
            __syncthreads();
        }
        // The last STAGES - 1 steps copy zeros (from no address) into slots no step reads
        // again, rather than branch around the copies: without the branch ptxas keeps more of
        // the copies' address work out of the loop (132 -> 123 instructions a step on the 64c
        // 64x64 config, NVRTC 12.9, sm_90).
        if (!SPIO_COPY_UNDER_BRANCH || t + STAGES - 1 < STEPS) {
            load_step(t + STAGES - 1);
        }
        spio::cp_async_commit_group();
        compute_step(t);
    }
    spio::cp_async_wait_all();  // those zeros too: no copy is in flight when the block exits
#endif

    // Accumulator element e of tap pair `pair` is dw's tap (2 pair + rp, s) of channel k of the
    // group by its channel c (DwFrag::rp, k and c of the element).
    const int c8 = block_c8 + warp.c8();
    if (c8 >= DW::K8) {
        return;
    }
#if SPIO_WGRAD_PARTIALS
    // This warp's slot: its dy tile (images, rows, columns) and its run of columns in the tile.
    const int part = PartSlot::of(block.n(), block.y(), block.x(), warp.x8()).flat();
#endif
    SPIO_UNROLL
    for (int pair = 0; pair < PAIRS; ++pair) {
        SPIO_UNROLL
        for (int s = 0; s < S; ++s) {
            SPIO_UNROLL
            for (int e = 0; e < 4; ++e) {
                const int r = 2 * pair + DwFrag::rp(lane, e);
                const int k = DwFrag::k(lane, e);
                const int c = DwFrag::c(lane, e);
#if SPIO_ABLATE_STORES
                if (__float_as_uint(acc[pair][s][e]) != 0x7fc0beefu) {
                    continue;
                }
#endif
                if (r < R) {
#if SPIO_WGRAD_PARTIALS
                    *DWPart(dw).t(part).k8(c8).k(k).c(c).r(r).s(s) = acc[pair][s][e];
#else
                    atomicAdd(DW(dw).k8(c8).k(k).c(c).r(r).s(s).get(), acc[pair][s][e]);
#endif
                }
            }
        }
    }
#if SPIO_WGRAD_HAS_BIAS
#if SPIO_ABLATE_STORES
    if (__float_as_uint(bias_acc[0]) != 0x7fc0beefu) {  // as for dw above
        return;
    }
#endif
    // Every column of bias_acc holds the row sums (B is all ones): the lanes of column 0 write.
    if (DwFrag::c(lane, 0) == 0) {
        const int k = DwFrag::k(lane, 0);
#if SPIO_WGRAD_PARTIALS
        *DBiasPart(dbias).t(part).k8(c8).k(k) = bias_acc[0];
#else
        atomicAdd(DBias(dbias).k8(c8).k(k).get(), bias_acc[0]);
#endif
    }
#endif
}
