"""scripts/bench_op_overhead.py's --profile report, on the CPU: it names the PyTorch ops a call
dispatches, with their count per call, and the Python functions that cost the most."""

import pytest
import torch

from tests.conftest import load_script

bench_op_overhead = load_script("bench_op_overhead")


def test_profile_host_reports_ops_per_call_and_python_functions(capsys):
    x = torch.ones(4)

    def call():
        torch.add(x, x)
        torch.mul(x, x)
        torch.mul(x, x)

    bench_op_overhead.profile_host("toy", call, calls=20, sync=lambda: None)
    out = capsys.readouterr().out
    ops = {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if "aten::" in line}
    assert ops["aten::mul"] == 2.0 and ops["aten::add"] == 1.0, out
    assert "toy: Python functions by own time" in out and "call" in out


def test_profile_host_lists_the_costliest_ops_first(capsys):
    a, x = torch.ones(256, 256), torch.ones(4)

    def call():
        torch.mm(a, a)
        torch.add(x, x)

    bench_op_overhead.profile_host("toy", call, calls=20, sync=lambda: None, rows=1)
    ops = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "aten::" in line]
    assert ops[:1] == ["aten::mm"], ops


def test_channels_not_a_positive_multiple_of_8_is_a_usage_error(capsys):
    """--channels 12 or 0 were tracebacks from the layer after the GPU was set up."""
    for value, needs in (("12", "a positive multiple of 8"), ("0", "a positive integer")):
        with pytest.raises(SystemExit) as info:
            bench_op_overhead.main(["--channels", value])
        assert info.value.code == 2
        said = f"argument --channels: needs {needs}, got '{value}'"
        assert said in capsys.readouterr().err
