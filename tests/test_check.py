"""`python -m spio check` in the CPU emulator: passes on the real kernels, fails on a broken one."""

import os
import subprocess
import sys

import pytest
import torch

from spio import check
from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels import conv2d_gw8_wgrad_factory as wg
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from tests.conftest import gpu_available

TINY = (Conv2dGw8Params(n=1, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True),)


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


def test_check_builds_its_kernels_before_running_them(monkeypatch):
    """In parallel, up front: every kernel the check launches was among those built."""
    from spio.kernels import kernel as kernel_module

    built, launched = set(), []
    build, launch = kernel_module.build_kernels, kernel_module.Kernel.launch

    def recording_build(kernels, device, progress=True):
        kernels = list(kernels)
        built.update(k.name for k in kernels)
        return build(kernels, device, progress)

    def recording_launch(self, args, device):
        launched.append(self.name)
        return launch(self, args, device)

    monkeypatch.setattr(kernel_module, "build_kernels", recording_build)
    monkeypatch.setattr(kernel_module.Kernel, "launch", recording_launch)
    results, _ = _run(dtypes=("bf16",))
    assert all(r.passed for r in results)
    assert launched and set(launched) <= built


def test_error_ratio_flags_nan_and_scales_by_tolerance():
    expected = torch.tensor([1.0, -2.0], dtype=torch.float64)
    assert check.error_ratio(torch.tensor([1.0, float("nan")]), expected, 0.1, 0.0) == float("inf")
    ratio = check.error_ratio(torch.tensor([1.05, -2.0]), expected, 0.1, 0.0)
    assert ratio == pytest.approx(0.5)


def test_check_command_runs_end_to_end_in_the_emulator():
    out = subprocess.run(
        [sys.executable, "-m", "spio", "check", "--device", "cpu", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" PASS ") == 6
    assert "all 6 pass/dtype checks passed" in out.stdout


@pytest.mark.skipif(gpu_available(), reason="a GPU is present")
def test_check_on_cuda_without_gpu_exits_with_message():
    out = subprocess.run(
        [sys.executable, "-m", "spio", "check", "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert out.returncode == 2
    assert "needs a CUDA GPU" in out.stderr


@pytest.mark.cuda
def test_check_passes_on_the_gpu():
    lines = []
    results = check.run_check("cuda", check.GPU_LAYERS[-3:], extra_configs=1, report=lines.append)
    assert all(r.passed for r in results), "\n".join(lines)


@pytest.mark.parametrize(
    "setting,said",
    [("CXX", "needs a host C++ compiler"), ("SPIO_CUDA_INCLUDE", "holds no cuda_fp16.h")],
)
def test_check_reports_a_broken_toolchain_as_one_setup_error(setting, said, tmp_path):
    """When no kernel builds, one setup error (exit 2), not six "inf of tolerance" FAIL lines."""
    out = subprocess.run(
        [sys.executable, "-m", "spio", "check", "--device", "cpu", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, SPIO_CACHE_DIR=str(tmp_path), **{setting: "/nonexistent"}),
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "spio check: setup error: none of the 13 kernels could be built" in out.stderr
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
