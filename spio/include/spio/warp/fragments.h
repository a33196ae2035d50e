#ifndef SPIO_WARP_FRAGMENTS_H_
#define SPIO_WARP_FRAGMENTS_H_

/// Register fragments of the warp-wide mma.sync operands and accumulators.
///
/// A fragment is the part of a matrix that one lane holds. Its row(lane, idx) and col(lane, idx)
/// give the matrix coordinates of the lane's element idx, following the PTX ISA's "Matrix
/// Fragments for mma.m16n8k8 / mma.m16n8k16" (g = lane >> 2, t = lane % 4):
/// - A of m16n8k8 (16x8, row major): idx 0,1 at row g, idx 2,3 at row g + 8; column 2t + (idx & 1).
/// - B of m16n8k8 (8x8, column major): idx 0,1 at rows 2t, 2t + 1; column g.
/// - A of m16n8k16 (16x16): idx 0,1 row g; 2,3 row g + 8; 4,5 row g; 6,7 row g + 8;
///   column 2t + (idx & 1), plus 8 for idx >= 4.
/// - B of m16n8k16 (16x8): idx 0,1 at rows 2t, 2t + 1; idx 2,3 at rows 2t + 8, 2t + 9; column g.
/// - C/D of both shapes (16x8 f32): idx 0,1 row g, idx 2,3 row g + 8; column 2t + (idx & 1).
/// Operand registers hold two 16-bit elements: element 2i in the low half of reg[i], 2i + 1 in
/// the high half.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "spio/macros.h"

namespace spio {

namespace detail {

/// Bits of a half, as an unsigned 16-bit value in a 32-bit integer.
SPIO_HOST_DEVICE unsigned bits_of(__half value) {
    return static_cast<__half_raw>(value).x;
}

/// Bits of a bfloat16, as an unsigned 16-bit value in a 32-bit integer.
SPIO_HOST_DEVICE unsigned bits_of(__nv_bfloat16 value) {
    return static_cast<__nv_bfloat16_raw>(value).x;
}

/// The element of type Element whose bits are the low 16 bits of `bits`.
template <typename Element>
SPIO_HOST_DEVICE Element from_bits(unsigned bits);

template <>
SPIO_HOST_DEVICE __half from_bits<__half>(unsigned bits) {
    __half_raw raw;
    raw.x = static_cast<unsigned short>(bits & 0xffffu);
    return __half(raw);
}

template <>
SPIO_HOST_DEVICE __nv_bfloat16 from_bits<__nv_bfloat16>(unsigned bits) {
    __nv_bfloat16_raw raw;
    raw.x = static_cast<unsigned short>(bits & 0xffffu);
    return __nv_bfloat16(raw);
}

/// The pair type (two elements in one 32-bit register) of a 16-bit element type.
template <typename Element>
struct PairOf;

template <>
struct PairOf<__half> {
    using type = __half2;
};

template <>
struct PairOf<__nv_bfloat16> {
    using type = __nv_bfloat162;
};

/// Row and column of each element of the m16n8k8 A operand (16x8, row major).
struct LayoutA_m16n8k8 {
    enum : int { rows = 16, cols = 8, num_elements = 4 };
    SPIO_HOST_DEVICE static constexpr int row(int lane, int idx) {
        return (lane >> 2) + ((idx >> 1) & 1) * 8;
    }
    SPIO_HOST_DEVICE static constexpr int col(int lane, int idx) {
        return (lane & 3) * 2 + (idx & 1);
    }
};

/// Row and column of each element of the m16n8k8 B operand (8x8, column major).
struct LayoutB_m16n8k8 {
    enum : int { rows = 8, cols = 8, num_elements = 2 };
    SPIO_HOST_DEVICE static constexpr int row(int lane, int idx) {
        return (lane & 3) * 2 + (idx & 1);
    }
    SPIO_HOST_DEVICE static constexpr int col(int lane, int /*idx*/) { return lane >> 2; }
};

/// Row and column of each element of the m16n8k16 A operand (16x16, row major).
struct LayoutA_m16n8k16 {
    enum : int { rows = 16, cols = 16, num_elements = 8 };
    SPIO_HOST_DEVICE static constexpr int row(int lane, int idx) {
        return (lane >> 2) + ((idx >> 1) & 1) * 8;
    }
    SPIO_HOST_DEVICE static constexpr int col(int lane, int idx) {
        return (lane & 3) * 2 + (idx & 1) + ((idx >> 2) & 1) * 8;
    }
};

/// Row and column of each element of the m16n8k16 B operand (16x8, column major).
struct LayoutB_m16n8k16 {
    enum : int { rows = 16, cols = 8, num_elements = 4 };
    SPIO_HOST_DEVICE static constexpr int row(int lane, int idx) {
        return (lane & 3) * 2 + (idx & 1) + ((idx >> 1) & 1) * 8;
    }
    SPIO_HOST_DEVICE static constexpr int col(int lane, int /*idx*/) { return lane >> 2; }
};

/// Row and column of each element of the 16x8 f32 accumulator (C and D of both shapes).
struct LayoutC_m16n8 {
    enum : int { rows = 16, cols = 8, num_elements = 4 };
    SPIO_HOST_DEVICE static constexpr int row(int lane, int idx) {
        return (lane >> 2) + ((idx >> 1) & 1) * 8;
    }
    SPIO_HOST_DEVICE static constexpr int col(int lane, int idx) {
        return (lane & 3) * 2 + (idx & 1);
    }
};

/// An mma operand fragment: num_regs 32-bit registers, each holding two 16-bit elements.
///
/// Parameters:
///   Layout: one of the Layout* structs above (row/col of each element).
///   ElementType: __half or __nv_bfloat16.
template <typename Layout, typename ElementType>
struct OperandFragment {
    using element_type = ElementType;
    using pair_type = typename PairOf<ElementType>::type;
    static constexpr int rows = Layout::rows;
    static constexpr int cols = Layout::cols;
    static constexpr int num_elements = Layout::num_elements;
    static constexpr int num_regs = num_elements / 2;

    unsigned reg[num_regs];

    /// Row of the lane's element idx in the operand matrix.
    SPIO_HOST_DEVICE static constexpr int row(int lane, int idx) { return Layout::row(lane, idx); }

    /// Column of the lane's element idx in the operand matrix.
    SPIO_HOST_DEVICE static constexpr int col(int lane, int idx) { return Layout::col(lane, idx); }

    /// Sets every element of the fragment to `value`.
    ///
    /// Parameters:
    ///   value: the element stored in every position.
    SPIO_HOST_DEVICE void fill(element_type value) {
        const unsigned bits = bits_of(value);
        for (int i = 0; i < num_regs; ++i) {
            reg[i] = bits | (bits << 16);
        }
    }

    /// Sets register i from two elements.
    ///
    /// Parameters:
    ///   i: the register, 0 <= i < num_regs.
    ///   lo: becomes element 2i (the low half of reg[i]).
    ///   hi: becomes element 2i + 1 (the high half).
    SPIO_HOST_DEVICE void set_reg(int i, element_type lo, element_type hi) {
        reg[i] = bits_of(lo) | (bits_of(hi) << 16);
    }

    /// Sets register i from a pair.
    ///
    /// Parameters:
    ///   i: the register, 0 <= i < num_regs.
    ///   pair: pair.x becomes element 2i, pair.y element 2i + 1.
    SPIO_HOST_DEVICE void set_reg(int i, pair_type pair) { set_reg(i, pair.x, pair.y); }

    /// Returns register i as a pair.
    ///
    /// Parameters:
    ///   i: the register, 0 <= i < num_regs.
    /// Returns:
    ///   the pair: .x is element 2i, .y element 2i + 1.
    SPIO_HOST_DEVICE pair_type get_reg(int i) const {
        pair_type pair;
        pair.x = from_bits<element_type>(reg[i]);
        pair.y = from_bits<element_type>(reg[i] >> 16);
        return pair;
    }

    /// Returns element idx of the lane's fragment.
    ///
    /// Parameters:
    ///   idx: the element, 0 <= idx < num_elements.
    /// Returns:
    ///   element idx (the low half of reg[idx / 2] for even idx, the high half for odd).
    SPIO_HOST_DEVICE element_type get(int idx) const {
        return from_bits<element_type>(reg[idx >> 1] >> ((idx & 1) * 16));
    }
};

}  // namespace detail

/// Packs two floats, rounded to nearest, in a pair of Element.
///
/// Parameters:
///   Element: __half or __nv_bfloat16.
///   lo: the value of .x.
///   hi: the value of .y.
/// Returns:
///   the pair (__half2 or __nv_bfloat162): .x = lo, .y = hi, each rounded to nearest.
template <typename Element>
SPIO_HOST_DEVICE typename detail::PairOf<Element>::type pack_pair(float lo, float hi);

template <>
SPIO_HOST_DEVICE __half2 pack_pair<__half>(float lo, float hi) {
    return __floats2half2_rn(lo, hi);
}

template <>
SPIO_HOST_DEVICE __nv_bfloat162 pack_pair<__nv_bfloat16>(float lo, float hi) {
    return __floats2bfloat162_rn(lo, hi);
}

/// Converts a pair of fp16, bf16 or fp32 values to two floats, exactly.
///
/// Parameters:
///   pair: a __half2, __nv_bfloat162 or float2 (one overload each).
/// Returns:
///   the two values as floats (.x, .y), exactly.
SPIO_HOST_DEVICE float2 unpack_pair(__half2 pair) { return __half22float2(pair); }
SPIO_HOST_DEVICE float2 unpack_pair(__nv_bfloat162 pair) { return __bfloat1622float2(pair); }
SPIO_HOST_DEVICE float2 unpack_pair(float2 pair) { return pair; }

/// m16n8k8 A operand, f16: 16x8 row-major, 2 registers (4 elements) per lane.
using FragA_m16n8k8_f16 = detail::OperandFragment<detail::LayoutA_m16n8k8, __half>;
/// m16n8k8 A operand, bf16.
using FragA_m16n8k8_bf16 = detail::OperandFragment<detail::LayoutA_m16n8k8, __nv_bfloat16>;
/// m16n8k8 B operand, f16: 8x8 column-major, 1 register (2 elements) per lane.
using FragB_m16n8k8_f16 = detail::OperandFragment<detail::LayoutB_m16n8k8, __half>;
/// m16n8k8 B operand, bf16.
using FragB_m16n8k8_bf16 = detail::OperandFragment<detail::LayoutB_m16n8k8, __nv_bfloat16>;
/// m16n8k16 A operand, f16: 16x16 row-major, 4 registers (8 elements) per lane.
using FragA_m16n8k16_f16 = detail::OperandFragment<detail::LayoutA_m16n8k16, __half>;
/// m16n8k16 A operand, bf16.
using FragA_m16n8k16_bf16 = detail::OperandFragment<detail::LayoutA_m16n8k16, __nv_bfloat16>;
/// m16n8k16 B operand, f16: 16x8 column-major, 2 registers (4 elements) per lane.
using FragB_m16n8k16_f16 = detail::OperandFragment<detail::LayoutB_m16n8k16, __half>;
/// m16n8k16 B operand, bf16.
using FragB_m16n8k16_bf16 = detail::OperandFragment<detail::LayoutB_m16n8k16, __nv_bfloat16>;

/// The 16x8 f32 accumulator (C and D) of m16n8k8 and m16n8k16: 4 floats per lane.
struct FragC_m16n8_f32 {
    static constexpr int rows = 16;
    static constexpr int cols = 8;
    static constexpr int num_elements = 4;
    static constexpr int num_regs = 4;

    float reg[num_regs];

    /// Row of the lane's element idx in the accumulator matrix.
    SPIO_HOST_DEVICE static constexpr int row(int lane, int idx) {
        return detail::LayoutC_m16n8::row(lane, idx);
    }

    /// Column of the lane's element idx in the accumulator matrix.
    SPIO_HOST_DEVICE static constexpr int col(int lane, int idx) {
        return detail::LayoutC_m16n8::col(lane, idx);
    }

    /// Sets every element to `value`.
    ///
    /// Parameters:
    ///   value: the value stored in every element.
    SPIO_HOST_DEVICE void fill(float value) {
        for (int i = 0; i < num_regs; ++i) {
            reg[i] = value;
        }
    }

    /// Sets every element to 0 (before the first mma).
    SPIO_HOST_DEVICE void zero() { fill(0.0f); }

    /// Returns elements 2i and 2i + 1 (row row(lane, 2i), columns 2t and 2t + 1) as a __half2.
    ///
    /// Parameters:
    ///   i: pair index, 0 (row g) or 1 (row g + 8).
    /// Returns:
    ///   .x = element 2i, .y = element 2i + 1, rounded to nearest even.
    SPIO_HOST_DEVICE __half2 to_half2(int i) const {
        return __floats2half2_rn(reg[2 * i], reg[2 * i + 1]);
    }

    /// Returns elements 2i and 2i + 1 rounded to a __nv_bfloat162, as to_half2.
    ///
    /// Parameters:
    ///   i: pair index, 0 (row g) or 1 (row g + 8).
    /// Returns:
    ///   .x = element 2i, .y = element 2i + 1, rounded to nearest even.
    SPIO_HOST_DEVICE __nv_bfloat162 to_bfloat162(int i) const {
        return __floats2bfloat162_rn(reg[2 * i], reg[2 * i + 1]);
    }
};

}  // namespace spio

#endif  // SPIO_WARP_FRAGMENTS_H_
