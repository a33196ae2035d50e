"""Fixtures for generator tests: build generated headers with the host C++ compiler and run them."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

_STUB = Path(__file__).with_name("fragments_stub.h")
# The real fragment contract the generated headers include (the tests that read its types).
FRAGMENTS_H = REPO / "spio/include/spio/warp/fragments.h"


def _host_cuda_include() -> Path | None:
    """A CUDA include folder whose cuda_fp16.h compiles with g++ (it needs crt/host_defines.h).

    NVIDIA's runtime pip wheel lacks crt/, so a toolkit's include folder is usually needed.
    """
    from spio.cuda import paths

    candidates = [os.environ.get("SPIO_CUDA_INCLUDE")]
    try:
        candidates.append(str(paths.find_cuda_include()))
    except paths.CudaNotFoundError:
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(os.path.join(home, "include"))
    for folder in candidates:
        if folder and all(
            (Path(folder) / f).is_file() for f in ("cuda_fp16.h", "crt/host_defines.h")
        ):
            return Path(folder)
    return None


@dataclass(frozen=True)
class HostCxx:
    """Writes headers and a main program to a temp folder, builds with g++ -std=c++17, runs it."""

    compiler: str
    folder: Path
    cuda_include: Path | None

    def run(self, program: str, headers: dict[str, str], cuda: bool = False) -> str:
        """Compile and run `program` with `headers` on the include path; return its stdout.

        `cuda=True` puts the CUDA headers on the path (skips when none compile on the host).
        spio/warp/fragments.h is the test stub of the fragment contract.
        """
        work = Path(tempfile.mkdtemp(dir=self.folder))
        include = work / "include"
        (include / "spio" / "warp").mkdir(parents=True, exist_ok=True)
        shutil.copy(_STUB, include / "spio" / "warp" / "fragments.h")
        for name, text in headers.items():
            (include / name).write_text(text)
        source = work / "main.cpp"
        source.write_text(program)
        exe = work / "main"
        cmd = [
            self.compiler,
            "-std=c++17",
            "-O0",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
            str(include),
        ]
        if cuda:
            if self.cuda_include is None:
                pytest.skip("no CUDA headers that compile with the host compiler (need crt/)")
            cmd += ["-isystem", str(self.cuda_include)]
        build = subprocess.run(
            [*cmd, str(source), "-o", str(exe)], capture_output=True, encoding="utf-8"
        )
        assert build.returncode == 0, f"g++ failed:\n{build.stderr}\n--- program ---\n{program}"
        result = subprocess.run([str(exe)], capture_output=True, encoding="utf-8", timeout=60)
        assert result.returncode == 0, f"program failed ({result.returncode}):\n{result.stderr}"
        return result.stdout

    def values(self, program: str, headers: dict[str, str], cuda: bool = False) -> dict[str, int]:
        """Like run(), parsing the program's 'key value' output lines into a dict."""
        out = {}
        for line in self.run(program, headers, cuda).splitlines():
            key, value = line.rsplit(" ", 1)
            assert key not in out, f"program printed {key!r} twice"
            out[key] = int(value)
        return out

    def printed(
        self,
        headers: dict[str, str],
        body: list[str],
        preamble: tuple[str, ...] = (),
        cuda: bool = False,
    ) -> dict[str, int]:
        """values() of a program that includes `headers`, then the `preamble` lines, and runs
        `body` in main(), whose lines print integers with P("key", value)."""
        program = "\n".join(
            [
                *(f'#include "{name}"' for name in headers),
                "#include <cstdio>",
                *preamble,
                "template <typename T> void P(const char *k, T v) {",
                '  std::printf("%s %lld\\n", k, static_cast<long long>(v));',
                "}",
                "int main() {",
                *body,
                "}",
            ]
        )
        return self.values(program, headers, cuda)


@pytest.fixture(scope="session")
def cxx(tmp_path_factory) -> HostCxx:
    """A host C++ compiler runner; skips when no g++ is installed."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        pytest.skip("needs a host C++ compiler (g++)")
    return HostCxx(compiler, tmp_path_factory.mktemp("cxx"), _host_cuda_include())
