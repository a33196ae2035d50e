# Leave-one-shape-out scoring of perf models retrained on this run's samples against the shipped
# sm_90 models (docs/perf/2026-12-04-h200.md). Run from the repository root: python <this file>.
import sys, numpy as np
sys.path.insert(0, "scripts")
import train_perf_model as t
from spio.kernels.perf_samples import read_samples
from spio.kernels import perf_model as pm
import xgboost
from pathlib import Path
samples = read_samples(Path("docs/perf/2026-12-04-h200/perf_samples.csv"))
if isinstance(samples, tuple): samples = samples[0]
samples = t.dedupe(t.runs_as_sampled(samples))
fams = sorted({s.family for s in samples})
for fam in fams:
    fs = [s for s in samples if s.family == fam]
    groups = t.by_layer(fs)
    shipped = xgboost.Booster(); shipped.load_model(str(pm.PACKAGED_MODELS_DIR / "sm_90" / f"{fam}.ubj"))
    for key, g in groups.items():
        p0 = g[0].params
        rest = [s for s in fs if (s.params.c, s.params.h, s.params.w, s.params.r, s.params.s) != (p0.c, p0.h, p0.w, p0.r, p0.s)]
        b = t.fit(rest, t.DEFAULTS, 0, 2)
        new = t.score(b, g); old = t.score(shipped, g)
        p = g[0].params
        print(f"{fam[11:]:6s} n{p.n:<4d} c{p.c:<4d} {p.h}x{p.w} rows {len(g):3d}  regret new(LOLO) {new['regret_median']:.3f}  shipped {old['regret_median']:.3f}  rho new {new['spearman_median']:.2f} shipped {old['spearman_median']:.2f}")
