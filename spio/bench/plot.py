"""Plots of a benchmark run: effective bandwidth vs batch size, one PNG per pass and dtype.

Each PNG has one panel per layer: spio solid, PyTorch (cuDNN) dashed, and the device copy of the
same bytes dotted, so a panel shows both the ratio to cuDNN and the distance to copy bandwidth.
Uses matplotlib's object API with the Agg canvas (no pyplot, no display, no global state).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..compiler.cache import write_atomically
from ..kernels.stats import PASSES
from .results import BenchRow

_STYLE = {
    "spio": dict(linestyle="-", marker="o", color="tab:blue", label="spio"),
    "torch": dict(linestyle="--", marker="s", color="tab:orange", label="PyTorch (cuDNN)"),
    "copy": dict(linestyle=":", marker="", color="0.45", label="device copy"),
}


def _require_matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError(
            "spio bench plots need matplotlib: pip install matplotlib (or spio[bench])"
        ) from None
    return Figure, FigureCanvasAgg


def plot_rows(rows: Iterable[BenchRow], out_dir: Path) -> list[Path]:
    """Write bandwidth_<pass>_<dtype>.png for every pass and dtype in rows; returns the paths."""
    Figure, FigureCanvasAgg = _require_matplotlib()
    rows = list(rows)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    keys = sorted({(r.pass_, r.dtype) for r in rows}, key=lambda k: (_pass_order(k[0]), k[1]))
    for pass_, dtype in keys:
        subset = [r for r in rows if r.pass_ == pass_ and r.dtype == dtype]
        layers = list(dict.fromkeys(r.layer for r in subset))
        cols = min(4, len(layers))
        grid_rows = math.ceil(len(layers) / cols)
        fig = Figure(figsize=(4.2 * cols, 3.3 * grid_rows + 0.8), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(grid_rows, cols, squeeze=False)
        for index, layer in enumerate(layers):
            ax = axes[index // cols][index % cols]
            for impl, style in _STYLE.items():
                points = sorted(
                    (r.n, r.gbps) for r in subset if r.layer == layer and r.impl == impl
                )
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], **style)
            batches = sorted({r.n for r in subset if r.layer == layer})
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.set_ylim(bottom=0)
            ax.set_title(layer, fontsize=10)
            ax.set_xlabel("batch size")
            ax.set_ylabel("effective GB/s")
            ax.grid(True, alpha=0.3)
        for index in range(len(layers), grid_rows * cols):
            axes[index // cols][index % cols].set_visible(False)
        # Every panel's lines, one a label: the first panel may lack one (a failed timing).
        legend: dict[str, Any] = {}
        for ax in (ax for row in axes for ax in row):
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
        order = [style["label"] for style in _STYLE.values()]
        labels = sorted(legend, key=order.index)
        handles = [legend[label] for label in labels]
        try:
            fig.legend(handles, labels, loc="outside lower center", ncols=len(labels))
        except ValueError:  # matplotlib < 3.7 has no "outside" legend placement
            fig.legend(handles, labels, loc="lower center", ncol=len(labels))
        first = subset[0]
        fig.suptitle(
            f"{pass_} {dtype}: effective bandwidth vs batch size\n{first.gpu} | driver "
            f"{first.driver} | torch {first.torch} | spio {first.spio} | {first.date}",
            fontsize=10,
        )
        path = out_dir / f"bandwidth_{pass_}_{dtype}.png"
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110)
        write_atomically(path, png.getvalue())  # an earlier run's plot stays whole until then
        written.append(path)
    return written


def _pass_order(pass_: str) -> int:
    return PASSES.index(pass_) if pass_ in PASSES else len(PASSES)
