/// The second pass of the partial-sums WGrad (conv2d_gw8_wgrad.cu with SPIO_WGRAD_PARTIALS): sums
/// the slots of the partial-sum buffers into dw (and dbias), rounded once to the gradients' dtypes.
///
/// What it computes, with T = slots (given at launch) and G = SumThread::G:
///   dw[k8, k, c, r, s] = sum over t < T of DWPart[t, k8, r, s, k, c]
///   dbias[k8, k]       = sum over t < T of DBiasPart[t, k8, k]   (with Sum::has_bias)
/// in fp32 and in a fixed order, so that the result is the same on every run: slot t goes to
/// group t mod G; each group adds its slots in increasing t from 0.0f, and the element's sum adds
/// the G group sums, group 0 first, to 0.0f. Channel k8 * 8 + k of dw is PyTorch's output channel
/// and c its input channel within the group. dw is written as DW (contiguous, [K, 8, R, S]) or,
/// with `channels_last` != 0, as DWChannelsLast ([K, R, S, 8]: a channels_last model's weight
/// layout, so that autograd takes the gradient as it is, without a copy into the weight's layout).
///
/// Tiling: a block sums SumThread::E consecutive output elements (SumElement: dw's in a slot's
/// order, DwIdx, then dbias's), one a lane, so that a warp reads whole lines of a slot. Its
/// G warps split the slots: warp g sums group g, issuing Sum::batch loads (slots g, g + G, ...
/// of a SlotIdx step) before adding them, so that many loads are in flight even where a layer
/// has few elements and many slots. The group sums meet in shared memory (SmemSums); after one
/// __syncthreads() warp 0 adds them and writes the element.
///
/// Launch contract: SumThread::size threads a block, ceil(DwIdx::size / SumThread::E) blocks, or
/// with Sum::has_bias ceil((DwIdx::size + DBiasIdx::size) / SumThread::E) (DBiasIdx is generated
/// either way), SmemSums::num_bytes of dynamic shared memory.
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

/// One group's sum of an element over the slots: slots g, g + G, g + 2G, ... added in that
/// order to 0.0f, loaded Sum::batch at a time before they are added. A step's loads past the
/// last slot give 0.0f, which adds nothing (a sum that starts at +0.0f is never -0.0f).
///
/// Parameters:
///   part   a cursor at the element in slot 0 (DWPart or DBiasPart).
///   g      the group, 0 <= g < SumThread::G.
///   slots  the number of slots.
template <typename Part>
SPIO_DEVICE float group_sum(Part part, int g, int slots) {
    float total = 0.0f;
    for (int step = 0; SlotIdx::of(step, 0, g).flat() < slots; ++step) {
        float values[Sum::batch];
        SPIO_UNROLL
        for (int j = 0; j < Sum::batch; ++j) {
            const int t = SlotIdx::of(step, j, g).flat();
            values[j] = t < slots ? *part.t(t) : 0.0f;
        }
        SPIO_UNROLL
        for (int j = 0; j < Sum::batch; ++j) {
            total += values[j];
        }
    }
    return total;
}

}  // namespace

extern "C" __global__ void spio_sum_slots(DW::data_type *dw, DBias::data_type *dbias,
                                          const float *dw_part, const float *dbias_part,
                                          int slots, int channels_last) {
    extern __shared__ uint4 dynamic_smem[];
    const SmemSums sums(reinterpret_cast<float *>(dynamic_smem));
    const SumThread thread(threadIdx.x);
    const int i = SumElement::of(blockIdx.x, thread.e()).flat();
    const bool is_dw = i < DwIdx::size;
    const bool is_dbias = Sum::has_bias && !is_dw && i < DwIdx::size + DBiasIdx::size;
    const DwIdx w(i);
    const DBiasIdx b(i - DwIdx::size);
    float group = 0.0f;
    if (is_dw) {
        group = group_sum(DWPart(dw_part).k8(w.k8()).k(w.k()).c(w.c()).r(w.r()).s(w.s()),
                          thread.g(), slots);
    } else if (is_dbias) {
        group = group_sum(DBiasPart(dbias_part).k8(b.k8()).k(b.k()), thread.g(), slots);
    }
    *sums.g(thread.g()).e(thread.e()) = group;
    __syncthreads();
    if (thread.g() != 0) {
        return;
    }
    float total = 0.0f;
    SPIO_UNROLL
    for (int g = 0; g < SumThread::G; ++g) {
        total += *sums.g(g).e(thread.e());
    }
    if (is_dw) {
        const auto value = round_to<DW::data_type>(total);
        if (channels_last) {
            *DWChannelsLast(dw).k8(w.k8()).k(w.k()).r(w.r()).s(w.s()).c(w.c()) = value;
        } else {
            *DW(dw).k8(w.k8()).k(w.k()).c(w.c()).r(w.r()).s(w.s()) = value;
        }
    } else if (is_dbias) {
        *DBias(dbias).k8(b.k8()).k(b.k()) = round_to<DBias::data_type>(total);
    }
}
