# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The CUDA driver API, as much of it as spio's kernels need.

libcuda.so.1 is opened with dlopen on the first call, never at import, so this module builds and
imports on machines without an NVIDIA driver. cuda.h supplies types and enum values only; every
entry point is resolved by its ABI name (cuda.h maps e.g. cuCtxPushCurrent to cuCtxPushCurrent_v2).
SPIO_LIBCUDA names another library to open instead (tests use it to simulate a missing driver).

Contexts: spio works in each device's primary context, the one PyTorch uses. A call that needs a
context pushes the primary context when another (or none) is current and pops it afterwards, so the
caller's current context is left as it was.

Launch arguments are packed into a C buffer on the stack without creating Python objects: a Python
int is a C int32, a float a C float, an object with .data_ptr() (a torch tensor) a 64-bit pointer,
and the wrappers below (Int64, Float64, Pointer, Bytes, ...) give other C types. When the driver can
report a kernel's parameter sizes (cuFuncGetParamInfo, driver 550+), they are read once per Function
and every launch is checked against them, so a wrong argument is an error, not a corrupt launch.
"""

import numbers
import operator
import os

cimport cython
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_AsUnsignedLongLong
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, strlen

from spio.env import path_or_name
from spio.log import logger


cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    char* dlerror()
    enum:
        RTLD_NOW
        RTLD_LOCAL


cdef extern from "cuda.h" nogil:
    enum:
        CUDA_VERSION
    ctypedef int CUresult
    enum:
        CUDA_SUCCESS
        CUDA_ERROR_INVALID_VALUE
        CUDA_ERROR_NOT_FOUND
    ctypedef int CUdevice
    ctypedef void* CUcontext
    ctypedef void* CUmodule
    ctypedef void* CUfunction
    ctypedef void* CUstream
    enum:
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK
        CU_DEVICE_ATTRIBUTE_WARP_SIZE
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR
    enum:
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
        CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES
        CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
        CU_FUNC_ATTRIBUTE_NUM_REGS
        CU_FUNC_ATTRIBUTE_PTX_VERSION
        CU_FUNC_ATTRIBUTE_BINARY_VERSION
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


# Entry points, typed by their ABI (enum parameters are passed as int).
ctypedef CUresult (*fn_u)(unsigned int) noexcept nogil
ctypedef CUresult (*fn_pi)(int*) noexcept nogil
ctypedef CUresult (*fn_err_str)(CUresult, const char**) noexcept nogil
ctypedef CUresult (*fn_device_get)(CUdevice*, int) noexcept nogil
ctypedef CUresult (*fn_device_name)(char*, int, CUdevice) noexcept nogil
ctypedef CUresult (*fn_device_attr)(int*, int, CUdevice) noexcept nogil
ctypedef CUresult (*fn_device_mem)(size_t*, CUdevice) noexcept nogil
ctypedef CUresult (*fn_ctx_retain)(CUcontext*, CUdevice) noexcept nogil
ctypedef CUresult (*fn_dev)(CUdevice) noexcept nogil
ctypedef CUresult (*fn_pctx)(CUcontext*) noexcept nogil
ctypedef CUresult (*fn_ctx)(CUcontext) noexcept nogil
ctypedef CUresult (*fn_pdev)(CUdevice*) noexcept nogil
ctypedef CUresult (*fn_void)() noexcept nogil
ctypedef CUresult (*fn_module_load)(CUmodule*, const void*) noexcept nogil
ctypedef CUresult (*fn_module)(CUmodule) noexcept nogil
ctypedef CUresult (*fn_module_function)(CUfunction*, CUmodule, const char*) noexcept nogil
ctypedef CUresult (*fn_func_get_attr)(int*, int, CUfunction) noexcept nogil
ctypedef CUresult (*fn_func_set_attr)(CUfunction, int, int) noexcept nogil
ctypedef CUresult (*fn_func_param_info)(CUfunction, size_t, size_t*, size_t*) noexcept nogil
ctypedef CUresult (*fn_tensor_map_tiled)(
    void*, int, uint32_t, void*, const uint64_t*, const uint64_t*, const uint32_t*,
    const uint32_t*, int, int, int, int) noexcept nogil
ctypedef CUresult (*fn_launch)(
    CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
    unsigned int, unsigned int, CUstream, void**, void**) noexcept nogil


cdef struct Api:
    fn_u p_cuInit
    fn_pi p_cuDriverGetVersion
    fn_err_str p_cuGetErrorName
    fn_err_str p_cuGetErrorString
    fn_pi p_cuDeviceGetCount
    fn_device_get p_cuDeviceGet
    fn_device_name p_cuDeviceGetName
    fn_device_attr p_cuDeviceGetAttribute
    fn_device_mem p_cuDeviceTotalMem
    fn_ctx_retain p_cuDevicePrimaryCtxRetain
    fn_dev p_cuDevicePrimaryCtxRelease
    fn_pctx p_cuCtxGetCurrent
    fn_ctx p_cuCtxPushCurrent
    fn_pctx p_cuCtxPopCurrent
    fn_pdev p_cuCtxGetDevice
    fn_void p_cuCtxSynchronize
    fn_module_load p_cuModuleLoadData
    fn_module p_cuModuleUnload
    fn_module_function p_cuModuleGetFunction
    fn_func_get_attr p_cuFuncGetAttribute
    fn_func_set_attr p_cuFuncSetAttribute
    fn_func_param_info p_cuFuncGetParamInfo  # optional: NULL on drivers before CUDA 12.4
    fn_launch p_cuLaunchKernel
    fn_tensor_map_tiled p_cuTensorMapEncodeTiled  # optional: NULL on drivers before CUDA 12.0


cdef Api _api
cdef bint _loaded = False
cdef bint _initialized = False

#: The CUDA_VERSION of the cuda.h this extension was built against (types and enums only).
built_with_cuda_version = CUDA_VERSION

_DEFAULT_LIBRARY = "libcuda.so.1"

cdef enum:
    # Kernel parameters: at most 4 KiB in all (the classic limit every driver accepts).
    ARENA_WORDS = 512
    MAX_ARGS = 512
    # Function._nparams before the driver was asked for the parameter layout.
    PARAMS_UNQUERIED = -2
    # Function._nparams when the driver cannot report it (no cuFuncGetParamInfo).
    PARAMS_UNKNOWN = -1


class CudaDriverError(RuntimeError):
    """The NVIDIA driver library cannot be loaded or lacks an entry point spio needs."""


class CudaError(RuntimeError):
    """A CUDA driver call returned an error; `.code`, `.name` and `.call` say which and where."""

    def __init__(self, code: int, name: str, call: str, description: str = "", detail: str = ""):
        self.code = code
        self.name = name
        self.call = call
        self.description = description
        self.detail = detail
        message = f"{call} failed: {name}"
        if description:
            message += f" ({description})"
        if detail:
            message += f"; {detail}"
        super().__init__(message)

    def __reduce__(self):
        return (CudaError, (self.code, self.name, self.call, self.description, self.detail))


# --------------------------------------------------------------------------------------------------
# Loading libcuda


cdef void* _symbol(void* lib, const char* name, str path) except NULL:
    cdef void* p = dlsym(lib, name)
    if p == NULL:
        raise CudaDriverError(
            f"{path} has no entry point {name.decode()}: the NVIDIA driver is too old for spio "
            f"(or {path} is not the CUDA driver library)"
        )
    return p


cdef int _open(str path, Api* api) except -1:
    """dlopen `path` and resolve every entry point into `api`; raise CudaDriverError on failure."""
    cdef bytes encoded = os.fsencode(path)
    cdef void* lib = dlopen(encoded, RTLD_NOW | RTLD_LOCAL)
    cdef const char* err
    if lib == NULL:
        err = dlerror()
        reason = (<bytes>err).decode("utf-8", "replace") if err != NULL else "unknown reason"
        setting = os.environ.get("SPIO_LIBCUDA", "").strip()
        chosen = (
            f" That is the library SPIO_LIBCUDA={setting!r} names: set it to the CUDA driver "
            "library (libcuda.so.1 where the driver is installed), or unset it."
            if setting else ""
        )
        raise CudaDriverError(
            f"No NVIDIA driver found: cannot load {path} ({reason}).{chosen} spio's GPU kernels "
            "need an NVIDIA GPU and its driver; on CPU tensors spio runs the PyTorch reference "
            "instead (the kernels in its CPU emulator with SPIO_EMULATE=1)."
        )
    api.p_cuInit = <fn_u>_symbol(lib, b"cuInit", path)
    api.p_cuDriverGetVersion = <fn_pi>_symbol(lib, b"cuDriverGetVersion", path)
    api.p_cuGetErrorName = <fn_err_str>_symbol(lib, b"cuGetErrorName", path)
    api.p_cuGetErrorString = <fn_err_str>_symbol(lib, b"cuGetErrorString", path)
    api.p_cuDeviceGetCount = <fn_pi>_symbol(lib, b"cuDeviceGetCount", path)
    api.p_cuDeviceGet = <fn_device_get>_symbol(lib, b"cuDeviceGet", path)
    api.p_cuDeviceGetName = <fn_device_name>_symbol(lib, b"cuDeviceGetName", path)
    api.p_cuDeviceGetAttribute = <fn_device_attr>_symbol(lib, b"cuDeviceGetAttribute", path)
    api.p_cuDeviceTotalMem = <fn_device_mem>_symbol(lib, b"cuDeviceTotalMem_v2", path)
    api.p_cuDevicePrimaryCtxRetain = <fn_ctx_retain>_symbol(
        lib, b"cuDevicePrimaryCtxRetain", path)
    api.p_cuDevicePrimaryCtxRelease = <fn_dev>_symbol(lib, b"cuDevicePrimaryCtxRelease_v2", path)
    api.p_cuCtxGetCurrent = <fn_pctx>_symbol(lib, b"cuCtxGetCurrent", path)
    api.p_cuCtxPushCurrent = <fn_ctx>_symbol(lib, b"cuCtxPushCurrent_v2", path)
    api.p_cuCtxPopCurrent = <fn_pctx>_symbol(lib, b"cuCtxPopCurrent_v2", path)
    api.p_cuCtxGetDevice = <fn_pdev>_symbol(lib, b"cuCtxGetDevice", path)
    api.p_cuCtxSynchronize = <fn_void>_symbol(lib, b"cuCtxSynchronize", path)
    api.p_cuModuleLoadData = <fn_module_load>_symbol(lib, b"cuModuleLoadData", path)
    api.p_cuModuleUnload = <fn_module>_symbol(lib, b"cuModuleUnload", path)
    api.p_cuModuleGetFunction = <fn_module_function>_symbol(lib, b"cuModuleGetFunction", path)
    api.p_cuFuncGetAttribute = <fn_func_get_attr>_symbol(lib, b"cuFuncGetAttribute", path)
    api.p_cuFuncSetAttribute = <fn_func_set_attr>_symbol(lib, b"cuFuncSetAttribute", path)
    api.p_cuLaunchKernel = <fn_launch>_symbol(lib, b"cuLaunchKernel", path)
    api.p_cuFuncGetParamInfo = <fn_func_param_info>dlsym(lib, b"cuFuncGetParamInfo")
    api.p_cuTensorMapEncodeTiled = <fn_tensor_map_tiled>dlsym(lib, b"cuTensorMapEncodeTiled")
    return 0


def _probe_library(path: str) -> None:
    """Open `path` as the driver library and resolve every entry point, without using it.

    Raises CudaDriverError exactly as the first driver call would; for tests and diagnostics.
    """
    cdef Api scratch
    _open(path, &scratch)


def library_path() -> str:
    """The driver library spio opens: $SPIO_LIBCUDA (a path, made absolute, or a bare name for
    the loader to find), else libcuda.so.1."""
    return path_or_name("SPIO_LIBCUDA") or _DEFAULT_LIBRARY


cdef inline int _load() except -1:
    global _loaded, _api
    if _loaded:
        return 0
    cdef Api api
    path = library_path()
    _open(path, &api)
    _api = api
    _loaded = True
    logger.debug("loaded the CUDA driver from %s", path)
    return 0


cdef inline int _ensure_init() except -1:
    global _initialized
    if _initialized:
        return 0
    _load()
    cdef CUresult r
    with nogil:
        r = _api.p_cuInit(0)
    _check(r, "cuInit")
    _initialized = True
    return 0


# --------------------------------------------------------------------------------------------------
# Errors


cdef str _c_text(const char* s):
    return (<bytes>s).decode("utf-8", "replace")


cdef object _make_error(CUresult r, str call, str detail=""):
    cdef const char* s = NULL
    name = f"CUDA_ERROR_{<int>r}"
    description = ""
    if _api.p_cuGetErrorName != NULL and _api.p_cuGetErrorName(r, &s) == CUDA_SUCCESS and s != NULL:
        name = _c_text(s)
    s = NULL
    if (_api.p_cuGetErrorString != NULL and _api.p_cuGetErrorString(r, &s) == CUDA_SUCCESS
            and s != NULL):
        description = _c_text(s)
    return CudaError(<int>r, name, call, description, detail)


#: Errors that leave the context unusable (sticky), which a launch may report for an earlier
#: asynchronous one: an illegal or misaligned address, a launch timeout, a device-side assert
#: (another library's kernel's, say PyTorch's index checks), a hardware stack error, an illegal
#: instruction, an invalid address space or program counter, a failed launch.
STICKY_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})


def _sticky_note(code: int) -> str:
    """What a launch error adds for a sticky error `code`: it may be an earlier launch's."""
    if code not in STICKY_ERRORS:
        return ""
    return ("; this error may be an earlier asynchronous launch's (a launch reports the "
            "context's sticky error): CUDA_LAUNCH_BLOCKING=1 makes the kernel that failed "
            "report it, and the process must restart to use the GPU again")


cdef float _float32(double value, str what) except? -1:
    """value as a C float; ValueError where a finite value overflows float32 (it would be inf)."""
    cdef float f = <float>value
    if f - f != 0 and value - value == 0:  # f is inf or nan, value finite
        raise ValueError(f"{what}: the float {value!r} does not fit in float32; wrap it as "
                         "Float64(x) for a double")
    return f


cdef inline int _check(CUresult r, str call) except -1:
    if r != CUDA_SUCCESS:
        raise _make_error(r, call)
    return 0


cdef enum:
    # What _push_if_needed did, for _pop_if_pushed and _check_push.
    CTX_ALREADY_CURRENT = 0
    CTX_PUSHED = 1
    CTX_GET_FAILED = 2  # cuCtxGetCurrent failed
    CTX_PUSH_FAILED = 3  # cuCtxPushCurrent failed


cdef inline CUresult _push_if_needed(CUcontext ctx, int* state) noexcept nogil:
    """Make `ctx` current unless it already is; `state` says what was done (CTX_*): whether
    _pop_if_pushed must undo it, and on failure which call failed (for _check_push)."""
    cdef CUcontext current = NULL
    cdef CUresult r = _api.p_cuCtxGetCurrent(&current)
    if r != CUDA_SUCCESS:
        state[0] = CTX_GET_FAILED
        return r
    if current == ctx:
        state[0] = CTX_ALREADY_CURRENT
        return r
    r = _api.p_cuCtxPushCurrent(ctx)
    state[0] = CTX_PUSHED if r == CUDA_SUCCESS else CTX_PUSH_FAILED
    return r


cdef inline void _pop_if_pushed(int state) noexcept nogil:
    cdef CUcontext popped
    if state == CTX_PUSHED:
        _api.p_cuCtxPopCurrent(&popped)


cdef int _check_push(CUresult r, int state) except -1:
    """Raise for a failed _push_if_needed, naming the call that failed."""
    if r != CUDA_SUCCESS:
        raise _make_error(r, "cuCtxGetCurrent" if state == CTX_GET_FAILED else "cuCtxPushCurrent")
    return 0


# --------------------------------------------------------------------------------------------------
# Driver and devices


def init() -> None:
    """Load the driver library and call cuInit (once); later calls return at once."""
    _ensure_init()


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, as (major, minor), e.g. (13, 0)."""
    _load()
    cdef int v = 0
    _check(_api.p_cuDriverGetVersion(&v), "cuDriverGetVersion")
    return (v // 1000, (v % 1000) // 10)


def device_count() -> int:
    """Number of CUDA devices the driver sees."""
    _ensure_init()
    cdef int n = 0
    _check(_api.p_cuDeviceGetCount(&n), "cuDeviceGetCount")
    return n


cdef CUdevice _device(int ordinal) except? -1:
    count = device_count()
    if ordinal < 0 or ordinal >= count:
        raise ValueError(f"CUDA device ordinal must be in 0..{count - 1}, got {ordinal} "
                         f"({count} device(s) found)")
    cdef CUdevice dev = 0
    _check(_api.p_cuDeviceGet(&dev, ordinal), "cuDeviceGet")
    return dev


cdef int _current_ordinal() except -1:
    """Ordinal of the device whose context is current on this thread; 0 when none is."""
    _ensure_init()
    cdef CUcontext ctx = NULL
    cdef CUdevice dev = 0, other = 0
    _check(_api.p_cuCtxGetCurrent(&ctx), "cuCtxGetCurrent")
    if ctx == NULL:
        return 0
    _check(_api.p_cuCtxGetDevice(&dev), "cuCtxGetDevice")
    for i in range(device_count()):
        _check(_api.p_cuDeviceGet(&other, i), "cuDeviceGet")
        if other == dev:
            return i
    return 0


cdef object _ordinal_of(object device):
    """A device ordinal from None (the current device), an int, or a torch.device (Module.load's
    `device`); its range is checked where the ordinal is used (retain_primary_context)."""
    if device is None:
        return _current_ordinal()
    if isinstance(device, int) and not isinstance(device, bool):
        return int(device)
    kind = getattr(device, "type", None)
    if kind is not None:
        if kind != "cuda":
            raise ValueError(f"spio kernels run on CUDA devices, got device {device!r}")
        index = getattr(device, "index", None)
        return _current_ordinal() if index is None else index
    raise TypeError(f"device must be None, an int ordinal or a torch.device, got {device!r}")


cdef object _device_attr(CUdevice dev, int attribute, bint optional):
    cdef int value = 0
    cdef CUresult r = _api.p_cuDeviceGetAttribute(&value, attribute, dev)
    if r != CUDA_SUCCESS:
        if optional:
            return None
        _check(r, f"cuDeviceGetAttribute({attribute})")
    return value


_attributes_cache = {}


cdef object _checked_ordinal(object ordinal):
    """`ordinal` as a plain int; a bool (which Python counts as 0 or 1) or a non-int is refused."""
    if isinstance(ordinal, bool) or not isinstance(ordinal, int):
        raise TypeError(f"CUDA device ordinal must be an int, got {ordinal!r}")
    return int(ordinal)


def device_attributes(ordinal=0) -> dict:
    """Name, compute capability, SM count, cache and shared-memory limits of device `ordinal`.

    Values are read once per device and cached; the result is a fresh dict each call.
    """
    ordinal = _checked_ordinal(ordinal)
    cached = _attributes_cache.get(ordinal)
    if cached is not None:
        return dict(cached)
    cdef CUdevice dev = _device(ordinal)
    cdef char name[256]
    cdef size_t total = 0
    _check(_api.p_cuDeviceGetName(name, sizeof(name), dev), "cuDeviceGetName")
    _check(_api.p_cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem")
    major = _device_attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, False)
    minor = _device_attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, False)
    attrs = {
        "ordinal": ordinal,
        "name": _c_text(name),
        "compute_capability": (major, minor),
        "arch": f"sm_{major}{minor}",
        "sm_count": _device_attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, False),
        "l2_cache_bytes": _device_attr(dev, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, False),
        "max_shared_memory_per_block": _device_attr(
            dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, False),
        "max_shared_memory_per_block_optin": _device_attr(
            dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, False),
        "max_shared_memory_per_sm": _device_attr(
            dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, False),
        "max_threads_per_block": _device_attr(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, False),
        "max_threads_per_sm": _device_attr(
            dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, False),
        "max_registers_per_sm": _device_attr(
            dev, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, False),
        "max_blocks_per_sm": _device_attr(
            dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, True),
        "warp_size": _device_attr(dev, CU_DEVICE_ATTRIBUTE_WARP_SIZE, False),
        "total_memory_bytes": total,
        # Informational; newer drivers may stop reporting clocks, hence None instead of an error.
        "clock_khz": _device_attr(dev, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, True),
        "memory_clock_khz": _device_attr(dev, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, True),
        "memory_bus_width_bits": _device_attr(
            dev, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, True),
    }
    _attributes_cache[ordinal] = attrs
    return dict(attrs)


# --------------------------------------------------------------------------------------------------
# Primary contexts


_primary_contexts = {}


cdef class PrimaryContext:
    """A retained primary context of one device: the context PyTorch's runtime also uses.

    `with ctx:` makes it current on this thread and restores the previous context on exit.
    """

    cdef CUcontext _handle
    cdef CUdevice _device
    cdef bint _retained
    cdef readonly int ordinal

    def __init__(self, *args, **kwargs):
        raise TypeError("use spio.cuda.driver.retain_primary_context(ordinal)")

    @property
    def handle(self) -> int:
        """The CUcontext as an integer address (0 once released)."""
        return <uintptr_t>self._handle if self._retained else 0

    @property
    def retained(self) -> bool:
        return self._retained

    def release(self) -> None:
        """Release the retain taken by retain_primary_context; unload its modules first."""
        if not self._retained:
            return
        self._retained = False
        if _primary_contexts.get(self.ordinal) is self:
            del _primary_contexts[self.ordinal]
        _check(_api.p_cuDevicePrimaryCtxRelease(self._device), "cuDevicePrimaryCtxRelease")
        logger.debug("released the primary context of device %d", self.ordinal)

    def synchronize(self) -> None:
        """Wait for all work in this context (cuCtxSynchronize)."""
        cdef CUresult r, r2 = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        self._require_retained()
        with nogil:
            r = _push_if_needed(self._handle, &state)
            if r == CUDA_SUCCESS:
                r2 = _api.p_cuCtxSynchronize()
                _pop_if_pushed(state)
        _check_push(r, state)
        _check(r2, "cuCtxSynchronize")

    def __enter__(self) -> PrimaryContext:
        self._require_retained()
        _check(_api.p_cuCtxPushCurrent(self._handle), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc) -> None:
        cdef CUcontext popped
        _check(_api.p_cuCtxPopCurrent(&popped), "cuCtxPopCurrent")

    cdef int _require_retained(self) except -1:
        if not self._retained:
            raise ValueError(f"the primary context of device {self.ordinal} was released")
        return 0

    def __repr__(self) -> str:
        state = f"0x{<uintptr_t>self._handle:x}" if self._retained else "released"
        return f"<PrimaryContext device={self.ordinal} {state}>"

    def __dealloc__(self):
        if self._retained and _loaded:
            _api.p_cuDevicePrimaryCtxRelease(self._device)


def retain_primary_context(ordinal=0) -> PrimaryContext:
    """The primary context of device `ordinal`, retained once per process and shared.

    Retaining keeps the context from being destroyed when its other users release it; a reset
    (cuDevicePrimaryCtxReset, cudaDeviceReset) still destroys every resource in it, kernels
    loaded by spio included, and the process cannot launch them again. release() undoes it.
    """
    ordinal = _checked_ordinal(ordinal)
    existing = _primary_contexts.get(ordinal)
    if existing is not None:
        return existing
    cdef CUdevice dev = _device(ordinal)
    cdef CUcontext handle = NULL
    cdef CUresult r
    with nogil:
        r = _api.p_cuDevicePrimaryCtxRetain(&handle, dev)
    _check(r, "cuDevicePrimaryCtxRetain")
    cdef PrimaryContext ctx = PrimaryContext.__new__(PrimaryContext)
    ctx._handle = handle
    ctx._device = dev
    ctx.ordinal = ordinal
    ctx._retained = True
    existing = _primary_contexts.setdefault(ordinal, ctx)
    if existing is not ctx:  # another thread won the race; drop our extra retain
        ctx.release()
        return existing
    logger.debug("retained the primary context of device %d", ordinal)
    return ctx


# --------------------------------------------------------------------------------------------------
# Kernel-argument wrappers


def encode_tensor_map_tiled(int data_type, address, dims, strides, box, int swizzle,
                            int l2_promotion=0) -> bytes:
    """The 128 bytes cuTensorMapEncodeTiled encodes for a tiled region: `data_type` and `swizzle`
    as cuda.h numbers them, `dims` and `box` in elements and `strides` in bytes (of dims[1:]),
    innermost first; element strides 1, no interleave, zeros out of bounds.
    spio.cuda.tensor_map.TensorMap checks the driver's rules first and names any broken one."""
    _ensure_init()
    if _api.p_cuTensorMapEncodeTiled == NULL:
        raise CudaDriverError(
            "this NVIDIA driver has no cuTensorMapEncodeTiled: tensor maps need a driver for "
            "CUDA 12.0 or newer")
    cdef Py_ssize_t rank = len(dims), i
    if not 1 <= rank <= 5 or len(strides) != rank - 1 or len(box) != rank:
        raise ValueError(f"a tensor map of {rank} dims (1 to 5) needs {rank - 1} strides and "
                         f"{rank} box extents, got {len(strides)} and {len(box)}")
    cdef uint64_t c_dims[5]
    cdef uint64_t c_strides[5]
    cdef uint32_t c_box[5]
    cdef uint32_t c_elem[5]
    for i in range(rank):
        c_dims[i] = dims[i]
        c_box[i] = box[i]
        c_elem[i] = 1
        if i < rank - 1:
            c_strides[i] = strides[i]
    # The driver writes the map at a 64-byte aligned address: 128 bytes inside this buffer.
    cdef uint64_t storage[24]
    cdef void* tmap = <void*>((<uintptr_t>storage + 63) & ~(<uintptr_t>63))
    cdef void* gaddr = <void*><uintptr_t>PyLong_AsUnsignedLongLong(address)
    cdef CUresult r
    with nogil:
        r = _api.p_cuTensorMapEncodeTiled(tmap, data_type, <uint32_t>rank, gaddr, c_dims,
                                          c_strides, c_box, c_elem, 0, swizzle, l2_promotion, 0)
    _check(r, "cuTensorMapEncodeTiled")
    return (<char*>tmap)[:128]


cdef class KernelArg:
    """A kernel argument with an explicit C type; reusable across launches."""

    cdef uint64_t _bits  # the value's bytes (little-endian, low bytes used)
    cdef Py_ssize_t _size  # bytes in the kernel's parameter
    cdef bytes _blob  # Bytes only: the raw parameter
    cdef object _value

    # One fixed argument, like the subclasses: with `*args, **kwargs` here, Cython 3.3.0 gives the
    # subclasses a vectorcall tp_new that calls a base one it never defines (cython#7936), and
    # the module fails to import with an undefined symbol.
    def __init__(self, value=None):
        raise TypeError("use a concrete wrapper: Int32, UInt32, Int64, UInt64, Float32, "
                        "Float64, Bool, Pointer or Bytes")

    @property
    def value(self):
        return self._value

    @property
    def nbytes(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._value!r})"


cdef int _set_int(KernelArg arg, value, object lo, object hi, Py_ssize_t size,
                  const char* ctype) except -1:
    if isinstance(value, bool):
        raise TypeError(f"{ctype.decode()} needs an int, got the bool {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{ctype.decode()} needs an int, got {value!r}") from None
    if value < lo or value > hi:
        raise ValueError(f"{ctype.decode()} must be in {lo}..{hi}, got {value}")
    arg._bits = <uint64_t>(value & 0xFFFFFFFFFFFFFFFF)
    arg._size = size
    arg._value = value
    return 0


cdef class Int32(KernelArg):
    """A C int32_t argument (what a plain Python int already means)."""

    def __init__(self, value):
        _set_int(self, value, -(1 << 31), (1 << 31) - 1, 4, b"int32")


cdef class UInt32(KernelArg):
    """A C uint32_t argument."""

    def __init__(self, value):
        _set_int(self, value, 0, (1 << 32) - 1, 4, b"uint32")


cdef class Int64(KernelArg):
    """A C int64_t argument."""

    def __init__(self, value):
        _set_int(self, value, -(1 << 63), (1 << 63) - 1, 8, b"int64")


cdef class UInt64(KernelArg):
    """A C uint64_t argument."""

    def __init__(self, value):
        _set_int(self, value, 0, 0xFFFFFFFFFFFFFFFF, 8, b"uint64")


cdef class Bool(KernelArg):
    """A C++ bool argument (one byte)."""

    def __init__(self, value):
        self._bits = 1 if value else 0
        self._size = 1
        self._value = bool(value)


cdef class Float32(KernelArg):
    """A C float argument (what a plain Python float already means)."""

    def __init__(self, value):
        cdef float f = _float32(float(value), "Float32")
        self._bits = 0
        memcpy(&self._bits, &f, 4)
        self._size = 4
        self._value = float(value)


cdef class Float64(KernelArg):
    """A C double argument."""

    def __init__(self, value):
        cdef double d = float(value)
        memcpy(&self._bits, &d, 8)
        self._size = 8
        self._value = d


cdef class Pointer(KernelArg):
    """A 64-bit device pointer: an int address or anything with .data_ptr().

    Only the address is kept: the tensor it came from must stay alive while kernels use it.
    """

    def __init__(self, value):
        if not isinstance(value, int):
            data_ptr = getattr(value, "data_ptr", None)
            if data_ptr is None:
                raise TypeError(f"Pointer needs an int address or an object with .data_ptr(), "
                                f"got {type(value).__name__}")
            value = data_ptr()
        _set_int(self, value, 0, 0xFFFFFFFFFFFFFFFF, 8, b"pointer")


cdef class Bytes(KernelArg):
    """A parameter passed by value as raw bytes, e.g. a struct packed with the struct module."""

    def __init__(self, data):
        blob = bytes(data)
        if not 0 < len(blob) <= ARENA_WORDS * 8:
            raise ValueError(f"Bytes argument must be 1..{ARENA_WORDS * 8} bytes, got {len(blob)}")
        self._blob = blob
        self._size = len(blob)
        self._value = blob


# --------------------------------------------------------------------------------------------------
# Launch configuration and argument packing


cdef inline unsigned int _dim(object v, str what, str axis, long long limit) except 0:
    cdef int overflow = 0
    cdef long long n
    if type(v) is not int and (not isinstance(v, int) or isinstance(v, bool)):
        raise TypeError(f"{what} {axis} must be an int, got {v!r}")
    n = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow or n < 1 or n > limit:
        raise ValueError(f"{what} {axis} must be in 1..{limit}, got {v}")
    return <unsigned int>n


cdef int _dims(object d, str what, unsigned int* out, long long lx, long long ly,
               long long lz) except -1:
    """Parse an int or a 1- to 3-tuple into out[0..2], checking each against its limit."""
    cdef Py_ssize_t n
    if type(d) is int:
        out[0] = _dim(d, what, "x", lx)
        out[1] = out[2] = 1
        return 0
    if type(d) is not tuple:
        if isinstance(d, (tuple, list)):
            d = tuple(d)
        elif isinstance(d, int) and not isinstance(d, bool):
            d = (d,)
        else:
            raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {d!r}")
    n = PyTuple_GET_SIZE(d)
    if n < 1 or n > 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {n}: {d!r}")
    out[0] = _dim(<object>PyTuple_GET_ITEM(d, 0), what, "x", lx)
    out[1] = _dim(<object>PyTuple_GET_ITEM(d, 1), what, "y", ly) if n > 1 else 1
    out[2] = _dim(<object>PyTuple_GET_ITEM(d, 2), what, "z", lz) if n > 2 else 1
    return 0


cdef int _launch_dims(object grid, object block, unsigned int* g, unsigned int* b) except -1:
    _dims(grid, "grid", g, 0x7FFFFFFF, 65535, 65535)
    _dims(block, "block", b, 1024, 1024, 64)
    cdef unsigned long long threads = <unsigned long long>b[0] * b[1] * b[2]
    if threads > 1024:
        raise ValueError(
            f"block must have at most 1024 threads, got {b[0]}x{b[1]}x{b[2]} = {threads}")
    return 0


cdef unsigned int _shared_bytes(object n) except? 0xFFFFFFFF:
    cdef int overflow = 0
    cdef long long v
    if type(n) is not int and (not isinstance(n, int) or isinstance(n, bool)):
        raise TypeError(f"shared_mem_bytes must be an int, got {n!r}")
    v = PyLong_AsLongLongAndOverflow(n, &overflow)
    if overflow or v < 0 or v >= 0xFFFFFFFF:
        raise ValueError(f"shared_mem_bytes must be a non-negative 32-bit count, got {n}")
    return <unsigned int>v


cdef uintptr_t _stream_handle(object stream) except? 1:
    """The CUstream of `stream`: an int handle, None (0), or an object with .cuda_stream."""
    if type(stream) is int and stream == 0:
        return 0
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError(f"stream must be a CUstream handle (int) or a torch.cuda.Stream, "
                        f"got {stream!r}")
    if not isinstance(stream, int):
        handle = getattr(stream, "cuda_stream", None)  # a torch.cuda.Stream
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise TypeError(f"stream must be a CUstream handle (int) or a torch.cuda.Stream, "
                            f"got {stream!r}")
        stream = handle
    if stream < 0 or stream > 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"stream handle must be a non-negative address, got {stream}")
    return <uintptr_t>PyLong_AsUnsignedLongLong(stream)


cdef str _arg_kind_text(object a, Py_ssize_t size):
    """What argument `a` of `size` bytes is, for messages; _pack_args has already made int and
    float subclasses plain ints and floats."""
    if type(a) is int:
        return "a Python int (int32, 4 bytes)"
    if type(a) is float:
        return "a Python float (float32, 4 bytes)"
    if isinstance(a, KernelArg):
        return f"{a!r} ({size} bytes)"
    return f"a {type(a).__name__} data pointer (8 bytes)"


cdef Py_ssize_t _pack_args(object args, uint64_t* arena, void** ptrs,
                           const uint32_t* expected, Py_ssize_t nexpected, str kernel,
                           Py_ssize_t* sizes_out) except -1:
    """Store each argument's bytes in `arena` and its address in `ptrs`; return the count.

    When nexpected >= 0, `expected` holds the kernel's parameter sizes and each argument is
    checked against its size. `sizes_out`, if not NULL, receives the size of each argument.
    """
    cdef Py_ssize_t n, i, size = 0, words = 0
    cdef int overflow = 0
    cdef long long iv
    cdef float fv
    cdef KernelArg wrapped
    cdef uint64_t* slot
    if type(args) is not tuple:
        args = tuple(args)
    n = PyTuple_GET_SIZE(args)
    if n > MAX_ARGS:
        raise ValueError(f"kernel {kernel!r}: at most {MAX_ARGS} arguments, got {n}")
    if nexpected >= 0 and n != nexpected:
        raise ValueError(f"kernel {kernel!r} takes {nexpected} argument(s), got {n}")
    for i in range(n):
        a = <object>PyTuple_GET_ITEM(args, i)
        if words >= ARENA_WORDS:
            raise ValueError(f"kernel {kernel!r}: arguments exceed {ARENA_WORDS * 8} bytes")
        slot = arena + words
        if type(a) is not int and type(a) is not float and not isinstance(a, KernelArg):
            if isinstance(a, bool):
                raise TypeError(f"kernel {kernel!r} argument {i}: a Python bool is ambiguous; "
                                "pass Bool(x) for a C++ bool or Int32(x) for an int")
            if isinstance(a, int):  # int subclasses such as IntEnum
                a = int(a)
            elif isinstance(a, float):  # float subclasses such as numpy.float64
                a = float(a)
            elif not hasattr(a, "data_ptr"):  # numpy.int32, numpy.float32, ...: not tensors
                if isinstance(a, numbers.Integral):
                    a = int(a)
                elif isinstance(a, numbers.Real):
                    a = float(a)
        if type(a) is int:
            iv = PyLong_AsLongLongAndOverflow(a, &overflow)
            if overflow or iv < -2147483648 or iv > 2147483647:
                raise ValueError(
                    f"kernel {kernel!r} argument {i}: the int {a} does not fit in int32; "
                    "wrap it, e.g. Int64(x), UInt32(x) or Pointer(x)")
            slot[0] = <uint32_t><int32_t>iv
            size = 4
        elif type(a) is float:
            fv = _float32(a, f"kernel {kernel!r} argument {i}")
            slot[0] = 0
            memcpy(slot, &fv, 4)
            size = 4
        elif isinstance(a, KernelArg):
            wrapped = <KernelArg>a
            size = wrapped._size
            if wrapped._blob is not None:
                if words + (size + 7) // 8 > ARENA_WORDS:
                    raise ValueError(
                        f"kernel {kernel!r}: arguments exceed {ARENA_WORDS * 8} bytes")
                memcpy(slot, <const char*>wrapped._blob, size)
            else:
                slot[0] = wrapped._bits
        else:
            data_ptr = getattr(a, "data_ptr", None)
            if data_ptr is None:
                raise TypeError(
                    f"kernel {kernel!r} argument {i} has unsupported type {type(a).__name__}; "
                    "pass an int (int32), a float (float32), a tensor (pointer) or a wrapper "
                    "such as Int64(x), Float64(x), Pointer(addr) or Bytes(struct)")
            if getattr(a, "is_cuda", True) is False:  # a host address would fault on the GPU
                raise ValueError(f"kernel {kernel!r} argument {i} is a tensor on "
                                 f"{getattr(a, 'device', 'the host')}: pass CUDA tensors")
            address = data_ptr()
            if type(address) is not int or address < 0 or address > 0xFFFFFFFFFFFFFFFF:
                raise ValueError(f"kernel {kernel!r} argument {i}: data_ptr() returned "
                                 f"{address!r}, not a 64-bit address")
            slot[0] = PyLong_AsUnsignedLongLong(address)
            size = 8
        if nexpected >= 0 and <Py_ssize_t>expected[i] != size:
            raise ValueError(
                f"kernel {kernel!r} argument {i} is a {expected[i]}-byte parameter, but "
                f"{_arg_kind_text(a, size)} was given; wrap it to match, e.g. Int64(x), "
                "Float64(x), Pointer(x), Bool(x) or Bytes(struct)")
        ptrs[i] = slot
        if sizes_out != NULL:
            sizes_out[i] = size
        words += (size + 7) // 8
    return n


def _pack_args_for_test(args, param_sizes=None) -> list:
    """Pack `args` as a launch would and return each argument's bytes (for tests).

    `param_sizes`, when given, plays the kernel's parameter sizes that launches check against.
    """
    cdef uint64_t arena[ARENA_WORDS]
    cdef void* ptrs[MAX_ARGS]
    cdef uint32_t expected[MAX_ARGS]
    cdef Py_ssize_t sizes[MAX_ARGS]
    cdef Py_ssize_t nexpected = -1
    if param_sizes is not None:
        nexpected = len(param_sizes)
        for i, s in enumerate(param_sizes[:MAX_ARGS]):
            expected[i] = s
    n = _pack_args(args, arena, ptrs, expected, nexpected, "test", sizes)
    return [(<char*>ptrs[i])[:sizes[i]] for i in range(n)]


def _check_launch_config_for_test(grid, block, shared_mem_bytes=0, stream=0) -> tuple:
    """Validate a launch configuration as Function.launch does; return it normalized (tests)."""
    cdef unsigned int g[3]
    cdef unsigned int b[3]
    _launch_dims(grid, block, g, b)
    smem = _shared_bytes(shared_mem_bytes)
    s = _stream_handle(stream)
    return (g[0], g[1], g[2]), (b[0], b[1], b[2]), smem, s


# --------------------------------------------------------------------------------------------------
# Modules and functions


# The garbage collector must not clear `context` before __dealloc__ runs: when a Module is part of
# collected garbage (say, a module's globals at interpreter exit) the last reference to its
# PrimaryContext could go first, releasing the context and then unloading the module from a
# context no longer retained. A Module refers to nothing that refers back, so no cycle is kept.
@cython.no_gc_clear
cdef class Module:
    """A cubin loaded into a device's primary context; unloaded by close() or when collected."""

    cdef CUmodule _handle
    cdef CUcontext _ctx
    cdef readonly PrimaryContext context
    cdef readonly int device

    def __init__(self, *args, **kwargs):
        raise TypeError("use Module.load(cubin, device)")

    @staticmethod
    def load(cubin, device=None) -> Module:
        """Load `cubin` (bytes: a cubin, fatbin or NUL-terminated PTX) on `device`.

        `device` is an ordinal, a torch.device, or None for the current device.
        """
        if not isinstance(cubin, (bytes, bytearray, memoryview)):
            raise TypeError(f"Module.load needs the cubin as bytes, got {type(cubin).__name__}")
        cdef bytes image = bytes(cubin)
        if len(image) == 0:
            raise ValueError("Module.load needs a non-empty cubin, got 0 bytes")
        ordinal = _ordinal_of(device)
        cdef PrimaryContext ctx = retain_primary_context(ordinal)
        cdef CUmodule handle = NULL
        cdef const char* data = image
        cdef CUresult r, r2 = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        with nogil:
            r = _push_if_needed(ctx._handle, &state)
            if r == CUDA_SUCCESS:
                r2 = _api.p_cuModuleLoadData(&handle, data)
                _pop_if_pushed(state)
        _check_push(r, state)
        if r2 != CUDA_SUCCESS:
            raise _make_error(r2, "cuModuleLoadData", f"{len(image)} bytes on device {ordinal}")
        cdef Module module = Module.__new__(Module)
        module._handle = handle
        module._ctx = ctx._handle
        module.context = ctx
        module.device = ordinal
        logger.debug("loaded a %d-byte module on device %d", len(image), ordinal)
        return module

    @property
    def closed(self) -> bool:
        return self._handle == NULL

    def get_function(self, name: str) -> Function:
        """The kernel `name` (its extern "C" or mangled name); CudaError if it is not here."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"kernel name must be a non-empty str, got {name!r}")
        if self._handle == NULL:
            raise ValueError(f"cannot get kernel {name!r}: the module is closed")
        cdef bytes encoded = name.encode()
        cdef CUfunction handle = NULL
        cdef CUresult r, r2 = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        r = _push_if_needed(self._ctx, &state)
        if r == CUDA_SUCCESS:
            r2 = _api.p_cuModuleGetFunction(&handle, self._handle, encoded)
            _pop_if_pushed(state)
        _check_push(r, state)
        if r2 != CUDA_SUCCESS:
            detail = f"kernel {name!r}"
            if r2 == CUDA_ERROR_NOT_FOUND:
                detail = (f"no kernel named {name!r} in this module (is it declared "
                          "extern \"C\" __global__?)")
            raise _make_error(r2, "cuModuleGetFunction", detail)
        cdef Function f = Function.__new__(Function)
        f._handle = handle
        f._ctx = self._ctx
        f._module = self
        f.name = name
        f._nparams = PARAMS_UNQUERIED
        f._sizes = NULL
        return f

    def close(self) -> None:
        """Unload the module; its Functions can no longer launch. Safe to call twice."""
        cdef CUmodule handle = self._handle
        cdef CUresult r, r2 = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        if handle == NULL:
            return
        self._handle = NULL  # before the GIL is released: a second close does nothing
        with nogil:
            r = _push_if_needed(self._ctx, &state)
            if r == CUDA_SUCCESS:
                r2 = _api.p_cuModuleUnload(handle)
                _pop_if_pushed(state)
        if r != CUDA_SUCCESS:  # not unloaded: a later close, or the collector, tries again
            self._handle = handle
        _check_push(r, state)
        _check(r2, "cuModuleUnload")

    def __enter__(self) -> Module:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._handle == NULL else f"0x{<uintptr_t>self._handle:x}"
        return f"<Module device={self.device} {state}>"

    def __dealloc__(self):
        cdef int state = CTX_ALREADY_CURRENT
        if self._handle != NULL and _loaded:
            # Errors are ignored: at interpreter exit the driver may already be shut down.
            if _push_if_needed(self._ctx, &state) == CUDA_SUCCESS:
                _api.p_cuModuleUnload(self._handle)
                _pop_if_pushed(state)
            self._handle = NULL


cdef class Function:
    """A kernel in a loaded Module: attributes, dynamic shared memory opt-in, and launch."""

    cdef CUfunction _handle
    cdef CUcontext _ctx
    cdef Module _module
    cdef readonly str name
    cdef Py_ssize_t _nparams
    cdef uint32_t* _sizes

    def __init__(self, *args, **kwargs):
        raise TypeError("use Module.get_function(name)")

    @property
    def module(self) -> Module:
        return self._module

    cdef int _get_attr(self, int attribute, str what) except? -1:
        cdef int value = 0
        cdef CUresult r, r2 = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        self._require_open()
        r = _push_if_needed(self._ctx, &state)
        if r == CUDA_SUCCESS:
            r2 = _api.p_cuFuncGetAttribute(&value, attribute, self._handle)
            _pop_if_pushed(state)
        _check_push(r, state)
        if r2 != CUDA_SUCCESS:
            raise _make_error(r2, "cuFuncGetAttribute", f"{what} of kernel {self.name!r}")
        return value

    cdef int _require_open(self) except -1:
        if self._module._handle == NULL:
            raise ValueError(f"kernel {self.name!r} belongs to a closed Module")
        return 0

    cdef int _query_params(self) except -1:
        """Read the parameter sizes once (cuFuncGetParamInfo); PARAMS_UNKNOWN if unsupported."""
        cdef size_t offset = 0, size = 0, i = 0
        cdef CUresult r = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        if self._nparams != PARAMS_UNQUERIED:
            return 0
        if _api.p_cuFuncGetParamInfo == NULL:
            self._nparams = PARAMS_UNKNOWN
            return 0
        self._get_attr(CU_FUNC_ATTRIBUTE_NUM_REGS, "registers")  # loads a lazily loaded kernel
        sizes = []
        r = _push_if_needed(self._ctx, &state)
        _check_push(r, state)
        while i < MAX_ARGS + 1:
            r = _api.p_cuFuncGetParamInfo(self._handle, i, &offset, &size)
            if r != CUDA_SUCCESS:
                break
            sizes.append(size)
            i += 1
        _pop_if_pushed(state)
        if r != CUDA_ERROR_INVALID_VALUE:  # INVALID_VALUE marks the end of the list
            logger.debug("cuFuncGetParamInfo unusable for %s (error %d); arguments unchecked",
                         self.name, r)
            self._nparams = PARAMS_UNKNOWN
            return 0
        self._sizes = <uint32_t*>malloc(max(1, len(sizes)) * sizeof(uint32_t))
        if self._sizes == NULL:
            raise MemoryError()
        for j, s in enumerate(sizes):
            self._sizes[j] = s
        self._nparams = len(sizes)
        return 0

    @property
    def param_sizes(self) -> tuple | None:
        """The kernel's parameter sizes in bytes, or None when the driver cannot report them."""
        self._require_open()
        self._query_params()
        if self._nparams < 0:
            return None
        return tuple(self._sizes[i] for i in range(self._nparams))

    def attributes(self) -> dict:
        """Registers, static/local/constant memory, thread limit and binary versions."""
        return {
            "num_regs": self._get_attr(CU_FUNC_ATTRIBUTE_NUM_REGS, "num_regs"),
            "static_shared_bytes": self._get_attr(
                CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "static_shared_bytes"),
            "max_threads_per_block": self._get_attr(
                CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "max_threads_per_block"),
            "local_bytes": self._get_attr(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "local_bytes"),
            "const_bytes": self._get_attr(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, "const_bytes"),
            "max_dynamic_shared_bytes": self._get_attr(
                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, "max_dynamic_shared_bytes"),
            "ptx_version": self._get_attr(CU_FUNC_ATTRIBUTE_PTX_VERSION, "ptx_version"),
            "binary_version": self._get_attr(CU_FUNC_ATTRIBUTE_BINARY_VERSION, "binary_version"),
        }

    def set_max_dynamic_shared_memory(self, nbytes: int) -> None:
        """Opt in to `nbytes` of dynamic shared memory per block (needed above 48 KiB)."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool):
            raise TypeError(f"dynamic shared memory must be an int byte count, got {nbytes!r}")
        if nbytes < 0:
            raise ValueError(f"dynamic shared memory must be >= 0 bytes, got {nbytes}")
        static = self._get_attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "static_shared_bytes")
        optin = device_attributes(self._module.device)["max_shared_memory_per_block_optin"]
        if nbytes > optin - static:
            raise ValueError(
                f"kernel {self.name!r} can opt in to at most {optin - static} bytes of dynamic "
                f"shared memory on device {self._module.device} ({optin} per block minus "
                f"{static} static), got {nbytes}")
        cdef CUresult r, r2 = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        r = _push_if_needed(self._ctx, &state)
        if r == CUDA_SUCCESS:
            r2 = _api.p_cuFuncSetAttribute(
                self._handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
            _pop_if_pushed(state)
        _check_push(r, state)
        if r2 != CUDA_SUCCESS:
            raise _make_error(r2, "cuFuncSetAttribute",
                              f"{nbytes} bytes of dynamic shared memory for kernel {self.name!r}")

    def launch(self, grid, block, args=(), shared_mem_bytes=0, stream=0) -> None:
        """Launch on `stream` (a CUstream handle int, 0 = default stream, or a torch.cuda.Stream).

        grid and block are ints or 1- to 3-tuples; args as described in the module docstring.
        """
        cdef unsigned int g[3]
        cdef unsigned int b[3]
        cdef uint64_t arena[ARENA_WORDS]
        cdef void* ptrs[MAX_ARGS]
        cdef unsigned int smem
        cdef CUstream s
        cdef CUresult r, r2 = CUDA_SUCCESS
        cdef int state = CTX_ALREADY_CURRENT
        _launch_dims(grid, block, g, b)
        smem = _shared_bytes(shared_mem_bytes)
        s = <CUstream>_stream_handle(stream)
        if self._module._handle == NULL:
            self._require_open()
        if self._nparams == PARAMS_UNQUERIED:
            self._query_params()
        _pack_args(args, arena, ptrs, self._sizes, self._nparams, self.name, NULL)
        with nogil:
            r = _push_if_needed(self._ctx, &state)
            if r == CUDA_SUCCESS:
                r2 = _api.p_cuLaunchKernel(self._handle, g[0], g[1], g[2], b[0], b[1], b[2],
                                           smem, s, ptrs, NULL)
                _pop_if_pushed(state)
        if r != CUDA_SUCCESS:
            _check_push(r, state)
        if r2 != CUDA_SUCCESS:
            raise _make_error(r2, "cuLaunchKernel",
                              f"kernel {self.name!r}, grid ({g[0]}, {g[1]}, {g[2]}), block "
                              f"({b[0]}, {b[1]}, {b[2]}), {smem} bytes of dynamic shared memory"
                              + _sticky_note(<int>r2))

    def __repr__(self) -> str:
        return f"<Function {self.name!r} device={self._module.device}>"

    def __dealloc__(self):
        free(self._sizes)


__all__ = [
    "Bool",
    "Bytes",
    "CudaDriverError",
    "CudaError",
    "Float32",
    "Float64",
    "Function",
    "Int32",
    "Int64",
    "KernelArg",
    "Module",
    "Pointer",
    "PrimaryContext",
    "STICKY_ERRORS",
    "UInt32",
    "UInt64",
    "built_with_cuda_version",
    "device_attributes",
    "device_count",
    "driver_version",
    "encode_tensor_map_tiled",
    "init",
    "library_path",
    "retain_primary_context",
]
