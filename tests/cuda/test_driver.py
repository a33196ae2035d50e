"""spio.cuda.driver: loading, errors, contexts, argument packing and launches.

Without a GPU the wrapper is exercised against a fake libcuda (a small C library built here and
selected with SPIO_LIBCUDA) in subprocesses, since the driver is loaded once per process. The fake
checks what the real driver would: a context is current where one must be, parameter sizes, and
dynamic shared memory limits. The `cuda` tests run the same API on a real GPU.
"""

import ctypes.util
import enum
import os
import pickle
import shutil
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

from tests.conftest import REPO, run_spio

driver = pytest.importorskip("spio.cuda.driver", reason="build with setup.py build_ext --inplace")

FAKE_LIBCUDA = r"""
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
typedef int CUresult;
typedef int CUdevice;
typedef struct { int dev; int refs; } Ctx;
typedef struct { Ctx *ctx; int loaded; } Mod;
typedef struct { Ctx *ctx; const char *name; int nparams; size_t sizes[8]; int smem; int dyn; } Fn;

static Ctx ctxs[2] = {{0, 0}, {1, 0}};
static Ctx *stack[16];
static int initialized;
static Mod mods[64];
static int nmods;
static Fn fns[64];
static int nfns;

int depth, unloads, launches, refs0, refs1, refs_at_unload;
int fail_get_current, fail_push;  /* set from a test: the error these calls then return */
int fail_sync, fail_set_attribute, fail_param_info;
int version = 13000;
unsigned last_dims[6], last_smem;
unsigned long long last_stream;
void *last_ctx;
unsigned char last_params[256];

static Ctx *current(void) { return depth ? stack[depth - 1] : NULL; }
static void count_refs(void) { refs0 = ctxs[0].refs; refs1 = ctxs[1].refs; }

CUresult cuInit(unsigned flags) {
    const char *e = getenv("FAKE_CUDA_INIT_ERROR");
    if (e) return atoi(e);
    initialized = 1;
    return 0;
}
CUresult cuDriverGetVersion(int *v) { *v = version; return 0; }
static const char *names[][3] = {
    {"0", "CUDA_SUCCESS", "no error"},
    {"1", "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {"3", "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {"4", "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {"100", "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {"101", "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {"200", "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {"201", "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {"400", "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {"500", "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {"700", "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {"801", "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};
static CUresult lookup(CUresult r, const char **s, int which) {
    for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
        if (atoi(names[i][0]) == r) { *s = names[i][which]; return 0; }
    *s = NULL;
    return 1;
}
CUresult cuGetErrorName(CUresult r, const char **s) { return lookup(r, s, 1); }
CUresult cuGetErrorString(CUresult r, const char **s) { return lookup(r, s, 2); }
CUresult cuDeviceGetCount(int *n) { if (!initialized) return 3; *n = 2; return 0; }
CUresult cuDeviceGet(CUdevice *d, int o) {
    if (!initialized) return 3;
    if (o < 0 || o > 1) return 101;
    *d = o;
    return 0;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    snprintf(name, len, "Fake GPU %d", d);
    return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    switch (attr) {
    case 1: *v = 1024; return 0;       /* max threads per block */
    case 8: *v = 49152; return 0;      /* shared memory per block */
    case 10: *v = 32; return 0;        /* warp size */
    case 13: *v = 1980000; return 0;   /* clock */
    case 16: *v = 132 - d; return 0;   /* SMs */
    case 37: *v = 6144; return 0;      /* bus width */
    case 38: *v = 62914560; return 0;  /* L2 */
    case 39: *v = 2048; return 0;
    case 75: *v = 9; return 0;
    case 76: *v = 0; return 0;
    case 81: *v = 233472; return 0;
    case 82: *v = 65536; return 0;
    case 97: *v = 232448; return 0;    /* opt-in shared memory per block */
    case 106: *v = 24; return 0;       /* resident blocks per SM */
    default: return 1;                 /* e.g. 36, the memory clock: "not reported" */
    }
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { *bytes = 150000000000ULL; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, CUdevice d) {
    ctxs[d].refs++;
    count_refs();
    *c = &ctxs[d];
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (ctxs[d].refs == 0) return 201;
    ctxs[d].refs--;
    count_refs();
    return 0;
}
CUresult cuCtxGetCurrent(void **c) {
    if (fail_get_current) return fail_get_current;
    *c = current();
    return 0;
}
CUresult cuCtxPushCurrent_v2(void *c) {
    if (fail_push) return fail_push;
    stack[depth++] = c;
    return 0;
}
CUresult cuCtxPopCurrent_v2(void **c) {
    if (!depth) return 201;
    *c = stack[--depth];
    return 0;
}
CUresult cuCtxGetDevice(CUdevice *d) { if (!depth) return 201; *d = current()->dev; return 0; }
CUresult cuCtxSynchronize(void) { return depth ? fail_sync : 201; }
CUresult cuModuleLoadData(void **m, const void *image) {
    if (!current()) return 201;
    if (memcmp(image, "FAKECUBIN", 9) != 0) return 200;
    mods[nmods].ctx = current();
    mods[nmods].loaded = 1;
    *m = &mods[nmods++];
    return 0;
}
CUresult cuModuleUnload(Mod *m) {
    if (current() != m->ctx) return 201;
    m->loaded = 0;
    unloads++;
    refs_at_unload = m->ctx->refs;
    return 0;
}
CUresult cuModuleGetFunction(void **f, Mod *m, const char *name) {
    if (!m->loaded) return 400;
    Fn fn = {m->ctx, "", 0, {0}, 0, 49152};
    if (!strcmp(name, "write_pattern")) {
        fn.nparams = 3; fn.sizes[0] = 8; fn.sizes[1] = 4; fn.sizes[2] = 4;
    } else if (!strcmp(name, "big_smem")) {
        fn.nparams = 1; fn.sizes[0] = 8; fn.smem = 1024; fn.dyn = 49152 - 1024;
    } else if (!strcmp(name, "no_params")) {
    } else {
        return 500;
    }
    fns[nfns] = fn;
    *f = &fns[nfns++];
    return 0;
}
CUresult cuFuncGetAttribute(int *v, int attr, Fn *f) {
    switch (attr) {
    case 0: *v = 1024; return 0;
    case 1: *v = f->smem; return 0;
    case 2: case 3: *v = 0; return 0;
    case 4: *v = 40; return 0;
    case 5: case 6: *v = 90; return 0;
    case 8: *v = f->dyn; return 0;
    default: return 1;
    }
}
CUresult cuFuncSetAttribute(Fn *f, int attr, int v) {
    if (fail_set_attribute) return fail_set_attribute;
    if (attr != 8 || v < 0 || v + f->smem > 232448) return 1;
    f->dyn = v;
    return 0;
}
#ifndef NO_PARAM_INFO
CUresult cuFuncGetParamInfo(Fn *f, size_t i, size_t *offset, size_t *size) {
    size_t off = 0;
    if (fail_param_info) return fail_param_info;
    if (i >= (size_t)f->nparams) return 1;
    for (size_t j = 0; j < i; ++j) off += f->sizes[j];
    *offset = off;
    *size = f->sizes[i];
    return 0;
}
#endif
#ifndef NO_PARAM_INFO
/* Records its arguments in the map, word by word, so that a test can read back what it was
   given: the real driver's encoding is opaque. 1 (invalid value) for a map not 64-byte aligned. */
CUresult cuTensorMapEncodeTiled(void *map, int type, unsigned rank, void *address,
                                const unsigned long long *dims, const unsigned long long *strides,
                                const unsigned *box, const unsigned *elem, int interleave,
                                int swizzle, int l2, int oob) {
    unsigned long long *w = map;
    if ((unsigned long long)map % 64) return 1;
    memset(map, 0, 128);
    w[0] = type | (unsigned long long)rank << 8 | (unsigned long long)interleave << 16 |
           (unsigned long long)swizzle << 24 | (unsigned long long)l2 << 32 |
           (unsigned long long)oob << 40;
    w[1] = (unsigned long long)address;
    for (unsigned i = 0; i < rank; ++i) {
        w[2 + i] = dims[i];
        w[7 + i] = (unsigned long long)box[i] | (unsigned long long)elem[i] << 32;
        if (i + 1 < rank) w[12 + i] = strides[i];
    }
    return 0;
}
#endif
CUresult cuLaunchKernel(Fn *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void *stream, void **params, void **extra) {
    size_t off = 0;
    if (current() != f->ctx) return 201;
    if (smem > (unsigned)f->dyn) return 1;
    unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    memcpy(last_dims, dims, sizeof dims);
    last_smem = smem;
    last_stream = (unsigned long long)stream;
    last_ctx = current();
    for (int i = 0; i < f->nparams; ++i) {
        memcpy(last_params + off, params[i], f->sizes[i]);
        off += f->sizes[i];
    }
    launches++;
    return 0;
}
"""

PRELUDE = """
import ctypes, enum, gc, os, struct
import pytest
from spio.cuda import driver as d
library = os.environ["SPIO_LIBCUDA"]
fake = ctypes.CDLL(library) if os.path.exists(library) else None
def g(name):
    return ctypes.c_int.in_dll(fake, name).value
def current_ctx():
    c = ctypes.c_void_p()
    assert fake.cuCtxGetCurrent(ctypes.byref(c)) == 0
    return c.value or 0
class Tensor:
    def __init__(self, ptr):
        self.ptr = ptr
    def data_ptr(self):
        return self.ptr
CUBIN = b"FAKECUBIN and the rest of an image"
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    """Build the fake driver library twice: with and without cuFuncGetParamInfo."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the fake libcuda")
    folder = tmp_path_factory.mktemp("fake_libcuda")
    source = folder / "fake.c"
    source.write_text(FAKE_LIBCUDA)
    libs = {}
    for variant, flags in (("new", []), ("old", ["-DNO_PARAM_INFO"])):
        lib = folder / f"libcuda_{variant}.so"
        subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", *flags, "-o", str(lib), str(source)], check=True
        )
        libs[variant] = lib
    return libs


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` (dedented) in a fresh interpreter, in the repository and importing spio from it,
    with these variables added to the environment."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(REPO), "SPIO_TEST_KERNELS": KERNELS, **env},
        capture_output=True,
        encoding="utf-8",
        timeout=300,
        cwd=REPO,
    )


def run_with(library, code: str, **env) -> None:
    """Run `code` (after PRELUDE) in a fresh interpreter whose driver library is `library`."""
    proc = _run_python(PRELUDE + textwrap.dedent(code), SPIO_LIBCUDA=str(library), **env)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"


# --------------------------------------------------------------------------------------------------
# No driver at all


def test_error_types_and_message():
    assert issubclass(driver.CudaError, RuntimeError)
    assert issubclass(driver.CudaDriverError, RuntimeError)
    err = driver.CudaError(200, "CUDA_ERROR_INVALID_IMAGE", "cuModuleLoadData", "bad image")
    assert str(err) == "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (bad image)"
    assert (err.code, err.name, err.call) == (200, "CUDA_ERROR_INVALID_IMAGE", "cuModuleLoadData")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.code == 200


def test_missing_library_is_a_clear_driver_error(tmp_path, monkeypatch):
    missing = tmp_path / "libcuda.so.1"
    monkeypatch.delenv("SPIO_LIBCUDA", raising=False)
    with pytest.raises(driver.CudaDriverError, match="No NVIDIA driver found") as info:
        driver._probe_library(str(missing))
    assert str(missing) in str(info.value) and "SPIO_LIBCUDA" not in str(info.value)
    # Where SPIO_LIBCUDA chose the library, the message names the setting (it had blamed the
    # GPU or driver alone).
    monkeypatch.setenv("SPIO_LIBCUDA", "~")
    with pytest.raises(driver.CudaDriverError) as info:
        driver._probe_library(driver.library_path())
    assert "That is the library SPIO_LIBCUDA='~' names: set it to the CUDA driver" in str(
        info.value
    )


def test_library_without_the_entry_points_is_rejected():
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no libc found to stand in for a wrong library")
    with pytest.raises(driver.CudaDriverError, match="has no entry point cuInit"):
        driver._probe_library(libc)


def test_every_call_raises_without_a_driver(tmp_path):
    code = """
    for call in (d.init, d.driver_version, d.device_count, lambda: d.device_attributes(0),
                 lambda: d.retain_primary_context(0), lambda: d.Module.load(CUBIN, 0)):
        with pytest.raises(d.CudaDriverError, match="No NVIDIA driver found"):
            call()
    """
    run_with(tmp_path / "nowhere" / "libcuda.so.1", code)


def test_import_does_not_load_the_driver(tmp_path):
    code = "from spio.cuda import driver as d; print(d.library_path(), d.built_with_cuda_version)"
    proc = _run_python(code, SPIO_LIBCUDA=str(tmp_path / "missing.so"))
    assert proc.returncode == 0, proc.stderr
    path, version = proc.stdout.split()
    assert path.endswith("missing.so") and int(version) >= 12000


# --------------------------------------------------------------------------------------------------
# Launch configuration and argument packing (no driver needed)


@pytest.mark.parametrize(
    ("grid", "block", "expected"),
    [
        (5, 128, ((5, 1, 1), (128, 1, 1))),
        ((4, 3), [32, 8], ((4, 3, 1), (32, 8, 1))),
        ((2**31 - 1, 65535, 65535), (8, 8, 16), ((2**31 - 1, 65535, 65535), (8, 8, 16))),
    ],
)
def test_launch_config_normalized(grid, block, expected):
    g, b, smem, stream = driver._check_launch_config_for_test(grid, block)
    assert (g, b, smem, stream) == (*expected, 0, 0)


@pytest.mark.parametrize(
    ("grid", "block", "error", "match"),
    [
        (0, 32, ValueError, r"grid x must be in 1\.\.2147483647, got 0"),
        (-1, 32, ValueError, "grid x"),
        ((1, 65536), 32, ValueError, r"grid y must be in 1\.\.65535, got 65536"),
        (2**40, 32, ValueError, "grid x"),
        (1, 1025, ValueError, r"block x must be in 1\.\.1024, got 1025"),
        (1, (1, 1, 65), ValueError, "block z"),
        (1, (64, 32), ValueError, r"at most 1024 threads, got 64x32x1 = 2048"),
        (1, (), ValueError, "1 to 3 dimensions"),
        ((1, 1, 1, 1), 32, ValueError, "1 to 3 dimensions"),
        ("8", 32, TypeError, "grid must be an int or a tuple"),
        ((1.0, 2), 32, TypeError, "grid x must be an int"),
        (1, (32, True), TypeError, "block y must be an int"),
    ],
)
def test_launch_config_rejected(grid, block, error, match):
    with pytest.raises(error, match=match):
        driver._check_launch_config_for_test(grid, block)


def test_shared_memory_and_stream_validation():
    class TorchStream:
        cuda_stream = 0xABC

    assert driver._check_launch_config_for_test(1, 1, 4096, TorchStream())[2:] == (4096, 0xABC)
    assert driver._check_launch_config_for_test(1, 1, 0, None)[3] == 0
    with pytest.raises(ValueError, match="shared_mem_bytes"):
        driver._check_launch_config_for_test(1, 1, -1)
    with pytest.raises(TypeError, match="shared_mem_bytes"):
        driver._check_launch_config_for_test(1, 1, 1.5)
    with pytest.raises(ValueError, match="stream handle"):
        driver._check_launch_config_for_test(1, 1, 0, -5)
    with pytest.raises(TypeError, match="stream must be"):
        driver._check_launch_config_for_test(1, 1, 0, "default")
    # An int subclass is a handle (an IntEnum of streams); a bool, a handle or not, is refused.
    assert driver._check_launch_config_for_test(1, 1, 0, Color.RED)[3] == 3
    for flag in (True, False):
        with pytest.raises(TypeError, match="stream must be"):
            driver._check_launch_config_for_test(1, 1, 0, flag)

    class BoolStream:
        cuda_stream = True

    with pytest.raises(TypeError, match="stream must be"):
        driver._check_launch_config_for_test(1, 1, 0, BoolStream())


class FakeTensor:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


class Color(enum.IntEnum):
    RED = 3


def test_arguments_packed_as_c_values():
    blob = struct.pack("<iif", 1, 2, 3.0)
    args = [
        7,
        -2,
        1.5,
        FakeTensor(0xDEADBEEF00),
        driver.Int64(-(2**40)),
        driver.UInt32(2**32 - 1),
        driver.UInt64(2**64 - 1),
        driver.Float64(0.1),
        driver.Float32(0.25),
        driver.Bool(1),
        driver.Pointer(FakeTensor(16)),
        driver.Pointer(32),
        driver.Bytes(blob),
        Color.RED,
    ]
    packed = driver._pack_args_for_test(args)
    assert packed == [
        struct.pack("<i", 7),
        struct.pack("<i", -2),
        struct.pack("<f", 1.5),
        struct.pack("<Q", 0xDEADBEEF00),
        struct.pack("<q", -(2**40)),
        struct.pack("<I", 2**32 - 1),
        struct.pack("<Q", 2**64 - 1),
        struct.pack("<d", 0.1),
        struct.pack("<f", 0.25),
        b"\x01",
        struct.pack("<Q", 16),
        struct.pack("<Q", 32),
        blob,
        struct.pack("<i", 3),
    ]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ([2**31], ValueError, "does not fit in int32"),
        ([-(2**31) - 1], ValueError, "does not fit in int32"),
        ([True], TypeError, "bool is ambiguous"),
        (["x"], TypeError, "argument 0 has unsupported type str"),
        ([1, None], TypeError, "argument 1 has unsupported type NoneType"),
        ([FakeTensor(-1)], ValueError, "not a 64-bit address"),
        ([driver.Bytes(bytes(4096)), 1], ValueError, "exceed 4096 bytes"),
        ([1e40], ValueError, "the float 1e\\+40 does not fit in float32; wrap it as Float64"),
        ([-3.5e38], ValueError, "does not fit in float32"),
    ],
)
def test_bad_arguments_rejected(args, error, match):
    with pytest.raises(error, match=match):
        driver._pack_args_for_test(args)


@pytest.mark.parametrize(
    ("make", "value", "error"),
    [
        (driver.Int32, 2**31, ValueError),
        (driver.UInt32, -1, ValueError),
        (driver.Int64, 2**63, ValueError),
        (driver.UInt64, 2**64, ValueError),
        (driver.Pointer, -8, ValueError),
        (driver.Pointer, "0x10", TypeError),
        (driver.Int64, 1.5, TypeError),
        (driver.Int32, True, TypeError),
        (driver.Bytes, b"", ValueError),
        (driver.Float32, 1e40, ValueError),
    ],
)
def test_wrapper_ranges(make, value, error):
    with pytest.raises(error):
        make(value)


def test_numpy_scalars_pack_as_ints_and_floats_and_infinities_as_given():
    """numpy.float32 had been refused as an unsupported type where numpy.float64 passed; a
    float too large for float32 had been packed as inf, where an int too large for int32 is
    refused. inf and nan given as such still pass."""
    np = pytest.importorskip("numpy")
    packed = driver._pack_args_for_test([np.float32(2.5), np.int32(-3), np.float64(1.5)])
    assert packed == [struct.pack("<f", 2.5), struct.pack("<i", -3), struct.pack("<f", 1.5)]
    inf, nan = driver._pack_args_for_test([float("inf"), float("nan")])
    assert struct.unpack("<f", inf)[0] == float("inf") and struct.unpack("<f", nan)[0] != 0


def test_host_tensors_are_refused_as_kernel_arguments():
    """A CPU tensor's data_ptr() is a host address, which a kernel would fault on (a sticky
    error, ending the process's use of the GPU)."""
    import torch

    with pytest.raises(ValueError, match="argument 1 is a tensor on cpu: pass CUDA tensors"):
        driver._pack_args_for_test([FakeTensor(16), torch.zeros(4)])


def test_launch_errors_that_may_be_an_earlier_launchs_say_so():
    """An illegal address from an earlier asynchronous launch is reported by the next launch,
    which had been named as its cause."""
    note = driver._sticky_note(700)  # CUDA_ERROR_ILLEGAL_ADDRESS
    assert "earlier asynchronous launch's" in note and "CUDA_LAUNCH_BLOCKING=1" in note
    assert driver._sticky_note(719) == note  # CUDA_ERROR_LAUNCH_FAILED
    assert driver._sticky_note(710) == note  # CUDA_ERROR_ASSERT: e.g. PyTorch's index checks
    assert driver._sticky_note(701) == ""  # out of resources: this launch's own
    # spio.check reads the same list (public) to stop at a sticky error
    assert {700, 710, 719} <= driver.STICKY_ERRORS and 701 not in driver.STICKY_ERRORS


def test_the_driver_library_setting(monkeypatch, tmp_path):
    """A relative SPIO_LIBCUDA is opened by its absolute path (dlopen takes a name without "/"
    as a soname to search for); a bare name is the loader's to find; blank is the default."""
    monkeypatch.chdir(tmp_path)
    for text, want in (
        ("", "libcuda.so.1"),
        ("  ", "libcuda.so.1"),
        ("libcuda.so", "libcuda.so"),
        ("./fake/libcuda.so", str(tmp_path / "fake/libcuda.so")),
    ):
        monkeypatch.setenv("SPIO_LIBCUDA", text)
        assert driver.library_path() == want


def test_wrappers_cannot_be_built_directly():
    for cls in (driver.KernelArg, driver.Module, driver.Function, driver.PrimaryContext):
        with pytest.raises(TypeError):
            cls()


def test_arguments_checked_against_parameter_sizes():
    assert driver._pack_args_for_test([FakeTensor(8), 1], param_sizes=[8, 4])
    with pytest.raises(ValueError, match="takes 2 argument"):
        driver._pack_args_for_test([FakeTensor(8)], param_sizes=[8, 4])
    with pytest.raises(ValueError, match=r"argument 0 is a 8-byte parameter, but a Python int"):
        driver._pack_args_for_test([5, 1], param_sizes=[8, 4])
    with pytest.raises(ValueError, match=r"argument 0 is a 8-byte parameter, but a Python int"):
        driver._pack_args_for_test([Color.RED, 1], param_sizes=[8, 4])  # an int subclass
    with pytest.raises(ValueError, match=r"argument 1 is a 1-byte parameter"):
        driver._pack_args_for_test([FakeTensor(8), 1.0], param_sizes=[8, 1])
    packed = driver._pack_args_for_test([driver.Int64(5), driver.Bool(False)], param_sizes=[8, 1])
    assert packed == [struct.pack("<q", 5), b"\x00"]


def test_an_empty_spio_libcuda_means_the_default_library(monkeypatch):
    """SPIO_LIBCUDA set but empty (as `SPIO_LIBCUDA= python ...` leaves it) names no library:
    dlopen("") would hand back the program itself instead of the NVIDIA driver."""
    monkeypatch.delenv("SPIO_LIBCUDA", raising=False)
    default = driver.library_path()
    monkeypatch.setenv("SPIO_LIBCUDA", "")
    assert driver.library_path() == default == "libcuda.so.1"


def test_a_device_that_is_not_cuda_is_refused_before_the_driver_is_used():
    """Module.load on a CPU torch.device is a ValueError naming the device: read as "the current
    device", it would load the cubin on a GPU the caller did not ask for."""
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="spio kernels run on CUDA devices, got device"):
        driver.Module.load(b"FAKECUBIN", torch.device("cpu"))


def test_the_limits_of_each_argument_type_are_accepted():
    """The extreme values an argument type holds pack as themselves: a check one off at either
    end of a range (or of the 4 KiB and 512-argument limits) refuses a valid launch."""
    ints = [2**31 - 1, -(2**31)]
    assert driver._pack_args_for_test(ints) == [struct.pack("<i", v) for v in ints]
    wrapped = [driver.Int32(2**31 - 1), driver.Int32(-(2**31)), driver.Int64(2**63 - 1)]
    packed = driver._pack_args_for_test(wrapped)
    assert packed == [struct.pack("<i", 2**31 - 1), struct.pack("<i", -(2**31))] + [
        struct.pack("<q", 2**63 - 1)
    ]
    whole_arena = bytes(range(256)) * 16
    assert driver._pack_args_for_test([driver.Bytes(whole_arena)]) == [whole_arena]
    assert driver._pack_args_for_test([driver.Bytes(whole_arena[8:]), 7]) == [
        whole_arena[8:],
        struct.pack("<i", 7),
    ]
    most = list(range(512))
    assert driver._pack_args_for_test(most) == [struct.pack("<i", v) for v in most]
    with pytest.raises(ValueError, match="at most 512 arguments, got 513"):
        driver._pack_args_for_test([*most, 512])


# --------------------------------------------------------------------------------------------------
# The wrapper against a fake driver


def test_fake_driver_devices(fake_libcuda):
    run_with(
        fake_libcuda["new"],
        """
    assert d.driver_version() == (13, 0)
    d.init()
    assert d.device_count() == 2
    a = d.device_attributes(1)
    assert a["name"] == "Fake GPU 1"
    assert a["compute_capability"] == (9, 0) and a["arch"] == "sm_90"
    assert a["sm_count"] == 131 and a["l2_cache_bytes"] == 62914560
    assert a["max_shared_memory_per_block_optin"] == 232448
    assert a["max_shared_memory_per_sm"] == 233472
    assert a["warp_size"] == 32 and a["max_threads_per_block"] == 1024
    assert a["memory_clock_khz"] is None and a["memory_bus_width_bits"] == 6144
    a["name"] = "changed"
    assert d.device_attributes(1)["name"] == "Fake GPU 1"
    with pytest.raises(ValueError, match=r"ordinal must be in 0\\.\\.1, got 2"):
        d.device_attributes(2)
    # True is not device 1, nor 1.0; an IntEnum is its value.
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="ordinal must be an int"):
            d.device_attributes(bad)
        with pytest.raises(TypeError, match="ordinal must be an int"):
            d.retain_primary_context(bad)
    class Gpu(enum.IntEnum):
        SECOND = 1
    assert d.device_attributes(Gpu.SECOND)["name"] == "Fake GPU 1"
    assert d.retain_primary_context(Gpu.SECOND) is d.retain_primary_context(1)
    assert type(d.retain_primary_context(1).ordinal) is int
    """,
    )


@pytest.mark.parametrize(
    "code, name, message",
    [
        (100, "CUDA_ERROR_NO_DEVICE", "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable"),
        (999, "CUDA_ERROR_999", "cuInit failed: CUDA_ERROR_999"),
    ],
)
def test_fake_driver_errors_carry_code_name_and_call(fake_libcuda, code, name, message):
    """A failed call's CudaError carries its code, the driver's name for it and the call. An
    error code the driver has no name for (a newer driver's) is named CUDA_ERROR_<code>, with
    no description, so the number is never lost."""
    unknown = code == 999
    run_with(
        fake_libcuda["new"],
        f"""
    with pytest.raises(d.CudaError) as info:
        d.init()
    e = info.value
    assert (e.code, e.name, e.call) == ({code}, {name!r}, "cuInit")
    assert str(e).startswith({message!r})
    if {unknown}:
        assert e.description == "" and str(e) == {message!r}
    """,
        FAKE_CUDA_INIT_ERROR=str(code),
    )
    run_with(
        fake_libcuda["new"],
        """
    with pytest.raises(d.CudaError, match="cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE"):
        d.Module.load(b"not a cubin", 0)
    with pytest.raises(ValueError, match="non-empty"):
        d.Module.load(b"", 0)
    with pytest.raises(TypeError, match="as bytes"):
        d.Module.load("FAKECUBIN", 0)
    m = d.Module.load(CUBIN, 0)
    with pytest.raises(d.CudaError) as info:
        m.get_function("missing_kernel")
    assert info.value.code == 500 and info.value.call == "cuModuleGetFunction"
    assert "no kernel named 'missing_kernel'" in str(info.value)
    """,
    )


def test_fake_driver_context_errors_name_the_failing_call(fake_libcuda):
    """A failed cuCtxGetCurrent (e.g. CUDA_ERROR_DEINITIALIZED at shutdown) is reported as
    cuCtxGetCurrent, and a failed push as cuCtxPushCurrent, by every call that makes its context
    current; nothing is launched, loaded or left pushed."""
    run_with(
        fake_libcuda["new"],
        """
    m = d.Module.load(CUBIN, 0)
    f = m.get_function("write_pattern")
    f2 = m.get_function("big_smem")
    ctx = d.retain_primary_context(0)
    calls = {
        "launch": lambda: f.launch(1, 32, (Tensor(64), 1, 2.0)),
        "load": lambda: d.Module.load(CUBIN, 0),
        "get_function": lambda: m.get_function("no_params"),
        "attributes": f.attributes,
        "param_sizes": lambda: f2.param_sizes,
        "set_max_dynamic_shared_memory": lambda: f.set_max_dynamic_shared_memory(60000),
        "synchronize": ctx.synchronize,
    }
    for switch, code, name, call in (
        ("fail_get_current", 4, "CUDA_ERROR_DEINITIALIZED", "cuCtxGetCurrent"),
        ("fail_push", 201, "CUDA_ERROR_INVALID_CONTEXT", "cuCtxPushCurrent"),
    ):
        ctypes.c_int.in_dll(fake, switch).value = code
        for what, fn in calls.items():
            with pytest.raises(d.CudaError) as info:
                fn()
            e = info.value
            assert (e.code, e.name, e.call) == (code, name, call), (what, str(e))
            assert str(e).startswith(f"{call} failed: {name}"), (what, str(e))
        ctypes.c_int.in_dll(fake, switch).value = 0
    assert g("launches") == 0 and g("depth") == 0
    m.close()
    """,
    )


def test_fake_driver_close_with_a_failed_push_can_be_tried_again(fake_libcuda):
    """A close whose push fails leaves the module loaded, and a later close unloads it (it had
    forgotten the handle: the module stayed loaded for good)."""
    run_with(
        fake_libcuda["new"],
        """
    m = d.Module.load(CUBIN, 0)
    ctypes.c_int.in_dll(fake, "fail_push").value = 201
    with pytest.raises(d.CudaError, match="cuCtxPushCurrent"):
        m.close()
    ctypes.c_int.in_dll(fake, "fail_push").value = 0
    assert not m.closed and g("unloads") == 0
    m.close()
    assert m.closed and g("unloads") == 1
    """,
    )


def test_fake_driver_contexts_pushed_and_restored(fake_libcuda):
    run_with(
        fake_libcuda["new"],
        """
    d.init()
    assert current_ctx() == 0
    m = d.Module.load(CUBIN, 0)  # the fake refuses to load without a current context
    assert m.device == 0 and current_ctx() == 0 and g("depth") == 0
    f = m.get_function("write_pattern")
    ctx0 = d.retain_primary_context(0)
    assert ctx0 is m.context and g("refs0") == 1
    with d.retain_primary_context(1) as ctx1:
        assert current_ctx() == ctx1.handle
        f.launch(1, 32, (Tensor(64), 1, 2.0))
        assert ctypes.c_void_p.in_dll(fake, "last_ctx").value == ctx0.handle
        assert current_ctx() == ctx1.handle and g("depth") == 1
        m1 = d.Module.load(CUBIN)  # no device: the current context's device
        assert m1.device == 1
    assert current_ctx() == 0 and g("depth") == 0
    with ctx0:
        f.launch(1, 32, (Tensor(64), 1, 2.0))  # fast path: already current
        assert g("depth") == 1
        ctx0.synchronize()
    assert g("launches") == 2 and g("depth") == 0
    """,
    )


def test_fake_driver_launch_passes_arguments(fake_libcuda):
    run_with(
        fake_libcuda["new"],
        """
    class Stream:
        cuda_stream = 0x5150
    f = d.Module.load(CUBIN, 0).get_function("write_pattern")
    assert f.param_sizes == (8, 4, 4)
    f.launch((3, 2), (64, 2), [Tensor(0x7F0000001000), -9, 0.75], stream=Stream())
    dims = (ctypes.c_uint * 6).in_dll(fake, "last_dims")
    assert list(dims) == [3, 2, 1, 64, 2, 1]
    assert ctypes.c_ulonglong.in_dll(fake, "last_stream").value == 0x5150
    params = bytes((ctypes.c_ubyte * 16).in_dll(fake, "last_params"))
    assert params == struct.pack("<Qif", 0x7F0000001000, -9, 0.75)
    with pytest.raises(ValueError, match="takes 3 argument"):
        f.launch(1, 1, [Tensor(8), 1])
    with pytest.raises(ValueError, match="argument 0 is a 8-byte parameter"):
        f.launch(1, 1, [8, 1, 1.0])
    with pytest.raises(ValueError, match="block x"):
        f.launch(1, 2048, [Tensor(8), 1, 1.0])
    assert g("launches") == 1
    """,
    )


def test_fake_driver_dynamic_shared_memory(fake_libcuda):
    run_with(
        fake_libcuda["new"],
        """
    f = d.Module.load(CUBIN, 0).get_function("big_smem")
    attrs = f.attributes()
    assert attrs["num_regs"] == 40 and attrs["static_shared_bytes"] == 1024
    assert attrs["max_threads_per_block"] == 1024
    with pytest.raises(d.CudaError) as info:
        f.launch(1, 128, [Tensor(8)], shared_mem_bytes=100000)
    assert info.value.call == "cuLaunchKernel" and "'big_smem'" in str(info.value)
    assert "100000 bytes of dynamic shared memory" in str(info.value)
    f.set_max_dynamic_shared_memory(100000)
    assert f.attributes()["max_dynamic_shared_bytes"] == 100000
    f.launch(1, 128, [Tensor(8)], shared_mem_bytes=100000)
    assert ctypes.c_uint.in_dll(fake, "last_smem").value == 100000
    with pytest.raises(ValueError, match=r"at most 231424 bytes .* got 231425"):
        f.set_max_dynamic_shared_memory(232448 - 1024 + 1)
    with pytest.raises(ValueError, match=">= 0"):
        f.set_max_dynamic_shared_memory(-1)
    """,
    )


def test_fake_driver_module_lifetime(fake_libcuda):
    run_with(
        fake_libcuda["new"],
        """
    m = d.Module.load(CUBIN, 0)
    f = m.get_function("no_params")
    f.launch(1, 1)
    m.close()
    assert m.closed and g("unloads") == 1
    m.close()
    assert g("unloads") == 1
    with pytest.raises(ValueError, match="closed Module"):
        f.launch(1, 1)
    with pytest.raises(ValueError, match="module is closed"):
        m.get_function("no_params")
    with d.Module.load(CUBIN, 0) as m2:
        pass
    assert m2.closed and g("unloads") == 2
    m3 = d.Module.load(CUBIN, 0)
    f3 = m3.get_function("no_params")
    del m3
    gc.collect()
    assert g("unloads") == 2  # the Function keeps its module alive
    del f3
    gc.collect()
    assert g("unloads") == 3 and g("depth") == 0
    """,
    )


def test_fake_driver_module_collected_as_garbage_unloads_before_release(fake_libcuda):
    """A Module in collected garbage (as the modules' globals are at interpreter exit) is unloaded
    while its primary context is still retained: the collector does not drop the Module's
    reference to its PrimaryContext first."""
    run_with(
        fake_libcuda["new"],
        """
    gc.disable()
    m = d.Module.load(CUBIN, 0)
    garbage = [m]
    garbage.append(garbage)
    del m
    d._primary_contexts.clear()  # only the Module holds its context now, as at exit
    del garbage
    gc.collect()
    assert g("unloads") == 1 and g("refs0") == 0
    assert g("refs_at_unload") == 1
    """,
    )


@pytest.mark.parametrize("driver_state", ["running", "shut down"])
def test_fake_driver_modules_alive_at_exit(fake_libcuda, driver_state):
    """Modules, functions and contexts still referenced at interpreter exit (as spio's loaded
    kernels are) are freed without an error or a crash, whether the driver still runs or already
    answers CUDA_ERROR_DEINITIALIZED."""
    shut_down = driver_state == "shut down"
    run_with(
        fake_libcuda["new"],
        f"""
    m = d.Module.load(CUBIN, 0)
    f = m.get_function("write_pattern")
    f.launch(1, 32, (Tensor(64), 1, 2.0))
    ctx = d.retain_primary_context(1)
    if {shut_down}:
        ctypes.c_int.in_dll(fake, "fail_get_current").value = 4
    """,
    )


def test_fake_driver_primary_context_retain_release(fake_libcuda):
    run_with(
        fake_libcuda["new"],
        """
    c = d.retain_primary_context(0)
    assert d.retain_primary_context(0) is c and g("refs0") == 1
    c.release()
    assert g("refs0") == 0 and not c.retained and c.handle == 0
    c.release()
    assert g("refs0") == 0
    with pytest.raises(ValueError, match="released"):
        c.synchronize()
    c2 = d.retain_primary_context(0)
    assert c2 is not c and g("refs0") == 1
    """,
    )


def test_fake_old_driver_skips_parameter_checks(fake_libcuda):
    run_with(
        fake_libcuda["old"],
        """
    f = d.Module.load(CUBIN, 0).get_function("write_pattern")
    assert f.param_sizes is None
    f.launch(1, 1, [Tensor(0x1000), 5, 2.5])
    params = bytes((ctypes.c_ubyte * 16).in_dll(fake, "last_params"))
    assert params == struct.pack("<Qif", 0x1000, 5, 2.5)
    """,
    )


def test_fake_driver_tensor_map_gets_the_maps_arguments(fake_libcuda):
    """TensorMap.cuda_bytes passes cuTensorMapEncodeTiled the map's facts as cuda.h numbers them
    (the fake records its arguments in the map; the real encoding is opaque), at a 64-byte
    aligned address (the fake refuses others), and its argument on a GPU is a by-value Bytes."""
    run_with(
        fake_libcuda["new"],
        """
    from spio.cuda.tensor_map import TensorMap
    m = TensorMap(0x7000, 2, (64, 66, 64, 128), (128, 8448, 540672), (64, 34, 1, 1), 128)
    blob = m.cuda_bytes()
    w = struct.unpack("<16Q", blob)
    # UINT16 (1), rank 4, no interleave, SWIZZLE_128B (3), no L2 promotion, zeros out of bounds
    assert w[0] == 1 | 4 << 8 | 3 << 24, hex(w[0])
    assert w[1] == 0x7000
    assert w[2:6] == (64, 66, 64, 128)
    assert [x & 0xFFFFFFFF for x in w[7:11]] == [64, 34, 1, 1]
    assert [x >> 32 for x in w[7:11]] == [1, 1, 1, 1]
    assert w[12:15] == (128, 8448, 540672)
    for swizzle, mode in ((0, 0), (32, 1), (64, 2)):
        m2 = TensorMap(0x7000, 2, (16, 5), (32,), (16, 3), swizzle)
        w = struct.unpack("<16Q", m2.cuda_bytes())
        assert (w[0] >> 24) & 0xFF == mode and w[0] & 0xFF == 1 and (w[0] >> 8) & 0xFF == 2
    assert struct.unpack("<16Q", TensorMap(0x7000, 4, (4,), (), (4,)).cuda_bytes())[0] & 0xFF == 2
    for l2, mode in ((64, 1), (128, 2), (256, 3)):  # CU_TENSOR_MAP_L2_PROMOTION_L2_<l2>B
        m2 = TensorMap(0x7000, 2, (16, 5), (32,), (16, 3), 32, l2)
        w = struct.unpack("<16Q", m2.cuda_bytes())
        assert w[0] == 1 | 2 << 8 | 1 << 24 | mode << 32, hex(w[0])
    class Device:
        type = "cuda"
    arg = m.argument(Device())
    assert isinstance(arg, d.Bytes) and arg.nbytes == 128 and arg.value == blob
    """,
    )


def test_fake_old_driver_without_tensor_maps_says_so(fake_libcuda):
    run_with(
        fake_libcuda["old"],
        """
    from spio.cuda.tensor_map import TensorMap
    with pytest.raises(d.CudaDriverError, match="no cuTensorMapEncodeTiled.*CUDA 12.0"):
        TensorMap(0x7000, 2, (16, 5), (32,), (16, 3)).cuda_bytes()
    """,
    )


def test_fake_driver_version_minor_is_read_from_its_tens(fake_libcuda):
    """cuDriverGetVersion encodes 1000 * major + 10 * minor: 12040 is CUDA 12.4, not 12.40."""
    run_with(
        fake_libcuda["new"],
        """
    for major, minor in ((12, 4), (12, 8), (11, 0)):
        ctypes.c_int.in_dll(fake, "version").value = 1000 * major + 10 * minor
        assert d.driver_version() == (major, minor)
    """,
    )


def test_fake_driver_negative_device_ordinal_is_a_value_error(fake_libcuda):
    """A negative ordinal is refused like one past the last device, with the valid range, before
    the driver is asked for it (cuDeviceGet would answer an opaque CUDA_ERROR_INVALID_DEVICE)."""
    run_with(
        fake_libcuda["new"],
        """
    for call in (d.device_attributes, d.retain_primary_context, lambda o: d.Module.load(CUBIN, o)):
        with pytest.raises(ValueError, match=r"ordinal must be in 0\\.\\.1, got -1"):
            call(-1)
    assert g("refs0") == g("refs1") == 0
    """,
    )


def test_fake_driver_each_device_attribute_reads_its_own_attribute(fake_libcuda):
    """Every key of device_attributes holds what the driver reports for the matching
    CU_DEVICE_ATTRIBUTE (the numbers are cuda.h's), asked of the fake directly."""
    run_with(
        fake_libcuda["new"],
        """
    numbers = {
        "max_threads_per_block": 1, "max_shared_memory_per_block": 8, "warp_size": 10,
        "clock_khz": 13, "sm_count": 16, "memory_bus_width_bits": 37, "l2_cache_bytes": 38,
        "max_threads_per_sm": 39, "max_shared_memory_per_sm": 81, "max_registers_per_sm": 82,
        "max_shared_memory_per_block_optin": 97, "max_blocks_per_sm": 106,
    }
    for ordinal in (0, 1):
        attrs = d.device_attributes(ordinal)
        for key, number in numbers.items():
            value = ctypes.c_int()
            assert fake.cuDeviceGetAttribute(ctypes.byref(value), number, ordinal) == 0
            assert attrs[key] == value.value, (ordinal, key, attrs[key], value.value)
        total = ctypes.c_size_t()
        assert fake.cuDeviceTotalMem_v2(ctypes.byref(total), ordinal) == 0
        assert attrs["total_memory_bytes"] == total.value
    assert len({attrs[key] for key in numbers}) == len(numbers)  # a swapped key shows
    """,
    )


def test_fake_driver_load_without_a_current_context_uses_device_0(fake_libcuda):
    """With no device given and no context current on the thread (a fresh thread, or before
    PyTorch touched CUDA), Module.load uses device 0 rather than asking cuCtxGetDevice, which
    fails without a context."""
    run_with(
        fake_libcuda["new"],
        """
    d.init()
    assert current_ctx() == 0
    m = d.Module.load(CUBIN)
    assert m.device == 0 and m.context is d.retain_primary_context(0)
    assert current_ctx() == 0 and g("depth") == 0
    """,
    )


def test_fake_driver_synchronize_restores_the_callers_context(fake_libcuda):
    """synchronize() pushes its context when another (or none) is current and pops it again, also
    when cuCtxSynchronize fails; that failure (an earlier kernel's fault) is raised, not lost."""
    run_with(
        fake_libcuda["new"],
        """
    ctx0 = d.retain_primary_context(0)
    ctx0.synchronize()
    assert current_ctx() == 0 and g("depth") == 0
    with d.retain_primary_context(1) as ctx1:
        ctx0.synchronize()
        assert current_ctx() == ctx1.handle and g("depth") == 1
    ctypes.c_int.in_dll(fake, "fail_sync").value = 700
    with pytest.raises(d.CudaError) as info:
        ctx0.synchronize()
    assert (info.value.code, info.value.name, info.value.call) == (
        700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuCtxSynchronize")
    assert current_ctx() == 0 and g("depth") == 0
    """,
    )


def test_fake_driver_parameter_info_error_leaves_arguments_unchecked(fake_libcuda):
    """Only CUDA_ERROR_INVALID_VALUE ends cuFuncGetParamInfo's list; any other error (say
    CUDA_ERROR_NOT_SUPPORTED) means the sizes are unknown, and launches go unchecked as on an old
    driver, instead of the kernel seeming to take no arguments."""
    run_with(
        fake_libcuda["new"],
        """
    ctypes.c_int.in_dll(fake, "fail_param_info").value = 801
    f = d.Module.load(CUBIN, 0).get_function("write_pattern")
    assert f.param_sizes is None
    f.launch(1, 1, [Tensor(0x2000), 6, 1.25])
    params = bytes((ctypes.c_ubyte * 16).in_dll(fake, "last_params"))
    assert params == struct.pack("<Qif", 0x2000, 6, 1.25)
    assert g("launches") == 1 and g("depth") == 0
    """,
    )


def test_fake_driver_dynamic_shared_memory_up_to_the_exact_limit(fake_libcuda):
    """A kernel may opt in to exactly the device's opt-in limit minus its static shared memory, and
    a refusal by cuFuncSetAttribute is raised as a CudaError rather than passed over."""
    run_with(
        fake_libcuda["new"],
        """
    f = d.Module.load(CUBIN, 0).get_function("big_smem")
    optin = d.device_attributes(0)["max_shared_memory_per_block_optin"]
    most = optin - f.attributes()["static_shared_bytes"]
    f.set_max_dynamic_shared_memory(most)
    assert f.attributes()["max_dynamic_shared_bytes"] == most
    f.launch(1, 128, [Tensor(8)], shared_mem_bytes=most)
    assert ctypes.c_uint.in_dll(fake, "last_smem").value == most
    ctypes.c_int.in_dll(fake, "fail_set_attribute").value = 1
    with pytest.raises(d.CudaError) as info:
        f.set_max_dynamic_shared_memory(1000)
    assert info.value.call == "cuFuncSetAttribute" and "1000 bytes" in str(info.value)
    assert f.attributes()["max_dynamic_shared_bytes"] == most and g("depth") == 0
    """,
    )


@pytest.mark.parametrize("variant", ["new", "old"])
def test_fake_driver_launch_with_a_failed_push_raises(fake_libcuda, variant):
    """A launch whose context cannot be made current raises (naming cuCtxGetCurrent or
    cuCtxPushCurrent) once the parameter sizes are known or cannot be known, when the push in
    launch itself is the first call to fail: the kernel did not run, so silence would lose it."""
    run_with(
        fake_libcuda[variant],
        """
    f = d.Module.load(CUBIN, 0).get_function("write_pattern")
    f.param_sizes  # queried now, so the launch below makes no other driver call first
    for switch, code, call in (("fail_get_current", 4, "cuCtxGetCurrent"),
                               ("fail_push", 201, "cuCtxPushCurrent")):
        ctypes.c_int.in_dll(fake, switch).value = code
        with pytest.raises(d.CudaError) as info:
            f.launch(1, 32, (Tensor(64), 1, 2.0))
        assert (info.value.code, info.value.call) == (code, call)
        ctypes.c_int.in_dll(fake, switch).value = 0
    assert g("launches") == 0 and g("depth") == 0
    f.launch(1, 32, (Tensor(64), 1, 2.0))
    assert g("launches") == 1 and g("depth") == 0
    """,
    )


# --------------------------------------------------------------------------------------------------
# A real GPU

KERNELS = r"""
extern "C" __global__ void write_pattern(float* out, int n, int scale, float offset) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = float(i * scale) + offset;
}

extern "C" __global__ void reverse_in_shared(float* out, int n) {
    extern __shared__ float buffer[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = float(i);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buffer[n - 1 - i];
}
"""


@pytest.fixture(scope="module")
def gpu_module():
    import torch

    from spio.compiler import compile_cubin

    torch.cuda.init()
    arch = driver.device_attributes(torch.cuda.current_device())["arch"]
    return driver.Module.load(compile_cubin(KERNELS, arch).cubin, torch.cuda.current_device())


@pytest.mark.cuda
def test_gpu_device_attributes_match_torch():
    import torch

    props = torch.cuda.get_device_properties(0)
    attrs = driver.device_attributes(0)
    assert driver.device_count() == torch.cuda.device_count()
    assert attrs["name"] == props.name
    assert attrs["compute_capability"] == (props.major, props.minor)
    assert attrs["sm_count"] == props.multi_processor_count
    assert attrs["total_memory_bytes"] == props.total_memory
    assert attrs["warp_size"] == 32 and attrs["max_threads_per_block"] == 1024
    assert attrs["max_shared_memory_per_block_optin"] >= attrs["max_shared_memory_per_block"]
    assert attrs["l2_cache_bytes"] > 1 << 20
    assert driver.driver_version() >= (12, 0)


@pytest.mark.cuda
def test_gpu_launch_writes_pattern(gpu_module):
    import torch

    n = 10_000
    out = torch.full((n,), float("nan"), device="cuda")
    f = gpu_module.get_function("write_pattern")
    assert f.param_sizes == (8, 4, 4, 4)
    f.launch(
        (n + 255) // 256, 256, (out, n, 3, 0.5), stream=torch.cuda.current_stream().cuda_stream
    )
    expected = torch.arange(n, device="cuda", dtype=torch.float32) * 3 + 0.5
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.cuda
def test_gpu_launch_from_a_thread_without_a_context(gpu_module):
    import torch

    out = torch.zeros(64, device="cuda")
    torch.cuda.synchronize()
    f = gpu_module.get_function("write_pattern")
    errors = []

    def work():
        try:
            f.launch(1, 64, (out, 64, 1, 1.0))
            gpu_module.context.synchronize()
        except Exception as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    torch.testing.assert_close(out.cpu(), torch.arange(64, dtype=torch.float32) + 1)


@pytest.mark.cuda
def test_gpu_dynamic_shared_memory_opt_in(gpu_module):
    import torch

    f = gpu_module.get_function("reverse_in_shared")
    optin = driver.device_attributes(gpu_module.device)["max_shared_memory_per_block_optin"]
    nbytes = optin - f.attributes()["static_shared_bytes"]
    n = nbytes // 4
    out = torch.zeros(n, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    if nbytes > 48 * 1024:
        with pytest.raises(driver.CudaError, match="cuLaunchKernel"):
            f.launch(1, 256, (out, n), shared_mem_bytes=nbytes, stream=stream)
    f.set_max_dynamic_shared_memory(nbytes)
    assert f.attributes()["max_dynamic_shared_bytes"] == nbytes
    f.launch(1, 256, (out, n), shared_mem_bytes=nbytes, stream=stream)
    expected = torch.arange(n - 1, -1, -1, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="at most"):
        f.set_max_dynamic_shared_memory(nbytes + 1)


@pytest.mark.cuda
def test_gpu_unknown_function_and_bad_image(gpu_module):
    with pytest.raises(driver.CudaError, match="no kernel named 'not_a_kernel'") as info:
        gpu_module.get_function("not_a_kernel")
    assert info.value.name == "CUDA_ERROR_NOT_FOUND"
    with pytest.raises(driver.CudaError, match="cuModuleLoadData failed"):
        driver.Module.load(b"\x7fELF but not really a cubin", gpu_module.device)


@pytest.mark.cuda
def test_gpu_primary_context_is_torchs():
    import torch

    torch.zeros(1, device="cuda")  # torch makes its primary context current on this thread
    libcuda = ctypes.CDLL("libcuda.so.1")
    current = ctypes.c_void_p()
    assert libcuda.cuCtxGetCurrent(ctypes.byref(current)) == 0
    assert driver.retain_primary_context(torch.cuda.current_device()).handle == current.value


@pytest.mark.cuda
def test_gpu_spio_loads_before_torch_touches_cuda():
    """spio's first load retains the primary context before PyTorch has initialised CUDA in the
    process; PyTorch then uses that same context, and a launch into its tensor is right."""
    proc = _run_python(
        """
        import ctypes, os
        from spio.compiler import compile_cubin
        from spio.cuda import driver

        arch = driver.device_attributes(0)["arch"]
        module = driver.Module.load(compile_cubin(os.environ["SPIO_TEST_KERNELS"], arch).cubin, 0)
        import torch

        out = torch.full((1000,), float("nan"), device="cuda:0")
        current = ctypes.c_void_p()
        assert ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent(ctypes.byref(current)) == 0
        assert current.value == module.context.handle, (current.value, module.context.handle)
        stream = torch.cuda.current_stream().cuda_stream
        module.get_function("write_pattern").launch(4, 256, (out, 1000, 3, 0.5), stream=stream)
        expected = torch.arange(1000, device="cuda:0", dtype=torch.float32) * 3 + 0.5
        assert torch.equal(out, expected)
        print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


_EXIT_AFTER = {
    # The driver alone: nothing else retains the primary context, so it is destroyed with its
    # last release (Module is unloaded before that: no_gc_clear).
    "driver": """
        import os
        from spio.compiler import compile_cubin
        from spio.cuda import driver

        arch = driver.device_attributes(0)["arch"]
        module = driver.Module.load(compile_cubin(os.environ["SPIO_TEST_KERNELS"], arch).cubin, 0)
        module.get_function("write_pattern").launch(1, 32, (driver.Pointer(0), 0, 1, 0.0))
        module.context.synchronize()
        print("ok")
        """,
    # A spio layer's forward and backward through PyTorch, left for exit to clean up.
    "layer": """
        import torch, spio

        conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=2)
        layer = spio.transform(conv).cuda().half().to(memory_format=torch.channels_last)
        x = torch.randn(2, 16, 8, 8, device="cuda", dtype=torch.half, requires_grad=True)
        layer(x.to(memory_format=torch.channels_last)).float().sum().backward()
        torch.cuda.synchronize()
        print("ok")
        """,
}


@pytest.mark.cuda
@pytest.mark.parametrize("loading", ["LAZY", "EAGER"])
@pytest.mark.parametrize("what", sorted(_EXIT_AFTER))
def test_gpu_process_exits_cleanly_with_modules_loaded(what, loading):
    """Modules, functions and contexts still alive at interpreter exit are freed without an
    error, a message or a crash, with or without PyTorch holding the context."""
    proc = _run_python(_EXIT_AFTER[what], CUDA_MODULE_LOADING=loading)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    for sign in ("Exception ignored", "CUDA_ERROR", "Traceback", "Segmentation"):
        assert sign not in proc.stderr, proc.stderr


def test_info_lists_the_fake_gpus_and_the_driver_cuda_version(fake_libcuda, tmp_path):
    """`python -m spio info` against the fake driver (two GPUs, CUDA 13.0): a GPU row and a
    driver row; the NVRTC found here is not newer than CUDA 13, so nothing is marked broken."""
    env = {"SPIO_LIBCUDA": str(fake_libcuda["new"]), "SPIO_CACHE_DIR": str(tmp_path)}
    proc = run_spio("info", env=env)
    rows = dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())
    assert rows["GPU"].startswith("cuda:0 Fake GPU 0 (sm_90, 132 SMs); cuda:1 Fake GPU 1"), rows
    assert rows["driver"] == "CUDA 13.0", rows
    assert proc.returncode == 0, proc.stdout + proc.stderr
