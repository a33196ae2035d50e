"""Benchmark CSV round trip, the summary table, and PNG plots rendered from a CSV (no GPU).

The rows here are synthetic fixtures labelled as such, only to exercise formatting and plotting.
"""

import csv
import re

import pytest

from spio.bench.layers import layer_table
from spio.bench.results import BenchRow, compare, format_table, read_csv, runs, write_csv
from spio.kernels.stats import Conv2dStats
from tests.conftest import REPO, run_spio

FIXTURE = "FIXTURE: synthetic numbers, not a measurement"


def _rows():
    """Two layers x two batch sizes x three passes x three impls, with made-up times."""
    rows = []
    for layer in layer_table()[:2]:
        for n in (32, 64):
            params = layer.params(n)
            stats = Conv2dStats(params)
            for pass_ in ("fprop", "dgrad", "wgrad"):
                for impl, ms in (("spio", 0.1), ("torch", 0.3), ("copy", 0.08)):
                    rows.append(
                        BenchRow(
                            layer=layer.name, n=n, c=params.c, h=params.h, w=params.w,
                            r=params.r, s=params.s, pad_h=params.padding_h,
                            pad_w=params.padding_w, dtype="fp16", pass_=pass_, impl=impl,
                            bytes=stats.bytes(pass_), flops=0 if impl == "copy" else stats.flops,
                            median_ms=ms * n / 32, p10_ms=ms * n / 32, p90_ms=ms * n / 32,
                            reps=20, rotation_sets=3, config="g8_p16_q32_w1", gpu=FIXTURE,
                            driver="-", torch="-", cuda="-", spio="-", date="2000-01-01",
                            command="python -m spio bench (fixture)", timing=FIXTURE,
                        )
                    )  # fmt: skip
    return rows


def _plot_only(csv):
    """`python -m spio bench --plot-only CSV` in a fresh interpreter that sees no GPU."""
    return run_spio("bench", "--plot-only", str(csv), env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.fixture
def bench_csv(tmp_path):
    return write_csv(_rows(), tmp_path / "run" / "bench_fp16.csv")


def test_csv_round_trip_keeps_every_field(bench_csv):
    assert read_csv(bench_csv) == _rows()
    header = bench_csv.read_text().splitlines()[0].split(",")
    for column in ("gpu", "driver", "torch", "spio", "date", "command", "pass", "gbps"):
        assert column in header


def test_a_csv_from_before_selected_by_was_recorded_still_reads():
    """Run 5's CSV has no selected_by column: its rows read with it empty (plots of old runs)."""
    path = REPO / "docs/perf/2026-11-29-h200-2/run5/bench_fp16.csv"
    assert "selected_by" not in path.read_text().splitlines()[0]
    rows = read_csv(path)
    assert len(rows) == 180 and {row.selected_by for row in rows} == {""}


def test_concatenated_csvs_are_read_and_their_runs_told_apart(bench_csv, tmp_path):
    """`cat a.csv b.csv` repeats the header line; the table and plots take one run at a time."""
    import dataclasses

    later = [dataclasses.replace(row, date="2000-01-02") for row in _rows()]
    second = write_csv(later, tmp_path / "later.csv")
    both = tmp_path / "both.csv"
    both.write_text(bench_csv.read_text() + second.read_text())
    rows = read_csv(both)
    assert rows == _rows() + later
    assert [date for _, date, _ in runs(rows)] == ["2000-01-01", "2000-01-02"]
    out = _plot_only(both)
    assert out.returncode == 2 and "holds rows of 2 benchmark runs" in out.stderr
    assert "2000-01-02: python -m spio bench (fixture)" in out.stderr


def test_a_time_that_is_not_positive_is_named(tmp_path):
    """Not a ZeroDivisionError from the GB/s of a hand-edited or damaged row."""
    import csv

    path = write_csv(_rows()[:1], tmp_path / "zero.csv")
    header, row = list(csv.reader(path.open()))
    row[header.index("median_ms")] = "0"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, row])
    with pytest.raises(ValueError, match=r"zero.csv:2: median_ms must be finite and > 0, got 0"):
        read_csv(path)
    # Nor an infinite one (its row had shown inf µs at 0 GB/s, exit 0).
    row[header.index("median_ms")] = "inf"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, row])
    with pytest.raises(ValueError, match=r"zero.csv:2: median_ms must be finite and > 0, got inf"):
        read_csv(path)


@pytest.mark.parametrize("n", ["0", "-32"])
def test_a_batch_size_that_is_not_positive_is_named(tmp_path, n):
    """Not a matplotlib traceback from log-scaling a batch-size axis at n <= 0 (exit 1): the
    file, line and value, which `bench --plot-only` reports with exit 2."""
    import csv

    path = write_csv(_rows()[:2], tmp_path / "zero_n.csv")
    header, first, second = list(csv.reader(path.open()))
    second[header.index("n")] = n
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, first, second])
    with pytest.raises(ValueError, match=rf"zero_n.csv:3: n must be finite and > 0, got {n}$"):
        read_csv(path)
    out = _plot_only(path)
    assert out.returncode == 2, out.stderr
    assert "zero_n.csv:3: n must be finite and > 0" in out.stderr and "Traceback" not in out.stderr


def test_a_csv_saved_with_a_byte_order_mark_reads(bench_csv, tmp_path):
    """Excel saves "CSV UTF-8" with a byte-order mark, which became part of the first column's
    name: `missing columns ['layer']`."""
    with_bom = tmp_path / "excel.csv"
    with_bom.write_bytes(b"\xef\xbb\xbf" + bench_csv.read_bytes())
    assert read_csv(with_bom) == _rows()


@pytest.mark.parametrize("kept", [7, 27])  # cut in the numbers, or in the run's text columns
def test_a_row_cut_short_is_named(tmp_path, kept):
    """A damaged or cut-off line (fewer fields than the header): a ValueError naming the line,
    which `bench --plot-only` reports, not a TypeError from int(None), nor a row read with None
    in its text columns."""
    import csv

    path = write_csv(_rows()[:2], tmp_path / "cut.csv")
    header, first, second = list(csv.reader(path.open()))
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, first, second[:kept]])
    with pytest.raises(ValueError, match=rf"cut.csv:3: the row has {kept} of the header's"):
        read_csv(path)


def test_a_row_with_extra_fields_is_named(tmp_path):
    """A line with more fields than the header (two rows joined, a stray comma) was read, its
    extra fields dropped without a word."""
    import csv

    path = write_csv(_rows()[:2], tmp_path / "long.csv")
    header, first, second = list(csv.reader(path.open()))
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, first + second[:3], second])
    with pytest.raises(ValueError, match=rf"long.csv:2: the row has {len(header) + 3} columns"):
        read_csv(path)


@pytest.mark.parametrize(
    "column, value, said",
    [
        ("impl", "xyz", "impl must be one of spio, torch, copy, got 'xyz'"),
        ("pass", "xyz", "pass must be one of fprop, dgrad, wgrad, got 'xyz'"),
        ("dtype", "fp32", "dtype must be one of fp16, bf16, got 'fp32'"),
        ("bytes", "-1", "bytes must be >= 0, got -1"),
        ("flops", "-5", "flops must be >= 0, got -5"),
    ],
)
def test_read_csv_names_a_value_the_table_and_plots_know_nothing_of(tmp_path, column, value, said):
    """An unknown impl had made a table row of dashes, an unknown pass a plot of its own
    (bandwidth_xyz_fp16.png), and negative bytes a bandwidth of -0 GB/s, with exit 0."""
    path = write_csv(_rows()[:2], tmp_path / "edited.csv")
    header, first, second = list(csv.reader(path.open()))
    second[header.index(column)] = value
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows([header, first, second])
    with pytest.raises(ValueError, match=rf"edited.csv:3: {re.escape(said)}$"):
        read_csv(path)


def test_read_csv_rejects_other_files(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a spio benchmark CSV"):
        read_csv(other)
    with pytest.raises(FileNotFoundError):
        read_csv(tmp_path / "missing.csv")
    with pytest.raises(IsADirectoryError, match="is a folder, not a benchmark CSV"):
        read_csv(tmp_path)  # (had been "not found")


def test_table_reports_bandwidth_copy_fraction_and_speedup():
    rows = _rows()
    comparisons = compare(rows)
    assert len(comparisons) == 2 * 2 * 3
    first = comparisons[0]
    assert first.speedup == pytest.approx(3.0)
    assert first.copy_fraction("spio") == pytest.approx(0.8)
    table = format_table(rows)
    assert "speedup over PyTorch: median 3.00x" in table
    line = next(line for line in table.splitlines() if line.startswith("64c_64x64_3x3"))
    gbps = first.spio.bytes / 0.1e-3 / 1e9
    assert f"{gbps:.0f}" in line and "80%" in line and "3.00x" in line


def test_a_case_not_fully_pre_filled_is_marked_and_left_out_of_the_summary():
    """Such a timing may time the host, not the GPU: its line is marked, and the median, min
    and max speedups are over the other cases (they had counted it, unmarked)."""
    import dataclasses

    rows = _rows()
    first = compare(rows)[0]
    slow = dataclasses.replace(
        first.torch, median_ms=first.torch.median_ms * 100,
        timing=first.torch.timing + " (NOT fully pre-filled)",
    )  # fmt: skip
    rows = [slow if row == first.torch else row for row in rows]
    table = format_table(rows)
    marked = [line for line in table.splitlines() if line.endswith("x*")]
    assert len(marked) == 1 and "300.00x*" in marked[0]
    assert "max 3.00x" in table and f"over {len(compare(rows)) - 1} cases" in table
    assert table.splitlines()[-1].startswith("*: a timing of the case was not fully pre-filled")


def _assert_pngs(folder, expected):
    for name in expected:
        path = folder / name
        assert path.is_file(), f"{name} missing"
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"
        assert len(data) > 20_000, f"{name} is suspiciously small: {len(data)} bytes"


def test_plots_render_one_png_per_pass(bench_csv, tmp_path):
    pytest.importorskip("matplotlib")
    from spio.bench.plot import plot_rows

    paths = plot_rows(read_csv(bench_csv), tmp_path / "plots")
    names = [p.name for p in paths]
    assert names == ["bandwidth_fprop_fp16.png", "bandwidth_dgrad_fp16.png",
                     "bandwidth_wgrad_fp16.png"]  # fmt: skip
    _assert_pngs(tmp_path / "plots", names)


def test_a_plot_that_fails_leaves_the_earlier_png_whole(bench_csv, tmp_path, monkeypatch):
    """savefig wrote straight into the PNG: a plot stopped while it drew left a cut-off file
    where the earlier run's plot had been. It is drawn first, then put in place whole."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from spio.bench.plot import plot_rows

    folder = tmp_path / "plots"
    folder.mkdir()
    earlier = folder / "bandwidth_fprop_fp16.png"
    earlier.write_bytes(b"an earlier run's plot")
    save = Figure.savefig

    def cut_off(fig, target, **kwargs):
        save(fig, target, **kwargs)
        target.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", cut_off)
    with pytest.raises(KeyboardInterrupt):
        plot_rows(read_csv(bench_csv), folder)
    assert earlier.read_bytes() == b"an earlier run's plot"
    assert [p.name for p in folder.iterdir()] == [earlier.name]


def test_plot_only_command_needs_no_gpu(bench_csv):
    pytest.importorskip("matplotlib")
    out = _plot_only(bench_csv)
    assert out.returncode == 0, out.stderr
    assert "speedup over PyTorch" in out.stdout
    _assert_pngs(bench_csv.parent, ["bandwidth_fprop_fp16.png", "bandwidth_wgrad_fp16.png"])


def test_table_columns_hold_each_impls_time_bandwidth_copy_fraction_and_speedup():
    """64c_64x64_3x3 at N=32, FProp, worked out by hand: x and y are 32*64*64*64*2 bytes each,
    w 64*8*3*3*2, 33,563,648 bytes in all. At the fixture's 0.1, 0.3 and 0.08 ms that is
    335.6, 111.9 and 419.5 GB/s (1e9 bytes/s); spio reaches 0.08/0.1 = 80% of the copy's
    bandwidth, PyTorch 0.08/0.3 = 27%; PyTorch time / spio time = 3.00."""
    nbytes = 2 * (32 * 64 * 64 * 64 * 2) + 64 * 8 * 3 * 3 * 2
    assert nbytes == 33_563_648
    line = format_table(_rows()).splitlines()[2]
    assert line.split() == [
        "64c_64x64_3x3", "32", "fp16", "fprop",
        "0.1000", "0.3000", "0.0800",  # ms: spio, torch, copy
        "336", "112", "420",  # GB/s: spio, torch, copy
        "80%", "27%",  # % of copy bandwidth: spio, torch
        "3.00x",
    ]  # fmt: skip


def test_speedup_summary_is_the_median_min_and_max_of_the_cases():
    """Three cases whose PyTorch times make speedups of 1, 2 and 6: median 2 (the mean would
    be 3), min 1, max 6."""
    import dataclasses

    rows = _rows()[:9]  # 64c_64x64_3x3 at N=32: three passes x (spio, torch, copy), spio 0.1 ms
    torch_ms = iter([0.1, 0.2, 0.6])
    rows = [
        dataclasses.replace(row, median_ms=next(torch_ms)) if row.impl == "torch" else row
        for row in rows
    ]
    assert [c.speedup for c in compare(rows)] == pytest.approx([1.0, 2.0, 6.0])
    summary = format_table(rows).splitlines()[-1]
    assert summary == "speedup over PyTorch: median 2.00x, min 1.00x, max 6.00x over 3 cases"
    summary = format_table(rows[:3]).splitlines()[-1]  # one case: not "over 1 cases"
    assert summary == "speedup over PyTorch: median 1.00x, min 1.00x, max 1.00x over 1 case"


def test_csv_derived_columns_are_gb_per_second_and_tflop_per_second(tmp_path):
    """FProp of 64c_64x64_3x3 at N=32: 33,563,648 bytes (see above) and 2*32*64*64*64*8*3*3 =
    1,207,959,552 FLOPs. spio at 0.1 ms: 335.64 GB/s, 12.080 TFLOP/s; PyTorch at 0.3 ms:
    111.88 GB/s, 4.027 TFLOP/s; the copy at 0.08 ms: 419.55 GB/s and no FLOPs."""
    import csv

    assert 2 * 32 * 64 * 64 * 64 * 8 * 3 * 3 == 1_207_959_552
    path = write_csv(_rows()[:3], tmp_path / "derived.csv")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames[-2:] == ["gbps", "tflops"]
        got = [(r["impl"], r["gbps"], r["tflops"]) for r in reader]
    assert got == [
        ("spio", "335.64", "12.080"),
        ("torch", "111.88", "4.027"),
        ("copy", "419.55", "0.000"),
    ]


def test_a_command_line_that_is_not_utf8_is_written(tmp_path):
    """An --out of a non-UTF-8 byte is a lone surrogate in the command Python read: the CSV had
    failed to encode it (UnicodeEncodeError, after the first case was timed)."""
    import dataclasses
    import os

    command = "python -m spio bench --out " + os.fsdecode(b"/tmp/out\xff")
    rows = [dataclasses.replace(row, command=command) for row in _rows()]
    path = write_csv(rows, tmp_path / "bench.csv")
    assert [row.command for row in read_csv(path)] == [
        "python -m spio bench --out /tmp/out\\udcff"
    ] * len(rows)


def test_the_legend_has_every_panels_lines(monkeypatch, tmp_path):
    """The first panel's lines alone had made the legend: a layer whose copy timing failed left
    the copy out of it, though the other panels draw it."""
    pytest.importorskip("matplotlib")
    import dataclasses

    from matplotlib.figure import Figure

    from spio.bench.plot import plot_rows

    template = _rows()[0]
    rows = [
        dataclasses.replace(template, layer=layer, n=n, pass_="fprop", impl=impl)
        for layer in ("A", "B")
        for n in (8, 16)
        for impl in ("spio", "torch", "copy")
        if (layer, impl) != ("A", "copy")
    ]
    legends = []
    save = Figure.savefig

    def record(fig, target, **kwargs):
        legends.append([text.get_text() for legend in fig.legends for text in legend.get_texts()])
        return save(fig, target, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    plot_rows(rows, tmp_path)
    assert legends == [["spio", "PyTorch (cuDNN)", "device copy"]]


def test_each_panel_plots_its_layers_rows_of_its_pass_and_dtype(monkeypatch, tmp_path):
    """Five FProp layers in fp16 and bf16, rows given out of order: the fp16 figure has the
    five layers' panels in row-major order on a 2 x 4 grid (the other three hidden), and each
    panel one line per implementation over that layer's batch sizes, sorted, with y from 0.
    With 1,024,000 bytes in n/1000 ms, spio moves 1,024,000 / (n * 1e-6) / 1e9 = 1024 / n GB/s,
    PyTorch (twice the time) 512 / n and the copy (half) 2048 / n; bf16 rows take 4x longer."""
    pytest.importorskip("matplotlib")
    import dataclasses

    from matplotlib.figure import Figure

    from spio.bench.plot import plot_rows

    template = _rows()[0]
    batches = {f"L{i}": (8, 16, 32) if i == 0 else (32, 64) for i in range(5)}
    factor = {"spio": 1.0, "torch": 2.0, "copy": 0.5}
    rows = [
        dataclasses.replace(
            template, layer=layer, n=n, dtype=dtype, pass_="fprop", impl=impl,
            bytes=1_024_000, median_ms=n / 1000 * factor[impl] * (4 if dtype == "bf16" else 1),
        )
        for dtype in ("fp16", "bf16")
        for layer, ns in batches.items()
        for n in reversed(ns)
        for impl in factor
    ]  # fmt: skip
    drawn = []
    save = Figure.savefig

    def record(fig, target, **kwargs):
        drawn.append(fig)
        return save(fig, target, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    paths = plot_rows(rows, tmp_path)
    assert [p.name for p in paths] == ["bandwidth_fprop_bf16.png", "bandwidth_fprop_fp16.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
    figures = dict(zip([p.name for p in paths], drawn, strict=True))
    fig = figures["bandwidth_fprop_fp16.png"]
    assert len(fig.axes) == 8
    assert [ax.get_visible() for ax in fig.axes] == [True] * 5 + [False] * 3
    expected = {"spio": 1024, "PyTorch (cuDNN)": 512, "device copy": 2048}
    for ax, (layer, ns) in zip(fig.axes, batches.items(), strict=False):
        assert ax.get_title() == layer
        assert list(ax.get_xticks()) == list(ns)
        assert ax.get_ylim()[0] == 0
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == set(expected), layer
        for label, gbps in expected.items():
            assert list(lines[label].get_xdata()) == list(ns), (layer, label)
            assert list(lines[label].get_ydata()) == pytest.approx([gbps / n for n in ns])
