"""`python -m spio bench` without a GPU, and its argument checks."""

import pytest

from spio.__main__ import build_parser
from spio.bench.layers import layer_table
from tests.conftest import REPO, gpu_available
from tests.conftest import run_spio as run_spio_anywhere


def run_spio(*args):
    """`python -m spio ARGS` in a fresh interpreter that sees no GPU."""
    return run_spio_anywhere(*args, env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.skipif(gpu_available(), reason="a GPU is present: bench would run for real")
def test_bench_without_gpu_exits_nonzero_with_message(tmp_path):
    out = run_spio("bench", "--quick", "--out", str(tmp_path))
    assert out.returncode == 2
    assert "needs a CUDA GPU" in out.stderr
    assert not list(tmp_path.iterdir())


def test_bench_and_check_are_listed_commands():
    out = run_spio("--help")
    assert out.returncode == 0
    assert "bench" in out.stdout and "check" in out.stdout


def test_bench_arguments_parse():
    args = build_parser().parse_args(
        ["bench", "--quick", "--passes", "wgrad,fprop", "--dtype", "bf16", "--in-situ"]
    )
    assert args.quick and args.in_situ and args.passes == ("wgrad", "fprop")
    assert args.dtype == "bf16"
    # Unset until cmd_bench takes the defaults (every pass, fp16), so that --plot-only can tell
    # an option given at its default value from one not given.
    args = build_parser().parse_args(["bench"])
    assert args.passes is None and args.dtype is None


def test_a_layer_shape_of_other_digits_is_named_as_other_bad_shapes():
    """A superscript 2 passed isdigit(), then failed in int() with its own message."""
    from spio.bench.layers import parse_layer

    with pytest.raises(ValueError, match=r"C,H,W\[,R,S\[,PAD_H,PAD_W\]\] in non-negative integers"):
        parse_layer("8,8,\u00b2")


def test_repeated_passes_and_batch_sizes_are_timed_once():
    args = build_parser().parse_args(
        ["bench", "--passes", "fprop,wgrad,fprop", "--batch-sizes", "32,8,32"]
    )
    assert args.passes == ("fprop", "wgrad") and args.batch_sizes == (32, 8)


@pytest.mark.parametrize(
    "bad",
    [
        ["--passes", "fprop,bprop"],
        ["--dtype", "fp32"],
        ["--batch-sizes", "0"],
        ["--layers", ""],  # had matched every layer
    ],
)
def test_bench_rejects_bad_arguments(bad):
    out = run_spio("bench", *bad)
    assert out.returncode == 2
    assert "error" in out.stderr


def test_plot_only_names_a_file_it_cannot_read(tmp_path):
    """A missing or foreign CSV is a message and exit 2, not a traceback."""
    missing = run_spio("bench", "--plot-only", str(tmp_path / "missing.csv"))
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    other = run_spio("bench", "--plot-only", str(foreign))
    for out, said in ((missing, "not found"), (other, "missing columns")):
        assert out.returncode == 2 and said in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_bench_names_the_layers_when_none_matches(monkeypatch, capsys):
    import torch

    from spio.bench.cli import cmd_bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # fails before any GPU work
    args = build_parser().parse_args(["bench", "--layers", "nomatch"])
    assert cmd_bench(args) == 2
    err = capsys.readouterr().err
    assert "no benchmark layer matches ['nomatch']" in err and "64c_64x64_3x3" in err


def test_bench_names_every_layers_name_that_matches_nothing(monkeypatch, capsys):
    """A --layers NAME matching no row was dropped without a word when another NAME matched;
    now exit 2 naming each such NAME and the table's names, before the GPU check, so that a
    typo is reported on a machine without a GPU too."""
    import torch

    from spio.__main__ import main
    from spio.bench import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["bench", "--layers", "64c_64x64", "--layers", "368c_7x7_3x33", "--layers", "nope"]
    with pytest.raises(ValueError) as error:
        cli.chosen_layers(build_parser().parse_args(argv))
    assert "no benchmark layer matches ['368c_7x7_3x33', 'nope']; layers: " in str(error.value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"spio bench: {error.value}\n"
    assert all(layer.name in err for layer in layer_table())
    args = build_parser().parse_args(["bench", "--layers", "64c_64x64", "--layers", "368c_7x7"])
    assert [layer.name for layer in cli.chosen_layers(args)] == ["64c_64x64_3x3", "368c_7x7_3x3"]


PLOTTED_CSV = str(REPO / "docs/perf/2026-11-29-h200-2/bench_fp16.csv")


def test_bench_on_a_gpu_its_kernels_do_not_run_on_says_so(monkeypatch, tmp_path, capsys):
    """A GPU of an arch spio does not build for (faked): one line naming it, exit 2, nothing
    timed or written."""
    import torch

    from spio.bench import cli, run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "_gpu_problem", lambda: "cuda:0 (Tesla T4) is sm_75")
    monkeypatch.setattr(run, "run_bench", lambda *a, **k: pytest.fail("timed"))
    args = build_parser().parse_args(["bench", "--quick", "--out", str(tmp_path / "out")])
    assert cli.cmd_bench(args) == 2
    err = capsys.readouterr().err
    assert err == "spio bench: spio's kernels do not run on cuda:0 (Tesla T4) is sm_75\n"
    assert not (tmp_path / "out").exists()


def test_plot_only_names_an_output_folder_that_is_a_file(tmp_path):
    """--out naming a file is one line naming it and the OS error, exit 2, before the table."""
    a_file = tmp_path / "results.png"
    a_file.write_bytes(b"")
    out = run_spio("bench", "--plot-only", PLOTTED_CSV, "--out", str(a_file))
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(
        f"spio bench: cannot write to the output folder {a_file}: [Errno 17]"
    )
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_plot_only_names_an_output_folder_it_cannot_write(tmp_path, monkeypatch, capsys):
    """A folder that exists but refuses files (read-only; simulated, as root may write anyway)."""
    from spio import args
    from spio.__main__ import main

    def refuse(dir):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(args.tempfile, "TemporaryFile", refuse)  # the output folder's check
    assert main(["bench", "--plot-only", PLOTTED_CSV, "--out", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and str(tmp_path) in out.err and "Permission denied" in out.err
    assert not list(tmp_path.iterdir())


def test_bench_times_layers_given_as_shapes(monkeypatch, tmp_path):
    """--layer times any shape: alone instead of the table, with --layers besides the rows they
    select (a shape that is a table row is timed once); the run gets exactly those layers."""
    import torch

    from spio.bench import cli, run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "_gpu_problem", lambda: None)
    timed = []
    monkeypatch.setattr(run, "run_bench", lambda settings, *a, **k: timed.append(settings) or [])

    def names(*argv):
        args = build_parser().parse_args(["bench", "--out", str(tmp_path), *argv])
        assert cli.cmd_bench(args) == 1  # no rows from the stand-in: "timings failed"
        return [layer.name for layer in timed.pop().layers]

    assert names("--layer", "48,100,100") == ["48c_100x100_3x3"]
    assert names("--layer", "48,100,100,5,5,0,0", "--layer", "24,9,9,1,3") == [
        "48c_100x100_5x5_pad0x0",
        "24c_9x9_1x3",
    ]
    assert names("--layers", "7x7", "--layer", "48,100,100", "--layer", "368,7,7") == [
        "368c_7x7_3x3",
        "48c_100x100_3x3",
    ]
    assert len(names()) == len(layer_table())


@pytest.mark.parametrize(
    "text,said",
    [("60,32,32", "channels a positive multiple of 8, got 60"), ("64,32", "C,H,W")],
)
def test_bench_names_why_a_layer_shape_is_refused(text, said):
    out = run_spio("bench", "--layer", text)
    assert out.returncode == 2
    assert "argument --layer" in out.stderr and said in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "option,text,said",
    [
        ("--passes", ",", "passes must be a comma-separated subset of fprop,dgrad,wgrad, got ','"),
        ("--passes", "fprop,bprop", "passes must be a comma-separated subset"),
        ("--batch-sizes", ",", "needs one or more comma-separated positive integers, got ','"),
        ("--batch-sizes", "", "needs one or more comma-separated positive integers, got ''"),
        ("--batch-sizes", "32,-1", "batch sizes must be positive, got '32,-1'"),
        ("--batch-sizes", "32,x", "batch sizes must be integers, got '32,x'"),
    ],
)
def test_bench_names_why_passes_or_batch_sizes_are_refused(option, text, said, capsys):
    """An empty list (only commas) is refused as well as a bad entry, by the option's own rule."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", option, text])
    assert exit_.value.code == 2
    assert f"argument {option}: {said}" in capsys.readouterr().err


def test_bench_lists_skip_empty_entries_and_spaces():
    args = build_parser().parse_args(["bench", "--passes", " dgrad, ", "--batch-sizes", "8, 16,"])
    assert args.passes == ("dgrad",) and args.batch_sizes == (8, 16)


def _csv_of_runs(tmp_path, dates):
    """PLOTTED_CSV (one run) copied into tmp_path, its rows repeated once per date in `dates`
    with that date: one benchmark run per date; no date gives the header alone."""
    import csv

    with open(PLOTTED_CSV, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fieldnames, rows = reader.fieldnames, list(reader)
    path = tmp_path / "runs" / "bench_fp16.csv"
    path.parent.mkdir(parents=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames)
        writer.writeheader()
        for date in dates:
            writer.writerows({**row, "date": date} for row in rows)
    return path


def test_plot_only_refuses_a_csv_without_rows_or_of_two_runs(tmp_path, capsys):
    """A header alone is exit 2, as every other CSV that cannot be plotted (it was 1, the status
    of a failed timing); rows of two runs (two dates) exit 2 and list both runs."""
    from spio.__main__ import main

    empty = _csv_of_runs(tmp_path / "a", [])
    assert main(["bench", "--plot-only", str(empty)]) == 2
    assert capsys.readouterr().err == f"spio bench: {empty} has no rows\n"
    two = _csv_of_runs(tmp_path / "b", ["2026-11-29 21:27 UTC", "2026-11-30 08:00 UTC"])
    assert main(["bench", "--plot-only", str(two)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and f"{two} holds rows of 2 benchmark runs" in out.err
    assert "  NVIDIA H200, 2026-11-30 08:00 UTC: python -m spio bench --quick" in out.err


def test_plot_only_refuses_the_options_that_choose_what_to_time(capsys):
    """--plot-only renders a CSV's rows as they are: --passes, --layers and the other options
    that choose what to time were silently ignored with it; now exit 2 naming them."""
    from spio.__main__ import main

    argv = ["bench", "--plot-only", PLOTTED_CSV, "--passes", "fprop", "--layers", "64c",
            "--dtype", "bf16", "--batch-sizes", "32"]  # fmt: skip
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        "spio bench: --plot-only renders the CSV as it is: --passes, --dtype, --layers, "
        "--batch-sizes do "
        "not apply to it\n"
    )
    assert main(["bench", "--plot-only", PLOTTED_CSV, "--quick"]) == 2
    assert capsys.readouterr().err.endswith(": --quick does not apply to it\n")
    # Also at their default values (had passed: `--dtype fp16` with a bf16 CSV, say).
    argv = ["bench", "--plot-only", PLOTTED_CSV, "--dtype", "fp16", "--passes", "fprop,dgrad,wgrad"]
    assert main(argv) == 2
    assert capsys.readouterr().err.endswith(": --passes, --dtype do not apply to it\n")


def test_plot_only_plots_next_to_the_csv_unless_out_is_given(tmp_path, monkeypatch, capsys):
    from spio.__main__ import main
    from spio.bench import cli

    plotted = []
    monkeypatch.setattr(cli, "_plot", lambda rows, out_dir: plotted.append(out_dir) or 0)
    path = _csv_of_runs(tmp_path, ["2026-11-29 21:27 UTC"])
    assert main(["bench", "--plot-only", str(path)]) == 0
    assert main(["bench", "--plot-only", str(path), "--out", str(tmp_path / "plots")]) == 0
    assert plotted == [path.parent, tmp_path / "plots"]
    assert "64c_64x64_3x3" in capsys.readouterr().out  # the table


@pytest.mark.parametrize("error,status", [(RuntimeError("needs matplotlib"), 1), (OSError(28), 2)])
def test_plots_that_cannot_be_made_or_written_fail_with_a_message(
    error, status, monkeypatch, capsys
):
    """Without matplotlib exit 1; a folder that went away or filled up since the check, 2."""
    from spio.bench import cli, plot

    def fail(rows, out_dir):
        raise error

    monkeypatch.setattr(plot, "plot_rows", fail)
    assert cli._plot([], "somewhere") == status
    err = capsys.readouterr().err
    assert err.startswith(
        "spio bench: "
        + ("needs matplotlib" if status == 1 else "cannot write the plots to somewhere")
    )


@pytest.fixture
def fake_bench(monkeypatch):
    """cmd_bench on a faked GPU, run_bench recording its settings and returning `fake_bench.rows`
    rows (None for all it was asked for), the table and plots stubbed out."""
    import types

    import torch

    from spio.bench import cli, results, run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "_gpu_problem", lambda: None)
    monkeypatch.setattr(cli, "_plot", lambda rows, out_dir: 0)
    monkeypatch.setattr(results, "format_table", lambda rows: "TABLE")
    monkeypatch.setattr(results, "write_csv", lambda rows, path: path)
    state = types.SimpleNamespace(settings=[], rows=None)

    def run_bench(settings, command, csv_path):
        state.settings.append(settings)
        wanted = len(settings.layers) * len(settings.batch_sizes) * len(settings.passes) * 3
        return ["row"] * (wanted if state.rows is None else state.rows)

    monkeypatch.setattr(run, "run_bench", run_bench)
    return state


def test_bench_quick_times_fewer_batch_sizes_and_repetitions(fake_bench, tmp_path):
    from spio.bench import cli
    from spio.bench.layers import BATCH_SIZES, QUICK_BATCH_SIZES

    for argv, sizes, warmup, reps in [
        ([], BATCH_SIZES, 5, 100),
        (["--quick"], QUICK_BATCH_SIZES, 3, 20),
        (["--quick", "--batch-sizes", "8"], (8,), 3, 20),
    ]:
        args = build_parser().parse_args(
            ["bench", "--out", str(tmp_path), "--layers", "7x7", *argv]
        )
        assert cli.cmd_bench(args) == 0
        settings = fake_bench.settings.pop()
        assert (settings.batch_sizes, settings.warmup, settings.reps) == (sizes, warmup, reps)
        assert settings.passes == ("fprop", "dgrad", "wgrad") and settings.dtype == "fp16"


def test_bench_fails_when_any_timing_is_missing(fake_bench, tmp_path, capsys):
    """Three implementations per layer, batch size and pass: one row short is exit 1 naming the
    count; all of them is exit 0 and the table."""
    from spio.bench import cli

    argv = ["bench", "--out", str(tmp_path), "--layer", "8,4,4", "--batch-sizes", "2,4"]
    args = build_parser().parse_args([*argv, "--passes", "fprop,wgrad"])
    assert cli.cmd_bench(args) == 0
    assert capsys.readouterr().out == f"TABLE\nwrote {tmp_path / 'bench_fp16.csv'}\n"
    fake_bench.rows = 11
    assert cli.cmd_bench(args) == 1
    assert capsys.readouterr().err == "spio bench: 1 of 12 timings failed (see the log)\n"


def test_bench_rows_it_cannot_write_are_one_error(fake_bench, tmp_path, capsys, monkeypatch):
    """A disk that fills during the sweep: the table is still printed, then one line naming the
    file, exit 2 (an OSError's traceback had ended the sweep at the case it met it)."""
    from spio.bench import cli, results

    def full(rows, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(results, "write_csv", full)
    argv = ["bench", "--out", str(tmp_path), "--layer", "8,4,4", "--batch-sizes", "2"]
    assert cli.cmd_bench(build_parser().parse_args(argv)) == 2
    out, err = capsys.readouterr()
    assert out == "TABLE\n"
    assert err.startswith(f"spio bench: cannot write {tmp_path / 'bench_fp16.csv'}: [Errno 28]")


def test_a_sweep_goes_on_after_a_write_of_its_rows_fails(tmp_path, caplog):
    from spio.bench.run import write_rows_so_far

    def full(rows, path):
        raise OSError(28, "No space left on device")

    assert write_rows_so_far(full, ["row"], tmp_path / "a.csv") is False
    assert "cannot write" in caplog.text and "the rows are written at the end" in caplog.text
    assert write_rows_so_far(lambda rows, path: path, ["row"], tmp_path / "a.csv") is True


def test_in_situ_runs_at_n_64_or_the_first_batch_size_and_quick_on_three_layers(
    monkeypatch, tmp_path
):
    """--quick profiles the table's first three layers, but every layer named by --layers or
    --layer; N is 64 unless --batch-sizes gives one."""
    import torch

    from spio.bench import cli, insitu, run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "_gpu_problem", lambda: None)
    monkeypatch.setattr(run, "run_info", lambda command: None)
    monkeypatch.setattr(run, "cudnn_at_its_best", lambda: "")  # (torch's flags left alone)
    calls = []

    def run_insitu(layers, n, **kwargs):
        calls.append(([layer.name for layer in layers], n))
        return []  # (an empty run: the cases it was asked for are counted as failed)

    monkeypatch.setattr(insitu, "run_insitu", run_insitu)

    def profiled(*argv):
        args = build_parser().parse_args(["bench", "--in-situ", "--out", str(tmp_path), *argv])
        assert cli.cmd_bench(args) == 1
        return calls.pop()

    table = [layer.name for layer in layer_table()]
    assert profiled("--quick") == (table[:3], 64)
    assert profiled("--quick", "--batch-sizes", "16,32") == (table[:3], 16)
    square = [n for n in table if "_3x3" in n]
    assert len(square) > 3  # so --quick alone would cut them
    assert profiled("--layers", "_3x3") == (square, 64)
    assert profiled("--quick", "--layers", "_3x3") == (square, 64)
    assert profiled("--quick", "--layer", "8,4,4") == (["8c_4x4_3x3"], 64)


def test_in_situ_fails_where_a_pass_saw_no_call(monkeypatch, tmp_path, capsys):
    """A pass with no call of its layer measured nothing: exit 1, as the isolated bench's
    missing timings (it had exited 0 whatever it measured)."""
    import dataclasses

    import torch

    from spio.bench import cli, insitu, run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "_gpu_problem", lambda: None)
    monkeypatch.setattr(run, "run_info", lambda command: None)
    monkeypatch.setattr(run, "cudnn_at_its_best", lambda: "")  # (torch's flags left alone)
    names = [f.name for f in dataclasses.fields(insitu.InSituRow)]
    row = insitu.InSituRow(**{name: "x" for name in names} | {"calls": 3, "us_per_call": 1.0})
    # One layer, 2 styles x 2 implementations x 3 passes: 12 rows.
    made = [row] * 11 + [dataclasses.replace(row, calls=0)]
    monkeypatch.setattr(insitu, "run_insitu", lambda layers, n, **kwargs: list(made))
    monkeypatch.setattr(insitu, "format_insitu_table", lambda rows: "TABLE")
    written = []
    monkeypatch.setattr(insitu, "write_insitu_csv", lambda rows, path: written.append(len(rows)))
    argv = ["bench", "--in-situ", "--out", str(tmp_path), "--layer", "8,4,4"]
    args = build_parser().parse_args(argv)
    assert cli.cmd_bench(args) == 1
    assert (
        capsys.readouterr().err == "spio bench: 1 of 12 in-situ passes saw no call of their layer\n"
    )
    made[-1] = row
    assert cli.cmd_bench(args) == 0
    # A stack that failed (out of memory, say) has no rows: counted, the others still written.
    del made[-3:]
    assert cli.cmd_bench(args) == 1
    assert capsys.readouterr().err == "spio bench: 3 of 12 in-situ passes failed (see the log)\n"
    assert written == [12, 12, 9]


def test_command_line_quotes_arguments_as_a_shell_would_need(monkeypatch):
    from spio.bench import cli

    monkeypatch.setattr(cli.sys, "argv", ["/x/spio/__main__.py", "bench", "--layers", "a b"])
    assert cli.command_line() == "python -m spio bench --layers 'a b'"


def test_a_rerun_into_the_same_folder_keeps_the_earlier_runs_files(fake_bench, tmp_path, capsys):
    """The CSV was rewritten after the new run's first case (the earlier run's rows gone) and
    the earlier plots stayed beside it: they move to earlier/<the CSV's time>/, said."""
    import os

    from spio.bench import cli

    (tmp_path / "bench_fp16.csv").write_text("earlier rows\n")
    (tmp_path / "bandwidth_fprop_fp16.png").write_bytes(b"png")
    (tmp_path / "bandwidth_fprop_bf16.png").write_bytes(b"other dtype's")
    os.utime(tmp_path / "bench_fp16.csv", (1.8e9, 1.8e9))
    args = build_parser().parse_args(["bench", "--out", str(tmp_path), "--layer", "8,4,4"])
    assert cli.cmd_bench(args) == 0
    (kept,) = (tmp_path / "earlier").iterdir()
    assert sorted(p.name for p in kept.iterdir()) == ["bandwidth_fprop_fp16.png", "bench_fp16.csv"]
    assert (kept / "bench_fp16.csv").read_text() == "earlier rows\n"
    assert (tmp_path / "bandwidth_fprop_bf16.png").exists()  # another dtype's run: left
    assert not (tmp_path / "bench_fp16.csv").exists()  # the fake run wrote none
    assert f"to {kept}" in capsys.readouterr().out
    assert cli.cmd_bench(args) == 0  # nothing of the dtype left: nothing moved
    assert len(list((tmp_path / "earlier").iterdir())) == 1


def test_earlier_files_that_cannot_be_moved_aside_are_one_error(fake_bench, tmp_path, capsys):
    """An `earlier` that is a file (or not this user's to write) had ended the command in a
    traceback: one `spio bench:` line, exit 2, nothing timed and the earlier CSV left."""
    from spio.bench import cli

    (tmp_path / "bench_fp16.csv").write_text("earlier rows\n")
    (tmp_path / "earlier").write_text("a file")
    args = build_parser().parse_args(["bench", "--out", str(tmp_path), "--layer", "8,4,4"])
    assert cli.cmd_bench(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spio bench: cannot move the earlier run's files in {tmp_path} aside")
    assert fake_bench.settings == [] and (tmp_path / "bench_fp16.csv").exists()
