"""compile_cubin: real NVRTC compiles for every arch, resource reports, errors, and the cache."""

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import spio
from spio.compiler import CompileError, cache, compile_cubin, digest, parse_resource_report
from spio.compiler import compile as compile_module
from spio.cuda import nvrtc, paths

# A small kernel using each instruction family our kernels depend on.
TENSOR_CORE_KERNEL = r"""
#include <cuda_fp16.h>
extern "C" __global__ void probe(float *out, const __half *in) {
    __shared__ __align__(16) __half tile[32 * 8];
    unsigned smem = (unsigned)__cvta_generic_to_shared(tile + threadIdx.x * 8);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem), "l"(in + threadIdx.x * 8), "r"(16));
    asm volatile("cp.async.commit_group;\n");
    asm volatile("cp.async.wait_group 0;\n");
    __syncthreads();
    unsigned a0, a1, b = 0;
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(a0), "=r"(a1) : "r"(smem));
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b));
    out[threadIdx.x] = c[0] + c[1] + c[2] + c[3];
}
"""


def unique(source: str) -> str:
    """The same program with a fresh cache key."""
    return f"// {uuid.uuid4()}\n{source}"


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_tensor_core_kernel_compiles_without_spills(arch, cache_dir):
    result = compile_cubin(TENSOR_CORE_KERNEL, arch)
    assert result.cubin[:4] == b"\x7fELF"
    usage = result.resources["probe"]
    assert usage.registers > 0
    assert usage.spill_stores == 0 and usage.spill_loads == 0
    assert usage.shared_bytes == 32 * 8 * 2
    for instruction in ("mma.sync.aligned.m16n8k8", "ldmatrix.sync.aligned", "cp.async.cg"):
        assert instruction in result.ptx
    assert f".target {arch}" in result.ptx


def test_broken_kernel_raises_with_nvrtc_log(cache_dir):
    source = 'extern "C" __global__ void broken(float *x) { x[0] = undeclared_name; }'
    with pytest.raises(CompileError) as info:
        compile_cubin(source, "sm_80", name="broken.cu")
    assert "undeclared_name" in info.value.log
    assert "undeclared_name" in str(info.value) and "broken.cu" in str(info.value)
    # Which arch: a kernel built for several had its failures named alike.
    assert str(info.value).startswith("NVRTC failed to compile broken.cu for sm_80 (")
    assert info.value.arch == "sm_80"


def test_a_failure_for_an_arch_nvrtc_lacks_says_so(cache_dir, monkeypatch, forget_toolchain):
    """Where the NVRTC found has no such arch (sm_100 before NVRTC 12.8), its own log said only
    "invalid value for --gpu-architecture"; the error now says which NVRTC and what to do.
    (This NVRTC is made to lack sm_90: its compile for it fails, as an older one's would.)"""
    source = 'extern "C" __global__ void k() {}'
    known = nvrtc.supported_archs()
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: tuple(a for a in known if a != "sm_90"))
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 4))
    with pytest.raises(CompileError) as info:
        compile_cubin(source, "sm_90", name="k.cu", options=["--no-such-option"])
    assert info.value.log.startswith("NVRTC 12.4 cannot compile for sm_90 (it compiles for ")
    assert "no-such-option" in info.value.log and info.value.arch == "sm_90"
    with pytest.raises(CompileError) as info:  # an arch it has: its log alone
        compile_cubin(source, "sm_80", name="k.cu", options=["--no-such-option"])
    assert "cannot compile for" not in info.value.log


def test_missing_header_error_names_it(cache_dir):
    source = '#include "no_such_header.h"\nextern "C" __global__ void k() {}'
    with pytest.raises(CompileError, match="no_such_header.h"):
        compile_cubin(source, "sm_80")


def test_headers_and_options_of_the_wrong_types_are_named(cache_dir):
    """Bytes for a header's text failed inside with AttributeError; one option given as a
    string was split into characters, which NVRTC refused as "-"."""
    source = 'extern "C" __global__ void k() {}'
    with pytest.raises(TypeError, match=r"headers as \{name: text\} of strings, got 'a.h': bytes"):
        compile_cubin(source, "sm_80", headers={"a.h": b"#define A 1\n"})
    with pytest.raises(TypeError, match="options as a sequence of strings, got '-lineinfo'"):
        compile_cubin(source, "sm_80", options="-lineinfo")


def test_a_nul_character_is_refused_where_nvrtc_would_stop_reading(cache_dir):
    """NVRTC takes C strings: text after a NUL in the source, a header, an option or the name
    was dropped unread (a source with junk after one compiled), while the cache key kept it."""
    from spio.emulator.build import build_library

    source = 'extern "C" __global__ void k(int *p) { *p = 1; }\n'
    for call, what in (
        (lambda: compile_cubin(source + "\0 not C++", "sm_80"), "a source"),
        (lambda: compile_cubin(source, "sm_80", name="a\0b"), "a name"),
        (lambda: compile_cubin(source, "sm_80", options=["-DX=1\0junk"]), "an option"),
    ):
        with pytest.raises(ValueError, match=f"compile_cubin needs {what} without NUL characters"):
            call()
    message = "needs headers without NUL characters, got one in 'h.h'"
    with pytest.raises(ValueError, match=f"compile_cubin {message}"):
        compile_cubin(source, "sm_80", headers={"h.h": "#define X 1\0 junk"})
    with pytest.raises(ValueError, match=f"the emulator {message}"):
        build_library(source, headers={"h.h": "#define X 1\0 junk"})


@pytest.mark.parametrize("name", ["/tmp/spio-escape.h", "../../spio-escape.h", "a\\b.h", ""])
def test_header_names_outside_the_include_folder_are_refused(cache_dir, name):
    """The emulator writes in-memory headers to files in its include folder: an absolute name or
    one with '..' had been written outside it (over an existing file), and bytes for a header's
    text had been a TypeError of the regex module. NVRTC takes the same names as the emulator."""
    from spio.emulator.build import build_library

    source = 'extern "C" __global__ void k() {}'
    message = "header names that are relative paths without '..' or backslashes, got"
    with pytest.raises(ValueError, match=f"compile_cubin needs {message}"):
        compile_cubin(source, "sm_80", headers={name: "#define A 1\n"})
    with pytest.raises(ValueError, match=f"the emulator needs {message}"):
        build_library(source, headers={name: "#define A 1\n"})
    with pytest.raises(TypeError, match="the emulator needs headers as .* got 'a.h': bytes"):
        build_library(source, headers={"a.h": b"#define A 1\n"})


def test_in_memory_headers_are_included(cache_dir):
    source = '#include "gen.h"\nextern "C" __global__ void k(int *x) { x[0] = GEN_VALUE; }'
    result = compile_cubin(source, "sm_86", headers={"gen.h": "#define GEN_VALUE 42\n"})
    assert "42" in result.ptx


@pytest.mark.parametrize("arch", ["sm_70", "sm_91", "compute_80", ""])
def test_unknown_arch_is_rejected(arch, cache_dir):
    with pytest.raises(ValueError, match="unknown GPU architecture"):
        compile_cubin(TENSOR_CORE_KERNEL, arch)


@pytest.mark.parametrize("source", ["", "   \n"])
def test_empty_source_is_rejected(source, cache_dir):
    with pytest.raises(ValueError, match="non-empty CUDA source"):
        compile_cubin(source, "sm_80")


def test_experimental_arch_compiles(cache_dir):
    """An arch outside spio's list (sm_120, which NVRTC knows from CUDA 12.8 on) still builds."""
    from spio.cuda import nvrtc

    if nvrtc.version() < (12, 8):
        pytest.skip(f"NVRTC {nvrtc.version()} does not know sm_120 (CUDA 12.8 does)")
    result = compile_cubin(TENSOR_CORE_KERNEL, "sm_120")
    assert "probe" in result.resources


def test_line_info_and_debug_options_change_the_build(cache_dir):
    source = unique(TENSOR_CORE_KERNEL)
    plain = compile_cubin(source, "sm_80")
    with_lines = compile_cubin(source, "sm_80", line_info=True)
    assert not with_lines.cached
    assert ".loc" in with_lines.ptx and ".loc" not in plain.ptx
    debug = compile_cubin(source, "sm_80", debug=True)
    assert not debug.cached


def test_second_compile_is_a_cache_hit_without_nvrtc(cache_dir, monkeypatch):
    source = unique(TENSOR_CORE_KERNEL)
    first = compile_cubin(source, "sm_89")
    assert not first.cached

    def fail(*args, **kwargs):
        raise AssertionError("NVRTC was called on a cache hit")

    monkeypatch.setattr(nvrtc, "compile_program", fail)
    second = compile_cubin(source, "sm_89")  # from memory
    assert second.cached and second.cubin == first.cubin
    compile_module._cubin_cache.clear_memory()
    third = compile_cubin(source, "sm_89")  # from disk
    assert third.cached and third.cubin == first.cubin
    assert third.resources == first.resources


def _only_entry(folder):
    entries = list((folder / "cubin").glob("*.bin"))
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_damaged_cache_entry_is_recompiled(cache_dir, damage):
    source = unique(TENSOR_CORE_KERNEL)
    first = compile_cubin(source, "sm_80")
    entry = _only_entry(cache_dir)
    blob = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        entry.write_bytes(blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:])
    else:
        entry.write_bytes(b"")
    compile_module._cubin_cache.clear_memory()
    second = compile_cubin(source, "sm_80")
    assert not second.cached
    assert second.cubin == first.cubin
    assert cache._decode(entry.read_bytes()) is not None  # the entry was rewritten whole


def test_unwritable_cache_folder_still_compiles(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    # Root ignores permission bits, so make the cache folder impossible: it lies under a file.
    monkeypatch.setenv("SPIO_CACHE_DIR", str(blocker / "cache"))
    fresh = cache.DiskCache("cubin")
    monkeypatch.setattr(compile_module, "_cubin_cache", fresh)
    source = unique(TENSOR_CORE_KERNEL)
    with caplog.at_level("WARNING", logger="spio"):
        first = compile_cubin(source, "sm_90")
        compile_cubin(unique(TENSOR_CORE_KERNEL), "sm_90")
        again = compile_cubin(source, "sm_90")
    assert not first.cached and again.cached  # kept in memory
    warnings = [r for r in caplog.records if "cannot write its cache folder" in r.message]
    assert len(warnings) == 1


def test_concurrent_processes_compile_once(cache_dir):
    source = unique(TENSOR_CORE_KERNEL)
    script = textwrap.dedent(
        """
        import sys
        from spio.compiler import compile_cubin
        result = compile_cubin(sys.stdin.read(), "sm_80")
        print("cached" if result.cached else "compiled")
        """
    )
    env = dict(os.environ, SPIO_CACHE_DIR=str(cache_dir))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            encoding="utf-8",
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(source, timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(outputs) == ["cached", "cached", "cached", "compiled"]
    entry = _only_entry(cache_dir)
    assert cache._decode(entry.read_bytes()) is not None
    assert not list((cache_dir / "cubin").glob("*.tmp"))


def test_parse_resource_report_reads_each_entry():
    log = textwrap.dedent(
        """\
        ptxas info    : 0 bytes gmem
        ptxas info    : Compiling entry function 'first' for 'sm_80'
        ptxas info    : Function properties for first
        ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
        ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 368 bytes cmem[0]
        ptxas info    : Compiling entry function 'second' for 'sm_80'
        ptxas info    : Function properties for second
        ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 32 registers, 368 bytes cmem[0]
        """
    )
    report = parse_resource_report(log)
    first, second = report["first"], report["second"]
    assert (first.registers, first.shared_bytes, first.barriers) == (255, 4096, 1)
    assert (first.stack_bytes, first.spill_stores, first.spill_loads) == (16, 8, 4)
    assert first.spills and not second.spills
    assert (second.registers, second.shared_bytes) == (32, 0)


def test_a_callees_spills_count_as_the_kernels():
    """ptxas reports a device function it did not inline under its own "Function properties"
    (here work(), called by k): its spills had been dropped, and k passed for spill-free."""
    log = textwrap.dedent(
        """\
        ptxas info    : Compiling entry function 'k' for 'sm_80'
        ptxas info    : Function properties for k
        ptxas         .     544 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 24 registers, used 0 barriers, 544 bytes cumulative stack size
        ptxas info    : Function properties for _Z4workPKfi
        ptxas         .     0 bytes stack frame, 656 bytes spill stores, 716 bytes spill loads
        """
    )
    (k,) = parse_resource_report(log).values()
    assert (k.spill_stores, k.spill_loads, k.stack_bytes, k.registers) == (656, 716, 544, 24)
    assert k.spills


def test_a_spill_in_a_function_not_inlined_is_reported_by_the_compiler():
    source = """
    __device__ __noinline__ float work(const float *x, int n) {
        float a[64];
        #pragma unroll
        for (int i = 0; i < 64; ++i) a[i] = x[i * n];
        float s = 0;
        #pragma unroll
        for (int i = 0; i < 64; ++i) s += a[i] * a[(i * 7) % 64];
        return s;
    }
    extern "C" __global__ void k(const float *x, float *y, int n) {
        y[threadIdx.x] = work(x + threadIdx.x, n);
    }
    """
    result = compile_cubin(source, "sm_80", options=("--maxrregcount=24",), use_cache=False)
    assert result.resources["k"].spills


def test_compiler_warnings_are_the_front_ends_and_ptxas_warning_lines():
    """Warnings only: not ptxas' info lines, nor an entry or file whose name holds the word."""
    log = textwrap.dedent(
        """\
        prog.cu(81): warning #177-D: function "f" was declared but never referenced
                  ^
        Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"
        ptxas info    : Compiling entry function 'no_warning' for 'sm_80'
        ptxas info    : Function properties for no_warning
        ptxas warning : Unresolved extern function 'g'
        warning_kernel.cu(3): remark: something to note
        ptxas info    : Used 32 registers, 368 bytes cmem[0]
        """
    )
    assert compile_module.compiler_warnings(log) == [
        'prog.cu(81): warning #177-D: function "f" was declared but never referenced',
        "ptxas warning : Unresolved extern function 'g'",
    ]
    assert compile_module.compiler_warnings("ptxas info    : Used 32 registers\n") == []


def test_a_compile_that_warns_keeps_the_warning_and_one_that_does_not_has_none(cache_dir):
    """CompileResult.warnings reads NVRTC's own log, from a fresh compile and from the cache."""
    unused = TENSOR_CORE_KERNEL + "\nnamespace { __device__ int never_called() { return 1; } }\n"
    for cached in (False, True):
        result = compile_cubin(unused, "sm_80", name="unused.cu")
        (warning,) = result.warnings
        assert "warning #177-D" in warning and "never_called" in warning
        assert result.cached == cached
        assert compile_cubin(TENSOR_CORE_KERNEL, "sm_80", name="clean.cu").warnings == []


def key_of(arch="sm_80", options=(), **flags):
    opts = compile_module.nvrtc_options(arch, **flags) + list(options)
    return compile_module.cubin_key(TENSOR_CORE_KERNEL, arch, {}, opts)


def use_bundled_copy(monkeypatch, folder):
    """spio/include copied to `folder`, and spio told that it lives there."""
    shutil.copytree(paths.bundled_include_dir(), folder)
    monkeypatch.setattr(paths, "bundled_include_dir", lambda: folder)
    return folder


def test_cache_key_changes_with_a_bundled_header(tmp_path, monkeypatch, forget_toolchain):
    """In the same process too: a cubin compiled after an edit must not be filed under the key
    of the headers as they were (a fresh process would then load it for the unedited ones)."""
    include = use_bundled_copy(monkeypatch, tmp_path / "include")
    before = key_of()
    header = sorted(include.rglob("*.h"))[0]
    text = header.read_text()
    header.write_text(text + "\n// edited\n")
    assert key_of() != before
    header.write_text(text)
    assert key_of() == before


def test_cache_key_does_not_depend_on_where_spio_is_installed(
    tmp_path, monkeypatch, forget_toolchain
):
    """The -I folders spio adds are in the key by content, not by path: moving the
    installation keeps the cache."""
    use_bundled_copy(monkeypatch, tmp_path / "site-a" / "include")
    here = key_of(), compile_module.nvrtc_options("sm_80")
    use_bundled_copy(monkeypatch, tmp_path / "site-b" / "include")
    there = key_of(), compile_module.nvrtc_options("sm_80")
    assert here[1] != there[1] and here[0] == there[0]


def test_cache_key_changes_with_nvrtc_identity(monkeypatch, forget_toolchain):
    version, libraries = compile_module._nvrtc_identity()
    assert version == nvrtc.version() and len(libraries) >= 1
    before = key_of()
    # Same major.minor, another build of libnvrtc (a patch release, another vendor's copy).
    monkeypatch.setattr(compile_module, "_nvrtc_identity", lambda: (version, ("other",)))
    assert key_of() != before
    monkeypatch.setattr(compile_module, "_nvrtc_identity", lambda: ((99, 0), libraries))
    assert key_of() != before


def test_nvrtc_identity_follows_the_library_file(tmp_path, monkeypatch, forget_toolchain):
    real = nvrtc.library_path()
    copy = tmp_path / "libnvrtc.so.12"
    with open(real, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read(2 * digest.LIBRARY_HEAD_BYTES))
    monkeypatch.setattr(nvrtc, "library_path", lambda: copy)
    first = compile_module._nvrtc_identity()
    compile_module._nvrtc_identity.cache_clear()
    with open(copy, "ab") as f:
        f.write(b"\0")  # a rebuild of another size
    assert compile_module._nvrtc_identity() != first


def test_cache_key_changes_with_cuda_headers(monkeypatch, forget_toolchain):
    before = key_of()
    monkeypatch.setattr(compile_module, "_cuda_headers_identity", lambda: "other headers")
    assert key_of() != before


def test_cache_key_keeps_every_option_but_spios_include_folders(forget_toolchain):
    base = compile_module.nvrtc_options("sm_80")
    before = compile_module.cubin_key(TENSOR_CORE_KERNEL, "sm_80", {}, base)
    assert key_of(line_info=True) != before
    assert key_of(debug=True) != before
    assert key_of(options=["--use_fast_math"]) != before
    assert key_of(options=["-I/one"]) != key_of(options=["-I/two"])  # not digested: path counts

    # An option spio adds later, anywhere in its list: the key used opts[:3] + opts[5:], which
    # dropped an option put before the -I flags and kept a -I path in its place.
    def with_option_at(at):
        opts = base[:at] + ["--fmad=false"] + base[at:]
        return compile_module.cubin_key(TENSOR_CORE_KERNEL, "sm_80", {}, opts)

    includes = compile_module._include_options()
    first = base.index(includes[0])
    assert base[first : first + 2] == includes
    assert with_option_at(first) == with_option_at(first + 1) == with_option_at(first + 2)
    assert with_option_at(first) != before
    keys = {with_option_at(at) for at in range(len(base) + 1)}
    assert before not in keys and len(keys) == len(base) - 1  # around the -I flags: one key
    assert compile_module.cubin_key(TENSOR_CORE_KERNEL, "sm_86", {}, base) != before
    renamed = compile_module.cubin_key(TENSOR_CORE_KERNEL, "sm_80", {}, base, "other.cu")
    assert renamed != before  # the log and -lineinfo cubins name the program
    with_header = compile_module.cubin_key(TENSOR_CORE_KERNEL, "sm_80", {"gen.h": "1"}, base)
    assert with_header != before


def test_a_failure_without_a_log_names_nvrtcs_result(monkeypatch):
    """NVRTC fails some programs with an empty log (e.g. out of memory): the error names the
    result, where it had said only 'NVRTC failed to compile k.cu:' and nothing after."""
    from spio.cuda import nvrtc

    real = nvrtc._lib()

    class EmptyLogFailure:
        def __getattr__(self, name):
            return getattr(real, name)

        def nvrtcCompileProgram(self, prog, count, options):
            return 3  # NVRTC_ERROR_INVALID_INPUT

        def nvrtcGetProgramLogSize(self, prog, size):
            size._obj.value = 1  # the terminating zero alone
            return 0

    monkeypatch.setattr(nvrtc, "_lib", EmptyLogFailure)
    with pytest.raises(CompileError) as info:
        nvrtc.compile_program('extern "C" __global__ void k() {}', "k.cu", [])
    assert info.value.result == "NVRTC_ERROR_INVALID_INPUT"
    assert str(info.value) == "NVRTC failed to compile k.cu (NVRTC_ERROR_INVALID_INPUT):\n(no log)"


def test_cache_key_changes_with_the_source_and_a_headers_text(forget_toolchain):
    base = compile_module.nvrtc_options("sm_80")

    def key(source=TENSOR_CORE_KERNEL, headers=None):
        return compile_module.cubin_key(source, "sm_80", headers or {}, base)

    assert key() == key()
    assert key(TENSOR_CORE_KERNEL.replace("c[0] + c[1]", "c[1] + c[0]")) != key()
    assert key(headers={"gen.h": "#define V 1\n"}) != key(headers={"gen.h": "#define V 2\n"})


def test_nvrtc_identity_follows_the_builtins_library(tmp_path, monkeypatch, forget_toolchain):
    """libnvrtc-builtins is loaded beside libnvrtc and holds code NVRTC compiles in: a new
    build of it alone is a new compiler."""
    lib, builtins = tmp_path / "libnvrtc.so.12", tmp_path / "libnvrtc-builtins.so.12.8"
    lib.write_bytes(b"nvrtc")
    builtins.write_bytes(b"builtins, one build")
    monkeypatch.setattr(nvrtc, "library_path", lambda: lib)
    monkeypatch.setattr(nvrtc, "builtins_beside", lambda path: [builtins])
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 8))
    first = compile_module._nvrtc_identity()
    compile_module._nvrtc_identity.cache_clear()
    builtins.write_bytes(b"builtins, another build")
    assert compile_module._nvrtc_identity() != first


@pytest.mark.parametrize("library", ["garbage", "another library"])
def test_an_spio_nvrtc_that_is_not_nvrtc_is_named_with_how_to_mend_it(tmp_path, library):
    """A file that does not load, or a library without NVRTC's symbols: one NvrtcError naming
    the file, the loader's reason and SPIO_NVRTC, not ctypes' bare OSError or AttributeError."""
    if library == "garbage":
        path = tmp_path / "libnvrtc.so.12"
        path.write_bytes(b"not a library")
        reason = "file too short"
    else:
        # this interpreter's build of spio's extension (a tree may hold other Pythons' too)
        path = Path(pytest.importorskip("spio.cuda.driver").__file__)
        reason = "undefined symbol: nvrtcVersion"
    code = textwrap.dedent(
        """
        from spio.cuda import nvrtc
        try:
            nvrtc.version()
        except nvrtc.NvrtcError as error:
            print(error)
        """
    )
    env = dict(os.environ, SPIO_NVRTC=str(path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "was found but cannot be loaded as NVRTC" in out.stdout, out.stdout
    assert reason in out.stdout and out.stdout.rstrip().endswith(
        "set SPIO_NVRTC to a working libnvrtc.so.12 or .13, or unset it"
    )


def test_quoted_includes_are_not_searched_in_the_current_directory(
    cache_dir, tmp_path, monkeypatch
):
    """NVRTC searched a quoted #include first beside the program, named bare: in the current
    directory. A process started where another checkout's spio/include lies built its kernels
    from those headers, and cached them under the key of spio's own for every process."""
    impostor = tmp_path / "spio" / "macros.h"
    impostor.parent.mkdir()
    impostor.write_text("#define SPIO_TEST_VALUE 7\n", encoding="utf-8")
    source = (
        '#include "spio/macros.h"\n#ifndef SPIO_TEST_VALUE\n#define SPIO_TEST_VALUE 5\n#endif\n'
        'extern "C" __global__ void k(int* x) { x[0] = SPIO_TEST_VALUE; }\n'
    )
    monkeypatch.chdir(tmp_path)
    stored = [line for line in compile_cubin(source, "sm_90").ptx.splitlines() if "mov" in line]
    assert any(line.rstrip().endswith(", 5;") for line in stored), stored


def test_a_compile_leaves_the_threads_locale_as_it_was(monkeypatch, tmp_path):
    """NVRTC 12.4 (torch 2.6's) switched the compiling thread to the C locale and left it so:
    Python's default text encoding in that thread became ASCII after spio's first compile, and
    a user's open() of a UTF-8 file failed. Here NVRTC is made to do that (on any NVRTC); the
    thread's locale, and the encoding Python reads from it, are restored."""
    import ctypes
    import io

    if nvrtc._uselocale() is None:
        pytest.skip("the C library has no uselocale")
    libc = ctypes.CDLL(None)
    libc.newlocale.restype = ctypes.c_void_p
    libc.newlocale.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p]
    c_locale = libc.newlocale(0x1FBF, b"C", None)  # LC_ALL_MASK (glibc's value)
    if not c_locale:
        pytest.skip("newlocale refused glibc's LC_ALL_MASK: another C library")
    lib = nvrtc._lib()
    real = lib.nvrtcCompileProgram

    def compile_and_switch(*args):
        result = real(*args)
        nvrtc._uselocale()(c_locale)  # what NVRTC 12.4 leaves behind
        return result

    def encoding():
        return io.TextIOWrapper(io.BytesIO()).encoding

    monkeypatch.setattr(lib, "nvrtcCompileProgram", compile_and_switch)
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    before, before_encoding = nvrtc._uselocale()(None), encoding()
    try:
        compile_cubin('extern "C" __global__ void k(float *x) { x[0] = 1.0f; }', "sm_80")
        assert nvrtc._uselocale()(None) == before and encoding() == before_encoding
        with nvrtc.thread_locale_kept():  # the fake does switch it: the check above can fail
            nvrtc._uselocale()(c_locale)
            assert nvrtc._uselocale()(None) == c_locale
        assert nvrtc._uselocale()(None) == before
    finally:  # (for the tests after a failure here)
        nvrtc._uselocale()(before)
        libc.freelocale.argtypes = [ctypes.c_void_p]
        libc.freelocale(c_locale)
