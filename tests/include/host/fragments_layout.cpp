/// Host test: the fragment row/col tables of spio/warp/fragments.h against the PTX ISA.
///
/// The reference functions below transcribe the PTX ISA's "Matrix Fragments for mma.m16n8k8" and
/// "... for mma.m16n8k16 with floating point type" (.f16/.bf16 A and B, .f32 C/D) in the ISA's
/// own case-by-case form. Further checks: each fragment covers its matrix exactly once across the
/// warp, and ldmatrix's documented per-lane result composes into the operand fragments.
/// Compiled with a plain host compiler (no emulator): fragments.h needs only cuda_fp16/bf16.

#include "spio/warp/fragments.h"

#include <cstring>

#include "check.h"

namespace {

int group_id(int lane) { return lane >> 2; }
int thread_id_in_group(int lane) { return lane % 4; }

// m16n8k8 .f16/.bf16 A: row = groupID for a0 and a1, groupID + 8 for a2 and a3;
// col = threadID_in_group * 2 + (i & 0x1).
int isa_a_k8_row(int lane, int i) { return (i == 0 || i == 1) ? group_id(lane) : group_id(lane) + 8; }
int isa_a_k8_col(int lane, int i) { return thread_id_in_group(lane) * 2 + (i & 0x1); }

// m16n8k8 .f16/.bf16 B: row = threadID_in_group * 2 + i for b0, b1; col = groupID.
int isa_b_k8_row(int lane, int i) { return thread_id_in_group(lane) * 2 + i; }
int isa_b_k8_col(int lane, int) { return group_id(lane); }

// C/D .f32: row = groupID for c0 and c1, groupID + 8 for c2 and c3;
// col = threadID_in_group * 2 + (i & 0x1).
int isa_c_row(int lane, int i) { return (i < 2) ? group_id(lane) : group_id(lane) + 8; }
int isa_c_col(int lane, int i) { return thread_id_in_group(lane) * 2 + (i & 0x1); }

// m16n8k16 .f16/.bf16 A: row = groupID for 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise;
// col = threadID_in_group * 2 + (i & 0x1) for i < 4, plus 8 for i >= 4.
int isa_a_k16_row(int lane, int i) {
    return ((0 <= i && i < 2) || (4 <= i && i < 6)) ? group_id(lane) : group_id(lane) + 8;
}
int isa_a_k16_col(int lane, int i) {
    return i < 4 ? thread_id_in_group(lane) * 2 + (i & 0x1)
                 : thread_id_in_group(lane) * 2 + (i & 0x1) + 8;
}

// m16n8k16 .f16/.bf16 B: row = threadID_in_group * 2 + (i & 0x1) for i < 2, plus 8 for i >= 2;
// col = groupID.
int isa_b_k16_row(int lane, int i) {
    return i < 2 ? thread_id_in_group(lane) * 2 + (i & 0x1)
                 : thread_id_in_group(lane) * 2 + (i & 0x1) + 8;
}
int isa_b_k16_col(int lane, int) { return group_id(lane); }

/// Checks Frag's row/col against the ISA functions and that the warp covers the matrix once.
template <typename Frag>
void check_layout(const char *name, int (*isa_row)(int, int), int (*isa_col)(int, int)) {
    int hits[16][16];
    std::memset(hits, 0, sizeof(hits));
    for (int lane = 0; lane < 32; ++lane) {
        for (int idx = 0; idx < Frag::num_elements; ++idx) {
            const int r = Frag::row(lane, idx);
            const int c = Frag::col(lane, idx);
            CHECK(r == isa_row(lane, idx), "%s row(%d, %d) = %d, ISA says %d", name, lane, idx, r,
                  isa_row(lane, idx));
            CHECK(c == isa_col(lane, idx), "%s col(%d, %d) = %d, ISA says %d", name, lane, idx, c,
                  isa_col(lane, idx));
            CHECK(0 <= r && r < Frag::rows && 0 <= c && c < Frag::cols,
                  "%s (%d, %d) outside %dx%d", name, r, c, Frag::rows, Frag::cols);
            if (0 <= r && r < 16 && 0 <= c && c < 16) {
                ++hits[r][c];
            }
        }
    }
    for (int r = 0; r < Frag::rows; ++r) {
        for (int c = 0; c < Frag::cols; ++c) {
            CHECK(hits[r][c] == 1, "%s element (%d, %d) held %d times", name, r, c, hits[r][c]);
        }
    }
    CHECK(32 * Frag::num_elements == Frag::rows * Frag::cols, "%s element count", name);
}

/// Position (row, col) that ldmatrix gives lane `lane` for element `half` (0 low, 1 high) of an
/// 8x8 matrix: row lane >> 2, column 2 (lane % 4) + half; with .trans the transpose.
void ldmatrix_position(bool trans, int lane, int half, int &row, int &col) {
    const int r = lane >> 2;
    const int c = 2 * (lane % 4) + half;
    row = trans ? c : r;
    col = trans ? r : c;
}

/// The canonical loads of each operand through ldmatrix reproduce the fragment layouts.
///
/// A (row-major in shared memory) is loaded without .trans: register j of the x2/x4 load takes
/// the 8x8 block at (row block j % 2, column block j / 2). B is stored k-major (row k holds
/// B(k, 0..7)) and loaded with .trans: register j takes rows 8j..8j+7 of B.
void check_ldmatrix_composition() {
    for (int lane = 0; lane < 32; ++lane) {
        for (int reg = 0; reg < 4; ++reg) {
            for (int half = 0; half < 2; ++half) {
                const int idx = 2 * reg + half;
                int r, c;
                ldmatrix_position(false, lane, half, r, c);
                const int a_row = r + 8 * (reg % 2);
                const int a_col = c + 8 * (reg / 2);
                CHECK(spio::FragA_m16n8k16_f16::row(lane, idx) == a_row &&
                          spio::FragA_m16n8k16_f16::col(lane, idx) == a_col,
                      "ldmatrix_x4 does not produce FragA_m16n8k16 at lane %d idx %d", lane, idx);
                if (reg < 2) {
                    CHECK(spio::FragA_m16n8k8_f16::row(lane, idx) == a_row &&
                              spio::FragA_m16n8k8_f16::col(lane, idx) == a_col,
                          "ldmatrix_x2 does not produce FragA_m16n8k8 at lane %d idx %d", lane,
                          idx);
                }
                ldmatrix_position(true, lane, half, r, c);
                if (reg < 2) {
                    CHECK(spio::FragB_m16n8k16_bf16::row(lane, idx) == r + 8 * reg &&
                              spio::FragB_m16n8k16_bf16::col(lane, idx) == c,
                          "ldmatrix_x2_trans does not produce FragB_m16n8k16 at lane %d idx %d",
                          lane, idx);
                }
                if (reg == 0) {
                    CHECK(spio::FragB_m16n8k8_f16::row(lane, idx) == r &&
                              spio::FragB_m16n8k8_f16::col(lane, idx) == c,
                          "ldmatrix_x1_trans does not produce FragB_m16n8k8 at lane %d idx %d",
                          lane, idx);
                    // B^T stored n-major and loaded without .trans gives the same fragment.
                    int rn, cn;
                    ldmatrix_position(false, lane, half, rn, cn);
                    CHECK(spio::FragB_m16n8k8_f16::row(lane, idx) == cn &&
                              spio::FragB_m16n8k8_f16::col(lane, idx) == rn,
                          "ldmatrix_x1 of B^T does not produce FragB_m16n8k8 at lane %d idx %d",
                          lane, idx);
                }
            }
        }
    }
}

// The tables are constexpr: usable in constant expressions on the host.
static_assert(spio::FragA_m16n8k8_f16::row(5, 2) == 9, "A row of lane 5, a2");
static_assert(spio::FragA_m16n8k16_bf16::col(7, 5) == 15, "A col of lane 7, a5");
static_assert(spio::FragB_m16n8k16_f16::row(3, 3) == 15, "B row of lane 3, b3");
static_assert(spio::FragC_m16n8_f32::row(31, 3) == 15, "C row of lane 31, c3");
static_assert(spio::FragA_m16n8k8_f16::num_regs == 2 && spio::FragB_m16n8k8_f16::num_regs == 1,
              "m16n8k8 register counts");
static_assert(spio::FragA_m16n8k16_f16::num_regs == 4 &&
                  spio::FragB_m16n8k16_bf16::num_regs == 2 && spio::FragC_m16n8_f32::num_regs == 4,
              "m16n8k16 register counts");
static_assert(sizeof(spio::FragA_m16n8k16_f16) == 16 && sizeof(spio::FragB_m16n8k8_bf16) == 4 &&
                  sizeof(spio::FragC_m16n8_f32) == 16,
              "fragments are exactly their registers");

void check_register_packing() {
    spio::FragA_m16n8k8_f16 a;
    a.set_reg(1, __float2half(1.0f), __float2half(-2.0f));
    CHECK(a.reg[1] == 0xC0003C00u, "set_reg(lo=1, hi=-2) gave %08x", a.reg[1]);
    CHECK(__half2float(a.get(2)) == 1.0f && __half2float(a.get(3)) == -2.0f,
          "get(2), get(3) after set_reg(1, ...)");
    const __half2 pair = a.get_reg(1);
    CHECK(__half2float(pair.x) == 1.0f && __half2float(pair.y) == -2.0f, "get_reg(1)");
    a.set_reg(0, __floats2half2_rn(0.5f, 4.0f));
    CHECK(a.reg[0] == 0x44003800u, "set_reg(pair 0.5, 4) gave %08x", a.reg[0]);

    spio::FragB_m16n8k16_bf16 b;
    b.fill(__float2bfloat16(1.0f));
    CHECK(b.reg[0] == 0x3F803F80u && b.reg[1] == 0x3F803F80u, "bf16 fill(1) gave %08x %08x",
          b.reg[0], b.reg[1]);
    b.set_reg(1, __float2bfloat16(2.0f), __float2bfloat16(-1.0f));
    CHECK(b.reg[1] == 0xBF804000u, "bf16 set_reg(lo=2, hi=-1) gave %08x", b.reg[1]);
    CHECK(__bfloat162float(b.get(3)) == -1.0f, "bf16 get(3)");

    spio::FragC_m16n8_f32 c;
    c.fill(7.0f);
    CHECK(c.reg[0] == 7.0f && c.reg[3] == 7.0f, "accumulator fill");
    c.zero();
    CHECK(c.reg[0] == 0.0f && c.reg[3] == 0.0f, "accumulator zero");
    c.reg[0] = 1.0f;
    c.reg[1] = 2.0f;
    c.reg[2] = 3.0f;
    c.reg[3] = 65504.0f * 4;  // out of fp16 range: rounds to +inf
    const __half2 h = c.to_half2(1);
    CHECK(__half2float(h.x) == 3.0f && __half2float(h.y) > 65504.0f, "to_half2(1) of 3, big");
    const __nv_bfloat162 bf = c.to_bfloat162(0);
    CHECK(__bfloat162float(bf.x) == 1.0f && __bfloat162float(bf.y) == 2.0f, "to_bfloat162(0)");
}

}  // namespace

int main() {
    check_layout<spio::FragA_m16n8k8_f16>("FragA_m16n8k8_f16", isa_a_k8_row, isa_a_k8_col);
    check_layout<spio::FragA_m16n8k8_bf16>("FragA_m16n8k8_bf16", isa_a_k8_row, isa_a_k8_col);
    check_layout<spio::FragB_m16n8k8_f16>("FragB_m16n8k8_f16", isa_b_k8_row, isa_b_k8_col);
    check_layout<spio::FragB_m16n8k8_bf16>("FragB_m16n8k8_bf16", isa_b_k8_row, isa_b_k8_col);
    check_layout<spio::FragA_m16n8k16_f16>("FragA_m16n8k16_f16", isa_a_k16_row, isa_a_k16_col);
    check_layout<spio::FragA_m16n8k16_bf16>("FragA_m16n8k16_bf16", isa_a_k16_row, isa_a_k16_col);
    check_layout<spio::FragB_m16n8k16_f16>("FragB_m16n8k16_f16", isa_b_k16_row, isa_b_k16_col);
    check_layout<spio::FragB_m16n8k16_bf16>("FragB_m16n8k16_bf16", isa_b_k16_row, isa_b_k16_col);
    check_layout<spio::FragC_m16n8_f32>("FragC_m16n8_f32", isa_c_row, isa_c_col);
    check_ldmatrix_composition();
    check_register_packing();
    std::printf("%d failures\n", check_failures());
    return check_failures() == 0 ? 0 : 1;
}
