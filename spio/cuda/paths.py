"""Find libnvrtc and the CUDA headers without a CUDA toolkit.

Search order, for both the library and the include folder:
1. the SPIO_NVRTC / SPIO_CUDA_INCLUDE environment variables;
2. NVIDIA's CUDA 12 pip wheels (nvidia/cuda_nvrtc/lib, nvidia/cuda_runtime/include);
3. NVIDIA's CUDA 13 pip wheels (nvidia/cu13/lib, nvidia/cu13/include);
4. CUDA_HOME, CUDA_PATH, then /usr/local/cuda;
5. conda's $CONDA_PREFIX/lib (headers in $CONDA_PREFIX/include or targets/*/include);
6. the folders on LD_LIBRARY_PATH;
7. the dynamic loader itself: dlopen of libnvrtc.so.12 / libnvrtc.so.13, then
   ctypes.util.find_library("nvrtc"). This finds distro packages (/usr/lib/x86_64-linux-gnu) and
   the LD_LIBRARY_PATH the process started with; the loaded handle tells the library's real path.
When a CUDA build of torch is installed, the places of torch's CUDA major version come first.
The headers for a libnvrtc found in steps 5-7 are those of its own installation: the include
folder beside its lib folder (see `includes_beside`).

This module uses only the standard library: setup.py loads it by file path to find cuda.h.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    from .. import env
except ImportError:  # loaded by file, as setup.py does (not to import spio): env.py by file too
    import importlib.util as _util

    _spec = _util.spec_from_file_location("_spio_env", Path(__file__).parent.parent / "env.py")
    assert _spec is not None and _spec.loader is not None
    env = _util.module_from_spec(_spec)
    _spec.loader.exec_module(env)


class CudaNotFoundError(FileNotFoundError):
    """Raised when NVRTC or the CUDA headers cannot be found; the message lists where we looked."""


@dataclass(frozen=True)
class _Candidate:
    major: int | None  # CUDA major version of this location, None when unknown
    lib: Path  # a folder holding libnvrtc
    includes: tuple[Path, ...]  # folders that may hold the CUDA headers, in order
    origin: str  # where the candidate came from, for messages


#: Toolkits searched after CUDA_HOME and CUDA_PATH (tests empty it to hide this machine's).
_SYSTEM_TOOLKITS: tuple[str, ...] = ("/usr/local/cuda",)

_NVRTC_NAME = re.compile(r"^libnvrtc\.so(\.\d+)*$")

#: The sonames the dynamic loader is asked for, in this order after torch's CUDA major.
_LOADER_SONAMES = ("libnvrtc.so.12", "libnvrtc.so.13")

_HOW_TO_FIX_NVRTC = (
    "Install it with `pip install nvidia-cuda-nvrtc-cu12`, set SPIO_NVRTC to the library's path, "
    "set CUDA_HOME to a CUDA toolkit, or add the folder holding libnvrtc.so to LD_LIBRARY_PATH."
)


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
        text = version_file.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+)\.", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _includes_for_lib_folder(folder: Path) -> list[Path]:
    """Include folders of the installation whose libraries sit in `folder`.

    A wheel's nvidia/cuda_nvrtc/lib pairs with nvidia/cuda_runtime/include; a toolkit's or conda's
    <root>/lib[64] with <root>/include and <root>/targets/*/include; a distro's multiarch folder
    /usr/lib/x86_64-linux-gnu with /usr/include.
    """
    root = folder.parent
    found = []
    if root.name == "cuda_nvrtc":
        found.append(root.parent / "cuda_runtime" / "include")
    found.append(root / "include")
    found += sorted((root / "targets").glob("*/include"))
    if root.name in ("lib", "lib64"):
        found.append(root.parent / "include")
    return found


def includes_beside(nvrtc: Path) -> list[Path]:
    """Include folders that belong to the installation of the libnvrtc at `nvrtc`, best first.

    Both the path as given and its symlink-resolved target are considered, so a conda
    $CONDA_PREFIX/lib symlink into targets/x86_64-linux/lib finds that target's headers too.
    """
    folders = dict.fromkeys([nvrtc.parent, nvrtc.resolve().parent])
    found = [inc for folder in folders for inc in _includes_for_lib_folder(folder)]
    return list(dict.fromkeys(found))


def _candidates() -> list[_Candidate]:
    """The fixed places to search (steps 2-6 of the module docstring), torch's CUDA major first."""
    cands: list[_Candidate] = []
    for nvidia in _nvidia_dirs():
        cands.append(
            _Candidate(
                12,
                nvidia / "cuda_nvrtc" / "lib",
                (nvidia / "cuda_runtime" / "include",),
                f"CUDA 12 wheels in {nvidia}",
            )
        )
        cands.append(
            _Candidate(
                13,
                nvidia / "cu13" / "lib",
                (nvidia / "cu13" / "include",),
                f"CUDA 13 wheels in {nvidia}",
            )
        )
    # Each place by its absolute path, as the SPIO_* paths are: a relative one had been passed
    # on relative (the library, NVRTC's -I), so that a change of the current folder made NVRTC
    # read other headers than those the cubin cache's key had identified.
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *_SYSTEM_TOOLKITS]
    for home in dict.fromkeys(h for h in homes if h):
        root = _absolute(home)
        for sub in ("lib64", "lib"):
            cands.append(_Candidate(None, root / sub, (root / "include",), f"toolkit at {root}"))
    conda = os.environ.get("CONDA_PREFIX")
    lib_folders = [(_absolute(conda) / "lib", "conda's CONDA_PREFIX")] if conda else []
    lib_folders += [
        (_absolute(entry), "LD_LIBRARY_PATH")
        for entry in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
        if entry
    ]
    for lib, what in lib_folders:
        cands.append(_Candidate(None, lib, tuple(_includes_for_lib_folder(lib)), what))
    preferred = torch_cuda_major()
    if preferred is not None:
        # Stable sort: torch's CUDA major first, everything else keeps its order.
        cands.sort(key=lambda c: 0 if c.major == preferred else 1)
    return cands


def _absolute(path: str | os.PathLike) -> Path:
    """`path` made absolute against the current folder (`..` resolved, symlinks kept)."""
    return Path(os.path.abspath(path))


def _nvrtc_in(folder: Path) -> Path | None:
    """The newest libnvrtc in `folder`, of torch's CUDA major where the folder holds one."""
    if not folder.is_dir():
        return None
    names = [p for p in folder.iterdir() if _NVRTC_NAME.match(p.name)]
    preferred = torch_cuda_major() if len(names) > 1 else None
    return max(names, key=lambda p: (_soname_version(p)[:1] == (preferred,), _soname_version(p)),
               default=None)  # fmt: skip


def _soname_version(path: Path) -> tuple[int, ...]:
    """(12, 9, 86) for libnvrtc.so.12.9.86: compared as numbers, so .so.12 is newer than .so.9.2."""
    return tuple(int(part) for part in path.name.split(".so")[1].split(".") if part)


class _LinkMap(ctypes.Structure):
    """The head of glibc's struct link_map: the load address and the file's path."""

    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


_RTLD_DI_LINKMAP = 2


def _path_of_handle(handle: int, name: str) -> Path | None:
    """The file behind a dlopen handle: dlinfo(RTLD_DI_LINKMAP), else /proc/self/maps."""
    try:
        dlinfo = ctypes.CDLL(None).dlinfo
        dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        dlinfo.restype = ctypes.c_int
        link_map = ctypes.POINTER(_LinkMap)()
        if dlinfo(handle, _RTLD_DI_LINKMAP, ctypes.byref(link_map)) == 0 and link_map:
            if link_map.contents.l_name:
                return Path(os.fsdecode(link_map.contents.l_name))
    except (AttributeError, OSError):  # no dlinfo (musl): read the memory map instead
        pass
    return _mapped_path(Path(name).name)


def _mapped_path(file_name: str) -> Path | None:
    """The first file named `file_name` mapped into this process, from /proc/self/maps."""
    try:
        # surrogateescape: a path that is not UTF-8 comes back as the same bytes.
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="surrogateescape")
        lines = maps.splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and Path(fields[5]).name == file_name:
            return Path(fields[5])
    return None


def _dlopen_path(name: str) -> Path | None:
    """Where the dynamic loader finds library `name` (a soname or a path), or None.

    The library stays loaded, as a later ctypes.CDLL of the same file would load it anyway.
    """
    try:
        handle = ctypes.CDLL(name)._handle
    except OSError:
        return None
    path = _path_of_handle(handle, name)
    return _absolute(path) if path is not None and path.is_file() else None


def _find_library() -> str | None:
    """ctypes.util.find_library("nvrtc"): a soname from ld.so.cache, gcc or ld's search path."""
    return ctypes.util.find_library("nvrtc")


def _ask_loader(looked: list[str]) -> Path | None:
    """libnvrtc as the dynamic loader finds it (step 7), appending what was tried to `looked`."""
    preferred = torch_cuda_major()
    first = [f"libnvrtc.so.{preferred}"] if preferred is not None else []
    sonames = list(dict.fromkeys(first + list(_LOADER_SONAMES)))
    for soname in sonames:
        path = _dlopen_path(soname)
        if path is not None:
            return path
    looked.append(
        f"dynamic loader: dlopen of {', '.join(sonames)} (ld.so.cache, system folders and the "
        "LD_LIBRARY_PATH this process started with) found nothing"
    )
    name = _find_library()
    if name is not None and name not in sonames:
        path = _dlopen_path(name)
        if path is not None:
            return path
    looked.append(f"ctypes.util.find_library('nvrtc') (answered {name!r})")
    return None


def find_nvrtc() -> Path:
    """Path of libnvrtc to load; raises CudaNotFoundError listing every place searched."""
    looked: list[str] = []
    chosen = env.path("SPIO_NVRTC")
    if chosen is not None:
        if chosen.is_file():
            return chosen
        raise CudaNotFoundError(  # an override that does not apply must not pass unnoticed
            f"{env.path_shown('SPIO_NVRTC')} is not a file. Set it to the path of "
            "libnvrtc.so.12 or .13, or unset it to let spio search its usual places"
        )
    for cand in _candidates():
        lib = _nvrtc_in(cand.lib)
        if lib is not None:
            return lib
        looked.append(f"{cand.lib} ({cand.origin})")
    lib = _ask_loader(looked)
    if lib is not None:
        return lib
    raise CudaNotFoundError(
        f"libnvrtc not found. {_HOW_TO_FIX_NVRTC} Looked in:\n  " + "\n  ".join(looked)
    )


def _find_include(
    headers: tuple[str, ...], prefer_major: int | None, nvrtc: Path | None = None
) -> Path:
    """The first folder holding every one of `headers` (SPIO_CUDA_INCLUDE, where set, or
    none), searched as find_cuda_include says."""

    def has_all(folder: Path) -> bool:
        return all((folder / header).is_file() for header in headers)

    required = " and ".join(headers)
    chosen = env.path("SPIO_CUDA_INCLUDE")
    if chosen is not None:
        if has_all(chosen):
            return chosen
        missing = ", ".join(h for h in headers if not (chosen / h).is_file())
        problem = "is not a folder" if not chosen.is_dir() else f"holds no {missing}"
        raise CudaNotFoundError(
            f"{env.path_shown('SPIO_CUDA_INCLUDE')} {problem}. Set it to the CUDA include folder "
            f"that holds {required}, or unset it to let spio search its usual places"
        )
    looked: list[str] = []
    cands = _candidates()
    if prefer_major is not None:
        # Stable sort: the preferred major's, then those of an unknown major (toolkits), last
        # another major's wheels (whose headers NVRTC of the preferred major fails to compile).
        cands.sort(key=lambda c: 0 if c.major == prefer_major else 1 if c.major is None else 2)

    def places():
        if nvrtc is not None:
            yield from ((inc, f"beside {nvrtc}") for inc in includes_beside(nvrtc))
        for cand in cands:
            yield from ((inc, cand.origin) for inc in cand.includes)
        if nvrtc is None:  # last, the headers of the libnvrtc the dynamic loader finds
            loaded = _ask_loader(looked)
            if loaded is not None:
                origin = f"beside {loaded}, found by the dynamic loader"
                yield from ((inc, origin) for inc in includes_beside(loaded))

    seen: set[Path] = set()
    for include, origin in places():
        if include in seen:
            continue
        seen.add(include)
        if has_all(include):
            return include
        looked.append(f"{include} ({origin})")
    raise CudaNotFoundError(
        f"CUDA headers ({required}) not found. Install them with "
        "`pip install nvidia-cuda-runtime-cu12`, set SPIO_CUDA_INCLUDE to the folder holding "
        f"{required}, or set CUDA_HOME to a CUDA toolkit. Looked in:\n  " + "\n  ".join(looked)
    )


def find_cuda_include(prefer_major: int | None = None, nvrtc: Path | None = None) -> Path:
    """Folder holding cuda_fp16.h and cuda_bf16.h (the kernels include both) for NVRTC,
    preferably of CUDA `prefer_major`.

    With `nvrtc`, the path of the libnvrtc in use, the headers of its own installation come first
    (after SPIO_CUDA_INCLUDE), so a libnvrtc from conda or the loader is paired with its headers.
    """
    return _find_include(("cuda_fp16.h", "cuda_bf16.h"), prefer_major, nvrtc)


def cuda_headers_version(folder: Path) -> tuple[int, int] | None:
    """The CUDA version of the headers in `folder`, from the CUDA_VERSION its cuda.h defines
    (12020 is (12, 2)); None where there is no cuda.h or it defines none."""
    try:
        with open(folder / "cuda.h", encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 16)  # the define is near the top (line 240 in CUDA 12.0)
    except OSError:
        return None
    match = re.search(r"^#define CUDA_VERSION (\d+)", head, re.MULTILINE)
    if match is None:
        return None
    number = int(match.group(1))
    return number // 1000, number % 1000 // 10


def find_driver_header_dir() -> Path:
    """Folder holding cuda.h, for building the driver extension."""
    return _find_include(("cuda.h",), None)


def bundled_include_dir() -> Path:
    """spio's own header library (spio/include)."""
    return Path(__file__).resolve().parent.parent / "include"
