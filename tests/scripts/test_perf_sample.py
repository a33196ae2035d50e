"""scripts/perf_sample.py on a GPU standing in on the CPU: its arguments, and its exit status
when kernels fail to build (nothing is launched)."""

import sys
import types

import pytest

from tests.conftest import load_script

perf_sample = load_script("perf_sample")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--batches", "0"], "argument --batches: needs a positive integer, got '0'"),
        (["--dtypes", "fp32"], "argument --dtypes: invalid choice: 'fp32'"),
        (["--max-configs", "-1"], "argument --max-configs: needs an integer >= 0, got '-1'"),
        (["--layers", "-1"], "argument --layers: needs an integer >= 0, got '-1'"),
        (["--repeats", "0"], "argument --repeats: needs a positive integer, got '0'"),
        (["--round", "-2"], "argument --round: needs an integer >= 0, got '-2'"),
    ],
)
def test_bad_sweep_arguments_are_usage_errors(argv, message, capsys):
    """They were tracebacks after the GPU was set up (--batches 0, --dtypes fp32,
    --max-configs -1), or a silently shorter sweep (--layers -1, a Python slice)."""
    with pytest.raises(SystemExit) as info:
        perf_sample.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_rounds_take_a_few_configs_of_each_layer_in_turn():
    work = [("f", "a", [1, 2, 3, 4, 5]), ("f", "b", [6]), ("g", "c", [7, 8, 9])]
    assert perf_sample.in_rounds(work, 2) == [
        ("f", "a", [1, 2]),
        ("f", "b", [6]),
        ("g", "c", [7, 8]),
        ("f", "a", [3, 4]),
        ("g", "c", [9]),
        ("f", "a", [5]),
    ]
    assert perf_sample.in_rounds(work, 0) == work and perf_sample.in_rounds(work, 9) == work
    assert perf_sample.in_rounds([], 3) == []


@pytest.mark.parametrize("round_size,calls", [("0", [4]), ("3", [3, 1])])
def test_a_sweep_whose_kernels_fail_to_build_exits_1(
    round_size, calls, monkeypatch, tmp_path, capsys
):
    """Every compile failing measured nothing, yet exited 0: gpu_check's perf step looked
    successful. (The layer's kernels compile in one call, or with --round in one a round.)"""
    import torch

    import spio.compiler
    import spio.cuda
    from spio.kernels import autotune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    attributes = {"name": "Fake H200", "arch": "sm_90", "sm_count": 132, "l2_cache_bytes": 1 << 20}
    fake_driver = types.SimpleNamespace(
        device_attributes=lambda ordinal: attributes, driver_version=lambda: (13, 0)
    )
    monkeypatch.setattr(spio.cuda, "driver", fake_driver, raising=False)
    monkeypatch.setitem(sys.modules, "spio.cuda.driver", fake_driver)
    compiled = []  # jobs a call

    def compile_many(jobs, **k):
        compiled.append(len(jobs))
        return [RuntimeError("no build")] * len(jobs)

    monkeypatch.setattr(spio.compiler, "compile_many", compile_many)
    monkeypatch.setattr(autotune, "input_copies", lambda *a: 1)
    monkeypatch.setattr(autotune, "kernel_inputs", lambda *a: [])  # no CUDA tensors here
    argv = ["--csv", str(tmp_path / "samples.csv"), "--layers", "1", "--batches", "32",
            "--dtypes", "fp16", "--families", "conv2d_gw8_fprop", "--max-configs", "2",
            "--round", round_size]  # fmt: skip
    assert perf_sample.main(argv) == 1
    assert compiled == calls  # 2 drawn, the heuristic's pick and the model's
    out = capsys.readouterr()
    assert "perf_sample: measured 0, failed " in out.out and "did not compile: no build" in out.err
