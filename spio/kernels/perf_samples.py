"""Measured samples of kernel run times: the CSV that scripts/perf_sample.py writes on a GPU and
scripts/train_perf_model.py trains the performance models (`spio.kernels.perf_model`) from.

A row is one kernel config timed on one layer: the device, the layer params, the config's fields
(`cfg_<field>`, empty where the family has no such field), the time and its effective bandwidth,
the date, and the variant of the kernel that was timed (`kernel_variant`). Lines starting with '#'
are comments.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .conv2d_gw8_params import Conv2dGw8Params
from .families import FAMILIES, Family, get_family
from .stats import Conv2dStats

#: Config fields of every family, in CSV column order (a family leaves the others empty).
CONFIG_COLUMNS = tuple(
    dict.fromkeys(name for family in FAMILIES.values() for name in family.config_fields)
)
#: An arch column's value: sm_ and the compute capability's digits (sm_90, sm_90a).
ARCH_NAME = re.compile(r"sm_\d+[a-z]?")
PARAM_COLUMNS = ("n", "c", "h", "w", "pad_h", "pad_w", "r", "s", "has_bias", "dtype")
_BASE_COLUMNS = ("family", "arch", "device", "driver", "spio_version", "synthetic")
SAMPLE_COLUMNS = (
    _BASE_COLUMNS
    + PARAM_COLUMNS
    + tuple(f"cfg_{name}" for name in CONFIG_COLUMNS)
    + ("time_us", "bandwidth_gbs", "date", "variant")
)

#: The variant of WGrad samples measured before samples named theirs: the atomic kernel alone,
#: without zeroing dw; no longer what spio runs for any config, so never trained on as samples
#: (train_perf_model.py's --fill rows, of shapes the samples lack, may be of any variant).
LEGACY_WGRAD_VARIANT = "atomic-kernel-only"


#: WGrad's partial sums as spio runs them since 2026-12-06 (each tap's 8 x 8 innermost in a
#: slot, and the reworked sum_slots). Samples named "partials" timed the path before: they are
#: neither trained on nor taken for samples of it when a sweep resumes (`Sample.key`).
WGRAD_PARTIALS_VARIANT = "partials-2"


#: What a sample's variant adds where the kernel timed moved its rows by tensor copies
#: (Family.tensor_copies): input rows, and FProp/DGrad's output rows too. Samples of the cp.async
#: kernels (every sample before 2026-12-07) name neither.
TMA_VARIANTS = {(True, False): "tma", (True, True): "tma-stores"}


def kernel_variant(family: Family, params: Conv2dGw8Params, config: Any, arch: str) -> str:
    """What a sample of this family and config times on `arch`, as spio runs it there, its
    parts joined by '+': for WGrad its reduction, WGRAD_PARTIALS_VARIANT (partial sums, then
    sum_slots) or "atomic" (dw zeroed, then the atomic kernel), whichever `uses_partial_sums`
    picks (FProp and DGrad: one launch, no part); then TMA_VARIANTS' name where the kernel moves
    its rows by tensor copies (as SPIO_TMA asks: Family.tensor_copies). "" for FProp and DGrad
    through cp.async."""
    parts = []
    if family.pass_ == "wgrad":
        from .conv2d_gw8_wgrad_factory import uses_partial_sums

        parts.append(WGRAD_PARTIALS_VARIANT if uses_partial_sums(params, config) else "atomic")
    copies = family.tensor_copies(params, config, arch)
    if copies in TMA_VARIANTS:
        parts.append(TMA_VARIANTS[copies])
    return "+".join(parts)


@dataclass(frozen=True)
class Sample:
    """One measured (or synthetic) run time of a kernel config on a layer."""

    family: str
    arch: str
    device: str
    driver: str
    spio_version: str
    synthetic: bool
    params: Conv2dGw8Params
    config: Any
    seconds: float
    date: str = ""
    variant: str = ""  # kernel_variant of what was timed

    @property
    def layer_key(self) -> str:
        """The layer's shape, batch size and dtype excluded (e.g. 'c64_h64_w64_pad1x1_r3_s3_bias0'):
        a shape's samples at every batch size and dtype are held out together."""
        return self.params.encode().split("_", 1)[1].rsplit("_", 1)[0]

    def key(self) -> tuple[str, ...]:
        """What identifies a sample when resuming a sweep (`sample_key`)."""
        return sample_key(self.family, self.device, self.params, self.config, self.variant)


def sample_key(
    family: str, device: str, params: Conv2dGw8Params, config: Any, variant: str
) -> tuple[str, ...]:
    """What identifies a sample when resuming a sweep: a sample of another variant (the kernel
    path as it was) is no sample of what spio runs now."""
    return (family, device, params.encode(), config.encode(), variant)


def sample_row(sample: Sample) -> dict[str, str]:
    """The CSV row of a sample."""
    p = sample.params
    bandwidth = Conv2dStats(p).effective_bandwidth(sample.seconds, get_family(sample.family).pass_)
    row = {
        "family": sample.family,
        "arch": sample.arch,
        "device": sample.device,
        "driver": sample.driver,
        "spio_version": sample.spio_version,
        "synthetic": str(int(sample.synthetic)),
        "n": p.n,
        "c": p.c,
        "h": p.h,
        "w": p.w,
        "pad_h": p.padding_h,
        "pad_w": p.padding_w,
        "r": p.r,
        "s": p.s,
        "has_bias": int(p.has_bias),
        "dtype": p.dtype,
        "time_us": f"{sample.seconds * 1e6:.4f}",
        "bandwidth_gbs": f"{bandwidth / 1e9:.2f}",
        "date": sample.date,
        "variant": sample.variant,
    }
    for name in CONFIG_COLUMNS:
        row[f"cfg_{name}"] = getattr(sample.config, name, "")
    return {k: str(v) for k, v in row.items()}


def _int(row: dict[str, str], column: str) -> int:
    try:
        return int(row[column])
    except ValueError:
        raise ValueError(
            f"perf sample column {column} needs an integer, got {row[column]!r}"
        ) from None


def _flag(row: dict[str, str], column: str) -> bool:
    value = row[column].strip()
    if value not in ("0", "1"):
        raise ValueError(f"perf sample column {column} needs 0 or 1, got {row[column]!r}")
    return value == "1"


def parse_sample(row: dict[str, str]) -> Sample:
    """The Sample of a CSV row; ValueError naming the bad column otherwise. A config column
    missing or empty takes the field's default (a CSV from before the field existed)."""
    family = get_family((row.get("family") or "").strip())
    if None in row:  # csv.DictReader's key for fields past the header's
        extra = len(row[None])  # type: ignore[index]
        raise ValueError(
            f"the row has {extra} fields more than the header's columns (two rows run together: "
            "a row cut off mid-write, then one appended?)"
        )
    needed = _BASE_COLUMNS + PARAM_COLUMNS
    missing = [c for c in needed + ("time_us", "date") if row.get(c) is None]
    if missing:
        raise ValueError(f"{family.name} sample rows need columns {', '.join(missing)}")
    arch = row["arch"].strip()
    if not ARCH_NAME.fullmatch(arch):  # (a model is written to a folder of this name)
        raise ValueError(
            f"perf sample column arch needs an arch such as sm_90, got {row['arch']!r}"
        )
    params = Conv2dGw8Params(
        n=_int(row, "n"),
        c=_int(row, "c"),
        h=_int(row, "h"),
        w=_int(row, "w"),
        padding=(_int(row, "pad_h"), _int(row, "pad_w")),
        r=_int(row, "r"),
        s=_int(row, "s"),
        has_bias=_flag(row, "has_bias"),
        dtype=row["dtype"].strip(),
    )
    config = family.config_from_fields(
        {
            k: _int(row, f"cfg_{k}")
            for k in family.config_fields
            if (row.get(f"cfg_{k}") or "").strip()
        }
    )
    try:
        seconds = float(row["time_us"]) * 1e-6
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"perf sample needs a positive finite time_us, got {row['time_us']!r}")
    synthetic = _flag(row, "synthetic")
    variant = row.get("variant")
    if variant is None:  # a CSV from before the column: WGrad rows timed the atomic kernel alone
        variant = LEGACY_WGRAD_VARIANT if family.pass_ == "wgrad" and not synthetic else ""
    return Sample(
        family=family.name,
        arch=arch,
        device=row["device"],
        driver=row["driver"],
        spio_version=row["spio_version"],
        synthetic=synthetic,
        params=params,
        config=config,
        seconds=seconds,
        date=row["date"],
        variant=variant.strip(),
    )


def read_samples(path: str | os.PathLike) -> tuple[list[Sample], list[str]]:
    """(samples, comment lines) of a sample CSV; lines starting with '#' are comments."""
    comments: list[str] = []
    lines: list[str] = []
    with open(path, newline="", encoding="utf-8-sig") as f:  # (a spreadsheet's BOM)
        for line in f:
            (comments if line.startswith("#") else lines).append(line)
    if not lines:
        return [], comments
    reader = csv.DictReader(lines)
    samples = []
    for number, row in enumerate(reader, start=1):  # data rows, the header not counted
        try:
            samples.append(parse_sample(row))
        except (ValueError, TypeError) as error:
            raise ValueError(f"{path}: data row {number}: {error}") from None
    return samples, comments


def check_sample_columns(path: str | os.PathLike) -> None:
    """Raise ValueError unless the CSV at `path` is missing, empty or has SAMPLE_COLUMNS and
    ends its last line, so that samples are appended only where every row will have the same
    columns and the first of them starts a line of its own."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, newline="", encoding="utf-8-sig") as f:
        header = next((line for line in f if not line.startswith("#")), "").strip()
    if header.split(",") == list(SAMPLE_COLUMNS):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
        raise ValueError(
            f"{path}'s last line does not end (a run stopped while it wrote that row?): a row "
            "added now would run on from it; end the line if its row is whole, or remove it"
        )
    missing = [c for c in SAMPLE_COLUMNS if c not in header.split(",")]
    older = f" (no {', '.join(missing)} column: an older spio wrote it)" if missing else ""
    raise ValueError(
        f"{path} has columns {header!r}{older}; samples can only be added to a CSV with "
        f"columns {','.join(SAMPLE_COLUMNS)}: start a new one"
    )


def append_samples(path: str | os.PathLike, samples: Iterable[Sample]) -> int:
    """Append samples to a CSV (header written when the file is new); returns the count."""
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    check_sample_columns(path)
    count = 0
    with open(path, "a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=SAMPLE_COLUMNS)
        if new:
            writer.writeheader()
        for sample in samples:
            writer.writerow(sample_row(sample))
            count += 1
        f.flush()
        os.fsync(f.fileno())
    return count
