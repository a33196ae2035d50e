"""Build a kernel source into an emulator shared library with the host C++ compiler.

A library is: the runtime object (fibers, barriers, collectives, checks), the x86-64 context switch
(none with ucontext fibers), the kernel object (the .cu source compiled as C++ after
force-including runtime/spio_emu.h, plus one generated entry per `extern "C" __global__` kernel)
and a closing guard object. The checked variant compiles the kernel object with -fsanitize=thread
(GCC's or clang's), so every load and store calls the runtime's __tsan_read*/__tsan_write*
callbacks. Libraries and runtime objects are cached on disk.

A library's checksummed cache entry is copied to `<cache>/emulator/lib/<key>.so` for dlopen. The
copy is checked against the entry once per process and rewritten when it differs, and is readable by
others as the umask allows, so a cache built as root (a Docker image) serves other users. When the
cache cannot be written, the copy goes to one private temporary folder, removed at exit. Where
the file's folder is mounted noexec, EmuModule loads a memory copy of it (`module.noexec`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..compiler import digest
from ..compiler.cache import (
    LIBRARY_FOLDER,
    TRUST_ADVICE_SENTENCE,
    DiskCache,
    hash_key,
    make_folder,
    why_changeable,
    why_untrusted,
    write_atomically,
)
from ..compiler.compile import checked_headers
from ..cuda import paths
from ..env import flag
from ..log import logger


@functools.cache
def recipe_digest() -> str:
    """Hash of this module and the loader (module.py): the build recipe (entry code, rewrites,
    link order) and the entry ABI are Python here, so any edit to them is a new key. It had
    been a version number to bump by hand, which 25 commits of the recipe never did."""
    here = Path(__file__).resolve().parent
    return hashlib.sha256(
        b"".join((here / f).read_bytes() for f in ("build.py", "module.py"))
    ).hexdigest()


RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"

_BASE_FLAGS = ("-O2", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-w")
#: ThreadSanitizer's instrumentation (not AddressSanitizer's): it calls back before every load and
#: store, where ASan's drops the check of a store to an address a load in the same function
#: already checked (so `x[i] += v`, a read-modify-write, never reported its write). Function entry
#: and exit are not instrumented, and volatile accesses call the same callbacks as the others: GCC
#: takes those settings as --param, clang as LLVM options. clang also needs telling to check a
#: load followed by a store to the same address (by default it checks only the store, so a stale
#: read, say of a cp.async not waited for, would go unreported).
_CHECK_FLAGS = {
    "gcc": (
        "-fsanitize=thread",
        "--param",
        "tsan-instrument-func-entry-exit=0",
        "--param",
        "tsan-distinguish-volatile=0",
    ),
    "clang": (
        "-fsanitize=thread",
        "-mllvm",
        "-tsan-instrument-func-entry-exit=0",
        "-mllvm",
        "-tsan-distinguish-volatile=0",
        "-mllvm",
        "-tsan-instrument-read-before-write=1",
    ),
}


_GLOBAL = r"(?:__global__|__spio_emu_global__)"
_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+(?:(?:__launch_bounds__\s*\([^)]*\)|static|inline)\s+)*'
    + _GLOBAL
    + r"\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?void\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s+)?([A-Za-z_]\w*)\s*\("
)
_KERNEL_RE_2 = re.compile(
    r'extern\s+"C"\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?void\s+'
    + _GLOBAL
    + r"\s+([A-Za-z_]\w*)\s*\("
)
_EXTERN_SHARED_RE = re.compile(
    r"\bextern\s+__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s*)?)([^;\[\]]*?)\s*\b([A-Za-z_]\w*)"
    r"\s*\[\s*\]\s*;"
)


class _TextOutput(TypedDict):
    """subprocess.run's keywords for text output, typed so that type checkers pick the overload
    of subprocess.run that returns str output (a dict[str, str] matches none)."""

    encoding: str
    errors: str


#: How the host compiler's output is read: as UTF-8 (g++ quotes names with UTF-8 quotation
#: marks under a UTF-8 locale, and echoes source lines), whatever the locale Python itself
#: runs under; bytes that are not UTF-8 are replaced, not raised on.
_TOOL_TEXT: _TextOutput = {"encoding": "utf-8", "errors": "replace"}


class EmulatorBuildError(RuntimeError):
    """Building an emulator library failed: the host compiler rejected the kernel source (the
    message carries its output), or the library could not be written anywhere, or (on a file
    system mounted noexec) not loaded from memory either."""


@dataclass(frozen=True)
class Library:
    """A built emulator library on disk and what it exports."""

    path: Path
    kernels: tuple[str, ...]
    checked: bool
    cached: bool
    seconds: float


def compiler() -> str:
    """The host C++ compiler: $CXX, else g++ (an empty CXX counts as unset)."""
    return os.environ.get("CXX", "").strip() or "g++"


def command_words(cxx: str) -> list[str]:
    """`cxx` (the compiler, its flags and any wrapper) split into words as a shell would;
    EmulatorBuildError naming CXX when it cannot be (an unbalanced quote)."""
    try:
        return shlex.split(cxx)
    except ValueError as error:
        raise EmulatorBuildError(
            f"CXX must be a command line (a compiler and its flags), got {cxx!r}: {error}"
        ) from error


@functools.cache
def compiler_version(cxx: str) -> str:
    """First line of `cxx --version`; raises EmulatorBuildError when it cannot run."""
    try:
        out = subprocess.run(
            [*command_words(cxx), "--version"], capture_output=True, check=True, **_TOOL_TEXT
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise EmulatorBuildError(
            f"the emulator needs a host C++ compiler (CXX={cxx!r}); running it failed: "
            f"{str(error).rstrip('.')}. Install g++ or clang++, or set CXX to one."
        ) from error
    return out.splitlines()[0] if out else cxx


def compiler_family(cxx: str) -> str:
    """The family of `cxx`: clang when its --version names clang, else gcc (whose options any
    other compiler then gets)."""
    return "clang" if "clang" in compiler_version(cxx).lower() else "gcc"


#: The oldest clang whose ThreadSanitizer instrumentation calls __tsan_memcpy, __tsan_memset and
#: __tsan_memmove, which the runtime checks. clang 15 and older call the C library's instead, so
#: a copy the compiler turns into memcpy (a float4 struct copy, say) would not be checked.
MIN_CLANG = 16


#: Locals the code never set read as a pattern (floats as -1.7e38 or NaN), not as the zeros of
#: a fresh fiber stack: an accumulator left unzeroed, or an mma operand never loaded, had given
#: exactly the right result in the emulator. GCC 12 and clang 16 take it; an older GCC builds
#: checked kernels without it.
UNSET_LOCALS_FLAG = "-ftrivial-auto-var-init=pattern"


@functools.cache
def _takes_flag(cxx: str, flag: str) -> bool:
    """Whether `cxx` accepts `flag` (a syntax-only compile of an empty program)."""
    try:
        done = subprocess.run(
            [*command_words(cxx), flag, "-x", "c++", "-fsyntax-only", "-"],
            input="",
            capture_output=True,
            **_TOOL_TEXT,
        )
    except OSError:
        return False
    return done.returncode == 0


#: A checked kernel's (not the runtime's) further flags, spelt alike by GCC and clang: a pointer
#: dereferenced (or a reference bound) at an address its type's alignment does not divide calls
#: the runtime's handler, for a GPU faults there ("misaligned address": a uint4 at an 8-byte
#: boundary). The type's alignment, not the access's size: ThreadSanitizer's callbacks cannot tell
#: a uint4 from a 16-byte struct of 8-byte alignment, and GCC split a uint4 into 4-byte loads.
KERNEL_CHECK_FLAGS = ("-fsanitize=alignment",)


def check_flags(cxx: str) -> tuple[str, ...]:
    """The flags of a checked kernel object built by `cxx` (ThreadSanitizer's, and unset locals
    as a pattern where `cxx` takes it); raises EmulatorBuildError for a clang older than
    MIN_CLANG."""
    family = compiler_family(cxx)
    if family == "clang":
        version = compiler_version(cxx)
        match = re.search(r"clang version (\d+)", version)
        if match and int(match.group(1)) < MIN_CLANG:
            raise EmulatorBuildError(
                f"the emulator's checked builds need clang {MIN_CLANG} or newer, or g++; "
                f"CXX={cxx!r} is {version!r}, whose instrumentation leaves memcpy and memset "
                "unchecked (a 16-byte copy past a tensor would go unreported). Set CXX to g++ "
                f"or to clang++ {MIN_CLANG}+"
            )
    unset = (UNSET_LOCALS_FLAG,) if _takes_flag(cxx, UNSET_LOCALS_FLAG) else ()
    return _CHECK_FLAGS[family] + unset


#: Environment variables that change what the host compiler includes or runs (GCC's, also read
#: by clang): they go into the cache keys, so that a library built under another include path is
#: not taken from the cache.
_COMPILER_ENVIRONMENT = (
    "CPATH",
    "CPLUS_INCLUDE_PATH",
    "C_INCLUDE_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
)


def compiler_environment() -> list[tuple[str, str]]:
    """The set variables of _COMPILER_ENVIRONMENT with their values, for cache keys."""
    return [(name, os.environ[name]) for name in _COMPILER_ENVIRONMENT if name in os.environ]


def kernel_names(text: str) -> list[str]:
    """Names of the `extern "C" __global__` kernels defined in `text`, in order: a name only
    declared has no body to run (its entry would name a symbol the library lacks), unless a
    definition follows, which the declaration's `extern "C"` gives C linkage."""
    matches = [*_KERNEL_RE.finditer(text), *_KERNEL_RE_2.finditer(text)]
    names = dict.fromkeys(m.group(1) for m in matches)
    return [name for name in names if _defined(text, name)]


def _defined(text: str, name: str) -> bool:
    """Whether `text` defines the function `name` (a parameter list followed by a body)."""
    return any(_has_body(text, m.end()) for m in re.finditer(rf"\b{name}\s*\(", text))


def _has_body(text: str, start: int) -> bool:
    """Whether the parameter list opened just before `start` is followed by a function body
    (`{`, after any attributes or qualifiers) rather than `;`."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                rest = re.match(r"[^;{]*", text[i + 1 :])
                end = i + 1 + (rest.end() if rest else 0)
                return text[end : end + 1] == "{"
    return False


def clipped(text: str, head: int = 16000, tail: int = 4000) -> str:
    """`text`, its middle left out (and counted) where it is longer than head + tail characters:
    a compiler's first error, usually the cause, and its last lines both stay."""
    if len(text) <= head + tail:
        return text
    cut = len(text) - head - tail
    return f"{text[:head]}\n... ({cut} characters left out) ...\n{text[-tail:]}"


def rewrite_extern_shared(text: str) -> str:
    """Turn `extern __shared__ T name[];` into a reference to the dynamic shared-memory buffer."""

    def repl(m: re.Match) -> str:
        ctype = m.group(2).strip()
        if not ctype:
            return m.group(0)
        # (the line breaks the declaration's spaces held, so that later lines keep their
        # numbers; one inside the type, a macro's continuation, stays where it is)
        dropped = m.group(0).count("\n") - ctype.count("\n")
        return f"SPIO_EMU_EXTERN_SHARED({ctype}, {m.group(3)});" + "\n" * dropped

    return _EXTERN_SHARED_RE.sub(repl, text)


def runtime_digest() -> str:
    """Hash of the runtime's own sources (runtime/ and its shims)."""
    return digest.tree_digest(RUNTIME_DIR)


def bundled_digest() -> str:
    """Hash of spio's bundled headers (spio/include), which kernels include."""
    return digest.tree_digest(paths.bundled_include_dir())


#: The oldest CUDA headers whose cuda_fp16.h and cuda_bf16.h declare, for host code, the
#: conversions the kernels use (__half22float2, __half_as_ushort, ...): 12.0's and 12.1's declare
#: them for nvcc only, so no kernel builds.
MIN_CUDA_HEADERS = (12, 2)


def dotted(version: tuple[int, ...]) -> str:
    """(12, 2) as "12.2"."""
    return ".".join(map(str, version))


def check_cuda_headers(folder: Path) -> None:
    """Raises EmulatorBuildError where the CUDA headers in `folder` are older than
    MIN_CUDA_HEADERS (headers of no known version pass)."""
    version = paths.cuda_headers_version(folder)
    if version is not None and version < MIN_CUDA_HEADERS:
        raise EmulatorBuildError(
            f"the CPU emulator needs CUDA headers {dotted(MIN_CUDA_HEADERS)} or newer (older "
            f"cuda_fp16.h declares its conversions for nvcc only); those in {folder} are "
            f"{dotted(version)} (NVRTC still builds GPU kernels with them). Install newer ones "
            "(pip install -U nvidia-cuda-runtime-cu12) or point SPIO_CUDA_INCLUDE at them"
        )


@functools.cache
def _cuda_include() -> Path:
    folder = paths.find_cuda_include()
    check_cuda_headers(folder)
    return folder


@functools.cache
def _cuda_identity() -> str:
    """Identity of the CUDA headers, for the cache keys: all of them, not only those spio_emu.h
    names, which include others (cuda_fp16.h includes vector_functions.h, a list of five had
    left it out)."""
    return digest.headers_identity(_cuda_include())


def _include_flags(extra: list[Path]) -> list[str]:
    dirs = [RUNTIME_DIR / "shim", _cuda_include(), RUNTIME_DIR, *extra]
    return [f"-I{d}" for d in dirs]


def _run(cmd: list[str], what: str) -> None:
    logger.debug("emulator: %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, **_TOOL_TEXT)
    if proc.returncode != 0:
        raise EmulatorBuildError(
            f"{what} failed (exit {proc.returncode}):\n{' '.join(cmd)}\n{clipped(proc.stderr)}"
        )


_cache = DiskCache("emulator")


def use_ucontext() -> bool:
    """glibc ucontext fibers instead of the assembly switch: other CPUs, or SPIO_EMU_UCONTEXT=1
    (read on every CPU, so that a value not on or off raises ValueError everywhere)."""
    asked = flag("SPIO_EMU_UCONTEXT")
    return asked or platform.machine() not in ("x86_64", "AMD64")


#: A build's temporary folder: `spio-emu-<pid>-...` (`spio-emu-rt-<pid>-...` for a runtime
#: object, `spio-emu-lib-<pid>-...` for the libraries of a process whose cache folder cannot
#: hold them), named for its process, so that a later process can remove the folders of
#: processes that died without removing them (SIGTERM from `timeout` or a scheduler, SIGKILL:
#: ~230 KB a build folder, ~110 KB a library).
_BUILD_FOLDER_RE = re.compile(r"spio-emu-(?:rt-|lib-)?(\d+)-")
#: A dead process's folder is removed only once untouched this long: a process of another PID
#: namespace sharing the temporary folder may look dead here, but no build takes an hour.
STALE_BUILD_SECONDS = 3600
_swept = False


def _sweep_once() -> None:
    """The first temporary folder a process makes removes those of dead processes first
    (`sweep_build_folders`)."""
    global _swept
    if not _swept:
        _swept = True
        sweep_build_folders()


@contextlib.contextmanager
def _build_folder(kind: str = "") -> Iterator[str]:
    """A temporary folder for one build (`kind` "rt-" for a runtime object), named for this
    process, removed when the build ends by the process that made it alone: a forked child that
    exits (tempfile.TemporaryDirectory's finalizer runs at exit) had removed a folder its parent's
    compiler was writing into."""
    _sweep_once()
    pid = os.getpid()
    folder = tempfile.mkdtemp(prefix=f"spio-emu-{kind}{pid}-")
    try:
        yield folder
    finally:
        _remove_private(Path(folder), pid)


def sweep_build_folders(root: Path | None = None) -> list[Path]:
    """Remove the build folders in `root` (the temporary folder) that this user's processes left
    when they died mid-build, untouched for STALE_BUILD_SECONDS; returns those removed."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        found = _BUILD_FOLDER_RE.match(entry.name)
        try:
            if found is None or not entry.is_dir(follow_symlinks=False):
                continue
            status = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if status.st_uid != os.getuid() or time.time() - status.st_mtime < STALE_BUILD_SECONDS:
            continue
        if _process_alive(int(found.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _process_alive(pid: int) -> bool:
    """False only where no process `pid` exists (another user's, or a number no PID can be,
    counts as alive: its folder is kept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass
    return True


def _toolchain_identity(cxx: str) -> tuple:
    """What decides every object the emulator builds besides its own source and flags: this
    recipe, the runtime's sources, the compiler (its command, wrappers included, version and
    environment), the CPU and the CUDA headers."""
    return (
        recipe_digest(),
        runtime_digest(),
        command_words(cxx),
        compiler_version(cxx),
        compiler_environment(),
        platform.machine(),
        _cuda_identity(),
    )


def _runtime_objects(cxx: str, workdir: Path) -> list[Path]:
    """The runtime, context-switch and closing-guard objects, compiled once and cached."""
    ucontext = use_ucontext()
    sources = ["emu_runtime.cc", *([] if ucontext else ["fiber_switch_x86_64.S"]), "emu_tls_end.cc"]
    flags = [*_BASE_FLAGS, *_include_flags([]), *(["-DSPIO_EMU_UCONTEXT"] if ucontext else [])]
    out: list[Path] = []
    for src in sources:
        key = hash_key("emu-runtime", src, flags, *_toolchain_identity(cxx))

        def build(src: str = src) -> tuple[bytes, dict]:
            with _build_folder("rt-") as tmp:
                obj = Path(tmp) / (src + ".o")
                _run(
                    [*command_words(cxx), *flags, "-c", str(RUNTIME_DIR / src), "-o", str(obj)],
                    f"compiling the emulator runtime ({src})",
                )
                return obj.read_bytes(), {"source": src}

        payload, _, _ = _cache.get_or_build(key, build)
        path = workdir / (src + ".o")
        path.write_bytes(payload)
        out.append(path)
    return out


def _entry_code(kernels: list[str]) -> str:
    lines = ["", "// ---- emulator entries (generated) ----"]
    for k in kernels:
        lines.append(
            f"SPIO_EMU_EXPORT int spio_emu_entry_{k}(const spio_emu_launch *cfg, "
            f"const uint64_t *slots, int num_slots) {{\n"
            f"    return ::spio::emu::detail::Entry<decltype(&{k}), &{k}>::launch(cfg, slots, "
            f"num_slots);\n}}"
        )
        lines.append(
            f"SPIO_EMU_EXPORT const char *spio_emu_signature_{k}() {{\n"
            f"    return ::spio::emu::detail::Entry<decltype(&{k}), &{k}>::signature();\n}}"
        )
    return "\n".join(lines) + "\n"


def _scan_kernels(cxx: str, cu: Path, include: list[str], name: str) -> list[str]:
    """Kernel names from the preprocessed source, so kernels declared by macros are found."""
    proc = subprocess.run(
        [
            *command_words(cxx),
            "-std=c++17",
            "-E",
            "-P",
            "-DSPIO_EMU_SCAN",
            "-include",
            "spio_emu.h",
            *include,
            "-x",
            "c++",
            str(cu),
        ],
        capture_output=True,
        **_TOOL_TEXT,
    )
    if proc.returncode != 0:
        raise EmulatorBuildError(
            f"preprocessing {name} for the CPU emulator failed:\n{clipped(proc.stderr)}"
        )
    kernels = kernel_names(proc.stdout)
    if not kernels:
        raise ValueError(
            f'{name}: no `extern "C" __global__ void <name>(...)` kernel found in the source'
        )
    return kernels


#: Library files known good in this process: the cache's path -> the file to load (that path,
#: or its copy in the private folder when the cache could not be written).
_files: dict[Path, Path] = {}
_files_lock = threading.Lock()
_private: Path | None = None
_warned = False


def _same_content(path: Path, payload: bytes) -> bool:
    """Whether the file at `path` holds exactly `payload` and no other user could change it
    (cache.why_changeable: in a folder only this user and root can write, then, what is loaded
    is what was compared)."""
    try:
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            if why_changeable(path, status) is not None:
                return False
            return status.st_size == len(payload) and f.read() == payload
    except OSError:  # missing, unreadable (another user's 0600 file), or not a file
        return False


def _remove_private(folder: Path, pid: int) -> None:
    if os.getpid() == pid:  # not from a forked child: the parent may still load from it
        shutil.rmtree(folder, ignore_errors=True)


def _private_folder() -> Path:
    """This process's own temporary folder for libraries, made once and removed at exit (or,
    where the process is killed, by a later process's sweep: named for it)."""
    global _private
    # (Made again where it has gone: a process of another PID namespace sharing the temporary
    # folder, to which this one looks dead, sweeps it after an hour untouched; and where what
    # is there now is not the folder mkdtemp made: another user could make one of its name,
    # which `ls` shows, once it has gone.)
    if _private is None or not _is_own_private(_private):
        _sweep_once()
        _private = Path(tempfile.mkdtemp(prefix=f"spio-emu-lib-{os.getpid()}-"))
        atexit.register(_remove_private, _private, os.getpid())
    return _private


def _is_own_private(folder: Path) -> bool:
    """Whether `folder` is a folder (not a link) of this user's that no one else may enter."""
    try:
        status = os.lstat(folder)
    except OSError:
        return False
    return (
        stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and not status.st_mode & 0o077
    )


def _library_file(key: str, payload: bytes, name: str) -> Path:
    """A file holding exactly `payload` to dlopen: `<cache>/emulator/lib/<key>.so`, checked once
    per process and rewritten when missing or different, else a copy in the private folder (also
    where another user could change files in lib/: cache.why_untrusted)."""
    global _warned
    target = _cache.folder / LIBRARY_FOLDER / f"{key}.so"
    with _files_lock:
        known = _files.get(target)
        if known is not None and known.is_file():
            if known == target or _is_own_private(known.parent):  # (not another's, since)
                return known
        reason = why_untrusted(target.parent)
        if reason is None and _same_content(target, payload):
            _files[target] = target
            return target
        try:
            if reason is not None:
                raise PermissionError(reason)  # (not written there: to the private folder)
            make_folder(target.parent)
            write_atomically(target, payload)
            # Judged again now that every folder on the way exists: one missing at the first
            # look may have been made meanwhile by another user, who could then swap the file.
            reason = why_untrusted(target, must_exist=True)
            if reason is not None:
                raise PermissionError(reason)
            _files[target] = target
            return target
        except OSError as error:
            cache_error = error
        try:
            path = _private_folder() / target.name
            if not _same_content(path, payload):
                write_atomically(path, payload)
        except OSError as error:
            raise EmulatorBuildError(
                f"cannot write the emulator library for {name}: not to the cache folder "
                f"{target.parent} ({cache_error}), nor to a temporary folder ({error}). Free disk "
                "space, or set SPIO_CACHE_DIR (or TMPDIR) to a writable folder."
            ) from error
        # One warning per process; none when the cache already warned that it cannot be written.
        if not _warned and not _cache.warned and reason is not None:
            logger.warning(
                "spio does not load emulator libraries from its cache folder %s (%s: another "
                "user could swap one there); they are written to %s for this process only. %s",
                target.parent,
                reason,
                path.parent,
                TRUST_ADVICE_SENTENCE,
            )
        elif not _warned and not _cache.warned:
            logger.warning(
                "spio cannot write emulator libraries to its cache folder %s (%s); they are "
                "written to %s for this process only. Set SPIO_CACHE_DIR to a writable folder.",
                target.parent,
                cache_error,
                path.parent,
            )
        else:
            logger.debug("emulator library %s written to %s (%s)", key, path, cache_error)
        _warned = True
        _files[target] = path
        return path


def file_stem(name: str) -> str:
    """`name` (a label, free text) made a safe file name for its source, which compiler messages
    show: characters other than letters, digits, `_`, `-`, `+` and `.` become `_`, no leading dot
    (`../x` stays in the build folder), at most 100 characters."""
    stem = re.sub(r"[^A-Za-z0-9_+.-]", "_", name).lstrip(".")[:100]
    return stem or "kernel"


def build_library(
    source: str,
    headers: dict[str, str] | None = None,
    *,
    name: str = "kernel",
    checked: bool = True,
    use_cache: bool = True,
) -> Library:
    """Compile `source` (and in-memory `headers`) into an emulator library; cached on disk
    (`use_cache` False: built anew, as a check that the compiler works now must be)."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"the emulator needs non-empty CUDA source for {name!r}, got {source!r}")
    headers = checked_headers(headers, "the emulator")
    cxx = compiler()
    flags = [*_BASE_FLAGS, *(check_flags(cxx) if checked else ())]
    kernel_flags = [*flags, *(KERNEL_CHECK_FLAGS if checked else ())]
    key = hash_key(
        "emu-lib",
        source,
        sorted(headers.items()),
        kernel_flags,
        checked,
        bundled_digest(),
        use_ucontext(),
        *_toolchain_identity(cxx),
    )

    def build() -> tuple[bytes, dict]:
        with _build_folder() as tmp:
            work = Path(tmp)
            inc = work / "include"
            for hname, text in headers.items():
                dest = inc / hname
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(rewrite_extern_shared(text), encoding="utf-8")
            # (spio/include declares no `extern __shared__` array: only kernel sources and
            # in-memory headers are rewritten; tests/emulator/test_errors.py checks it.)
            bundled = paths.bundled_include_dir()
            cu = work / f"{file_stem(name)}.cu"
            cu.write_text(rewrite_extern_shared(source), encoding="utf-8")
            include = _include_flags([inc, bundled, work])
            kernels = _scan_kernels(cxx, cu, include, name)
            unit = work / "unit.cc"
            unit.write_text(f'#include "{cu.name}"\n{_entry_code(kernels)}', encoding="utf-8")
            objs = _runtime_objects(cxx, work)
            kobj = work / "kernel.o"
            _run(
                [
                    *command_words(cxx),
                    *kernel_flags,
                    "-include",
                    "spio_emu.h",
                    *include,
                    "-c",
                    str(unit),
                    "-o",
                    str(kobj),
                ],
                f"compiling {name} for the CPU emulator",
            )
            lib = work / "lib.so"
            # Order matters: runtime (opening TLS guard), kernel, closing guard last.
            _run(
                [
                    *command_words(cxx),
                    "-shared",
                    "-Wl,-z,defs",  # a symbol left undefined fails here, not at every load
                    "-o",
                    str(lib),
                    *[str(o) for o in objs[:-1]],
                    str(kobj),
                    str(objs[-1]),
                ],
                f"linking {name} for the CPU emulator",
            )
            return lib.read_bytes(), {"kernels": kernels}

    start = time.perf_counter()
    if use_cache:
        payload, meta, cached = _cache.get_or_build(key, build)
    else:
        (payload, meta), cached = build(), False
    path = _library_file(key, payload, name)
    seconds = time.perf_counter() - start
    logger.info(
        "emulator library for %s (%s): %s in %.2f s",
        name,
        "checked" if checked else "unchecked",
        "cached" if cached else "compiled",
        seconds,
    )
    return Library(path, tuple(meta["kernels"]), checked, cached, seconds)
