"""Fixtures for the header-library tests: building and running the host C++ tests with g++."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from spio.cuda import paths
from spio.emulator.build import RUNTIME_DIR

HOST_DIR = Path(__file__).resolve().parent / "host"


@pytest.fixture(scope="session")
def cuda_include() -> Path:
    try:
        return paths.find_cuda_include()
    except paths.CudaNotFoundError as error:
        pytest.skip(f"CUDA headers not found: {error}")


@pytest.fixture(scope="session")
def host_cxx() -> str:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++ on this machine")
    return cxx


@pytest.fixture
def build_and_run(host_cxx, cuda_include, tmp_path):
    """Build host/<name>.cpp with g++ -std=c++17 against spio/include, run it, return its stdout.

    Fails the test with the compiler output or the program output when either step fails.
    """

    def run(name: str, defines: tuple[str, ...] = ()) -> str:
        exe = tmp_path / name
        cmd = [
            host_cxx,
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            # CUDA's own headers trip some warnings; keep them out of -Werror.
            f"-isystem{cuda_include}",
            # The emulator's stand-ins for crt/host_defines.h and <nv/target>, which the pip
            # wheels lack (after the real include dirs, so a full toolkit's headers win).
            "-idirafter",
            str(RUNTIME_DIR / "shim"),
            f"-I{paths.bundled_include_dir()}",
            f"-I{HOST_DIR}",
            *[f"-D{d}" for d in defines],
            str(HOST_DIR / f"{name}.cpp"),
            "-o",
            str(exe),
        ]
        built = subprocess.run(cmd, capture_output=True, encoding="utf-8")
        if built.returncode != 0:
            pytest.fail(f"g++ failed for {name}.cpp:\n{built.stderr}")
        ran = subprocess.run([str(exe)], capture_output=True, encoding="utf-8", timeout=60)
        if ran.returncode != 0:
            pytest.fail(f"{name} failed (exit {ran.returncode}):\n{ran.stdout}\n{ran.stderr}")
        return ran.stdout

    return run
