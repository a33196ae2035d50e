"""Tables of one GPU run's numbers against another's, from the files gpu_check.sh leaves.

For the record a run gets in docs/perf/ and for settling the predictions written before it: the
numbers are read from the run's own files, never typed in, and printed as Markdown tables.

    python scripts/compare_runs.py run NEW_DIR [OLD_DIR]       # all that both folders hold
    python scripts/compare_runs.py bench NEW.csv [OLD.csv]     # spio bench's CSVs
    python scripts/compare_runs.py ablate NEW.log [OLD.log]    # scripts/ablate_kernel.py's output
    python scripts/compare_runs.py probe NEW.log [OLD.log]     # scripts/read_probe.py's output

`run` reads a gpu_check.sh folder (or a run's folder under docs/perf/): `summary.txt`, the bench
CSVs in `bench/` (and in the same run, `bench_tma/`'s, the copies step's, against `bench/`'s),
`ablate.log`, `copies.log` and `probe.log`, each against OLD_DIR's where it has one. Without an
old one, each table shows the new run alone.

The bench tables give each case's spio time, its share of the device copy's rate (copy time over
spio's time: both move the pass's bytes) and its speedup over cuDNN (cuDNN's time over spio's),
with the headline layer (64c 64×64 3×3, N = 128; `--headline`) against issues #5 and #6's
targets, 90 % of copy and 3× cuDNN. The ablate tables give each variant's time per layer, pass
and config; a variant timed more than once under one key (the same config in two sections)
shows the median, with the count.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from spio.args import run_script

#: Issues #5 and #6's targets on the headline layer.
TARGET_COPY_SHARE = 0.90
TARGET_SPEEDUP = 3.0
HEADLINE = ("64c_64x64_3x3", 128)
#: A change in time counted as one in the summaries (runs on one GPU vary by about 1-3 %).
NOTABLE = 3.0
#: Keys of the old ablate log missing from the new one that are named (the rest are counted).
SHOWN = 10


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _change(new: float | None, old: float | None) -> str:
    if new is None or old is None:
        return ""
    return f"{100 * (new / old - 1):+.1f} %"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---- bench -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchCase:
    """One (layer, N, pass) of a bench CSV: the three implementations' median µs (None where the
    CSV has no row), spio's config and the run's description."""

    spio: float | None
    torch: float | None
    copy: float | None
    config: str

    @property
    def copy_share(self) -> float | None:
        """The device copy's time over spio's: spio's rate as a share of the copy's."""
        return None if not self.spio or self.copy is None else self.copy / self.spio

    @property
    def speedup(self) -> float | None:
        """cuDNN's time over spio's."""
        return None if not self.spio or self.torch is None else self.torch / self.spio


@dataclass(frozen=True)
class Bench:
    cases: dict[tuple[str, int, str], BenchCase]
    description: str  # GPU, driver, torch, spio version, date, dtype


def read_bench(path: Path) -> Bench:
    """A `spio bench` CSV (bench_<dtype>.csv): its cases, keyed (layer, N, pass)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = {"layer", "n", "pass", "impl", "median_ms"} - set(rows[0])
    if missing:
        raise ValueError(f"{path}: not a spio bench CSV (no column {', '.join(sorted(missing))})")
    times: dict[tuple[str, int, str], dict[str, float]] = {}
    configs: dict[tuple[str, int, str], str] = {}
    for row in rows:
        key = (row["layer"], int(row["n"]), row["pass"])
        times.setdefault(key, {})[row["impl"]] = float(row["median_ms"]) * 1e3
        if row["impl"] == "spio":
            configs[key] = row.get("config", "")
    cases = {
        key: BenchCase(t.get("spio"), t.get("torch"), t.get("copy"), configs.get(key, ""))
        for key, t in times.items()
    }
    first = rows[0]
    description = ", ".join(
        value
        for value in (
            first.get("gpu"),
            first.get("driver") and f"driver {first['driver']}",
            first.get("torch") and f"torch {first['torch']}",
            first.get("spio") and f"spio {first['spio']}",
            first.get("dtype"),
            first.get("date"),
        )
        if value
    )
    return Bench(cases, description)


def _ratio(value: float | None, fmt: str) -> str:
    """value in `fmt`; "%" gives a percentage with the house's space ("72 %")."""
    if value is None:
        return ""
    return f"{100 * value:.0f} %" if fmt == "%" else format(value, fmt)


def _targets(share: float | None, speedup: float | None) -> str:
    """ "met", or "not met" and what falls short, precise enough that a figure rounded onto a
    target (89.96 % shown as 90 %) is not read as reaching it."""
    if share is None or speedup is None:
        return "not met: no " + ("copy" if share is None else "cuDNN") + " time"
    short = []
    if share < TARGET_COPY_SHARE:
        short.append(f"{100 * share:.2f} % < {100 * TARGET_COPY_SHARE:g} %")
    if speedup < TARGET_SPEEDUP:
        short.append(f"{speedup:.3f}× < {TARGET_SPEEDUP:g}×")
    return "not met: " + ", ".join(short) if short else "met"


def bench_report(new: Bench, old: Bench | None, headline: tuple[str, int] = HEADLINE) -> str:
    """Markdown: the headline layer against the targets, every case, and a summary."""
    out = [f"New: {new.description}" + (f"  \nOld: {old.description}" if old else "")]
    layer, n = headline
    rows = []
    for pass_ in ("fprop", "dgrad", "wgrad"):
        case = new.cases.get((layer, n, pass_))
        if case is None:
            continue
        was = old.cases.get((layer, n, pass_)) if old else None
        share, speedup = case.copy_share, case.speedup
        row = [
            pass_,
            _us(case.spio),
            _ratio(share, "%"),
            _ratio(speedup, ".2f") + ("×" if speedup is not None else ""),
            _targets(share, speedup),
        ]
        if old:
            row += [
                _us(was and was.spio),
                _ratio(was and was.copy_share, "%"),
                _ratio(was and was.speedup, ".2f"),
                _change(case.spio, was and was.spio),
            ]
        rows.append(row)
    header = ["pass", "µs", "of copy", "× cuDNN", "targets (90 %, 3×)"]
    if old:
        header += ["old µs", "old of copy", "old ×", "time change"]
    title = f"### Headline: {layer}, N = {n}"
    out.append(f"{title}\n\n" + (_table(header, rows) if rows else "(not in the new CSV)"))

    rows = []
    for key, case in new.cases.items():
        was = old.cases.get(key) if old else None
        row = [
            key[0],
            str(key[1]),
            key[2],
            _us(case.spio),
            _ratio(case.copy_share, "%"),
            _ratio(case.speedup, ".2f"),
        ]
        if old:
            config = case.config if was is None or was.config == case.config else case.config + " *"
            row += [
                _us(was and was.spio),
                _change(case.spio, was and was.spio),
                _ratio(was and was.speedup, ".2f"),
                config,
            ]
        else:
            row.append(case.config)
        rows.append(row)
    header = ["layer", "N", "pass", "µs", "of copy", "× cuDNN"]
    header += ["old µs", "change", "old ×", "config (* changed)"] if old else ["config"]
    out.append("### Every case\n\n" + _table(header, rows))
    out.append("### Summary\n\n" + _bench_summary(new, old))
    return "\n\n".join(out)


def _case_name(key: tuple[str, int, str]) -> str:
    return f"{key[0]} N={key[1]} {key[2]}"


def _bench_summary(new: Bench, old: Bench | None) -> str:
    """Each run's speedups (median, range, losses) and, against the old run, how spio's times
    moved in each pass."""
    lines = []
    for name, bench in (("new", new), ("old", old)):
        if bench is None:
            continue
        speedups = {k: c.speedup for k, c in bench.cases.items() if c.speedup is not None}
        if not speedups:
            continue
        values = sorted(speedups.values())
        losses = sorted((s, k) for k, s in speedups.items() if s < 1)
        named = ", ".join(f"{_case_name(k)} {s:.2f}×" for s, k in losses)
        lines.append(
            f"- {name}: speedup over cuDNN median {statistics.median(values):.2f}×, min "
            f"{values[0]:.2f}×, max {values[-1]:.2f}× over {len(values)} cases; spio slower in "
            f"{len(losses)}" + (f": {named}" if losses else "")
        )
    if old is None:
        return "\n".join(lines)
    for pass_ in ("fprop", "dgrad", "wgrad"):
        changes = sorted(
            (100 * (c.spio / old.cases[k].spio - 1), k)
            for k, c in new.cases.items()
            if k[2] == pass_ and c.spio and k in old.cases and old.cases[k].spio
        )
        if not changes:
            continue
        (least, first), (most, last) = changes[0], changes[-1]
        median = statistics.median(c for c, _ in changes)
        slower = sum(change > NOTABLE for change, _ in changes)
        faster = sum(change < -NOTABLE for change, _ in changes)
        lines.append(
            f"- {pass_}: spio's time new/old median {median:+.1f} %, min {least:+.1f} % "
            f"({_case_name(first)}), max {most:+.1f} % ({_case_name(last)}); faster by more "
            f"than {NOTABLE:g} % in {faster}, slower in {slower}, of {len(changes)}"
        )
    only = set(new.cases) ^ set(old.cases)
    if only:
        lines.append(f"- cases in one CSV only: {len(only)}")
    return "\n".join(lines)


# ---- ablate ----------------------------------------------------------------------------------

_SECTION = re.compile(r"^(?P<gpu>.+), layer (?P<layer>\S+) N=(?P<n>\d+) (?P<dtype>\w+)$")
_ROW = re.compile(
    r"^(?P<pass>fprop|dgrad|wgrad)\s+(?P<variant>\S+(?: alone)?)\s+(?P<us>\d+\.\d+)\s+"
    r"(?P<gbps>\d+)(?:\s+(?P<vs>\d+\.\d\d))?(?:\s+(?P<rest>.*))?$"
)
_PROBLEM = re.compile(
    r"^(fprop|dgrad|wgrad)\s+\S+.*(WRONG|failed:|not built|did not build|not checked)"
)
#: A problem with a row timed just before it: the variant's results (ablate_kernel.py prints the
#: timing first, then checks the results against `full`'s).
_RESULT_PROBLEM = re.compile(
    r"^(?P<pass>fprop|dgrad|wgrad)\s+(?P<variant>\S+)\s+(?P<what>WRONG results|results not checked)"
)


@dataclass(frozen=True)
class AblateKey:
    layer: str
    n: int
    dtype: str
    pass_: str
    config: str  # "" for the copy and read lines (WGrad's whole wrappers: the config above)
    variant: str


@dataclass
class Ablate:
    times: dict[AblateKey, list[float]]  # in the log's order of first appearance
    vs_full: dict[AblateKey, list[float]]  # the log's own "vs full" column, where printed
    problems: list[str]  # WRONG results, failures, variants not built
    flagged: dict[AblateKey, str]  # timed rows whose results were wrong or not checked


def read_ablate(path: Path) -> Ablate:
    """scripts/ablate_kernel.py's output (gpu_check's ablate.log or copies.log): every timed row
    under its section's layer, N and dtype."""
    found = Ablate({}, {}, [], {})
    section = None
    last_config: dict[str, str] = {}  # by pass, in the section
    last_row: dict[tuple[str, str], AblateKey] = {}  # by (pass, variant), in the section
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.rstrip()
        if match := _SECTION.match(line):
            section = (match["layer"], int(match["n"]), match["dtype"])
            last_config, last_row = {}, {}
            continue
        if section is None:
            continue
        if match := _ROW.match(line):
            pass_, variant, rest = match["pass"], match["variant"], match["rest"] or ""
            if variant in ("copy", "read"):  # the pass's bytes, whatever the config
                config = ""
            elif re.fullmatch(r"[a-z0-9_]+", rest):
                config = last_config[pass_] = rest
            else:  # WGrad's whole wrappers, timed after their config's kernels
                config = last_config.get(pass_, "")
            key = last_row[pass_, variant] = AblateKey(*section, pass_, config, variant)
            found.times.setdefault(key, []).append(float(match["us"]))
            if match["vs"] is not None:
                found.vs_full.setdefault(key, []).append(float(match["vs"]))
        elif _PROBLEM.match(line):
            found.problems.append(f"{section[0]} N={section[1]}: {line}")
            result = _RESULT_PROBLEM.match(line)
            if result and (result["pass"], result["variant"]) in last_row:
                what = "WRONG" if result["what"].startswith("WRONG") else "not checked"
                found.flagged[last_row[result["pass"], result["variant"]]] = what
    return found


def ablate_report(new: Ablate, old: Ablate | None) -> str:
    """Markdown: every variant's time (the median where timed more than once), with its ratio to
    `full` of the same config in the same run, against the old run's where it has the key."""
    rows = []
    for key, values in new.times.items():
        time = statistics.median(values)
        full_key = AblateKey(key.layer, key.n, key.dtype, key.pass_, key.config, "full")
        full = new.times.get(full_key) if key.config else None
        count = f" ({len(values)}×)" if len(values) > 1 else ""
        logged = new.vs_full.get(key, [])
        if key.variant == "full" or not full:
            vs = ""
        elif len(values) == 1 and len(full) == 1 and len(logged) == 1:
            vs = f"{logged[0]:.2f}"  # the log's own, from the unrounded times
        else:
            vs = f"{time / statistics.median(full):.2f}"
        flag = new.flagged.get(key)
        row = [
            key.layer,
            str(key.n),
            key.pass_,
            key.config,
            key.variant + (f" ({flag})" if flag else ""),
            f"{time:.1f}{count}",
            vs,
        ]
        if old is not None:
            was = old.times.get(key)
            was_time = statistics.median(was) if was else None
            row += [_us(was_time), _change(time, was_time)]
        rows.append(row)
    header = ["layer", "N", "pass", "config", "variant", "µs", "vs full"]
    if old is not None:
        header += ["old µs", "change"]
    out = [_table(header, rows)]
    if old is not None:
        gone = [k for k in old.times if k not in new.times]
        if gone:
            named = [" ".join(filter(None, (k.layer, k.pass_, k.config, k.variant))) for k in gone]
            more = f"; and {len(named) - SHOWN} more" if len(named) > SHOWN else ""
            out.append(f"In the old log only ({len(gone)}): " + "; ".join(named[:SHOWN]) + more)
    if new.problems:
        out.append("Problems in the new log:\n\n" + "\n".join(f"- {p}" for p in new.problems))
    return "\n\n".join(out)


# ---- probe -----------------------------------------------------------------------------------

_PROBE_ROW = re.compile(r"^(?P<what>\S.*?)\s+(?P<us>\d+\.\d)\s+(?P<gbps>\d+)$")


def read_probe(path: Path) -> dict[str, tuple[float, int]]:
    """scripts/read_probe.py's output: (µs, GB/s) by probe description, in order."""
    found: dict[str, tuple[float, int]] = {}
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        if match := _PROBE_ROW.match(line.rstrip()):
            found[" ".join(match["what"].split())] = (float(match["us"]), int(match["gbps"]))
    return found


def probe_report(new: dict[str, tuple[float, int]], old: dict | None) -> str:
    rows = []
    for what, (us, gbps) in new.items():
        row = [what, f"{us:.1f}", str(gbps)]
        if old is not None:
            was = old.get(what)
            row += ["" if was is None else str(was[1]), _change(us, was and was[0])]
        rows.append(row)
    header = ["probe", "µs", "GB/s"] + (["old GB/s", "time change"] if old is not None else [])
    return _table(header, rows)


# ---- a whole run -----------------------------------------------------------------------------


def _bench_csvs(folder: Path) -> dict[str, Path]:
    """A run's plain bench CSVs by file name: gpu_check's `bench/`, or a committed run's top
    level (where older records keep them)."""
    found = {p.name: p for p in sorted(folder.glob("bench_*.csv"))}
    found.update({p.name: p for p in sorted((folder / "bench").glob("bench_*.csv"))})
    return found


def run_report(new: Path, old: Path | None, headline: tuple[str, int] = HEADLINE) -> str:
    """Every part both folders hold (the new one's alone where the old lacks it, said so)."""
    parts = [f"# {new} against {old}" if old else f"# {new}"]
    summary = new / "summary.txt"
    if summary.is_file():
        parts.append("## gpu_check summary\n\n```\n" + summary.read_text().rstrip() + "\n```")
    plain, olds = _bench_csvs(new), _bench_csvs(old) if old else {}
    tensor_copies = {p.name: p for p in sorted((new / "bench_tma").glob("bench_*.csv"))}
    for name in sorted(plain.keys() | tensor_copies.keys()):
        if name in plain:
            was = olds.get(name)
            lacking = f"\n\n({old} has no {name}: the new run alone)" if old and not was else ""
            parts.append(
                f"## bench ({plain[name].relative_to(new)}){lacking}\n\n"
                + bench_report(read_bench(plain[name]), was and read_bench(was), headline)
            )
        if name in tensor_copies:
            tma = tensor_copies[name]
            against = (
                f"against {plain[name].relative_to(new)}, the same run"
                if name in plain
                else "alone (the run has no plain bench)"
            )
            parts.append(
                f"## bench with tensor copies ({tma.relative_to(new)}) {against}\n\n"
                + bench_report(
                    read_bench(tma), plain.get(name) and read_bench(plain[name]), headline
                )
            )
    for name in ("ablate.log", "copies.log", "probe.log"):
        log = new / name
        if not log.is_file():
            continue
        was = old / name if old else None
        if was is not None and not was.is_file():
            was = None
        lacking = f"\n\n({old} has no {name}: the new run alone)" if old and not was else ""
        if name == "probe.log":
            table = probe_report(read_probe(log), was and read_probe(was))
        else:
            table = ablate_report(read_ablate(log), was and read_ablate(was))
        parts.append(f"## {name}{lacking}\n\n{table}")
    if len(parts) == 1:
        raise ValueError(
            f"{new}: no summary.txt, bench CSV (bench_*.csv, bench/, bench_tma/), ablate.log, "
            "copies.log or probe.log"
        )
    return "\n\n".join(parts)


def _headline(text: str) -> tuple[str, int]:
    layer, sep, n = text.rpartition(":")
    if not sep or not layer or not n.isdigit():
        raise argparse.ArgumentTypeError(f"needs LAYER:N, e.g. 64c_64x64_3x3:128, got {text!r}")
    return layer, int(n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "bench", "ablate", "probe"))
    parser.add_argument("new", type=Path, help="the new run's folder or file")
    parser.add_argument("old", type=Path, nargs="?", help="the run to compare it with")
    parser.add_argument(
        "--headline",
        type=_headline,
        default=HEADLINE,
        help="the layer and batch size held against the targets (default 64c_64x64_3x3:128)",
    )
    args = parser.parse_args(argv)
    for path in (args.new, args.old):
        if path is not None and not path.exists():
            parser.error(f"{path} does not exist")
    try:
        if args.what == "run":
            text = run_report(args.new, args.old, args.headline)
        elif args.what == "bench":
            text = bench_report(
                read_bench(args.new), args.old and read_bench(args.old), args.headline
            )
        elif args.what == "ablate":
            text = ablate_report(read_ablate(args.new), args.old and read_ablate(args.old))
        else:
            text = probe_report(read_probe(args.new), args.old and read_probe(args.old))
    except (OSError, ValueError) as error:
        print(f"compare_runs.py: {error}", file=sys.stderr)
        return 2
    command = " ".join(["python scripts/compare_runs.py", *(argv or sys.argv[1:])])
    print(f"<!-- {command} -->\n\n{text}")
    return 0


if __name__ == "__main__":
    run_script(main)
