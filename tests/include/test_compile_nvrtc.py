"""Every spio header but thread/bulk_copy.h (sm_90 only; its kernels' builds and
tests/emulator/test_tensor_copy.py compile it) compiles with NVRTC for each supported arch,
alone and all together.

Each header gets a small kernel that really uses every primitive it defines, so ptxas sees the
instructions. Checks: the PTX holds each expected instruction, ptxas reports no spills and no
stack frame, and an arch below sm_80 is rejected by spio/macros.h.
"""

from __future__ import annotations

import pickle
import re
import struct

import pytest

from spio.compiler import CompileError, compile_cubin
from spio.cuda import nvrtc, paths

ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]

# One kernel per header; the sources include only that header.
KERNELS: dict[str, tuple[str, str, list[str]]] = {}


def _kernel(header: str, name: str, body: str, ptx: list[str]) -> None:
    KERNELS[header] = (name, f'#include "spio/{header}"\n{body}', ptx)


_kernel(
    "macros.h",
    "macros_kernel",
    r"""
#if !SPIO_DEVICE_CODE || !SPIO_NVRTC
#error "NVRTC device code must see SPIO_DEVICE_CODE and SPIO_NVRTC set"
#endif
SPIO_DEVICE int twice(int x) { return 2 * x; }
SPIO_HOST_DEVICE constexpr int thrice(int x) { return 3 * x; }
static_assert(thrice(3) == 9, "SPIO_HOST_DEVICE constexpr in a constant expression");
extern "C" __global__ void macros_kernel(int *SPIO_RESTRICT out, const int *SPIO_RESTRICT in) {
    int acc = 0;
    SPIO_UNROLL
    for (int i = 0; i < 4; ++i) {
        acc += twice(in[i * blockDim.x + threadIdx.x]) + thrice(i);
    }
    out[threadIdx.x] = acc;
}
""",
    [],
)

_kernel(
    "ablation.h",
    "ablation_kernel",
    r"""
static_assert(SPIO_ABLATE_LOADS == 0 && SPIO_ABLATE_MMA == 0 && SPIO_ABLATE_STORES == 0 &&
              SPIO_ABLATE_SYNC == 0 && SPIO_L2_PREFETCH == 0 && SPIO_STAGGER_NS == 0 &&
              SPIO_ABLATE_COMPUTE == 0 && SPIO_STORE_STREAMING == 0,
              "production kernels get every switch off");
extern "C" __global__ void ablation_kernel(int *out, uint4 *wide) {
    spio::stagger_start(blockIdx.x);
    out[threadIdx.x] = 1;
    spio::store_output_16(wide + threadIdx.x, make_uint4(threadIdx.x, 1u, 2u, 3u));
}
""",
    [r"st\.global\.v4\.u32"],  # a plain store by default (st.global.cs with the switch)
)

_kernel(
    "warp/fragments.h",
    "fragments_kernel",
    r"""
template <typename Frag>
__device__ unsigned use_operand(const typename Frag::element_type value, unsigned extra) {
    const int lane = threadIdx.x & 31;
    Frag f;
    f.fill(value);
    f.set_reg(0, value, f.get(1));
    f.set_reg(Frag::num_regs - 1, f.get_reg(0));
    unsigned acc = extra;
    for (int i = 0; i < Frag::num_regs; ++i) acc ^= f.reg[i];
    for (int i = 0; i < Frag::num_elements; ++i) {
        acc += Frag::row(lane, i) * 16 + Frag::col(lane, i);
    }
    return acc;
}
extern "C" __global__ void fragments_kernel(const float *in, unsigned *out_bits, __half2 *out_h,
                                            __nv_bfloat162 *out_b) {
    const int t = threadIdx.x;
    const __half h = __float2half(in[t]);
    const __nv_bfloat16 b = __float2bfloat16(in[t]);
    unsigned acc = 0;
    acc = use_operand<spio::FragA_m16n8k8_f16>(h, acc);
    acc = use_operand<spio::FragA_m16n8k8_bf16>(b, acc);
    acc = use_operand<spio::FragB_m16n8k8_f16>(h, acc);
    acc = use_operand<spio::FragB_m16n8k8_bf16>(b, acc);
    acc = use_operand<spio::FragA_m16n8k16_f16>(h, acc);
    acc = use_operand<spio::FragA_m16n8k16_bf16>(b, acc);
    acc = use_operand<spio::FragB_m16n8k16_f16>(h, acc);
    acc = use_operand<spio::FragB_m16n8k16_bf16>(b, acc);
    spio::FragC_m16n8_f32 c;
    c.fill(in[t]);
    c.reg[3] += in[t + 32];
    out_bits[t] = acc + spio::FragC_m16n8_f32::row(t & 31, 3) + spio::FragC_m16n8_f32::col(t, 1);
    out_h[2 * t] = c.to_half2(0);
    out_h[2 * t + 1] = c.to_half2(1);
    out_b[2 * t] = c.to_bfloat162(0);
    out_b[2 * t + 1] = c.to_bfloat162(1);
}
""",
    [r"cvt\.rn\.f16x2\.f32|cvt\.rn\.f16\.f32", r"cvt\.rn\.bf16x2\.f32|cvt\.rn\.bf16\.f32"],
)

_kernel(
    "warp/ldmatrix.h",
    "ldmatrix_kernel",
    r"""
extern "C" __global__ void ldmatrix_kernel(const unsigned short *in, unsigned *out) {
    __shared__ __align__(16) unsigned short tile[32 * 8];
    const int lane = threadIdx.x & 31;
    for (int i = 0; i < 8; ++i) tile[lane * 8 + i] = in[lane * 8 + i];
    __syncwarp();
    const unsigned short *row = &tile[lane * 8];
    unsigned r1[1], r2[2], r4[4], t1[1], t2[2], t4[4];
    spio::ldmatrix_x1(r1, row);
    spio::ldmatrix_x2(r2, row);
    spio::ldmatrix_x4(r4, row);
    spio::ldmatrix_x1_trans(t1, row);
    spio::ldmatrix_x2_trans(t2, row);
    spio::ldmatrix_x4_trans(t4, row);
    unsigned *o = out + 14 * lane;
    o[0] = r1[0];
    o[1] = r2[0]; o[2] = r2[1];
    o[3] = r4[0]; o[4] = r4[1]; o[5] = r4[2]; o[6] = r4[3];
    o[7] = t1[0];
    o[8] = t2[0]; o[9] = t2[1];
    o[10] = t4[0]; o[11] = t4[1]; o[12] = t4[2]; o[13] = t4[3];
}
""",
    [
        r"ldmatrix\.sync\.aligned\.m8n8\.x1\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x2\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x1\.trans\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x2\.trans\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16",
    ],
)

_kernel(
    "warp/mma.h",
    "mma_kernel",
    r"""
extern "C" __global__ void mma_kernel(const unsigned *in, float *out) {
    const int lane = threadIdx.x & 31;
    const unsigned *x = in + 8 * lane;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const unsigned a2[2] = {x[0], x[1]};
    const unsigned a4[4] = {x[0], x[1], x[2], x[3]};
    const unsigned b2[2] = {x[4], x[5]};
    spio::mma_m16n8k8_f16(acc, a2, x[6], acc);
    spio::mma_m16n8k8_bf16(acc, a2, x[7], acc);
    spio::mma_m16n8k16_f16(acc, a4, b2, acc);
    spio::mma_m16n8k16_bf16(acc, a4, b2, acc);

    spio::FragC_m16n8_f32 c;
    c.zero();
    spio::FragA_m16n8k8_f16 a8h;       a8h.reg[0] = x[0]; a8h.reg[1] = x[1];
    spio::FragB_m16n8k8_f16 b8h;       b8h.reg[0] = x[2];
    spio::FragA_m16n8k8_bf16 a8b;      a8b.reg[0] = x[3]; a8b.reg[1] = x[4];
    spio::FragB_m16n8k8_bf16 b8b;      b8b.reg[0] = x[5];
    spio::FragA_m16n8k16_f16 a16h;     for (int i = 0; i < 4; ++i) a16h.reg[i] = x[i + 1];
    spio::FragB_m16n8k16_f16 b16h;     b16h.reg[0] = x[6]; b16h.reg[1] = x[7];
    spio::FragA_m16n8k16_bf16 a16b;    for (int i = 0; i < 4; ++i) a16b.reg[i] = x[i + 2];
    spio::FragB_m16n8k16_bf16 b16b;    b16b.reg[0] = x[7]; b16b.reg[1] = x[0];
    spio::mma(c, a8h, b8h, c);
    spio::mma(c, a8b, b8b, c);
    spio::mma(c, a16h, b16h, c);
    spio::mma(c, a16b, b16b, c);
    for (int i = 0; i < 4; ++i) out[8 * lane + i] = acc[i];
    for (int i = 0; i < 4; ++i) out[8 * lane + 4 + i] = c.reg[i];
}
""",
    [
        r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.f16\.f16\.f32",
        r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.bf16\.bf16\.f32",
        r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32",
        r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32",
    ],
)

_kernel(
    "thread/async_copy.h",
    "async_copy_kernel",
    r"""
extern "C" __global__ void async_copy_kernel(const uint4 *in, uint4 *out, int src_bytes) {
    __shared__ uint4 buf[4][128];
    const int t = threadIdx.x;
    spio::cp_async_16(&buf[0][t], &in[t], src_bytes);
    spio::cp_async_commit_group();
    spio::cp_async_16(&buf[1][t], &in[t + 128], 16);
    spio::cp_async_commit_group();
    spio::cp_async_16(&buf[2][t], &in[t + 256], 0);
    spio::cp_async_16_if(t < src_bytes, &buf[3][t], &in[t + 384], 16);
    spio::cp_async_wait_group<1>();
    spio::cp_async_wait_group<0>();
    spio::cp_async_wait_all();
    __syncthreads();
    const uint4 a = buf[0][127 - t], b = buf[1][t], c = buf[2][t], d = buf[3][t];
    out[t] = make_uint4(a.x ^ b.x ^ c.x, a.y ^ b.y ^ d.y, a.z ^ c.z, a.w ^ d.w);
}
""",
    [
        r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16, %r\d+;",
        # cp_async_16_if: the copy under a predicate set from `enable`, not under a branch
        r"setp\.ne\.b32 p, %r\d+, 0;\s*@p cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16",
        r"cp\.async\.commit_group;",
        r"cp\.async\.wait_group 1;",
        r"cp\.async\.wait_group 0;",
        r"cp\.async\.wait_all;",
    ],
)

_kernel(
    "block/pipeline.h",
    "pipeline_kernel",
    r"""
template <int Stages>
__device__ float run(const float4 *in, int num_tiles) {
    __shared__ float4 buffer[Stages][128];
    const int t = threadIdx.x;
    spio::AsyncPipeline<Stages> pipe;
    for (int s = 0; s < pipe.prefetch; ++s) {
        if (s < num_tiles) spio::cp_async_16(&buffer[pipe.write_stage()][t], &in[s * 128 + t], 16);
        pipe.commit();
    }
    float acc = 0.0f;
    for (int i = 0; i < num_tiles; ++i) {
        const int next = i + pipe.prefetch;
        if (next < num_tiles) {
            spio::cp_async_16(&buffer[pipe.write_stage()][t], &in[next * 128 + t], 16);
        }
        pipe.commit();
        pipe.wait_prior();
        __syncthreads();
        const float4 v = buffer[pipe.read_stage()][127 - t];
        acc += v.x * v.y + v.z * v.w;
        __syncthreads();
        pipe.advance();
    }
    return acc;
}
extern "C" __global__ void pipeline_kernel(const float4 *in, float *out, int num_tiles) {
    out[threadIdx.x] = run<2>(in, num_tiles) + run<3>(in, num_tiles);
}
""",
    [
        r"cp\.async\.cg\.shared\.global",
        r"cp\.async\.commit_group;",
        r"cp\.async\.wait_group 1;",
        r"cp\.async\.wait_group 2;",
    ],
)

# Everything through spio.h: a double-buffered 16x16 * 16x8 product per tile, like a gw8 conv.
_kernel(
    "spio.h",
    "spio_kernel",
    r"""
extern "C" __global__ void spio_kernel(const __half *x, const __half *w, __half2 *y,
                                       __nv_bfloat162 *y_bf16, int num_tiles) {
    __shared__ __align__(16) __half x_tile[2][16 * 16];
    __shared__ __align__(16) __half w_tile[16 * 8];
    const int lane = threadIdx.x & 31;
    // Weights: 16 rows (k) of 8 halves (n) = 16 x 16 bytes, lanes 0-15 copy one row each.
    if (lane < 16) spio::cp_async_16(&w_tile[lane * 8], &w[lane * 8], 16);
    spio::AsyncPipeline<2> pipe;
    // Each tile is 16 rows of 16 halves = 32 chunks of 16 bytes: one per lane.
    spio::cp_async_16(&x_tile[pipe.write_stage()][lane * 8], &x[lane * 8], 16);
    pipe.commit();
    spio::FragC_m16n8_f32 acc;
    acc.zero();
    for (int i = 0; i < num_tiles; ++i) {
        if (i + 1 < num_tiles) {
            spio::cp_async_16(&x_tile[pipe.write_stage()][lane * 8], &x[(i + 1) * 256 + lane * 8],
                              16);
        }
        pipe.commit();
        pipe.wait_prior();
        __syncwarp();
        const __half *xs = x_tile[pipe.read_stage()];
        spio::FragA_m16n8k16_f16 a;
        spio::ldmatrix_x4(a.reg, &xs[(lane & 15) * 16 + (lane >> 4) * 8]);
        spio::FragB_m16n8k16_f16 b;
        spio::ldmatrix_x2_trans(b.reg, &w_tile[(lane & 15) * 8]);
        spio::mma(acc, a, b, acc);
        spio::FragA_m16n8k8_f16 a8;
        spio::ldmatrix_x2(a8.reg, &xs[(lane & 15) * 16]);
        spio::FragB_m16n8k8_f16 b8;
        unsigned b8_reg[1];
        spio::ldmatrix_x1_trans(b8_reg, &w_tile[(lane & 7) * 8]);
        b8.reg[0] = b8_reg[0];
        spio::mma(acc, a8, b8, acc);
        __syncwarp();
        pipe.advance();
    }
    spio::cp_async_wait_all();
    y[2 * lane] = acc.to_half2(0);
    y[2 * lane + 1] = acc.to_half2(1);
    y_bf16[2 * lane] = acc.to_bfloat162(0);
    y_bf16[2 * lane + 1] = acc.to_bfloat162(1);
}
""",
    [
        r"cp\.async\.cg\.shared\.global",
        r"cp\.async\.wait_group 1;",
        r"cp\.async\.wait_all;",
        r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x2\.trans\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x2\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x1\.trans\.shared\.b16",
        r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32",
        r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.f16\.f16\.f32",
    ],
)


def _check(result, kernel: str, ptx_patterns: list[str]) -> None:
    assert kernel in result.resources, f"no ptxas report for {kernel}:\n{result.log}"
    usage = result.resources[kernel]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, f"{kernel} spills: {usage}"
    assert usage.stack_bytes == 0, f"{kernel} uses a stack frame: {usage}"
    assert usage.registers > 0, f"{kernel}: implausible report {usage}"
    for pattern in ptx_patterns:
        assert re.search(pattern, result.ptx), f"{kernel}: PTX lacks /{pattern}/"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("header", list(KERNELS))
def test_header_compiles_alone(header: str, arch: str) -> None:
    kernel, source, ptx_patterns = KERNELS[header]
    result = compile_cubin(source, arch, name=f"{kernel}.cu", use_cache=False)
    assert result.cubin, "empty cubin"
    _check(result, kernel, ptx_patterns)


@pytest.mark.parametrize("arch", ARCHS)
def test_all_headers_compile_together(arch: str) -> None:
    """Every kernel above in one translation unit, headers included in reverse order."""
    headers = list(reversed(KERNELS))
    includes = "".join(f'#include "spio/{h}"\n' for h in headers)
    source = includes + "".join(KERNELS[h][1] for h in headers)
    result = compile_cubin(source, arch, name="all_headers.cu", use_cache=False)
    for kernel, _, ptx_patterns in KERNELS.values():
        _check(result, kernel, ptx_patterns)


def test_streaming_store_switch_emits_st_global_cs() -> None:
    """SPIO_STORE_STREAMING (the `stores-cs` timing variant) turns store_output_16 into
    st.global.cs; without it the store is plain (the ablation.h kernel above)."""
    kernel, source, _ = KERNELS["ablation.h"]
    source = source.replace("static_assert(", "static_assert(true || ", 1)
    result = compile_cubin(
        "#define SPIO_STORE_STREAMING 1\n" + source, "sm_90", name="streaming.cu", use_cache=False
    )
    assert re.search(r"st\.global\.cs\.v4\.u32", result.ptx), result.ptx
    assert not re.search(r"st\.global\.v4\.u32", result.ptx)


def test_arch_below_sm80_is_rejected() -> None:
    """spio/macros.h stops a compile for sm_75 (no cp.async, no bf16 mma) with a clear error."""
    source = '#include "spio/macros.h"\nextern "C" __global__ void k() {}\n'
    options = ["--gpu-architecture=sm_75", "-std=c++17", f"-I{paths.bundled_include_dir()}"]
    with pytest.raises(CompileError, match="sm_80 or newer"):
        nvrtc.compile_program(source, "sm75.cu", options)
    # The same source compiles for sm_80, so the error above comes from the arch guard.
    nvrtc.compile_program(source, "sm80.cu", ["--gpu-architecture=sm_80", *options[1:]])


def _elf_end(cubin: bytes) -> int:
    """Where the last of an ELF64 file's sections, section headers and program headers ends."""
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    ends = [phoff + phentsize * phnum, shoff + shentsize * shnum]
    for i in range(shnum):
        kind, _, _, offset, size = struct.unpack_from("<IQQQQ", cubin, shoff + i * shentsize + 4)
        if kind != 8:  # SHT_NOBITS takes no room in the file
            ends.append(offset + size)
    return max(ends)


def test_compile_program_returns_whole_outputs_and_a_clean_log() -> None:
    """The cubin ends where its ELF tables say, the PTX and log carry no C terminator, and a
    rejected program's error names NVRTC's result."""
    source = 'extern "C" __global__ void k(float *x) { x[0] = 1.f; }\n'
    out = nvrtc.compile_program(source, "whole.cu", ["--gpu-architecture=sm_80"])
    assert out.cubin[:4] == b"\x7fELF" and len(out.cubin) == _elf_end(out.cubin)
    assert "\0" not in out.ptx and out.ptx.rstrip().endswith("}")
    assert "\0" not in out.log
    with pytest.raises(CompileError) as info:
        nvrtc.compile_program("not C++", "bad.cu", ["--gpu-architecture=sm_80"])
    assert info.value.result == "NVRTC_ERROR_COMPILATION" and "\0" not in info.value.log
    assert "(NVRTC_ERROR_COMPILATION)" in str(info.value)


def test_a_compile_error_survives_pickling() -> None:
    """Compile pool workers send it back pickled: the result name must not be lost."""
    sent = nvrtc.CompileError("k.cu", "k.cu(1): error", "NVRTC_ERROR_COMPILATION")
    error = pickle.loads(pickle.dumps(sent))
    assert (error.name, error.log, error.result) == (sent.name, sent.log, sent.result)
    assert str(error) == "NVRTC failed to compile k.cu (NVRTC_ERROR_COMPILATION):\nk.cu(1): error"
