"""Find libnvrtc and the CUDA headers without a CUDA toolkit.

Search order, for both the library and the include folder:
1. the SPIO_NVRTC / SPIO_CUDA_INCLUDE environment variables;
2. NVIDIA's CUDA 12 pip wheels (nvidia/cuda_nvrtc/lib, nvidia/cuda_runtime/include);
3. NVIDIA's CUDA 13 pip wheels (nvidia/cu13/lib, nvidia/cu13/include);
4. CUDA_HOME, then /usr/local/cuda.
When a CUDA build of torch is installed, the wheels of torch's CUDA major version come first.

This module uses only the standard library: setup.py loads it by file path to find cuda.h.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path


class CudaNotFoundError(FileNotFoundError):
    """Raised when NVRTC or the CUDA headers cannot be found; the message lists where we looked."""


@dataclass(frozen=True)
class _Candidate:
    major: int | None  # CUDA major version of this location, None when unknown
    lib: Path  # a folder holding libnvrtc
    include: Path  # a folder holding the CUDA headers
    origin: str  # where the candidate came from, for messages


def _nvidia_dirs() -> list[Path]:
    """Every folder named 'nvidia' that holds NVIDIA's pip wheels, in sys.path order."""
    found: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    locations = list(spec.submodule_search_locations or []) if spec else []
    locations += [os.path.join(p, "nvidia") for p in sys.path if p]
    for loc in locations:
        path = Path(loc)
        if path.is_dir() and path.resolve() not in [f.resolve() for f in found]:
            found.append(path)
    return found


def torch_cuda_major() -> int | None:
    """CUDA major version of the installed torch build, read without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+)\.", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _candidates() -> list[_Candidate]:
    cands: list[_Candidate] = []
    for nvidia in _nvidia_dirs():
        cands.append(
            _Candidate(
                12,
                nvidia / "cuda_nvrtc" / "lib",
                nvidia / "cuda_runtime" / "include",
                f"CUDA 12 wheels in {nvidia}",
            )
        )
        cands.append(
            _Candidate(
                13,
                nvidia / "cu13" / "lib",
                nvidia / "cu13" / "include",
                f"CUDA 13 wheels in {nvidia}",
            )
        )
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in dict.fromkeys(h for h in homes if h):
        root = Path(home)
        for lib in ("lib64", "lib"):
            cands.append(_Candidate(None, root / lib, root / "include", f"toolkit at {root}"))
    preferred = torch_cuda_major()
    if preferred is not None:
        # Stable sort: torch's CUDA major first, everything else keeps its order.
        cands.sort(key=lambda c: 0 if c.major == preferred else 1)
    return cands


_NVRTC_NAME = re.compile(r"^libnvrtc\.so(\.\d+)*$")


def _nvrtc_in(folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    names = sorted((p for p in folder.iterdir() if _NVRTC_NAME.match(p.name)), key=lambda p: p.name)
    return names[-1] if names else None


def find_nvrtc() -> Path:
    """Path of libnvrtc to load; raises CudaNotFoundError listing every place searched."""
    looked: list[str] = []
    env = os.environ.get("SPIO_NVRTC")
    if env:
        if Path(env).is_file():
            return Path(env)
        looked.append(f"SPIO_NVRTC={env} (no such file)")
    for cand in _candidates():
        lib = _nvrtc_in(cand.lib)
        if lib is not None:
            return lib
        looked.append(f"{cand.lib} ({cand.origin})")
    raise CudaNotFoundError(
        "libnvrtc not found. Install it with `pip install nvidia-cuda-nvrtc-cu12` or set "
        "SPIO_NVRTC to the library's path. Looked in:\n  " + "\n  ".join(looked)
    )


def _find_include(required: str, prefer_major: int | None) -> Path:
    looked: list[str] = []
    env = os.environ.get("SPIO_CUDA_INCLUDE")
    if env:
        if (Path(env) / required).is_file():
            return Path(env)
        looked.append(f"SPIO_CUDA_INCLUDE={env} (no {required} there)")
    cands = _candidates()
    if prefer_major is not None:
        cands.sort(key=lambda c: 0 if c.major == prefer_major else 1)
    for cand in cands:
        if (cand.include / required).is_file():
            return cand.include
        looked.append(f"{cand.include} ({cand.origin})")
    raise CudaNotFoundError(
        f"CUDA headers ({required}) not found. Install them with "
        "`pip install nvidia-cuda-runtime-cu12` or set SPIO_CUDA_INCLUDE. Looked in:\n  "
        + "\n  ".join(looked)
    )


def find_cuda_include(prefer_major: int | None = None) -> Path:
    """Folder holding cuda_fp16.h and friends for NVRTC, preferably of CUDA `prefer_major`."""
    return _find_include("cuda_fp16.h", prefer_major)


def find_driver_header_dir() -> Path:
    """Folder holding cuda.h, for building the driver extension."""
    return _find_include("cuda.h", None)


def bundled_include_dir() -> Path:
    """spio's own header library (spio/include)."""
    return Path(__file__).resolve().parent.parent / "include"
