"""spio's command line: python -m spio {info, check, compile, bench, clear-cache}."""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .args import non_empty, positive_int
from .env import SETTINGS

if TYPE_CHECKING:
    from .kernels.kernel import Kernel

_BROKEN = "BROKEN INSTALL"
_BAD_SETTING = "BAD SETTING"
_NOT_WRITABLE = "NOT A WRITABLE FOLDER"
_NOT_FOUND = "NOT FOUND"
_TOO_OLD = "TOO OLD"


def _gpus() -> tuple[list[dict], str | None]:
    """The attributes of each GPU spio sees through the CUDA driver, and, when it sees none, why."""
    try:
        from .cuda import driver
    except ImportError as error:
        shadowed = _shadowing_source_tree()
        if shadowed is not None:
            return [], (
                f"unknown: {_BROKEN}, the spio.cuda.driver extension does not load: spio was "
                f"imported from {shadowed}, a source tree without the built extension, not from "
                "the installed spio (the current folder comes first on sys.path); run from "
                "another folder, or build it there: python setup.py build_ext --inplace"
            )
        return [], f"unknown: {_BROKEN}, the spio.cuda.driver extension does not load ({error})"
    try:
        count = driver.device_count()
    except Exception as error:  # no driver, no device: say why, never crash `info`
        return [], f"no GPU ({error})"
    if count == 0:
        return [], "no GPU (the driver reports 0 devices)"
    return [driver.device_attributes(ordinal) for ordinal in range(count)], None


def _shadowing_source_tree() -> Path | None:
    """The folder spio was imported from where it is a source tree without the compiled driver
    extension while an installed spio (a wheel, another folder) has one: a checkout's `spio/`
    under the current folder shadows the installed package. None otherwise. (Every spio
    distribution is asked: a checkout built with `pip install .` holds its own spio.egg-info,
    found first, which locates the checkout itself.)"""
    import importlib.machinery
    import importlib.metadata

    package = Path(__file__).resolve().parent
    suffixes = importlib.machinery.EXTENSION_SUFFIXES

    def has_driver(folder: Path) -> bool:
        return any((folder / "cuda" / f"driver{suffix}").exists() for suffix in suffixes)

    if has_driver(package):
        return None
    for distribution in importlib.metadata.distributions(name="spio"):
        try:
            installed = Path(str(distribution.locate_file("spio"))).resolve()
        except Exception:  # (a distribution type that cannot locate its files)
            continue
        if installed != package and installed.is_dir() and has_driver(installed):
            return package
    return None


def _gpu_summary(gpus: list[dict], why_none: str | None) -> str:
    """One line for the GPUs of _gpus()."""
    if not gpus:
        why = why_none or "no GPU"
        hint = _emulation_hint()
        # The driver's message names SPIO_EMULATE=1 already: the hint once (where it is off).
        if why.startswith("no GPU") and not (
            hint.startswith("SPIO_EMULATE=1") and "SPIO_EMULATE=1" in why
        ):
            why += "; " + hint
        return why
    from .compiler.arch import builds_for

    def one(i: int, a: dict) -> str:
        text = f"cuda:{i} {a['name']} ({a['arch']}, {a['sm_count']} SMs)"
        if not builds_for(a["arch"]):
            text += ": not an arch spio's kernels run on (PyTorch's convolution runs instead)"
        return text

    return "; ".join(one(i, a) for i, a in enumerate(gpus))


def _emulation_hint() -> str:
    """What spio ops on CPU tensors run, for a machine without a GPU: the emulator where
    SPIO_EMULATE is on, else how to turn it on."""
    from . import emulator

    try:
        on = emulator.is_enabled()
    except ValueError:  # malformed: the settings row says so
        on = False
    if on:
        return "SPIO_EMULATE is on: spio ops on CPU tensors run the real kernels in the emulator"
    return "SPIO_EMULATE=1 runs the real kernels on CPU tensors in the CPU emulator"


def _driver_summary(driver_cuda: tuple[int, int], nvrtc_version: tuple) -> str:
    """The CUDA version the driver supports, and whether it can load what spio's NVRTC
    builds: not when the NVRTC is of a later CUDA major version (cubins of one major version
    load on any driver of that version, NVIDIA's minor version compatibility)."""
    text = f"CUDA {driver_cuda[0]}.{driver_cuda[1]}"
    if nvrtc_version[0] is not None and nvrtc_version[0] > driver_cuda[0]:
        text += (
            f" ({_BROKEN}: spio's NVRTC is of CUDA {nvrtc_version[0]}, whose cubins this driver "
            "cannot load; update the driver, or set SPIO_NVRTC to an NVRTC of CUDA "
            f"{driver_cuda[0]})"
        )
    return text


def _perf_model_rows(gpu_archs: list[str]) -> list[tuple[str, str]]:
    """What the shipped (or SPIO_PERF_MODELS) performance models cover, and which of the GPUs
    present (their archs, by ordinal) none covers: their tile configs come from the analytic
    heuristic. A model whose metadata does not parse or does not fit its place (check_model_slot),
    whose model file is missing or whose bytes are not those its metadata records is reported,
    not counted."""
    from .kernels.families import FAMILIES
    from .kernels.perf_model import (
        PACKAGED_MODELS_DIR,
        PerfModelError,
        check_model_file,
        check_model_slot,
        models_dir,
        models_setting_problem,
        read_meta,
    )

    folder = models_dir()
    shipped = folder == PACKAGED_MODELS_DIR
    if not folder.is_dir():  # a mistyped SPIO_PERF_MODELS must not pass for "no models"
        if shipped:
            return [("perf models", f"{_BROKEN}, the shipped models' folder {folder} is missing")]
        return [("perf models", f"{_BAD_SETTING}: {models_setting_problem()}")]
    by_arch: dict[str, list[dict]] = {}
    damaged = []
    for meta_path in sorted(folder.glob("sm_*/**/*.json")):
        try:
            meta = read_meta(meta_path)
            check_model_slot(folder, meta_path, meta)
            check_model_file(meta_path, meta)
        except PerfModelError as error:  # its layers get the heuristic's configs, with a warning
            damaged.append(str(error))
            continue
        by_arch.setdefault(meta_path.relative_to(folder).parts[0], []).append(meta)
    for model_path in sorted(folder.glob("sm_*/**/*.ubj")):  # a model without its metadata
        if not model_path.with_suffix(".json").exists():
            damaged.append(f"perf model {model_path} has no metadata ({model_path.stem}.json)")

    def listed(meta: dict, key: str) -> list:
        """meta[key] where it is a list, else [] (null, or a damaged file: info never crashes)."""
        value = meta.get(key)
        return value if isinstance(value, list) else []

    rows = []
    for arch, metas in sorted(by_arch.items()):
        families = [m.get("family") for m in metas]
        passes = ", ".join(f.removeprefix("conv2d_gw8_") for f in FAMILIES if f in families)
        devices = sorted({str(d) for m in metas for d in listed(m, "measured_on")})
        sizes = sorted(
            {n for m in metas for n in listed(m, "batch_sizes") if type(n) is int and n > 0}
        )
        rows.append(
            f"{arch}: {passes} (measured on {', '.join(devices) or 'unknown'}; "
            f"N {', '.join(map(str, sizes)) or '?'})"
        )
    if not rows:
        rows.append(f"none in {folder}")
    label = _BROKEN if shipped else f"{_BAD_SETTING}: SPIO_PERF_MODELS={folder}"
    rows.extend(f"{label}: {problem}" for problem in damaged)
    for ordinal, arch in enumerate(gpu_archs):
        if arch not in by_arch:
            rows.append(
                f"cuda:{ordinal} ({arch}): no model applies; the analytic heuristic picks tile "
                "configs (SPIO_AUTOTUNE=1 times its top candidates on first use)"
            )
    return [("perf models" if i == 0 else "", row) for i, row in enumerate(rows)]


def _count(n: int, noun: str) -> str:
    """ "1 file", "2 files": `n` and `noun`, with an s unless n is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _human_bytes(n: int) -> str:
    """`n` bytes as "n B" under a KiB, else in KiB, MiB or GiB to one decimal."""
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def cmd_info(args: argparse.Namespace) -> int:
    from . import __version__, supported_arch
    from .compiler.cache import NAMESPACES, cache_root, own_size
    from .cuda import nvrtc, paths
    from .emulator.module import noexec

    rows: list[tuple[str, str]] = [("spio", __version__)]
    rows.append(("python", f"{platform.python_version()} at {sys.executable}"))
    try:
        import torch

        rows.append(("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"))
    except ImportError:
        rows.append(("torch", "not installed"))
    major = minor = library = None
    try:  # report, don't crash: info is the first thing users run
        library = nvrtc.library_path()
        major, minor = nvrtc.version()
        rows.append(("NVRTC", f"{major}.{minor} at {library}"))
    except Exception as error:
        rows.append(("NVRTC", _nvrtc_problem(library, error)))
    try:
        headers = paths.find_cuda_include(prefer_major=major, nvrtc=library)  # as compiles use
        rows.append(("CUDA headers", _cuda_headers_summary(headers, major, minor)))
    except Exception as error:
        rows.append(("CUDA headers", f"{_label('SPIO_CUDA_INCLUDE')}, not found: {error}"))
    rows.append(("spio headers", str(paths.bundled_include_dir())))
    gpus, why_none = _gpus()
    rows.append(("GPU", _gpu_summary(gpus, why_none)))
    if gpus:
        from .cuda import driver

        try:
            rows.append(("driver", _driver_summary(driver.driver_version(), (major, minor))))
        except Exception as error:  # info reports, never crashes
            rows.append(("driver", f"version unknown ({error})"))
    rows.append(("supported arch", ", ".join(supported_arch)))
    rows.append(("emulator", _emulator_compiler_summary()))
    rows.extend(_perf_model_rows([gpu["arch"] for gpu in gpus]))
    root = cache_root()  # spio's folders there only: SPIO_CACHE_DIR may hold other things too
    sizes = [own_size(root / namespace) for namespace in NAMESPACES]
    files, total = sum(n for n, _ in sizes), sum(b for _, b in sizes)
    cache = _cache_problem(root) or f"{root} ({_count(files, 'file')}, {_human_bytes(total)})"
    if noexec(root):
        cache += "; mounted noexec: the emulator loads its libraries from memory copies"
    rows.append(("cache", cache))
    rows.append(("settings", _settings_summary()))
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    # No GPU is fine (the emulator and the PyTorch reference still work); a missing part, or a
    # setting that names something unusable, is not. A cache spio cannot write is reported but
    # is not a failure: kernels are then kept in memory, and everything still runs.
    problems = (_BROKEN, _BAD_SETTING)
    return 1 if any(p in value for _, value in rows for p in problems) else 0


def _settings_summary() -> str:
    """The SPIO_* variables set, and a BAD SETTING for each that does not parse."""
    set_ = [
        f"{name}={value}" for name, value in sorted(os.environ.items()) if name.startswith("SPIO_")
    ]
    text = ", ".join(set_) if set_ else "no SPIO_* variable set"
    unknown = [
        name
        for name in sorted(os.environ)
        if name.startswith("SPIO_") and name not in SETTINGS and not name.startswith("SPIO_TEST_")
    ]
    if unknown:  # a typo (SPIO_EMULTE=1) reads as nothing set: say so, as a note (exit 0)
        text += f"; not spio settings (a typo?): {', '.join(unknown)}"
    problems = _setting_problems() + _info_only_problems()
    if problems:
        text += "; " + "; ".join(f"{_BAD_SETTING}: {problem}" for problem in problems)
    return text


def _info_only_problems() -> list[str]:
    """Settings only info checks: SPIO_LIBCUDA naming no driver library (the driver is opened at
    the first GPU call, where an unusable one reads as "no GPU"), SPIO_NVDISASM naming no
    program (used only by scripts/), and SPIO_LOGGER malformed (which the other commands only
    warn of, at import)."""
    from .compiler.sass import find_nvdisasm
    from .env import path_or_name
    from .log import logger_setting_problem

    problems = []
    libcuda = path_or_name("SPIO_LIBCUDA")
    if libcuda:
        problem = _libcuda_problem(libcuda)
        if problem:
            problems.append(
                f"SPIO_LIBCUDA must name the CUDA driver library, got "
                f"{os.environ['SPIO_LIBCUDA']!r}, {problem}"
            )
    try:
        find_nvdisasm()
    except ValueError as error:  # SPIO_NVDISASM naming no program
        problems.append(str(error))
    logger = logger_setting_problem()
    if logger:
        problems.append(logger)
    return problems


def _libcuda_problem(path: str) -> str | None:
    """Why `path` (SPIO_LIBCUDA) is no CUDA driver library: no file there, or a file that does
    not load, or a library without cuInit, or a bare name the dynamic loader does not find;
    None where it loads, and for the default's name, libcuda.so.1, on a machine without a
    driver (the GPU row says so, and no GPU is no failure of info)."""
    import ctypes

    if "/" in path and not os.path.isfile(path):  # a bare name is the loader's to find
        return "no file"
    try:
        library = ctypes.CDLL(path)
    except OSError as error:
        if "/" in path:
            return f"which does not load ({error})"
        return None if path == "libcuda.so.1" else "which the dynamic loader does not find"
    if not hasattr(library, "cuInit"):
        return "which has no entry point cuInit"
    return None


def _cuda_headers_summary(folder, major: int | None = None, minor: int | None = None) -> str:
    """The headers' folder and CUDA version; headers too old for the CPU emulator are reported,
    not a failure of `info` (NVRTC builds GPU kernels with them); headers of another major
    version than NVRTC's (`major`, `minor`) are a broken install."""
    from .compiler.compile import headers_mismatch
    from .cuda.paths import cuda_headers_version
    from .emulator.build import MIN_CUDA_HEADERS, dotted

    version = cuda_headers_version(folder)
    if version is None:
        return str(folder)
    summary = f"{dotted(version)} at {folder}"
    if major is not None and minor is not None:
        mismatch = headers_mismatch(folder, (major, minor))
        if mismatch:
            summary += f"; {_BROKEN}: {mismatch}"
    if version < MIN_CUDA_HEADERS:  # the test check_cuda_headers makes
        summary += f"; {_TOO_OLD} for the CPU emulator, which needs {dotted(MIN_CUDA_HEADERS)}+"
    return summary


def _emulator_compiler_summary() -> str:
    """The host C++ compiler the CPU emulator builds kernels with, and its version. One that
    does not run, or is too old, is reported, not a failure of `info`: only the emulator needs
    it."""
    from .emulator.build import (
        MIN_CLANG,
        UNSET_LOCALS_FLAG,
        EmulatorBuildError,
        check_flags,
        compiler,
        compiler_version,
    )

    cxx = compiler()
    try:
        version = compiler_version(cxx)
    except EmulatorBuildError as error:
        return f"{_NOT_FOUND} ({error})"
    try:
        flags = check_flags(cxx)
    except EmulatorBuildError:
        return f"{cxx}: {version}; {_TOO_OLD}: the emulator needs clang {MIN_CLANG}+ or g++"
    if UNSET_LOCALS_FLAG not in flags:  # (GCC 11): the checks miss a local never set
        return (
            f"{cxx}: {version}; checked kernels' locals start as zeros, not a pattern "
            f"({UNSET_LOCALS_FLAG} needs GCC 12 or clang 16): a local never set goes unseen"
        )
    return f"{cxx}: {version}"


def _label(setting: str) -> str:
    """A row's problem label: a BAD SETTING where `setting` chose what failed, else a BROKEN
    INSTALL (what spio found by itself)."""
    return _BAD_SETTING if os.environ.get(setting, "").strip() else _BROKEN


def _nvrtc_problem(library, error: Exception) -> str:
    """The NVRTC row when libnvrtc was not found (library None) or was found but does not load
    (nvrtc's NvrtcError, whose cause is the loader's own error)."""
    from .cuda import nvrtc

    if library is None:
        return f"{_label('SPIO_NVRTC')}, not found: {error}"
    cause = error.__cause__ or error
    return (
        f"{_label('SPIO_NVRTC')}, {library} was found but cannot be loaded ({cause}); "
        f"{nvrtc.how_to_mend_loading()}"
    )


def _cache_problem(root) -> str | None:
    """Why spio cannot keep its cache in `root` (a folder another user could put files in, a
    file there, or a folder it cannot create or write a file in), or None. It tries, as the
    cache does: a permission check (os.access) passes for root everywhere, e.g. in /proc.
    Folders and the file it makes are removed."""
    from .compiler.cache import TRUST_ADVICE, why_untrusted

    distrust = why_untrusted(root)
    if distrust is not None:
        return (
            f"{root}: NOT USED ({distrust}: another user could put kernels there); "
            f"{TRUST_ADVICE}, else every process builds its kernels again"
        )
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    why: str | None
    if not existing.is_dir():
        why = f"{existing} is a file"
    else:
        why = _write_problem(root, existing)
    if why is None:
        return None
    return (
        f"{root}: {_NOT_WRITABLE} ({why}); set SPIO_CACHE_DIR to a writable folder, else every "
        "process builds its kernels again"
    )


def _write_problem(root, existing) -> str | None:
    """Why creating folder `root` (below `existing`, its deepest existing folder) and a file in
    it fails, or None; what it made is removed."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".spio-info-"):
            pass
    except OSError as error:
        return f"creating it, or a file in it, fails: {error.strerror or error}"
    finally:
        folder = root
        while folder != existing and folder != folder.parent:  # the folders made here
            try:
                folder.rmdir()
            except FileNotFoundError:  # not made: the mkdir failed below its parent
                pass
            except OSError:  # no longer empty (another process's cache)
                break
            folder = folder.parent
    return None


def cmd_clear_cache(args: argparse.Namespace) -> int:
    """Remove spio's files from its folders under the cache root (NAMESPACES), those folders
    where that empties them, and the root too; never anything else there, as SPIO_CACHE_DIR may
    name a folder shared with other data (another program's `autotune` folder in ~/.cache).
    Exit 1, naming the first error, when a file cannot be removed (another user's cache)."""
    from .compiler.cache import NAMESPACES, cache_root, remove_own_files

    root = cache_root()
    if not root.is_dir():  # said as it is, not as "removed 0 files from" a folder there is not
        kind = "no cache folder at" if not root.exists() else "not a folder, no cache:"
        print(f"{kind} {root}; nothing removed")
        return 0
    files = total = 0
    errors: list[OSError] = []
    for namespace in NAMESPACES:
        count, size, failed = remove_own_files(root / namespace)
        files, total, errors = files + count, total + size, errors + failed
    try:
        root.rmdir()  # only when empty
    except OSError:
        pass
    print(f"removed {_count(files, 'file')} ({_human_bytes(total)}) from {root}")
    if errors:
        print(
            f"spio clear-cache: {_count(len(errors), 'file')} could not be removed, the first: "
            f"{errors[0]}",
            file=sys.stderr,
        )
        return 1
    return 0


#: Configs `spio compile` makes, compiles and reports at a time (see cmd_compile).
COMPILE_CHUNK = 32


def cmd_compile(args: argparse.Namespace) -> int:
    """`spio compile`: every kernel spio runs, for the layer set's layers, compiled for each
    arch, a table row a compile. Exit 1 where one failed or spilled; 2, compiling nothing, for
    an argument or setup problem (_compile_setup_problem)."""
    from . import supported_arch
    from .compiler import check_arch

    # A repeated --arch once: compiling every kernel twice for it would only double the time.
    archs = list(dict.fromkeys(args.arch)) if args.arch else [check_arch(a) for a in supported_arch]
    problem = _compile_setup_problem(args, archs)
    if problem is not None:
        print(f"spio compile: {problem}", file=sys.stderr)
        return 2
    pairs = _compile_pairs(args)
    print(
        f"compiling the kernels spio runs for {_count(len(pairs), 'config')} (each operand "
        f"layout of FProp and DGrad, and the sum_slots kernels after partials WGrad kernels, "
        f"into each gradient dtype) for {', '.join(archs)}"
    )
    tally = _compile_table(pairs, archs)
    print(
        f"{_count(tally.kernels, 'kernel')}, {tally.sums} of them sum_slots (run after partials "
        "WGrad kernels)"
    )
    print(
        f"{tally.kernels * len(archs)} compiles: {tally.failures} failed, {tally.spills} spilled, "
        f"{tally.warned} with warnings"
    )
    return 1 if tally.failures or tally.spills else 0


def _compile_setup_problem(args: argparse.Namespace, archs: list[str]) -> str | None:
    """Why `spio compile` compiles nothing (exit 2), before making a kernel: a --kernel that
    names no family, --seed without --sample, NVRTC or the CUDA headers not found, or an arch
    this NVRTC cannot compile for; None where none is so."""
    from .compiler.compile import toolchain_identity
    from .cuda import nvrtc
    from .kernels.families import FAMILIES

    names = args.kernel or []
    unmatched = [name for name in names if not any(name in f for f in FAMILIES)]
    if unmatched:
        return (
            f"no kernel family matches {', '.join(map(repr, unmatched))}; "
            f"families: {', '.join(FAMILIES)}"
        )
    if args.seed is not None and not args.sample:
        return "--seed picks --sample's configs; give --sample too"
    try:  # what every compile needs: one line now, not a FAILED line for each kernel
        toolchain_identity()
    except (OSError, RuntimeError) as error:  # CudaNotFoundError, NvrtcError
        return (
            f"setup error: nothing was compiled: {error}\n"
            "`python -m spio info` shows where spio looked for its tools"
        )
    problem = nvrtc.archs_lacking(archs)
    if problem is not None:
        return f"nothing was compiled: {problem}"
    return None


def _compile_pairs(args: argparse.Namespace) -> dict[str, tuple]:
    """The (family, layer, config) of each config `spio compile` compiles the kernels of: every
    config of the layer set's layers in the families --kernel names (default: all), in order,
    or --sample of them at random (--seed, default 0)."""
    import random

    from .kernels.families import FAMILIES
    from .kernels.layer_sets import compile_layer_set

    names = args.kernel or []
    families = [f for f in FAMILIES if not names or any(name in f for name in names)]
    # (layer, config) pairs by their family, layer and config, the parts of their kernel's name
    # (a variant only adds a suffix), so that --sample picks as it would among the kernels,
    # generating only the ones it picks.
    pairs = {}
    for params in compile_layer_set():
        for family in families:
            for config in FAMILIES[family].configs(params):
                pairs[f"{family}__{params.encode()}__{config.encode()}"] = (family, params, config)
    keys = sorted(pairs)
    if args.sample and args.sample < len(keys):
        keys = random.Random(args.seed or 0).sample(keys, args.sample)
    elif args.sample:
        print(f"--sample {args.sample} is at least the {len(keys)} configs there are: all of them")
    return {key: pairs[key] for key in keys}


@dataclasses.dataclass
class _CompileTally:
    """What `spio compile` counted: the kernels made (`sums` of them sum_slots kernels), and the
    compiles (a kernel for an arch: kernels x archs) that failed, spilled or warned."""

    kernels: int = 0
    sums: int = 0
    failures: int = 0
    spills: int = 0
    warned: int = 0


def _compile_table(pairs: dict[str, tuple], archs: list[str]) -> _CompileTally:
    """Make, compile for each of `archs` and report, a table row each, the kernels of `pairs`
    (_compile_pairs), with a progress bar of the configs done; returns the counts."""
    from .compiler import compile_many
    from .kernels.conv2d_gw8_factory import tensor_copies
    from .kernels.conv2d_gw8_wgrad_factory import SUM_ENTRY
    from .kernels.families import FAMILIES, with_tensor_copies
    from .log import progress_bar

    keys = list(pairs)
    # A kernel's name is its key less the batch size, and a variant's suffix at most this long.
    suffix = "__wcl__belem" + ("__tmaio" if tensor_copies()[0] else "")
    name_width = max(len(key) for key in keys) + len(suffix)
    arch_width = max(len(arch) for arch in archs)  # sm_100 and sm_120 are wider than sm_90
    print(f"{'kernel':<{name_width}}  {'arch':<{arch_width}}  regs  spill(B)  smem(B)")
    # In chunks of configs, each made, compiled and reported before the next is made: the whole
    # layer set at once had held every kernel's source and every compile's cubin and PTX in
    # memory (~15 GB for the full sweep).
    bar = progress_bar(total=len(keys), desc="compiling kernels", unit="config")
    seen: set[str] = set()
    tally = _CompileTally()
    for start in range(0, len(keys), COMPILE_CHUNK):
        chunk = keys[start : start + COMPILE_CHUNK]
        made = []
        for key in chunk:
            family, params, config = pairs[key]
            made += FAMILIES[family].runnable_kernels(params, config)
        # Each once (a layer's sum_slots kernels follow each of its partials WGrad kernels).
        chosen = sorted(
            {k.name: k for k in made if k.name not in seen}.values(), key=lambda k: k.name
        )
        seen.update(k.name for k in chosen)
        tally.kernels += len(chosen)
        tally.sums += sum(1 for k in chosen if k.entry == SUM_ENTRY)
        # Each as spio runs it on the arch (with SPIO_TMA, sm_90's moving rows by tensor copies).
        jobs = [(with_tensor_copies(k, arch), arch) for k in chosen for arch in archs]
        results = compile_many([k.compile_job(a) for k, a in jobs], progress=False)
        for (kernel, arch), result in zip(jobs, results, strict=True):
            head = f"{kernel.name:<{name_width}}  {arch:<{arch_width}}"
            for line in _compile_rows(head, kernel, result, tally):
                bar.write(line)
        bar.update(len(chunk))
    bar.close()
    return tally


def _compile_rows(head: str, kernel: Kernel, result: object, tally: _CompileTally) -> list[str]:
    """The table's row for `kernel`'s compile `result` (a CompileResult, or the error), which
    `head` begins (its name and arch), and its compiler warnings; counted in `tally`."""
    from .compiler import CompileResult

    if not isinstance(result, CompileResult):
        tally.failures += 1
        return [f"{head}  FAILED: {result}"]
    usage = result.resources.get(kernel.entry)
    if usage is None:
        tally.failures += 1
        return [f"{head}  FAILED: no entry {kernel.entry}"]
    tally.spills += usage.spills
    warnings = result.warnings  # read from the log on each access
    tally.warned += bool(warnings)
    smem = usage.shared_bytes + kernel.shared_mem_bytes
    flags = ("  SPILLS" if usage.spills else "") + ("  WARNINGS" if warnings else "")
    spilled = usage.spill_stores + usage.spill_loads
    row = f"{head}  {usage.registers:4d}  {spilled:8d}  {smem:7d}{flags}"
    return [row, *(f"    {line}" for line in warnings)]


def cmd_check(args: argparse.Namespace) -> int:
    from .check import cmd_check as run

    return run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.cli import cmd_bench as run

    return run(args)


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
    "info": (
        cmd_info,
        "versions, where NVRTC and the headers were found, GPU, cache folder, SPIO_* settings; "
        "exit 1 when a part is missing or does not load, or a SPIO_* setting is bad",
    ),
    "compile": (
        cmd_compile,
        "compile every config of every kernel for the built-in layer set (with the sum_slots "
        "kernels that partials WGrad kernels run after them), listing compiler "
        "warnings; exit 1 on any failure or spill, 2 when --kernel matches no family, "
        "NVRTC or the CUDA headers are not found, or NVRTC cannot compile for an --arch",
    ),
    "check": (
        cmd_check,
        "numerical self-test of every kernel pass in fp16 and bf16 against float64 references "
        "(the GPU if the kernels run on it, else the CPU emulator); exit 1 on any failure, 2 "
        "when no kernel can be built or --device cuda finds no GPU they run on",
    ),
    "bench": (
        cmd_bench,
        "time spio vs PyTorch (cuDNN) vs a device copy on the layer table; table, CSV and plots "
        "(needs a GPU, except --plot-only); exit 2 without a GPU or on bad arguments or an "
        "output folder that cannot be written, 1 when a timing fails or the plots cannot be "
        "drawn",
    ),
    "clear-cache": (
        cmd_clear_cache,
        "delete every cached cubin, emulator library and autotuning result; exit 1 when a "
        "file cannot be removed",
    ),
}


def _arch(text: str) -> str:
    """An --arch value spio compiles for; a usage error (exit 2) names the known ones otherwise.
    (Not warned of as experimental here: cmd_compile may still refuse it; compile_many warns.)"""
    from .compiler.arch import check_arch

    try:
        return check_arch(text, warn=False)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    from . import __version__, experimental_arch, supported_arch

    # As it was called: the `spio` console script, or python -m spio.
    prog = "spio" if Path(sys.argv[0]).name == "spio" else "python -m spio"
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        epilog="Every command: exit 2 on bad arguments, 130 when interrupted (Ctrl-C), 141 when "
        "its output's reader went away (`| head`); check, compile and bench also exit 2 on a "
        "malformed SPIO_* setting (SPIO_LOGGER's is a warning; info reports each, exit 1; "
        "clear-cache reads only SPIO_CACHE_DIR).",
    )
    parser.add_argument("--version", action="version", version=f"spio {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name, (_, help_text) in COMMANDS.items():
        parsers[name] = sub.add_parser(name, help=help_text, description=help_text)
    compile_parser = parsers["compile"]
    compile_parser.add_argument(
        "--arch",
        action="append",
        type=_arch,
        help=f"{', '.join(supported_arch)}, or experimental (untested) "
        f"{', '.join(experimental_arch)} (repeatable; default: all but the experimental)",
    )
    compile_parser.add_argument(
        "--kernel",
        action="append",
        type=non_empty,
        metavar="NAME",
        help="only kernel families (conv2d_gw8_fprop, _dgrad, _wgrad) whose name contains NAME "
        "(repeatable: those of any NAME)",
    )
    compile_parser.add_argument(
        "--sample",
        type=positive_int,
        metavar="N",
        help="compile the kernels of a random sample of N configs (and the sum_slots kernels "
        "they need)",
    )
    compile_parser.add_argument(
        "--seed", type=int, metavar="S", help="seed for --sample (default 0; only with --sample)"
    )
    from .bench.cli import add_arguments as add_bench_arguments
    from .check import add_arguments as add_check_arguments

    add_check_arguments(parsers["check"])
    add_bench_arguments(parsers["bench"])
    return parser


def _setting_problems() -> list[str]:
    """The message of every SPIO_* setting that has a parser and does not parse (each parser
    raises a ValueError starting with the setting's name)."""
    from . import emulator
    from .compiler.pool import default_workers
    from .emulator.build import use_ucontext
    from .kernels.autotune import autotune_enabled, top_k
    from .kernels.conv2d_gw8_factory import tensor_copies
    from .kernels.kernel import _emulator_order_seed, _emulator_shared_offset
    from .kernels.perf_model import check_models_setting

    problems = []
    for parse in (
        check_models_setting,
        default_workers,
        _emulator_order_seed,
        _emulator_shared_offset,
        top_k,
        autotune_enabled,
        emulator.is_enabled,
        use_ucontext,
        tensor_copies,
    ):
        try:
            parse()
        except ValueError as error:
            if not str(error).startswith("SPIO_"):
                raise
            problems.append(str(error))
    return list(dict.fromkeys(problems))  # SPIO_AUTOTUNE's parser checks SPIO_AUTOTUNE_TOPK too


#: Commands that run whatever the SPIO_* settings say: `info` reports a bad one among its rows,
#: and `clear-cache` reads none of them.
_RUN_WITH_BAD_SETTINGS = ("info", "clear-cache")


def main(argv: list[str] | None = None) -> int:
    return _run_command(build_parser().parse_args(argv))


def _run_command(args: argparse.Namespace) -> int:
    """The parsed command's exit status: settings checked, the command run, its errors and
    Ctrl-C turned into one line and a status."""
    try:
        if args.command not in _RUN_WITH_BAD_SETTINGS:
            # A bad setting stops the command before any work instead of part way through.
            problems = _setting_problems()
            if problems:
                for problem in problems:
                    print(f"spio: error: {problem}", file=sys.stderr)
                return 2
        status = COMMANDS[args.command][0](args)
        sys.stdout.flush()  # here, where a reader that went away is caught, not at exit
        return status
    except BrokenPipeError:  # `spio compile | head`: the reader has what it wanted; no traceback
        _stdout_to_devnull()
        return 141  # as a shell reports a command ended by SIGPIPE (128 + 13)
    except ValueError as error:  # spio's convention: a bad SPIO_X setting's message starts "SPIO_"
        if not str(error).startswith("SPIO_"):
            raise
        print(f"spio: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # output to a full disk (`spio info > /dev/full`): one line
        # (An error of a named file is another's; so is one where stdout still takes writes.)
        failure = None if error.filename is not None else _output_failure()
        if failure is None:
            raise
        print(f"spio {args.command}: cannot write its output: {failure}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback; 130 as a shell reports SIGINT
        print(_interrupted(args.command), end="", file=sys.stderr)
        return 130


def _interrupted(command: str) -> str:
    """What spio says on stderr when Ctrl-C stops a command (a line of its own)."""
    return f"\nspio {command}: interrupted\n"


def _output_failure() -> OSError | None:
    """The error writing stdout gives (tried with a line end, as a failed write leaves nothing
    buffered to flush), or None where it takes writes; on an error stdout is pointed at devnull."""
    try:
        sys.stdout.write("\n")
        sys.stdout.flush()
    except OSError as error:
        _stdout_to_devnull()
        return error
    return None


def _stdout_to_devnull() -> None:
    """Point stdout at devnull: Python flushes it again at exit, which then cannot fail."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run() -> None:
    """The `spio` program (`python -m spio`, the console script): main(), then the exit. Ctrl-C
    while Python exits (its atexit callbacks, torch's and the compile pool's, take up to a
    second) ends the process at once, as during the command: one line and exit 130, not a
    traceback and the command's own status. Warnings clear the progress bars around them."""
    from . import log

    log.show_warnings()
    if log.command_warning:  # a malformed SPIO_LOGGER, met at `import spio`
        log.logger.warning(log.command_warning)
    args = build_parser().parse_args()
    status = _run_command(args)

    def interrupted(signum: int, frame: object) -> None:
        os.write(sys.stderr.fileno(), _interrupted(args.command).encode())
        os._exit(130)

    signal.signal(signal.SIGINT, interrupted)
    sys.exit(status)


if __name__ == "__main__":
    run()
