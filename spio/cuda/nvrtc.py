"""NVRTC through ctypes: compile CUDA C++ to cubin and PTX without a CUDA toolkit.

The library is found by spio.cuda.paths and loaded on first use, never at import time.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import env
from . import paths


class NvrtcError(RuntimeError):
    """An NVRTC call other than compilation failed."""


class CompileError(RuntimeError):
    """NVRTC rejected a program; `.log` holds the compiler's full log, `.arch` the target
    (where the caller said it: spio.compiler's compile_cubin does)."""

    def __init__(self, name: str, log: str, result: str = "", arch: str = ""):
        said = f" ({result})" if result else ""
        target = f" for {arch}" if arch else ""
        super().__init__(
            f"NVRTC failed to compile {name}{target}{said}:\n{log.strip() or '(no log)'}"
        )
        self.name = name
        self.log = log
        self.result = result
        self.arch = arch

    def __reduce__(self):  # picklable, so compile pool workers can return it
        return (CompileError, (self.name, self.log, self.result, self.arch))


@dataclass(frozen=True)
class NvrtcOutput:
    """What one successful compilation produced."""

    cubin: bytes
    ptx: str
    log: str


_lock = threading.Lock()


@functools.cache
def library_path() -> Path:
    """The libnvrtc that spio loads (see spio.cuda.paths for the search order)."""
    return paths.find_nvrtc()


_BUILTINS_NAME = re.compile(r"^libnvrtc-builtins\.so(\.\d+)*$")


def builtins_beside(nvrtc: Path) -> list[Path]:
    """The libnvrtc-builtins libraries in libnvrtc's own folder (not the `.alt` variants)."""
    folder = nvrtc.resolve().parent
    return sorted(p for p in folder.iterdir() if _BUILTINS_NAME.match(p.name))


def how_to_mend_loading() -> str:
    """What to do about a libnvrtc that was found but does not load: reinstall it, or, where
    SPIO_NVRTC chose it, choose another."""
    if env.path("SPIO_NVRTC") is not None:
        return "set SPIO_NVRTC to a working libnvrtc.so.12 or .13, or unset it"
    return "reinstall it (`pip install nvidia-cuda-nvrtc-cu12`), or set SPIO_NVRTC to another"


@functools.cache
def _lib() -> ctypes.CDLL:
    path = library_path()
    try:
        return _load(path)
    except (OSError, AttributeError) as error:  # not a library, or not NVRTC (a missing symbol)
        raise NvrtcError(
            f"{path} was found but cannot be loaded as NVRTC ({error}); {how_to_mend_loading()}"
        ) from error


def _load(path: Path) -> ctypes.CDLL:
    with _lock:
        # libnvrtc dlopens libnvrtc-builtins by soname when it compiles. The CUDA 13 wheels do
        # not put their lib folder on its search path ("failed to open libnvrtc-builtins.so.13.0"),
        # so load the builtins from libnvrtc's folder first: dlopen then finds them by soname.
        for builtins in builtins_beside(path):
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(str(path))
    c_char_pp = ctypes.POINTER(ctypes.c_char_p)
    prog_p = ctypes.POINTER(ctypes.c_void_p)
    size_p = ctypes.POINTER(ctypes.c_size_t)
    signatures = {
        "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
        "nvrtcCreateProgram": [
            prog_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int,
            c_char_pp,
            c_char_pp,
        ],
        "nvrtcDestroyProgram": [prog_p],
        "nvrtcCompileProgram": [ctypes.c_void_p, ctypes.c_int, c_char_pp],
        "nvrtcGetProgramLogSize": [ctypes.c_void_p, size_p],
        "nvrtcGetProgramLog": [ctypes.c_void_p, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [ctypes.c_void_p, size_p],
        "nvrtcGetCUBIN": [ctypes.c_void_p, ctypes.c_char_p],
        "nvrtcGetPTXSize": [ctypes.c_void_p, size_p],
        "nvrtcGetPTX": [ctypes.c_void_p, ctypes.c_char_p],
        "nvrtcGetNumSupportedArchs": [ctypes.POINTER(ctypes.c_int)],
        "nvrtcGetSupportedArchs": [ctypes.POINTER(ctypes.c_int)],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def _check(result: int, call: str) -> None:
    if result != 0:
        message = _lib().nvrtcGetErrorString(result).decode()
        raise NvrtcError(f"{call} failed: {message} ({result})")


@functools.cache
def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_lib().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


@functools.cache
def supported_archs() -> tuple[str, ...]:
    """The archs this NVRTC compiles for, as 'sm_XY', oldest first."""
    lib = _lib()
    count = ctypes.c_int()
    _check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
    archs = (ctypes.c_int * count.value)()
    _check(lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
    return tuple(f"sm_{arch}" for arch in archs)


def archs_lacking(archs: list[str]) -> str | None:
    """What is wrong where this NVRTC cannot compile for some of `archs` (NVRTC 12.4, torch
    2.6's, stops at sm_90; sm_100 and sm_120 came with CUDA 12.8), or None."""
    known = supported_archs()
    lacking = [arch for arch in archs if arch not in known]
    if not lacking:
        return None
    major, minor = version()
    return (
        f"NVRTC {major}.{minor} cannot compile for {', '.join(lacking)} (it compiles for "
        f"{known[0]} to {known[-1]}); a newer NVRTC can (`python -m spio info` shows which "
        "one spio found)"
    )


def _c_strings(items: list[bytes]):
    return (ctypes.c_char_p * len(items))(*items) if items else None


def _read(prog: ctypes.c_void_p, size_fn: str, get_fn: str) -> bytes:
    lib = _lib()
    size = ctypes.c_size_t()
    _check(getattr(lib, size_fn)(prog, ctypes.byref(size)), size_fn)
    buf = ctypes.create_string_buffer(size.value)
    _check(getattr(lib, get_fn)(prog, buf), get_fn)
    return buf.raw[: size.value]


@functools.cache
def _uselocale():
    """The C library's uselocale, or None where it has none."""
    try:
        function = ctypes.CDLL(None).uselocale
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_void_p]
    return function


@contextlib.contextmanager
def thread_locale_kept():
    """Restores the calling thread's locale on leaving. NVRTC 12.4 (torch 2.6's) switches the
    thread that compiles to the C locale and leaves it there: Python's default text encoding in
    that thread then became ASCII after spio's first compile, and a user's open() of a UTF-8
    file failed."""
    uselocale = _uselocale()
    if uselocale is None:
        yield
        return
    before = uselocale(None)
    try:
        yield
    finally:
        if uselocale(None) != before:
            uselocale(before)


def compile_program(
    source: str, name: str, options: list[str], headers: dict[str, str] | None = None
) -> NvrtcOutput:
    """Compile one translation unit; in-memory `headers` map include names to their text.

    Raises CompileError (with the NVRTC log) when the program does not compile. The calling
    thread's locale is as it was (thread_locale_kept).
    """
    with thread_locale_kept():
        return _compile_program(source, name, options, headers)


def _compile_program(
    source: str, name: str, options: list[str], headers: dict[str, str] | None
) -> NvrtcOutput:
    lib = _lib()
    headers = headers or {}
    prog = ctypes.c_void_p()
    _check(
        lib.nvrtcCreateProgram(
            ctypes.byref(prog),
            source.encode(),
            name.encode(),
            len(headers),
            _c_strings([text.encode() for text in headers.values()]),
            _c_strings([key.encode() for key in headers]),
        ),
        "nvrtcCreateProgram",
    )
    try:
        opts = [o.encode() for o in options]
        result = lib.nvrtcCompileProgram(prog, len(opts), _c_strings(opts))
        log = (
            _read(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
            .rstrip(b"\0")
            .decode(errors="replace")
        )
        if result != 0:  # the result's name too: a failure other than the source's has no log
            raise CompileError(name, log, lib.nvrtcGetErrorString(result).decode())
        cubin = _read(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
        ptx = _read(prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode()
        return NvrtcOutput(cubin=cubin, ptx=ptx, log=log)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
