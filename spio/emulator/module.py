"""EmuModule / EmuFunction: the GPU driver's module API, running kernels on CPU tensors.

Emulated launches take turns in the whole process, whichever library they run (one lock, held
while the C++ runtime runs): a library's runtime keeps its launch's state in globals, and every
launch installs its runtime's SIGSEGV handler for the process (saving the handler it finds and
putting it back at its end). Launches of two libraries overlapping in two threads put the
handlers back out of order and left a stale one installed, which later chained to itself instead
of reaching Python's faulthandler or ending the process. Nothing in spio launches emulated
kernels from several threads at once; threads that do (a model served from threads on the CPU)
wait for each other's launches.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import threading
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from ..cuda.tensor_map import EMULATOR_MAGIC
from ..log import logger
from .build import EmulatorBuildError, Library, build_library

#: Shared memory per block of the largest supported arch (sm_90: 227 KiB).
MAX_SHARED_BYTES = 227 * 1024
MAX_THREADS_PER_BLOCK = 1024
_MAX_BLOCK = (1024, 1024, 64)
_MAX_GRID = (2**31 - 1, 65535, 65535)
#: Unregistered bytes placed on either side of a tensor copied for a checked launch: as many as
#: the tensor has, within these bounds (untouched, they cost only address space), so that an
#: index a whole tensor's length past one lands in its guard, not in the next tensor's copy.
_REDZONE_MIN = 256
_REDZONE_MAX = 16 << 20


def _redzone(nbytes: int) -> int:
    """The guard zone's bytes for a tensor of `nbytes` (a multiple of 64)."""
    return -(-min(max(nbytes, _REDZONE_MIN), _REDZONE_MAX) // 64) * 64


#: The first 8 bytes of a tensor map in the emulator's layout (spio.cuda.tensor_map); its next 8
#: bytes are the tensor's global address.
_MAP_MAGIC = EMULATOR_MAGIC.to_bytes(8, "little")


class EmulatorError(RuntimeError):
    """A hazard found while emulating a kernel (out of bounds, race, stale cp.async read, ...)."""


class _Launch(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint32 * 3),
        ("block", ctypes.c_uint32 * 3),
        ("dynamic_shared_bytes", ctypes.c_uint64),
        ("ranges", ctypes.POINTER(ctypes.c_uint64)),
        ("num_ranges", ctypes.c_uint32),
        ("check", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
        ("shuffle", ctypes.c_uint32),
        ("dynamic_offset", ctypes.c_uint32),
        ("kernel_name", ctypes.c_char_p),
    ]


@dataclass(frozen=True)
class _Loaded:
    library: Library
    handle: ctypes.CDLL


#: Held by every emulated launch while its library's runtime runs (see the module's docstring).
#: A library's runtime keeps one launch's state in globals, shared by every EmuModule that loads
#: its file (dlopen loads a file once); and the SIGSEGV handler a launch installs and puts back
#: is the process's, so launches of different libraries must not overlap either.
_launch_lock = threading.RLock()
# A fork waits for a launch in progress (another thread's) to end: a child forked mid-launch
# found the lock held for ever, and the runtime's globals and signal handler mid-launch. (An
# RLock: a signal handler that forks, run by the launching thread between its launch's
# statements, takes it again where a Lock would wait for itself.)
os.register_at_fork(
    before=_launch_lock.acquire,
    after_in_parent=_launch_lock.release,
    after_in_child=_launch_lock.release,
)


def noexec(folder: Path) -> bool:
    """True when `folder`'s file system (its deepest existing folder's) is mounted noexec (a
    hardened /tmp or home), where the kernel refuses to map a library's code: dlopen fails with
    "failed to map segment from shared object"."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_NOEXEC)
    except (OSError, AttributeError):
        return False


#: Libraries loaded from memory, by file, with the descriptors that name them: one open
#: descriptor per library, never closed. dlopen knows a loaded library by its path, so a closed
#: descriptor's number, reused by the next library's, would hand back the first library.
_from_memory: dict[Path, tuple[int, ctypes.CDLL]] = {}
_from_memory_lock = threading.Lock()


def _dlopen(path: Path) -> ctypes.CDLL:
    """The library at `path`, loaded; from a copy in memory (memfd) when its folder is mounted
    noexec, so that a cache on such a file system still serves. Loading a file twice gives one
    handle, as dlopen does."""
    if not noexec(path.parent):
        try:
            return ctypes.CDLL(str(path))
        except OSError as error:
            raise EmulatorBuildError(f"cannot load the emulator library {path}: {error}") from error
    with _from_memory_lock:
        hit = _from_memory.get(path)
        if hit is not None:
            return hit[1]
        fd = None
        try:
            fd = os.memfd_create(path.name, os.MFD_CLOEXEC)
            with open(fd, "wb", closefd=False) as copy:
                copy.write(path.read_bytes())
            handle = ctypes.CDLL(f"/proc/self/fd/{fd}")
        except (OSError, AttributeError) as error:  # AttributeError: no memfd on this system
            if fd is not None:
                os.close(fd)
            raise EmulatorBuildError(
                f"cannot load the emulator library {path}: its folder is on a file system "
                f"mounted noexec, and loading it from memory failed ({error}). Set SPIO_CACHE_DIR "
                "to a folder on a file system that allows running programs."
            ) from error
        if not _from_memory:
            logger.info(
                "%s is on a file system mounted noexec: emulator libraries are loaded from "
                "memory copies",
                path.parent,
            )
        _from_memory[path] = (fd, handle)
        return handle


def _dims(value: Any, what: str, limits: tuple[int, int, int]) -> tuple[int, int, int]:
    """`value` (an int, or 1 to 3 of them) as three dims: TypeError for a value of another type
    (a float, None, a bool), ValueError for other counts or dims out of range, as the driver's
    launch (spio.cuda.driver) has them."""
    try:
        dims = (value,) if isinstance(value, int) else tuple(value)
    except TypeError:  # neither an int nor a sequence (a float, None)
        dims = None
    if dims is None or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"{what} must be an int or 1-3 ints, got {value!r}")
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must be an int or 1-3 ints, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    for axis, (d, lim) in enumerate(zip(dims, limits, strict=False)):
        if not 1 <= d <= lim:
            raise ValueError(f"{what}[{axis}] must be in 1..{lim}, got {d} ({what}={value!r})")
    return dims  # type: ignore[return-value]


def _launch_dims(
    grid: Any, block: Any, shared_mem_bytes: int, shared_offset: int, seed: int | None
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A launch's arguments checked, in this order (grid, block, threads per block, shared bytes,
    `shared_offset`, seed), before anything is built: the grid and block as three dims each."""
    grid3 = _dims(grid, "grid", _MAX_GRID)
    block3 = _dims(block, "block", _MAX_BLOCK)
    threads = math.prod(block3)
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(
            f"a block has at most {MAX_THREADS_PER_BLOCK} threads, got {threads} (block={block!r})"
        )
    if not isinstance(shared_mem_bytes, int) or isinstance(shared_mem_bytes, bool):
        raise TypeError(f"shared_mem_bytes must be an int, got {shared_mem_bytes!r}")
    if shared_mem_bytes < 0:
        raise ValueError(f"shared_mem_bytes must be an int >= 0, got {shared_mem_bytes!r}")
    if not isinstance(shared_offset, int) or shared_offset % 16 or not 0 <= shared_offset < 1024:
        raise ValueError(
            f"shared_offset must be a multiple of 16 in 0..1008, got {shared_offset!r}"
        )
    if seed is not None and (not isinstance(seed, Integral) or isinstance(seed, bool)):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    return grid3, block3


def _span(t: Any) -> tuple[int, int]:
    """[lo, hi) bytes a tensor's elements occupy."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride(), strict=False):
        extent = (size - 1) * stride
        if extent < 0:
            lo += extent
        else:
            hi += extent
    return t.data_ptr() + lo * t.element_size(), t.data_ptr() + (hi + 1) * t.element_size()


def _dense(t: Any) -> bool:
    """Whether t's elements fill their span exactly once (contiguous, channels_last, any
    permutation of dims): ordered by stride, each dim's stride is the product of the sizes
    below it. A self-overlapping view of the same span's size is not."""
    step = 1
    for stride, size in sorted((abs(st), s) for s, st in zip(t.shape, t.stride(), strict=True)
                               if s > 1):  # fmt: skip
        if stride != step:
            return False
        step *= size
    return True


def _byte_view(t: Any, lo: int, nbytes: int) -> Any:
    """The `nbytes` bytes of t's storage from address `lo`, as a flat uint8 tensor."""
    import torch

    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage, lo - storage.data_ptr(), (nbytes,), (1,))


def _guarded_copy(t: Any, lo: int, hi: int) -> tuple[Any, Any, Any]:
    """A copy of tensor t, whose elements fill the bytes [lo, hi), between unregistered guard zones.

    The copy keeps t's shape and strides (contiguous, channels_last or any other dense layout)
    and its address modulo 64. Returns the copy and the byte views of t's and the copy's span.
    """
    import torch

    nbytes = hi - lo
    guard = _redzone(nbytes)
    buf = torch.empty(nbytes + 2 * guard + 128, dtype=torch.uint8)
    start = (-buf.data_ptr()) % 64 + guard + lo % 64
    original = _byte_view(t, lo, nbytes)
    span = buf[start : start + nbytes]
    span.copy_(original)
    flat = span.view(t.dtype)
    offset = flat.storage_offset() + (t.data_ptr() - lo) // t.element_size()
    return torch.as_strided(flat, t.shape, t.stride(), offset), original, span


def _struct_bytes(kind: str, arg: Any, where: str) -> bytes:
    """The bytes of a struct passed by value (kind "s<N>"): bytes, bytearray or memoryview of
    exactly N bytes."""
    size = int(kind[1:])
    if not isinstance(arg, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"{where} is a struct of {size} bytes ({kind}): pass bytes, bytearray or memoryview, "
            f"got {type(arg).__name__}"
        )
    data = bytes(arg)
    if len(data) != size:
        raise ValueError(f"{where} is a struct of {size} bytes ({kind}): got {len(data)} bytes")
    return data


def _relocate_map(data: bytes, moves: list[tuple[int, int, int]]) -> bytes:
    """`data`, a struct argument, with its global address moved when it is a tensor map in the
    emulator's layout whose address lies inside a tensor that a checked launch moved into a
    guarded copy ([lo, hi) its original span, `moved` the copy's offset from it): the copy then
    reads the guarded copy, as the kernel's pointers do. Any other struct comes back unchanged, and
    so does a map into no moved tensor (the runtime reports a read outside every tensor)."""
    if len(data) < 16 or not data.startswith(_MAP_MAGIC):
        return data
    (address,) = struct.unpack_from("<Q", data, 8)
    for lo, hi, moved in moves:
        if lo <= address < hi:
            return data[:8] + struct.pack("<Q", address + moved) + data[16:]
    return data


def _int_range(kind: str) -> tuple[int, int]:
    bits = 8 * int(kind[1])
    if kind[0] == "u":
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _as_float32(value: float) -> float:
    """value rounded to float32 (inf where it overflows)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def gpu_packing_problem(kind: str, arg: Any) -> str | None:
    """What a GPU launch (spio.cuda.driver) would do with scalar `arg` for a parameter of `kind`
    where that differs from what the emulator passes, else None. The driver packs a Python int
    as an int32 and a float as a float32, refuses a bool as ambiguous, and refuses an argument of
    other bytes than its parameter's: an int for a float parameter would reach the kernel as the
    int's bits, an int for a long long or a bool parameter would be refused."""
    if kind == "p" or kind[0] == "s":
        return None
    if isinstance(arg, bool):
        return "a GPU launch refuses a Python bool as ambiguous: pass an int"
    integer = isinstance(arg, Integral)
    if kind in ("i4", "u4") and integer:
        if not -(2**31) <= int(arg) < 2**31:
            return f"a GPU launch packs an int as an int32, which {arg} does not fit in"
        return None
    if kind == "f4" and isinstance(arg, Real) and not integer:
        value = float(arg)
        if math.isfinite(value) and not math.isfinite(_as_float32(value)):
            return f"a GPU launch refuses the float {value!r}, which does not fit in float32"
        return None
    if not isinstance(arg, Real):
        return None  # (the emulator's own checks name what it takes)
    given = "an int as an int32" if integer else "a float as a float32"
    return (
        f"a GPU launch passes {given}, other bytes than the parameter's: spio's kernels take "
        "int and unsigned parameters as ints, float ones as floats"
    )


@dataclass(frozen=True)
class EmuFunction:
    """One kernel of an EmuModule; `launch` runs it on CPU tensors."""

    module: EmuModule
    name: str
    _logged: list = field(default_factory=list, repr=False, compare=False)

    def _signature(self, loaded: _Loaded) -> list[str]:
        fn = getattr(loaded.handle, f"spio_emu_signature_{self.name}")
        fn.restype = ctypes.c_char_p
        text = fn().decode()
        return text.split(",") if text else []

    def _marshal(self, kinds: list[str], args: tuple, check: bool):
        """Slots for the C++ side, registered ranges, (original, copy, original_bytes,
        copy_bytes) tuples of the tensors to copy back (the bytes: byte views of each one's span,
        _guarded_copy's), and the ctypes buffers of struct arguments, which must stay alive until
        the launch returns (their slots hold the buffers' addresses)."""
        import torch

        if len(args) != len(kinds):
            raise TypeError(
                f"kernel {self.name} takes {len(kinds)} arguments ({', '.join(kinds) or 'none'}), "
                f"got {len(args)}"
            )
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        spans = {i: _span(t) for i, t in tensors}
        slots: list[int] = []
        ranges: list[tuple[int, int]] = []
        copies: list[tuple[Any, Any, Any, Any]] = []
        moves: list[tuple[int, int, int]] = []  # (lo, hi) of a moved tensor's span, and its move
        structs: list[tuple[int, bytes]] = []  # (slot index, bytes) of the struct arguments
        for i, (kind, arg) in enumerate(zip(kinds, args, strict=False)):
            where = f"argument {i} of kernel {self.name}"
            if kind == "p":
                if arg is None:
                    slots.append(0)
                    continue
                if not isinstance(arg, torch.Tensor):
                    raise TypeError(f"{where} is a pointer: pass a CPU tensor, got {type(arg)}")
                if arg.device.type != "cpu":
                    raise ValueError(f"{where} must be a CPU tensor, got one on {arg.device}")
                lo, hi = spans[i]
                overlaps = any(j != i and spans[j][0] < hi and lo < spans[j][1] for j, _ in tensors)
                # Dense: the elements fill their span (contiguous, channels_last, any permutation).
                if check and _dense(arg) and not overlaps and arg.numel() > 0:
                    copy, original_bytes, copy_bytes = _guarded_copy(arg, lo, hi)
                    copies.append((arg, copy, original_bytes, copy_bytes))
                    moved = copy.data_ptr() - arg.data_ptr()
                    moves.append((lo, hi, moved))
                    lo, hi = lo + moved, hi + moved
                    slots.append(copy.data_ptr())
                else:
                    slots.append(arg.data_ptr())
                ranges.append((lo, hi))
            elif kind in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b"):
                if not isinstance(arg, int):
                    raise TypeError(f"{where} is an integer ({kind}), got {type(arg).__name__}")
                lo_v, hi_v = (0, 1) if kind == "b" else _int_range(kind)
                if not lo_v <= int(arg) <= hi_v:
                    raise ValueError(f"{where} ({kind}) must be in {lo_v}..{hi_v}, got {arg}")
                slots.append(int(arg) & 0xFFFFFFFFFFFFFFFF)
            elif kind in ("f4", "f8"):
                if isinstance(arg, bool) or not isinstance(arg, (int, float)):
                    raise TypeError(f"{where} is a float ({kind}), got {type(arg).__name__}")
                slots.append(struct.unpack("<Q", struct.pack("<d", float(arg)))[0])
            elif kind[0] == "s" and kind[1:].isdigit():
                structs.append((len(slots), _struct_bytes(kind, arg, where)))
                slots.append(0)  # the buffer's address, once every tensor has been placed
            else:
                raise TypeError(
                    f"{where} has a type the emulator cannot pass (only pointers, integers, "
                    f"floats, bools and trivially copyable structs, as bytes, are supported)"
                )
        # Maps after all tensors: a map may come before the tensor it describes.
        keep = []
        for slot, data in structs:
            buffer = ctypes.create_string_buffer(_relocate_map(data, moves), len(data))
            keep.append(buffer)
            slots[slot] = ctypes.addressof(buffer)
        return slots, ranges, copies, keep

    def launch(
        self,
        grid: Any,
        block: Any,
        args: tuple | list,
        shared_mem_bytes: int = 0,
        *,
        check: bool = True,
        seed: int | None = None,
        shared_offset: int = 0,
        gpu_rules: bool = False,
    ) -> None:
        """Run the kernel on CPU tensors; raises EmulatorError for a hazard (check=True).
        `shared_offset`: the dynamic shared buffer starts that many bytes (a multiple of 16 below
        1024) past a multiple of 1024, as a GPU may start it (it promises 16-byte alignment):
        kernels that align their buffers themselves are tested with it. `gpu_rules`: take the
        scalar arguments only as a GPU launch of the same values does (`gpu_packing_problem`),
        as spio's kernels launch: a value it would refuse, or pass as other bytes, is refused."""
        import torch

        grid3, block3 = _launch_dims(grid, block, shared_mem_bytes, shared_offset, seed)
        loaded = self.module._load(check)  # (builds the library: every argument checked first)
        static = self.module.static_shared_bytes(check)
        if shared_mem_bytes + static > MAX_SHARED_BYTES:
            # The static count is the module's, not this kernel's: every kernel's __shared__
            # variables live in one arena of the library (see spio_emu.h).
            raise ValueError(
                f"kernel {self.name}: {shared_mem_bytes} dynamic + {static} static shared bytes "
                f"exceed the {MAX_SHARED_BYTES}-byte limit per block (sm_90); the emulator "
                f"counts as static the __shared__ variables of every kernel in module "
                f"{self.module.name} together, so kernels that each fit on a GPU may need "
                f"modules of their own"
            )
        kinds = self._signature(loaded)
        if gpu_rules:
            for i, (kind, arg) in enumerate(zip(kinds, args, strict=False)):
                problem = gpu_packing_problem(kind, arg)
                if problem is not None:
                    raise TypeError(f"argument {i} of kernel {self.name} ({kind}): {problem}")
        slots, ranges, copies, keep = self._marshal(kinds, tuple(args), check)
        if not self._logged:
            self._logged.append(True)
            # (A module's name, where its function's own does not hold it: sum_slots' entry,
            # spio_sum_slots, is one symbol for every layer's build.)
            named = (
                self.name if self.module.name in self.name else f"{self.name} of {self.module.name}"
            )
            logger.info("emulating %s on the CPU", named)
        cfg = _Launch()
        cfg.grid[:] = grid3
        cfg.block[:] = block3
        cfg.dynamic_shared_bytes = shared_mem_bytes
        flat = (ctypes.c_uint64 * max(1, 2 * len(ranges)))(*[v for r in ranges for v in r])
        cfg.ranges = flat
        cfg.num_ranges = len(ranges)
        cfg.check = int(bool(check))
        cfg.seed = 0 if seed is None else int(seed) & 0xFFFFFFFFFFFFFFFF
        cfg.shuffle = 0 if seed is None else 1
        cfg.dynamic_offset = shared_offset
        name = self.name.encode()
        cfg.kernel_name = name
        slot_array = (ctypes.c_uint64 * max(1, len(slots)))(*slots)
        entry = getattr(loaded.handle, f"spio_emu_entry_{self.name}")
        entry.restype = ctypes.c_int
        entry.argtypes = [ctypes.POINTER(_Launch), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        with _launch_lock:
            rc = entry(ctypes.byref(cfg), slot_array, len(slots))
            del keep  # the struct arguments' buffers: the runtime has copied them
            message = loaded.handle.spio_emu_last_error
            message.restype = ctypes.c_char_p
            error = message().decode(errors="replace") if rc != 0 else ""
        with torch.no_grad():  # (an output that requires grad is written as an unchecked run does)
            for original, copy, original_bytes, copy_bytes in copies:
                # Copying back read-only inputs would bump their autograd version counters.
                if not torch.equal(original_bytes, copy_bytes):
                    original.copy_(copy)
        if rc != 0:
            raise EmulatorError(error or f"emulated launch of {self.name} failed (code {rc})")


@dataclass(frozen=True)
class EmuModule:
    """A kernel source built for the CPU emulator (checked and unchecked libraries, lazily)."""

    name: str
    source: str
    headers: dict[str, str]
    kernels: tuple[str, ...]
    _loaded: dict = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _load(self, checked: bool, lib: Library | None = None) -> _Loaded:
        """The library loaded, built first (or found in the cache) unless `lib` is given."""
        with self._lock:
            hit = self._loaded.get(checked)
            if hit is None:
                if lib is None:
                    lib = build_library(self.source, self.headers, name=self.name, checked=checked)
                handle = _dlopen(lib.path)
                hit = _Loaded(lib, handle)
                self._loaded[checked] = hit
            return hit

    def library(self, checked: bool = True) -> Library:
        """The built library (checked or not) this module loads: its path, and whether it came
        from the cache."""
        return self._load(checked).library

    def static_shared_bytes(self, checked: bool = True) -> int:
        """Static __shared__ bytes of all kernels of this module together."""
        fn = self._load(checked).handle.spio_emu_static_shared_bytes
        fn.restype = ctypes.c_uint64
        return int(fn())

    def fiber_switch(self, checked: bool = True) -> str:
        """The fibers' context switch in this build: "asm" (x86-64) or "ucontext"."""
        fn = self._load(checked).handle.spio_emu_fiber_switch
        fn.restype = ctypes.c_char_p
        return fn().decode()

    def get_function(self, kernel_name: str) -> EmuFunction:
        """The kernel `kernel_name` (declared `extern "C" __global__`)."""
        if kernel_name not in self.kernels:
            raise KeyError(
                f"module {self.name} has no kernel {kernel_name!r}; it declares "
                f"{', '.join(self.kernels)}"
            )
        return EmuFunction(self, kernel_name)


def load_module(
    source: str, headers: dict[str, str] | None = None, *, name: str = "kernel"
) -> EmuModule:
    """Build `source` for the CPU emulator (checked variant first) and return its module."""
    lib = build_library(source, headers, name=name, checked=True)
    module = EmuModule(name, source, dict(headers or {}), lib.kernels)
    module._load(True, lib)
    return module
