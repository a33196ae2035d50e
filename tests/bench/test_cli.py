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
    assert build_parser().parse_args(["bench"]).passes == ("fprop", "dgrad", "wgrad")


@pytest.mark.parametrize(
    "bad", [["--passes", "fprop,bprop"], ["--dtype", "fp32"], ["--batch-sizes", "0"]]
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
    assert out.stderr.startswith(f"cannot write to the output folder {a_file}: [Errno 17]")
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_plot_only_names_an_output_folder_it_cannot_write(tmp_path, monkeypatch, capsys):
    """A folder that exists but refuses files (read-only; simulated, as root may write anyway)."""
    from spio.__main__ import main
    from spio.bench import cli

    def refuse(dir):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(cli.tempfile, "TemporaryFile", refuse)
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
