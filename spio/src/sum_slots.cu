/// The second pass of the partial-sums WGrad (conv2d_gw8_wgrad.cu with SPIO_WGRAD_PARTIALS): sums
/// the slots of the partial-sum buffers into dw (and dbias), rounded once to the gradients' dtypes.
///
/// What it computes, with T = slots (given at launch):
///   dw[k8, k, c, r, s] = sum_{t = 0..T-1} DWPart[t, k8, k, c, r, s]
///   dbias[k8, k]       = sum_{t = 0..T-1} DBiasPart[t, k8, k]   (with Sum::has_bias)
/// in fp32, adding the slots in order t = 0, 1, ..., so the result is the same on every run.
/// Channel k8 * 8 + k of dw is PyTorch's output channel and c its input channel within the group.
/// dw is written as DW (contiguous, [K, 8, R, S]) or, with `channels_last` != 0, as
/// DWChannelsLast ([K, R, S, 8]: a channels_last model's weight layout, so that autograd takes
/// the gradient as it is, without a copy into the weight's layout).
///
/// Tiling: one thread per output element, DwIdx's (in dw's contiguous order), then DBiasIdx's;
/// consecutive threads read consecutive elements of a slot, so every slot is read in whole
/// lines. No shared memory, no synchronisation.
///
/// Launch contract: ceil((DwIdx::size + DBiasIdx::size) / blockDim.x) blocks of any block size
/// (DBiasIdx's threads return at once without Sum::has_bias).
/// Arguments: (DW::data_type *dw, DBias::data_type *dbias or null, const float *dw_part,
///             const float *dbias_part or null, int slots, int channels_last).
/// The generated header (sum_slots_gen.h) sets the layer's sizes and the gradients' types (float,
/// __half or __nv_bfloat16) through DW, DWChannelsLast and DBias.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "spio/macros.h"

#include "sum_slots_gen.h"

namespace {

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

/// The sum of one element over the slots, in slot order.
///
/// Parameters:
///   part   a cursor at the element in slot 0 (DWPart or DBiasPart).
///   slots  the number of slots.
template <typename Part>
SPIO_DEVICE float slot_sum(Part part, int slots) {
    float total = 0.0f;
    for (int t = 0; t < slots; ++t) {
        total += *part.t(t);
    }
    return total;
}

}  // namespace

extern "C" __global__ void spio_sum_slots(DW::data_type *dw, DBias::data_type *dbias,
                                          const float *dw_part, const float *dbias_part,
                                          int slots, int channels_last) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < DwIdx::size) {
        const DwIdx e(i);
        const float total = slot_sum(
            DWPart(dw_part).k8(e.k8()).k(e.k()).c(e.c()).r(e.r()).s(e.s()), slots);
        const auto value = round_to<DW::data_type>(total);
        if (channels_last) {
            *DWChannelsLast(dw).k8(e.k8()).k(e.k()).r(e.r()).s(e.s()).c(e.c()) = value;
        } else {
            *DW(dw).k8(e.k8()).k(e.k()).c(e.c()).r(e.r()).s(e.s()) = value;
        }
    } else if (Sum::has_bias && i < DwIdx::size + DBiasIdx::size) {
        const DBiasIdx e(i - DwIdx::size);
        const float total = slot_sum(DBiasPart(dbias_part).k8(e.k8()).k(e.k()), slots);
        *DBias(dbias).k8(e.k8()).k(e.k()) = round_to<DBias::data_type>(total);
    }
}
