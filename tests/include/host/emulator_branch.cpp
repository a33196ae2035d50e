/// Host test: under SPIO_EMULATOR the mma, ldmatrix and cp.async primitives forward to
/// ::spio::emu::<same name>(<same args>) (bulk_copy.h's are run in tests/emulator instead).
///
/// emu_prelude.h declares the emulator's functions with the signatures of docs/primitives.md; this
/// file defines them as recorders, calls each spio:: primitive (and each spio::mma overload) and
/// checks that the matching emu function saw the very same arrays, pointers and values.

#include "emu_prelude.h"

#include <cstring>

#include "check.h"
#include "spio/spio.h"

namespace {

struct Call {
    const char *name = "";
    const void *d = nullptr;
    const void *a = nullptr;
    const void *b = nullptr;
    const void *c = nullptr;
    unsigned b_value = 0;
    int n = -1;
    int count = 0;
};

Call last;

void record(const char *name, const void *d, const void *a, const void *b, const void *c) {
    last.name = name;
    last.d = d;
    last.a = a;
    last.b = b;
    last.c = c;
    ++last.count;
}

bool called(const char *name) { return std::strcmp(last.name, name) == 0; }

}  // namespace

namespace spio {
namespace emu {

void mma_m16n8k8_f16(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
    record("mma_m16n8k8_f16", d, a, nullptr, c);
    last.b_value = b;
}
void mma_m16n8k8_bf16(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
    record("mma_m16n8k8_bf16", d, a, nullptr, c);
    last.b_value = b;
}
void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                      const float (&c)[4]) {
    record("mma_m16n8k16_f16", d, a, b, c);
}
void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                       const float (&c)[4]) {
    record("mma_m16n8k16_bf16", d, a, b, c);
}
void ldmatrix_x1(unsigned (&d)[1], const void *p) { record("ldmatrix_x1", d, p, nullptr, nullptr); }
void ldmatrix_x2(unsigned (&d)[2], const void *p) { record("ldmatrix_x2", d, p, nullptr, nullptr); }
void ldmatrix_x4(unsigned (&d)[4], const void *p) { record("ldmatrix_x4", d, p, nullptr, nullptr); }
void ldmatrix_x1_trans(unsigned (&d)[1], const void *p) {
    record("ldmatrix_x1_trans", d, p, nullptr, nullptr);
}
void ldmatrix_x2_trans(unsigned (&d)[2], const void *p) {
    record("ldmatrix_x2_trans", d, p, nullptr, nullptr);
}
void ldmatrix_x4_trans(unsigned (&d)[4], const void *p) {
    record("ldmatrix_x4_trans", d, p, nullptr, nullptr);
}
void cp_async_16(void *dst, const void *src, int src_bytes) {
    record("cp_async_16", dst, src, nullptr, nullptr);
    last.n = src_bytes;
}
void cp_async_commit_group() { record("cp_async_commit_group", nullptr, nullptr, nullptr, nullptr); }
template <int N>
void cp_async_wait_group() {
    record("cp_async_wait_group", nullptr, nullptr, nullptr, nullptr);
    last.n = N;
}
void cp_async_wait_all() { record("cp_async_wait_all", nullptr, nullptr, nullptr, nullptr); }

}  // namespace emu
}  // namespace spio

int main() {
    float d[4], c[4] = {0, 0, 0, 0};
    unsigned a2[2] = {1, 2}, a4[4] = {1, 2, 3, 4}, b2[2] = {5, 6};

    spio::mma_m16n8k8_f16(d, a2, 0x1234u, c);
    CHECK(called("mma_m16n8k8_f16") && last.d == d && last.a == a2 && last.c == c &&
              last.b_value == 0x1234u,
          "mma_m16n8k8_f16 forwarding");
    spio::mma_m16n8k8_bf16(d, a2, 0x4321u, c);
    CHECK(called("mma_m16n8k8_bf16") && last.d == d && last.a == a2 && last.c == c &&
              last.b_value == 0x4321u,
          "mma_m16n8k8_bf16 forwarding");
    spio::mma_m16n8k16_f16(d, a4, b2, c);
    CHECK(called("mma_m16n8k16_f16") && last.d == d && last.a == a4 && last.b == b2 && last.c == c,
          "mma_m16n8k16_f16 forwarding");
    spio::mma_m16n8k16_bf16(d, a4, b2, c);
    CHECK(called("mma_m16n8k16_bf16") && last.d == d && last.a == a4 && last.b == b2 &&
              last.c == c,
          "mma_m16n8k16_bf16 forwarding");

    // The fragment overloads pick the instruction by shape and element type.
    spio::FragC_m16n8_f32 acc;
    acc.zero();
    spio::FragA_m16n8k8_f16 a8h;
    spio::FragB_m16n8k8_f16 b8h;
    b8h.reg[0] = 0xabcdu;
    spio::mma(acc, a8h, b8h, acc);
    CHECK(called("mma_m16n8k8_f16") && last.d == acc.reg && last.c == acc.reg &&
              last.a == a8h.reg && last.b_value == 0xabcdu,
          "mma(FragA_m16n8k8_f16) forwarding");
    spio::FragA_m16n8k8_bf16 a8b;
    spio::FragB_m16n8k8_bf16 b8b;
    b8b.reg[0] = 0xdcbau;
    spio::mma(acc, a8b, b8b, acc);
    CHECK(called("mma_m16n8k8_bf16") && last.a == a8b.reg && last.b_value == 0xdcbau,
          "mma(FragA_m16n8k8_bf16) forwarding");
    spio::FragA_m16n8k16_f16 a16h;
    spio::FragB_m16n8k16_f16 b16h;
    spio::mma(acc, a16h, b16h, acc);
    CHECK(called("mma_m16n8k16_f16") && last.a == a16h.reg && last.b == b16h.reg,
          "mma(FragA_m16n8k16_f16) forwarding");
    spio::FragA_m16n8k16_bf16 a16b;
    spio::FragB_m16n8k16_bf16 b16b;
    spio::mma(acc, a16b, b16b, acc);
    CHECK(called("mma_m16n8k16_bf16") && last.a == a16b.reg && last.b == b16b.reg,
          "mma(FragA_m16n8k16_bf16) forwarding");

    alignas(16) unsigned short smem[64];
    unsigned r1[1], r2[2], r4[4];
    spio::ldmatrix_x1(r1, smem + 8);
    CHECK(called("ldmatrix_x1") && last.d == r1 && last.a == smem + 8, "ldmatrix_x1 forwarding");
    spio::ldmatrix_x2(r2, smem + 16);
    CHECK(called("ldmatrix_x2") && last.d == r2 && last.a == smem + 16, "ldmatrix_x2 forwarding");
    spio::ldmatrix_x4(r4, smem + 24);
    CHECK(called("ldmatrix_x4") && last.d == r4 && last.a == smem + 24, "ldmatrix_x4 forwarding");
    spio::ldmatrix_x1_trans(r1, smem);
    CHECK(called("ldmatrix_x1_trans") && last.d == r1 && last.a == smem, "x1_trans forwarding");
    spio::ldmatrix_x2_trans(r2, smem);
    CHECK(called("ldmatrix_x2_trans") && last.d == r2 && last.a == smem, "x2_trans forwarding");
    spio::ldmatrix_x4_trans(r4, smem);
    CHECK(called("ldmatrix_x4_trans") && last.d == r4 && last.a == smem, "x4_trans forwarding");

    alignas(16) unsigned char global[32];
    spio::cp_async_16(smem, global + 16, 7);
    CHECK(called("cp_async_16") && last.d == smem && last.a == global + 16 && last.n == 7,
          "cp_async_16 forwarding");
    spio::cp_async_commit_group();
    CHECK(called("cp_async_commit_group"), "cp_async_commit_group forwarding");
    spio::cp_async_wait_group<3>();
    CHECK(called("cp_async_wait_group") && last.n == 3, "cp_async_wait_group<3> forwarding");
    spio::cp_async_wait_all();
    CHECK(called("cp_async_wait_all"), "cp_async_wait_all forwarding");

    // The pipeline's default group operations are the cp.async primitives.
    spio::AsyncPipeline<3> pipe;
    const int before = last.count;
    pipe.commit();
    CHECK(called("cp_async_commit_group") && last.count == before + 1, "pipeline commit");
    pipe.wait_prior();
    CHECK(called("cp_async_wait_group") && last.n == 2, "AsyncPipeline<3>::wait_prior waits <2>");

    CHECK(SPIO_DEVICE_CODE == 0 && SPIO_NVRTC == 0, "host build reports host code");
    std::printf("%d failures\n", check_failures());
    return check_failures() == 0 ? 0 : 1;
}
