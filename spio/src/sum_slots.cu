/// The second pass of the partial-sums WGrad (conv2d_gw8_wgrad.cu with SPIO_WGRAD_PARTIALS): sums
/// the slots of the partial-sum buffers into dw (and dbias), rounded once to the gradients' dtypes.
///
/// What it computes, with T = slots, W = dw's element count and C = dbias's (0: no bias):
///   dw[i]    = sum_{t = 0..T-1} dw_part[t * W + i]     (i < W)
///   dbias[j] = sum_{t = 0..T-1} dbias_part[t * C + j]  (j < C)
/// in fp32, adding the slots in order t = 0, 1, ..., so the result is the same on every run.
/// The slots hold dw in PyTorch's contiguous order [K, 8, R, S]; with taps_cl = R * S (> 0) dw is
/// written in its channels_last order [K, R, S, 8] instead (the layout of a channels_last
/// model's weight, so that autograd takes the gradient as it is, without a copy into the
/// weight's layout); taps_cl = 0 writes the slots' order.
///
/// Tiling: one thread per output element (dw's, then dbias's); consecutive threads read
/// consecutive elements of a slot, so every slot is read in whole lines. No shared memory, no
/// synchronisation.
///
/// Launch contract: ceil((W + C) / blockDim.x) blocks of any block size.
/// Arguments: (DwOut *dw, DbiasOut *dbias or null, const float *dw_part,
///             const float *dbias_part or null, int slots, int w, int c, int taps_cl).
/// The generated header (sum_slots_gen.h) sets DwOut and DbiasOut (float, __half or
/// __nv_bfloat16) as SPIO_SUM_DW_TYPE and SPIO_SUM_DBIAS_TYPE.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "spio/macros.h"

#include "sum_slots_gen.h"

namespace {

using DwOut = SPIO_SUM_DW_TYPE;
using DbiasOut = SPIO_SUM_DBIAS_TYPE;

/// v rounded once (to nearest even) to T. A build calls the round_to of its two output types;
/// [[maybe_unused]] keeps NVRTC quiet on the others.
template <typename T>
SPIO_HOST_DEVICE T round_to(float v);

template <>
[[maybe_unused]] SPIO_HOST_DEVICE float round_to<float>(float v) {
    return v;
}

template <>
[[maybe_unused]] SPIO_HOST_DEVICE __half round_to<__half>(float v) {
    return __float2half_rn(v);
}

template <>
[[maybe_unused]] SPIO_HOST_DEVICE __nv_bfloat16 round_to<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

/// The sum over `slots` slots of column i of a [slots][columns] fp32 buffer, in slot order.
SPIO_DEVICE float column_sum(const float *part, int slots, int columns, int i) {
    float total = 0.0f;
    for (int t = 0; t < slots; ++t) {
        total += part[static_cast<long long>(t) * columns + i];
    }
    return total;
}

}  // namespace

extern "C" __global__ void spio_sum_slots(DwOut *dw, DbiasOut *dbias, const float *dw_part,
                                          const float *dbias_part, int slots, int w, int c,
                                          int taps_cl) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < w) {
        int out = i;  // [K, 8, R, S] order: i = (k * 8 + c8) * taps + tap
        if (taps_cl > 0) {
            const int kc = i / taps_cl;
            out = (kc / 8) * 8 * taps_cl + (i - kc * taps_cl) * 8 + kc % 8;  // [K, R, S, 8]
        }
        dw[out] = round_to<DwOut>(column_sum(dw_part, slots, w, i));
    } else if (i < w + c) {
        dbias[i - w] = round_to<DbiasOut>(column_sum(dbias_part, slots, c, i - w));
    }
}
