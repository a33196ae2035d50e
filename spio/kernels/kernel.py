"""A compiled-on-demand kernel: its source, generated header, launch shape, and where it runs.

A `Kernel` is a value: the factory of its family builds it from layer parameters and a tile
config. It compiles with NVRTC for a GPU's arch and loads into that device's context, or builds for
the CPU emulator; both are cached (cubins and emulator libraries on disk, loaded modules per device
in memory).
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..env import integer
from ..locks import KeyedLocks
from ..log import logger, progress_bar

if TYPE_CHECKING:
    from ..compiler import CompileResult

SOURCE_DIR = Path(__file__).resolve().parent.parent / "src"


@functools.cache
def kernel_source(file_name: str) -> str:
    """The text of a kernel source file in spio/src."""
    return (SOURCE_DIR / file_name).read_text(encoding="utf-8")


def entry_symbol(name: str) -> str:
    """The extern "C" symbol of the kernel named `name`: spio_<name>. Profiler traces
    (torch.profiler, Nsight Systems and Compute) then show each launch's layer and tile config,
    and every spio kernel's symbol starts with "spio_" (what tools filter on)."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(
            f"a kernel name must be a C identifier's letters, digits and _, got {name!r}"
        )
    return f"spio_{name}"


#: The #define lines of each variant name with_defines has made in this process.
_variant_defines: dict[str, str] = {}

#: A live Kernel of each name, whose generated headers a new Kernel of that name shares: a
#: layer's kernel is made again for each batch size it meets (its grid differs), with headers of
#: tens of KB equal to the last ones. Weak: the headers go with the last kernel holding them.
_live_by_name: weakref.WeakValueDictionary[str, Kernel] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class Kernel:
    """Everything needed to compile and launch one kernel instance."""

    # Names the code: the kernel family, layer parameters (but the batch size, which the
    # kernels take at launch), tile config and variant. Kernels of one name compile to the same
    # cubin and share its loaded module; their grids may differ (a layer's at two batch
    # sizes): the grid and block are read from the Kernel at each launch.
    name: str
    source_file: str  # in spio/src
    entry: str  # the extern "C" function in the module
    # Generated headers, (include name, text): tens of KB, left out of the repr.
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem_bytes: int
    # What make_kernel was given (params, config, variant flags such as tma, weights_cl,
    # partials): the launch wrappers read them to lay out and check their arguments, the
    # variant helpers to make a sibling kernel, logs and perf tools to describe it.
    info: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    # info as a dict, for info_value (set by __post_init__)
    _info_map: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_info_map", dict(self.info))  # (frozen: the one way to set it)
        live = _live_by_name.get(self.name)
        if live is None:
            _live_by_name[self.name] = self
        elif live.headers is not self.headers and live.headers == self.headers:
            object.__setattr__(self, "headers", live.headers)  # (frozen: the one way to set it)

    def __hash__(self) -> int:
        # The name stands for the code, and hashing it is cheap; the generated dataclass hash
        # would rehash the headers' text on every launch.
        return hash(self.name)

    def info_value(self, key: str, default: Any = None) -> Any:
        """One value of `info` ("params", "config", ...), or default. (Read several times on
        every launch of spio's layers: one dict lookup.)"""
        return self._info_map.get(key, default)

    @property
    def source(self) -> str:
        return kernel_source(self.source_file)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def compile(self, arch: str) -> CompileResult:
        """Compile for `arch` (cached on disk); returns a spio.compiler.CompileResult."""
        from ..compiler import compile_cubin

        return compile_cubin(self.source, arch, dict(self.headers), name=f"{self.name}.cu")

    def with_defines(self, switches: tuple[str, ...]) -> Kernel:
        """A copy whose generated headers end by defining `switches` ("NAME" as 1, or
        "NAME=VALUE"), under a new name (so a new cubin): the timing and analysis variants of
        spio/include/spio/ablation.h. No switches: this kernel."""
        if not switches:
            return self
        defines = ""
        parts = []
        for switch in switches:
            name, _, value = switch.partition("=")
            defines += f"#define {name} {value or 1}\n"
            short = name.removeprefix("SPIO_ABLATE_").removeprefix("SPIO_").lower()
            parts.append(f"{short}{value}")
        headers = tuple((name, text + "\n" + defines) for name, text in self.headers)
        name = f"{self.name}__variant_{'_'.join(parts)}"
        # The name is readable, not injective (SPIO_ABLATE_X and SPIO_X both give "x"): kernels
        # are kept in memory by name, so two switch sets of one name in a process would share
        # a module. Refused instead, naming both.
        first = _variant_defines.setdefault(name, defines)
        if first != defines:
            raise ValueError(
                f"kernel variant {name} would name two builds: switches {first.split()[1::3]} "
                f"and {defines.split()[1::3]}; rename a switch"
            )
        return replace(self, name=name, headers=headers)

    def compile_job(self, arch: str):
        """A CompileJob for the parallel compile pool."""
        from ..compiler import CompileJob

        return CompileJob(self.source, arch, dict(self.headers), name=f"{self.name}.cu")

    def launch(self, args: list[Any], device: Any) -> None:
        """Run on `device` (a torch.device): a CUDA GPU, or the CPU emulator for device 'cpu'.

        `args` are tensors (passed as pointers), ints, floats, or None for a null pointer.
        """
        if device.type == "cuda":
            null = _null_pointer()
            args = [null if a is None else a for a in args]
            _cuda_function(self, cuda_ordinal(device)).launch_on_current_stream(self, args)
        elif device.type == "cpu":
            _emulator_function(self).launch(
                self.grid,
                self.block,
                args,
                shared_mem_bytes=self.shared_mem_bytes,
                seed=_emulator_order_seed(),
                shared_offset=_emulator_shared_offset(),
                gpu_rules=True,
            )
        else:
            raise ValueError(f"spio kernels run on CUDA devices or the CPU emulator, got {device}")


def cuda_ordinal(device: Any) -> int:
    """The device number of a CUDA torch.device: its index, or PyTorch's current device for a
    bare "cuda" (as PyTorch reads it; not device 0)."""
    if device.index is not None:
        return device.index
    import torch

    try:
        return torch.cuda.current_device()
    except (AssertionError, RuntimeError) as error:  # a CPU build's bare "Torch not compiled..."
        if torch.cuda.is_available():  # another trouble of CUDA's: torch's own error says it
            raise
        from ..cuda import driver

        driver.device_count()  # CudaDriverError, saying why there is no CUDA device
        raise RuntimeError(f"no CUDA device for {device}: torch has none ({error})") from None


@dataclass(frozen=True)
class KernelFactory:
    """One kernel family: its tile configs, how to build a kernel, and how to pick a config."""

    name: str
    configs: Callable[..., list]
    make_kernel: Callable[..., Kernel]
    default_config: Callable[..., Any]
    #: The keyword options get_kernel takes, each a bool (FProp/DGrad: igrad).
    options: tuple[str, ...] = ()

    def get_kernel(self, params: Any, device: Any = None, **options: Any) -> Kernel:
        """The kernel to run `params` on `device` (a torch.device, a string torch.device takes,
        e.g. "cuda:1", or a GPU ordinal; None: any), not yet built: its first launch builds it
        (see build_kernels).

        On a CUDA device the config comes from the performance model of the device's arch
        (SPIO_AUTOTUNE=1: the fastest of its top-k, measured once and cached on disk), else from
        the analytic heuristic `default_config`; see spio.kernels.perf_model. `options`:
        igrad=True for DGrad from conv2d_gw8_kernel_factory (the only option it takes).
        The WGrad factory's kernel adds into dw and dbias atomically (they must be zeroed first;
        conv2d_gw8_wgrad_factory.wgrad does that).
        """
        import torch

        from .conv2d_gw8_params import as_flag, check_params
        from .perf_model import select_config

        where = f"{self.name}_kernel_factory.get_kernel"
        check_params(params, where)
        for option in options:
            if option not in self.options:
                takes = ", ".join(self.options) or "none"
                raise TypeError(f"{where} takes no option {option!r} (its options: {takes})")
        # (Plain bools, as make_kernel's flags: numpy's and 0-d bool tensors count.)
        options = {option: as_flag(where, option, value) for option, value in options.items()}
        # (A torch.device, or what is one by its `type`, as the tests' stand-ins for GPUs.)
        if not (
            device is None
            or isinstance(device, str)
            or type(device) is int
            or hasattr(device, "type")
        ):
            raise TypeError(
                f"{where} needs a device: a torch.device, a string or a GPU ordinal, got {device!r}"
            )
        if isinstance(device, (str, int)):  # as a string "cuda" had the heuristic's config
            try:
                device = (
                    torch.device("cuda", device)
                    if isinstance(device, int)
                    else torch.device(device)
                )
            except RuntimeError as error:  # "gpu", a negative ordinal: torch's reason, named
                raise ValueError(f"{where} needs a device, got {device!r}: {error}") from None
        return self.make_kernel(params, select_config(self, params, device, **options), **options)


class _LoadedCudaFunction:
    """A kernel loaded into one device's primary context (the context PyTorch uses)."""

    def __init__(self, kernel: Kernel, ordinal: int):
        from ..cuda import driver

        device = driver.device_attributes(ordinal)
        limit = device["max_shared_memory_per_block_optin"]
        if kernel.shared_mem_bytes > limit:  # not a launch error with a driver code, later
            raise ValueError(
                f"kernel {kernel.name} needs {kernel.shared_mem_bytes} bytes of shared memory per "
                f"block; {device['name']} ({device['arch']}) allows {limit}. Choose a config with "
                "fewer groups per block, a narrower tile or fewer stages (spio's own configs "
                "keep within 99 KiB, the smallest limit of the GPUs it supports)"
            )
        result = kernel.compile(device["arch"])
        if not result.cached:
            _built_at_first_launch(kernel, result.seconds)
        try:
            self.module = driver.Module.load(result.cubin, device=ordinal)
        except driver.CudaError as error:
            if error.name not in _IMAGE_ERRORS:
                raise
            hint = _image_hint(kernel, device["arch"], driver.driver_version())
            detail = f"{error.detail}; {hint}" if error.detail else hint
            raise driver.CudaError(
                error.code, error.name, error.call, error.description, detail
            ) from None
        self.function = self.module.get_function(kernel.entry)
        # Beyond the function's default limit (48 KiB less its static shared memory): opt in.
        if kernel.shared_mem_bytes > self.function.attributes()["max_dynamic_shared_bytes"]:
            self.function.set_max_dynamic_shared_memory(kernel.shared_mem_bytes)
        self.ordinal = ordinal

    def launch_on_current_stream(self, kernel: Kernel, args: list[Any]) -> None:
        self.function.launch(
            kernel.grid,
            kernel.block,
            args,
            shared_mem_bytes=kernel.shared_mem_bytes,
            stream=current_stream(self.ordinal),
        )


#: What cuModuleLoadData says of a cubin the driver or GPU cannot take.
_IMAGE_ERRORS = frozenset(
    {
        "CUDA_ERROR_INVALID_IMAGE",
        "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "CUDA_ERROR_INVALID_PTX",
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    }
)


def _image_hint(kernel: Kernel, arch: str, driver_cuda: tuple[int, int]) -> str:
    """What to do when the driver refuses `kernel`'s cubin (built for `arch`): most often a
    driver older than the NVRTC that built it, which pip may have installed newer than the
    driver (`driver_cuda`: the CUDA version the driver supports)."""
    from ..cuda import nvrtc

    try:
        built_by = nvrtc.version()
    except Exception:  # NVRTC gone since the build (a cached cubin): nothing to compare
        built_by = None
    drv = f"{driver_cuda[0]}.{driver_cuda[1]}"
    what = f"kernel {kernel.name} ({arch}"
    what += f", built by NVRTC {built_by[0]}.{built_by[1]})" if built_by else ")"
    if built_by is not None and built_by > driver_cuda:
        return (
            f"{what} could not be loaded by a driver for CUDA {drv}, older than the NVRTC that "
            f"built it. Update the NVIDIA driver, or give spio an NVRTC of CUDA {drv} or earlier "
            "(SPIO_NVRTC names its library; `python -m spio info` shows which one spio found)"
        )
    return (
        f"{what} could not be loaded by the driver (CUDA {drv}); `python -m spio info` shows "
        "which NVRTC and headers spio found"
    )


def current_stream(ordinal: int) -> int:
    """The CUstream handle of PyTorch's current stream on device `ordinal`."""
    return _raw_stream()(ordinal)


@functools.cache
def _raw_stream() -> Callable[[int], int]:
    """PyTorch's fastest way to the current stream's handle. torch.cuda.current_stream builds a
    Stream object per call (a few µs, paid on every launch); the raw getter that compilers built
    on PyTorch use returns the handle directly. Fall back to the public API where it is missing."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda ordinal: torch.cuda.current_stream(ordinal).cuda_stream


@functools.cache
def _null_pointer():
    """The null-pointer kernel argument (for None), made once."""
    from ..cuda import driver

    return driver.Pointer(0)


#: Loaded functions by kernel name (the code; see Kernel.name) and device ordinal, and emulated
#: ones by kernel name: one module per code, whatever grid each launch uses.
_loaded: dict[tuple[str, int], _LoadedCudaFunction] = {}
_emulated: dict[str, Any] = {}
#: The lock of one kernel's first load, by key of _loaded or _emulated: a thread waits only
#: for the build it needs, and threads needing different kernels build them at once.
_first_load = KeyedLocks()


def _cuda_function(kernel: Kernel, ordinal: int) -> _LoadedCudaFunction:
    key = (kernel.name, ordinal)
    loaded = _loaded.get(key)
    if loaded is None:
        with _first_load[key]:
            loaded = _loaded.get(key)
            if loaded is None:
                loaded = _loaded[key] = _LoadedCudaFunction(kernel, ordinal)
    return loaded


def _emulator_order_seed() -> int | None:
    """SPIO_EMULATOR_ORDER_SEED=<int>: emulated launches run their blocks, and each block's
    threads, in an order shuffled by that seed instead of in index order; a GPU promises no
    order, and a kernel whose result depends on one fails under some seed. Unset: index order."""
    return integer("SPIO_EMULATOR_ORDER_SEED")


def _emulator_shared_offset() -> int:
    """SPIO_EMULATOR_SHARED_OFFSET=<bytes>: emulated launches start their dynamic shared memory
    that many bytes (a multiple of 16 below 1024) past a 1024-byte boundary, as a GPU may (it
    promises 16-byte alignment): for testing kernels that align their buffers themselves (the
    tensor-copy variants). Unset: at the boundary."""
    offset = integer(
        "SPIO_EMULATOR_SHARED_OFFSET",
        "a multiple of 16 in 0..1008",
        lambda value: value % 16 == 0 and 0 <= value < 1024,
    )
    return offset or 0


def _emulator_function(kernel: Kernel):
    function = _emulated.get(kernel.name)
    if function is None:
        from .. import emulator

        with _first_load[kernel.name]:
            function = _emulated.get(kernel.name)
            if function is None:
                logger.debug("building %s for the CPU emulator", kernel.name)
                module = emulator.load_module(kernel.source, dict(kernel.headers), name=kernel.name)
                library = module.library()
                if not library.cached:
                    _built_at_first_launch(kernel, library.seconds)
                function = _emulated[kernel.name] = module.get_function(kernel.entry)
    return function


#: After this many seconds of building kernels at their first launch, a process says once that
#: spio.precompile builds them ahead (a cold cache, and a model's first step stalls meanwhile).
FIRST_LAUNCH_BUILD_NOTICE_S = 10.0
_first_launch_build_s = 0.0
_first_launch_notice_given = False


_first_launch_lock = threading.Lock()


def _built_at_first_launch(kernel: Kernel, seconds: float) -> None:
    """Counts a build that a launch waited for (not found in the caches)."""
    global _first_launch_build_s, _first_launch_notice_given
    with _first_launch_lock:  # threads build different kernels at once
        _first_launch_build_s += seconds
        if _first_launch_notice_given or _first_launch_build_s < FIRST_LAUNCH_BUILD_NOTICE_S:
            return
        _first_launch_notice_given = True
    logger.warning(
        "spio has spent %.0f s building kernels at their first launch (the latest: %s); the "
        "caller waits meanwhile. spio.precompile(model, x) builds a model's kernels ahead, in "
        "parallel, and they stay cached on disk for later runs. (Said once.)",
        _first_launch_build_s,
        kernel.name,
    )


def build_kernels(kernels: Iterable[Kernel], device: Any, progress: bool = True) -> dict[str, str]:
    """Build every kernel for `device` (a torch.device) in parallel into the disk caches, so that
    each one's first launch only loads it: cubins for a CUDA device's arch by NVRTC in worker
    processes, emulator libraries for the CPU by the host compiler in threads (SPIO_WORKERS of
    either). Returns the kernels that failed to build: name -> error (at most 4,000 characters
    of it); a failed kernel's launch raises the full error."""
    unique = list({k.name: k for k in kernels}.values())
    if not unique:
        return {}
    if device.type == "cuda":
        from ..compiler import compile_many
        from ..cuda import driver

        arch = driver.device_attributes(cuda_ordinal(device))["arch"]
        desc = f"compiling {len(unique)} spio kernels for {arch}"
        jobs = [k.compile_job(arch) for k in unique]
        results = compile_many(jobs, progress=progress, desc=desc)
    elif device.type == "cpu":
        results = _build_emulated(unique, progress)
    else:
        raise ValueError(f"spio kernels run on CUDA devices or the CPU emulator, got {device}")
    return {
        k.name: _clipped(r)
        for k, r in zip(unique, results, strict=True)
        if isinstance(r, BaseException)
    }


def _clipped(error: BaseException, limit: int = 4000) -> str:
    """An error's text, at most `limit` characters of it (a compiler's log can run long)."""
    text = str(error)
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text) - limit} more)"


def _build_emulated(kernels: list[Kernel], progress: bool) -> list[Any]:
    """Each kernel's checked emulator library (what its launch loads), or the exception."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from ..compiler.pool import default_workers
    from ..emulator.build import build_library

    def build(kernel: Kernel) -> Any:
        try:
            return build_library(kernel.source, dict(kernel.headers), name=kernel.name)
        except Exception as error:  # returned: one bad kernel must not stop the others
            return error

    desc = f"building {len(kernels)} spio kernels for the CPU emulator"
    pool = ThreadPoolExecutor(max_workers=min(default_workers(), len(kernels)))
    try:
        futures = {pool.submit(build, k): i for i, k in enumerate(kernels)}
        results: list[Any] = [None] * len(kernels)
        for future in progress_bar(
            as_completed(futures),
            desc=desc,
            total=len(kernels),
            disable=not progress,
            unit="kernel",
        ):
            results[futures[future]] = future.result()
        return results
    finally:  # on an interrupt, the builds not yet started are dropped
        pool.shutdown(wait=True, cancel_futures=True)
