#ifndef SPIO_TESTS_EMU_PRELUDE_H_
#define SPIO_TESTS_EMU_PRELUDE_H_

/// What the CPU emulator provides before spio headers are included, reduced to declarations.
///
/// Lets host tests compile the headers' emulator branches: CUDA's fp16/bf16 headers first, then
/// SPIO_EMULATOR, the CUDA keywords, and spio::emu declarations with the signatures of
/// docs/primitives.md. A test that calls a primitive must also define the emu function.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// CUDA's host_defines.h may have given these host meanings already: replace them.
#undef __device__
#undef __forceinline__
#undef __global__
#undef __shared__
#define SPIO_EMULATOR 1
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__

namespace spio {
namespace emu {

void mma_m16n8k8_f16(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]);
void mma_m16n8k8_bf16(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]);
void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                      const float (&c)[4]);
void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                       const float (&c)[4]);
void ldmatrix_x1(unsigned (&d)[1], const void *row_ptr);
void ldmatrix_x2(unsigned (&d)[2], const void *row_ptr);
void ldmatrix_x4(unsigned (&d)[4], const void *row_ptr);
void ldmatrix_x1_trans(unsigned (&d)[1], const void *row_ptr);
void ldmatrix_x2_trans(unsigned (&d)[2], const void *row_ptr);
void ldmatrix_x4_trans(unsigned (&d)[4], const void *row_ptr);
void cp_async_16(void *smem_dst, const void *gmem_src, int src_bytes);
void cp_async_commit_group();
template <int N>
void cp_async_wait_group();
void cp_async_wait_all();

}  // namespace emu
}  // namespace spio

#endif  // SPIO_TESTS_EMU_PRELUDE_H_
