"""How well the analytic heuristic (spio's pick where no model applies) ranks the configs run 7
sampled on the H200: the measured time of its first sampled config over the best sampled one, per
layer and batch size (spio/perf_models/README.md). Run from the repository root."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "scripts")
import train_perf_model as t  # noqa: E402

from spio.kernels import perf_model as pm  # noqa: E402
from spio.kernels.families import get_family  # noqa: E402
from spio.kernels.perf_samples import read_samples  # noqa: E402

RUN7 = Path("docs/perf/2026-12-04-h200/run7/perf_samples.csv")
samples = t.dedupe(t.runs_as_sampled(read_samples(RUN7)[0]))
for name in sorted({s.family for s in samples}):
    family = get_family(name)
    regrets = []
    for group in t.by_layer([s for s in samples if s.family == name]).values():
        times = {s.config: s.seconds for s in group}
        first = pm.heuristic_ranking(family, group[0].params, list(times))[0]
        regrets.append(times[first] / min(times.values()))
    r = np.array(regrets)
    print(
        f"{name}: {len(r)} cases, regret median {np.median(r):.3f} mean {r.mean():.3f} "
        f"max {r.max():.3f}"
    )
