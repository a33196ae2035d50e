"""scripts/compare_runs.py on the H200 runs recorded in docs/perf (runs 7 and 8): the numbers it
reads out are those the record quotes (docs/perf/2026-12-04-h200.md, computed there by each
run's derived.py), and on hand-written files it keys, pairs and refuses as it says."""

import pytest

from tests.conftest import REPO, load_script

compare = load_script("compare_runs")

RUNS = REPO / "docs/perf/2026-12-04-h200"
RUN7, RUN8 = RUNS / "run7", RUNS / "run8"


def _row(text: str, *first: str) -> list[str]:
    """The cells of the Markdown table row of `text` whose first cells are `first`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[: len(first)] == list(first):
            return cells
    raise AssertionError(f"no row starting {first}")


def test_the_headline_is_run_7s_record():
    # Run 7 (the record of the kernels): FProp 52.8 µs, 72 % of copy, 2.55×; DGrad 52.8, 73 %,
    # 2.52×; WGrad 84.2, 45 %, 1.12×; none at the targets.
    text = compare.bench_report(compare.read_bench(RUN7 / "bench/bench_fp16.csv"), None)
    assert _row(text, "fprop")[1:5] == [
        "52.8",
        "72 %",
        "2.55×",
        "not met: 71.89 % < 90 %, 2.551× < 3×",
    ]
    assert _row(text, "dgrad")[1:4] == ["52.8", "73 %", "2.52×"]
    assert _row(text, "wgrad")[1:4] == ["84.2", "45 %", "1.12×"]


def test_run_8_against_run_7_as_its_derived_numbers():
    # run8/derived.py: FProp 52.4 (run 7 52.8), -0.7 %; speedups median 1.58, min 0.54 (run 7:
    # 1.59, 0.59); 8 losses (run 7: 6); the 64c N=32 WGrad +11.3 %.
    new = compare.read_bench(RUN8 / "bench/bench_fp16.csv")
    old = compare.read_bench(RUN7 / "bench/bench_fp16.csv")
    text = compare.bench_report(new, old)
    row = _row(text, "fprop")
    assert row[1:4] + row[5:] == ["52.4", "72 %", "2.56×", "52.8", "72 %", "2.55", "-0.7 %"]
    assert _row(text, "64c_64x64_3x3", "32", "wgrad")[3:8] == [
        "32.0", "47 %", "1.22", "28.8", "+11.3 %"
    ]  # fmt: skip
    assert "- new: speedup over cuDNN median 1.58×, min 0.54×, max 5.36× over 60 cases; " \
        "spio slower in 8: 368c_7x7_3x3 N=32 wgrad 0.54×" in text  # fmt: skip
    assert "- old: speedup over cuDNN median 1.59×, min 0.59×, max 6.01× over 60 cases; " \
        "spio slower in 6" in text  # fmt: skip


def test_a_case_at_both_targets_is_met_and_missing_rows_leave_blanks(tmp_path):
    header = "layer,n,pass,impl,median_ms,config\n"
    rows = [
        "64c_64x64_3x3,128,fprop,spio,0.010,g1",
        "64c_64x64_3x3,128,fprop,torch,0.031,",
        "64c_64x64_3x3,128,fprop,copy,0.009,",
        "64c_64x64_3x3,128,dgrad,spio,0.010,g2",  # no cuDNN, no copy
        "64c_64x64_3x3,128,wgrad,spio,0.010,g3",  # rounds onto both targets, reaches neither
        "64c_64x64_3x3,128,wgrad,torch,0.02996,",
        "64c_64x64_3x3,128,wgrad,copy,0.00896,",
    ]
    path = tmp_path / "bench_fp16.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    text = compare.bench_report(compare.read_bench(path), None)
    assert _row(text, "fprop")[1:5] == ["10.0", "90 %", "3.10×", "met"]
    assert _row(text, "dgrad")[1:5] == ["10.0", "", "", "not met: no copy time"]
    # Shown rounded as 90 % and 3.00×, its targets cell says what falls short.
    assert _row(text, "wgrad")[1:5] == [
        "10.0", "90 %", "3.00×", "not met: 89.60 % < 90 %, 2.996× < 3×"
    ]  # fmt: skip


def test_a_csv_that_is_not_spio_benchs_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a spio bench CSV"):
        compare.read_bench(path)
    (tmp_path / "empty.csv").write_text("layer,n,pass,impl,median_ms\n")
    with pytest.raises(ValueError, match="no rows"):
        compare.read_bench(tmp_path / "empty.csv")


def test_ablate_rows_are_keyed_by_their_config_the_wrappers_by_the_one_above():
    # Run 7's ablate.log times two WGrad configs in one section, each followed by its whole
    # wrappers (docs/perf/2026-12-04-h200.md: 81.7, ldg 94.0; 83.5, ldg 110.4; partials+sum
    # 81.0 and 83.1).
    ablate = compare.read_ablate(RUN7 / "ablate.log")
    key = compare.AblateKey
    s6 = ("64c_64x64_3x3", 128, "fp16", "wgrad", "g2_p32_q64_n4_w4_s6_k8")
    s3 = ("64c_64x64_3x3", 128, "fp16", "wgrad", "g2_p32_q64_n4_w4_s3_k8")
    assert ablate.times[key(*s6, "full")] == [81.7]
    assert ablate.times[key(*s6, "partials+sum")] == [81.0]
    assert ablate.times[key(*s3, "ldg")] == [110.4]
    assert ablate.times[key(*s3, "partials+sum")] == [83.1]
    # A config timed in several sections keeps every time; the table shows their median.
    pick = ("64c_64x64_3x3", 128, "fp16", "fprop", "g8_p64_q32_w1_s4_k16")
    assert ablate.times[key(*pick, "full")] == [53.0, 52.8]
    text = compare.ablate_report(ablate, None)
    assert _row(text, *map(str, pick[:2]), "fprop", pick[4], "full")[5] == "52.9 (2×)"
    assert _row(text, *map(str, s6[:2]), "wgrad", s6[4], "ldg")[5:] == ["94.0", "1.15"]
    # copy and read belong to the pass, not a config.
    assert key(*s6[:4], "", "copy") in ablate.times


def test_ablate_against_an_older_log(tmp_path):
    new = compare.read_ablate(RUN8 / "ablate2.log")
    old = compare.read_ablate(RUN7 / "ablate.log")
    text = compare.ablate_report(new, old)
    # run 8's WGrad full 86.8 against run 7's 85.1 and 84.4 and 84.9 (median 84.9)
    row = _row(text, "64c_64x64_3x3", "128", "wgrad", "g2_p64_q32_n1_w4_s2_k16", "full")
    assert row[5:] == ["86.8", "", "84.9", "+2.2 %"]
    assert "In the old log only (" in text and "more" in text


def test_ablate_problem_lines_are_listed_and_their_rows_marked(tmp_path):
    log = tmp_path / "ablate.log"
    log.write_text(
        "NVIDIA H200 (sm_90), layer 64c_64x64_3x3 N=128 fp16\n"
        "pass   variant            µs pass GB/s  vs full  config\n"
        "fprop  full             53.0      2531     1.00  g8_p64_q32_w1_s4_k16\n"
        "fprop  tma              40.0      3355     0.75  g8_p64_q32_w1_s4_k16\n"
        "fprop  tma            WRONG results: 3 of 8 elements differ\n"
        "fprop  swizzled         50.0      2684     0.94  g8_p64_q32_w1_s4_k16\n"
        "dgrad  tma-stores     failed: CudaError: CUDA_ERROR_ILLEGAL_ADDRESS\n"
        "fprop  sum alone         1.2        10           sum\n"
    )
    ablate = compare.read_ablate(log)
    assert [p.split(": ", 1)[1] for p in ablate.problems] == [
        "fprop  tma            WRONG results: 3 of 8 elements differ",
        "dgrad  tma-stores     failed: CudaError: CUDA_ERROR_ILLEGAL_ADDRESS",
    ]
    text = compare.ablate_report(ablate, None)
    pick = ("64c_64x64_3x3", "128", "fprop", "g8_p64_q32_w1_s4_k16")
    # A timing whose results were wrong is marked on its row, not only listed below.
    assert _row(text, *pick, "tma (WRONG)")[5:] == ["40.0", "0.75"]
    assert _row(text, *pick, "swizzled")[5:] == ["50.0", "0.94"]
    assert "- 64c_64x64_3x3 N=128: fprop  tma            WRONG results" in text


def test_older_ablate_logs_copy_rows_and_the_logs_own_ratios():
    # Before the copy lines had a note ("moves ... MB"), they ended at their GB/s.
    old = compare.read_ablate(REPO / "docs/perf/2026-11-29-h200-2/ablate.log")
    copies = [t for k, times in old.times.items() if k.variant == "copy" for t in times]
    assert len(copies) == 5
    # Where a variant and its full were timed once, "vs full" is the log's own column (from
    # unrounded times): run 8's WGrad zfill, 83.6 µs, 0.96 in the log (83.6 / 86.8 rounds up).
    text = compare.ablate_report(compare.read_ablate(RUN8 / "ablate.log"), None)
    row = _row(text, "64c_64x64_3x3", "128", "wgrad", "g2_p64_q32_n1_w4_s2_k16", "zfill")
    assert row[5:] == ["83.6", "0.96"]


def test_probe_rows_are_read_by_their_description():
    probe = compare.read_probe(RUN7 / "probe.log")
    assert probe["torch: sum of fp16 (reads only)"] == (24.1, 2789)
    assert probe["cp.async depth 4, 1056 blocks x 256, 62 KiB each every 62 KiB"] == (37.1, 1807)
    text = compare.probe_report(probe, {"torch: sum of fp16 (reads only)": (20.0, 3355)})
    assert _row(text, "torch: sum of fp16 (reads only)")[1:] == ["24.1", "2789", "3355", "+20.5 %"]


def test_the_command_line(tmp_path, capsys):
    assert compare.main(["run", str(RUN8), str(RUN7)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"<!-- python scripts/compare_runs.py run {RUN8} {RUN7} -->")
    for title in ("## gpu_check summary", "## bench (bench/bench_fp16.csv)", "## ablate.log"):
        assert title in out
    assert "## probe.log" not in out  # run 8 did not run the probe step
    assert compare.main(["run", str(tmp_path)]) == 2
    assert "no summary.txt, bench CSV" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        compare.main(["bench", str(tmp_path / "missing.csv")])
    assert stop.value.code == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.main(["bench", str(RUN7 / "bench/bench_fp16.csv"), "--headline", "64c"])
    assert "needs LAYER:N" in capsys.readouterr().err


def test_committed_runs_keep_their_bench_at_the_top_level(tmp_path):
    # docs/perf/2026-12-04-h200 (run 6) keeps bench_fp16.csv beside its logs, not in bench/.
    text = compare.run_report(RUN7, RUNS)
    bench = text[text.index("## bench (bench/bench_fp16.csv)") :]
    assert "has no bench_fp16.csv" not in bench
    # run 6's FProp, 52.8 µs, 73 %, 2.54× (docs/perf/2026-12-04-h200.md's run 6 table)
    assert _row(bench, "fprop")[5:8] == ["52.8", "73 %", "2.54"]
    alone = compare.run_report(RUN7, tmp_path)  # a folder without one
    assert f"({tmp_path} has no bench_fp16.csv: the new run alone)" in alone
    assert f"({tmp_path} has no ablate.log: the new run alone)" in alone


def test_a_copies_run_without_a_plain_bench(tmp_path):
    # GPU_CHECK_ONLY="wheels build copies" leaves bench_tma/ and copies.log, no bench/.
    (tmp_path / "bench_tma").mkdir()
    source = (RUN8 / "bench/bench_fp16.csv").read_text()
    (tmp_path / "bench_tma/bench_fp16.csv").write_text(source)
    text = compare.run_report(tmp_path, None)
    assert "## bench with tensor copies (bench_tma/bench_fp16.csv) alone" in text
    assert _row(text, "fprop")[1] == "52.4"
