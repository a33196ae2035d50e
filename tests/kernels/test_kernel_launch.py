"""Kernel.launch on a CUDA device, against the fake libcuda of the driver tests: the module loads
into the right device's primary context, shared memory beyond 48 KiB is opted into, None becomes a
null pointer, and the launch goes to PyTorch's current stream."""

import pytest

# Skip here when the extension is not built: importing test_driver would fail at its own skip.
pytest.importorskip("spio.cuda.driver", reason="build with setup.py build_ext --inplace")

from tests.cuda.test_driver import fake_libcuda, run_with  # noqa: E402, F401  (fixture)

SETUP = """
import torch
from spio.compiler import CompileResult
from spio.kernels import kernel as K
K.Kernel.compile = lambda self, arch: CompileResult(cubin=CUBIN, arch=arch, cached=True)
K.current_stream = lambda ordinal: 0x5000 + ordinal
def make(entry, smem):
    return K.Kernel(name=f"test_{entry}", source_file="conv2d_gw8.cu", entry=entry, headers=(),
                    grid=(3, 1, 1), block=(64, 1, 1), shared_mem_bytes=smem)
"""


def test_launch_on_a_second_device(fake_libcuda):  # noqa: F811
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
kernel = make("write_pattern", 0)
kernel.launch([Tensor(0x1000), 7, 9], torch.device("cuda", 1))
assert g("launches") > 0
assert list((ctypes.c_uint * 6).in_dll(fake, "last_dims")) == [3, 1, 1, 64, 1, 1]
assert ctypes.c_ulonglong.in_dll(fake, "last_stream").value == 0x5001
assert g("refs1") == 1 and g("refs0") == 0   # device 1's primary context, retained once
params = bytes((ctypes.c_ubyte * 16).in_dll(fake, "last_params"))
assert struct.unpack("<Qii", params) == (0x1000, 7, 9)
again = g("launches")
kernel.launch([Tensor(0x2000), 1, 2], torch.device("cuda", 1))  # loaded once, launched twice
assert g("launches") > again and g("refs1") == 1
""",
    )


def test_one_kernel_launched_on_two_devices_loads_into_each(fake_libcuda):  # noqa: F811
    """A kernel's loaded module is kept per device: after a launch on device 0, a launch on
    device 1 loads the kernel into device 1's context (a module of another context would not
    run there), and later launches on either reuse that device's own module."""
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
kernel = make("write_pattern", 0)
kernel.launch([Tensor(0x1000), 1, 2], torch.device("cuda", 0))
assert g("refs0") == 1 and g("refs1") == 0
kernel.launch([Tensor(0x1000), 3, 4], torch.device("cuda", 1))
assert g("refs0") == 1 and g("refs1") == 1
assert ctypes.c_ulonglong.in_dll(fake, "last_stream").value == 0x5001
assert sorted(K._loaded) == [("test_write_pattern", 0), ("test_write_pattern", 1)]
assert K._loaded[("test_write_pattern", 1)].ordinal == 1
kernel.launch([Tensor(0x1000), 5, 6], torch.device("cuda", 0))
assert ctypes.c_ulonglong.in_dll(fake, "last_stream").value == 0x5000
assert g("refs0") == 1 and g("refs1") == 1 and len(K._loaded) == 2
""",
    )


def test_a_bare_cuda_device_means_pytorchs_current_device(fake_libcuda):  # noqa: F811
    """torch.device("cuda") is PyTorch's current device, as PyTorch reads it: after
    torch.cuda.set_device(1) the launch, and the device a config is picked for, are device 1's
    (they were device 0's)."""
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
from spio.kernels import perf_model
torch.cuda.current_device = lambda: 1
assert K.cuda_ordinal(torch.device("cuda")) == 1 and K.cuda_ordinal(torch.device("cuda", 0)) == 0
make("write_pattern", 0).launch([Tensor(0x1000), 7, 9], torch.device("cuda"))
assert ctypes.c_ulonglong.in_dll(fake, "last_stream").value == 0x5001
assert g("refs1") == 1 and g("refs0") == 0
asked = []
perf_model._cuda_identity = lambda ordinal: asked.append(ordinal)
perf_model.device_identity(torch.device("cuda"))
assert asked == [1], asked
""",
    )


def test_large_shared_memory_and_null_pointer(fake_libcuda):  # noqa: F811
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
kernel = make("big_smem", 100 * 1024)
kernel.launch([None], torch.device("cuda", 0))
assert ctypes.c_uint.in_dll(fake, "last_smem").value == 100 * 1024
params = bytes((ctypes.c_ubyte * 8).in_dll(fake, "last_params"))
assert struct.unpack("<Q", params) == (0,)
assert ctypes.c_ulonglong.in_dll(fake, "last_stream").value == 0x5000
""",
    )


def test_dynamic_shared_memory_beside_static_is_opted_into(fake_libcuda):  # noqa: F811
    """The default dynamic limit is 48 KiB less the function's static shared memory (1 KiB for
    the fake's big_smem): 47.5 KiB of dynamic memory needs the opt-in, which had been made only
    above 48 KiB, so the launch failed."""
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
kernel = make("big_smem", 48 * 1024 - 512)
kernel.launch([None], torch.device("cuda", 0))
assert ctypes.c_uint.in_dll(fake, "last_smem").value == 48 * 1024 - 512
""",
    )


def test_more_shared_memory_than_the_gpu_allows_is_named(fake_libcuda):  # noqa: F811
    """A config of one's own (make_kernel takes any) past the GPU's opt-in limit: a clear error
    before anything is compiled or loaded, not a driver error at launch."""
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
kernel = make("big_smem", 240 * 1024)
try:
    kernel.launch([None], torch.device("cuda", 0))
except ValueError as error:
    assert "needs 245760 bytes of shared memory per block" in str(error), error
    assert "allows 232448" in str(error), error
else:
    raise AssertionError("launched")
assert g("launches") == 0
""",
    )


def test_kernels_of_one_name_share_their_module_and_launch_their_own_grid(fake_libcuda):  # noqa: F811
    """The name stands for the code (a layer's kernel has one name and a grid per batch size):
    one module per name and device, each launch with its own kernel's grid."""
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
import dataclasses
small = make("write_pattern", 0)
large = dataclasses.replace(small, grid=(40, 1, 1))
small.launch([Tensor(0x1000), 1, 2], torch.device("cuda", 0))
large.launch([Tensor(0x1000), 1, 2], torch.device("cuda", 0))
assert list((ctypes.c_uint * 6).in_dll(fake, "last_dims")) == [40, 1, 1, 64, 1, 1]
small.launch([Tensor(0x1000), 1, 2], torch.device("cuda", 0))
assert list((ctypes.c_uint * 6).in_dll(fake, "last_dims")) == [3, 1, 1, 64, 1, 1]
assert list(K._loaded) == [("test_write_pattern", 0)]
""",
    )


def test_kernel_hashes_by_its_name():
    """A Kernel's hash is its name's (the generated one would rehash the headers' text on every
    use as a key), and equality still compares every field."""
    from spio.kernels.kernel import Kernel

    def make(headers, name="k1"):
        return Kernel(name=name, source_file="conv2d_gw8.cu", entry="e", headers=headers,
                      grid=(1, 1, 1), block=(32, 1, 1), shared_mem_bytes=0)  # fmt: skip

    a, b = make((("h.h", "x" * 100_000),)), make((("h.h", "x" * 100_000),))
    assert a == b and hash(a) == hash(b) == hash("k1")
    assert a != make((("h.h", "y"),)) and len({a, b, make((), "k2")}) == 2


def test_kernels_of_one_name_hold_one_copy_of_their_headers(monkeypatch):
    """A layer's kernel is made again for every batch size it meets (the grid differs), its
    generated headers (tens of KB) equal to the last ones: each Kernel of that name then holds
    a live one's headers, not a copy of its own. Headers that differ are kept as they are; and
    nothing keeps the headers once no kernel of the name is left (autotuning makes and drops
    many candidates)."""
    import gc
    import weakref

    from spio.kernels import kernel as K

    monkeypatch.setattr(K, "_live_by_name", weakref.WeakValueDictionary())

    def make(text, name="shared_k"):
        return K.Kernel(name=name, source_file="conv2d_gw8.cu", entry="e",
                        headers=(("h.h", "".join(["x", text])),), grid=(1, 1, 1),
                        block=(32, 1, 1), shared_mem_bytes=0)  # fmt: skip

    first, again = make("x" * 10_000), make("x" * 10_000)
    assert again.headers is first.headers and again == first
    other = make("y")
    assert other.headers == (("h.h", "xy"),) and other.headers is not first.headers
    assert make("x" * 10_000).headers is first.headers
    dropped = [make("z", name=f"dropped_{i}") for i in range(3)]
    assert len(K._live_by_name) == 4
    del dropped
    gc.collect()
    assert set(K._live_by_name) == {"shared_k"}


def test_a_kernels_repr_leaves_out_its_headers():
    """A list of kernels (spio.precompile's result) printed in a notebook had been tens of KB
    of generated C++ per kernel."""
    from spio.kernels.kernel import Kernel

    a = Kernel(name="k1", source_file="conv2d_gw8.cu", entry="e", headers=(("h.h", "x" * 100_000),),
               grid=(1, 1, 1), block=(32, 1, 1), shared_mem_bytes=0)  # fmt: skip
    assert "x" * 100 not in repr(a) and "name='k1'" in repr(a) and len(repr(a)) < 300


@pytest.mark.cuda
def test_current_stream_is_torchs():
    import torch

    from spio.kernels import kernel as K

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert K.current_stream(torch.cuda.current_device()) == s.cuda_stream
    assert K.current_stream(0) == torch.cuda.current_stream(0).cuda_stream


def test_each_kernel_symbol_names_its_layer_and_config():
    """Profiler traces show a kernel's symbol: every FProp, DGrad and WGrad kernel is compiled
    as spio_<its name> (layer and config), the symbol ptxas reports (and the one the emulator
    looks up, in every emulated kernel test), so launches of different layers or configs are
    told apart; a name that is no C identifier is refused."""
    from spio.kernels import Conv2dGw8Params
    from spio.kernels.families import FAMILIES
    from spio.kernels.kernel import entry_symbol

    params = Conv2dGw8Params(n=2, c=16, h=7, w=6, has_bias=True)
    entries = set()
    for family in FAMILIES.values():
        for config in family.configs(params)[:2]:
            kernel = family.make_kernel(params, config)
            assert kernel.entry == f"spio_{kernel.name}"
            assert list(kernel.compile("sm_90").resources) == [kernel.entry]
            entries.add(kernel.entry)
    assert len(entries) == 2 * len(FAMILIES)
    with pytest.raises(ValueError, match="C identifier"):
        entry_symbol("conv2d-gw8")


def test_a_build_at_first_launch_is_counted(fake_libcuda):  # noqa: F811
    """A cubin compiled for a launch (not found in the cache) counts toward the one notice
    that points at spio.precompile; cached ones do not."""
    run_with(
        fake_libcuda["new"],
        SETUP
        + """
import logging
notices = []
class Notices(logging.Handler):
    def emit(self, record):
        notices.append(record.getMessage())
logging.getLogger("spio").addHandler(Notices())
make("write_pattern", 0).launch([Tensor(0x1000), 7, 9], torch.device("cuda", 0))
assert notices == []
K.Kernel.compile = lambda self, arch: CompileResult(cubin=CUBIN, arch=arch, seconds=11.0)
second = K.Kernel(name="test_second", source_file="conv2d_gw8.cu", entry="write_pattern",
                  headers=(), grid=(3, 1, 1), block=(64, 1, 1), shared_mem_bytes=0)
second.launch([Tensor(0x1000), 7, 9], torch.device("cuda", 0))
assert len(notices) == 1 and "spent 11 s building kernels at their first launch" in notices[0]
""",
    )


def test_a_cubin_the_driver_refuses_says_what_to_do(fake_libcuda):  # noqa: F811
    """The fake driver refuses images that are not its FAKECUBIN (CUDA_ERROR_INVALID_IMAGE) and
    says it supports CUDA 13.0. With an NVRTC newer than that the error says the driver is the
    older one and how to fix it; otherwise it names the kernel, arch and NVRTC, and `spio info`."""
    run_with(
        fake_libcuda["new"],
        SETUP.replace("cubin=CUBIN", "cubin=b'NOT A CUBIN'")
        + """
from spio.cuda import nvrtc
def refused(nvrtc_version):
    nvrtc.version = lambda: nvrtc_version
    try:
        make(f"refused_{nvrtc_version[1]}", 0).launch([None], torch.device("cuda", 0))
    except d.CudaError as error:
        assert error.name == "CUDA_ERROR_INVALID_IMAGE", error
        return str(error)
    raise AssertionError("loaded")
newer = refused((13, 1))
assert "kernel test_refused_1 (sm_90, built by NVRTC 13.1) could not be loaded by a driver " \\
    "for CUDA 13.0, older than the NVRTC that built it. Update the NVIDIA driver" in newer, newer
assert "NVRTC of CUDA 13.0 or earlier (SPIO_NVRTC" in newer, newer
older = refused((12, 9))
assert "kernel test_refused_9 (sm_90, built by NVRTC 12.9) could not be loaded by the " \\
    "driver (CUDA 13.0); `python -m spio info`" in older, older
assert older.startswith("cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE"), older
assert g("launches") == 0
""",
    )


def test_a_bare_cuda_device_without_cuda_says_why(monkeypatch):
    """get_kernel(params, "cuda") on a build of torch without CUDA raised torch's bare
    AssertionError ("Torch not compiled with CUDA enabled"); now spio's own error, as for a
    numbered device: the driver's where it cannot be loaded."""
    import torch

    from spio.cuda import driver
    from spio.kernels import kernel as K

    def fails():
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "current_device", fails)

    def no_driver():
        raise driver.CudaDriverError("No NVIDIA driver found")

    monkeypatch.setattr(driver, "device_count", no_driver)
    with pytest.raises(driver.CudaDriverError, match="No NVIDIA driver found"):
        K.cuda_ordinal(torch.device("cuda"))
    monkeypatch.setattr(driver, "device_count", lambda: 1)
    with pytest.raises(RuntimeError, match="no CUDA device for cuda: torch has none \\(Torch not"):
        K.cuda_ordinal(torch.device("cuda"))
    # Where torch has CUDA, its own error of another trouble is left as it is.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(AssertionError, match="Torch not compiled"):
        K.cuda_ordinal(torch.device("cuda"))
