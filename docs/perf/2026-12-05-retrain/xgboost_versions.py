"""Do other xgboost versions pick what the shipped models pick under the one that wrote them?

Run with the repository's environment to write every config's features of three layers per pass,
then with each other xgboost's Python to predict them, then once more to compare (2026-12-05,
Python 3.11: xgboost 1.7.6, 2.0.3 and xgboost-cpu 2.1.4, 3.0.0, 3.1.0 against 3.2.0):

    python docs/perf/2026-12-05-retrain/xgboost_versions.py features DIR
    OTHER/bin/python docs/perf/2026-12-05-retrain/xgboost_versions.py predict DIR   # each version
    python docs/perf/2026-12-05-retrain/xgboost_versions.py compare DIR

The predict step needs only numpy and xgboost (and the repository, for the model files).
"""

import glob
import json
import sys
from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parents[3] / "spio" / "perf_models" / "sm_90"
FAMILIES = ("conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad")
LAYERS = 3


def features(folder: Path) -> None:
    from spio.kernels import perf_model as pm
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P
    from spio.kernels.families import get_family

    layers = [
        P(128, 64, 64, 64, padding=1),
        P(32, 256, 16, 16, padding=1),
        P(64, 96, 28, 28, padding=2, r=5, s=5),
    ]
    names = {}
    for name in FAMILIES:
        family = get_family(name)
        for i, params in enumerate(layers):
            np.save(folder / f"{name}_{i}.npy", pm.features(family, params, family.configs(params)))
        names[name] = list(pm.feature_names(family))
    (folder / "names.json").write_text(json.dumps(names))


def predict(folder: Path) -> None:
    import xgboost

    names = json.loads((folder / "names.json").read_text())
    out = {}
    for name in FAMILIES:
        booster = xgboost.Booster()
        booster.load_model(str(MODELS / f"{name}.ubj"))
        for i in range(LAYERS):
            x = np.load(folder / f"{name}_{i}.npy")
            data = xgboost.DMatrix(x, feature_names=names[name])
            out[f"{name}_{i}"] = booster.predict(data).tolist()
    (folder / f"pred_{xgboost.__version__}.json").write_text(json.dumps(out))


def compare(folder: Path) -> None:
    ref = json.loads((folder / "pred_3.2.0.json").read_text())
    for path in sorted(glob.glob(str(folder / "pred_*.json"))):
        version = Path(path).stem[5:]
        if version == "3.2.0":
            continue
        got = json.loads(Path(path).read_text())
        parts = []
        for name in FAMILIES:
            shifts, worst, same = [], 0.0, True
            for i in range(LAYERS):
                a, b = np.array(ref[f"{name}_{i}"]), np.array(got[f"{name}_{i}"])
                shift = float(np.median(b - a))
                worst = max(worst, float(np.abs(b - a - shift).max()))
                shifts.append(shift)
                same &= int(a.argmin()) == int(b.argmin())
            parts.append(
                f"{name[11:]}: shift {shifts[0]:+.2f} (others within {worst:.1e}), same pick {same}"
            )
        print(version, " | ".join(parts))


if __name__ == "__main__":
    {"features": features, "predict": predict, "compare": compare}[sys.argv[1]](Path(sys.argv[2]))
