"""`python -m spio check` in the CPU emulator: passes on the real kernels, fails on a broken one."""

import sys

import pytest
import torch

from spio import check
from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels import conv2d_gw8_wgrad_factory as wg
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.kernels.stats import PASSES
from tests.conftest import gpu_available, run_spio

TINY = (Conv2dGw8Params(n=1, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True),)


def _check_pass(device, layers, pass_, dtype, extra_configs=1):
    """One pass in one dtype over layers (re-typed to dtype), each with sampled configs."""
    jobs = check.check_jobs(device, layers, pass_, dtype, extra_configs)
    return check.run_jobs(device, pass_, dtype, jobs)


def _run(**kwargs):
    lines = []
    results = check.run_check("cpu", TINY, extra_configs=0, report=lines.append, **kwargs)
    return results, lines


def test_check_passes_every_pass_and_dtype_in_the_emulator():
    results, lines = _run()
    assert [(r.pass_, r.dtype) for r in results] == [
        (p, d) for d in ("fp16", "bf16") for p in ("fprop", "dgrad", "wgrad")
    ]
    assert all(r.passed and r.runs == 1 and 0 <= r.worst <= 1 for r in results), lines
    assert len(lines) == 6 and all(" PASS " in line for line in lines)
    assert "worst error" in lines[0] and "of tolerance" in lines[0]


def test_check_draws_each_pass_configs_once(monkeypatch):
    """run_check draws each (layer, pass, dtype)'s configs once, for building and running both
    (it ranked them again for the runs: on a GPU, another round of perf-model predictions)."""
    calls = []
    real = check.configs_to_run
    monkeypatch.setattr(check, "configs_to_run", lambda *a, **k: calls.append(a) or real(*a, **k))
    results, _ = _run(passes=("fprop", "wgrad"), dtypes=("bf16",))
    assert all(r.passed and r.runs == 1 for r in results)
    assert len(calls) == 2


def test_check_reports_a_broken_fprop(monkeypatch):
    real = fd.fprop

    def off_by_a_little(x, w, bias, params, config=None, out=None, kernel=None):
        y = real(x, w, bias, params, config, out=out, kernel=kernel)
        y[0, 3, 2, 4] += 0.25  # one wrong element
        return y

    monkeypatch.setattr(fd, "fprop", off_by_a_little)
    results, lines = _run(passes=("fprop", "dgrad"), dtypes=("fp16",))
    fprop, dgrad = results
    assert not fprop.passed and 1 < fprop.worst < float("inf") and len(fprop.failures) == 1
    assert "FAIL" in lines[0] and TINY[0].encode() in lines[0] and "Error" not in lines[0]
    assert dgrad.passed and "PASS" in lines[1]


def test_check_reports_a_missing_bias_gradient(monkeypatch):
    real = wg.wgrad
    monkeypatch.setattr(wg, "wgrad", lambda *a, **k: (real(*a, **k)[0], None))
    (result,), lines = _run(passes=("wgrad",), dtypes=("bf16",))
    assert not result.passed and result.worst == float("inf")


def test_check_poisons_the_wgrad_partial_sums(monkeypatch):
    """A partial-sums kernel that skips one element of its buffer leaves what was there: NaN,
    since check poisons the buffers, so the pass fails (unpoisoned, the allocator could hand
    back an earlier run's right values)."""
    from spio.kernels.kernel import Kernel

    real = Kernel.launch

    def skips_one(self, args, device):
        if not self.info_value("partials"):
            return real(self, args, device)
        before = args[0].clone()
        real(self, args, device)
        args[0][5] = before[5]

    monkeypatch.setattr(Kernel, "launch", skips_one)
    (result,), lines = _run(passes=("wgrad",), dtypes=("fp16",))
    assert not result.passed and result.worst == float("inf"), lines


def test_check_turns_a_kernel_error_into_a_failure(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(fd, "dgrad", broken)
    (result,), lines = _run(passes=("dgrad",), dtypes=("fp16",))
    assert not result.passed
    assert "RuntimeError: launch failed" in lines[0]


def test_check_stops_at_a_sticky_cuda_error(monkeypatch):
    """After an illegal address the GPU context is unusable: every later run had failed with
    the same error, each reported as its own failure; now the check stops and says why."""
    from spio.cuda import driver

    calls = []

    def illegal_address(*args, **kwargs):
        calls.append(args)
        raise driver.CudaError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuLaunchKernel")

    monkeypatch.setattr(check, "precompile", lambda jobs, device: None)
    monkeypatch.setattr(check, "run_one", illegal_address)
    results, lines = _run()
    assert len(calls) == 1 and len(results) == 1 and not results[0].passed
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in lines[0]
    assert "unusable in this process" in lines[1] and "CUDA_LAUNCH_BLOCKING=1" in lines[1]

    # Another CUDA error is the run's own: the check goes on.
    def out_of_resources(*args, **kwargs):
        raise driver.CudaError(701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuLaunchKernel")

    monkeypatch.setattr(check, "run_one", out_of_resources)
    results, lines = _run()
    assert len(results) == len(PASSES) * len(check.DTYPES)
    assert not any(r.passed for r in results)


def test_check_stops_at_a_sticky_error_raised_by_pytorch(monkeypatch):
    """On a GPU the sticky error may surface through PyTorch (its own exception type, not the
    driver's CudaError): the check had gone on and failed every later run with it. Any error
    after which the context no longer synchronises stops it; one after which it does, not."""
    monkeypatch.setenv("SPIO_TMA", "off")
    calls = []

    def illegal_access(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def lost_context(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    jobs = check.check_jobs("cpu", TINY, "fprop", "fp16", extra_configs=1) * 2
    monkeypatch.setattr(check, "run_one", illegal_access)
    monkeypatch.setattr(torch.cuda, "synchronize", lost_context)
    with pytest.raises(check.ContextLost) as lost:
        check.run_jobs("cuda", "fprop", "fp16", jobs)
    assert len(calls) == 1 and lost.value.result.runs == 1
    assert "illegal memory access" in lost.value.result.failures[0]

    # A CUDA error of a code spio does not list as sticky: asked the same way.
    from spio.cuda import driver

    def unlisted(*args, **kwargs):
        calls.append(args)
        raise driver.CudaError(999, "CUDA_ERROR_UNKNOWN", "cuLaunchKernel")

    calls.clear()
    monkeypatch.setattr(check, "run_one", unlisted)
    with pytest.raises(check.ContextLost):
        check.run_jobs("cuda", "fprop", "fp16", jobs)
    assert len(calls) == 1

    monkeypatch.setattr(check, "run_one", illegal_access)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    result = check.run_jobs("cuda", "fprop", "fp16", jobs)
    assert result.runs == len(jobs) > 1 and len(result.failures) == len(jobs)
    # On the CPU no error is sticky.
    monkeypatch.setattr(torch.cuda, "synchronize", lost_context)
    assert check.run_jobs("cpu", "fprop", "fp16", jobs).runs == len(jobs)


def _record_builds_and_launches(monkeypatch):
    """(names of the kernels built, kernels launched), recorded from now on; both still run."""
    from spio.kernels import kernel as kernel_module

    built, launched = set(), []
    build, launch = kernel_module.build_kernels, kernel_module.Kernel.launch

    def recording_build(kernels, device, progress=True):
        kernels = list(kernels)
        built.update(k.name for k in kernels)
        return build(kernels, device, progress)

    def recording_launch(self, args, device):
        launched.append(self)
        return launch(self, args, device)

    monkeypatch.setattr(kernel_module, "build_kernels", recording_build)
    monkeypatch.setattr(kernel_module.Kernel, "launch", recording_launch)
    return built, launched


def test_check_builds_its_kernels_before_running_them(monkeypatch):
    """In parallel, up front: every kernel the check launches was among those built, the
    variants reading operands as held too (they had been built at their first launch)."""
    built, launched = _record_builds_and_launches(monkeypatch)
    results = check.run_check("cpu", TINY, extra_configs=1, dtypes=("bf16",), report=print)
    assert all(r.passed and r.runs == 2 for r in results)
    assert launched and {k.name for k in launched} <= built
    assert [k.info_value("weights_cl") for k in launched if "dgrad" in k.name] == [False, True]


@pytest.mark.parametrize("setting", ["loads", "loads+stores"])
def test_check_runs_the_tensor_copy_kernels_spio_runs_under_spio_tma(monkeypatch, setting):
    """With SPIO_TMA set, spio runs every pass's tensor-copy kernel (in the emulator too): the
    check builds and launches those, and says so. It had checked the plain kernels alone."""
    monkeypatch.setenv("SPIO_TMA", setting)
    built, launched = _record_builds_and_launches(monkeypatch)
    results, _ = _run(dtypes=("fp16",))
    assert all(r.passed and r.runs == 1 for r in results)
    convs = [k for k in launched if k.info_value("config") is not None]
    assert len(convs) == 3 and all(k.info_value("tma") for k in convs), [k.name for k in convs]
    stores = [bool(k.info_value("tma_stores")) for k in convs if "wgrad" not in k.name]
    assert stores == [setting == "loads+stores"] * 2
    assert {k.name for k in launched} <= built
    notes = check._tensor_copies_note()
    assert "SPIO_TMA" in notes and ("output" in notes) == (setting == "loads+stores")
    monkeypatch.setenv("SPIO_TMA", "off")
    assert check._tensor_copies_note() == ""


def test_error_ratio_flags_nan_and_scales_by_tolerance():
    expected = torch.tensor([1.0, -2.0], dtype=torch.float64)
    assert check.error_ratio(torch.tensor([1.0, float("nan")]), expected, 0.1, 0.0) == float("inf")
    ratio = check.error_ratio(torch.tensor([1.05, -2.0]), expected, 0.1, 0.0)
    assert ratio == pytest.approx(0.5)


def _planted(reference, tol, sign=-1.0, times=4.0):
    """The float64 reference with its most negative element moved `times` its tolerance
    (atol + rtol * |expected|) below (sign -1) or above the right value."""
    wrong = reference.clone()
    flat = wrong.view(-1)
    at = int(flat.argmin())
    flat[at] += sign * times * (tol.atol + tol.rtol * abs(float(reference.view(-1)[at])))
    return wrong


def _fake_kernels(monkeypatch, target):
    """Fake fprop, dgrad and wgrad that return the float64 reference (rounded to what the kernel
    writes: the activation dtype, fp32 for WGrad) with one element 4 tolerances too low in
    `target`: "fprop", "dgrad", "dw" or "dbias"."""
    from spio.reference import (
        conv2d_gw8_bias_grad_ref,
        conv2d_gw8_dgrad_ref,
        conv2d_gw8_fprop_ref,
        conv2d_gw8_tolerance,
        conv2d_gw8_wgrad_ref,
    )

    def fprop(x, w, bias, params, config=None, out=None, kernel=None):
        y = conv2d_gw8_fprop_ref(x, w, bias, params.padding)
        if target == "fprop":
            y = _planted(y, conv2d_gw8_tolerance(params, "fprop", x, w))
        return out.copy_(y)

    def dgrad(dy, w, params, config=None, out=None, kernel=None):
        dx = conv2d_gw8_dgrad_ref(dy, w, params.padding, (params.h, params.w))
        if target == "dgrad":
            dx = _planted(dx, conv2d_gw8_tolerance(params, "dgrad", dy, w))
        return out.copy_(dx)

    def wgrad(x, dy, params, kernel=None, poison=False, dtypes=None, channels_last=False):
        out = (dtypes or (torch.float32,))[0]
        dw = conv2d_gw8_wgrad_ref(x, dy, params.padding, params.r, params.s)
        dbias = conv2d_gw8_bias_grad_ref(dy)
        if target == "dw":
            dw = _planted(dw, conv2d_gw8_tolerance(params, "wgrad", x, dy, out_dtype=out))
        if target == "dbias":
            tolerance = conv2d_gw8_tolerance(params, "wgrad", dy, torch.ones(1), out_dtype=out)
            dbias = _planted(dbias, tolerance)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        return dw.to(out, memory_format=layout), dbias.to(out)

    monkeypatch.setattr(fd, "fprop", fprop)
    monkeypatch.setattr(fd, "dgrad", dgrad)
    monkeypatch.setattr(wg, "wgrad", wgrad)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("target", ["fprop", "dgrad", "dw", "dbias"])
def test_check_measures_an_error_below_the_reference_in_tolerances(monkeypatch, target, dtype):
    """A result one element of which is 4 tolerances (of the depth-derived tolerance) under the
    float64 reference fails with a worst error of about 4 (rounding to the output dtype moves it
    by at most half a tolerance); every other pass, whose result is the reference, passes."""
    _fake_kernels(monkeypatch, target)
    for pass_ in ("fprop", "dgrad", "wgrad"):
        result = _check_pass("cpu", TINY, pass_, dtype, extra_configs=0)
        if pass_ == {"dw": "wgrad", "dbias": "wgrad"}.get(target, target):
            assert not result.passed and 3.4 < result.worst < 4.6, result.line()
        else:
            assert result.passed and result.worst <= 0.5, result.line()


def test_check_hands_every_kernel_nan_filled_outputs(monkeypatch):
    """So that an element a kernel does not write fails as NaN instead of passing with what the
    buffer held (zeros, or a previous run's right values)."""
    from spio.reference import conv2d_gw8_dgrad_ref, conv2d_gw8_fprop_ref

    seen = []

    def fprop(x, w, bias, params, config=None, out=None, kernel=None):
        seen.append(("fprop", out is not None and bool(out.isnan().all())))
        return conv2d_gw8_fprop_ref(x, w, bias, params.padding)

    def dgrad(dy, w, params, config=None, out=None, kernel=None):
        seen.append(("dgrad", out is not None and bool(out.isnan().all())))
        return conv2d_gw8_dgrad_ref(dy, w, params.padding, (params.h, params.w))

    monkeypatch.setattr(fd, "fprop", fprop)
    monkeypatch.setattr(fd, "dgrad", dgrad)
    for pass_ in ("fprop", "dgrad"):
        assert _check_pass("cpu", TINY, pass_, "bf16", extra_configs=0).passed
    assert seen == [("fprop", True), ("dgrad", True)]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("pass_", ["fprop", "dgrad"])
def test_check_compares_with_the_exact_reference_not_one_rounded_to_the_output_dtype(
    monkeypatch, pass_, dtype
):
    """A result 1.25 tolerances off the float64 reference fails, also at the element where the
    reference rounded to fp16/bf16 lies between the two (rounded, it would seem under 1)."""
    from spio.reference import conv2d_gw8_dgrad_ref, conv2d_gw8_fprop_ref, conv2d_gw8_tolerance

    def off(reference, tol):
        """float64 (any dtype passes through the check) reference, the element where rounding
        to `dtype` moves furthest (in tolerances) moved 1.25 tolerances that way."""
        allowed = tol.atol + tol.rtol * reference.abs()
        moved = reference.to({"fp16": torch.float16, "bf16": torch.bfloat16}[dtype])
        residual = (moved.double() - reference) / allowed
        at = int(residual.abs().view(-1).argmax())
        assert abs(float(residual.view(-1)[at])) > 0.3  # where rounding hides errors
        result = reference.clone()
        result.view(-1)[at] += 1.25 * float(residual.view(-1)[at].sign() * allowed.view(-1)[at])
        return result

    def fprop(x, w, bias, params, config=None, out=None, kernel=None):
        y = conv2d_gw8_fprop_ref(x, w, bias, params.padding)
        return off(y, conv2d_gw8_tolerance(params, "fprop", x, w))

    def dgrad(dy, w, params, config=None, out=None, kernel=None):
        dx = conv2d_gw8_dgrad_ref(dy, w, params.padding, (params.h, params.w))
        return off(dx, conv2d_gw8_tolerance(params, "dgrad", dy, w))

    monkeypatch.setattr(fd, "fprop", fprop)
    monkeypatch.setattr(fd, "dgrad", dgrad)
    result = _check_pass("cpu", TINY, pass_, dtype, extra_configs=0)
    assert not result.passed and 1.2 < result.worst < 1.3, result.line()


LAYERS = (
    Conv2dGw8Params(n=1, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True),
    Conv2dGw8Params(n=2, c=8, h=4, w=7, padding=(0, 2), r=1, s=5),
)


def _recorded_runs(monkeypatch, tmp_path, ratios=None):
    """check.run_one replaced: records (params, pass, config, device) and returns the next of
    `ratios` (0.5 when None). "cuda" is a fake sm_90 GPU without perf models: the heuristic's
    picks for an H200-class GPU, as on the CPU."""
    from spio.kernels import perf_model as pm

    fake_gpu = pm.DeviceIdentity("sm_90", "Fake GPU", "13.0")
    monkeypatch.setattr(pm, "device_identity", lambda d: fake_gpu if d.type == "cuda" else None)
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))  # no models there
    pm.clear_caches()
    runs = []
    ratios = iter(ratios or ())

    def run_one(params, pass_, config, device, seed=0, kernel=None, as_held=False):
        runs.append((params, pass_, config, device))
        return next(ratios, 0.5)

    monkeypatch.setattr(check, "run_one", run_one)
    return runs


def test_check_runs_every_layer_in_the_dtype_with_the_default_and_sampled_configs(
    monkeypatch, tmp_path
):
    from dataclasses import replace

    from spio.kernels.families import FAMILY_OF_PASS

    runs = _recorded_runs(monkeypatch, tmp_path)
    result = _check_pass("cuda", LAYERS, "dgrad", "bf16", extra_configs=2)
    family = FAMILY_OF_PASS["dgrad"]
    typed = [replace(p, dtype="bf16") for p in LAYERS]
    assert [params for params, _, _, _ in runs] == [typed[0]] * 3 + [typed[1]] * 3
    for index, params in enumerate(typed):
        configs = [config for p, _, config, _ in runs if p == params]
        # The pick first, then every other layer's last (so that some picks run as held).
        assert configs[-index] == family.default_config(params)
        assert len(set(configs)) == 3 and set(configs) <= set(family.configs(params))
    assert {(pass_, device) for _, pass_, _, device in runs} == {("dgrad", "cuda")}
    assert result.passed and result.runs == 6 and result.worst == 0.5


def test_check_keeps_the_worst_error_and_counts_every_failed_run(monkeypatch, tmp_path):
    """A NaN ratio fails too (not ratio <= 1), and the worst error is the largest run's, not
    the last."""
    _recorded_runs(monkeypatch, tmp_path, ratios=[0.5, 3.0, float("nan"), 0.25])
    result = _check_pass("cpu", LAYERS, "fprop", "fp16", extra_configs=1)
    assert result.runs == 4 and len(result.failures) == 2 and not result.passed
    assert result.worst == 3.0
    assert "FAIL" in result.line() and "2 failed" in result.line()


def test_check_with_nothing_run_does_not_pass():
    result = _check_pass("cpu", (), "fprop", "fp16")
    assert result.runs == 0 and not result.passed and " FAIL " in result.line()


def test_check_runs_the_kernels_on_the_device_it_is_given(monkeypatch, tmp_path):
    runs = _recorded_runs(monkeypatch, tmp_path)
    built_for = []
    monkeypatch.setattr(check, "precompile", lambda *args: built_for.append(args[-1]))
    results = check.run_check("cuda", TINY, extra_configs=0, report=lambda line: None)
    assert len(results) == 6 and all(r.passed for r in results)
    assert built_for == ["cuda"] and {device for *_, device in runs} == {"cuda"}


def _all_passing() -> list:
    """One passing result for every pass in every dtype."""
    return [check.PassResult(p, d, runs=1, worst=0.5) for d in check.DTYPES for p in PASSES]


def _cmd_check(monkeypatch, device, quick, results=None, error=None):
    """cmd_check on `device` with run_check replaced: records its arguments and returns
    `results` (six passing ones when None) or raises `error`. -> (exit status, arguments)."""
    import argparse

    calls = []

    def run_check(device, layers, extra_configs=1, **kwargs):
        calls.append((device, tuple(layers), extra_configs))
        if error:
            raise error
        return results or _all_passing()

    monkeypatch.setattr(check, "resolve_device", lambda requested: device)
    monkeypatch.setattr(check, "run_check", run_check)
    status = check.cmd_check(argparse.Namespace(device=None, quick=quick))
    (call,) = calls
    return status, call


def test_check_command_covers_every_layer_and_samples_configs(monkeypatch):
    """On a GPU: every GPU layer (table-sized ones too), the default config and sampled ones;
    --quick fewer layers but still table-sized ones. In the emulator: every emulator layer;
    --quick a layer with a bias and one with a non-square filter and no bias."""
    status, (device, layers, extra) = _cmd_check(monkeypatch, "cuda", quick=False)
    assert status == 0 and device == "cuda" and layers == check.GPU_LAYERS and extra >= 1
    _, (device, layers, extra) = _cmd_check(monkeypatch, "cuda", quick=True)
    assert device == "cuda" and set(layers) < set(check.GPU_LAYERS)
    assert set(layers) - set(check.EMULATOR_LAYERS)
    _, (device, layers, extra) = _cmd_check(monkeypatch, "cpu", quick=False)
    assert device == "cpu" and layers == check.EMULATOR_LAYERS and extra >= 1
    _, (device, layers, extra) = _cmd_check(monkeypatch, "cpu", quick=True)
    assert device == "cpu" and extra == 0
    assert any(p.has_bias for p in layers) and any(not p.has_bias and p.r != p.s for p in layers)


def test_check_command_exits_1_when_any_pass_fails(monkeypatch, capsys):
    passing = _all_passing()
    assert _cmd_check(monkeypatch, "cpu", quick=True, results=passing)[0] == 0
    assert "all 6 pass/dtype checks passed" in capsys.readouterr().out
    for index in (0, len(passing) - 1):
        failing = list(passing)
        failing[index] = check.PassResult("wgrad", "bf16", runs=1, worst=2.0, failures=("x",))
        assert _cmd_check(monkeypatch, "cpu", quick=True, results=failing)[0] == 1
        assert "FAILED: 1 of 6 pass/dtype checks" in capsys.readouterr().out
    setup = check.SetupError("no compiler")
    assert _cmd_check(monkeypatch, "cpu", quick=True, error=setup)[0] == 2
    assert "spio check: setup error: no compiler" in capsys.readouterr().err


def test_check_command_runs_end_to_end_in_the_emulator():
    out = run_spio("check", "--device", "cpu", "--quick", timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" PASS ") == 6
    assert "all 6 pass/dtype checks passed" in out.stdout


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_check_on_cuda_without_gpu_exits_with_message():
    out = run_spio("check", "--device", "cuda", env={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2
    assert "needs a CUDA GPU" in out.stderr


@pytest.mark.cuda
def test_check_passes_on_the_gpu():
    lines = []
    results = check.run_check("cuda", check.GPU_LAYERS[-3:], extra_configs=1, report=lines.append)
    assert all(r.passed for r in results), "\n".join(lines)


@pytest.mark.parametrize(
    "setting,said",
    [("CXX", "needs a host C++ compiler"), ("SPIO_CUDA_INCLUDE", "is not a folder")],
)
def test_check_reports_a_broken_toolchain_as_one_setup_error(setting, said, tmp_path):
    """When no kernel builds, one setup error (exit 2), not six "inf of tolerance" FAIL lines."""
    env = {"SPIO_CACHE_DIR": str(tmp_path), setting: "/nonexistent"}
    out = run_spio("check", "--device", "cpu", "--quick", env=env, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    # (21 run kernels and the held WGrad run's fp32 sum, which it compares its half one with)
    assert "spio check: setup error: none of the 22 kernels could be built" in out.stderr
    assert said in out.stderr and " FAIL " not in out.stdout


def test_check_runs_where_the_kernels_run(monkeypatch, capsys):
    """The default device is the GPU when spio's kernels run on it, else the emulator, saying
    why (a T4, say); --device cuda on such a GPU is an error naming it (torch.cuda faked)."""
    from spio.functional import checks

    problem = {"answer": None}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(checks, "device_problem", lambda device: problem["answer"])
    assert check.resolve_device(None) == "cuda"
    assert check.resolve_device("cpu") == "cpu"
    problem["answer"] = "cuda:0 (Tesla T4) is sm_75"
    assert check.resolve_device(None) == "cpu"
    assert "do not run on cuda:0 (Tesla T4) is sm_75: checking in the CPU emulator" in (
        capsys.readouterr().out
    )
    with pytest.raises(RuntimeError, match=r"--device cuda: spio's kernels do not run on cuda:0"):
        check.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check.resolve_device(None) == "cpu"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU; none is available"):
        check.resolve_device("cuda")
    # A CPU build of torch on a machine with a GPU: said, where the check had gone to the
    # emulator in silence.
    from spio.cuda import driver

    capsys.readouterr()
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(driver, "device_count", lambda: 1)
    assert check.resolve_device(None) == "cpu"
    said = "is a CPU build, so no GPU is available to it (spio's driver sees 1)"
    assert said in capsys.readouterr().out
    with pytest.raises(RuntimeError, match=r"none is available \(torch .* is a CPU build"):
        check.resolve_device("cuda")
    # spio's source tree without the built driver extension (`python -m spio check` in a
    # checkout installed with `pip install .`): the emulator, where it had been an ImportError.
    import spio.cuda

    monkeypatch.setitem(sys.modules, "spio.cuda.driver", None)
    monkeypatch.delattr(spio.cuda, "driver")
    assert check.resolve_device(None) == "cpu"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU; none is available$"):
        check.resolve_device("cuda")
    # and a failed emulated run is a failure, not that ImportError (_sticky imported the driver)
    assert check._sticky(RuntimeError("wrong store"), "cpu") is False


def test_the_check_runs_the_config_spio_picks_on_the_gpu(monkeypatch, tmp_path):
    """On a GPU the check's first config of each pass is the one spio runs there (its perf
    model's pick, or the heuristic's for that GPU); it had been the heuristic's for an H200-class
    GPU whatever the GPU, a config spio may never run there. On the CPU it still is."""
    from spio.kernels import perf_model as pm
    from spio.kernels.families import FAMILY_OF_PASS

    layer = Conv2dGw8Params(128, 64, 64, 64, padding=1, has_bias=True)
    rtx3090 = pm.DeviceIdentity("sm_86", "NVIDIA GeForce RTX 3090", "13.0", sms=82)
    h200 = pm.DeviceIdentity("sm_90", "NVIDIA H200", "13.0", sms=132)
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))  # none for the 3090
    monkeypatch.setattr(pm, "device_identity", lambda d: rtx3090 if d.type == "cuda" else None)
    pm.clear_caches()
    for pass_ in PASSES:
        family = FAMILY_OF_PASS[pass_]
        cpu = check.configs_to_run(layer, pass_, extra=2, seed=0)
        gpu = check.configs_to_run(layer, pass_, extra=2, seed=0, device="cuda")
        assert cpu[0] == family.default_config(layer) and len(cpu) == len(gpu) == 3
        assert gpu[0] == family.default_config(layer, machine=rtx3090.machine)
    wgrad = FAMILY_OF_PASS["wgrad"]
    assert check.configs_to_run(layer, "wgrad", 0, 0, "cuda") != [wgrad.default_config(layer)]
    # With the shipped sm_90 models: each pass's model pick, on this layer not the heuristic's.
    monkeypatch.delenv("SPIO_PERF_MODELS")
    monkeypatch.setattr(pm, "device_identity", lambda d: h200 if d.type == "cuda" else None)
    pm.clear_caches()
    for pass_ in PASSES:
        family = FAMILY_OF_PASS[pass_]
        ranked, model = pm.rank_configs(family, family.layer_as_run(layer), h200)
        assert model is not None and ranked[0] != family.default_config(layer)
        assert check.configs_to_run(layer, pass_, 0, 0, "cuda") == [ranked[0]]
    pm.clear_caches()


def test_the_emulator_check_runs_multi_image_and_sixteen_wide_mma_configs_of_every_pass():
    """Mutation testing (2026-12-06): a WGrad kernel that read only a block's first image, and
    one that gave m16n8k16 its A registers in the wrong order, passed `spio check` in the
    emulator, whose WGrad runs had all been one image a block with mma_k 8 (fp16 and bf16 drew
    the same configs). Every pass must run a config with several images a block, one of them
    ragged (the batch not a multiple of its images a block), and one with mma_k 16."""
    from spio.kernels.conv2d_gw8_params import DTYPES

    for pass_ in PASSES:
        jobs = [
            job
            for dtype in DTYPES
            for job in check.check_jobs("cpu", check.EMULATOR_LAYERS, pass_, dtype, 1)
        ]
        assert any(c.block_n > 1 for _, c in jobs), pass_
        assert any(p.n % c.block_n for p, c in jobs), pass_
        assert any(c.mma_k == 16 for _, c in jobs), pass_


def test_the_check_runs_the_variants_a_half_precision_model_runs(monkeypatch):
    """Every other run reads channels_last weights and (FProp) a half bias as held: a kernel
    that read a bf16 bias as fp16 passed `spio check` (mutation testing, 2026-12-06), as its
    runs all had an fp32 bias and contiguous weights."""
    launched = []
    real = fd.fprop

    def spy(x, w, bias, params, config=None, out=None, kernel=None, **kwargs):
        launched.append((kernel.info_value("weights_cl"), kernel.info_value("bias_elem")))
        assert bias is None or bias.dtype == x.dtype or not kernel.info_value("bias_elem")
        return real(x, w, bias, params, config, out=out, kernel=kernel, **kwargs)

    monkeypatch.setattr(fd, "fprop", spy)
    jobs = check.check_jobs("cpu", TINY, "fprop", "bf16", 1)
    result = check.run_jobs("cpu", "fprop", "bf16", jobs)
    assert result.passed and result.runs == 2, result
    assert launched == [(False, False), (True, True)]


def test_the_check_runs_wgrad_each_way_spio_runs_it(monkeypatch):
    """WGrad's runs had all summed into fp32, contiguous gradients with the partial-sums kernel:
    a sum_slots that wrote a channels_last dw in the contiguous layout (what a channels_last
    model's autocast or half weights get), and an atomic kernel that added half its sums, both
    passed `spio check` (mutation testing, 2026-12-06). Quick emulator runs: the plain
    partial-sums kernel, the biased layer's gradients in its dtype and layout as held, and the
    atomic kernel."""
    launched = []
    real = wg.wgrad

    def spy(x, dy, params, kernel=None, dtypes=None, channels_last=False, **kwargs):
        launched.append((kernel.info_value("partials"), dtypes, channels_last, params.has_bias))
        return real(x, dy, params, kernel=kernel, dtypes=dtypes, channels_last=channels_last,
                    **kwargs)  # fmt: skip

    monkeypatch.setattr(wg, "wgrad", spy)
    jobs = check.check_jobs("cpu", check.QUICK_EMULATOR_LAYERS, "wgrad", "bf16", 0)
    result = check.run_jobs("cpu", "wgrad", "bf16", jobs)
    assert result.passed and result.runs == 3, result
    fp32, bf16 = (torch.float32,) * 2, (torch.bfloat16,) * 2
    # (the held run's second launch: the fp32 gradients its half ones must round from)
    assert launched == [
        (True, fp32, False, False),
        (True, bf16, True, True),
        (True, None, False, True),
        (False, fp32, False, False),
    ]


def test_the_quick_checks_run_every_variant_of_every_pass():
    """The quick emulator check had run no FProp with a bias in the input's dtype (its held run
    was of the bias-free layer) and no atomic WGrad; the quick GPU check, its 7 layers."""
    for layers in (check.QUICK_EMULATOR_LAYERS, check.GPU_LAYERS[:4] + check.GPU_LAYERS[-3:]):
        indices = range(len(layers))
        assert any(check.held(i) and layers[i].has_bias for i in indices)  # (FProp's, WGrad's)
        assert any(check.atomic(i, "wgrad") for i in indices)
        assert not any(check.atomic(i, "fprop") or check.atomic(i, "dgrad") for i in indices)
        assert not any(check.atomic(i, "wgrad") and check.held(i) for i in indices)


def test_the_full_emulator_check_runs_some_picks_as_held():
    """With one sampled config a layer the picks had all been even runs: spio's own choice was
    never run with the operands as a half-precision model holds them."""
    for pass_ in PASSES:
        jobs = check.check_jobs("cpu", check.EMULATOR_LAYERS, pass_, "fp16", 1)
        picks = {params: check.configs_to_run(params, pass_, 0, 0)[0] for params, _ in jobs}
        held_picks = [i for i, (p, c) in enumerate(jobs) if check.held(i) and c == picks[p]]
        assert len(held_picks) == len(check.EMULATOR_LAYERS) // 2, pass_


def test_a_kernel_that_does_not_compile_is_a_failure_not_a_setup_error(monkeypatch):
    """When none of the check's kernels builds but a kernel of no spio code does, spio's own
    code is at fault: its runs fail (exit 1), where a setup error (exit 2) had named the
    toolchain, so that a CI treating 2 as "no toolchain" hid a kernel that did not compile."""
    real = check.kernel_as_run

    def broken(*args, **kwargs):
        return real(*args, **kwargs).with_defines(("SPIO_UNROLL=this is not C++",))

    monkeypatch.setattr(check, "kernel_as_run", broken)
    layers = (check.EMULATOR_LAYERS[1],)
    results = check.run_check("cpu", layers, 0, ("fprop",), ("fp16",), report=lambda line: None)
    assert not results[0].passed and "error: invalid use of" in results[0].failures[0]
    monkeypatch.setattr(check, "toolchain_problem", lambda device: "no compiler")
    with pytest.raises(check.SetupError, match="none of the 1 kernels could be built"):
        check.run_check("cpu", layers, 0, ("fprop",), ("fp16",), report=lambda line: None)


def test_the_toolchain_probe_is_built_anew(monkeypatch):
    """A probe served from the disk cache said nothing of a compiler broken since: every kernel
    failing then read as spio's own fault (exit 1) where it is the toolchain's (exit 2)."""
    from spio.emulator import build

    assert check.toolchain_problem("cpu") is None  # (built, and cached, once)

    def broken(*args, **kwargs):
        raise build.EmulatorBuildError("g++: fatal error: cannot execute 'cc1plus'")

    monkeypatch.setattr(build, "_run", broken)
    assert "cannot execute 'cc1plus'" in check.toolchain_problem("cpu")


def test_held_wgrad_gradients_must_be_the_fp32_ones_rounded_to_nearest(monkeypatch):
    """A sum_slots rounding toward zero stayed within the half gradients' tolerance (0.94-0.98
    of it): the held run compares them bit for bit with the same kernel's fp32 gradients
    rounded to nearest, which its fixed summing order makes exact."""
    real = wg.wgrad

    def toward_zero(x, dy, params, kernel=None, dtypes=None, **kwargs):
        dw, dbias = real(x, dy, params, kernel=kernel, dtypes=None, **kwargs)
        half = (dtypes or (torch.float32,))[0]
        if half == torch.float32:
            return dw, dbias

        def truncated(f):
            h = f.to(half)
            bits = h.view(torch.int16).clone()
            bits[(h.float().abs() > f.abs()) & (f != 0)] -= 1  # one ulp toward zero
            return bits.view(half)

        layout = torch.channels_last if kwargs.get("channels_last") else torch.contiguous_format
        return truncated(dw).contiguous(memory_format=layout), truncated(dbias)

    layer = check.QUICK_EMULATOR_LAYERS[1]  # biased: dbias too
    config = check.configs_to_run(layer, "wgrad", 0, 0)[0]
    assert check.run_one(layer, "wgrad", config, "cpu", as_held=True) <= 1.0
    monkeypatch.setattr(wg, "wgrad", toward_zero)
    assert check.run_one(layer, "wgrad", config, "cpu", as_held=True) == float("inf")
