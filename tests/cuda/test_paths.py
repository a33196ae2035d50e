"""Finding libnvrtc and the CUDA headers: environment overrides, wheel order, clear failures."""

import pytest

from spio.cuda import paths


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
        for header in ("cuda.h", "cuda_fp16.h"):
            (nvidia / include / header).write_text("")
    return nvidia


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No environment overrides, no toolkit, and only the fake wheels we create."""
    for var in ("SPIO_NVRTC", "SPIO_CUDA_INCLUDE", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "torch_cuda_major", lambda: None)
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [])
    return tmp_path


@pytest.fixture
def no_toolkit(isolated, monkeypatch):
    """Also hide any CUDA toolkit installed on this machine (/usr/local/cuda)."""
    real_candidates = paths._candidates
    monkeypatch.setattr(
        paths, "_candidates", lambda: [c for c in real_candidates() if c.major is not None]
    )
    return isolated


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


def test_environment_overrides_win(isolated, monkeypatch):
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    custom = isolated / "custom"
    custom.mkdir()
    (custom / "libnvrtc.so.99").write_bytes(b"")
    (custom / "cuda_fp16.h").write_text("")
    monkeypatch.setenv("SPIO_NVRTC", str(custom / "libnvrtc.so.99"))
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(custom))
    assert paths.find_nvrtc() == custom / "libnvrtc.so.99"
    assert paths.find_cuda_include() == custom


def test_cuda_home_is_searched_after_the_wheels(isolated, monkeypatch):
    home = isolated / "toolkit"
    (home / "lib64").mkdir(parents=True)
    (home / "lib64" / "libnvrtc.so.12").write_bytes(b"")
    (home / "include").mkdir()
    (home / "include" / "cuda_fp16.h").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert paths.find_nvrtc() == home / "lib64" / "libnvrtc.so.12"
    assert paths.find_cuda_include() == home / "include"
    nvidia = make_wheels(isolated, [12])
    monkeypatch.setattr(paths, "_nvidia_dirs", lambda: [nvidia])
    assert paths.find_nvrtc() == nvidia / "cuda_nvrtc/lib/libnvrtc.so.12"


def test_nothing_found_lists_where_it_looked(no_toolkit, monkeypatch):
    isolated = no_toolkit
    monkeypatch.setenv("SPIO_NVRTC", str(isolated / "missing.so"))
    with pytest.raises(paths.CudaNotFoundError) as info:
        paths.find_nvrtc()
    message = str(info.value)
    assert "missing.so" in message and "pip install nvidia-cuda-nvrtc-cu12" in message
    monkeypatch.setenv("SPIO_CUDA_INCLUDE", str(isolated / "nowhere"))
    with pytest.raises(paths.CudaNotFoundError, match="nowhere"):
        paths.find_cuda_include()


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
