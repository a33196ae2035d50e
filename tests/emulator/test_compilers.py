"""The emulator builds with GCC's g++ or LLVM's clang++ (CXX picks). Each spells the sanitizer
settings of a checked build its own way, and clang's instrumentation calls more of the runtime:
the unaligned access callbacks, memset and memcpy. The hazard and primitive tests run with every
compiler of conftest's COMPILERS; these cover what differs."""

import re

import pytest
import torch

from spio.emulator import EmulatorError, build
from tests.conftest import run_spio
from tests.emulator.conftest import CLANG, HAZARDS, load

needs_clang = pytest.mark.skipif(CLANG is None, reason="no clang++ 16 or newer on PATH")


@pytest.mark.parametrize("checked", [True, False])
def test_a_cxx_with_an_unbalanced_quote_is_named(monkeypatch, checked):
    """CXX='g++ "' had been shlex's ValueError ("No closing quotation"), a traceback of
    `spio info` and a setup error of `spio check` that did not name CXX."""
    monkeypatch.setenv("CXX", 'g++ "')
    said = r"CXX must be a command line \(a compiler and its flags\), got 'g\+\+ \"': No closing"
    with pytest.raises(build.EmulatorBuildError, match=said):
        build.build_library('extern "C" __global__ void k() {}', checked=checked)
    from spio import __main__ as cli

    assert cli._emulator_compiler_summary().startswith("NOT FOUND (CXX must be a command line")


@pytest.mark.parametrize(
    "version,family",
    [
        ("g++ (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc"),
        ("c++ (GCC) 11.4.1 20231218 (Red Hat 11.4.1-3)", "gcc"),
        ("Debian clang version 16.0.6 (15~deb12u1)", "clang"),
        ("Ubuntu clang version 18.1.3 (1ubuntu1)", "clang"),
    ],
)
def test_a_checked_build_spells_the_sanitizer_settings_for_its_compiler(
    monkeypatch, version, family
):
    monkeypatch.setattr(build, "compiler_version", lambda cxx: version)
    monkeypatch.setattr(build, "_takes_flag", lambda cxx, flag: True)
    assert build.compiler_family("c++") == family
    *flags, unset = build.check_flags("c++")
    assert unset == "-ftrivial-auto-var-init=pattern"  # unset locals read as a pattern
    monkeypatch.setattr(build, "_takes_flag", lambda cxx, flag: False)  # GCC 11: without it
    assert build.check_flags("c++") == tuple(flags)
    assert flags[0] == "-fsanitize=thread"
    prefix = "-mllvm" if family == "clang" else "--param"
    assert all(flag == prefix for flag in flags[1::2])
    settings = [flag.lstrip("-") for flag in flags[2::2]]
    assert "tsan-instrument-func-entry-exit=0" in settings
    assert "tsan-distinguish-volatile=0" in settings
    if family == "clang":  # clang checks only the store of a load-then-store by default
        assert "tsan-instrument-read-before-write=1" in settings


@pytest.mark.parametrize(
    "version", ["Ubuntu clang version 14.0.0-1ubuntu1.1", "Debian clang version 15.0.6"]
)
def test_a_clang_that_leaves_memcpy_unchecked_is_refused_for_checked_builds(monkeypatch, version):
    """clang 15 and older turn a float4 struct copy into a call of the C library's memcpy, which
    no check sees: test_a_vector_load_running_past_a_tensor_is_out_of_bounds failed with
    clang 14."""
    monkeypatch.setattr(build, "compiler_version", lambda cxx: version)
    with pytest.raises(
        build.EmulatorBuildError, match=f"need clang 16 or newer.*{re.escape(version)}"
    ):
        build.check_flags("clang++")


@pytest.fixture(scope="module")
def clang_hazards():
    return load(HAZARDS, "emu_test_hazards", "clang")


@needs_clang
def test_clang_builds_check_memset_and_memcpy(clang_hazards):
    fn = clang_hazards.get_function("clear_then_copy")
    x = torch.randn(8)
    out = torch.randn(16)
    fn.launch(1, 32, (out, x, 8, 8))
    assert torch.equal(out, torch.cat([torch.zeros(8), x]))
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access: writes 40 bytes"):
        fn.launch(1, 32, (torch.randn(9), torch.randn(4), 10, 4))  # memset (memcpy: 16 bytes)
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access: writes 40 bytes"):
        fn.launch(1, 32, (torch.randn(16), torch.randn(10), 10, 10))  # memset fits, memcpy not
    with pytest.raises(EmulatorError, match="out-of-bounds global-memory access: reads 40 bytes"):
        fn.launch(1, 32, (torch.randn(32), torch.randn(9), 10, 10))  # memcpy reads past `in`


@needs_clang
def test_spio_check_passes_with_kernels_built_by_clang(tmp_path):
    """Every pass of both dtypes, on the real kernel source, built by clang++ for the emulator."""
    env = {"CXX": CLANG, "SPIO_CACHE_DIR": str(tmp_path)}
    out = run_spio("check", "--quick", "--device", "cpu", env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all 6 pass/dtype checks passed" in out.stdout


def test_cuda_headers_too_old_for_host_code_are_named(cuda_include):
    """CUDA 12.0's and 12.1's cuda_fp16.h declare __half22float2 and the others for nvcc only:
    every kernel build failed with a page of compiler errors."""
    (cuda_include / "cuda.h").write_text("#define CUDA_VERSION 12010\n")
    with pytest.raises(
        build.EmulatorBuildError,
        match=rf"needs CUDA headers 12\.2 or newer .* in {re.escape(str(cuda_include))} are 12\.1 ",
    ):
        build.build_library(HAZARDS, name="emu_test_hazards")
