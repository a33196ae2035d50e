"""Leave-one-shape-out scoring behind the 2026-12-05 DGrad and WGrad models
(spio/perf_models/README.md). For each layer shape of run 7's samples (the current kernels): a
model trained on run 7's other shapes alone, and one trained on them plus run 5's rows of the
shapes run 7 lacks (train_perf_model.py --fill), each over seeds 0-4, scored on the held-out
shape (regret: measured time of the predicted-best sampled config over the best sampled); and
the models shipped before (trained on run 5's samples of older kernels, these shapes included),
scored on the same rows. Run from the repository root, with the earlier models in a folder:

    mkdir -p /tmp/old/sm_90 && for f in dgrad wgrad fprop; do for x in ubj json; do
      git show 70b9a46:spio/perf_models/sm_90/conv2d_gw8_$f.$x > /tmp/old/sm_90/conv2d_gw8_$f.$x
    done; done
    python docs/perf/2026-12-05-retrain/loso.py /tmp/old
"""

import statistics
import sys
from pathlib import Path

import numpy as np
import xgboost

sys.path.insert(0, "scripts")
import train_perf_model as t  # noqa: E402

from spio.kernels.perf_samples import read_samples  # noqa: E402

RUN7 = Path("docs/perf/2026-12-04-h200/run7/perf_samples.csv")
RUN5 = Path("docs/perf/2026-11-29-h200-2/run5/perf_samples.csv")
SEEDS = range(5)

old_dir = Path(sys.argv[1])
run7 = t.dedupe(t.runs_as_sampled(read_samples(RUN7)[0]))
run5 = t.dedupe(read_samples(RUN5)[0])
print(
    "family  layer (held out)                              run 7 alone  + --fill  run 5 alone"
    "  earlier model"
)
for family in sorted({s.family for s in run7}):
    new = [s for s in run7 if s.family == family]
    fill = t.shapes_lacking(new, [s for s in run5 if s.family == family])
    earlier = xgboost.Booster(model_file=str(old_dir / "sm_90" / f"{family}.ubj"))
    table = []
    for key, held in t.by_layer(new).items():
        rest = [s for s in new if s.layer_key != held[0].layer_key]
        alone = [t.score(t.fit(rest, t.DEFAULTS, seed, 2), held)["regret_median"] for seed in SEEDS]
        filled = [
            t.score(t.fit(rest + fill, t.DEFAULTS, seed, 2), held)["regret_median"]
            for seed in SEEDS
        ]
        older = [s for s in run5 if s.family == family and s.layer_key != held[0].layer_key]
        run5_style = [
            t.score(t.fit(older, t.DEFAULTS, seed, 2), held)["regret_median"] for seed in SEEDS
        ]
        row = (
            statistics.mean(alone),
            statistics.mean(filled),
            statistics.mean(run5_style),
            t.score(earlier, held)["regret_median"],
        )
        table.append(row)
        print(
            f"{family[11:]:6s}  {key[:44]:44s}  {row[0]:11.3f}  {row[1]:8.3f}  {row[2]:11.3f}"
            f"  {row[3]:13.3f}"
        )
    v = np.array(table)
    for name, f in (("median", np.median), ("mean", np.mean), ("max", np.max)):
        print(
            f"{family[11:]:6s}  {name:44s}  "
            + "  ".join(f"{x:{w}.3f}" for x, w in zip(f(v, 0), (11, 8, 11, 13), strict=True))
        )
