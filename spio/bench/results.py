"""Benchmark results: one CSV row per (layer, batch, pass, implementation), and the summary table.

The CSV is self-describing: every row carries the run's GPU, driver, torch, CUDA and spio versions,
date and command line, so files with the same columns from different machines can be concatenated
(repeated header lines included) and still be read; `runs` tells the runs apart. The table and the
plots compare the implementations of one run. Nothing here needs a GPU or torch; they are made
from these rows alone.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from spio.kernels.conv2d_gw8_params import DTYPES
from spio.kernels.stats import PASSES

#: Implementations timed per pass: spio's kernel, PyTorch (cuDNN), and a device copy of the
#: same number of bytes (the bandwidth a memory-bound kernel could at best reach).
IMPLS = ("spio", "torch", "copy")


@dataclass(frozen=True)
class RunInfo:
    """Where and how a benchmark ran; repeated in every CSV row."""

    gpu: str
    driver: str
    torch: str
    cuda: str
    spio: str
    date: str
    command: str
    timing: str


#: Appended to a row's `timing` when not every batch of its calls was queued behind the spin
#: kernel (spio.bench.timing): the time may include waits on the host.
NOT_PREFILLED = " (NOT fully pre-filled)"


@dataclass(frozen=True)
class BenchRow:
    """The measured time of one implementation of one pass of one layer at one batch size."""

    layer: str
    n: int
    c: int
    h: int
    w: int
    r: int
    s: int
    pad_h: int
    pad_w: int
    dtype: str
    pass_: str
    impl: str
    bytes: int
    flops: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    reps: int
    rotation_sets: int
    config: str
    gpu: str
    driver: str
    torch: str
    cuda: str
    spio: str
    date: str
    command: str
    timing: str
    #: How spio's config was chosen ("model sm_90/<family>.ubj", "heuristic", "autotune"); empty
    #: for PyTorch and the copy, and in CSVs written before it was recorded.
    selected_by: str = ""
    #: The kernel spio ran (its name: config and variant, e.g. `__wcl`, WGrad's `__partials`);
    #: empty for PyTorch and the copy, and in CSVs written before it was recorded.
    kernel: str = ""

    @property
    def gbps(self) -> float:
        """Effective bandwidth in GB/s (1e9 bytes per second): bytes that must move / time."""
        return self.bytes / (self.median_ms * 1e-3) / 1e9

    @property
    def tflops(self) -> float:
        """Arithmetic throughput in TFLOP/s (copy rows: 0)."""
        return self.flops / (self.median_ms * 1e-3) / 1e12


#: CSV columns written after BenchRow's fields (whose "pass_" is written "pass"), computed from
#: them (and recomputed, not read, by read_csv).
_DERIVED: dict[str, Callable] = {
    "gbps": lambda row: f"{row.gbps:.2f}",
    "tflops": lambda row: f"{row.tflops:.3f}",
}


def _column(name: str) -> str:
    return "pass" if name == "pass_" else name


def write_rows(
    rows: Iterable, path: Path, row_type: type, derived: dict[str, Callable] | None = None
) -> Path:
    """Write dataclass rows of `row_type` to a CSV at path, one column per field ("pass_" is
    written "pass"), then one per `derived` name (its function formats a row's value). The file
    is replaced whole (a sweep rewrites it after every case; a reader, or a kill, never meets
    half of it)."""
    from ..compiler.cache import write_atomically

    derived = derived or {}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f.name for f in fields(row_type)]
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow([_column(n) for n in names] + list(derived))
    for row in rows:
        values = asdict(row)
        writer.writerow([values[n] for n in names] + [fn(row) for fn in derived.values()])
    # A command line of a path that is not UTF-8 holds lone surrogates (Python's reading of
    # the bytes): kept readable, as backslash escapes, not a UnicodeEncodeError mid-sweep.
    write_atomically(path, text.getvalue().encode("utf-8", "backslashreplace"))
    return path


def write_csv(rows: Iterable[BenchRow], path: Path) -> Path:
    """Write rows (with derived GB/s and TFLOP/s columns) to path; returns path."""
    return write_rows(rows, path, BenchRow, _DERIVED)


#: The values a benchmark CSV's categorical columns take (the table and plots know no others).
_CHOICES = {"impl": IMPLS, "pass_": PASSES, "dtype": DTYPES}


def read_csv(path: Path) -> list[BenchRow]:
    """Rows of a CSV written by write_csv (derived columns are recomputed, not read)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a benchmark CSV")
    if not path.is_file():
        raise FileNotFoundError(f"benchmark CSV not found: {path}")
    types = {f.name: f.type for f in fields(BenchRow)}
    optional = {f.name: f.default for f in fields(BenchRow) if f.default is not MISSING}
    rows = []
    # utf-8-sig: Excel saves "CSV UTF-8" with a byte-order mark, else read into the first name.
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        present = set(reader.fieldnames or ())
        missing = {_column(n) for n in types if n not in optional} - present
        if missing:
            raise ValueError(
                f"{path} is not a spio benchmark CSV: missing columns {sorted(missing)}"
            )
        header = {name: name for name in reader.fieldnames or ()}
        for line_no, record in enumerate(reader, start=2):
            if record == header:  # the header again, where CSVs were concatenated
                continue
            if None in record.values():  # csv.DictReader fills a short row's columns with None
                given = sum(value is not None for value in record.values())
                raise ValueError(
                    f"{path}:{line_no}: the row has {given} of the header's "
                    f"{len(header)} columns (a damaged or cut-off line)"
                )
            if None in record:  # ... and keeps a long row's extra fields under the key None
                given = len(header) + len(record[None])  # type: ignore[index]
                raise ValueError(
                    f"{path}:{line_no}: the row has {given} columns, the header "
                    f"{len(header)} (a damaged line, or two joined)"
                )
            values = {}
            for name, kind in types.items():
                if _column(name) not in present:  # an optional column of a later spio
                    values[name] = optional[name]
                    continue
                text = record[_column(name)]
                try:
                    values[name] = (
                        int(text) if kind == "int" else float(text) if kind == "float" else text
                    )
                except ValueError:
                    raise ValueError(f"{path}:{line_no}: bad {_column(name)} {text!r}") from None
            for positive in ("n", "median_ms"):  # n: the plots' log-scaled batch-size axis
                if not 0 < values[positive] < math.inf:
                    raise ValueError(
                        f"{path}:{line_no}: {positive} must be finite and > 0, got "
                        f"{values[positive]}"
                    )
            for count in ("bytes", "flops"):
                if values[count] < 0:
                    raise ValueError(f"{path}:{line_no}: {count} must be >= 0, got {values[count]}")
            for name, allowed in _CHOICES.items():
                if values[name] not in allowed:
                    raise ValueError(
                        f"{path}:{line_no}: {_column(name)} must be one of {', '.join(allowed)}, "
                        f"got {values[name]!r}"
                    )
            rows.append(BenchRow(**values))
    return rows


def runs(rows: Iterable[BenchRow]) -> list[tuple[str, str, str]]:
    """The benchmark runs the rows come from, as (gpu, date, command), in first-seen order."""
    return list(dict.fromkeys((row.gpu, row.date, row.command) for row in rows))


@dataclass(frozen=True)
class Comparison:
    """spio vs PyTorch vs copy for one (layer, batch, dtype, pass)."""

    layer: str
    n: int
    dtype: str
    pass_: str
    spio: BenchRow | None
    torch: BenchRow | None
    copy: BenchRow | None

    @property
    def speedup(self) -> float | None:
        """PyTorch time / spio time (> 1: spio is faster)."""
        if self.spio is None or self.torch is None:
            return None
        return self.torch.median_ms / self.spio.median_ms

    def copy_fraction(self, impl: str) -> float | None:
        """impl's effective bandwidth as a fraction of the copy's."""
        row = getattr(self, impl)
        if row is None or self.copy is None:
            return None
        return row.gbps / self.copy.gbps


def compare(rows: Iterable[BenchRow]) -> list[Comparison]:
    """Group rows by (layer, batch, dtype, pass), keeping first-seen order."""
    groups: dict[tuple[str, int, str, str], dict[str, BenchRow]] = {}
    for row in rows:
        groups.setdefault((row.layer, row.n, row.dtype, row.pass_), {})[row.impl] = row
    return [
        Comparison(*key, impls.get("spio"), impls.get("torch"), impls.get("copy"))
        for key, impls in groups.items()
    ]


def _fmt(value: float | None, spec: str) -> str:
    """format(value, spec), or "-" right-aligned to the spec's width when value is None."""
    if value is None:
        width = int(spec.split(".")[0] or 0)
        return "-".rjust(width)
    return format(value, spec)


def format_table(rows: Iterable[BenchRow]) -> str:
    """The printed summary: ms, effective GB/s, % of copy bandwidth, speedup over PyTorch."""
    comparisons = compare(rows)
    header = (
        f"{'layer':<16} {'N':>4} {'dtype':<5} {'pass':<5} {'spio ms':>9} {'torch ms':>9} "
        f"{'copy ms':>8} {'spio GB/s':>9} {'torch GB/s':>10} {'copy GB/s':>9} "
        f"{'spio %cp':>8} {'torch %cp':>9} {'speedup':>7}"
    )
    lines = [header, "-" * len(header)]
    for cmp in comparisons:
        ms = {i: None if getattr(cmp, i) is None else getattr(cmp, i).median_ms for i in IMPLS}
        bw = {i: None if getattr(cmp, i) is None else getattr(cmp, i).gbps for i in IMPLS}
        pct = {i: cmp.copy_fraction(i) for i in ("spio", "torch")}
        mark = "*" if _host_bound(cmp) else " "
        lines.append(
            f"{cmp.layer:<16} {cmp.n:>4} {cmp.dtype:<5} {cmp.pass_:<5} "
            f"{_fmt(ms['spio'], '9.4f')} {_fmt(ms['torch'], '9.4f')} {_fmt(ms['copy'], '8.4f')} "
            f"{_fmt(bw['spio'], '9.0f')} {_fmt(bw['torch'], '10.0f')} {_fmt(bw['copy'], '9.0f')} "
            f"{_fmt(None if pct['spio'] is None else 100 * pct['spio'], '7.0f')}% "
            f"{_fmt(None if pct['torch'] is None else 100 * pct['torch'], '8.0f')}% "
            f"{_fmt(cmp.speedup, '6.2f')}x{mark}"
        )
    speedups = [c.speedup for c in comparisons if c.speedup is not None and not _host_bound(c)]
    if speedups:
        lines.append(
            f"speedup over PyTorch: median {statistics.median(speedups):.2f}x, "
            f"min {min(speedups):.2f}x, max {max(speedups):.2f}x over {len(speedups)} "
            + ("case" if len(speedups) == 1 else "cases")
        )
    if any(_host_bound(c) for c in comparisons):
        lines.append(
            "*: a timing of the case was not fully pre-filled (its calls may have waited on the "
            "host, not the GPU); left out of the speedup summary"
        )
    return "\n".join(lines)


def _host_bound(cmp) -> bool:
    """Whether a timing of the comparison's rows was NOT fully pre-filled (see spio.bench.run)."""
    rows = (getattr(cmp, impl) for impl in IMPLS)
    return any(row is not None and row.timing.endswith(NOT_PREFILLED) for row in rows)
