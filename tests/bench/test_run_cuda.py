"""The benchmark machinery on a real GPU: event timing, one small sweep, in-situ profiling, and
the sanitizer launch script. Sanity bounds only; performance numbers come from `spio bench`."""

import math
import re

import pytest

from spio.bench.layers import BenchLayer

pytestmark = pytest.mark.cuda

SMALL = BenchLayer("small_64c_16x16_3x3", 64, 16, 16)


def test_event_timing_measures_gpu_time_not_launch_overhead():
    import torch

    from spio.bench.timing import SpinCalibration, time_calls

    cycles = SpinCalibration.cycles(50e-6)  # a 50 µs spin per call
    timing = time_calls(lambda i: torch.cuda._sleep(cycles), warmup=3, reps=60)
    assert timing.prefilled
    assert 0.03 < timing.median_ms < 0.1, timing
    assert timing.p10_ms <= timing.median_ms <= timing.p90_ms


def test_small_sweep_times_every_pass_and_impl(tmp_path):
    from spio.bench.results import compare, read_csv, write_csv
    from spio.bench.run import BenchSettings, run_bench

    settings = BenchSettings(layers=(SMALL,), batch_sizes=(4,), warmup=2, reps=10)
    rows = run_bench(settings, "pytest")
    assert {(r.pass_, r.impl) for r in rows} == {
        (p, i) for p in ("fprop", "dgrad", "wgrad") for i in ("spio", "torch", "copy")
    }
    for row in rows:
        assert row.median_ms > 0 and 1 < row.gbps < 50_000, row
        assert row.p10_ms <= row.median_ms <= row.p90_ms
        assert row.gpu and row.driver and row.spio and row.rotation_sets >= 1
    assert all(c.speedup is not None for c in compare(rows))
    assert read_csv(write_csv(rows, tmp_path / "b.csv")) == rows


def test_in_situ_profiles_each_pass_of_both_impls():
    from spio.bench.insitu import format_insitu_table, run_insitu
    from spio.bench.run import run_info

    rows = run_insitu([SMALL], n=4, dtype="bf16", info=run_info("pytest"), depth=2, warmup=2,
                      steps=3)  # fmt: skip
    assert len(rows) == 2 * 2 * 3  # styles x impls x passes
    for row in rows:
        assert row.calls == 2 * 3, row  # depth x steps
        assert row.event_us_per_call > 0, row  # CUDA events bracket every pass
        if not math.isnan(row.us_per_call):  # the profiler attributed kernels to the pass
            assert row.us_per_call > 0 and row.kernels, row
        elif row.impl == "spio":  # not linked to the range (pytorch#144778), but seen
            assert row.kernels.startswith("not attributed") and "spio_conv2d_gw8" in row.kernels
    data = format_insitu_table(rows).splitlines()[2:8]  # 2 styles x 3 passes
    assert len(data) == 6, data
    for line in data:  # a speedup in every row; "*" where one side is an event time, one not
        cells = line.split()
        spio_cell, torch_cell, speedup = cells[4], cells[5], cells[6]
        assert re.fullmatch(r"\d+\.\d\dx\*?", speedup), line
        assert speedup.endswith("*") == (
            spio_cell.startswith("(e)") != torch_cell.startswith("(e)")
        ), line


def test_sanitizer_launches_pass_without_the_sanitizer():
    from spio.bench import sanitize

    assert sanitize.main() == 0


def test_bench_cli_times_a_layer_given_as_a_shape(tmp_path):
    """`spio bench --layer` with an odd shape and padding off R//2: exit 0, and the CSV holds a
    timed row for every pass and impl, named after the shape."""
    from spio.__main__ import main
    from spio.bench.results import read_csv

    status = main(["bench", "--layer", "24,9,13,3,5,0,1", "--batch-sizes", "3", "--quick",
                   "--out", str(tmp_path)])  # fmt: skip
    assert status == 0
    rows = read_csv(tmp_path / "bench_fp16.csv")
    assert {r.layer for r in rows} == {"24c_9x13_3x5_pad0x1"}
    assert len(rows) == 9 and all(r.median_ms > 0 for r in rows)
