"""The emulator's test kernels also compile with NVRTC, so the host branch cannot hide a broken
PTX branch of a primitive."""

import pytest

import spio


@pytest.mark.parametrize("arch", spio.supported_arch)
@pytest.mark.parametrize("which", ["primitives", "hazards", "shared_oob", "global_races", "bench"])
def test_test_kernels_compile_with_nvrtc(emu_sources, bench_source, arch, which):
    compiler = pytest.importorskip("spio.compiler")
    try:
        from spio.cuda.paths import find_nvrtc

        find_nvrtc()
    except Exception as error:  # no NVRTC on this machine
        pytest.skip(f"NVRTC not available: {error}")
    source = bench_source if which == "bench" else emu_sources[which]
    result = compiler.compile_cubin(source, arch, name=f"emu_{which}.cu")
    assert result.cubin and result.resources  # an empty report would pass the loop below
    for kernel, usage in result.resources.items():
        assert usage.spill_stores == 0 and usage.spill_loads == 0, (kernel, usage)


def test_bulk_copy_kernels_compile_with_nvrtc_for_sm_90_only():
    """cp.async.bulk and mbarrier tx-counts are sm_90 PTX: the header builds there and names the
    arch it needs elsewhere."""
    compiler = pytest.importorskip("spio.compiler")
    try:
        from spio.cuda.paths import find_nvrtc

        find_nvrtc()
    except Exception as error:  # no NVRTC on this machine
        pytest.skip(f"NVRTC not available: {error}")
    from tests.emulator.conftest import BULK

    result = compiler.compile_cubin(BULK, "sm_90", name="emu_bulk.cu")
    assert result.cubin
    with pytest.raises(Exception, match="needs sm_90 or newer"):
        compiler.compile_cubin(BULK, "sm_80", name="emu_bulk.cu")
