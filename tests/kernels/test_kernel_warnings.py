"""spio's kernel sources build without compiler warnings.

NVRTC's warnings are asserted where the sampled kernels are compiled for every arch
(`assert_sample_compiles_without_spills` and the variant, reduction and sum_slots build tests).
Here the same sources go through g++ with -Wall -Wextra -Werror, as the emulator builds them but
for its `-w`: g++ sees what NVRTC does not, e.g. a local only some kernels use (DGrad and FProp
without a bias worked out the bias's group index and never read it) or a signed-unsigned
comparison.
"""

import pytest

from spio.emulator import build
from spio.kernels import Conv2dGw8Params
from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels import conv2d_gw8_wgrad_factory as wg

#: Unused parameters stay allowed: every kernel of a family takes the same arguments, a bias or
#: dbias pointer among them, whether or not it has one.
STRICT = ("-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter")

WITH_BIAS = Conv2dGw8Params(n=2, c=16, h=9, w=7, padding=1, r=3, s=3, has_bias=True)
BF16 = Conv2dGw8Params(n=3, c=8, h=6, w=5, padding=(2, 0), r=5, s=1, dtype="bf16")
WIDE = Conv2dGw8Params(n=2, c=16, h=5, w=20, padding=1, r=4, s=2)  # has WGrad k16 configs


def _kernels():
    """(id, kernel): each source with each pass and each compile-time switch that adds or
    removes code (bias, weights layout, k8 or k16 mma, partial sums or atomics, dtypes)."""
    fprop = fd.make_kernel(WITH_BIAS, fd.default_config(WITH_BIAS), False)  # k16; BF16's: k8
    k16 = next(c for c in wg.configs(WIDE) if c.mma_k == 16)
    return [
        ("fprop-bias-wcl-belem", fd.variant(fprop, True, True)),
        ("fprop-bf16", fd.make_kernel(BF16, fd.default_config(BF16), False)),
        ("dgrad", fd.make_kernel(WITH_BIAS, fd.default_config(WITH_BIAS, True), True)),
        ("wgrad-bias-atomic", wg.make_kernel(WITH_BIAS, wg.default_config(WITH_BIAS))),
        ("wgrad-bf16-partials", wg.make_kernel(BF16, wg.default_config(BF16), partials=True)),
        ("wgrad-k16-partials", wg.make_kernel(WIDE, k16, partials=True)),
        ("sum_slots", wg.sum_kernel(WITH_BIAS, "fp32", "bf16")),
    ]


KERNELS = _kernels()


@pytest.mark.parametrize("kernel", [k for _, k in KERNELS], ids=[i for i, _ in KERNELS])
def test_kernel_source_builds_under_gxx_wall_wextra(monkeypatch, kernel):
    if build.compiler_family(build.compiler()) != "gcc":
        pytest.skip(f"g++'s warnings are what is held; CXX={build.compiler()!r} is not g++")
    flags = tuple(f for f in build._BASE_FLAGS if f != "-w") + STRICT
    monkeypatch.setattr(build, "_BASE_FLAGS", flags)
    # EmulatorBuildError, with g++'s output, on any warning.
    build.build_library(kernel.source, dict(kernel.headers), name=kernel.name, checked=False)
