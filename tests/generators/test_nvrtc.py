"""Generated headers compile with NVRTC for every supported architecture (no GPU needed)."""

from __future__ import annotations

import pytest

import spio
from spio.generators import (
    ELEMENT_TYPES,
    FRAGMENT_TYPES,
    FragmentSpec,
    IndexSpec,
    MacroSpec,
    ParamsSpec,
    TensorSpec,
    generate,
)

KERNEL = """
#include "generated.h"
extern "C" __global__ void use_generated(float *out) {
{body}
}
"""


def compile_for(arch: str, header: str, body: list[str]):
    from spio.compiler import compile_cubin

    source = KERNEL.replace("{body}", "\n".join(body))
    result = compile_cubin(source, arch, {"generated.h": header}, use_cache=False)
    assert result.cubin, "NVRTC returned an empty cubin"
    assert "use_generated" in result.resources, result.log
    return result


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_tensor_index_params_macros_compile(arch):
    """Every dtype (plain and const), padded dims, Index, Params and Macros in one device kernel."""
    specs = [
        MacroSpec({"SPIO_TILE": 16, "SPIO_FLAG": True, "SPIO_SCALE": -0.5}),
        ParamsSpec("Block", {"p": 8, "n": 4, "flag": False, "scale": 0.25}),
        IndexSpec("Thread", {"warp": 4, "lane": 32}),
    ]
    body = ["  Thread th(threadIdx.x);", "  float acc = Block::scale * SPIO_SCALE;"]
    for i, dtype in enumerate(sorted(ELEMENT_TYPES)):
        for const in ("", "const "):
            cls = f"T{i}{'c' if const else ''}"
            specs.append(TensorSpec(cls, const + dtype, {"y": 3, "x": 8, "c8": (8, 9)}))
            body += [
                f"  {{ {cls} t(reinterpret_cast<{cls}::data_type *>(out));",
                f"    {cls}::Index idx(th.lane());",
                "    acc += (t.y(-1).x(th.warp()).c8(idx.c8()).get() - t.get()) + idx.offset();",
                f"    acc += {cls}::size + {cls}::num_bytes + {cls}::stride_y + {cls}::C8; }}",
            ]
    body += [
        "#if SPIO_FLAG",
        "  if (!Block::flag) acc += Block::p * Block::n + Thread::size + SPIO_TILE;",
        "#endif",
        "  out[threadIdx.x] = acc;",
    ]
    compile_for(arch, generate(specs, "generated.h"), body)


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_fragments_compile_against_spio_header(arch):
    """Every fragment type, named, against the real spio/warp/fragments.h, used in device code."""
    specs, body = [], ["  int lane = threadIdx.x % 32;", "  float acc = 0.f;"]
    for i, fragment_type in enumerate(FRAGMENT_TYPES):
        cls = f"F{i}"
        specs.append(FragmentSpec(cls, fragment_type, row="q", col="k"))
        body += [
            f"  {{ {cls} f{{}};",
            f"    for (int e = 0; e < {cls}::num_elements; ++e)",
            f"      acc += {cls}::q(lane, e) * {cls}::K + {cls}::k(lane, e) + f.reg[0]; }}",
        ]
    body.append("  out[threadIdx.x] = acc;")
    compile_for(arch, generate(specs), body)
