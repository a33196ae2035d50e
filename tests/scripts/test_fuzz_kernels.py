"""scripts/fuzz_kernels.py: its cases are reproducible from (seed, index), valid and varied; it
runs them in the emulator; a wrong result, an error and an unfit tensor-copy build are each
reported as such, and a failure's line reproduces it."""

import os
import re
from collections import Counter

import pytest

import spio.reference
from tests.conftest import load_script

fuzz = load_script("fuzz_kernels")


def test_cases_reproduce_from_seed_and_index():
    assert fuzz.draw_case(3, 41) == fuzz.draw_case(3, 41)
    assert fuzz.draw_case(3, 41) != fuzz.draw_case(3, 42)
    assert fuzz.draw_case(3, 41) != fuzz.draw_case(4, 41)


def test_cases_are_valid_and_reach_every_variant():
    from spio.kernels.families import FAMILY_OF_PASS

    seen: Counter = Counter()
    for index in range(300):
        case = fuzz.draw_case(0, index)
        p = case.params
        assert p.p >= 1 and p.q >= 1, case.line()  # a non-empty output
        assert case.config in FAMILY_OF_PASS[case.pass_].configs(p), case.line()
        assert not case.tma or case.swizzled  # as make_kernel implies it
        assert not case.tma_stores or (case.tma and case.pass_ != "wgrad")
        seen.update([case.pass_, p.dtype, f"r{p.r}", f"s{p.s}"])
        seen.update(
            name for name in ("held", "swizzled", "tma", "tma_stores") if getattr(case, name)
        )
        seen["bias"] += p.has_bias
        block_n = getattr(case.config, "block_n", 1)
        seen["images a block"] += block_n > 1
        seen["whole blocks of 16 images"] += block_n == 16 and p.n % 16 == 0
        negative = p.padding[0] > p.r - 1 or p.padding[1] > p.s - 1  # DGrad pads by R-1-pad
        seen["negative dgrad padding"] += case.pass_ == "dgrad" and negative
        if case.pass_ == "wgrad":
            seen["partials" if case.partials else "atomic"] += 1
    expected = ["fprop", "dgrad", "wgrad", "fp16", "bf16", "held", "swizzled", "tma"]
    expected += ["tma_stores", "bias", "images a block", "whole blocks of 16 images"]
    expected += ["negative dgrad padding"]
    expected += ["partials", "atomic"]
    expected += [f"{axis}{k}" for axis in "rs" for k in range(1, 6)]
    assert all(seen[name] for name in expected), seen


def test_cases_pass_in_the_emulator(monkeypatch, capsys):
    assert fuzz.main(["--seed", "0", "--cases", "3"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^case \d+: pass in ", out, re.MULTILINE)) == 3, out
    assert "3 passed, 0 failed, 0 did not fit (seed 0, emulator)" in out


def test_a_wrong_result_fails_with_the_line_that_reproduces_it(monkeypatch, capsys):
    """The references moved by 1: every kernel's result is then wrong by far more than the
    tolerance, and the run says so (exit 1), with the command for each failed case."""
    for name in ("conv2d_gw8_fprop_ref", "conv2d_gw8_dgrad_ref", "conv2d_gw8_wgrad_ref"):
        real = getattr(spio.reference, name)
        monkeypatch.setattr(spio.reference, name, lambda *a, real=real, **k: real(*a, **k) + 1)
    assert fuzz.main(["--seed", "5", "--first", "7", "--cases", "2"]) == 1
    out = capsys.readouterr().out
    assert "0 passed, 2 failed, 0 did not fit (seed 5, emulator)" in out
    for index in (7, 8):
        line = fuzz.draw_case(5, index).line()
        assert f"failed: python scripts/fuzz_kernels.py --seed 5 --case {index}: {line}" in out


def test_an_error_is_a_failure_and_the_run_goes_on(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("emulated fault")

    monkeypatch.setattr("spio.check.run_one", broken)
    assert fuzz.main(["--cases", "2"]) == 1
    out = capsys.readouterr().out
    assert out.count("RuntimeError: emulated fault") == 2, out


def test_a_tensor_copy_build_that_does_not_fit_is_counted_apart(monkeypatch, capsys):
    case = next(c for c in map(lambda i: fuzz.draw_case(0, i), range(100)) if c.tma)
    index = case.index

    def refuse(*args, **kwargs):
        raise ValueError("needs 300000 bytes of shared memory with tma=True, more than ...")

    for module in ("conv2d_gw8_factory", "conv2d_gw8_wgrad_factory"):
        monkeypatch.setattr(f"spio.kernels.{module}.make_kernel", refuse)
    assert fuzz.main(["--seed", "0", "--case", str(index)]) == 0
    assert "0 passed, 0 failed, 1 did not fit" in capsys.readouterr().out
    # Without tensor copies the same refusal is an error, not a skip.
    plain = next(c for c in map(lambda i: fuzz.draw_case(0, i), range(100)) if not c.tma)
    with pytest.raises(ValueError, match="shared memory"):
        fuzz.build(plain)


def test_each_case_runs_in_its_own_order_and_shared_memory_offset(monkeypatch):
    """The emulator's settings for a case's launches are the case's (read at each launch), and
    the caller's come back afterwards."""
    monkeypatch.setenv("SPIO_EMULATOR_ORDER_SEED", "1")
    monkeypatch.delenv("SPIO_EMULATOR_SHARED_OFFSET", raising=False)
    seen = []

    def run_one(*args, **kwargs):
        seen.append((os.environ["SPIO_EMULATOR_ORDER_SEED"],
                     os.environ["SPIO_EMULATOR_SHARED_OFFSET"]))  # fmt: skip
        return 0.5

    monkeypatch.setattr("spio.check.run_one", run_one)
    cases = [fuzz.draw_case(0, i) for i in range(2)]
    for case in cases:
        assert fuzz.run_case(case)[0] == "pass"
    assert seen == [(str(c.order_seed), str(c.shared_offset)) for c in cases]
    assert all(c.shared_offset % 16 == 0 and 0 <= c.shared_offset < 1024 for c in cases)
    assert cases[0].order_seed != cases[1].order_seed
    assert os.environ["SPIO_EMULATOR_ORDER_SEED"] == "1"
    assert "SPIO_EMULATOR_SHARED_OFFSET" not in os.environ


@pytest.mark.slow
def test_a_fuzz_sweep_passes(capsys):
    """`pytest -m slow`'s share of the fuzzing: 300 drawn cases of a seed of their own (about
    three minutes on one core), every one within its tolerance."""
    code = fuzz.main(["--seed", "63", "--cases", "300"])
    out = capsys.readouterr().out
    assert code == 0, "\n".join(line for line in out.splitlines() if "fail" in line)
    summary = r"^\d+ passed, 0 failed, \d+ did not fit \(seed 63, emulator\)$"
    assert re.search(summary, out, re.MULTILINE)


def _case(**wanted):
    """The first case of seed 0 with the attributes `wanted` (pass_ among them)."""
    for index in range(500):
        case = fuzz.draw_case(0, index)
        if all(getattr(case, name) == value for name, value in wanted.items()):
            return case
    raise AssertionError(f"no case with {wanted} among 500")


@pytest.mark.parametrize(
    "wanted",
    [
        {"pass_": "fprop", "held": True, "tma": False},
        {"pass_": "dgrad", "held": True, "tma": True},
        {"pass_": "wgrad", "held": True, "partials": True},
        {"pass_": "wgrad", "held": False, "partials": False},
    ],
)
def test_the_kernels_built_ahead_are_those_the_run_launches(monkeypatch, wanted):
    """prebuild builds each case's kernel as run_one launches it (a held FProp/DGrad's variant
    reading channels_last weights and a half bias) and WGrad's sum_slots kernels, so the runs
    build nothing more."""
    from spio.kernels import kernel as kernel_module
    from spio.kernels.kernel import Kernel

    case = _case(**wanted)
    built, launched = [], []
    real_build, real_launch = kernel_module.build_kernels, Kernel.launch

    def build_kernels(kernels, device, progress=True):
        built.extend(k.name for k in kernels)
        return real_build(kernels, device, progress)

    def launch(self, args, device):
        launched.append(self.name)
        return real_launch(self, args, device)

    monkeypatch.setattr(kernel_module, "build_kernels", build_kernels)
    monkeypatch.setattr(Kernel, "launch", launch)
    fuzz.prebuild([case], "cpu", None)
    assert fuzz.run_case(case)[0] == "pass"
    assert launched and set(launched) <= set(built), (launched, built)


def test_tensor_copies_on_a_gpu_without_them_do_not_fit():
    case = _case(tma=True)
    assert fuzz.build(case, "sm_80") is None and fuzz.build(case, "sm_90") is not None
    assert fuzz.run_case(case, "cpu", "sm_86") == ("unfit", "no tensor copies on sm_86")


def test_a_lost_gpu_ends_the_run_with_where_to_go_on(monkeypatch, capsys):
    """After a sticky CUDA error every later run would fail with it: the run stops there, says
    where to go on from, and fails."""
    outcomes = iter([("pass", "0.4 of the tolerance"), ("lost", "illegal address")])
    monkeypatch.setattr(fuzz, "prebuild", lambda cases, device, arch: None)
    monkeypatch.setattr(fuzz, "run_case", lambda case, device, arch: next(outcomes))
    assert fuzz.main(["--seed", "2", "--first", "10", "--cases", "5"]) == 1
    out = capsys.readouterr().out
    assert "go on with --first 12" in out
    assert "1 passed, 1 failed, 0 did not fit (seed 2, emulator)" in out
    assert "failed: python scripts/fuzz_kernels.py --seed 2 --case 11" in out


@pytest.mark.cuda
def test_fuzz_cases_pass_on_the_gpu(capsys):
    """A dozen drawn cases on the GPU (the tensor-copy ones on sm_90), each within its
    tolerance: the gpu_check tests step's share of the fuzzing, where its opt-in step is not run."""
    code = fuzz.main(["--device", "cuda", "--seed", "7", "--cases", "12"])
    out = capsys.readouterr().out
    assert code == 0, "\n".join(line for line in out.splitlines() if "fail" in line)
    assert re.search(r"^\d+ passed, 0 failed, \d+ did not fit \(seed 7, sm_\d+a?\)$", out, re.M)
