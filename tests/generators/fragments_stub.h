/// Host-only stand-in for spio/warp/fragments.h: the fragment types' layout functions as the
/// contract in docs/primitives.md states them (PTX ISA mma m16n8k8 / m16n8k16, g = lane >> 2,
/// t = lane % 4), so generator tests can run without the real header or a GPU.
#ifndef SPIO_TESTS_FRAGMENTS_STUB_H_
#define SPIO_TESTS_FRAGMENTS_STUB_H_

namespace spio {

/// 16x8 A operand of m16n8k8: a0,a1 row g, a2,a3 row g+8, columns 2t, 2t+1.
struct FragA_m16n8k8 {
    static constexpr int num_regs = 2;
    static constexpr int num_elements = 4;
    unsigned reg[num_regs];
    static constexpr int row(int lane, int idx) { return (lane >> 2) + 8 * (idx >> 1); }
    static constexpr int col(int lane, int idx) { return 2 * (lane % 4) + (idx & 1); }
};

/// 8x8 B operand of m16n8k8: b0,b1 rows 2t, 2t+1, column g.
struct FragB_m16n8k8 {
    static constexpr int num_regs = 1;
    static constexpr int num_elements = 2;
    unsigned reg[num_regs];
    static constexpr int row(int lane, int idx) { return 2 * (lane % 4) + idx; }
    static constexpr int col(int lane, int /*idx*/) { return lane >> 2; }
};

/// 16x16 A operand of m16n8k16: pairs (row g | g+8) x (cols 2t | 2t+8).
struct FragA_m16n8k16 {
    static constexpr int num_regs = 4;
    static constexpr int num_elements = 8;
    unsigned reg[num_regs];
    static constexpr int row(int lane, int idx) { return (lane >> 2) + 8 * ((idx >> 1) & 1); }
    static constexpr int col(int lane, int idx) {
        return 2 * (lane % 4) + (idx & 1) + 8 * (idx >> 2);
    }
};

/// 16x8 B operand of m16n8k16: b0,b1 rows 2t, 2t+1, b2,b3 rows 2t+8, 2t+9, column g.
struct FragB_m16n8k16 {
    static constexpr int num_regs = 2;
    static constexpr int num_elements = 4;
    unsigned reg[num_regs];
    static constexpr int row(int lane, int idx) { return 2 * (lane % 4) + (idx & 1) + 8 * (idx >> 1); }
    static constexpr int col(int lane, int /*idx*/) { return lane >> 2; }
};

/// 16x8 f32 accumulator: c0,c1 row g, c2,c3 row g+8, columns 2t, 2t+1.
struct FragC_m16n8_f32 {
    static constexpr int num_regs = 4;
    static constexpr int num_elements = 4;
    float reg[num_regs];
    static constexpr int row(int lane, int idx) { return (lane >> 2) + 8 * (idx >> 1); }
    static constexpr int col(int lane, int idx) { return 2 * (lane % 4) + (idx & 1); }
};

struct FragA_m16n8k8_f16 : FragA_m16n8k8 {};
struct FragA_m16n8k8_bf16 : FragA_m16n8k8 {};
struct FragB_m16n8k8_f16 : FragB_m16n8k8 {};
struct FragB_m16n8k8_bf16 : FragB_m16n8k8 {};
struct FragA_m16n8k16_f16 : FragA_m16n8k16 {};
struct FragA_m16n8k16_bf16 : FragA_m16n8k16 {};
struct FragB_m16n8k16_f16 : FragB_m16n8k16 {};
struct FragB_m16n8k16_bf16 : FragB_m16n8k16 {};

}  // namespace spio

#endif  // SPIO_TESTS_FRAGMENTS_STUB_H_
