"""scripts/fuzz_layers.py: its cases are reproducible from (seed, index), valid and varied; they
pass through the emulated layer path; a wrong output or gradient, or an error, is a failure with
the command that reruns it."""

import os
import re
from collections import Counter

import pytest

from spio.functional import _kernels
from tests.conftest import load_script

fuzz = load_script("fuzz_layers")


def test_cases_reproduce_from_seed_and_index():
    assert fuzz.draw_case(3, 41) == fuzz.draw_case(3, 41)
    assert fuzz.draw_case(3, 41) != fuzz.draw_case(3, 42)


def test_cases_are_valid_and_reach_every_setting():
    seen: Counter = Counter()
    for index in range(300):
        case = fuzz.draw_case(0, index)
        assert case.params.p >= 1 and case.params.q >= 1
        assert any(case.grads) and (case.params.has_bias or not case.grads[2])
        assert case.setting != "half, fp32 bias" or case.params.has_bias
        assert not case.unbatched or (case.module and case.params.n == 1)
        seen.update([case.setting, f"x {case.x_layout}", f"w {case.w_layout}",
                     f"dy {case.dy_layout}", f"passes {case.passes}"])  # fmt: skip
        seen["module"] += case.module
        seen["function"] += not case.module
        seen["3-D"] += case.unbatched
    expected = [*fuzz.SETTINGS, "module", "function", "3-D"]
    expected += [f"{t} {layout}" for t in ("x", "dy") for layout in fuzz.LAYOUTS]
    expected += ["w contiguous", "w channels_last"] + [f"passes {p}" for p in range(1, 8)]
    assert all(seen[name] for name in expected), seen


def test_cases_pass_in_the_emulator(capsys):
    assert fuzz.main(["--seed", "0", "--cases", "4"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^case \d+: pass in ", out, re.MULTILINE)) == 4, out
    assert "4 passed, 0 failed (seed 0, cpu)" in out


def _first(**wanted):
    return next(
        case
        for case in map(lambda i: fuzz.draw_case(0, i), range(300))
        if all(getattr(case, name) == value for name, value in wanted.items())
    )


@pytest.mark.parametrize("kernel, result", [("fprop", "y"), ("dgrad", "dx")])
def test_a_wrong_result_fails_with_the_line_that_reproduces_it(monkeypatch, capsys, kernel, result):
    """spio's FProp (or DGrad) kernel wrapper made to add 1: a case that runs it fails, naming
    the result, and the run says so with the command for the case."""
    case = _first(passes=7, grads=(True, True, False))
    real = getattr(_kernels.Layer, kernel)
    monkeypatch.setattr(_kernels.Layer, kernel, lambda *a, **k: real(*a, **k) + 1)
    assert fuzz.main(["--seed", "0", "--case", str(case.index)]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"case {case.index}: fail .*{result} [\d.e+]+ times its tolerance", out)
    assert f"failed: python scripts/fuzz_layers.py --seed 0 --case {case.index}: " in out


def test_an_error_is_a_failure_and_the_run_goes_on(monkeypatch, capsys):
    def broken(case, device):
        raise RuntimeError("a fault")

    monkeypatch.setattr(fuzz, "check_case", broken)
    assert fuzz.main(["--cases", "2"]) == 1
    assert capsys.readouterr().out.count("RuntimeError: a fault") == 2


@pytest.mark.slow
def test_a_fuzz_sweep_passes(capsys):
    """`pytest -m slow`'s share: 150 drawn cases of a seed of their own."""
    code = fuzz.main(["--seed", "63", "--cases", "150"])
    out = capsys.readouterr().out
    assert code == 0, "\n".join(line for line in out.splitlines() if "fail" in line)
    assert "150 passed, 0 failed (seed 63, cpu)" in out


@pytest.mark.cuda
def test_fuzz_cases_pass_on_the_gpu(capsys):
    code = fuzz.main(["--device", "cuda", "--seed", "7", "--cases", "12"])
    out = capsys.readouterr().out
    assert code == 0, "\n".join(line for line in out.splitlines() if "fail" in line)


def test_the_emulator_setting_is_the_callers_again_after_a_run(monkeypatch):
    monkeypatch.delenv("SPIO_EMULATE", raising=False)
    seen = []
    monkeypatch.setattr(fuzz, "check_case", lambda case, device: seen.append(
        os.environ.get("SPIO_EMULATE")) or ([], {"y": 0.5}))  # fmt: skip
    assert fuzz.main(["--cases", "1"]) == 0
    assert seen == ["1"] and "SPIO_EMULATE" not in os.environ


def test_an_output_in_another_memory_format_than_f_conv2d_gives_fails(monkeypatch, capsys):
    """spio's output laid out contiguous whatever its operands: a channels_last case fails."""
    from spio.functional import eager

    case = _first(x_layout="channels_last", passes=7, unbatched=False)
    monkeypatch.setattr(eager, "in_format", lambda t, fmt: t.contiguous())
    assert fuzz.main(["--seed", "0", "--case", str(case.index)]) == 1
    assert "y is not channels_last where F.conv2d's is" in capsys.readouterr().out
