#ifndef SPIO_WARP_MMA_H_
#define SPIO_WARP_MMA_H_

/// Warp-wide tensor-core matrix multiply-accumulate: D = A * B + C with mma.sync.
///
/// Every lane of the warp must call these together (mma.sync.aligned), with converged control
/// flow. Fragment layouts are in spio/warp/fragments.h. d may be the same array as c.

#include "spio/macros.h"
#include "spio/warp/fragments.h"

namespace spio {

/// Computes D (16x8 f32) = A (16x8 f16, row major) * B (8x8 f16, column major) + C (16x8 f32).
///
/// Parameters:
///   d: the lane's 4 accumulator elements of the result (may be the same array as c).
///   a: the lane's 2 registers of A (4 halves).
///   b: the lane's register of B (2 halves).
///   c: the lane's 4 accumulator elements of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma_m16n8k8_f16(float (&d)[4], const unsigned (&a)[2], unsigned b,
                                 const float (&c)[4]) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    ::spio::emu::mma_m16n8k8_f16(d, a, b, c);
#endif
}

/// Computes D (16x8 f32) = A (16x8 bf16, row major) * B (8x8 bf16, column major) + C (16x8 f32).
///
/// The parameters are those of mma_m16n8k8_f16, with bfloat16 elements in a and b.
///
/// Parameters:
///   d: the lane's 4 accumulator elements of the result (may be the same array as c).
///   a: the lane's 2 registers of A (4 bfloat16 elements).
///   b: the lane's register of B (2 bfloat16 elements).
///   c: the lane's 4 accumulator elements of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma_m16n8k8_bf16(float (&d)[4], const unsigned (&a)[2], unsigned b,
                                  const float (&c)[4]) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    ::spio::emu::mma_m16n8k8_bf16(d, a, b, c);
#endif
}

/// Computes D (16x8 f32) = A (16x16 f16, row major) * B (16x8 f16, column major) + C (16x8 f32).
///
/// Parameters:
///   d: the lane's 4 accumulator elements of the result (may be the same array as c).
///   a: the lane's 4 registers of A (8 halves).
///   b: the lane's 2 registers of B (4 halves).
///   c: the lane's 4 accumulator elements of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                  const float (&c)[4]) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    ::spio::emu::mma_m16n8k16_f16(d, a, b, c);
#endif
}

/// Computes D (16x8 f32) = A (16x16 bf16, row major) * B (16x8 bf16, column major) + C (16x8 f32).
///
/// The parameters are those of mma_m16n8k16_f16, with bfloat16 elements in a and b.
///
/// Parameters:
///   d: the lane's 4 accumulator elements of the result (may be the same array as c).
///   a: the lane's 4 registers of A (8 bfloat16 elements).
///   b: the lane's 2 registers of B (4 bfloat16 elements).
///   c: the lane's 4 accumulator elements of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                   const float (&c)[4]) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    ::spio::emu::mma_m16n8k16_bf16(d, a, b, c);
#endif
}

/// Runs mma_m16n8k8_f16 or mma_m16n8k8_bf16, chosen by the operand element type.
///
/// Kernels written for both element types name theirs once instead of branching at every mma.
///
/// Parameters:
///   Element: the element type of a and b, __half or __nv_bfloat16.
///   d, a, b, c: those of mma_m16n8k8_f16, with elements of type Element in a and b.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
template <typename Element>
SPIO_DEVICE void mma_m16n8k8(float (&d)[4], const unsigned (&a)[2], unsigned b,
                             const float (&c)[4]);

template <>
SPIO_DEVICE void mma_m16n8k8<__half>(float (&d)[4], const unsigned (&a)[2], unsigned b,
                                     const float (&c)[4]) {
    mma_m16n8k8_f16(d, a, b, c);
}

template <>
SPIO_DEVICE void mma_m16n8k8<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[2], unsigned b,
                                            const float (&c)[4]) {
    mma_m16n8k8_bf16(d, a, b, c);
}

/// Runs mma_m16n8k16_f16 or mma_m16n8k16_bf16, chosen by the operand element type.
///
/// Parameters:
///   Element: the element type of a and b, __half or __nv_bfloat16.
///   d, a, b, c: those of mma_m16n8k16_f16, with elements of type Element in a and b.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
template <typename Element>
SPIO_DEVICE void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                              const float (&c)[4]);

template <>
SPIO_DEVICE void mma_m16n8k16<__half>(float (&d)[4], const unsigned (&a)[4],
                                      const unsigned (&b)[2], const float (&c)[4]) {
    mma_m16n8k16_f16(d, a, b, c);
}

template <>
SPIO_DEVICE void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2], const float (&c)[4]) {
    mma_m16n8k16_bf16(d, a, b, c);
}

/// Computes d = a * b + c on m16n8k8 f16 fragments, with mma_m16n8k8_f16.
///
/// Parameters:
///   d: the accumulator fragment of the result (may be c).
///   a: the A operand fragment.
///   b: the B operand fragment.
///   c: the accumulator fragment of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma(FragC_m16n8_f32 &d, const FragA_m16n8k8_f16 &a, const FragB_m16n8k8_f16 &b,
                     const FragC_m16n8_f32 &c) {
    mma_m16n8k8_f16(d.reg, a.reg, b.reg[0], c.reg);
}

/// Computes d = a * b + c on m16n8k8 bf16 fragments, with mma_m16n8k8_bf16.
///
/// Parameters:
///   d: the accumulator fragment of the result (may be c).
///   a: the A operand fragment.
///   b: the B operand fragment.
///   c: the accumulator fragment of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma(FragC_m16n8_f32 &d, const FragA_m16n8k8_bf16 &a,
                     const FragB_m16n8k8_bf16 &b, const FragC_m16n8_f32 &c) {
    mma_m16n8k8_bf16(d.reg, a.reg, b.reg[0], c.reg);
}

/// Computes d = a * b + c on m16n8k16 f16 fragments, with mma_m16n8k16_f16.
///
/// Parameters:
///   d: the accumulator fragment of the result (may be c).
///   a: the A operand fragment.
///   b: the B operand fragment.
///   c: the accumulator fragment of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma(FragC_m16n8_f32 &d, const FragA_m16n8k16_f16 &a,
                     const FragB_m16n8k16_f16 &b, const FragC_m16n8_f32 &c) {
    mma_m16n8k16_f16(d.reg, a.reg, b.reg, c.reg);
}

/// Computes d = a * b + c on m16n8k16 bf16 fragments, with mma_m16n8k16_bf16.
///
/// Parameters:
///   d: the accumulator fragment of the result (may be c).
///   a: the A operand fragment.
///   b: the B operand fragment.
///   c: the accumulator fragment of the addend.
/// Assumes:
///   every lane of the warp calls it together, with converged control flow.
SPIO_DEVICE void mma(FragC_m16n8_f32 &d, const FragA_m16n8k16_bf16 &a,
                     const FragB_m16n8k16_bf16 &b, const FragC_m16n8_f32 &c) {
    mma_m16n8k16_bf16(d.reg, a.reg, b.reg, c.reg);
}

}  // namespace spio

#endif  // SPIO_WARP_MMA_H_
