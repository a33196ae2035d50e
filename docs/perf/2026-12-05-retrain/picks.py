"""The configs the earlier (run 5's samples) and the retrained (2026-12-05) sm_90 DGrad and WGrad
models pick for every bench layer at N = 32 and 128, fp16, no bias, for an H200, and whether run 7
sampled that layer and pass (docs/perf/2026-12-05-predictions.md counts the changed picks among
the unsampled ones). The earlier models are read from git (1d0bd54^, the commit before the
retraining). Run from the repository root: python docs/perf/2026-12-05-retrain/picks.py"""

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "scripts")
import train_perf_model as t  # noqa: E402

from spio.bench.layers import layer_table  # noqa: E402
from spio.kernels import perf_model as pm  # noqa: E402
from spio.kernels.families import get_family  # noqa: E402
from spio.kernels.perf_samples import read_samples  # noqa: E402

EARLIER = "1d0bd54^"
H200 = pm.DeviceIdentity(arch="sm_90", name="NVIDIA H200", driver="13.0", sms=132)
RUN7 = Path("docs/perf/2026-12-04-h200/run7/perf_samples.csv")
sampled = {(s.family, s.params.c, s.params.h, s.params.w, s.params.r, s.params.s, s.params.n)
           for s in t.runs_as_sampled(read_samples(RUN7)[0])}  # fmt: skip


def name(config) -> str:
    return config.encode() if hasattr(config, "encode") else str(config)


with tempfile.TemporaryDirectory() as folder:
    earlier = Path(folder) / "sm_90"
    earlier.mkdir()
    for family in ("conv2d_gw8_dgrad", "conv2d_gw8_wgrad", "conv2d_gw8_fprop"):
        for ext in ("ubj", "json"):
            blob = subprocess.run(
                ["git", "show", f"{EARLIER}:spio/perf_models/sm_90/{family}.{ext}"],
                check=True, capture_output=True,
            ).stdout  # fmt: skip
            (earlier / f"{family}.{ext}").write_bytes(blob)
    for family_name in ("conv2d_gw8_dgrad", "conv2d_gw8_wgrad"):
        family = get_family(family_name)
        changed = unsampled = 0
        for layer in layer_table():
            for n in (32, 128):
                params = layer.params(n)
                old = pm.rank_configs(family, params, H200, Path(folder))[0][0]
                new = pm.rank_configs(family, params, H200)[0][0]
                key = (family_name, params.c, params.h, params.w, params.r, params.s, n)
                was = "sampled" if key in sampled else "unsampled"
                if was == "unsampled":
                    unsampled += 1
                    changed += old != new
                mark = "changed" if old != new else "same"
                print(f"{family_name[11:]:5s} {layer.name:16s} N={n:<3d} {was:9s} "
                      f"earlier {name(old):28s} new {name(new):28s} {mark}")  # fmt: skip
        print(f"{family_name}: the pick changed in {changed} of {unsampled} unsampled cases")
