"""Train spio's kernel performance models from measured samples (scripts/perf_sample.py CSVs).

One XGBoost regressor per kernel family and GPU arch (with --per-device: per device name too).
Features are the layer params, the tile config and derived quantities (spio.kernels.perf_model);
the target is log seconds per byte moved (log time less a per-layer constant). Layers, not rows,
are held out: with --holdout F > 0 a model is first trained without a fraction F of the layer shapes
and scored on them (Spearman rank correlation of predicted vs measured times within each layer on
each GPU, and regret = measured time of the predicted-best config / measured-best time, median and
p95 over those cases: one model may learn from several GPUs' samples, never rank across them); the
model written is then trained on all rows; the analytic heuristic's regret on the same configs is
scored beside it, and a model whose median regret is worse is not written (--keep-worse writes it;
exit 1 where one was held back, or where spio's own evaluation of a model would differ from
xgboost's, which is not written either; the other families are trained and written all the same).
--holdout 0 skips the evaluation. Output per family:
`<out>/<arch>[/<device-slug>]/<family>.ubj` and a JSON beside it (data size, GPU, date, the batch
sizes and dtypes measured, held-out scores, whether the data was synthetic). At run time a model
is only used for batch sizes from half the smallest to twice the largest measured one.

    python scripts/train_perf_model.py perf_samples.csv [--out DIR] [--per-device] [--holdout F]

With --fill OLDER.csv ..., rows of layer shapes that the CSVs lack (per family and arch, and with
--per-device per device; a shape at any batch size or dtype counts as covered) are taken from
older samples too, whatever kernel variant they timed, and always trained on, never held out:
where the CSVs cover few shapes (a GPU run's sampling cut short), they keep the model from meeting
a filter size or layer it never saw, at the cost of timings of older kernels on those shapes. The
JSON counts them (`fill_rows`, `fill_layers`, `fill_sources`), and its devices, batch sizes and
config values are those of every row trained on, theirs included.

Models trained on synthetic data are never written into spio/perf_models/ (pass --out).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from spio.args import (
    folder_write_error,
    non_negative_float,
    positive_int,
    run_script,
    unit_fraction,
)
from spio.compiler.cache import write_atomically
from spio.kernels.conv2d_gw8_factory import typical_machine
from spio.kernels.families import FAMILIES, get_family
from spio.kernels.perf_model import (
    FEATURE_VERSION,
    PACKAGED_MODELS_DIR,
    TARGET,
    device_slug,
    feature_names,
    heuristic_ranking,
    model_path,
    target_offset,
)
from spio.kernels.perf_model import features as perf_model_features
from spio.kernels.perf_samples import Sample, kernel_variant, read_samples

DEFAULTS = {"trees": 200, "depth": 6, "eta": 0.1, "subsample": 0.9, "min_child_weight": 2.0}


def dedupe(samples: Sequence[Sample]) -> list[Sample]:
    """One sample per (family, device, params, config): repeated measurements -> their median."""
    groups: dict[tuple, list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[sample.key()].append(sample)
    out = []
    # In a fixed order (the whole key: device and variant too), not the rows': the same samples
    # in another order had trained another model.
    for group in sorted(groups.values(), key=lambda g: g[0].key()):
        seconds = statistics.median(s.seconds for s in group)
        first = group[0]
        out.append(
            Sample(
                **{**{f: getattr(first, f) for f in first.__dataclass_fields__}, "seconds": seconds}
            )
        )
    return out


def runs_as_sampled(samples: Sequence[Sample]) -> list[Sample]:
    """The samples that timed what spio runs for their config (kernel_variant on the sample's
    arch, under this process's SPIO_TMA; synthetic ones have no kernel), printing how many others
    are left out: e.g. WGrad samples of the atomic kernel alone, measured before spio ran partial
    sums and timed its whole WGrad, or samples of tensor-copy kernels where SPIO_TMA is unset."""
    kept, left_out = [], defaultdict(int)
    for sample in samples:
        runs = kernel_variant(get_family(sample.family), sample.params, sample.config, sample.arch)
        if sample.synthetic or sample.variant == runs:
            kept.append(sample)
        else:
            left_out[(sample.family, sample.variant or "none", runs or "none")] += 1
    for (family, timed, runs), count in sorted(left_out.items()):
        print(
            f"train_perf_model: leaving out {count} {family} samples that timed {timed!r} where "
            f"spio runs {runs!r} for their config"
        )
    return kept


def by_layer(samples: Sequence[Sample]) -> dict[tuple[str, str], list[Sample]]:
    """Samples grouped by device and layer params (dtype included), in a stable order: one
    model may learn from several GPUs' samples, but a layer's configs are ranked, and a pick's
    regret measured, among one GPU's times."""
    layers: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        layers[(sample.device, sample.params.encode())].append(sample)
    return dict(sorted(layers.items()))


def design(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """(features, target) of samples of one family, built one layer at a time."""
    family = get_family(samples[0].family)
    xs, ys = [], []
    for group in by_layer(samples).values():
        params = group[0].params
        xs.append(perf_model_features(family, params, [s.config for s in group]))
        offset = target_offset(family, params)
        ys.append(np.log([s.seconds for s in group]) - offset)
    return np.concatenate(xs), np.concatenate(ys)


def fit(samples: Sequence[Sample], hyper: dict, seed: int, threads: int):
    """An XGBoost booster fit to samples of one family."""
    import xgboost

    x, y = design(samples)
    names = list(feature_names(get_family(samples[0].family)))
    data = xgboost.DMatrix(x, label=y, feature_names=names, nthread=threads)
    booster_params = {
        "objective": "reg:squarederror",
        "tree_method": "hist",
        "max_depth": hyper["depth"],
        "eta": hyper["eta"],
        "subsample": hyper["subsample"],
        "min_child_weight": hyper["min_child_weight"],
        "nthread": threads,
        "seed": seed,
    }
    return xgboost.train(booster_params, data, num_boost_round=hyper["trees"])


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of a and b (nan when either is constant)."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def evaluation_problem(model: bytes, booster, samples: Sequence[Sample]) -> str | None:
    """Why spio's own evaluation of the trained model (spio.kernels.trees, which reads the file
    spio ships) does not predict exactly what xgboost does on the training rows, or None: a
    model an xgboost of another format would write is refused here, not misread by users."""
    from spio.kernels.trees import TreeEnsemble, read_ubjson

    x, _ = design(samples)
    try:
        ours = TreeEnsemble.from_model(read_ubjson(model)).predict(x)
    except ValueError as error:
        return f"spio cannot read the model xgboost wrote ({error})"
    theirs = booster.inplace_predict(np.asarray(x, dtype=np.float32), validate_features=False)
    if not np.array_equal(ours, theirs):
        worst = float(np.max(np.abs(ours.astype(np.float64) - theirs)))
        return f"spio's evaluation of the model differs from xgboost's (by up to {worst:.3g})"
    return None


def score(booster, samples: Sequence[Sample]) -> dict:
    """Per-layer Spearman and regret of `booster` on samples (held-out layers) of one family,
    beside the regret of the analytic heuristic (for a typical GPU of the samples' arch: what
    ranks where no model is) choosing among the same measured configs."""
    import xgboost

    family = get_family(samples[0].family)
    machine = typical_machine(samples[0].arch)
    regrets, correlations, heuristic_regrets = [], [], []
    for group in by_layer(samples).values():
        if len(group) < 2:
            continue
        params = group[0].params
        configs = [s.config for s in group]
        features = perf_model_features(family, params, configs)
        names = list(feature_names(family))
        predicted = booster.predict(xgboost.DMatrix(features, feature_names=names))
        measured = np.array([s.seconds for s in group])
        regrets.append(float(measured[int(np.argmin(predicted))] / measured.min()))
        heuristic_pick = heuristic_ranking(family, params, configs, machine)[0]
        heuristic_regrets.append(float(measured[configs.index(heuristic_pick)] / measured.min()))
        rho = spearman(predicted, measured)
        if not math.isnan(rho):
            correlations.append(rho)
    if not regrets:
        return {"heldout_layers_scored": 0}
    return {
        "heldout_layers_scored": len(regrets),
        "regret_median": float(np.median(regrets)),
        "regret_p95": float(np.percentile(regrets, 95)),
        "regret_max": float(max(regrets)),
        "spearman_median": float(np.median(correlations)) if correlations else None,
        "spearman_min": float(min(correlations)) if correlations else None,
        "heuristic_regret_median": float(np.median(heuristic_regrets)),
        "heuristic_regret_p95": float(np.percentile(heuristic_regrets, 95)),
    }


def worse_than_the_heuristic(metrics: dict) -> bool:
    """Whether the held-out scores put the model's median regret above the heuristic's on the
    same configs: the heuristic then ranks better than the model would, and ranks where no
    model is."""
    ours, theirs = metrics.get("regret_median"), metrics.get("heuristic_regret_median")
    return ours is not None and theirs is not None and ours > theirs


def describe_metrics(metrics: dict) -> str:
    """One line on held-out quality; a Spearman of None (constant predictions) prints as n/a."""
    if metrics.get("regret_median") is None:
        return "no held-out layers scored"
    rho = metrics.get("spearman_median")
    heuristic = metrics.get("heuristic_regret_median")
    return (
        f"regret median {metrics['regret_median']:.3f} p95 {metrics['regret_p95']:.3f}, "
        f"spearman median {'n/a' if rho is None else f'{rho:.3f}'}"
        + ("" if heuristic is None else f" (the heuristic's regret median {heuristic:.3f})")
    )


def split_layers(samples: Sequence[Sample], fraction: float, seed: int):
    """(train, held-out) samples, holding out a `fraction` of the layer shapes (Sample.layer_key:
    a shape's samples at every batch size and dtype go to the same side)."""
    keys = sorted({s.layer_key for s in samples})
    if len(keys) < 2 or fraction <= 0:
        return list(samples), []
    random.Random(seed).shuffle(keys)
    held = set(keys[: max(1, min(len(keys) - 1, round(fraction * len(keys))))])
    train = [s for s in samples if s.layer_key not in held]
    test = [s for s in samples if s.layer_key in held]
    return train, test


def shapes_lacking(samples: Sequence[Sample], fill: Sequence[Sample]) -> list[Sample]:
    """The `fill` samples of layer shapes (Sample.layer_key) that `samples` have none of."""
    covered = {s.layer_key for s in samples}
    return [s for s in fill if s.layer_key not in covered]


def train_group(
    samples: Sequence[Sample],
    *,
    holdout: float,
    seed: int,
    hyper: dict,
    threads: int,
    fill: Sequence[Sample] = (),
) -> tuple[object, dict]:
    """(booster trained on all samples and `fill`, metrics). With holdout > 0 the metrics score a
    model trained without the held-out layers on those layers; with 0 (or one layer) there are
    none. `fill` (rows of other layer shapes, --fill) is always trained on, never held out."""
    train, test = split_layers(samples, holdout, seed)
    train = [*train, *fill]
    held = sorted({s.layer_key for s in test})
    metrics: dict = {"heldout_layers": len(held)}
    if test:
        metrics.update(score(fit(train, hyper, seed, threads), test))
        metrics["heldout_layer_keys"] = held
        metrics["metrics_from"] = (
            f"held-out split of {len(held)} of {len({s.layer_key for s in samples})} layer shapes "
            f"(each at every batch size and dtype measured; {len(test)} rows), scored by a model "
            f"trained on the other {len(train)} rows"
            + (f" ({len(fill)} of them --fill rows)" if fill else "")
            + "; "
            "the model written was retrained on all rows"
        )
    else:
        why = "--holdout 0" if holdout <= 0 else "one layer shape: none to hold out"
        metrics["metrics_from"] = f"no held-out evaluation ({why}); trained on all rows"
    return fit([*samples, *fill], hyper, seed, threads), metrics


def training_domain(samples: Sequence[Sample]) -> dict:
    """The batch sizes and dtypes the samples were measured at, and each config field's values
    (PerfModel.batch_range reads the batch sizes, PerfModel.measured the config values; the dtypes
    are only recorded)."""
    fields = get_family(samples[0].family).config_fields
    return {
        "batch_sizes": sorted({s.params.n for s in samples}),
        "dtypes": sorted({s.params.dtype for s in samples}),
        "config_values": {
            name: sorted({getattr(s.config, name) for s in samples}) for name in fields
        },
    }


def source_name(path: Path) -> str:
    """A CSV's path relative to the repository root when it lies inside it, else its name."""
    root = PACKAGED_MODELS_DIR.parent.parent
    return path.resolve().relative_to(root).as_posix() if _inside(path, root) else path.name


def is_synthetic(samples: Sequence[Sample], comments: Sequence[str]) -> bool:
    """True when any sample or header comment says the data is synthetic."""
    return any(s.synthetic for s in samples) or any("SYNTHETIC" in c.upper() for c in comments)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def out_problem(out: Path) -> str | None:
    """Why models cannot be written under the folder `out` (created if missing), or None:
    checked before any training, so that a mistyped --out is not found only after it."""
    error = folder_write_error(out)
    if error is not None:
        why = error.strerror or error
        return f"cannot write models to {out}: {why}; pass --out a writable folder"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+", type=Path, help="sample CSVs from perf_sample.py")
    parser.add_argument("--out", type=Path, default=PACKAGED_MODELS_DIR, help="models folder")
    parser.add_argument(
        "--families", nargs="+", choices=list(FAMILIES), help="only these kernel families"
    )
    parser.add_argument("--arch", nargs="+", help="only these archs, e.g. sm_90")
    parser.add_argument("--per-device", action="store_true", help="one model per device name")
    parser.add_argument(
        "--holdout",
        type=float,
        default=0.2,
        help="fraction of layer shapes held out to score a model first (0: no evaluation)",
    )
    parser.add_argument(
        "--fill",
        nargs="+",
        type=Path,
        default=[],
        metavar="CSV",
        help="older sample CSVs: their rows of layer shapes the CSVs lack are trained on too",
    )
    parser.add_argument(
        "--keep-worse",
        action="store_true",
        help="write a model even where its held-out regret is worse than the heuristic's",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=1, help="XGBoost threads")
    # Values XGBoost would refuse with a traceback, or take and train a constant model with.
    kinds = {
        "trees": positive_int,
        "depth": positive_int,
        "eta": unit_fraction,
        "subsample": unit_fraction,
        "min_child_weight": non_negative_float,
    }
    for name, value in DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kinds[name], default=value)
    args = parser.parse_args(argv)
    hyper = {name: getattr(args, name) for name in DEFAULTS}
    if not 0 <= args.holdout < 1:
        print(
            f"train_perf_model: --holdout needs a fraction in [0, 1), got {args.holdout}",
            file=sys.stderr,
        )
        return 2
    try:
        import xgboost  # training needs it (spio reads the models without it)
    except Exception as error:  # ImportError, or xgboost's own where its library is missing
        print(
            f"train_perf_model: needs xgboost, which does not import ({error}); "
            "pip install 'spio[train]' (or xgboost)",
            file=sys.stderr,
        )
        return 2

    samples, comments, fill = [], [], []
    for paths, into in ((args.csv, samples), (args.fill, fill)):
        for path in paths:
            try:
                got, notes = read_samples(path)
            except (OSError, ValueError) as error:
                print(f"train_perf_model: cannot read {path}: {error}", file=sys.stderr)
                return 2
            into += got
            comments += notes

    def chosen(read: list[Sample]) -> list[Sample]:
        """The samples of the --families and --arch asked for."""
        return [
            s
            for s in read
            if (not args.families or s.family in args.families)
            and (not args.arch or s.arch in args.arch)
        ]

    samples = runs_as_sampled(chosen(samples))
    fill = chosen(fill)  # any variant: they stand in for shapes the samples lack
    if not samples:
        print("train_perf_model: no samples to train on", file=sys.stderr)
        return 2
    synthetic = is_synthetic([*samples, *fill], comments)
    if synthetic and _inside(args.out, PACKAGED_MODELS_DIR):
        print(
            "train_perf_model: refusing to write models trained on SYNTHETIC data into "
            f"{PACKAGED_MODELS_DIR}; only measured data may ship (pass --out DIR to experiment)",
            file=sys.stderr,
        )
        return 2
    if problem := out_problem(args.out):
        print(f"train_perf_model: {problem}", file=sys.stderr)
        return 2

    groups: dict[tuple, list[Sample]] = defaultdict(list)
    for sample in dedupe(samples):
        device = sample.device if args.per_device else None
        groups[(sample.family, sample.arch, device)].append(sample)

    import spio

    fills: dict[tuple, list[Sample]] = defaultdict(list)
    for sample in dedupe(fill):
        fills[(sample.family, sample.arch, sample.device if args.per_device else None)].append(
            sample
        )

    held_back = failed = 0
    for (family, arch, device), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        filled = shapes_lacking(group, fills[(family, arch, device)])
        booster, metrics = train_group(
            group,
            holdout=args.holdout,
            seed=args.seed,
            hyper=hyper,
            threads=args.threads,
            fill=filled,
        )
        trained = [*group, *filled]
        if worse_than_the_heuristic(metrics) and not args.keep_worse:
            print(
                f"train_perf_model: {family} {arch}{' ' + device if device else ''}: held back, "
                f"not written: {describe_metrics(metrics)}, so the heuristic ranks better on the "
                "held-out layers (and ranks where no model is); --keep-worse writes it anyway",
                file=sys.stderr,
            )
            held_back += 1
            continue
        path = model_path(args.out, family, arch, device)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Each file replaced whole: a stop mid-write must not leave a cut-off model where the
        # package (the default --out) loads its models from.
        model = bytes(booster.save_raw("ubj"))
        if problem := evaluation_problem(model, booster, [*group, *filled]):
            print(
                f"train_perf_model: {family} {arch}{' ' + device if device else ''}: {problem}; "
                "this model not written",
                file=sys.stderr,
            )
            failed += 1
            continue
        write_atomically(path, model)
        meta = {
            "family": family,
            "arch": arch,
            "device": device,
            "device_slug": device_slug(device) if device else None,
            "measured_on": sorted({s.device for s in trained}),
            "drivers": sorted({s.driver for s in trained}),
            "spio_versions": sorted({s.spio_version for s in trained}),
            # The kernel variants timed (perf_samples.kernel_variant; "" the plain FProp/DGrad
            # kernels, "tma" theirs by tensor copies, ...), --fill rows' too.
            "variants": sorted({s.variant for s in trained}),
            "synthetic": synthetic,
            "rows": len(trained),
            "layers": len({s.params.encode() for s in trained}),
            "configs": len({s.config for s in trained}),
            **training_domain(trained),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "sources": [source_name(p) for p in args.csv],
            **(
                {
                    "fill_sources": [source_name(p) for p in args.fill],
                    "fill_rows": len(filled),
                    "fill_layers": sorted({s.params.encode() for s in filled}),
                }
                if args.fill
                else {}
            ),
            "feature_version": FEATURE_VERSION,
            "features": list(feature_names(get_family(family))),
            "target": TARGET,
            "model_sha256": hashlib.sha256(model).hexdigest(),
            "trained_with": {
                "spio": spio.__version__,
                "xgboost": xgboost.__version__,
                "seed": args.seed,
                "holdout": args.holdout,
                **hyper,
            },
            **metrics,
        }
        write_atomically(path.with_suffix(".json"), (json.dumps(meta, indent=2) + "\n").encode())
        regret = describe_metrics(metrics)
        counted = f"{len(group)} rows" + (f" and {len(filled)} --fill rows" if args.fill else "")
        print(f"{family} {arch}{' ' + device if device else ''}: {counted}; {regret}")
        print(f"  wrote {path}")
    return 1 if held_back or failed else 0


if __name__ == "__main__":
    run_script(main)
