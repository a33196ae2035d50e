"""spio.args: option values a usage error names, for `python -m spio` and the scripts."""

import argparse
import sys

import pytest

from spio.args import non_negative_float, positive_float, positive_int, unit_fraction
from tests.conftest import REPO


@pytest.mark.parametrize(
    "kind, good, bad",
    [
        (positive_int, {"1": 1, "12": 12}, ["0", "-3", "1.5", "x", ""]),
        (unit_fraction, {"1": 1.0, "0.25": 0.25, "1e-3": 0.001}, ["0", "-0.1", "1.01", "nan", "x"]),
        (non_negative_float, {"0": 0.0, "2.5": 2.5}, ["-1", "-0.001", "nan", "x"]),
        (positive_float, {"0.5": 0.5, "90": 90.0}, ["0", "-1", "nan", "inf", "x"]),
    ],
)
def test_values_are_taken_or_named(kind, good, bad):
    for text, value in good.items():
        assert kind(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=f"got {text!r}"):
            kind(text)


def test_a_script_option_refuses_a_value_that_would_train_a_constant_model(capsys):
    """train_perf_model.py took --trees 0 or --eta 0 and wrote models that predict a constant
    (into the shipped models' folder by default); XGBoost refused --depth -1 with a traceback."""
    from tests.conftest import load_script

    script = load_script("train_perf_model")
    for option in (["--trees", "0"], ["--eta", "0"], ["--subsample", "2"], ["--depth", "-1"]):
        with pytest.raises(SystemExit) as stop:
            script.main(["unused.csv", *option])
        assert stop.value.code == 2
        assert f"argument {option[0]}: needs" in capsys.readouterr().err


def test_run_script_exits_with_mains_status_and_ctrl_c_is_one_line(monkeypatch, capsys):
    """The scripts ended a Ctrl-C in a KeyboardInterrupt traceback; now one line and exit 130,
    as `spio`'s commands."""
    from spio.args import run_script

    monkeypatch.setattr(sys, "argv", ["scripts/perf_sample.py", "--budget-s", "60"])
    for status in (0, 2, None):
        with pytest.raises(SystemExit) as exited:
            run_script(lambda status=status: status)
        assert exited.value.code == status

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exited:
        run_script(interrupted)
    assert exited.value.code == 130
    assert capsys.readouterr().err == "\nperf_sample: interrupted\n"


def test_every_script_exits_through_run_script():
    scripts = sorted((REPO / "scripts").glob("*.py"))
    assert len(scripts) >= 10
    for script in scripts:
        text = script.read_text()
        assert 'if __name__ == "__main__":\n    run_script(main)\n' in text, script.name
