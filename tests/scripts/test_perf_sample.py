"""scripts/perf_sample.py on a GPU standing in on the CPU: its arguments, and its exit status
when kernels fail to build (nothing is launched)."""

import sys
import types

import pytest

from tests.conftest import load_script, without_tensor_copies

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


@pytest.fixture
def failing_builds(monkeypatch):
    """perf_sample on a stand-in GPU (no CUDA tensors, no timing) whose every compile fails:
    the names of each compile_many call's jobs, a list a call."""
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
    compiled: list[list[str]] = []

    def compile_many(jobs, **k):
        compiled.append([job.name.removesuffix(".cu") for job in jobs])
        return [RuntimeError("no build")] * len(jobs)

    monkeypatch.setattr(spio.compiler, "compile_many", compile_many)
    monkeypatch.setattr(autotune, "input_copies", lambda *a: 1)
    monkeypatch.setattr(autotune, "kernel_inputs", lambda *a: [])  # no CUDA tensors here
    return compiled


def sweep_args(tmp_path, family: str, round_size: str = "0") -> list[str]:
    return ["--csv", str(tmp_path / "samples.csv"), "--layers", "1", "--batches", "32",
            "--dtypes", "fp16", "--families", family, "--max-configs", "2",
            "--round", round_size]  # fmt: skip


@pytest.mark.parametrize("round_size,calls", [("0", [4]), ("3", [3, 1])])
def test_a_sweep_whose_kernels_fail_to_build_exits_1(
    round_size, calls, failing_builds, tmp_path, capsys
):
    """Every compile failing measured nothing, yet exited 0: gpu_check's perf step looked
    successful. (The layer's kernels compile in one call, or with --round in one a round.)"""
    assert perf_sample.main(sweep_args(tmp_path, "conv2d_gw8_fprop", round_size)) == 1
    # 2 drawn, the heuristic's pick and the model's
    assert [len(names) for names in failing_builds] == calls
    out = capsys.readouterr()
    assert "perf_sample: measured 0, failed " in out.out and "did not compile: no build" in out.err


def test_a_wgrad_sweep_builds_each_partials_kernels_sum_with_it(failing_builds, tmp_path):
    """The sum_slots kernel that a partials WGrad's timed call runs is built in the same
    compile_many call as the layer's kernels, not at the first timing."""
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
    from spio.kernels.conv2d_gw8_wgrad_factory import sum_kernel

    assert perf_sample.main(sweep_args(tmp_path, "conv2d_gw8_wgrad")) == 1
    (names,) = failing_builds
    partials = [n for n in names if without_tensor_copies(n).endswith("__partials")]
    assert partials, names  # (the first bench layer's picks use partial sums)
    sums = [n for n in names if n.startswith("sum_slots")]
    layer = Conv2dGw8Params.decode("n1_" + partials[0].split("__")[1])  # (its name's layer)
    assert sums == [sum_kernel(layer).name]


@pytest.mark.parametrize("setting", ["off", "loads", "loads+stores"])
def test_a_sweep_times_and_names_the_tensor_copies_spio_runs(
    setting, failing_builds, tmp_path, monkeypatch
):
    """On an sm_90 GPU with SPIO_TMA set, the kernels timed are those spio runs there (their rows
    by tensor copies), and each row's variant says so; a resumed sweep under another setting
    times the configs again, as other variants."""
    import spio.compiler
    from spio.kernels import autotune
    from spio.kernels.perf_samples import read_samples

    timed: list[str] = []
    # The fixture's stand-in GPU, its compiles made to succeed and its timings faked.
    monkeypatch.setattr(spio.compiler, "compile_many", lambda jobs, **k: [None] * len(jobs))

    def time_kernel(family, params, kernel, arg_sets, device, **k):
        timed.append(kernel.name)
        return 1e-5

    monkeypatch.setattr(autotune, "time_kernel", time_kernel)
    suffix, variant = {"off": ("", ""), "loads": ("__tma", "tma"),
                       "loads+stores": ("__tmaio", "tma-stores")}[setting]  # fmt: skip
    monkeypatch.setenv("SPIO_TMA", setting)
    assert perf_sample.main(sweep_args(tmp_path, "conv2d_gw8_fprop")) == 0
    assert len(timed) == 4 and all(name.endswith(suffix) for name in timed), timed
    if setting == "off":
        assert not any("__tma" in name for name in timed)
    samples = read_samples(tmp_path / "samples.csv")[0]
    assert [s.variant for s in samples] == [variant] * 4
    # The other setting's kernels are other samples: timed again, not skipped.
    monkeypatch.setenv("SPIO_TMA", "off" if setting != "off" else "loads")
    timed.clear()
    assert perf_sample.main(sweep_args(tmp_path, "conv2d_gw8_fprop")) == 0
    assert len(timed) == 4
    assert len(read_samples(tmp_path / "samples.csv")[0]) == 8
