/// Grouped 2-D convolution with group width 8, stride 1: FProp, and DGrad in "igrad" mode.
///
/// What it computes (NHWC; g is the group of 8 channels, c and k index inside a group):
///   Out[n, y, x, 8g + k] = sum_{r, s, c} In[n, y + r - PAD_H, x + s - PAD_W, 8g + c] * Tap(g, r, s)[k][c]
///                          (+ bias[8g + k] in FProp)
///   FProp: In = x, Out = y, Tap(g, r, s)[k][c] = w[8g + k, c, r, s], PAD = padding.
///   DGrad: In = dy, Out = dx, Tap(g, r, s)[k][c] = w[8g + c, k, R-1-r, S-1-s], PAD = R-1-padding (may
///          be negative); the same kernel with the taps flipped and each 8x8 tap transposed, which
///          the tap gather does by reading the weights' k and c the other way (no extra pass).
/// Inputs whose indices fall outside In are zero (cp.async zero-fill); w is read as the caller holds
/// it, PyTorch's [K, 8, R, S] or its channels_last [K, R, S, 8] (see the launch contract).
///
/// Tiling: a block owns Block::n consecutive images, Block::c8 groups, Block::y output rows and
/// Block::x output columns. It streams the Block::y + R - 1 input rows of its tile in each image,
/// image after image, through shared memory one row at a time (cp.async, Block::stages row
/// buffers, so up to Block::stages - 1 rows are in flight while one is being computed). The
/// pipeline runs on across image boundaries, and the weights are read once for all Block::n
/// images. A stage holds one row of the block's groups, group-major ([c8][x], the pitch padded to
/// odd) or, in a build with swizzled stages, pixel-major with each pixel's groups permuted by a
/// key of the pixel (SmemInput; conv2d_gw8_factory.stage_layout); the code is the same, as all
/// its addresses come from SmemInput. Each warp owns one group and Block::warp_x16 runs of 16
/// output columns.
/// For each input row a warp loads, per filter column s, the 16x8 matrix of the shifted input
/// (16 pixels x 8 channels, ldmatrix.x2) and multiplies it with the R taps (r, s) by
/// mma.sync.m16n8k8 (or, with Block::mma_k == 16, two filter columns per mma.sync.m16n8k16: A is
/// the two shifted 16x8 matrices side by side, B the two 8x8 taps stacked), adding into a
/// circular buffer of R output rows kept in registers (overlap-add): input row i feeds output
/// rows i - r. The loop over input rows is unrolled by a multiple of R so that each buffer slot is
/// a fixed set of registers (and, where that stays short, of the stages, so that each step's
/// stage is a constant: unroll_steps). After input row i, output row i - (R-1) is complete: it is
/// biased (in fp32), rounded and written to a shared-memory staging buffer, and its slot zeroed
/// for reuse. In the next step all threads copy the staged row to global memory in whole
/// 16-byte chunks, a pixel's groups side by side (two staging buffers alternate).
/// Across images the stream is one sequence of rows: its output rows i - (R-1) whose R input rows
/// straddle two images' tiles (the last R - 1 of each image's stretch) mix two images and are
/// dropped, neither staged nor stored; every other output row sees only its own image's rows.
/// Weights are read once per block into shared memory, copied as they are held (the block's groups
/// are one contiguous run), and from there into registers, one register per tap per lane.
/// Which elements of the mma's matrices a lane holds comes from the generated fragment classes
/// (TapFrag: a tap's B; AccFrag: the accumulators), which rows' addresses it gives to ldmatrix
/// from spio::ldmatrix_row: the kernel works out no lane's role itself.
///
/// Synchronisation: one __syncthreads per input row, and one before the taps are read. Every row
/// index commits exactly one cp.async group (empty past the last row); row 0's also holds the
/// weights. At the top of row i every thread waits for its copies of row i (cp.async.wait_group
/// STAGES - 2 leaves the newer rows in flight), then the barrier publishes row i
/// to all warps and guarantees that every warp has finished reading row i - 1, whose stage then
/// receives row i + STAGES - 1. The same barrier publishes the output row staged in step i - 1,
/// which the threads copy out in step i; its buffer is staged into again only in step i + 1, after
/// the next barrier. One more barrier after the last step publishes the tile's last output row.
/// (The timing variant SPIO_LOAD_VIA_REGS moves input rows through registers instead; its
/// comment is at its code.) A build with SPIO_LOAD_VIA_TMA (sm_90; the generated header sets
/// it, with swizzled stages) brings each input row in by one tensor copy that thread 0 issues,
/// waited for on an mbarrier a stage instead of cp.async.wait_group; the barrier per row stays,
/// and so does its role: the stage thread 0 then refills is one no warp reads any more. Such a
/// kernel takes one more argument, the input's tensor map (conv2d_gw8_factory.input_box). One
/// built with SPIO_STORE_VIA_TMA too also stores each staged output row by one tensor copy that
/// thread 0 issues after the barrier that publishes it (the staging threads fence their writes
/// for the copy first), and waits, before the next step's barrier, until the copy has read the
/// buffer, which that step stages into; it takes the output's tensor map after the input's
/// (conv2d_gw8_factory.output_box; map_arguments passes both).
///
/// Launch contract: grid = ceil(images / Block::n) * (the blocks of one image's tiles: BlockIdx
/// without its n) blocks, Block::threads threads (one warp per group and run of
/// Block::warp_x16 * 16 columns: WarpIdx), SmemInput::num_bytes + SmemWeights::num_bytes +
/// SmemOutput::num_bytes bytes of dynamic shared memory; a SPIO_LOAD_VIA_TMA build
/// SPIO_TMA_ALIGN - 16 bytes more, to align its buffers, and 8 * Block::stages for its mbarriers
/// after them (conv2d_gw8_factory.shared_mem_bytes).
/// Arguments: (Output::data_type *out, const uint4 *in, const Elem *weights,
/// Bias::data_type *bias or null, int images); out and in are NHWC. The batch size `images` is
/// the one extent given at launch: the generated tensors and BlockIdx leave their n extents open,
/// so one build serves every batch size that Block::n divides, and another (Block::ragged, whose
/// last block of images is partly empty and checks each image against `images`) the others.
/// The generated header sets the weights' layout (PyTorch's contiguous [K, 8, R, S] or its
/// channels_last [K, R, S, 8]) and the bias element (fp32, or the activations' dtype), so either
/// is read as the caller holds it.
/// The generated header (conv2d_gw8_gen.h) defines Conv, Block, the tensors and the index classes,
/// and the kernel's symbol SPIO_KERNEL_ENTRY: spio_<pass, layer and config>
/// (spio.kernels.kernel.entry_symbol), so that profiler traces tell launches apart.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "spio/thread/async_copy.h"
#include "spio/warp/ldmatrix.h"
#include "spio/warp/mma.h"

#include "conv2d_gw8_gen.h"
// After the generated header, where scripts/ablate_kernel.py defines its switches.
#include "spio/ablation.h"
#if SPIO_LOAD_VIA_TMA
#include "spio/thread/bulk_copy.h"
#endif

namespace {

using Elem = SPIO_CONV_ELEMENT;

/// Adds A * B into acc for one tap (one m16n8k8).
SPIO_DEVICE void mma_tap(float (&acc)[4], const unsigned (&a)[2], unsigned b) {
    spio::mma_m16n8k8<Elem>(acc, a, b, acc);
}
/// The 16 bits of an element. (A build calls the element_bits of its Elem; [[maybe_unused]] keeps
/// NVRTC quiet on the other.)
[[maybe_unused]] SPIO_DEVICE unsigned short element_bits(__half e) { return __half_as_ushort(e); }
[[maybe_unused]] SPIO_DEVICE unsigned short element_bits(__nv_bfloat16 e) {
    return __bfloat16_as_ushort(e);
}
/// The 32-bit register holding lo (bits 0-15) and hi (bits 16-31), as ldmatrix would load them.
SPIO_DEVICE unsigned pack_elements(Elem lo, Elem hi) {
    return element_bits(lo) | (static_cast<unsigned>(element_bits(hi)) << 16);
}

/// Adds [A0 A1] * [B0; B1] into acc for taps s and s + 1 in one m16n8k16: its A fragment is the
/// two k8 fragments' registers in order, its B the two B registers.
SPIO_DEVICE void mma_two_taps(float (&acc)[4], const unsigned (&a0)[2], const unsigned (&a1)[2],
                              unsigned b0, unsigned b1) {
    const unsigned a[4] = {a0[0], a0[1], a1[0], a1[1]};
    const unsigned b[2] = {b0, b1};
    spio::mma_m16n8k16<Elem>(acc, a, b, acc);
}

/// Where a row of a block's stream lies: its image (counted from the block's first) and its row in
/// that image's tile of Block::y + R - 1 input rows. The main loop advances positions one row a
/// step instead of dividing by the tile's rows. With one image a block the position is the stream
/// row itself (StreamRow::of) and the counters stand still, so that they cost nothing.
struct StreamRow {
    static constexpr int ROWS = Block::y + Conv::r - 1;
    int image;
    int row;
    /// The position of stream row `row` (for row < 0: image 0 and the same negative row).
    SPIO_DEVICE static constexpr StreamRow at(int row) {
        return Block::n == 1 || row < 0 ? StreamRow{0, row} : StreamRow{row / ROWS, row % ROWS};
    }
    /// The position of stream row `row` kept by a counter: the counter's, or the row itself.
    SPIO_DEVICE static constexpr StreamRow of(int row, StreamRow counted) {
        return Block::n == 1 ? at(row) : counted;
    }
    /// Moves to the next stream row (nothing with one image a block).
    SPIO_DEVICE void next() {
        if (Block::n > 1 && ++row == ROWS) {
            row = 0;
            ++image;
        }
    }
};

/// The most steps unroll_steps unrolls the main loop by to make the stages constants.
constexpr int MAX_UNROLL = 6;
SPIO_DEVICE constexpr int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }
SPIO_DEVICE constexpr int lcm(int a, int b) { return a / gcd(a, b) * b; }
/// Steps of the main loop's unrolled body: a multiple of R, so that each accumulator slot is a
/// fixed set of registers. Where it stays at most MAX_UNROLL steps, also a multiple of `stages`
/// and 2 (or of `stages` alone), so that each step's input stage and output buffer are constants:
/// the input's shared-memory addresses are then immediate offsets, not a division, a multiply and
/// an add per step. (NVRTC 12.9, sm_90: 90 -> 40 instructions a step for the 64c 64x64 layer's
/// 6-stage config, same blocks per SM; longer unrolls cost blocks per SM, docs/perf/resources.md.)
/// SPIO_UNROLL_BY_R (spio/ablation.h) keeps R, for timing the difference.
SPIO_DEVICE constexpr int unroll_steps(int r, int stages) {
    return SPIO_UNROLL_BY_R                       ? r
           : lcm(lcm(r, stages), 2) <= MAX_UNROLL ? lcm(lcm(r, stages), 2)
           : lcm(r, stages) <= MAX_UNROLL         ? lcm(r, stages)
                                                  : r;
}

}  // namespace

// Min. 1 block per SM: with the thread count alone, ptxas (NVRTC 12.9 and 13.0) capped registers
// below the need of some register-heavy configs and spilled; this way it never spills them.
extern "C" __global__ void __launch_bounds__(Block::threads, 1)
    SPIO_KERNEL_ENTRY(Output::data_type *out, const uint4 *in, const Elem *weights,
                      Bias::data_type *bias, int images
#if SPIO_LOAD_VIA_TMA
                      ,
                      const __grid_constant__ spio::TensorMap in_map
#endif
#if SPIO_STORE_VIA_TMA
                      ,
                      const __grid_constant__ spio::TensorMap out_map
#endif
    ) {
    constexpr int R = Conv::r;
    constexpr int S = Conv::s;
    constexpr int ROWS = Block::y + R - 1;     // input rows of the tile in one image
    constexpr int STREAM = Block::n * ROWS;    // input rows of the block: its images one by one

    spio::stagger_start(blockIdx.x);  // nothing unless timing with SPIO_STAGGER_NS

    extern __shared__ uint4 dynamic_smem[];
#if SPIO_LOAD_VIA_TMA
    // Tensor copies swizzle by shared-memory address bits: the stages start at a multiple of the
    // pattern's repeat, SPIO_TMA_ALIGN bytes (the factory leaves room to round up to it).
    uint4 *const smem = spio::align_shared<SPIO_TMA_ALIGN>(dynamic_smem);
#else
    uint4 *const smem = dynamic_smem;
#endif
    const SmemInput smem_input(smem);
    const SmemWeights smem_weights(reinterpret_cast<Elem *>(smem + SmemInput::size));
    static_assert(SmemWeights::num_bytes % 16 == 0, "output staging must be 16-byte aligned");
    const SmemOutput smem_output(reinterpret_cast<SmemOutput::data_type *>(
        smem + SmemInput::size + SmemWeights::num_bytes / 16));

    const BlockIdx block(blockIdx.x);
    const int block_n = block.n() * Block::n;  // the block's first image
    const int block_c8 = block.c8() * Block::c8;
    const int block_y = block.y() * Block::y;
    const int block_x = block.x() * Block::x;

    constexpr int STAGES = Block::stages;

#if SPIO_LOAD_VIA_TMA
    static_assert(!SPIO_LOAD_VIA_REGS, "SPIO_LOAD_VIA_TMA and SPIO_LOAD_VIA_REGS exclude each other");
    // Without the barrier per row a warp could wait for a stage's next phase while thread 0
    // refills it for the one after, or refill it while others read it.
    static_assert(!SPIO_ABLATE_SYNC, "SPIO_LOAD_VIA_TMA needs the barrier per row");
    static_assert(!SPIO_STORE_VIA_TMA || !SPIO_STORE_STREAMING,
                  "tensor copies store the output: no st.global.cs to choose");
    // Input rows by tensor copies (sm_90): thread 0 copies each row, one box of in_map (the
    // block's groups across its Block::x + S - 1 input columns), which lands swizzled as
    // SmemInput lays it out, zeros outside the input (also rows above or below the image, and
    // images past the batch), on the stage's mbarrier (stage_full; they follow the output
    // staging buffers).
    constexpr unsigned ROW_BYTES = InputLoadIdx::size * 16;
    spio::BufferBarriers<STAGES> stage_full(reinterpret_cast<unsigned long long *>(
        smem + SmemInput::size + SmemWeights::num_bytes / 16 + SmemOutput::num_bytes / 16));
    const bool issuer = threadIdx.x == 0;
    // Copies the stream row at `pos` into stage `stage` (thread 0 only).
    const auto load_input_row = [&](int stage, StreamRow pos) {
        spio::mbarrier_arrive_expect_tx(stage_full[stage], SPIO_ABLATE_LOADS ? 0 : ROW_BYTES);
        if (!SPIO_ABLATE_LOADS) {
            spio::cp_async_bulk_tensor_4d_g2s(smem_input.stage(stage).get(), &in_map, block_c8 * 8,
                                              block_x - Conv::pad_w, block_y + pos.row - Conv::pad_h,
                                              block_n + pos.image, stage_full[stage]);
        }
    };
    if (issuer) {
        stage_full.init();
    }
    (void)in;
#else
    // Input copies: thread t copies elements t + j * Block::threads of every row. The part of an
    // element's addresses that does not depend on the row is worked out once, here: its offset in
    // a stage (-1: this thread has no element j) and in an input row (-1: outside the image or the
    // channels, so it is zero-filled). Per row only the row's offset and bounds remain.
    constexpr int LOADS = (InputLoadIdx::size + Block::threads - 1) / Block::threads;
    int load_dst[LOADS];
    int load_col[LOADS];
    spio::plan_row_16<InputLoadIdx, Block::threads>(
        load_dst, load_col, threadIdx.x, [&](const InputLoadIdx &idx, int &dst, int &col) {
            const int x = block_x + idx.x() - Conv::pad_w;
            const int c8 = block_c8 + idx.c8();
            dst = static_cast<int>(smem_input.stage(0).c8(idx.c8()).x(idx.x()).get() -
                                   smem_input.stage(0).get());
            if (x >= 0 && x < Input::X && c8 < Input::C8) {
                col = x * Input::stride_x + c8 * Input::stride_c8;
            }
        });
    // Where the input row at `pos` is read from: its image (the block's first for a row that is
    // not read: outside the image's rows or past the batch), its offset there, and whether it is
    // inside the input.
    struct RowSource {
        const uint4 *image;
        int offset;
        bool inside;
    };
    const uint4 *first_image = Input(in).n(block_n).get();
    const auto row_source = [&](StreamRow pos) {
        const int y = block_y + pos.row - Conv::pad_h;
        const int n = block_n + pos.image;
        const bool inside = y >= 0 && y < Input::Y && (!Block::ragged || n < images);
        const uint4 *image = Block::n == 1 || !inside ? first_image : Input(in).n(n).get();
        return RowSource{image, y * Input::stride_y, inside};
    };
    // Copies the stream row at `pos` into stage `stage` (zero outside the image); no commit.
    const auto load_input_row = [&](int stage, StreamRow pos) {
        const RowSource source = row_source(pos);
        if (!SPIO_ABLATE_LOADS) {
            spio::cp_async_row_16<SPIO_L2_PREFETCH>(smem_input.stage(stage).get(), load_dst,
                                                    load_col, source.image, source.offset,
                                                    source.inside, in);
        }
    };
#endif  // SPIO_LOAD_VIA_TMA
#if SPIO_LOAD_VIA_REGS
    // The timing variant SPIO_LOAD_VIA_REGS (spio/ablation.h): input rows travel through
    // registers instead of cp.async. Row r is loaded with plain 16-byte loads into register slot
    // r % DEPTH at the end of step r - 1 - DEPTH, and stored into its stage at the end of step
    // r - 1, so DEPTH = STAGES - 1 rows are in flight, as with cp.async. The slots are indexed
    // by the unrolled step (u + 1) % DEPTH, which needs DEPTH to divide R.
    constexpr int DEPTH = STAGES - 1;
    static_assert(R % DEPTH == 0, "SPIO_LOAD_VIA_REGS needs STAGES - 1 to divide the filter's R");
    uint4 held[DEPTH][LOADS];
    const auto load_row_regs = [&](StreamRow pos, uint4(&slot)[LOADS]) {
        const RowSource source = row_source(pos);
        spio::load_row_16(slot, load_dst, load_col, source.image, source.offset, source.inside);
    };
    const auto store_row_regs = [&](int stage, const uint4(&slot)[LOADS]) {
        spio::store_row_16(smem_input.stage(stage).get(), load_dst, slot);
    };
#endif
    // Weights: the block's groups are one contiguous run of the weights in global memory
    // (PyTorch's [K, 8, R, S], or channels_last [K, R, S, 8]), copied as it is, in 16-byte chunks,
    // into shared memory (SmemWeights has the same layout), with the first input row's copies.
    // Groups past the layer's are zero-filled.
    {
        constexpr int CHUNKS = SmemWeights::num_bytes / 16;
        const Elem *run = Weights(weights).k(block_c8 * 8).get();
        SPIO_UNROLL
        for (int j = 0; j < (CHUNKS + Block::threads - 1) / Block::threads; ++j) {
            const int chunk = threadIdx.x + j * Block::threads;
            if (chunk < CHUNKS) {
                const bool inside = block_c8 + WeightChunkIdx(chunk).c8() < Input::C8;
                spio::cp_async_16(smem_weights.get() + chunk * 8, inside ? run + chunk * 8 : weights,
                                  inside ? 16 : 0);
            }
        }
    }
#if SPIO_LOAD_VIA_REGS
    spio::cp_async_commit_group();  // the weights
    SPIO_UNROLL
    for (int row = 0; row < DEPTH; ++row) {
        if (row < STREAM) {
            load_row_regs(StreamRow::at(row), held[row]);
        }
    }
    store_row_regs(0, held[0]);  // row 0 into stage 0
    if (DEPTH < STREAM) {
        load_row_regs(StreamRow::at(DEPTH), held[0]);
    }
    spio::cp_async_wait_all();  // the weights have landed
#elif SPIO_LOAD_VIA_TMA
    spio::cp_async_commit_group();  // the weights
    SPIO_UNROLL
    for (int row = 0; row < STAGES - 1; ++row) {
        if (issuer && row < STREAM) {
            load_input_row(row, StreamRow::at(row));  // row `row` into stage `row`
        }
    }
    spio::cp_async_wait_all();  // the weights have landed (the rows are waited for in the loop)
#else
    SPIO_UNROLL
    for (int row = 0; row < STAGES - 1; ++row) {
        if (row < STREAM) {
            load_input_row(row, StreamRow::at(row));  // row `row` into stage `row`
        }
        spio::cp_async_commit_group();
    }
    spio::cp_async_wait_group<STAGES - 2>();  // the weights (and input row 0) have landed
#endif
    __syncthreads();

    const int lane = threadIdx.x % 32;
    const WarpIdx warp(threadIdx.x / 32);
    const int warp_x = warp.x16() * (Block::warp_x16 * 16);  // first column of this warp in the tile

    // B operands: one register per tap, holding the lane's two elements of the mma's B[c][k]
    // (TapFrag: rows c0 and c1 of column k). FProp: B[c][k] = w[8g + k, c, r, s]. DGrad:
    // B[c][k] = w[8g + c, k, R-1-r, S-1-s]. Read element by element from the weights as held.
    unsigned taps[R][S];
    {
        const SmemWeights group = smem_weights.c8(warp.c8());
        const int k = TapFrag::k(lane, 0);
        const int c0 = TapFrag::c(lane, 0);
        const int c1 = TapFrag::c(lane, 1);
        SPIO_UNROLL
        for (int r = 0; r < R; ++r) {
            SPIO_UNROLL
            for (int s = 0; s < S; ++s) {
#if SPIO_CONV_IGRAD
                const SmemWeights tap = group.r(R - 1 - r).s(S - 1 - s);
                taps[r][s] = pack_elements(*tap.k(c0).c(k), *tap.k(c1).c(k));
#else
                const SmemWeights tap = group.r(r).s(s);
                taps[r][s] = pack_elements(*tap.k(k).c(c0), *tap.k(k).c(c1));
#endif
            }
        }
    }

#if SPIO_CONV_HAS_BIAS
    const int c8 = block_c8 + warp.c8();  // this warp's group
    float2 bias_pair = make_float2(0.0f, 0.0f);
    if (c8 < Output::K8) {
        bias_pair = spio::unpack_pair(*Bias(bias).k8(c8).k2(AccFrag::k2(lane, 0)));
    }
#endif

    // The circular buffer: acc[slot][run] is a 16x8 f32 accumulator fragment.
    float acc[R][Block::warp_x16][4];
    SPIO_UNROLL
    for (int slot = 0; slot < R; ++slot) {
        SPIO_UNROLL
        for (int run = 0; run < Block::warp_x16; ++run) {
            SPIO_UNROLL
            for (int e = 0; e < 4; ++e) {
                acc[slot][run][e] = 0.0f;
            }
        }
    }

    // Output rows leave through shared memory so that global stores are whole 16-byte chunks,
    // consecutive threads writing consecutive chunks (all the block's groups of a pixel, then the
    // next pixel), instead of each lane writing 4 bytes into every pixel's 16-byte group slice.
    // A staged row is pixel-major, a pixel's groups side by side, padded by one chunk against
    // bank conflicts; where a tensor copy stores it (SPIO_STORE_VIA_TMA), unpadded and swizzled
    // as the input stages are: SmemOutput's elements are then the 16-byte chunks the swizzle
    // moves, and a lane writes its output pair (AccFrag::k2) of its group's chunk of each of its
    // pixels.
    // Biases (in fp32), rounds and writes an output row from accumulator slot `rows` into staging
    // buffer `buf` (stream output row i goes to buffer i % 2).
    const auto stage_output_row = [&](int buf, float (&rows)[Block::warp_x16][4]) {
#if SPIO_STORE_VIA_TMA
        const SmemOutput staged = smem_output.buf(buf).k8(warp.c8());
#else
        const SmemOutput staged = smem_output.buf(buf).k8(warp.c8()).k2(AccFrag::k2(lane, 0));
#endif
        SPIO_UNROLL
        for (int run = 0; run < Block::warp_x16; ++run) {
            SPIO_UNROLL
            for (int half = 0; half < 2; ++half) {  // elements 2 half and 2 half + 1: one pair
                const int x = warp_x + run * 16 + AccFrag::x(lane, 2 * half);
                float v0 = rows[run][2 * half];
                float v1 = rows[run][2 * half + 1];
#if SPIO_CONV_HAS_BIAS
                v0 += bias_pair.x;  // (x + 0.0f is not x for x = -0.0: without a bias, no add)
                v1 += bias_pair.y;
#endif
#if SPIO_STORE_VIA_TMA
                reinterpret_cast<Output::data_type *>(staged.x(x).get())[AccFrag::k2(lane, 0)] =
                    spio::pack_pair<Elem>(v0, v1);
#else
                *staged.x(x) = spio::pack_pair<Elem>(v0, v1);
#endif
            }
        }
#if SPIO_STORE_VIA_TMA
        spio::fence_proxy_async_shared();  // the row's writes before thread 0's tensor copy of it
#endif
    };
#if SPIO_STORE_VIA_TMA
    // Output rows by tensor copies (sm_90): thread 0 copies each staged row out, one box of
    // out_map (the block's groups across its Block::x columns; the copy leaves out what lies
    // outside the output: columns and groups past its edges, images past the batch), in a bulk
    // group of its own. Before each step's barrier it waits until the previous step's copy has
    // read its buffer, which the step after the barrier stages into again; before the block
    // ends, until every copy is complete.
    static_assert(SPIO_LOAD_VIA_TMA, "SPIO_STORE_VIA_TMA comes with SPIO_LOAD_VIA_TMA's alignment");
    const auto store_output_row = [&](int buf, StreamRow pos) {
        const int y = block_y + pos.row;
        const bool one_image = Block::n == 1 || pos.row < Block::y;
        if (issuer && one_image && y < Output::Y) {
            if (!SPIO_ABLATE_STORES) {
                spio::cp_async_bulk_tensor_4d_s2g(&out_map, block_c8 * 8, block_x, y,
                                                  block_n + pos.image, smem_output.buf(buf).get());
            }
            spio::cp_async_bulk_commit_group();
        }
    };
    (void)out;
#else
    // Output copies: thread t copies chunks t + j * Block::threads of every staged row. As for the
    // input, the row-independent part of each address is worked out once: the chunk's offset in
    // a staging buffer and in an output row (plan_row_16; an output offset of -1, for no chunk j
    // or one outside the image or channels, means the chunk is neither read nor written).
    constexpr int STORES = (OutputStoreIdx::size + Block::threads - 1) / Block::threads;
    int store_src[STORES];
    int store_dst[STORES];
    spio::plan_row_16<OutputStoreIdx, Block::threads>(
        store_src, store_dst, threadIdx.x, [&](const OutputStoreIdx &idx, int &src, int &dst) {
            const int x = block_x + idx.x();
            const int k8 = block_c8 + idx.c8();
            src = static_cast<int>(smem_output.x(idx.x()).k8(idx.c8()).get() - smem_output.get());
            if (x < Output::X && k8 < Output::K8) {
                dst = x * Output::stride_x + k8 * Output::stride_k8;
            }
        });
    // Copies the output row at stream position `pos`, staged in buffer `buf`, to global memory
    // (all threads) if the block writes it: its input rows are all in one image's tile (see the
    // leading comment), and it is inside the output.
    const auto store_output_row = [&](int buf, StreamRow pos) {
        const int y = block_y + pos.row;
        const bool one_image =
            Block::n == 1 ||
            (pos.row < Block::y && (!Block::ragged || block_n + pos.image < images));
        if (!one_image || y >= Output::Y) {
            return;
        }
        Output::data_type *out_row = Output(out).n(block_n + pos.image).y(y).get();
        const Output::data_type *staged = smem_output.buf(buf).get();
        SPIO_UNROLL
        for (int j = 0; j < STORES; ++j) {
            if (store_dst[j] < 0) {  // no chunk j, or outside the image or channels
                continue;
            }
            const uint4 chunk = *reinterpret_cast<const uint4 *>(staged + store_src[j]);
#if SPIO_ABLATE_STORES
            if (chunk.x != 0x7fc0beefu) {
                continue;
            }
#endif
            spio::store_output_16(out_row + store_dst[j], chunk);
        }
    };
#endif  // SPIO_STORE_VIA_TMA

    // Positions of the rows each step handles: the one it loads ahead, the output row it
    // finishes, and the one the previous step finished (staged there, copied out here). With
    // one image a block they are the stream rows themselves, and these go unused.
#if SPIO_LOAD_VIA_REGS
    StreamRow ahead = StreamRow::at(1 + DEPTH);
#else
    StreamRow ahead = StreamRow::at(STAGES - 1);
#endif
    StreamRow finishing = StreamRow::at(-(R - 1));
    StreamRow staged = StreamRow::at(-R);
    // The loop is unrolled by UNROLL steps (unroll_steps). ring(row0, k, n): the slot of stream
    // row row0 + k in a ring of n (row0 + k >= 0 where used), a constant where n divides UNROLL
    // (row0, a multiple of UNROLL, is then a multiple of n and drops out).
    constexpr int UNROLL = unroll_steps(R, STAGES);
    constexpr bool COMPUTE = !SPIO_ABLATE_COMPUTE;  // (the input pipeline alone without it)
    const auto ring = [](int row0, int k, int n) {
        return UNROLL % n == 0 ? (k % n + n) % n : (row0 + k) % n;
    };
    for (int row0 = 0; row0 < STREAM; row0 += UNROLL) {
        SPIO_UNROLL
        for (int u = 0; u < UNROLL; ++u) {
            const int row = row0 + u;
            if (row < STREAM) {
#if SPIO_LOAD_VIA_REGS
                if (!SPIO_ABLATE_SYNC) {
                    __syncthreads();
                }
#elif SPIO_LOAD_VIA_TMA
                stage_full.wait(ring(row0, u, STAGES));
#if SPIO_STORE_VIA_TMA
                if (issuer) {  // the output row stored last step is read: its buffer is free
                    spio::cp_async_bulk_wait_group_read<0>();
                }
#endif
                if (!SPIO_ABLATE_SYNC) {
                    __syncthreads();
                }
                // Every warp is done with row - 1's stage: thread 0 refills it, ordering the
                // threads' reads of it before the copy's writes (the async proxy's).
                if (issuer && row + STAGES - 1 < STREAM) {
                    spio::fence_proxy_async_shared();
                    load_input_row(ring(row0, u + STAGES - 1, STAGES),
                                   StreamRow::of(row + STAGES - 1, ahead));
                }
                ahead.next();
#else
                spio::cp_async_wait_group<STAGES - 2>();
                if (!SPIO_ABLATE_SYNC) {
                    __syncthreads();
                }
                if (row + STAGES - 1 < STREAM) {
                    load_input_row(ring(row0, u + STAGES - 1, STAGES),
                                   StreamRow::of(row + STAGES - 1, ahead));
                }
                ahead.next();
                spio::cp_async_commit_group();
#endif
                // The output row staged in the previous step is visible to all threads now.
                if (COMPUTE && row >= R) {
                    store_output_row(ring(row0, u - R, 2), StreamRow::of(row - R, staged));
                }
                const SmemInput stage = smem_input.stage(ring(row0, u, STAGES)).c8(warp.c8());
                // Block::mma_k == 16 pairs filter columns s and s + 1 into one m16n8k16.
                constexpr int TAPS_PER_MMA = Block::mma_k / 8;
                SPIO_UNROLL
                for (int s = 0; COMPUTE && s < S; s += TAPS_PER_MMA) {
                    const bool two_taps = TAPS_PER_MMA == 2 && s + 1 < S;
                    const int s1 = two_taps ? s + 1 : s;
                    SPIO_UNROLL
                    for (int run = 0; run < Block::warp_x16; ++run) {
                        unsigned a[2][2];
                        // A: 16 pixels (this lane's row address: ldmatrix_row) by 8 channels.
                        const int pixel = warp_x + run * 16 + spio::ldmatrix_row<2>(lane);
                        spio::ldmatrix_x2(a[0], stage.x(pixel + s).get());
                        if (two_taps) {
                            spio::ldmatrix_x2(a[1], stage.x(pixel + s1).get());
                        }
                        SPIO_UNROLL
                        for (int r = 0; r < R; ++r) {
                            // Output row (row - r) lives in slot (u - r) mod R. Rows above the
                            // stream (row < r) only exist in its first R - 1 input rows: skip them.
                            if (!SPIO_ABLATE_MMA && (row0 > 0 || r <= u)) {
                                float (&out_rows)[4] = acc[(u - r + R) % R][run];
                                if (two_taps) {
                                    mma_two_taps(out_rows, a[0], a[1], taps[r][s], taps[r][s1]);
                                } else {
                                    mma_tap(out_rows, a[0], taps[r][s]);
                                }
                            }
                        }
                    }
                }
                // Output row (row - (R - 1)) has all its input rows now.
                const int done = row - (R - 1);
                float (&finished)[Block::warp_x16][4] = acc[(u + 1) % R];
                if (COMPUTE && done >= 0 && (Block::n == 1 || finishing.row < Block::y)) {
                    stage_output_row(ring(row0, u - (R - 1), 2), finished);
                }
                staged = finishing;
                finishing.next();
                SPIO_UNROLL
                for (int run = 0; run < Block::warp_x16; ++run) {
                    SPIO_UNROLL
                    for (int e = 0; e < 4; ++e) {
                        finished[run][e] = 0.0f;
                    }
                }
#if SPIO_LOAD_VIA_REGS
                // Row row + 1 into its stage, which held row + 1 - STAGES, done with before this
                // step's barrier (the next barrier publishes it); then row row + 1 + DEPTH into
                // the register slot that frees.
                if (row + 1 < STREAM) {
                    store_row_regs(ring(row0, u + 1, STAGES), held[(u + 1) % DEPTH]);
                }
                if (row + 1 + DEPTH < STREAM) {
                    load_row_regs(StreamRow::of(row + 1 + DEPTH, ahead), held[(u + 1) % DEPTH]);
                }
                ahead.next();
#endif
            }
        }
    }
    __syncthreads();  // the last output row of the stream is staged
    if (COMPUTE) {
        store_output_row((STREAM - R) % 2, StreamRow::at(STREAM - R));
    }
#if SPIO_STORE_VIA_TMA
    if (issuer) {  // the staging buffers live as long as the block: its copies end first
        spio::cp_async_bulk_wait_group<0>();
    }
#endif
}
