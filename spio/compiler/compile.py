"""Compile CUDA C++ with NVRTC to cubin, with ptxas resource reports and a disk cache."""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..cuda import nvrtc, paths
from ..cuda.nvrtc import CompileError
from ..log import logger
from . import digest
from .arch import check_arch, warn_here_only
from .cache import DiskCache, hash_key

_cubin_cache = DiskCache("cubin")


@dataclass(frozen=True)
class ResourceUsage:
    """ptxas' resource report for one kernel (entry function)."""

    registers: int = 0
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes
    shared_bytes: int = 0  # static shared memory
    stack_bytes: int = 0
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class CompileResult:
    """A compiled module: the cubin, each kernel's resources, the NVRTC log, whether cached, and
    the cache key it is filed under ("" when compiled without the cache)."""

    cubin: bytes
    arch: str
    resources: dict[str, ResourceUsage] = field(default_factory=dict)
    log: str = ""
    ptx: str = ""
    cached: bool = False
    seconds: float = 0.0
    key: str = ""

    @property
    def warnings(self) -> list[str]:
        """The compiler's warnings in the log (front end and ptxas), a line each."""
        return compiler_warnings(self.log)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for")
_PROPS = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


# The front end's "prog.cu(81): warning #177-D: ..." and ptxas' "ptxas warning : ...".
_WARNING = re.compile(r"\bwarning( #\w+(-D)?)?\s*:")


def compiler_warnings(log: str) -> list[str]:
    """The warning lines of an NVRTC log."""
    return [line.strip() for line in log.splitlines() if _WARNING.search(line)]


def parse_resource_report(log: str) -> dict[str, ResourceUsage]:
    """Parse `-Xptxas -v` output into a ResourceUsage per entry function. The spills of a
    device function ptxas did not inline (its own "Function properties") count as spills of
    every entry function of the module, which may call it: they had been dropped, so a kernel
    spilling in a callee passed for one without spills."""
    usage: dict[str, dict[str, int]] = {}
    properties: dict[str, tuple[int, int, int]] = {}  # function: stack, spill stores, loads
    entry = props_of = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            usage.setdefault(entry, {})
        elif m := _PROPS.search(line):
            props_of = m.group(1)
        elif (m := _STACK.search(line)) and props_of is not None:
            properties[props_of] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and entry is not None:
            usage[entry]["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                usage[entry]["shared_bytes"] = int(s.group(1))
            if b := _BARRIERS.search(line):
                usage[entry]["barriers"] = int(b.group(1))
    callees = [values for name, values in properties.items() if name not in usage]
    for name, values in usage.items():
        stack, stores, loads = properties.get(name, (0, 0, 0))
        values.update(
            stack_bytes=stack,
            spill_stores=stores + sum(callee[1] for callee in callees),
            spill_loads=loads + sum(callee[2] for callee in callees),
        )
    return {name: ResourceUsage(**values) for name, values in usage.items()}


def _bundled_headers_digest() -> str:
    """Hash of every header in spio/include: any edit there invalidates cached cubins.

    Read at every cache lookup (about 0.4 ms: spio/include is small), so that a cubin compiled
    after an edit in a running process, pool workers' included, is filed under the edited
    headers' digest and not the one the process began with.
    """
    return digest.tree_digest(paths.bundled_include_dir())


@functools.cache
def _cuda_include_dir() -> Path:
    """The CUDA headers for the NVRTC in use: its own installation's, else its major version's
    (warning once where the only ones found are another major's)."""
    version = nvrtc.version()
    include = paths.find_cuda_include(prefer_major=version[0], nvrtc=nvrtc.library_path())
    mismatch = headers_mismatch(include, version)
    if mismatch:
        logger.warning("%s", mismatch)
    return include


def headers_mismatch(include: Path, nvrtc_version: tuple[int, int]) -> str | None:
    """What is wrong where the CUDA headers in `include` are of another major version than
    NVRTC (whose compiles then fail in the headers, e.g. NV_IF_ELSE_TARGET undefined), else
    None."""
    headers = paths.cuda_headers_version(include)
    if headers is None or headers[0] == nvrtc_version[0]:
        return None
    return (
        f"the CUDA headers at {include} are CUDA {headers[0]}.{headers[1]}'s, NVRTC is CUDA "
        f"{nvrtc_version[0]}.{nvrtc_version[1]}'s: kernels may fail to compile. Install CUDA "
        f"{nvrtc_version[0]}'s headers (its nvidia-cuda-runtime wheel) or set SPIO_CUDA_INCLUDE"
    )


@functools.cache
def _cuda_headers_identity() -> str:
    """Cheap identity of the CUDA headers in use: folder, header paths, sizes and mtimes."""
    return digest.headers_identity(_cuda_include_dir())


@functools.cache
def _nvrtc_identity() -> tuple[tuple[int, int], tuple[str, ...]]:
    """NVRTC's version and the identity of libnvrtc and its builtins, computed once per process.

    The version alone misses a patch update or another build with the same major.minor; the
    libraries' content identity (size and first MiB) catches those, and does not change when the
    installation moves.
    """
    lib = nvrtc.library_path()
    libraries = [lib, *nvrtc.builtins_beside(lib)]
    return nvrtc.version(), tuple(digest.library_identity(path) for path in libraries)


def _include_options() -> list[str]:
    """The -I options spio adds; their folders' content is in the cache key, not their paths."""
    return [f"-I{paths.bundled_include_dir()}", f"-I{_cuda_include_dir()}"]


def nvrtc_options(arch: str, *, line_info: bool = False, debug: bool = False) -> list[str]:
    """The NVRTC command line spio uses for `arch`. --no-source-include: NVRTC searches a
    quoted #include first beside the program, whose name is bare: in the current directory,
    which the cache key does not cover (a process started in another checkout's spio/include
    would build, and cache for every process, kernels from that checkout's headers)."""
    opts = [
        f"--gpu-architecture={arch}",
        "-std=c++17",
        "--ptxas-options=-v",
        "--no-source-include",
        *_include_options(),
    ]
    if line_info:
        opts.append("-lineinfo")
    if debug:
        opts.append("-G")
    return opts


def cubin_key(
    source: str, arch: str, headers: dict[str, str], opts: list[str], name: str = "kernel.cu"
) -> str:
    """The cache key of one compilation: everything that decides the cubin and its log.

    That is the program's name (in the log, and in the line info of -lineinfo cubins), the
    source, the in-memory headers, every option except the -I folders spio adds,
    the arch, NVRTC's identity, spio/include's content and the CUDA headers' identity. The -I
    paths are left out so that moving spio's own folder keeps its cache; the CUDA headers'
    identity includes their folder's path and mtimes (statting is cheap, reading them is not),
    so a new or moved environment holding the CUDA wheels compiles afresh once. Options a
    caller passes, -I included, stay in the key (their folders' content is not digested).
    """
    own_includes = set(_include_options())
    return hash_key(
        "nvrtc",
        name,
        source,
        sorted(headers.items()),
        [o for o in opts if o not in own_includes],
        arch,
        *toolchain_identity(),
    )


def toolchain_identity() -> tuple:
    """What decides a cubin besides its program and options: NVRTC's identity, spio/include's
    content and the CUDA headers' identity."""
    return _nvrtc_identity(), _bundled_headers_digest(), _cuda_headers_identity()


def checked_headers(headers: dict[str, str] | None, who: str) -> dict[str, str]:
    """`headers` as a dict, after checking that they are {name: text} of strings, each name a
    relative path within the include folder (the emulator writes them to files there): TypeError
    or ValueError naming `who` and the header."""
    headers = dict(headers or {})
    for header, text in headers.items():
        if not isinstance(header, str) or not isinstance(text, str):
            raise TypeError(
                f"{who} needs headers as {{name: text}} of strings, got {header!r}: "
                f"{type(text).__name__}"
            )
        if "\0" in header or "\0" in text:  # NVRTC reads C strings: the rest went unread
            raise ValueError(f"{who} needs headers without NUL characters, got one in {header!r}")
        parts = PurePosixPath(header).parts
        if not parts or header.startswith("/") or ".." in parts or "\\" in header:
            raise ValueError(
                f"{who} needs header names that are relative paths without '..' or "
                f"backslashes, got {header!r}"
            )
    return headers


def compile_cubin(
    source: str,
    arch: str,
    headers: dict[str, str] | None = None,
    *,
    name: str = "kernel.cu",
    options: tuple[str, ...] | list[str] = (),
    line_info: bool = False,
    debug: bool = False,
    use_cache: bool = True,
) -> CompileResult:
    """Compile `source` (plus in-memory `headers`) for `arch` to a cubin.

    spio/include and the CUDA headers are on the include path. Results are cached on disk, keyed by
    everything that decides the binary. Raises CompileError carrying the NVRTC log.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"compile_cubin needs non-empty CUDA source for {name!r}, got {source!r}")
    check_arch(arch)
    headers = checked_headers(headers, "compile_cubin")
    if isinstance(options, str) or not all(isinstance(o, str) for o in options):
        raise TypeError(f"compile_cubin needs options as a sequence of strings, got {options!r}")
    # NVRTC takes C strings: what followed a NUL was dropped unread (the source's rest, an
    # option's), while the cache key counted it.
    for what, text in (
        ("a source", source),
        ("a name", name),
        *(("an option", o) for o in options),
    ):
        if "\0" in text:
            raise ValueError(f"compile_cubin needs {what} without NUL characters, got {text!r}")
    opts = nvrtc_options(arch, line_info=line_info, debug=debug) + list(options)

    def build() -> tuple[bytes, dict]:
        start = time.perf_counter()
        try:
            out = nvrtc.compile_program(source, name, opts, headers)
        except CompileError as error:  # which of a kernel's archs failed: said
            lacking = nvrtc.archs_lacking([arch])  # and why, where NVRTC has no such arch
            log = f"{lacking}\n{error.log}" if lacking else error.log
            raise CompileError(error.name, log, error.result, arch) from None
        seconds = time.perf_counter() - start
        if _lines_here:
            log_build(name, arch, False, seconds)
        return out.cubin, _meta(out.log, out.ptx, seconds)

    key = ""
    if not use_cache:
        cubin, meta = build()
        cached = False
    else:
        key = cubin_key(source, arch, headers, opts, name)
        start = time.perf_counter()
        cubin, meta, cached = _cubin_cache.get_or_build(key, build)
        if cached and _lines_here:  # (a build logged itself)
            log_build(name, arch, True, time.perf_counter() - start)
    return CompileResult(
        cubin=cubin,
        arch=arch,
        resources=parse_resource_report(meta["log"]),
        log=meta["log"],
        ptx=meta["ptx"],
        cached=cached,
        seconds=meta["seconds"],
        key=key,
    )


def _meta(log: str, ptx: str, seconds: float) -> dict:
    """A cubin cache entry's meta: what CompileResult holds besides the cubin."""
    return {"log": log, "ptx": ptx, "seconds": seconds}


def keep_in_memory(result: CompileResult) -> None:
    """Keep a result a compile worker made where the disk cache does not hold it (a cache folder
    the worker could not write, or one removed meanwhile), so that loading the kernel does not
    compile it again: on disk if this process can write it there, else in memory, the cache
    then saying once that its folder cannot be written."""
    if result.key and not _cubin_cache.on_disk(result.key):
        _cubin_cache.keep(result.key, result.cubin, _meta(result.log, result.ptx, result.seconds))


def log_build(name: str, arch: str, cached: bool, seconds: float, where: str = "") -> None:
    """The one log line (info) of a kernel's compile: "compiled <name> for <arch> in <s> s", or
    "cached ..." where the cache had it; `where` ends it (pool.report: " (in a compile
    worker)"). The record names the caller's line (stacklevel)."""
    verb = "cached" if cached else "compiled"
    logger.info(f"{verb} %s for %s in %.2f s{where}", name, arch, seconds, stacklevel=2)


#: Whether compile_cubin logs its "compiled"/"cached" line in this process: not in a compile
#: worker, whose lines would reach only the logging SPIO_LOGGER set up there (none where the
#: parent configured logging in code); its parent logs them (pool.report).
_lines_here = True


def as_compile_worker() -> None:
    """In a compile worker: what compile_cubin would say is its parent's to say. Each job's
    "compiled"/"cached" line (pool.report), that the cubin cache folder cannot be written (once,
    when it keeps the worker's results), and that an arch is experimental (compile_many, once)."""
    global _lines_here
    _lines_here = False
    _cubin_cache.quiet()
    warn_here_only()


__all__ = [
    "CompileError",
    "CompileResult",
    "ResourceUsage",
    "compile_cubin",
    "parse_resource_report",
]
