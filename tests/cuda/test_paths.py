"""Finding libnvrtc and the CUDA headers: environment overrides, wheel order, conda,
LD_LIBRARY_PATH and the dynamic loader, headers that match the NVRTC found, clear failures."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spio.cuda import paths
from tests.conftest import REPO


def make_wheels(root, majors):
    """Fake NVIDIA wheel folders under root/nvidia for the given CUDA majors."""
    nvidia = root / "nvidia"
    layout = {
        12: ("cuda_nvrtc/lib/libnvrtc.so.12", "cuda_runtime/include"),
        13: ("cu13/lib/libnvrtc.so.13", "cu13/include"),
    }
    for major in majors:
        lib, include = layout[major]
        (nvidia / lib).parent.mkdir(parents=True, exist_ok=True)
        (nvidia / lib).write_bytes(b"")
        (nvidia / include).mkdir(parents=True, exist_ok=True)
        for header in ("cuda.h", "cuda_fp16.h", "cuda_bf16.h"):
            (nvidia / include / header).write_text("")
    return nvidia


ISOLATED_VARS = (
    "SPIO_NVRTC",
    "SPIO_CUDA_INCLUDE",
    "CUDA_HOME",
    "CUDA_PATH",
    "CONDA_PREFIX",
    "LD_LIBRARY_PATH",
)


@pytest.fixture(scope="module")
def real_nvrtc():
    """The libnvrtc this machine has, found before any test hides it."""
    try:
        return paths.find_nvrtc()
    except paths.CudaNotFoundError as error:
        pytest.skip(f"no libnvrtc on this machine: {error}")


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No environment overrides, no wheels but the fake ones we create, and a dynamic loader
    that finds nothing (libnvrtc may already be loaded in this process)."""
    for var in ISOLATED_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "torch_cuda_major", lambda: None)
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [])
    monkeypatch.setattr(paths, "_dlopen_path", lambda name: None)
    monkeypatch.setattr(paths, "_find_library", lambda: None)
    return tmp_path


@pytest.fixture
def no_toolkit(isolated, monkeypatch):
    """Also hide any CUDA toolkit installed on this machine (/usr/local/cuda)."""
    monkeypatch.setattr(paths, "_SYSTEM_TOOLKITS", ())
    return isolated


def install(root, lib_dir, include_dir, real=None, name="libnvrtc.so.12"):
    """A fake NVRTC installation under root: lib_dir/name (a symlink to the real libnvrtc, or an
    empty file) and include_dir/cuda_fp16.h, cuda_bf16.h and cuda.h. Returns the library's
    path."""
    lib = root / lib_dir / name
    lib.parent.mkdir(parents=True, exist_ok=True)
    if real is not None:
        lib.symlink_to(real)
    else:
        lib.write_bytes(b"")
    (root / include_dir).mkdir(parents=True, exist_ok=True)
    for header in ("cuda.h", "cuda_fp16.h", "cuda_bf16.h"):
        (root / include_dir / header).write_text("")
    return lib


def test_cuda12_wheels_come_before_cuda13(isolated, monkeypatch):
    nvidia = make_wheels(isolated, [12, 13])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    assert paths.find_nvrtc() == nvidia / "cuda_nvrtc/lib/libnvrtc.so.12"
    assert paths.find_cuda_include() == nvidia / "cuda_runtime/include"


def test_torch_cuda_major_is_preferred(isolated, monkeypatch):
    nvidia = make_wheels(isolated, [12, 13])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    monkeypatch.setattr(paths, "torch_cuda_major", lambda: 13)
    assert paths.find_nvrtc() == nvidia / "cu13/lib/libnvrtc.so.13"
    assert paths.find_cuda_include(prefer_major=13) == nvidia / "cu13/include"


def test_only_cuda13_wheels(isolated, monkeypatch):
    nvidia = make_wheels(isolated, [13])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    assert paths.find_nvrtc().name == "libnvrtc.so.13"
    assert paths.find_driver_header_dir() == nvidia / "cu13/include"


def _wheels_and_a_custom_folder(isolated, monkeypatch, nvrtc: str):
    """(the CUDA 12 wheels' nvidia folder, found by the search; a folder `custom` beside it
    holding a stand-in libnvrtc named `nvrtc` and the two headers)."""
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    custom = isolated / "custom"
    custom.mkdir()
    (custom / nvrtc).write_bytes(b"")
    (custom / "cuda_fp16.h").write_text("")
    (custom / "cuda_bf16.h").write_text("")
    return nvidia, custom


def test_environment_overrides_win(isolated, monkeypatch):
    _, custom = _wheels_and_a_custom_folder(isolated, monkeypatch, "libnvrtc.so.99")
    monkeypatch.setenv("SPIO_NVRTC", str(custom / "libnvrtc.so.99"))
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(custom))
    assert paths.find_nvrtc() == custom / "libnvrtc.so.99"
    assert paths.find_cuda_include() == custom


def test_a_relative_or_blank_override(isolated, monkeypatch):
    """A relative SPIO_NVRTC is the file in the current folder, by its absolute path (given
    bare, the dynamic loader had searched its own path and could load another NVRTC); a blank
    one is unset, as for every other setting."""
    nvidia, custom = _wheels_and_a_custom_folder(isolated, monkeypatch, "libnvrtc.so.12")
    monkeypatch.chdir(custom)
    monkeypatch.setenv("SPIO_NVRTC", "./libnvrtc.so.12")
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", ".")
    assert paths.find_nvrtc() == custom / "libnvrtc.so.12"
    assert paths.find_cuda_include() == custom
    monkeypatch.setenv("SPIO_NVRTC", " ")
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", "")
    assert paths.find_nvrtc() == nvidia / "cuda_nvrtc/lib/libnvrtc.so.12"
    assert paths.find_cuda_include().parent == nvidia / "cuda_runtime"


def test_an_override_that_does_not_apply_is_an_error(isolated, monkeypatch):
    """Not a silent fall-back to the wheels the override was meant to replace."""
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    monkeypatch.setenv("SPIO_NVRTC", str(isolated / "typo" / "libnvrtc.so.12"))
    with pytest.raises(paths.CudaNotFoundError, match=r"SPIO_NVRTC=.*typo.* is not a file"):
        paths.find_nvrtc()
    monkeypatch.setenv("SPIO_NVRTC", str(isolated))  # a folder
    with pytest.raises(paths.CudaNotFoundError, match="is not a file"):
        paths.find_nvrtc()
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(isolated / "nowhere"))
    with pytest.raises(paths.CudaNotFoundError, match=r"nowhere' is not a folder"):
        paths.find_cuda_include()


def test_the_newest_soname_in_a_folder_wins(tmp_path):
    for name in ("libnvrtc.so.9.2", "libnvrtc.so.12", "libnvrtc.so.12.9.86", "libnvrtc.so"):
        (tmp_path / name).write_bytes(b"")
    assert paths._nvrtc_in(tmp_path).name == "libnvrtc.so.12.9.86"
    (tmp_path / "libnvrtc.so.12.9.86").unlink()
    assert paths._nvrtc_in(tmp_path).name == "libnvrtc.so.12"  # string order picked .so.9.2


def test_a_folder_with_both_majors_gives_torchs(tmp_path, monkeypatch):
    """A folder (LD_LIBRARY_PATH, conda) holding libnvrtc.so.12 and .13 had given the newest
    whatever torch's CUDA, whose driver may not load the newer major's cubins."""
    for name in ("libnvrtc.so.12", "libnvrtc.so.12.9.86", "libnvrtc.so.13"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(paths, "torch_cuda_major", lambda: 12)
    assert paths._nvrtc_in(tmp_path).name == "libnvrtc.so.12.9.86"
    monkeypatch.setattr(paths, "torch_cuda_major", lambda: None)  # CPU torch: the newest
    assert paths._nvrtc_in(tmp_path).name == "libnvrtc.so.13"


def test_another_majors_wheel_headers_come_after_a_toolkits(isolated, monkeypatch):
    """NVRTC 12 without the CUDA 12 runtime wheel, beside a CUDA 13 wheel: its headers, which
    NVRTC 12 fails to compile, had come before CUDA_HOME's toolkit, whose major is unknown."""
    nvidia = make_wheels(isolated, [13])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    monkeypatch.setattr(paths, "_SYSTEM_TOOLKITS", ())
    install(isolated / "toolkit", "lib64", "include")
    monkeypatch.setenv("CUDA_HOME", str(isolated / "toolkit"))
    bare = isolated / "bare" / "libnvrtc.so.12"  # no headers beside it
    bare.parent.mkdir()
    bare.write_bytes(b"")
    assert paths.find_cuda_include(prefer_major=12, nvrtc=bare) == isolated / "toolkit/include"
    assert paths.find_cuda_include(prefer_major=13, nvrtc=bare) == nvidia / "cu13/include"


def test_headers_of_another_major_than_nvrtcs_are_named(tmp_path, monkeypatch, caplog):
    """Compiles then fail inside the headers (NV_IF_ELSE_TARGET undefined), naming neither
    version: a warning at the first compile and a broken install in `spio info` name both."""
    from spio.__main__ import _cuda_headers_summary
    from spio.compiler import compile as compile_module

    (tmp_path / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    assert compile_module.headers_mismatch(tmp_path, (13, 2)) is None
    mismatch = compile_module.headers_mismatch(tmp_path, (12, 9))
    assert "CUDA 13.0's, NVRTC is CUDA 12.9's" in mismatch and "SPIO_CUDA_INCLUDE" in mismatch
    assert "BROKEN INSTALL" in _cuda_headers_summary(tmp_path, 12, 9)
    assert "BROKEN" not in _cuda_headers_summary(tmp_path, 13, 0)
    monkeypatch.setattr(compile_module.nvrtc, "version", lambda: (12, 9))
    monkeypatch.setattr(compile_module.paths, "find_cuda_include", lambda **kw: tmp_path)
    compile_module._cuda_include_dir.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="spio"):
            assert compile_module._cuda_include_dir() == tmp_path
    finally:
        compile_module._cuda_include_dir.cache_clear()
    assert "CUDA 13.0's, NVRTC is CUDA 12.9's" in caplog.text


def test_cuda_home_is_searched_after_the_wheels(isolated, monkeypatch):
    home = isolated / "toolkit"
    (home / "lib64").mkdir(parents=True)
    (home / "lib64" / "libnvrtc.so.12").write_bytes(b"")
    (home / "include").mkdir()
    (home / "include" / "cuda_fp16.h").write_text("")
    (home / "include" / "cuda_bf16.h").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert paths.find_nvrtc() == home / "lib64" / "libnvrtc.so.12"
    assert paths.find_cuda_include() == home / "include"
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    assert paths.find_nvrtc() == nvidia / "cuda_nvrtc/lib/libnvrtc.so.12"


def test_nothing_found_lists_where_it_looked(no_toolkit, monkeypatch):
    isolated = no_toolkit
    nvidia = isolated / "nvidia"
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    monkeypatch.setenv("CUDA_HOME", str(isolated / "toolkit"))
    monkeypatch.setenv("CONDA_PREFIX", str(isolated / "conda"))
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{isolated / 'ld1'}:{isolated / 'ld2'}")
    asked = []
    monkeypatch.setattr(paths, "_dlopen_path", lambda name: asked.append(name))
    with pytest.raises(paths.CudaNotFoundError) as info:
        paths.find_nvrtc()
    message = str(info.value)
    for place in (
        str(nvidia / "cuda_nvrtc" / "lib"),
        str(nvidia / "cu13" / "lib"),
        str(isolated / "toolkit" / "lib64"),
        str(isolated / "toolkit" / "lib"),
        f"{isolated / 'conda' / 'lib'} (conda's CONDA_PREFIX)",
        f"{isolated / 'ld1'} (LD_LIBRARY_PATH)",
        f"{isolated / 'ld2'} (LD_LIBRARY_PATH)",
        "dynamic loader: dlopen of libnvrtc.so.12, libnvrtc.so.13",
        "ctypes.util.find_library('nvrtc')",
    ):
        assert place in message, (place, message)
    assert asked == ["libnvrtc.so.12", "libnvrtc.so.13"]
    for fix in (
        "pip install nvidia-cuda-nvrtc-cu12",
        "set SPIO_NVRTC",
        "CUDA_HOME",
        "LD_LIBRARY_PATH",
    ):
        assert fix in message.split("Looked in")[0], fix
    with pytest.raises(paths.CudaNotFoundError) as info:
        paths.find_cuda_include()
    message = str(info.value)
    for place in (
        str(nvidia / "cuda_runtime" / "include"),
        str(isolated / "toolkit" / "include"),
        str(isolated / "conda" / "include"),
        f"{isolated / 'include'} (LD_LIBRARY_PATH)",
        "dynamic loader",
    ):
        assert place in message, (place, message)
    assert "SPIO_CUDA_INCLUDE" in message and "pip install nvidia-cuda-runtime-cu12" in message
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(isolated / "nowhere"))
    with pytest.raises(paths.CudaNotFoundError, match="nowhere"):
        paths.find_cuda_include()


def test_ld_library_path_folder_is_searched(no_toolkit, monkeypatch, real_nvrtc):
    """A libnvrtc only LD_LIBRARY_PATH points at: CDLL("libnvrtc.so.12") loads it, and
    find_nvrtc raised CudaNotFoundError with an empty "Looked in" list before."""
    lib = install(no_toolkit / "opt" / "nvrtc", "lib", "include", real=real_nvrtc)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{no_toolkit / 'empty'}::{lib.parent}")
    assert paths.find_nvrtc() == lib
    assert paths.find_cuda_include() == no_toolkit / "opt" / "nvrtc" / "include"
    assert paths.find_cuda_include(nvrtc=lib) == no_toolkit / "opt" / "nvrtc" / "include"
    assert paths.find_driver_header_dir() == no_toolkit / "opt" / "nvrtc" / "include"


def test_conda_prefix_is_searched(no_toolkit, monkeypatch, real_nvrtc):
    """conda-forge's layout: $CONDA_PREFIX/lib holds a symlink into targets/x86_64-linux/lib,
    and the headers are under targets/x86_64-linux/include."""
    conda = no_toolkit / "conda"
    target = install(conda, "targets/x86_64-linux/lib", "targets/x86_64-linux/include", real_nvrtc)
    (conda / "lib").mkdir()
    (conda / "lib" / "libnvrtc.so.12").symlink_to(target)
    monkeypatch.setenv("CONDA_PREFIX", str(conda))
    assert paths.find_nvrtc() == conda / "lib" / "libnvrtc.so.12"
    include = conda / "targets" / "x86_64-linux" / "include"
    assert paths.find_cuda_include() == include
    assert paths.find_cuda_include(nvrtc=paths.find_nvrtc()) == include


def test_new_places_come_after_wheels_and_toolkits(isolated, monkeypatch):
    """Wheels, then CUDA_HOME, then CONDA_PREFIX, then LD_LIBRARY_PATH, then the loader."""
    loader = isolated / "loader" / "libnvrtc.so.12"
    loader.parent.mkdir()
    loader.write_bytes(b"")
    monkeypatch.setattr(paths, "_dlopen_path", lambda name: loader)
    assert paths.find_nvrtc() == loader
    ld = install(isolated / "ld", "lib", "include")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(ld.parent))
    assert paths.find_nvrtc() == ld
    conda = install(isolated / "conda", "lib", "include")
    monkeypatch.setenv("CONDA_PREFIX", str(isolated / "conda"))
    assert paths.find_nvrtc() == conda
    home = install(isolated / "toolkit", "lib64", "include")
    monkeypatch.setenv("CUDA_HOME", str(isolated / "toolkit"))
    assert paths.find_nvrtc() == home
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    assert paths.find_nvrtc() == nvidia / "cuda_nvrtc/lib/libnvrtc.so.12"


def test_loader_asks_for_torch_cuda_major_first(no_toolkit, monkeypatch):
    asked = []
    monkeypatch.setattr(paths, "_dlopen_path", lambda name: asked.append(name))
    monkeypatch.setattr(paths, "torch_cuda_major", lambda: 13)
    with pytest.raises(paths.CudaNotFoundError):
        paths.find_nvrtc()
    assert asked == ["libnvrtc.so.13", "libnvrtc.so.12"]


def test_find_library_answer_is_loaded_last(no_toolkit, monkeypatch):
    """An NVRTC of another major that only ldconfig's cache knows, e.g. libnvrtc.so.14."""
    lib = install(no_toolkit / "usr", "lib/x86_64-linux-gnu", "include", name="libnvrtc.so.14")
    monkeypatch.setattr(paths, "_find_library", lambda: "libnvrtc.so.14")
    monkeypatch.setattr(paths, "_dlopen_path", lambda name: lib if name == lib.name else None)
    assert paths.find_nvrtc() == lib
    assert paths.find_cuda_include(nvrtc=lib) == no_toolkit / "usr" / "include"


def test_headers_come_from_the_nvrtc_installation(isolated, monkeypatch):
    """With the NVRTC in use named, its own installation's headers come before a toolkit's."""
    install(isolated / "toolkit", "lib64", "include")
    monkeypatch.setenv("CUDA_HOME", str(isolated / "toolkit"))
    distro = install(isolated / "usr", "lib/x86_64-linux-gnu", "include")
    assert paths.find_cuda_include() == isolated / "toolkit" / "include"
    assert paths.find_cuda_include(nvrtc=distro) == isolated / "usr" / "include"
    # A wheel's libnvrtc pairs with the runtime wheel's headers, not cuda_nvrtc/include.
    nvidia = make_wheels(isolated, [12, 13])
    wheel = nvidia / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    assert paths.includes_beside(wheel)[0] == nvidia / "cuda_runtime" / "include"
    cu13 = nvidia / "cu13" / "lib" / "libnvrtc.so.13"
    assert paths.find_cuda_include(nvrtc=cu13) == nvidia / "cu13" / "include"
    # No headers beside it: the search by CUDA major decides, as before.
    bare = isolated / "bare" / "lib" / "libnvrtc.so.13"
    bare.parent.mkdir(parents=True)
    bare.write_bytes(b"")
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    assert paths.find_cuda_include(prefer_major=13, nvrtc=bare) == nvidia / "cu13" / "include"
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(isolated / "toolkit" / "include"))
    assert paths.find_cuda_include(nvrtc=distro) == isolated / "toolkit" / "include"


def test_dlopen_path_names_the_loaded_file(real_nvrtc):
    # The same file, maybe by another path: a CUDA build of torch loads libnvrtc first, through
    # its RPATH (torch/lib/../../nvidia/cu13/lib/...), and the loader names it so from then on.
    assert paths._dlopen_path(str(real_nvrtc)).samefile(real_nvrtc)
    assert paths._dlopen_path("libnvrtc-no-such-library.so.1") is None
    # The fallback where dlinfo is missing (musl) reads the memory map.
    assert paths._mapped_path(real_nvrtc.resolve().name) == real_nvrtc.resolve()
    assert paths._mapped_path("libnvrtc-no-such-library.so.1") is None


def test_dlopen_path_of_a_library_loaded_first_by_another_path(real_nvrtc):
    """What a CUDA build of torch does at import: libnvrtc loaded through a path with `..` in it
    (its RPATH); asked for the library by its plain path, the loader names the detour."""
    detour = real_nvrtc.parent / ".." / real_nvrtc.parent.name / real_nvrtc.name
    script = (
        f"import ctypes; ctypes.CDLL({str(detour)!r}); "
        f"from spio.cuda import paths; print(paths._dlopen_path({str(real_nvrtc)!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, encoding="utf-8"
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).samefile(real_nvrtc)


def test_dynamic_loader_finds_a_library_only_it_knows(tmp_path, real_nvrtc):
    """A distro package in a folder only the loader searches (here: the LD_LIBRARY_PATH the
    process started with, removed from os.environ): found by dlopen, its real path resolved
    from the handle, its headers in /usr/include's stand-in, and NVRTC loads from there."""
    lib = install(tmp_path / "usr", "lib/x86_64-linux-gnu", "include", real=real_nvrtc)
    script = textwrap.dedent(
        """
        import os
        os.environ.pop("LD_LIBRARY_PATH")
        from spio.cuda import nvrtc, paths
        paths._nvidia_dirs = lambda: []
        paths._SYSTEM_TOOLKITS = ()
        paths.torch_cuda_major = lambda: None
        lib = paths.find_nvrtc()
        print(lib)
        print(paths.find_cuda_include(nvrtc=lib))
        print(paths.find_cuda_include())
        print(nvrtc.library_path() == lib and nvrtc.version()[0] >= 12)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ISOLATED_VARS}
    env["LD_LIBRARY_PATH"] = str(lib.parent)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, encoding="utf-8"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(lib), *[str(tmp_path / "usr" / "include")] * 2, "True"]


def test_torch_cuda_major_reads_the_installed_build():
    # The CPU build of torch in CI has cuda = None; a CUDA build says its version.
    torch = pytest.importorskip("torch")
    expected = int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
    assert paths.torch_cuda_major() == expected


def test_real_installation_is_found():
    lib = paths.find_nvrtc()
    assert lib.is_file() and "nvrtc" in lib.name
    assert (paths.find_cuda_include() / "cuda_fp16.h").is_file()
    assert (paths.bundled_include_dir()).is_dir()


def test_nvrtc_builtins_are_found_beside_libnvrtc(tmp_path):
    """CUDA 13 wheels: libnvrtc dlopens libnvrtc-builtins by soname, but not from its own folder
    ("failed to open libnvrtc-builtins.so.13.0" on the H200, 2026-11-29). spio preloads the
    builtins that sit beside the libnvrtc it loads, never the `.alt` variant."""
    from spio.cuda import nvrtc

    for name in ("libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libnvrtc-builtins.alt.so.13.0",
                 "libnvrtc.alt.so.13", "libcudart.so.13"):  # fmt: skip
        (tmp_path / name).write_bytes(b"")
    found = nvrtc.builtins_beside(tmp_path / "libnvrtc.so.13")
    assert [p.name for p in found] == ["libnvrtc-builtins.so.13.0"]


def test_nvrtc_compiles_with_its_builtins_preloaded():
    """The NVRTC spio finds compiles a program that needs its builtins (a device function with
    math), so the preload above did not break the CUDA 12 wheels' layout either."""
    from spio.compiler import compile_cubin

    source = 'extern "C" __global__ void k(float *x) { x[0] = sinf(x[0]) + __expf(x[1]); }'
    result = compile_cubin(source, "sm_80")
    assert result.cubin[:4] == b"\x7fELF"


def test_relative_places_are_used_by_their_absolute_paths(no_toolkit, monkeypatch):
    """A relative CUDA_HOME (or CUDA_PATH, CONDA_PREFIX, LD_LIBRARY_PATH entry) had been passed
    on relative: after the process changed folder NVRTC read that folder's headers (its -I was
    relative) under the cache key of the first folder's, and the library's builtins were looked
    for there."""
    install(no_toolkit, "cuda/lib64", "cuda/include")
    install(no_toolkit, "conda/lib", "conda/include", name="libnvrtc.so.13")
    monkeypatch.chdir(no_toolkit)
    for var, value, lib in (
        ("CUDA_HOME", "cuda", "cuda/lib64/libnvrtc.so.12"),
        ("CUDA_PATH", "./cuda/../cuda", "cuda/lib64/libnvrtc.so.12"),
        ("CONDA_PREFIX", "conda", "conda/lib/libnvrtc.so.13"),
        ("LD_LIBRARY_PATH", "conda/lib", "conda/lib/libnvrtc.so.13"),
    ):
        monkeypatch.setenv(var, value)
        found = paths.find_nvrtc()
        assert found == no_toolkit / lib and found.is_absolute()
        include = paths.find_cuda_include()
        assert include == no_toolkit / lib.split("/")[0] / "include" and include.is_absolute()
        monkeypatch.delenv(var)


def test_an_include_override_that_is_a_file_says_so(isolated, monkeypatch):
    header = isolated / "cuda_fp16.h"
    header.write_text("")
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(header))
    with pytest.raises(paths.CudaNotFoundError, match=r"cuda_fp16.h' is not a folder"):
        paths.find_cuda_include()


def test_an_include_override_without_the_header_is_an_error(isolated, monkeypatch):
    """SPIO_CUDA_INCLUDE names an existing folder that lacks cuda_fp16.h: an error too, not
    that folder (NVRTC would then fail far from the cause)."""
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    empty = isolated / "empty"
    empty.mkdir()
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(empty))
    with pytest.raises(paths.CudaNotFoundError, match=r"empty' holds no cuda_fp16.h"):
        paths.find_cuda_include()


def test_headers_without_cuda_bf16_are_no_kernel_headers(isolated, monkeypatch):
    """Every kernel includes cuda_bf16.h as well as cuda_fp16.h: a folder with only the latter
    (an override, or a place searched) is not the kernels' headers, where it had passed `spio
    info` and then failed every compile with an NVRTC error far from the cause."""
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    half = isolated / "half"
    half.mkdir()
    (half / "cuda_fp16.h").write_text("")
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(half))
    with pytest.raises(
        paths.CudaNotFoundError,
        match=r"half' holds no cuda_bf16.h\. Set it to the CUDA include folder that holds "
        r"cuda_fp16.h and cuda_bf16.h",
    ):
        paths.find_cuda_include()
    monkeypatch.delenv("SPIO_CUDA_INCLUDE")
    home = isolated / "toolkit"  # searched after the wheels, whose headers lack cuda_bf16.h
    (home / "include").mkdir(parents=True)
    for header in ("cuda_fp16.h", "cuda_bf16.h"):
        (home / "include" / header).write_text("")
    monkeypatch.setenv("CUDA_HOME", str(home))
    (nvidia / "cuda_runtime" / "include" / "cuda_bf16.h").unlink()
    assert paths.find_cuda_include() == home / "include"


def test_cuda_home_comes_before_cuda_path_and_lib64_before_lib(no_toolkit, monkeypatch):
    home = install(no_toolkit / "home", "lib64", "include")
    install(no_toolkit / "home", "lib", "include")
    other = install(no_toolkit / "path", "lib64", "include")
    monkeypatch.setenv("CUDA_PATH", str(no_toolkit / "path"))
    assert paths.find_nvrtc() == other
    monkeypatch.setenv("CUDA_HOME", str(no_toolkit / "home"))
    assert paths.find_nvrtc() == home


def test_headers_beside_the_target_of_a_symlinked_libnvrtc(no_toolkit):
    """A distro folder's libnvrtc symlinked into a toolkit: the toolkit's headers are its own."""
    target = install(no_toolkit / "opt" / "cuda", "lib64", "include")
    link = no_toolkit / "usr" / "lib" / "libnvrtc.so.12"
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    assert paths.find_cuda_include(nvrtc=link) == no_toolkit / "opt" / "cuda" / "include"


def test_the_builtins_library_is_not_taken_for_libnvrtc(tmp_path):
    for name in ("libnvrtc.so.12", "libnvrtc-builtins.so.12.9", "libnvrtc.alt.so.13"):
        (tmp_path / name).write_bytes(b"")
    assert paths._nvrtc_in(tmp_path).name == "libnvrtc.so.12"


@pytest.mark.parametrize(
    "define,version",
    [("#define CUDA_VERSION 12020", (12, 2)), ("#define CUDA_VERSION 13050", (13, 5)), ("", None)],
)
def test_the_headers_cuda_version_is_read_from_cuda_h(tmp_path, define, version):
    (tmp_path / "cuda.h").write_text(f"#ifndef __cuda_cuda_h__\n{define}\n#endif\n")
    assert paths.cuda_headers_version(tmp_path) == version
    assert paths.cuda_headers_version(tmp_path / "missing") is None


def test_the_installed_headers_are_of_nvrtcs_cuda_major():
    from spio.cuda import nvrtc

    major, _ = nvrtc.version()
    version = paths.cuda_headers_version(paths.find_cuda_include(prefer_major=major))
    assert version is not None and version[0] == major
