"""Bad launches fail with a clear error before anything runs; module API and integration hooks."""

import logging
import os
import signal
import subprocess
import sys

import pytest
import torch

import spio.emulator as emulator
from spio.emulator.build import EmulatorBuildError, clipped, kernel_names, rewrite_extern_shared
from spio.functional.checks import uses_kernels
from tests.conftest import REPO


@pytest.fixture
def add_fn(hazards):
    return hazards.get_function("shifted_write")


@pytest.mark.parametrize(
    "args,error,match",
    [
        ((torch.zeros(4), torch.zeros(4), 4), TypeError, "takes 4 arguments"),
        ((torch.zeros(4), torch.zeros(4), 4, 0, 1), TypeError, "takes 4 arguments"),
        ((1.5, torch.zeros(4), 4, 0), TypeError, "argument 0 .* pointer"),
        ((torch.zeros(4), torch.zeros(4), 4.0, 0), TypeError, "argument 2 .* integer"),
        ((torch.zeros(4), torch.zeros(4), torch.tensor(4), 0), TypeError, "argument 2"),
        ((torch.zeros(4), torch.zeros(4), 2**31, 0), ValueError, "argument 2 .*2147483647"),
    ],
)
def test_bad_arguments(add_fn, args, error, match):
    with pytest.raises(error, match=match):
        add_fn.launch(1, 4, args)


@pytest.mark.parametrize(
    "grid,block,shared,match",
    [
        (0, 32, 0, r"grid\[0\] must be in 1"),
        ((1, 0), 32, 0, r"grid\[1\] must be in 1"),
        (1, 1025, 0, r"block\[0\] must be in 1..1024"),
        (1, (32, 32, 2), 0, "at most 1024 threads, got 2048"),
        (1, (1, 1, 65), 0, r"block\[2\] must be in 1..64"),
        (1, 32, 227 * 1024 + 1, "exceed the 232448-byte limit"),
        (1, 32, -1, "shared_mem_bytes must be"),
        ((1, 2, 3, 4), 32, 0, "1-3 ints"),
        (2**31, 32, 0, r"grid\[0\] must be in 1..2147483647, got 2147483648"),
        ((1, 65536), 32, 0, r"grid\[1\] must be in 1..65535, got 65536"),
        ((1, 1, 65536), 32, 0, r"grid\[2\] must be in 1..65535, got 65536"),
    ],
)
def test_bad_launch_configuration(add_fn, grid, block, shared, match):
    out = torch.full((4,), 3.0)
    with pytest.raises(ValueError, match=match):
        add_fn.launch(grid, block, (out, torch.zeros(4), 4, 0), shared_mem_bytes=shared)
    assert torch.equal(out, torch.full((4,), 3.0))  # nothing ran


@pytest.mark.parametrize(
    "grid,block,match",
    [
        (1.5, 32, r"grid must be an int or 1-3 ints, got 1\.5"),
        (1, None, "block must be an int or 1-3 ints, got None"),
        ((1.0, 2), 32, r"grid must be an int or 1-3 ints, got \(1\.0, 2\)"),
        (1, (32, True), r"block must be an int or 1-3 ints, got \(32, True\)"),
    ],
)
def test_a_launch_configuration_of_the_wrong_type_is_a_type_error(add_fn, grid, block, match):
    """As the driver's launch has it (tests/cuda/test_driver.py): a grid or block that is not an
    int or ints is a TypeError. A float or None had become a ValueError here, and a float or a
    bool among ints had been one."""
    out = torch.full((4,), 3.0)
    with pytest.raises(TypeError, match=match):
        add_fn.launch(grid, block, (out, torch.zeros(4), 4, 0))
    assert torch.equal(out, torch.full((4,), 3.0))  # nothing ran


@pytest.mark.parametrize("shared", [96.0, None, True])
def test_shared_memory_of_the_wrong_type_is_a_type_error(add_fn, shared):
    """As the driver's launch has it: a float or None was a ValueError here, and True was
    taken as 1 byte."""
    out = torch.full((4,), 3.0)
    with pytest.raises(TypeError, match=f"shared_mem_bytes must be an int, got {shared!r}"):
        add_fn.launch(1, 32, (out, torch.zeros(4), 4, 0), shared_mem_bytes=shared)
    assert torch.equal(out, torch.full((4,), 3.0))  # nothing ran


def test_unknown_kernel(hazards):
    with pytest.raises(KeyError, match="no kernel 'nope'.*neighbour"):
        hazards.get_function("nope")


def test_compile_error_carries_compiler_output():
    src = 'extern "C" __global__ void broken(float *x) { x[0] = undefined_name; }'
    with pytest.raises(EmulatorBuildError, match="undefined_name"):
        emulator.load_module(src, name="emu_test_broken")


def test_compile_error_is_reported_whatever_the_locale_python_runs_under(tmp_path):
    """g++ echoes the failing source line, here with a UTF-8 comment on it. Its output was
    decoded with the locale's encoding, so where that was ASCII (a process whose locale a
    library reset, as happened under torch 2.6's tests) a compile error became a
    UnicodeDecodeError that hid g++'s message. Run in a process whose locale is plain C, with
    neither locale coercion nor UTF-8 mode, so that Python's own encoding is ASCII."""
    code = """
import locale
from spio import emulator
from spio.emulator.build import EmulatorBuildError
assert locale.getpreferredencoding(False) != "UTF-8", locale.getpreferredencoding(False)
src = 'extern "C" __global__ void broken(float *x) { x[0] = undefined_name; }  // 8\\u00d78 taps'
try:
    emulator.load_module(src, name="emu_test_broken_utf8")
except EmulatorBuildError as error:
    assert "undefined_name" in str(error) and "8\\u00d78 taps" in str(error), str(error)
    print("reported")
"""
    env = {**os.environ, "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "LC_ALL": "C"}
    env["SPIO_CACHE_DIR"] = str(tmp_path)  # a fresh cache: the build really runs g++
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=env, cwd=REPO, timeout=600
    )
    assert run.returncode == 0 and run.stdout.strip() == b"reported", run.stderr.decode(
        errors="replace"
    )


def test_source_without_kernels():
    with pytest.raises(ValueError, match='no `extern "C" __global__'):
        emulator.load_module("__device__ int f() { return 1; }")


def test_kernel_name_scan():
    src = """
    extern "C" __global__ void a(int *x) {}
    extern "C" __global__ __launch_bounds__(256) void b(int *x) {}
    extern "C" __launch_bounds__(128, 2) __global__ void c(int *x) {}
    __global__ void not_extern_c(int *x) {}
    """
    assert kernel_names(src) == ["a", "b", "c"]


def test_extern_shared_rewrite():
    text = "extern __shared__ __align__(16) unsigned char smem[];"
    assert rewrite_extern_shared(text) == "SPIO_EMU_EXTERN_SHARED(unsigned char, smem);"


def test_is_enabled(monkeypatch):
    for on in ("1", "true", " Yes ", "ON"):  # as the ops read it (they ask is_enabled)
        monkeypatch.setenv("SPIO_EMULATE", on)
        assert emulator.is_enabled() and uses_kernels(torch.device("cpu"))
    for off in ("0", "false", " No ", "OFF", ""):
        monkeypatch.setenv("SPIO_EMULATE", off)
        assert not emulator.is_enabled()
    monkeypatch.delenv("SPIO_EMULATE")
    assert not emulator.is_enabled()


def test_a_bad_emulate_value_raises(monkeypatch):
    """SPIO_EMULATE=maybe had read as off: CPU tensors silently took PyTorch's convolution."""
    monkeypatch.setenv("SPIO_EMULATE", "maybe")
    match = r"^SPIO_EMULATE must be 1/true/yes/on or 0/false/no/off, got 'maybe'$"
    with pytest.raises(ValueError, match=match):
        emulator.is_enabled()
    with pytest.raises(ValueError, match=match):
        uses_kernels(torch.device("cpu"))


def test_use_ucontext_reads_the_flag_like_the_others(monkeypatch):
    """SPIO_EMU_UCONTEXT takes the on/off words of every flag (true had been ignored) and a bad
    value raises, on every CPU (maybe had been ignored)."""
    from spio.emulator.build import use_ucontext

    for on in ("1", "true", " Yes ", "ON"):
        monkeypatch.setenv("SPIO_EMU_UCONTEXT", on)
        assert use_ucontext()
    monkeypatch.setenv("SPIO_EMU_UCONTEXT", "maybe")
    with pytest.raises(ValueError, match=r"^SPIO_EMU_UCONTEXT must be .*, got 'maybe'$"):
        use_ucontext()
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    with pytest.raises(ValueError, match=r"^SPIO_EMU_UCONTEXT must be .*, got 'maybe'$"):
        use_ucontext()
    monkeypatch.setenv("SPIO_EMU_UCONTEXT", "off")
    assert use_ucontext()  # other CPUs have no assembly switch


def test_first_launch_logs_once(hazards, caplog):
    """Naming the module where the function's name does not hold it (sum_slots' entry,
    spio_sum_slots, is one symbol for every layer's build: its lines could not be told apart)."""
    fn = hazards.get_function("neighbour")
    with caplog.at_level(logging.INFO, logger="spio"):
        for _ in range(2):
            fn.launch(1, 128, (torch.zeros(128), torch.randn(128), 1))
    lines = [r.getMessage() for r in caplog.records if "emulating" in r.getMessage()]
    assert lines == ["emulating neighbour of emu_test_hazards on the CPU"]


def test_float_and_int_arguments(prims):
    x = torch.randn(96)
    out = torch.zeros(96)
    prims.get_function("dynamic_shared").launch((1,), (96, 1, 1), [out, x, 96], 384)
    torch.testing.assert_close(out, (2 * x).flip(0))


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def test_launch_leaves_no_fiber_stack_mappings_behind():
    # Each guarded fiber stack is two mappings; keeping 1024 of them per loaded library once
    # exhausted vm.max_map_count after a few dozen kernels in one process.
    source = (
        'extern "C" __global__ void fill_index(float *out) {\n'
        "    out[threadIdx.x] = float(threadIdx.x);\n"
        "}\n"
    )
    fn = emulator.load_module(source, name="mappings_probe").get_function("fill_index")
    out = torch.zeros(1024)
    before = _mappings()
    fn.launch(1, 1024, (out,))  # loads the library and runs 1024 fibers
    assert _mappings() - before < 64
    assert torch.equal(out, torch.arange(1024, dtype=torch.float32))


def test_512_kib_of_local_memory_fits_and_more_is_a_stack_overflow():
    """A GPU thread has up to 512 KiB of local memory; a fiber stack holds that much. An array
    past the stack faults in the guard below it, which the launch reports (checked or not), and
    the process goes on. In a subprocess: a fault the emulator missed would end the process."""
    code = r"""
import torch
from spio import emulator
src = '''
extern "C" __global__ void big_local(float *out, const float *in, int n) {
    float r[N];
    for (int i = 0; i < n; ++i) r[i] = in[i % 32] * i;
    float s = 0;
    for (int i = n - 1; i >= 0; --i) s += r[(i * 7) % n];
    out[threadIdx.x] = s;
}
'''
for n in (131072, 200000, 131072):  # 512 KiB, 781 KiB, then 512 KiB again
    fn = emulator.load_module(src.replace("N", str(n)), name=f"big_local_{n}")
    for check in (True, False):
        out = torch.zeros(32)
        try:
            fn.get_function("big_local").launch(1, 32, (out, torch.ones(32), n), check=check)
            print(n, check, "ok", out[0].item() == out[31].item() > 0)
        except emulator.EmulatorError as error:
            print(n, check, "error", "stack overflow of the emulated thread" in str(error))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=REPO)
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    assert run.stdout.decode().splitlines() == [
        "131072 True ok True",
        "131072 False ok True",
        "200000 True error True",
        "200000 False error True",
        "131072 True ok True",
        "131072 False ok True",
    ]


_OVERLAPPING_LIBRARIES = r'''
import contextlib, ctypes, faulthandler, sys, threading, time
import torch
from spio import emulator
from spio.emulator import module

faulthandler.enable()
if sys.argv[1] == "unlocked":  # launches no longer take turns: the runtime on its own
    module._launch_lock = contextlib.nullcontext()
libc = ctypes.CDLL(None)


def segv_handler():
    # The process's SIGSEGV handler: the first member of the struct sigaction(2) fills in.
    action = ctypes.create_string_buffer(256)
    assert libc.sigaction(11, None, action) == 0
    return ctypes.c_void_p.from_buffer(action).value


SOURCE = """
// Marks flags[mark], then waits until flags[go] or flags[go2] is set.
extern "C" __global__ void mark_and_wait(volatile int *flags, int mark, int go, int go2) {
    flags[mark] = 1;
    while (!flags[go] && !flags[go2]) {}
}
"""
# Two libraries (two sources), each with its own runtime and SIGSEGV handler.
a = emulator.load_module(SOURCE + "// a", name="overlap_a").get_function("mark_and_wait")
b = emulator.load_module(SOURCE + "// b", name="overlap_b").get_function("mark_and_wait")
flags = torch.zeros(4, dtype=torch.int32)
before = segv_handler()


def run_a():
    try:  # A's launch waits for B's to start (flags[1]), or for the main thread's word
        a.launch(1, 1, (flags, 0, 1, 3), check=False)
    finally:
        flags[2] = 1


def run_b():  # B's launch waits for A's to have returned
    b.launch(1, 1, (flags, 1, 2, 2), check=False)


thread_a, thread_b = threading.Thread(target=run_a), threading.Thread(target=run_b)
thread_a.start()
while not flags[0]:  # A's launch is running
    time.sleep(0.001)
thread_b.start()
deadline = time.monotonic() + 1
while not flags[1] and time.monotonic() < deadline:
    time.sleep(0.001)
print("overlapped", bool(flags[1]))
flags[3] = 1  # A's launch stops waiting: B's is waiting for it to end
thread_a.join()
thread_b.join()
print("handler kept", segv_handler() == before)
a.launch(1, 1, (flags, 0, 3, 3), check=False)  # A again, alone
print("faulting", flush=True)
ctypes.string_at(0)
'''


def _overlapping_libraries(mode: str) -> tuple[str, str, int]:
    """_OVERLAPPING_LIBRARIES run in a process of its own: stdout, stderr, exit status."""
    try:
        run = subprocess.run(
            [sys.executable, "-c", _OVERLAPPING_LIBRARIES, mode],
            capture_output=True,
            cwd=REPO,
            timeout=120,
        )
    except subprocess.TimeoutExpired as error:
        hung = (error.stdout or b"").decode(errors="replace")
    else:
        return run.stdout.decode(), run.stderr.decode(errors="replace"), run.returncode
    pytest.fail(f"the process hung after a segmentation fault; its output: {hung!r}")


def test_launches_of_two_libraries_from_two_threads_leave_the_segv_handler_as_it_was():
    """Each launch installs its library's SIGSEGV handler (stack overflows) and puts back the one
    it found. Launches of two libraries overlapping in two threads (A starts, B starts, A ends, B
    ends) put back A's handler, stale; A's next launch took it for the one before, and a later
    fault chained to itself without end: the process hung instead of reaching faulthandler.
    Launches take turns process-wide now. In a subprocess: the fault ends it."""
    out, err, returncode = _overlapping_libraries("locked")
    assert "overlapped False" in out  # B's launch waited for A's
    assert "handler kept True" in out
    assert "faulting" in out
    assert "Fatal Python error: Segmentation fault" in err, err[-3000:]
    assert returncode == -signal.SIGSEGV


def test_a_launch_never_chains_the_segv_handler_to_itself():
    """The same launches overlapping (the lock taken away): A's stale handler is left installed,
    and A's next launch finds it. The runtime does not take its own handler for the one before:
    a fault then ends the process (faulthandler's handler is lost) instead of hanging it."""
    out, _, returncode = _overlapping_libraries("unlocked")
    assert "overlapped True" in out
    assert "handler kept False" in out
    assert "faulting" in out
    assert returncode == -signal.SIGSEGV


def test_checked_launch_leaves_read_only_inputs_untouched(add_fn):
    # Checked launches run on guarded copies; copying an unchanged input back would bump its
    # autograd version counter and break backward passes that saved it.
    src, dst = torch.randn(8), torch.zeros(8)
    version = src._version
    add_fn.launch(1, 8, (dst, src, 8, 0))
    assert src._version == version
    assert torch.equal(dst, src)


def test_the_compiler_command_is_part_of_the_cache_key(monkeypatch):
    """Flags or a wrapper inside $CXX build a different library, not the cached one."""
    from spio.emulator.build import build_library

    source = 'extern "C" __global__ void one(int *p) { p[0] = 1; }'
    monkeypatch.setenv("CXX", "g++")
    plain = build_library(source, name="emu_test_cxx_key", checked=False)
    monkeypatch.setenv("CXX", "g++ -DSPIO_TEST_UNUSED_FLAG=1")
    flagged = build_library(source, name="emu_test_cxx_key", checked=False)
    assert plain.path != flagged.path


def test_dense_tensors_are_those_whose_elements_fill_their_span_once():
    """Checked launches copy dense tensors between guard zones: contiguous, channels_last and
    permuted ones are dense; slices and self-overlapping views of the same size are not."""
    from spio.emulator.module import _dense

    t = torch.empty(2, 3, 4, 5)
    assert _dense(t) and _dense(t.to(memory_format=torch.channels_last))
    assert _dense(t.permute(3, 1, 0, 2)) and _dense(torch.empty(1, 1, 1))
    assert not _dense(t[:, :, :2])
    assert not _dense(torch.empty(8).as_strided((2, 2, 2), (1, 1, 5)))  # span 8, overlapping


SCALARS = r"""
extern "C" __global__ void scalars(double *out, float f, double d, bool b, signed char c,
                                   unsigned short u, long long l) {
    out[0] = f; out[1] = d; out[2] = b; out[3] = c; out[4] = u; out[5] = double(l);
}

extern "C" __global__ void address_mod_64(long long *out, const float *p) {
    out[0] = (long long)(reinterpret_cast<unsigned long long>(p) % 64);
}
"""


@pytest.fixture(scope="module")
def scalars():
    return emulator.load_module(SCALARS, name="emu_test_scalars").get_function("scalars")


def _scalar_args():
    return [torch.zeros(6, dtype=torch.float64), 1.5, 0.1, True, -128, 65535, -(2**40)]


def test_scalar_arguments_of_every_kind_reach_the_kernel(scalars):
    args = _scalar_args()
    scalars.launch(1, 1, args)
    assert args[0].tolist() == [1.5, 0.1, 1.0, -128.0, 65535.0, -1099511627776.0]


@pytest.mark.parametrize(
    "index,value,error,match",
    [
        (1, True, TypeError, r"argument 1 of kernel scalars is a float \(f4\), got bool"),
        (3, 2, ValueError, r"argument 3 of kernel scalars \(b\) must be in 0..1, got 2"),
        (4, 128, ValueError, r"argument 4 of kernel scalars \(i1\) must be in -128..127, got 128"),
        (5, 65536, ValueError, r"\(u2\) must be in 0..65535, got 65536"),
        (5, -1, ValueError, r"\(u2\) must be in 0..65535, got -1"),
    ],
)
def test_bad_scalar_arguments(scalars, index, value, error, match):
    args = _scalar_args()
    args[index] = value
    with pytest.raises(error, match=match):
        scalars.launch(1, 1, args)
    assert not args[0].any()  # nothing ran


GPU_RULES = r"""
extern "C" __global__ void f4(double *o, float v) { o[0] = v; }
extern "C" __global__ void f8(double *o, double v) { o[0] = v; }
extern "C" __global__ void b(double *o, bool v) { o[0] = v; }
extern "C" __global__ void i8(double *o, long long v) { o[0] = double(v); }
extern "C" __global__ void u4(double *o, unsigned v) { o[0] = v; }
extern "C" __global__ void i4(double *o, int v) { o[0] = v; }
"""


@pytest.mark.parametrize(
    "kernel,value,match",
    [
        ("f4", 2, r"argument 1 of kernel f4 \(f4\): a GPU launch passes an int as an int32"),
        ("f8", 0.1, r"\(f8\): a GPU launch passes a float as a float32"),
        ("b", True, r"\(b\): a GPU launch refuses a Python bool as ambiguous"),
        ("b", 1, r"\(b\): a GPU launch passes an int as an int32"),
        ("i8", 5, r"\(i8\): a GPU launch passes an int as an int32"),
        ("i4", True, r"\(i4\): a GPU launch refuses a Python bool"),
        ("u4", 2**31, r"\(u4\): a GPU launch packs an int as an int32, which 2147483648 does"),
        ("f4", 1e40, r"\(f4\): a GPU launch refuses the float 1e\+40, which does not fit in"),
    ],
)
def test_gpu_rules_refuse_what_a_gpu_launch_would_refuse_or_garble(kernel, value, match):
    """spio's kernels launch in the emulator with gpu_rules: an int for a float parameter had
    run as that number here and would reach a GPU kernel as the int's bits (1.4e-45 for 1); an
    int for a long long or bool parameter, or a bool anywhere, which the GPU launch refuses, had
    run here. Without gpu_rules the emulator takes each (its own API)."""
    module = emulator.load_module(GPU_RULES, name="emu_test_gpu_rules")
    out = torch.zeros(1, dtype=torch.float64)
    with pytest.raises(TypeError, match=match):
        module.get_function(kernel).launch(1, 1, (out, value), gpu_rules=True)
    assert not out.any()  # nothing ran
    module.get_function(kernel).launch(1, 1, (out, value))
    assert out.item() == pytest.approx(float(value) if value != 1e40 else float("inf"))


@pytest.mark.parametrize("kernel,value", [("f4", 2.5), ("i4", -7), ("u4", 2**31 - 1)])
def test_gpu_rules_take_what_a_gpu_launch_packs_as_the_parameter(kernel, value):
    module = emulator.load_module(GPU_RULES, name="emu_test_gpu_rules")
    out = torch.zeros(1, dtype=torch.float64)
    module.get_function(kernel).launch(1, 1, (out, value), gpu_rules=True)
    assert out.item() == value


def test_spio_kernels_launch_in_the_emulator_with_gpu_rules(monkeypatch):
    from spio.emulator.module import EmuFunction
    from spio.functional import conv2d_gw8

    seen = []
    launch = EmuFunction.launch

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("gpu_rules"))
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(EmuFunction, "launch", spy)
    monkeypatch.setenv("SPIO_EMULATE", "1")
    x = torch.randn(1, 8, 3, 3, dtype=torch.float16, requires_grad=True)
    w = torch.randn(8, 8, 3, 3, dtype=torch.float16, requires_grad=True)
    conv2d_gw8(x, w, padding_y=1, padding_x=1).sum().backward()  # FProp, DGrad, WGrad's two
    assert len(seen) >= 3 and all(seen), seen


def test_a_pointer_argument_must_be_a_cpu_tensor(scalars):
    args = _scalar_args()
    args[0] = torch.zeros(6, dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match="argument 0 of kernel scalars must be a CPU tensor, got"):
        scalars.launch(1, 1, args)


def test_modules_of_one_library_load_one_handle(scalars):
    """Both load one file (dlopen loads it once) whose runtime keeps a launch in globals: their
    launches must take turns, as every emulated launch does (one lock in the process)."""
    other = emulator.load_module(SCALARS, name="emu_test_scalars_again")
    assert other._load(True).handle._handle == scalars.module._load(True).handle._handle


def test_the_shared_memory_limit_counts_static_shared_memory(shared_oob):
    """shared_oob's one static array is 128 floats (512 bytes): 227 KiB less that is the most
    dynamic shared memory a launch may ask for."""
    fn = shared_oob.get_function("dynamic_index")
    x, out = torch.randn(128), torch.zeros(128)
    fn.launch(1, 128, (out, x, 0), shared_mem_bytes=232448 - 512)
    assert torch.equal(out, x)
    match = r"231937 dynamic \+ 512 static shared bytes exceed the 232448-byte limit"
    with pytest.raises(ValueError, match=match) as info:
        fn.launch(1, 128, (out, x, 0), shared_mem_bytes=232448 - 511)
    # The static bytes are the module's (every kernel's __shared__ variables), and it says so.
    assert "__shared__ variables of every kernel in module emu_test_shared_oob" in str(info.value)


def test_extern_shared_in_a_header_given_with_the_source_is_the_dynamic_buffer():
    """A header passed with the source gets the same `extern __shared__` rewrite as the source."""
    header = (
        "__device__ inline float *staged() {\n"
        "    extern __shared__ float buffer[];\n"
        "    return buffer;\n"
        "}\n"
    )
    source = (
        '#include "staged.h"\n'
        'extern "C" __global__ void reverse(float *out, const float *in) {\n'
        "    staged()[threadIdx.x] = in[threadIdx.x];\n"
        "    __syncthreads();\n"
        "    out[threadIdx.x] = staged()[blockDim.x - 1 - threadIdx.x];\n"
        "}\n"
    )
    module = emulator.load_module(source, {"staged.h": header}, name="emu_test_header_shared")
    x, out = torch.randn(32), torch.zeros(32)
    module.get_function("reverse").launch(1, 32, (out, x), shared_mem_bytes=128)
    assert torch.equal(out, x.flip(0))


def test_checked_and_unchecked_libraries_are_loaded_apart(scalars):
    module = scalars.module
    assert module.library(True).checked and not module.library(False).checked
    assert module.library(True).path != module.library(False).path


def test_a_checked_copy_keeps_the_tensors_address_modulo_64(scalars):
    """Kernels may take a tensor's alignment from its address: the guarded copy keeps it."""
    fn = scalars.module.get_function("address_mod_64")
    view = torch.zeros(32)[3:]
    out = torch.full((1,), -1, dtype=torch.int64)
    fn.launch(1, 1, (out, view))
    assert out.item() == view.data_ptr() % 64 != 0


# ---- accesses far out of bounds, and sources the build must not take as given ----------------

_DYNAMIC_INDEX = r"""
extern "C" __global__ void dynamic_at(float *out, long index) {
    extern __shared__ float buf[];
    if (threadIdx.x == 0) { buf[index] = 2.0f; out[0] = buf[index]; }
}
"""


@pytest.mark.parametrize(
    "shared_bytes,offset,index,message",
    [
        (4096, 0, -512, "out-of-bounds shared-memory access"),  # 2 KiB below the buffer
        (4096, 0, -4000, "out-of-bounds shared-memory access"),  # 16 KiB below
        (4096, 0, 100_000, "out-of-bounds"),  # past the guard (where depends on the linker)
        (232_448, 0, -20_000, "out-of-bounds"),
        (4096, 0, -16_400, "out-of-bounds"),  # just past the low guard
        (232_448, 1008, 58_116, "out-of-bounds shared-memory access"),  # 16 bytes past the top
    ],
)
def test_a_shared_index_far_out_of_bounds_is_reported(shared_bytes, offset, index, message):
    """Each was unreported (the runtime's own memory counted as the library's data), the last
    one ending the process with SIGSEGV: run in a child process, so that a crash fails here."""
    script = (
        "import torch, spio.emulator as e\n"
        f"fn = e.load_module({_DYNAMIC_INDEX!r}, name='dynamic_at').get_function('dynamic_at')\n"
        "try:\n"
        f"    fn.launch(1, 1, (torch.zeros(1), {index}), {shared_bytes}, shared_offset={offset})\n"
        "except e.EmulatorError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    print('no error')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert message in run.stdout


def test_a_read_a_little_past_a_large_tensor_does_not_reach_the_next_one():
    """Guard zones grow with the tensor: a read 1,000 bytes past a 4 MiB tensor had landed in
    the next argument's copy and read its values, unreported."""
    src = r"""extern "C" __global__ void read_at(float *out, const float *a, const float *b,
                                            long k) {
        if (threadIdx.x == 0) out[0] = a[k] + b[0]; }"""
    fn = emulator.load_module(src, name="read_at").get_function("read_at")
    n = 1 << 20
    a, b = torch.zeros(n), torch.full((n,), 7.0)
    for past in (64, 1000, 10_000, n - 64):
        with pytest.raises(emulator.EmulatorError, match="out-of-bounds global"):
            fn.launch(1, 1, (torch.zeros(1), a, b, n + past))
    out = torch.zeros(1)
    fn.launch(1, 1, (out, a, b, n - 1))
    assert out.item() == 7.0


def test_a_kernel_only_declared_is_not_an_entry():
    """A declaration without a body is valid CUDA; the library had been built and cached with an
    entry naming the missing symbol, and every load failed with a bare OSError."""
    src = """extern "C" __global__ void declared_only(float *out);
extern "C" __global__ void defined(float *out) { out[threadIdx.x] = 1; }"""
    assert kernel_names(src) == ["defined"]
    module = emulator.load_module(src, name="declared_only")
    assert module.kernels == ("defined",)
    out = torch.zeros(4)
    module.get_function("defined").launch(1, 4, (out,))
    assert out.tolist() == [1.0] * 4


def test_an_undefined_symbol_fails_the_build_naming_it():
    """A __device__ function declared and called but defined nowhere fails at the link (it had
    linked, been cached, and failed at every load with a bare OSError)."""
    src = """__device__ float missing_helper(float x);
extern "C" __global__ void calls(float *out) { out[0] = missing_helper(out[0]); }"""
    with pytest.raises(EmulatorBuildError, match="(?s)linking calls_missing.*missing_helper"):
        emulator.load_module(src, name="calls_missing")


def test_a_kernel_declared_extern_c_and_defined_after_is_an_entry():
    """The declaration's extern "C" gives the later definition C linkage (NVRTC builds it)."""
    src = """extern "C" __global__ void fill(float *out);
__global__ void fill(float *out) { out[threadIdx.x] = 5; }"""
    assert kernel_names(src) == ["fill"]
    out = torch.zeros(4)
    emulator.load_module(src, name="declared_first").get_function("fill").launch(1, 4, (out,))
    assert out.tolist() == [5.0] * 4


def test_a_long_compiler_error_keeps_its_first_error():
    """The cause of an error cascade comes first: only the output's last 20,000 characters had
    been kept. (g++ reports all 401 errors; clang stops after 20.)"""
    body = "\n".join(f"    undefined_thing_{i}(out);" for i in range(400))
    src = 'extern "C" __global__ void cascade(float *out) {\n    int x = ;\n' + body + "\n}\n"
    with pytest.raises(EmulatorBuildError) as info:
        emulator.load_module(src, name="cascade")
    assert "cascade.cu:2:" in str(info.value)
    text = "".join(f"line {i}\n" for i in range(10_000))
    short = clipped(text)
    assert short.startswith("line 0\n") and short.endswith("line 9999\n")
    assert f"({len(text) - 20_000} characters left out)" in short
    assert clipped("short") == "short"


def test_a_multiline_extern_shared_in_a_macro_still_builds():
    """A line break inside the declaration's type (a macro's continuation) stays where it is:
    one added after it had ended the macro early."""
    src = r"""#define DYNAMIC_BUF(T, name) \
    extern __shared__ \
    T name[]; \
    name[threadIdx.x] = 0
extern "C" __global__ void in_macro(float *out) {
    DYNAMIC_BUF(float, buf); buf[threadIdx.x] = 2.0f; __syncthreads();
    out[threadIdx.x] = buf[threadIdx.x];
}"""
    out = torch.zeros(4)
    module = emulator.load_module(src, name="in_macro")
    module.get_function("in_macro").launch(1, 4, (out,), shared_mem_bytes=16)
    assert out.tolist() == [2.0] * 4


def test_errors_after_a_multiline_extern_shared_keep_their_line_numbers():
    src = (
        'extern "C" __global__ void late_error(float *out) {\n'
        "    extern __shared__\n"
        "        float buf[];\n"
        "    buf[0] = 1;\n"
        "    int x = ;\n"
        "}\n"
    )
    assert rewrite_extern_shared(src).count("\n") == src.count("\n")
    with pytest.raises(EmulatorBuildError, match=r"late_error\.cu:5:"):
        emulator.load_module(src, name="late_error")


def test_no_bundled_header_declares_an_extern_shared_array():
    """The emulator rewrites `extern __shared__ T name[];` in kernel sources and in-memory
    headers only: spio/include is put on the include path as it is."""
    from spio.cuda.paths import bundled_include_dir
    from spio.emulator.build import _EXTERN_SHARED_RE

    declaring = [
        str(path)
        for path in bundled_include_dir().rglob("*")
        if path.is_file() and _EXTERN_SHARED_RE.search(path.read_text(encoding="utf-8"))
    ]
    assert declaring == []


def test_a_module_name_is_only_a_label(tmp_path):
    """A name with `/` had failed with FileNotFoundError, and one with `../` wrote its source
    outside the build folder."""
    import tempfile
    from pathlib import Path

    src = 'extern "C" __global__ void labelled(float *out) { out[0] = 3; }'
    escaped = Path(tempfile.gettempdir()) / "spio-escape-label.cu"  # where ../ had written
    escaped.unlink(missing_ok=True)
    for name in ("../spio-escape-label", "../../spio-escape/x y", "a/b", "x" * 300):
        module = emulator.load_module(src, name=name)
        out = torch.zeros(1)
        module.get_function("labelled").launch(1, 1, (out,))
        assert out.item() == 3.0
    assert not escaped.exists()


def test_a_checked_launch_writes_an_output_that_requires_grad(add_fn):
    """As an unchecked launch and a GPU do; the checked copy-back had raised autograd's leaf
    error after the kernel ran."""
    for check in (True, False):
        out = torch.zeros(4, requires_grad=True)
        add_fn.launch(1, 4, (out, torch.arange(4.0), 4, 0), check=check)
        assert out.detach().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_numpy_integer_seed_is_an_int():
    import numpy as np

    fn = emulator.load_module(
        'extern "C" __global__ void seeded(float *out) { out[threadIdx.x] = 1; }', name="seeded"
    ).get_function("seeded")
    out = torch.zeros(4)
    fn.launch(1, 4, (out,), seed=np.int64(3))
    assert out.tolist() == [1.0] * 4


@pytest.mark.parametrize("seed", [1.5, "7", True])
def test_a_seed_must_be_an_int(add_fn, seed):
    with pytest.raises(TypeError, match="seed must be an int"):
        add_fn.launch(1, 4, (torch.zeros(4), torch.zeros(4), 4, 0), seed=seed)
