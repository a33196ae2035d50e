"""`python -m spio bench`: arguments and the command, kept here so spio/__main__.py stays small."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..args import non_empty
from ..kernels.stats import PASSES
from .layers import (
    BATCH_SIZES,
    QUICK_BATCH_SIZES,
    BenchLayer,
    layer_table,
    parse_layer,
    select_layers,
)

NO_GPU_MESSAGE = (
    "spio bench needs a CUDA GPU, and none is available on this machine "
    "(torch.cuda.is_available() is False); `--plot-only CSV` renders plots from an earlier run"
)

DEFAULT_OUT = "spio_bench_out"
DEFAULT_DTYPE = "fp16"


def _gpu_problem() -> str | None:
    """Why spio's kernels cannot run on the current GPU (its arch), or None."""
    import torch

    from ..functional.checks import device_problem

    return device_problem(torch.device("cuda"))


def _passes(text: str) -> tuple[str, ...]:
    passes = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))  # once each
    bad = [p for p in passes if p not in PASSES]
    if bad or not passes:
        raise argparse.ArgumentTypeError(
            f"passes must be a comma-separated subset of {','.join(PASSES)}, got {text!r}"
        )
    return passes


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(dict.fromkeys(int(v) for v in text.split(",") if v.strip()))  # once each
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers, got {text!r}") from None
    if not sizes:
        raise argparse.ArgumentTypeError(
            f"needs one or more comma-separated positive integers, got {text!r}"
        )
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {text!r}")
    return sizes


def _layer(text: str) -> BenchLayer:
    try:
        return parse_layer(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def chosen_layers(args: argparse.Namespace) -> tuple[BenchLayer, ...]:
    """The layers to time: the table's whose names contain a --layers text (all of them when
    neither --layers nor --layer is given), then each --layer not among them. ValueError naming
    each --layers text that matches no row."""
    table = select_layers(layer_table(), args.layers) if args.layers or not args.layer else []
    chosen = {layer.name: layer for layer in table}
    for layer in args.layer or ():
        chosen.setdefault(layer.name, layer)
    return tuple(chosen.values())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench command's options."""
    parser.add_argument(
        "--quick", action="store_true", help="batch sizes 32 and 128, fewer repetitions"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"folder for the CSV and PNG files (default ./{DEFAULT_OUT}; "
        "with --plot-only, the CSV's folder)",
    )
    parser.add_argument(
        "--passes",
        type=_passes,
        help="comma-separated passes to time (default fprop,dgrad,wgrad)",
    )
    parser.add_argument("--dtype", choices=("fp16", "bf16"), help=f"default {DEFAULT_DTYPE}")
    parser.add_argument(
        "--in-situ",
        action="store_true",
        help="instead of isolated layers, profile each layer inside ConvFirst- and MBConv-style "
        "block stacks at N=64 or the first --batch-sizes (torch.profiler kernel times; --quick "
        "without --layers or --layer: the table's first three layers)",
    )
    parser.add_argument(
        "--plot-only",
        type=Path,
        metavar="CSV",
        help="render the table and plots from an earlier run's CSV; needs no GPU",
    )
    parser.add_argument(
        "--layers",
        action="append",
        type=non_empty,
        help="only layers whose name contains this (repeatable), e.g. 64c_64x64",
    )
    parser.add_argument(
        "--layer",
        action="append",
        type=_layer,
        metavar="C,H,W[,R,S[,PAD_H,PAD_W]]",
        help="time this layer shape, or a table row by name (repeatable; R and S default to 3, "
        "padding to R//2, S//2); alone it replaces the table, with --layers it adds to the rows "
        "they select",
    )
    parser.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        help=f"comma-separated batch sizes (default {','.join(map(str, BATCH_SIZES))}; "
        "overrides --quick's)",
    )


def command_line() -> str:
    """This process's command line, as a user would type it."""
    args = sys.argv[1:]
    return shlex.join(["python", "-m", "spio", *args])


def _out_dir_error(out_dir: Path) -> str | None:
    """Why results cannot be written to out_dir (created if missing), or None; checked before any
    work so that a mistyped --out is not found only after the table is printed."""
    from ..args import folder_write_error

    error = folder_write_error(out_dir)
    if error is not None:
        return f"cannot write to the output folder {out_dir}: {error}; pass --out a writable folder"
    return None


def _keep_earlier(out_dir: Path, names: list[str]) -> str | None:
    """Move an earlier run's files of `names` (globs) in `out_dir` into
    `out_dir/earlier/<the CSV's time>/`, saying so: a rerun into the same folder had replaced
    its CSV after the first case, and left its plots beside the new CSV. Returns what went
    wrong where they cannot be moved (nothing is timed then), else None."""
    import datetime

    found = [path for name in names for path in sorted(out_dir.glob(name)) if path.is_file()]
    if not found:
        return None
    when = datetime.datetime.fromtimestamp(found[0].stat().st_mtime)
    keep = out_dir / "earlier" / when.strftime("%Y-%m-%d_%H%M%S")
    try:
        keep.mkdir(parents=True, exist_ok=True)
        for path in found:
            path.replace(keep / path.name)
    except OSError as error:  # e.g. an `earlier` that is a file, or not this user's to write
        return f"cannot move the earlier run's files in {out_dir} aside to {keep}: {error}"
    print(f"moved the earlier run's {', '.join(p.name for p in found)} to {keep}")
    return None


def _error(message: object) -> None:
    """One line on stderr, as the other commands' errors: `spio bench: <message>`."""
    print(f"spio bench: {message}", file=sys.stderr)


def _plot(rows, out_dir: Path) -> int:
    from .plot import plot_rows

    try:
        paths = plot_rows(rows, out_dir)
    except RuntimeError as error:  # matplotlib missing
        _error(error)
        return 1
    except OSError as error:  # the folder went away or filled up since _out_dir_error
        _error(f"cannot write the plots to {out_dir}: {error}")
        return 2
    for path in paths:
        print(f"wrote {path}")
    return 0


def _unused_with_plot_only(args: argparse.Namespace) -> list[str]:
    """The options given that choose what to time, which a CSV already timed fixes: --plot-only
    would ignore them (also where given their default values: `--dtype fp16` with a bf16 CSV)."""
    given = {
        "--quick": args.quick,
        "--passes": args.passes is not None,
        "--dtype": args.dtype is not None,
        "--in-situ": args.in_situ,
        "--layers": args.layers,
        "--layer": args.layer,
        "--batch-sizes": args.batch_sizes,
    }
    return [option for option, value in given.items() if value]


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark (or only render plots) as the arguments say; returns the exit status."""
    from .results import format_table, read_csv, runs

    if args.plot_only is not None:
        if ignored := _unused_with_plot_only(args):
            verb = "does" if len(ignored) == 1 else "do"
            _error(
                f"--plot-only renders the CSV as it is: {', '.join(ignored)} {verb} not apply to it"
            )
            return 2
        try:
            rows = read_csv(args.plot_only)
        except (OSError, ValueError) as error:
            _error(f"cannot read {args.plot_only}: {error}")
            return 2
        if not rows:  # a header alone: a CSV that cannot be plotted, as the errors above
            _error(f"{args.plot_only} has no rows")
            return 2
        found = runs(rows)
        if len(found) > 1:
            listed = "\n".join(f"  {gpu}, {date}: {command}" for gpu, date, command in found)
            _error(
                f"{args.plot_only} holds rows of {len(found)} benchmark runs; the table and plots "
                f"compare one run's implementations, so split it by run (its date column):\n"
                + listed
            )
            return 2
        out_dir = args.out or args.plot_only.parent
        if message := _out_dir_error(out_dir):
            _error(message)
            return 2
        print(format_table(rows))
        return _plot(rows, out_dir)

    args.passes = args.passes or PASSES
    args.dtype = args.dtype or DEFAULT_DTYPE
    try:  # before the GPU check, as argparse's checks: a typo is reported on any machine
        layers = chosen_layers(args)
    except ValueError as error:
        _error(error)
        return 2

    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    out_dir = args.out or Path(DEFAULT_OUT)
    if problem := _gpu_problem():
        _error(f"spio's kernels do not run on {problem}")
        return 2
    if message := _out_dir_error(out_dir):
        _error(message)
        return 2
    batch_sizes = args.batch_sizes or (QUICK_BATCH_SIZES if args.quick else BATCH_SIZES)
    if args.in_situ:
        earlier = [f"insitu_{args.dtype}.csv"]
    else:
        earlier = [f"bench_{args.dtype}.csv", f"bandwidth_*_{args.dtype}.png"]
    if message := _keep_earlier(out_dir, earlier):
        _error(message)
        return 2
    if args.in_situ:
        return _in_situ(args, layers, batch_sizes, out_dir)

    from .results import write_csv
    from .run import BenchSettings, run_bench

    settings = BenchSettings(
        layers=layers,
        batch_sizes=tuple(batch_sizes),
        passes=args.passes,
        dtype=args.dtype,
        warmup=3 if args.quick else 5,
        reps=20 if args.quick else 100,
    )
    path = out_dir / f"bench_{args.dtype}.csv"
    rows = run_bench(settings, command_line(), csv_path=path)  # written after every case
    expected = len(layers) * len(batch_sizes) * len(args.passes) * 3
    if rows:
        print(format_table(rows))
        if not _written(write_csv, rows, path):
            return 2
    status = _plot(rows, out_dir) if rows else 1
    if len(rows) < expected:
        _error(f"{expected - len(rows)} of {expected} timings failed (see the log)")
        return 1
    return status


def _written(write, rows: list, path: Path) -> bool:
    """write(rows, path), saying so; False, with one error line, where the file cannot be
    written (the table above still shows the rows)."""
    try:
        write(rows, path)
    except OSError as error:
        _error(f"cannot write {path}: {error}")
        return False
    print(f"wrote {path}")
    return True


def _in_situ(args: argparse.Namespace, layers, batch_sizes, out_dir: Path) -> int:
    from .insitu import IMPLS, STYLES, format_insitu_table, run_insitu, write_insitu_csv
    from .run import CUDNN_AT_ITS_BEST, run_info

    info = run_info(command_line() + CUDNN_AT_ITS_BEST)  # (run_insitu sets cuDNN so)
    n = batch_sizes[0] if args.batch_sizes else 64
    profiled = list(layers[:3] if args.quick and not (args.layers or args.layer) else layers)
    path = out_dir / f"insitu_{args.dtype}.csv"
    rows = run_insitu(
        profiled,
        n=n,
        dtype=args.dtype,
        info=info,
        passes=args.passes,
        warmup=3 if args.quick else 5,
        steps=10 if args.quick else 20,
        csv_path=path,  # written after every stack
    )
    if rows:
        print(format_insitu_table(rows))
        if not _written(write_insitu_csv, rows, path):
            return 2
    expected = len(profiled) * len(STYLES) * len(IMPLS) * len(args.passes)
    if len(rows) < expected:  # stacks that failed (see the log)
        _error(f"{expected - len(rows)} of {expected} in-situ passes failed (see the log)")
        return 1
    unseen = sum(1 for row in rows if not row.calls)
    if unseen:  # as the isolated bench's missing timings: the run did not measure it all
        _error(f"{unseen} of {len(rows)} in-situ passes saw no call of their layer")
        return 1
    return 0
