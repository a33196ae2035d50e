"""Performance model: features, sample CSVs, training on the SYNTHETIC dataset (known formula plus
noise), model lookup and fallbacks in get_kernel, selection speed, and perf_sample without a GPU."""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from spio.compiler import occupancy
from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels import perf_model as pm
from spio.kernels import perf_samples as ps
from spio.kernels.conv2d_gw8_factory import conv2d_gw8_kernel_factory
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P
from spio.kernels.conv2d_gw8_wgrad_factory import conv2d_gw8_wgrad_kernel_factory
from tests.conftest import REPO, load_script
from tests.data import synthetic_perf as syn

H200 = pm.DeviceIdentity(arch="sm_90", name="NVIDIA H200", driver="13.0")

#: (factory, options) per family, as get_kernel is called for it.
CALLS = {
    "conv2d_gw8_fprop": (conv2d_gw8_kernel_factory, {}),
    "conv2d_gw8_dgrad": (conv2d_gw8_kernel_factory, {"igrad": True}),
    "conv2d_gw8_wgrad": (conv2d_gw8_wgrad_kernel_factory, {}),
}


class FakeCuda:
    """Stands in for torch.device("cuda", 0): selection only reads .type and .index."""

    type = "cuda"
    index = 0


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """Models trained on the synthetic CSV into a temporary folder."""
    out = tmp_path_factory.mktemp("perf_models")
    assert syn.train_models(out) == 0
    return out


@pytest.fixture
def fake_device(monkeypatch, models):
    """get_kernel on a fake H200 (sm_90) with models read from `models`; caches cleared."""
    monkeypatch.setenv("SPIO_PERF_MODELS", str(models))
    monkeypatch.delenv("SPIO_AUTOTUNE", raising=False)
    monkeypatch.setattr(
        pm, "device_identity", lambda d: H200 if getattr(d, "type", "") == "cuda" else None
    )
    pm.clear_caches()
    yield FakeCuda()
    pm.clear_caches()


def _find_model(family, identity, folder):
    """The most specific model of `family` for `identity` in `folder` that loads, or None."""
    return next(pm.loadable_models(family, identity, folder), None)


def unseen_layers(count: int) -> list[P]:
    """Random layers that are not in the synthetic CSV."""
    seen = {s.params for s in ps.read_samples(syn.CSV_PATH)[0]}
    return [p for p in syn.synthetic_layers(count + 40, seed=11) if p not in seen][:count]


# --- data -------------------------------------------------------------------------------------


def test_the_models_folder_setting_is_a_path_as_the_others(monkeypatch, tmp_path):
    """`~` was not expanded (a folder that exists read as "not a folder"), and a relative one
    moved with the current folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    for text in ("models", "~/models", " ./models "):
        monkeypatch.setenv("SPIO_PERF_MODELS", text)
        assert pm.models_dir() == tmp_path / "models" and pm.models_setting_problem() is None
    monkeypatch.setenv("SPIO_PERF_MODELS", "~/nowhere")
    assert pm.models_setting_problem() == (
        "SPIO_PERF_MODELS must name a folder of models (sm_XX/<family>.ubj), got '~/nowhere', "
        "not a folder; unset it for the shipped models"
    )
    monkeypatch.setenv("SPIO_PERF_MODELS", " ")
    assert pm.models_dir() == pm.PACKAGED_MODELS_DIR and pm.models_setting_problem() is None


def test_synthetic_dataset_is_marked_and_follows_its_formula():
    samples, comments = ps.read_samples(syn.CSV_PATH)
    assert any("SYNTHETIC" in c for c in comments)
    assert samples and all(s.synthetic and s.device == syn.DEVICE for s in samples)
    assert {s.family for s in samples} == set(pm.FAMILIES)
    ratios = [
        math.log(s.seconds / syn.synthetic_seconds(s.family, s.params, s.config)) for s in samples
    ]
    assert max(abs(r) for r in ratios) < 6 * syn.NOISE  # formula plus noise, nothing else
    assert 0.5 * syn.NOISE < float(np.std(ratios)) < 1.5 * syn.NOISE


def test_samples_name_the_wgrad_reduction_spio_runs(monkeypatch, tmp_path, capsys):
    """WGrad samples time the whole pass as spio runs the config (partial sums and their sum, or
    zeroing and atomics), and training leaves out samples that timed anything else."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    train = load_script("train_perf_model")
    params = P(8, 32, 16, 16, padding=1)
    wgrad, fprop = pm.FAMILIES["conv2d_gw8_wgrad"], pm.FAMILIES["conv2d_gw8_fprop"]
    config = wgrad.configs(params)[0]
    monkeypatch.setenv("SPIO_TMA", "off")
    assert ps.kernel_variant(fprop, params, fprop.configs(params)[0], "sm_90") == ""
    assert ps.kernel_variant(wgrad, params, config, "sm_90") == ps.WGRAD_PARTIALS_VARIANT
    assert ps.WGRAD_PARTIALS_VARIANT == "partials-2"
    assert wgrad.make_kernel(params, config).name.endswith("__partials")
    monkeypatch.setattr(wg, "PARTIAL_BYTES", 16)  # no partial-sum buffer fits: atomics
    assert ps.kernel_variant(wgrad, params, config, "sm_90") == "atomic"
    assert not wgrad.make_kernel(params, config).name.endswith("__partials")
    monkeypatch.undo()
    monkeypatch.setenv("SPIO_TMA", "off")

    def sample(variant, synthetic=False):
        return ps.Sample(
            wgrad.name, "sm_90", "GPU", "13.0", "0", synthetic, params, config, 1e-5, "", variant
        )

    samples = [sample("partials-2"), sample("atomic"), sample(ps.LEGACY_WGRAD_VARIANT),
               sample("", synthetic=True), sample("partials")]  # fmt: skip
    kept = train.runs_as_sampled(samples)
    assert kept == [samples[0], samples[3]]
    out = capsys.readouterr().out
    assert "leaving out 1 conv2d_gw8_wgrad samples that timed 'atomic' where spio runs" in out
    assert f"timed {ps.LEGACY_WGRAD_VARIANT!r}" in out
    # Timed before the slot layout and sum of 2026-12-06: not what spio runs now.
    assert "samples that timed 'partials' where spio runs 'partials-2'" in out
    # Nor a sample of it when a sweep resumes: the key tells the two apart.
    assert samples[0].key() != samples[4].key()


@pytest.mark.parametrize("setting", ["loads", "loads+stores"])
def test_samples_name_the_tensor_copies_spio_runs(monkeypatch, capsys, setting):
    """With SPIO_TMA set, a sample's variant names the tensor copies of the kernel spio runs for
    its config on the sample's arch (none before sm_90, nor where the stages would not fit), the
    kernel perf sampling and autotuning make is that kernel, and training keeps only samples of
    what runs under its own setting."""
    from spio.kernels.families import with_tensor_copies

    train = load_script("train_perf_model")
    monkeypatch.setenv("SPIO_TMA", setting)
    stores = setting == "loads+stores"
    params = P(8, 64, 32, 32, padding=1)
    seen = collections.Counter()
    for family in pm.FAMILIES.values():
        configs = family.configs(params)
        for config in configs[:: max(1, len(configs) // 12)]:
            for arch in ("sm_80", "sm_89", "sm_90"):
                variant = ps.kernel_variant(family, params, config, arch)
                kernel = with_tensor_copies(family.make_kernel(params, config), arch)
                tma, tmaio = kernel.info_value("tma"), bool(kernel.info_value("tma_stores"))
                assert tma == ("tma" in variant), (family.name, config, arch, variant)
                assert tmaio == variant.endswith("tma-stores"), (family.name, config, variant)
                assert (arch == "sm_90") or not tma  # no tensor copies before sm_90
                seen[(family.pass_, variant)] += 1
    expected = {("fprop", "tma"), ("dgrad", "tma"), ("wgrad", "partials-2+tma")}
    if stores:  # WGrad stores no rows
        expected = {("fprop", "tma-stores"), ("dgrad", "tma-stores"), ("wgrad", "partials-2+tma")}
    assert expected <= set(seen), seen

    # A config whose stages fit only without tensor copies in, or (with their output staging
    # smaller) with copies out too, runs and is sampled as it fits.
    wide = P(8, 64, 64, 64, padding=1)
    fprop = pm.FAMILIES["conv2d_gw8_fprop"]
    config = next(
        c
        for c in fprop.configs(wide)
        if fprop.shared_mem_bytes(wide, c, swizzled=True, tma=True) > fd.MAX_SHARED_BYTES
    )
    kernel = with_tensor_copies(fprop.make_kernel(wide, config), "sm_90")
    assert ps.kernel_variant(fprop, wide, config, "sm_90") == ("tma-stores" if stores else "")
    assert kernel.info_value("tma") == kernel.info_value("tma_stores") == stores

    # Training under this setting keeps the tensor-copy samples and leaves out the cp.async ones
    # (and the reverse with SPIO_TMA unset).
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    config = family.configs(params)[0]

    def sample(variant):
        return ps.Sample(family.name, "sm_90", "GPU", "13.0", "0", False, params, config, 1e-5,
                         "", variant)  # fmt: skip

    tma, plain = sample("tma-stores" if stores else "tma"), sample("")
    assert tma.key() != plain.key()  # a resumed sweep times the other again
    assert train.runs_as_sampled([tma, plain]) == [tma]
    assert "samples that timed 'none' where spio runs 'tma" in capsys.readouterr().out
    monkeypatch.setenv("SPIO_TMA", "off")
    assert train.runs_as_sampled([tma, plain]) == [plain]
    assert f"samples that timed {tma.variant!r} where spio runs 'none'" in capsys.readouterr().out


def test_features_agree_with_the_kernels():
    layers = [
        P(3, 40, 17, 23, padding=4),
        P(2, 8, 9, 20, padding=(0, 2), r=1, s=5),
        P(16, 96, 28, 31, padding=2, r=5, s=5, dtype="bf16", has_bias=True),
    ]
    for params in layers:
        for family in pm.FAMILIES.values():
            configs = family.configs(params)
            x = pm.features(family, params, configs)
            assert x.shape == (len(configs), len(pm.feature_names(family)))
            assert np.isfinite(x).all()
            picks = range(0, len(configs), max(1, len(configs) // 6))
            for i in picks:
                kernel = family.make_kernel(params, configs[i])
                row = dict(zip(pm.feature_names(family), x[i], strict=True))
                assert row["blocks"] == kernel.grid[0]
                assert row["threads"] == kernel.threads
                assert row["smem_bytes"] == kernel.shared_mem_bytes


def test_derived_features_keep_the_definitions_the_shipped_models_learnt():
    """The shipped models were trained on these definitions; changing one without a new
    FEATURE_VERSION would feed them numbers they never saw. Worked out by hand for configs of
    a layer of 8 groups, 16 x 16: resident blocks per SM are ceil(blocks / 132) here (the
    configs are small enough for more), bytes in flight those blocks' (stages - 1) rows."""
    fprop, wgrad = pm.FAMILIES["conv2d_gw8_fprop"], pm.FAMILIES["conv2d_gw8_wgrad"]
    fprop_config = fprop.config_type(groups=4, block_p=8, block_q=16, stages=4)
    wgrad_config = wgrad.config_type(groups=4, block_p=8, block_q=16, block_n=4, stages=3)
    # FProp's row: 4 groups x (16 + 2) pixels x 16 bytes; WGrad's: an x row (16 + 2 pixels) and
    # a dy row (16 pixels) of 4 groups.
    fprop_row, wgrad_row = 4 * 18 * 16, 4 * (18 + 16) * 16
    cases = [
        # N images x 2 row tiles x 2 group tiles
        (fprop, fprop_config, 8, 32, 1, 3 * fprop_row),
        (fprop, fprop_config, 64, 256, 2, 2 * 3 * fprop_row),
        # N / 4 image tiles x 2 row tiles x 2 group tiles
        (wgrad, wgrad_config, 8, 8, 1, 2 * wgrad_row),
        (wgrad, wgrad_config, 272, 272, 3, 3 * 2 * wgrad_row),
    ]
    for family, config, n, blocks, resident, in_flight in cases:
        params = P(n, 64, 16, 16, padding=1)
        features = pm.features(family, params, [config])[0]
        row = dict(zip(pm.feature_names(family), features, strict=True))
        case = (family.name, n)
        assert row["blocks"] == blocks and row["resident"] == resident, case
        assert row["waves"] == pytest.approx(blocks / (132 * resident)), case
        assert row["fill"] == pytest.approx(min(1, blocks / 132)), case
        assert row["log_bytes_in_flight"] == pytest.approx(math.log(in_flight)), case


def test_a_model_worse_than_the_heuristic_is_held_back(tmp_path, capsys):
    """Nothing had compared a model with the heuristic it replaces: one whose held-out median
    regret is worse is not written (exit 1, saying so) unless --keep-worse."""
    import json

    script = load_script("train_perf_model")
    metrics = {"regret_median": 1.2, "regret_p95": 1.3, "spearman_median": 0.1}
    assert script.worse_than_the_heuristic({**metrics, "heuristic_regret_median": 1.1})
    assert not script.worse_than_the_heuristic({**metrics, "heuristic_regret_median": 1.2})
    assert not script.worse_than_the_heuristic(metrics)  # nothing held out: nothing to compare
    line = script.describe_metrics({**metrics, "heuristic_regret_median": 1.1})
    assert line.endswith("(the heuristic's regret median 1.100)")

    samples = [s for s in ps.read_samples(syn.CSV_PATH)[0] if s.family == "conv2d_gw8_dgrad"]
    # Times that reverse the heuristic's own order within each layer: the model learns them,
    # and the heuristic's pick is each held-out layer's slowest.
    machine = fd.typical_machine(samples[0].arch)
    family = pm.FAMILIES["conv2d_gw8_dgrad"]
    reversed_times = []
    for group in script.by_layer(samples).values():
        ranked = pm.heuristic_ranking(family, group[0].params, [s.config for s in group], machine)
        slowest_first = {c: 1e-5 * (len(ranked) - i) for i, c in enumerate(ranked)}
        reversed_times += [dataclasses.replace(s, seconds=slowest_first[s.config]) for s in group]
    ps.append_samples(tmp_path / "s.csv", reversed_times)
    argv = [str(tmp_path / "s.csv"), "--out", str(tmp_path / "m"), "--trees", "20"]
    assert script.main([*argv, "--holdout", "0.3"]) == 0  # the model beats it: written
    meta = json.loads(
        pm.model_path(tmp_path / "m", family.name, "sm_90").with_suffix(".json").read_text()
    )
    assert meta["heuristic_regret_median"] > meta["regret_median"]
    # The heuristic's order kept, and a model too small to learn it: held back.
    in_order = [dataclasses.replace(s, seconds=2e-5 / s.seconds * 1e-5) for s in reversed_times]
    ps.append_samples(tmp_path / "t.csv", in_order)
    capsys.readouterr()
    argv = [str(tmp_path / "t.csv"), "--out", str(tmp_path / "n"), "--trees", "2", "--depth", "1"]
    assert script.main([*argv, "--holdout", "0.3"]) == 1  # (a two-stump model: constant)
    err = capsys.readouterr().err
    assert "held back, not written" in err and "--keep-worse" in err
    assert not pm.model_path(tmp_path / "n", family.name, "sm_90").exists()
    assert script.main([*argv, "--holdout", "0.3", "--keep-worse"]) == 0
    assert pm.model_path(tmp_path / "n", family.name, "sm_90").exists()


def test_training_does_not_depend_on_the_rows_order(tmp_path):
    """The same rows reversed had trained another model (different picks on 28 of 60 layers);
    so had two GPUs' rows of the same configs given in the other order (rows that tied in the
    sort kept the CSVs' order)."""
    script = load_script("train_perf_model")
    one_gpu = [s for s in ps.read_samples(syn.CSV_PATH)[0] if s.family == "conv2d_gw8_fprop"]
    other_gpu = [dataclasses.replace(s, device="GPU B", seconds=s.seconds / 2) for s in one_gpu]
    samples = one_gpu + other_gpu
    for name, rows in (("a", samples), ("b", samples[::-1])):
        ps.append_samples(tmp_path / f"{name}.csv", rows)
        argv = [str(tmp_path / f"{name}.csv"), "--out", str(tmp_path / name), "--trees", "10"]
        assert script.main([*argv, "--holdout", "0"]) == 0
    a, b = (pm.model_path(tmp_path / d, "conv2d_gw8_fprop", "sm_90") for d in "ab")
    assert a.read_bytes() == b.read_bytes()


def test_metrics_line_survives_constant_predictions():
    """A model too small to rank (constant predictions) has no Spearman: the summary line says
    n/a instead of crashing, as it did on the H200 on 2026-11-29."""
    describe = load_script("train_perf_model").describe_metrics
    assert describe({"heldout_layers_scored": 0}) == "no held-out layers scored"
    line = describe({"regret_median": 1.0, "regret_p95": 1.2, "spearman_median": None})
    assert line == "regret median 1.000 p95 1.200, spearman median n/a"
    assert "0.500" in describe({"regret_median": 1.0, "regret_p95": 1.0, "spearman_median": 0.5})


def test_a_model_of_one_layer_shape_says_why_nothing_was_held_out():
    """With --holdout above 0 and one layer shape there is none to hold out: the metadata said
    "--holdout 0", which was not given."""
    train_script = load_script("train_perf_model")
    samples = syn.synthetic_samples(layers=2, configs_per_layer=8)
    first = samples[0]
    one = [s for s in samples if (s.layer_key, s.family) == (first.layer_key, first.family)]
    hyper = dict(train_script.DEFAULTS, trees=5)
    for holdout, why in ((0.2, "one layer shape: none to hold out"), (0.0, "--holdout 0")):
        _, metrics = train_script.train_group(one, holdout=holdout, seed=0, hyper=hyper, threads=1)
        assert metrics["metrics_from"] == f"no held-out evaluation ({why}); trained on all rows"


def test_layers_are_held_out_whole():
    train_script = load_script("train_perf_model")
    samples, _ = ps.read_samples(syn.CSV_PATH)
    train, test = train_script.split_layers(samples, 0.25, seed=3)
    assert train and test and len(train) + len(test) == len(samples)
    assert not {s.layer_key for s in train} & {s.layer_key for s in test}

    def shapes(samples):  # a held-out shape measured at another batch size had been trained on
        return {dataclasses.replace(s.params, n=1, dtype="fp16") for s in samples}

    assert not shapes(train) & shapes(test)
    assert len({s.params.n for s in samples}) > 1  # the synthetic data has several batch sizes

    def at_twice_the_batch(s):  # the synthetic data has each shape at one batch size and dtype
        return dataclasses.replace(s, params=dataclasses.replace(s.params, n=2 * s.params.n))

    train, test = train_script.split_layers(
        samples + [at_twice_the_batch(s) for s in samples], 0.25, seed=3
    )
    assert train and test and not shapes(train) & shapes(test)
    first_two = sorted({s.layer_key for s in samples})[:2]
    two = [s for s in samples if s.layer_key in first_two]
    train, test = train_script.split_layers(two, 0.9, seed=0)
    assert train and test  # one of two shapes held out, never both
    held = [train_script.split_layers(samples, 0.25, seed)[1] for seed in range(4)]
    assert len({frozenset(s.layer_key for s in test) for test in held}) > 1  # drawn by the seed


def test_repeated_measurements_keep_their_median():
    train_script = load_script("train_perf_model")
    sample = ps.read_samples(syn.CSV_PATH)[0][0]
    repeats = [dataclasses.replace(sample, seconds=t) for t in (1e-5, 2e-5, 9e-5)]
    assert train_script.dedupe(repeats) == [dataclasses.replace(sample, seconds=2e-5)]


def test_held_out_scores_are_per_layer_regret_and_spearman():
    """Three layers of 4 configs, measured and predicted by hand: regrets 1, 2 and 1.5 (measured
    time of the predicted best over the best), Spearman 1, -0.4 and 0.8."""
    train_script = load_script("train_perf_model")
    fprop = [s for s in ps.read_samples(syn.CSV_PATH)[0] if s.family == "conv2d_gw8_fprop"]
    groups = [group[:4] for group in train_script.by_layer(fprop).values() if len(group) >= 4]
    cases = [  # (measured, predicted) per layer
        ([1, 2, 3, 4], [1, 2, 3, 4]),
        ([1, 2, 3, 4], [4, 1, 3, 2]),
        ([2, 3, 4, 5], [2, 1, 3, 4]),
    ]
    samples = [
        dataclasses.replace(s, seconds=m / 1024)
        for group, (measured, _) in zip(groups[:3], cases, strict=True)
        for s, m in zip(group, measured, strict=True)
    ]
    predictions = iter(np.array(predicted, float) for _, predicted in cases)
    booster = types.SimpleNamespace(predict=lambda data: next(predictions))
    scores = train_script.score(booster, samples)
    # The heuristic's pick among the same measured configs, scored the same way.
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    machine = fd.typical_machine(samples[0].arch)
    heuristic = []
    for group, (measured, _) in zip(groups[:3], cases, strict=True):
        configs = [s.config for s in group]
        pick = pm.heuristic_ranking(family, group[0].params, configs, machine)[0]
        heuristic.append(measured[configs.index(pick)] / min(measured))
    assert scores.pop("heuristic_regret_median") == pytest.approx(float(np.median(heuristic)))
    assert scores.pop("heuristic_regret_p95") == pytest.approx(np.percentile(heuristic, 95))
    assert scores == {
        "heldout_layers_scored": 3,
        "regret_median": 1.5,
        "regret_p95": pytest.approx(1.95),  # 1.5 + 0.9 * (2 - 1.5)
        "regret_max": 2.0,
        "spearman_median": pytest.approx(0.8),
        "spearman_min": pytest.approx(-0.4),
    }
    # Ties take their average rank: ranks 1, 2.5, 2.5, 4 against 1, 2, 3, 4 give sqrt(0.9).
    assert train_script.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9**0.5)


def test_held_out_regret_ranks_each_gpus_times_apart():
    """Samples of two GPUs train one model of their arch: a layer's configs are ranked among one
    GPU's times. Both GPUs' rows had been one layer: tied predictions picked the first GPU's
    time and divided it by the other's best, a regret of 2.0 where each GPU alone scores 1.0."""
    script = load_script("train_perf_model")
    one_gpu = [s for s in ps.read_samples(syn.CSV_PATH)[0] if s.family == "conv2d_gw8_fprop"]
    other_gpu = [dataclasses.replace(s, device="GPU B", seconds=s.seconds / 2) for s in one_gpu]
    hyper = dict(script.DEFAULTS, trees=30)

    def scores(samples):
        _, metrics = script.train_group(
            script.dedupe(samples), holdout=0.2, seed=0, hyper=hyper, threads=1
        )
        keys = ("regret_median", "heuristic_regret_median", "regret_p95")
        return [metrics[key] for key in keys], metrics["heldout_layers_scored"]

    (alone, layers), (both, cases) = scores(one_gpu), scores(one_gpu + other_gpu)
    assert cases == 2 * layers  # each GPU's layer scored on its own
    # B ranks every config as A does: the medians agree (the p95 moves with the model, trained
    # on twice the rows), and no case comes near the 2.0 of the GPUs mixed.
    assert both[:2] == pytest.approx(alone[:2], rel=0.02)
    assert both[2] < 1.5


# --- training ---------------------------------------------------------------------------------


def test_training_writes_models_with_honest_metadata(models):
    import json

    for name in pm.FAMILIES:
        path = pm.model_path(models, name, syn.ARCH)
        meta = json.loads(path.with_suffix(".json").read_text())
        assert path.stat().st_size > 0
        assert meta["synthetic"] is True
        assert meta["measured_on"] == [syn.DEVICE]
        assert meta["rows"] > 100 and meta["layers"] >= 20
        assert meta["features"] == list(pm.feature_names(pm.FAMILIES[name]))
        assert meta["heldout_layers"] >= 3
        assert "retrained on all rows" in meta["metrics_from"]
        samples = [s for s in ps.read_samples(syn.CSV_PATH)[0] if s.family == name]
        assert meta["batch_sizes"] == sorted({s.params.n for s in samples})
        assert meta["dtypes"] == ["bf16", "fp16"]
        assert meta["sources"] == ["tests/data/synthetic_perf_samples.csv"]
        # held-out layer shapes rank as the formula says (DGrad's median is 1.059 here: 1.05
        # had held only while a held-out shape's other batch sizes were trained on)
        assert meta["regret_median"] <= 1.10, meta
        assert meta["regret_p95"] <= 1.35, meta
        assert meta["spearman_median"] >= 0.85, meta


def test_holdout_scores_first_and_the_model_written_is_trained_on_all_rows(tmp_path, capsys):
    import json

    args = ("--families", "conv2d_gw8_wgrad", "--trees", "20", "--seed", "4")
    assert syn.train_models(tmp_path / "held", *args, "--holdout", "0.3") == 0
    assert syn.train_models(tmp_path / "all", *args, "--holdout", "0") == 0
    held, every = (
        pm.model_path(tmp_path / d, "conv2d_gw8_wgrad", syn.ARCH) for d in ("held", "all")
    )
    assert held.read_bytes() == every.read_bytes()  # the split only scored a first model
    scored = json.loads(held.with_suffix(".json").read_text())
    plain = json.loads(every.with_suffix(".json").read_text())
    assert scored["heldout_layers"] == len(scored["heldout_layer_keys"]) > 0
    assert scored["metrics_from"].startswith(f"held-out split of {scored['heldout_layers']} of ")
    assert scored["regret_median"] >= 1.0 and scored["rows"] == plain["rows"]
    assert plain["heldout_layers"] == 0 and "regret_median" not in plain
    assert "no held-out evaluation" in plain["metrics_from"]
    capsys.readouterr()
    assert syn.train_models(tmp_path / "bad", *args, "--holdout", "1") == 2
    assert "--holdout needs a fraction in [0, 1), got 1.0" in capsys.readouterr().err
    assert syn.train_models(tmp_path / "bad", *args, "--holdout", "-0.1") == 2
    assert not (tmp_path / "bad").exists()


def test_fill_rows_stand_in_for_the_shapes_the_samples_lack(tmp_path, capsys, monkeypatch):
    """--fill: older samples of layer shapes the CSVs lack are trained on whatever kernel variant
    they timed, and never held out; their rows of shapes the CSVs have are not used."""
    import json

    script = load_script("train_perf_model")
    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    measured = [  # as measured on a GPU, each row timing what spio runs for its config
        dataclasses.replace(
            s, synthetic=False, variant=ps.kernel_variant(family, s.params, s.config, s.arch)
        )
        for s in ps.read_samples(syn.CSV_PATH)[0]
        if s.family == family.name
    ]
    keys = sorted({s.layer_key for s in measured})
    new_keys = set(keys[: len(keys) // 2])
    new = [s for s in measured if s.layer_key in new_keys]
    older = [  # the other shapes, timed as the atomic kernel alone; and a new shape, 10x slower
        dataclasses.replace(s, variant="atomic-kernel-only")
        for s in measured
        if s.layer_key not in new_keys
    ]
    # Not used: rows of the new shapes, 10x slower, at their batch size and at twice it; the
    # older shapes as another arch measured them.
    stale = [dataclasses.replace(s, seconds=10 * s.seconds) for s in new[:20]]
    stale += [
        dataclasses.replace(s, params=dataclasses.replace(s.params, n=2 * s.params.n))
        for s in stale
    ]
    elsewhere = [dataclasses.replace(s, arch="sm_80", device="An sm_80 GPU") for s in older]
    ps.append_samples(tmp_path / "new.csv", new)
    ps.append_samples(tmp_path / "older.csv", older + stale + elsewhere)

    def train(out: str, *args: str) -> dict:
        csv = "older.csv" if out == "older" else "new.csv"
        argv = [str(tmp_path / csv), "--out", str(tmp_path / out), "--trees", "20"]
        assert script.main([*argv, "--seed", "1", *args]) == 0
        return json.loads(
            pm.model_path(tmp_path / out, family.name, "sm_90").with_suffix(".json").read_text()
        )

    fitted = []  # the layer shapes of each model fit: the held-out split's, then the one written
    fit = script.fit

    def record(rows, *args):
        fitted.append({s.layer_key for s in rows})
        return fit(rows, *args)

    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(script, "fit", record)
        filled = train("filled", "--holdout", "0.4", "--fill", str(tmp_path / "older.csv"))
    older_keys = {s.layer_key for s in older}
    assert len(fitted) == 2 and older_keys <= fitted[0] and fitted[1] == set(keys)
    assert f"{len(new)} rows and {len(older)} --fill rows" in capsys.readouterr().out
    assert filled["rows"] == len(new) + len(older) and filled["fill_rows"] == len(older)
    assert filled["fill_layers"] == sorted({s.params.encode() for s in older})
    assert filled["fill_sources"] == ["older.csv"]
    timed = {s.variant for s in new}  # as spio runs each config: partial sums or atomics
    assert (
        any(v.split("+")[0] == ps.WGRAD_PARTIALS_VARIANT for v in timed)
        and "atomic-kernel-only" not in timed
    )
    assert filled["variants"] == sorted(timed | {"atomic-kernel-only"})
    assert filled["layers"] == len({s.params.encode() for s in measured})
    assert filled["heldout_layers"] > 0 and set(filled["heldout_layer_keys"]) <= new_keys
    assert f"({len(older)} of them --fill rows)" in filled["metrics_from"]
    plain = train("plain", "--holdout", "0.4")
    assert plain["rows"] == len(new) and "fill_rows" not in plain
    assert plain["variants"] == sorted(timed)
    assert plain["heldout_layer_keys"] == filled["heldout_layer_keys"]  # drawn from new shapes
    models = [pm.model_path(tmp_path / d, family.name, "sm_90") for d in ("filled", "plain")]
    assert models[0].read_bytes() != models[1].read_bytes()
    # One model per device: another device's rows fill none of this one's shapes.
    other = [dataclasses.replace(s, device="Another GPU") for s in older]
    ps.append_samples(tmp_path / "other.csv", other)
    argv = ["--per-device", "--holdout", "0", "--fill", str(tmp_path / "other.csv")]
    assert script.main([str(tmp_path / "new.csv"), "--out", str(tmp_path / "dev"), *argv]) == 0
    path = pm.model_path(tmp_path / "dev", family.name, "sm_90", syn.DEVICE).with_suffix(".json")
    assert json.loads(path.read_text())["fill_rows"] == 0
    # Given as samples, not --fill, the older rows are left out (they timed another variant) but
    # for the stale ones (of this arch).
    capsys.readouterr()
    assert train("older", "--holdout", "0")["rows"] == len(stale)
    assert "timed 'atomic-kernel-only'" in capsys.readouterr().out
    # Synthetic fill rows never ship (a stand-in for spio/perf_models, so nothing lands there).
    ps.append_samples(tmp_path / "synthetic.csv", [dataclasses.replace(older[0], synthetic=True)])
    script.PACKAGED_MODELS_DIR = tmp_path / "perf_models"
    argv = ["--out", str(tmp_path / "perf_models"), "--fill", str(tmp_path / "synthetic.csv")]
    assert script.main([str(tmp_path / "new.csv"), *argv]) == 2
    assert "SYNTHETIC" in capsys.readouterr().err and not (tmp_path / "perf_models").exists()


def test_trees_and_seed_reach_xgboost(tmp_path):
    import xgboost

    args = ("--families", "conv2d_gw8_wgrad", "--trees", "3", "--holdout", "0")
    paths = []
    for seed in ("1", "2"):
        assert syn.train_models(tmp_path / seed, *args, "--seed", seed) == 0
        paths.append(pm.model_path(tmp_path / seed, "conv2d_gw8_wgrad", syn.ARCH))
    assert xgboost.Booster(model_file=str(paths[0])).num_boosted_rounds() == 3
    assert paths[0].read_bytes() != paths[1].read_bytes()  # subsample 0.9 draws rows by seed


def test_training_refuses_a_model_spio_would_evaluate_otherwise(tmp_path, monkeypatch, capsys):
    """spio evaluates the trees itself (spio.kernels.trees): the training script checks that
    this gives exactly xgboost's predictions on the training rows before writing a model, so a
    format change of a later xgboost is refused there, not misread by users."""
    from spio.kernels import trees

    args = ("--families", "conv2d_gw8_wgrad", "--trees", "3", "--holdout", "0")
    exact = trees.TreeEnsemble.predict
    monkeypatch.setattr(trees.TreeEnsemble, "predict", lambda self, x: exact(self, x) * 1.0001)
    assert syn.train_models(tmp_path / "off", *args) == 1
    assert "differs from xgboost's" in capsys.readouterr().err
    assert not list((tmp_path / "off").rglob("*.ubj"))
    monkeypatch.setattr(trees, "read_ubjson", lambda data: {"learner": {}})
    assert syn.train_models(tmp_path / "unread", *args) == 1
    assert "spio cannot read the model xgboost wrote" in capsys.readouterr().err
    monkeypatch.undo()
    assert syn.train_models(tmp_path / "exact", *args) == 0
    # One family's model refused: the others are still trained and written, and the message
    # says which was not (it had said "nothing written" after writing one, and stopped).
    calls = []

    def off_once(self, x):
        calls.append(1)
        return exact(self, x) * (1.0001 if len(calls) == 1 else 1.0)

    monkeypatch.setattr(trees.TreeEnsemble, "predict", off_once)
    assert syn.train_models(tmp_path / "one", "--trees", "3", "--holdout", "0") == 1
    err = capsys.readouterr().err
    assert "conv2d_gw8_dgrad sm_90: spio's evaluation" in err and "this model not written" in err
    written = sorted(p.stem for p in (tmp_path / "one").rglob("*.ubj"))
    assert written == ["conv2d_gw8_fprop", "conv2d_gw8_wgrad"]


def test_model_ranks_unseen_layers_like_the_formula(models):
    """It ranks configs as the formula does, and predicts their log run times, not only their
    order: within a factor of 1.5 for most configs."""
    regrets, rhos, errors = [], [], []
    for name, family in pm.FAMILIES.items():
        model = pm.PerfModel.load(pm.model_path(models, name, syn.ARCH))
        for params in unseen_layers(8):
            configs = [c for c in family.configs(params) if model.measured(c)]
            truth = np.array([syn.synthetic_seconds(name, params, c) for c in configs])
            predicted = model.predict_log_seconds(params, configs)
            best = model.rank(params, configs)[0]
            errors.extend(np.abs(predicted - np.log(truth)))
            regrets.append(truth[configs.index(best)] / truth.min())
            rhos.append(
                np.corrcoef(np.argsort(np.argsort(predicted)), np.argsort(np.argsort(truth)))[0, 1]
            )
    assert np.median(regrets) <= 1.05 and np.percentile(regrets, 90) <= 1.5, regrets
    assert np.median(rhos) >= 0.85, rhos
    assert np.median(errors) <= math.log(1.5), np.median(errors)


def test_refuses_to_ship_a_model_trained_on_synthetic_data(capsys, tmp_path):
    before = sorted(pm.PACKAGED_MODELS_DIR.rglob("*"))
    assert syn.train_models(pm.PACKAGED_MODELS_DIR) == 2
    assert "SYNTHETIC" in capsys.readouterr().err
    assert sorted(pm.PACKAGED_MODELS_DIR.rglob("*")) == before
    # Nor into a folder inside it (a stand-in for spio/perf_models, so that nothing lands there).
    script = load_script("train_perf_model")
    script.PACKAGED_MODELS_DIR = tmp_path / "perf_models"
    out = tmp_path / "perf_models" / "sm_90"
    assert script.main([str(syn.CSV_PATH), "--out", str(out)]) == 2
    assert not (tmp_path / "perf_models").exists()


@pytest.mark.parametrize("out", ["a-file/models", "a-file"])
def test_an_output_folder_it_cannot_write_is_named_before_any_training(
    out, tmp_path, monkeypatch, capsys
):
    """A --out that cannot hold models (below a file, or a file): one line naming it, exit 2,
    before any model is trained, not an OSError traceback after the first one."""
    script = load_script("train_perf_model")
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setattr(script, "train_group", lambda *a, **k: pytest.fail("trained"))
    assert script.main([str(syn.CSV_PATH), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert f"train_perf_model: cannot write models to {tmp_path / out}: " in err
    assert "pass --out a writable folder" in err


def test_shipped_models_were_measured_on_a_real_gpu_and_load():
    paths = sorted(pm.PACKAGED_MODELS_DIR.rglob("*.ubj"))
    assert paths and (pm.PACKAGED_MODELS_DIR / "README.md").is_file()
    for path in paths:
        model = pm.PerfModel.load(path)  # loadable, and for this spio's feature set
        meta = model.meta
        assert path.stem == meta["family"] and meta["arch"] in path.parts, path
        assert meta["synthetic"] is False and meta["feature_version"] == pm.FEATURE_VERSION
        assert meta["measured_on"] and all(
            name.strip() and "SYNTHETIC" not in name.upper() for name in meta["measured_on"]
        ), meta["measured_on"]
        assert meta["rows"] > 0 and meta["layers"] > 0
        assert meta["batch_sizes"] and meta["dtypes"] and model.batch_range is not None
        assert meta["heldout_layers_scored"] > 0 and meta["regret_median"] >= 1.0
        # the measured data ships in the repository too, --fill's included
        for source in [*meta["sources"], *meta.get("fill_sources", [])]:
            samples, comments = ps.read_samples(REPO / source)
            assert not any(s.synthetic for s in samples) and not any(
                "SYNTHETIC" in c.upper() for c in comments
            )


def test_a_model_ranks_configs_it_never_measured_last(models):
    """Multi-image FProp/DGrad blocks (block_n > 1) came after the shipped FProp model's samples
    (and the synthetic ones): a model ranks them after every config like those it was trained
    on, so neither its pick nor autotuning's top-k is a config whose time the trees cannot tell."""
    import json

    for name, folders in (
        ("conv2d_gw8_fprop", (models, pm.PACKAGED_MODELS_DIR)),
        ("conv2d_gw8_dgrad", (models,)),  # the shipped one has measured every block_n (below)
    ):
        family = pm.FAMILIES[name]
        for folder in folders:
            model = pm.PerfModel.load(pm.model_path(folder, name, "sm_90"))
            assert model.meta["config_values"]["block_n"] == [1]
            params = P(64, 256, 8, 8, padding=1)
            configs = family.configs(params)
            ranked = model.rank(params, configs)
            multi = [c for c in configs if c.block_n > 1]
            assert multi and sorted(ranked, key=configs.index) == configs
            assert ranked[-len(multi) :] == multi
            assert all(c.block_n == 1 for c in ranked[: -len(multi)])
    dgrad = pm.PerfModel.load(pm.model_path(pm.PACKAGED_MODELS_DIR, "conv2d_gw8_dgrad", "sm_90"))
    assert dgrad.meta["config_values"]["block_n"] == [1, 2, 4, 8]
    # The WGrad model shipped before 2026-12-05 was trained on 1 and 4 images per block, not 16.
    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    shipped = pm.PerfModel.load(pm.model_path(pm.PACKAGED_MODELS_DIR, family.name, "sm_90"))
    assert shipped.meta["config_values"]["block_n"] == [1, 4, 16]
    values = {**shipped.meta["config_values"], "block_n": [1, 4]}
    meta = {**shipped.meta, "config_values": values}
    wgrad = pm.PerfModel(family, shipped.path, meta, shipped.trees)
    params = P(128, 1024, 7, 7, padding=1)
    configs = family.configs(params)
    unseen = [c for c in configs if c.block_n == 16]
    assert unseen and set(wgrad.rank(params, configs)[-len(unseen) :]) == set(unseen)
    assert set(shipped.rank(params, configs)[-len(unseen) :]) != set(unseen)
    # A model whose metadata predates config_values takes every config as measured.
    path = pm.model_path(models, "conv2d_gw8_fprop", "sm_90")
    meta = json.loads(path.with_suffix(".json").read_text())
    del meta["config_values"]
    old = pm.PerfModel(pm.FAMILIES["conv2d_gw8_fprop"], path, meta, None)
    assert all(old.measured(c) for c in multi)


def test_a_model_that_measured_none_of_a_layers_configs_leaves_it_to_the_heuristic(tmp_path):
    """A model whose `config_values` lack a value every config of a layer has (a foreign or
    user-trained model) had "ranked" them all as unmeasured, in config order: the pick was the
    family's first config. The heuristic ranks them instead, as for a layer no model covers."""
    import json

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    (tmp_path / "sm_90").mkdir()
    for suffix in (".json", ".ubj"):
        source = pm.model_path(pm.PACKAGED_MODELS_DIR, family.name, "sm_90").with_suffix(suffix)
        shutil.copy(source, tmp_path / "sm_90" / source.name)
    meta_path = pm.model_path(tmp_path, family.name, "sm_90").with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    meta["config_values"]["block_p"] = [v for v in meta["config_values"]["block_p"] if v != 4]
    meta_path.write_text(json.dumps(meta))
    tiny = P(32, 64, 4, 4, padding=1)  # every config's block_p is 4
    assert {c.block_p for c in family.configs(tiny)} == {4}
    ranked, model = pm.rank_configs(family, tiny, H200, tmp_path)
    assert model is None
    assert ranked == pm.heuristic_ranking(family, tiny, family.configs(tiny), H200.machine)
    ranked, model = pm.rank_configs(family, P(32, 64, 16, 16, padding=1), H200, tmp_path)
    assert model is not None  # a layer it measured configs of keeps the model


def test_samples_from_before_a_config_field_read_its_default():
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    fields = {"groups": "2", "block_p": "8", "block_q": "16", "warp_q16": "1", "stages": "4"}
    for extra in ({}, {"block_n": ""}, {"mma_k": " ", "block_n": "1"}):
        config = family.config_from_fields({**fields, **extra})
        assert (config.block_n, config.mma_k) == (1, 8)
    assert family.config_from_fields({**fields, "block_n": "4"}).block_n == 4


def test_shipped_sm90_model_leaves_small_batches_to_the_heuristic():
    """Measured at N = 128 only, the H200 models picked a 2-block config for N = 1."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    pm.clear_caches()
    small, large = P(1, 64, 64, 64, padding=1), P(128, 64, 64, 64, padding=1)
    ranked, model = pm.rank_configs(family, small, H200, pm.PACKAGED_MODELS_DIR)
    assert model is None and ranked[0] == conv2d_gw8_kernel_factory.default_config(small)
    ranked, model = pm.rank_configs(family, large, H200, pm.PACKAGED_MODELS_DIR)
    assert model is not None and model.meta["measured_on"] == ["NVIDIA H200"]
    pm.clear_caches()


# --- run time ---------------------------------------------------------------------------------


def test_get_kernel_uses_the_model_of_the_device_arch(fake_device, models):
    differs = 0
    for name, (factory, options) in CALLS.items():
        family = pm.FAMILIES[name]
        model = pm.PerfModel.load(pm.model_path(models, name, "sm_90"))
        for params in unseen_layers(4):
            kernel = factory.get_kernel(params, fake_device, **options)
            expected = model.rank(params, family.configs(params))[0]
            assert dict(kernel.info)["config"] == expected
            differs += expected != factory.default_config(params, **options)
    assert differs > 0  # the model, not the heuristic, decided
    # No device, or a CPU device: the heuristic, and no model is consulted.
    params = unseen_layers(1)[0]
    for device in (None, type("Cpu", (), {"type": "cpu", "index": None})()):
        kernel = conv2d_gw8_kernel_factory.get_kernel(params, device)
        assert dict(kernel.info)["config"] == conv2d_gw8_kernel_factory.default_config(params)


def test_get_kernel_takes_a_device_as_torch_device_does(fake_device):
    """A string or an ordinal names the GPU too: it had got the heuristic's config, silently,
    where a torch.device got the model's."""
    differs = 0
    for name, (factory, options) in CALLS.items():
        for params in unseen_layers(3):
            expected = dict(factory.get_kernel(params, fake_device, **options).info)["config"]
            differs += expected != factory.default_config(params, **options)
            for device in ("cuda:0", 0):  # "cuda" alone asks torch for the current GPU
                got = dict(factory.get_kernel(params, device, **options).info)["config"]
                assert got == expected, (name, device)
    assert differs > 0  # the model, not the heuristic, decided


def test_selection_follows_spio_perf_models_changed_in_a_running_process(
    fake_device, tmp_path, monkeypatch
):
    """Selections are memoised by the models folder too: pointing SPIO_PERF_MODELS at a folder
    without models makes the next selection the heuristic's, not the memoised model pick."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    params = unseen_layers(1)[0]
    pm.select_config(conv2d_gw8_kernel_factory, params, fake_device)
    assert pm.selection_source(family, params, fake_device).startswith("model ")
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))
    config = pm.select_config(conv2d_gw8_kernel_factory, params, fake_device)
    assert pm.selection_source(family, params, fake_device) == "heuristic"
    assert config == conv2d_gw8_kernel_factory.default_config(params)


def test_the_heuristics_pick_heads_its_ranking():
    """Where no model applies, select_config takes factory.default_config and autotuning times
    the head of heuristic_ranking: the same config, so an untuned and a tuned process start
    from the same pick."""
    for params in unseen_layers(12):
        for name, (factory, options) in CALLS.items():
            family = pm.FAMILIES[name]
            ranking = pm.heuristic_ranking(family, params, family.configs(params))
            assert ranking[0] == factory.default_config(params, **options), (name, params)


def test_device_specific_model_is_preferred(tmp_path):
    generic = pm.model_path(tmp_path, "conv2d_gw8_fprop", "sm_90")
    specific = pm.model_path(tmp_path, "conv2d_gw8_fprop", "sm_90", "NVIDIA H200")
    assert specific == tmp_path / "sm_90" / "nvidia-h200" / "conv2d_gw8_fprop.ubj"
    assert pm.model_candidates(tmp_path, "conv2d_gw8_fprop", H200) == [specific, generic]


def test_device_specific_model_is_loaded(tmp_path, models):
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    src = pm.model_path(models, family.name, "sm_90")
    for device in (None, "NVIDIA H200"):
        dst = pm.model_path(tmp_path, family.name, "sm_90", device)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
        shutil.copy(src.with_suffix(".json"), dst.with_suffix(".json"))
    pm.clear_caches()
    assert _find_model(family, H200, tmp_path).path.parent.name == "nvidia-h200"
    other = pm.DeviceIdentity("sm_90", "NVIDIA H100 80GB HBM3", "13.0")
    assert _find_model(family, other, tmp_path).path.parent.name == "sm_90"
    assert _find_model(family, pm.DeviceIdentity("sm_80", "A100", "13.0"), tmp_path) is None


def _place(models: Path, folder: Path, family: str, arch: str, slot=None, **meta) -> Path:
    """Copy the synthetic sm_90 model of `family` to `folder`'s slot for (arch, device `slot`), with
    `meta` written over its metadata; returns the copy's path."""
    import json

    src = pm.model_path(models, family, "sm_90")
    dst = pm.model_path(folder, family, arch, slot)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
    dst.with_suffix(".json").write_text(
        json.dumps(json.loads(src.with_suffix(".json").read_text()) | meta)
    )
    return dst


def test_a_model_in_another_familys_or_devices_slot_is_ignored(
    fake_device, models, tmp_path, caplog
):
    """A model file is used only for the family, arch and device it was trained for: FProp's
    model copied into the DGrad and WGrad slots had ranked their configs with FProp's features
    (WGrad's raised AttributeError), and an sm_90 model in sm_80/ was used on an sm_80 GPU."""
    fprop = pm.FAMILIES["conv2d_gw8_fprop"]
    for name in ("conv2d_gw8_dgrad", "conv2d_gw8_wgrad"):
        dst = pm.model_path(tmp_path, name, "sm_90")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pm.model_path(models, fprop.name, "sm_90"), dst)
        shutil.copy(
            pm.model_path(models, fprop.name, "sm_90").with_suffix(".json"),
            dst.with_suffix(".json"),
        )
    _place(models, tmp_path, fprop.name, "sm_80")
    _place(models, tmp_path, fprop.name, "sm_90", "NVIDIA H100", device="NVIDIA H200",
           device_slug="nvidia-h200")  # fmt: skip
    sm_80 = pm.DeviceIdentity(arch="sm_80", name="NVIDIA A100", driver="13.0")
    h100 = pm.DeviceIdentity(arch="sm_90", name="NVIDIA H100", driver="13.0")
    with caplog.at_level(logging.WARNING, logger="spio"):
        for name in ("conv2d_gw8_dgrad", "conv2d_gw8_wgrad"):
            assert _find_model(pm.FAMILIES[name], H200, tmp_path) is None
        assert _find_model(fprop, sm_80, tmp_path) is None
        assert _find_model(fprop, h100, tmp_path) is None  # and no generic sm_90 FProp model
        layer = unseen_layers(1)[0]
        for name, (factory, options) in CALLS.items():
            if name != "conv2d_gw8_fprop":
                ranked, model = pm.rank_configs(pm.FAMILIES[name], layer, H200, tmp_path)
                assert model is None and ranked[0] == factory.default_config(layer, **options)
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "is a model of conv2d_gw8_fprop, not of conv2d_gw8_dgrad" in messages
    assert "is a model of conv2d_gw8_fprop, not of conv2d_gw8_wgrad" in messages
    assert "was trained for 'sm_90', not for the device's sm_80" in messages
    assert "was measured on 'NVIDIA H200', not on NVIDIA H100" in messages


def test_a_device_model_that_does_not_cover_the_batch_size_gives_way_to_the_arch_model(
    fake_device, models, tmp_path, caplog
):
    """The per-device model is tried first; one measured at other batch sizes had sent the layer
    to the heuristic although the arch's model covered it."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    generic = _place(models, tmp_path, family.name, "sm_90")  # batch sizes 4 to 64
    specific = _place(models, tmp_path, family.name, "sm_90", "NVIDIA H200", batch_sizes=[1024])
    layer = P(32, 64, 28, 28, padding=1)
    with caplog.at_level(logging.INFO, logger="spio"):
        _, model = pm.rank_configs(family, layer, H200, tmp_path)
    assert model is not None and model.path == generic
    notes = [r.getMessage() for r in caplog.records if "does not apply" in r.getMessage()]
    assert len(notes) == 1 and str(specific) in notes[0]
    _, model = pm.rank_configs(family, P(1024, 64, 28, 28, padding=1), H200, tmp_path)
    assert model is not None and model.path == specific


def test_an_unusable_model_file_is_read_once(fake_device, models, tmp_path, monkeypatch):
    """Its error is remembered (until the file changes), not met again for every new layer."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    dst = _place(models, tmp_path, family.name, "sm_90", feature_version=-1)
    loads = []
    real = pm.PerfModel.load.__func__
    monkeypatch.setattr(
        pm.PerfModel, "load", classmethod(lambda cls, *a: loads.append(a) or real(cls, *a))
    )
    for layer in unseen_layers(3):
        assert pm.rank_configs(family, layer, H200, tmp_path)[1] is None
    assert len(loads) == 1
    _place(models, tmp_path, family.name, "sm_90")  # mended: a new file, read again
    os.utime(dst.with_suffix(".json"), ns=(1, 1))
    assert pm.rank_configs(family, unseen_layers(1)[0], H200, tmp_path)[1] is not None
    assert len(loads) == 2


def test_a_change_to_the_metadata_alone_is_read(fake_device, models, tmp_path):
    """Loaded models are memoised by the state of the metadata file too: a JSON edited beside
    an untouched model file takes effect (here it names a feature set this spio does not
    compute, so the model gives way to the heuristic)."""
    import json

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    dst = _place(models, tmp_path, family.name, "sm_90")
    layer = unseen_layers(1)[0]
    assert pm.rank_configs(family, layer, H200, tmp_path)[1] is not None
    model_state = dst.stat().st_mtime_ns
    meta = dst.with_suffix(".json")
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"feature_version": -1}))
    os.utime(meta, ns=(1, 1))  # a new state even where file times are coarse
    assert dst.stat().st_mtime_ns == model_state
    assert pm.rank_configs(family, layer, H200, tmp_path)[1] is None


def test_missing_model_falls_back_to_the_heuristic_logged_once(fake_device, tmp_path, caplog):
    os.environ["SPIO_PERF_MODELS"] = str(tmp_path)  # empty folder (monkeypatch restores it)
    with caplog.at_level(logging.INFO, logger="spio"):
        for params in unseen_layers(3):
            kernel = conv2d_gw8_kernel_factory.get_kernel(params, fake_device)
            assert dict(kernel.info)["config"] == conv2d_gw8_kernel_factory.default_config(params)
    notes = [r for r in caplog.records if "no perf model for conv2d_gw8_fprop" in r.getMessage()]
    assert len(notes) == 1 and "analytic heuristic" in notes[0].getMessage()


def test_a_model_covers_half_its_smallest_to_twice_its_largest_batch_size():
    family = pm.FAMILIES["conv2d_gw8_fprop"]

    def model(**meta):
        return pm.PerfModel(family=family, path=Path("m.ubj"), meta=meta, trees=None)

    measured = model(batch_sizes=[32, 128], dtypes=["fp16"])
    assert measured.batch_range == (16.0, 256.0)
    for n, covered in [(15, False), (16, True), (64, True), (256, True), (257, False)]:
        assert (measured.coverage_gap(P(n, 64, 28, 28, padding=1)) is None) is covered, n
    assert measured.coverage_gap(P(64, 64, 28, 28, padding=1, dtype="bf16")) is None  # any dtype
    reason, explanation = measured.coverage_gap(P(1, 64, 28, 28, padding=1))
    assert reason == "batch sizes below the range"
    assert explanation == (
        "batch size 1 is below the range it covers, 16 to 256 (measured at batch sizes 32, 128)"
    )
    assert model().coverage_gap(P(1, 64, 28, 28, padding=1)) is None  # no batch sizes recorded
    assert model().batch_range is None


def test_uncovered_batch_size_falls_back_to_the_heuristic_logged_once(fake_device, models, caplog):
    meta = pm.PerfModel.load(pm.model_path(models, "conv2d_gw8_fprop", "sm_90")).meta
    assert meta["batch_sizes"] == [4, 8, 16, 32, 64]  # covers 2 to 128
    layers = [P(n, 64, 28, 28, padding=1) for n in (1000, 129, 4096)]
    with caplog.at_level(logging.INFO, logger="spio"):
        for params in layers:
            for factory, options in CALLS.values():
                kernel = factory.get_kernel(params, fake_device, **options)
                assert dict(kernel.info)["config"] == factory.default_config(params, **options)
        conv2d_gw8_kernel_factory.get_kernel(P(1, 64, 28, 28, padding=1), fake_device)  # below
    notes = [r.getMessage() for r in caplog.records if "does not apply" in r.getMessage()]
    assert len(notes) == len(CALLS) + 1, notes
    assert all(r.levelno == logging.INFO for r in caplog.records)
    above = [note for note in notes if "batch size 1000 is above the range it covers" in note]
    assert sorted(name for name in CALLS for note in above if f"{name}.ubj" in note) == sorted(
        CALLS
    )
    assert all("2 to 128" in note and "analytic heuristic" in note for note in notes)
    assert "batch size 1 is below the range" in notes[-1] and "fprop.ubj" in notes[-1]


def test_autotune_times_the_heuristic_top_k_for_an_uncovered_batch_size(fake_device, monkeypatch):
    from spio.kernels import autotune

    seen = []

    def fake_autotune(family, params, device, identity, candidates, *, model=None):
        seen.append((candidates, model))
        return candidates[0]

    monkeypatch.setenv("SPIO_AUTOTUNE", "1")
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "3")
    monkeypatch.setattr(autotune, "autotune", fake_autotune)
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    # 4x4 images: every tile is the whole image, so every pick has multi-image variants.
    uncovered, covered = P(1000, 64, 4, 4, padding=1), P(16, 64, 4, 4, padding=1)
    conv2d_gw8_kernel_factory.get_kernel(uncovered, fake_device)
    conv2d_gw8_kernel_factory.get_kernel(covered, fake_device)
    (heuristic, none), (ranked, model) = seen
    assert none is None
    assert heuristic[:3] == pm.heuristic_ranking(family, uncovered, family.configs(uncovered))[:3]
    assert model is not None and ranked[:3] == model.rank(covered, family.configs(covered))[:3]
    # Then the pick's multi-image variants, which neither ranking can weigh.
    for timed in (heuristic, ranked):
        extra = timed[3:]
        assert extra and {c.block_n for c in extra} == {2, 4, 8}
        assert all(dataclasses.replace(c, block_n=1) == timed[0] for c in extra)


def test_unjudged_variants_are_the_picks_other_image_counts(models):
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    small, large = P(64, 64, 8, 8, padding=1), P(64, 64, 96, 96, padding=1)
    pick = family.default_config(small)
    variants = pm.unjudged_variants(family, None, pick, family.configs(small))
    assert pick.block_n == 1 and [c.block_n for c in variants] == [2, 4, 8]
    assert all(dataclasses.replace(c, block_n=1) == pick for c in variants)
    large_pick = family.default_config(large)
    assert pm.unjudged_variants(family, None, large_pick, family.configs(large)) == []
    # A model trained on every block_n it is asked about weighs them itself.
    model = pm.PerfModel.load(pm.model_path(models, family.name, "sm_90"))
    model.meta["config_values"]["block_n"] = [1, 2, 4, 8]
    assert pm.unjudged_variants(family, model, pick, family.configs(small)) == []
    # WGrad's heuristic weighs its images per block, but ranks 16, which no GPU has run, last:
    # autotuning without a model times the pick's twin with 16, not those with counts it weighs.
    wgrad = pm.FAMILIES["conv2d_gw8_wgrad"]
    wgrad_pick = wgrad.default_config(small)
    variants = pm.unjudged_variants(wgrad, None, wgrad_pick, wgrad.configs(small))
    assert wgrad_pick.block_n != 16 and [c.block_n for c in variants] == [16]
    assert dataclasses.replace(variants[0], block_n=wgrad_pick.block_n) == wgrad_pick
    assert {c.block_n for c in wgrad.configs(small)} == {1, 4, 16}  # a 1 or 4 twin was there


@pytest.mark.parametrize(
    "damage",
    [
        "garbage",
        "truncated",
        "empty",
        "json",
        "features",
        "features not a list",
        "family not a string",
        "target",
        "batch_sizes",
        "batch_sizes of zero",
        "batch_sizes of a bool",
        "batch_sizes empty",  # had read as trusted at every batch size
        "feature_version a bool",  # True == 1 had passed
        "feature_version newer",
        "config_values",
        "config_values of an unknown field",
        "a tree's child out of range",  # XGBoost loaded it, then crashed predicting (SIGSEGV)
        "a tree's child out of range, no digest",  # a model trained before model_sha256
        "a tree's node its own child, no digest",
        "model_sha256 not a string",
    ],
)
def test_corrupted_model_gives_a_clear_error_or_a_logged_fallback(
    damage, fake_device, tmp_path, models, caplog, monkeypatch
):
    import json

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    src = pm.model_path(models, family.name, "sm_90")
    dst = pm.model_path(tmp_path, family.name, "sm_90")
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    shutil.copy(src.with_suffix(".json"), dst.with_suffix(".json"))
    if damage == "garbage":
        dst.write_bytes(b"this is not a model" * 50)
    elif damage == "truncated":
        dst.write_bytes(src.read_bytes()[: src.stat().st_size // 3])
    elif damage == "empty":
        dst.write_bytes(b"")
    elif damage == "json":
        dst.with_suffix(".json").write_text("{not json")
    elif damage == "features":
        meta = json.loads(dst.with_suffix(".json").read_text())
        meta["features"] = meta["features"][:-1]
        dst.with_suffix(".json").write_text(json.dumps(meta))
    elif damage in ("features not a list", "family not a string", "target"):
        meta = json.loads(dst.with_suffix(".json").read_text())
        field, value = {
            "features not a list": ("features", 3),
            "family not a string": ("family", ["x"]),
            "target": ("target", "log_seconds"),
        }[damage]
        meta[field] = value
        dst.with_suffix(".json").write_text(json.dumps(meta))
    elif damage.startswith(("batch_sizes", "config_values")):
        meta = json.loads(dst.with_suffix(".json").read_text())
        field, value = {
            "batch_sizes": ("batch_sizes", "128"),
            "batch_sizes of zero": ("batch_sizes", [32, 0]),
            "batch_sizes of a bool": ("batch_sizes", [32, True]),
            "batch_sizes empty": ("batch_sizes", []),
            "config_values": ("config_values", {"block_n": "1"}),
            "config_values of an unknown field": ("config_values", {"block_m": [1]}),
        }[damage]
        meta[field] = value
        dst.with_suffix(".json").write_text(json.dumps(meta))
    elif damage.startswith("a tree's"):
        dst.write_bytes(_damaged_tree(src, own_child="own child" in damage))
        if "no digest" in damage:
            meta = json.loads(dst.with_suffix(".json").read_text())
            del meta["model_sha256"]
            dst.with_suffix(".json").write_text(json.dumps(meta))
    elif damage.startswith("feature_version"):
        meta = json.loads(dst.with_suffix(".json").read_text())
        meta["feature_version"] = True if "bool" in damage else pm.FEATURE_VERSION + 1
        dst.with_suffix(".json").write_text(json.dumps(meta))
    elif damage == "model_sha256 not a string":
        meta = json.loads(dst.with_suffix(".json").read_text())
        meta["model_sha256"] = 1
        dst.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(pm.PerfModelError, match=str(dst.with_suffix("")) + r"\.(ubj|json)") as e:
        pm.PerfModel.load(dst)
    if damage == "feature_version newer":  # retraining with this spio is not the remedy
        assert "a newer spio trained it: upgrade spio to use it" in str(e.value)

    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))
    params = unseen_layers(1)[0]
    with caplog.at_level(logging.INFO, logger="spio"):
        kernel = conv2d_gw8_kernel_factory.get_kernel(params, fake_device)
    assert dict(kernel.info)["config"] == conv2d_gw8_kernel_factory.default_config(params)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ignoring perf model" in warnings[0].getMessage()
    assert str(dst.parent) in warnings[0].getMessage()


@pytest.mark.parametrize(
    "damage",
    [
        "model file missing beside its metadata",
        "metadata missing beside the model file",
        "a folder",
        "a dangling link",
        "no entry",
    ],
)
def test_a_model_file_that_is_not_there_as_meant_is_warned_of_and_skipped(
    fake_device, models, tmp_path, monkeypatch, caplog, damage
):
    """A models folder copied in part (metadata without its model), or with a folder or a
    dangling link where the model file belongs: the model was meant to apply, so the heuristic
    stands in with a warning (it had been skipped with an info line alone); and a folder the
    process cannot enter (Path.is_file re-raises EACCES: here faked) had ended the call in a
    PermissionError instead of falling back."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    dst = _place(models, tmp_path, family.name, "sm_90")
    if damage == "model file missing beside its metadata":
        dst.unlink()
    elif damage == "metadata missing beside the model file":  # (a raw OSError had been logged)
        dst.with_suffix(".json").unlink()
    elif damage == "a folder":
        dst.unlink()
        dst.mkdir()
    elif damage == "a dangling link":
        dst.unlink()
        dst.symlink_to(tmp_path / "gone.ubj")
    else:
        is_file = Path.is_file

        def no_entry(path):
            if path.parent == dst.parent:
                raise PermissionError(13, "Permission denied", str(path))
            return is_file(path)

        monkeypatch.setattr(Path, "is_file", no_entry)
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))
    params = unseen_layers(1)[0]
    with caplog.at_level(logging.WARNING, logger="spio"):
        kernel = conv2d_gw8_kernel_factory.get_kernel(params, fake_device)
    assert dict(kernel.info)["config"] == conv2d_gw8_kernel_factory.default_config(params)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = {
        "model file missing beside its metadata": "is missing (its metadata",
        "metadata missing beside the model file": "has no metadata: conv2d_gw8_fprop.json is",
        "a folder": "is not a file",
        "a dangling link": "is not a file",
        "no entry": "Permission denied",
    }[damage]
    assert len(warnings) == 1 and "ignoring perf model" in warnings[0], warnings
    assert said in warnings[0] and str(dst.parent) in warnings[0]


def _damaged_tree(path: Path, own_child: bool) -> bytes:
    """The model at `path` as .ubj bytes with its first tree's root linking to a child past the
    tree's end (or to itself): XGBoost loads such a file, and its prediction then crashes."""
    import json

    import xgboost

    model = json.loads(bytes(xgboost.Booster(model_file=str(path)).save_raw("json")))
    model["learner"]["gradient_booster"]["model"]["trees"][0]["left_children"][0] = (
        0 if own_child else 10**6
    )
    return bytes(xgboost.Booster(model_file=bytearray(json.dumps(model).encode())).save_raw("ubj"))


def test_shipped_and_trained_models_record_their_digest(models):
    import hashlib

    for folder in (pm.PACKAGED_MODELS_DIR, models):
        for path in sorted(Path(folder).glob("sm_*/**/*.ubj")):
            meta = pm.read_meta(path.with_suffix(".json"))
            assert meta["model_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), path
            assert pm.PerfModel.load(path).trees.depth > 0  # its trees read and check out


def test_a_model_measured_on_another_gpu_of_the_arch_says_so_once(fake_device, caplog):
    h100 = pm.DeviceIdentity(arch="sm_90", name="NVIDIA H100 80GB HBM3", driver="13.0")
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    with caplog.at_level(logging.INFO, logger="spio"):
        for params in unseen_layers(2):
            assert pm.rank_configs(family, params, h100)[1] is not None
    notes = [r.getMessage() for r in caplog.records if "was measured on" in r.getMessage()]
    assert len(notes) == 1, notes
    assert syn.DEVICE in notes[0] and "NVIDIA H100 80GB HBM3" in notes[0]

    caplog.clear()
    synthetic = dataclasses.replace(H200, name=syn.DEVICE)  # the GPU it was measured on
    with caplog.at_level(logging.INFO, logger="spio"):
        pm.rank_configs(family, unseen_layers(1)[0], synthetic)
    assert not [r for r in caplog.records if "was measured on" in r.getMessage()]


def test_selection_loads_no_model_and_predicts_once_a_layer(fake_device, monkeypatch):
    """Selection loads no model once they are loaded and ranks each layer's configs with one
    batched prediction; it is memoised. Its time is printed, with a bound that only a gross
    regression breaks: on the 2-core CI machine 20 layers took 90 to 170 ms (2026-12-01), as
    the host's load varied, so a tight bound there fails without any change to spio."""
    *layers, first = unseen_layers(21)
    factory, options = CALLS["conv2d_gw8_fprop"]
    pm.select_config(factory, first, fake_device, **options)  # loads the model: a one-time cost
    calls = {"load": 0, "predict": 0}
    load, predict = pm.PerfModel.load, pm.PerfModel.predict_log_seconds

    def counted_load(*args, **kwargs):
        calls["load"] += 1
        return load(*args, **kwargs)

    def counted_predict(self, *args, **kwargs):
        calls["predict"] += 1
        return predict(self, *args, **kwargs)

    monkeypatch.setattr(pm.PerfModel, "load", staticmethod(counted_load))
    monkeypatch.setattr(pm.PerfModel, "predict_log_seconds", counted_predict)
    totals, worst = [], 0.0
    for _ in range(3):
        pm.clear_caches(models=False)
        start = time.perf_counter()
        for params in layers:
            t = time.perf_counter()
            pm.select_config(factory, params, fake_device, **options)
            worst = max(worst, time.perf_counter() - t)
        totals.append(time.perf_counter() - start)
    print(
        f"selection of 20 layers: best {min(totals) * 1e3:.1f} ms, worst layer {worst * 1e3:.1f} ms"
    )
    assert calls == {"load": 0, "predict": 3 * len(layers)}
    assert min(totals) < 1.0
    # memoised: a second selection of the same layer predicts nothing
    for params in layers:
        pm.select_config(factory, params, fake_device, **options)
    assert calls["predict"] == 3 * len(layers)


# --- scripts ----------------------------------------------------------------------------------


def test_perf_sample_without_a_gpu_exits_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    csv_path = tmp_path / "samples.csv"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "perf_sample.py"), "--csv", str(csv_path)],
        capture_output=True,
        encoding="utf-8",
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr
    assert not csv_path.exists()


def test_perf_sample_budget_must_stay_under_8_minutes(monkeypatch):
    import torch

    script = load_script("perf_sample")
    for budget in ("480", "0"):
        with pytest.raises(SystemExit) as exit_info:
            script.main(["--budget-s", budget])
        assert exit_info.value.code == 2
    assert script.MAX_BUDGET_S < 480
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main(["--budget-s", str(script.MAX_BUDGET_S)]) == 2  # accepted; then no GPU


def test_perf_sample_sweep_covers_the_layer_table():
    layers = load_script("perf_sample").sweep_layers(extra=5)
    assert len(set(layers)) == len(layers) == 12 * 4 * 2 + 5
    assert {(p.r, p.s) for p in layers} >= {(3, 3), (5, 5), (1, 3), (3, 1)}
    assert {p.dtype for p in layers} == {"fp16", "bf16"}
    assert {p.n for p in layers} >= {32, 64, 128, 256}
    assert all((p.p, p.q) == (p.h, p.w) for p in layers[: 12 * 4 * 2])  # "same" padding


def test_perf_sample_times_dgrad_of_a_biased_layer_as_spio_runs_it():
    """DGrad reads no bias: spio runs the bias-free layer's kernel, so that is what is timed
    (perf_sample samples family.layer_as_run of each layer, as _kernels.dgrad_kernel runs it)."""
    from spio.functional import _kernels

    as_run = {name: family.layer_as_run for name, family in pm.FAMILIES.items()}
    biased = P(32, 64, 28, 28, padding=1, has_bias=True)
    assert as_run["conv2d_gw8_dgrad"](biased).has_bias is False
    assert as_run["conv2d_gw8_fprop"](biased) == biased
    assert as_run["conv2d_gw8_wgrad"](biased) == biased
    kernel = _kernels.dgrad_kernel(biased, None)
    assert kernel.info_value("params") == as_run["conv2d_gw8_dgrad"](biased)


@pytest.mark.cuda
def test_sample_resume_and_train_on_a_gpu(tmp_path):
    """The real pipeline, small: time 3 drawn configs of 2 layers per family (and the picks
    perf_sample always adds), resume (nothing left), train into a temporary folder, and load
    the models."""
    csv_path = tmp_path / "samples.csv"
    command = [
        sys.executable, str(REPO / "scripts" / "perf_sample.py"), "--csv", str(csv_path),
        "--layers", "2", "--batches", "8", "--dtypes", "fp16", "--max-configs", "3",
        "--budget-s", "240", "--repeats", "5",
    ]  # fmt: skip
    first = subprocess.run(command, capture_output=True, encoding="utf-8", timeout=300, cwd=REPO)
    assert first.returncode == 0, first.stderr
    samples, _ = ps.read_samples(csv_path)
    rows = {name: sum(s.family == name for s in samples) for name in pm.FAMILIES}
    assert all(2 * 3 <= count <= 2 * (3 + 4) for count in rows.values()), rows
    assert all(not s.synthetic and 0 < s.seconds < 0.1 for s in samples)
    again = subprocess.run(command, capture_output=True, encoding="utf-8", timeout=300, cwd=REPO)
    assert again.returncode == 0 and "0 configs to time" in again.stdout
    assert len(ps.read_samples(csv_path)[0]) == len(samples)
    train = load_script("train_perf_model")
    assert train.main([str(csv_path), "--out", str(tmp_path / "models"), "--trees", "20"]) == 0
    for name in pm.FAMILIES:
        model = pm.PerfModel.load(pm.model_path(tmp_path / "models", name, samples[0].arch))
        assert model.meta["synthetic"] is False and model.meta["rows"] == rows[name]


def _fake_gpu(monkeypatch) -> dict:
    """perf_sample's view of a GPU, faked: CUDA available, an sm_90 "Fake GPU" with 60 MB of L2
    (the dict returned; change it to change the GPU), driver 13.0, and no kernel inputs made."""
    import torch

    from spio.cuda import driver
    from spio.kernels import autotune

    attrs = {
        "arch": "sm_90",
        "name": "Fake GPU",
        "l2_cache_bytes": 60 * 2**20,
        "sm_count": 132,
        "max_threads_per_sm": 2048,
        "max_shared_memory_per_sm": 233472,
        "max_registers_per_sm": 65536,
    }
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(driver, "device_attributes", lambda ordinal=0: dict(attrs))
    monkeypatch.setattr(driver, "driver_version", lambda: (13, 0))
    monkeypatch.setattr(autotune, "kernel_inputs", lambda *a: [])
    return attrs


def test_perf_sample_resumes_and_respects_its_budget_with_fakes(tmp_path, monkeypatch):
    """perf_sample's bookkeeping on CPU: the GPU, compiler and timer are fakes."""
    monkeypatch.setenv("SPIO_TMA", "off")
    import spio.compiler
    from spio.kernels import autotune

    _fake_gpu(monkeypatch)
    compiled = []
    monkeypatch.setattr(
        spio.compiler,
        "compile_many",
        lambda jobs, **kw: compiled.extend(jobs) or [None] * len(jobs),
    )
    timed = []

    def fake_time(family, params, kernel, arg_sets, device, **kw):
        timed.append(kernel.name)
        return 1e-5 * (1 + len(timed) % 7)

    monkeypatch.setattr(autotune, "time_kernel", fake_time)
    script = load_script("perf_sample")
    csv_path = tmp_path / "samples.csv"
    args = ["--csv", str(csv_path), "--layers", "2", "--batches", "8", "--dtypes", "fp16",
            "--max-configs", "4", "--workers", "1"]  # fmt: skip
    assert script.main(args) == 0
    samples, _ = ps.read_samples(csv_path)
    # Every config timed was compiled; with them, each WGrad layer's sum_slots kernel, which its
    # partials configs' timed calls run.
    sums = [job.name for job in compiled if job.name.startswith("sum_slots")]
    assert len(samples) == len(timed) == len(compiled) - len(sums)
    partials = {n.split("__")[1] for n in timed if n.endswith("__partials")}
    assert partials and len(sums) == len(set(sums)) == len(partials)
    by_layer: dict = {}
    for sample in samples:
        by_layer.setdefault((sample.family, sample.params), []).append(sample.config)
    assert len(by_layer) == 2 * len(pm.FAMILIES)
    for (name, params), configs in by_layer.items():  # 4 drawn, and the heuristic's pick
        assert 4 <= len(configs) <= 4 + 4, (name, configs)
        assert pm.FAMILIES[name].default_config(params) in configs
    assert {s.device for s in samples} == {"Fake GPU"} and not any(s.synthetic for s in samples)
    assert {s.driver for s in samples} == {"13.0"}
    timed.clear()
    assert script.main(args) == 0  # resumed: nothing left to time
    assert timed == [] and len(ps.read_samples(csv_path)[0]) == len(samples)
    # Rows of WGrad's partial sums as timed before 2026-12-06 ("partials", run 7's seed) are no
    # samples of what spio runs now: a resumed sweep times those configs again, only those.
    rows = csv_path.read_text().replace(",partials-2\n", ",partials\n")
    stale = rows.count(",partials\n")
    csv_path.write_text(rows)
    assert stale and script.main(args) == 0
    assert len(timed) == stale and all(name.endswith("__partials") for name in timed)
    timed.clear()
    more = ["--csv", str(tmp_path / "b.csv"), "--batches", "8", "--budget-s", "0.001"]
    assert script.main(more) == 0  # the budget ends the run early
    assert len(timed) < 5
    # Compiles take 0.4 s and the budget is 1 s: a compile starts only when it should end in
    # time, so at most two layers are timed and the run ends within the budget (it used to
    # wait, past it, for the compile ahead and the one started after that: about 1.65 s).
    # The script's clock is a fake that only compiles (0.4 s) and timings (1 ms) advance, so
    # the check does not depend on how busy this machine is.
    clock = [0.0]
    lock = threading.Lock()

    def advance(seconds):
        with lock:
            clock[0] += seconds

    def slow_compile(jobs, **kw):
        advance(0.4)
        compiled.extend(jobs)
        return [None] * len(jobs)

    def slow_time(*args, **kw):
        advance(0.001)
        return fake_time(*args, **kw)

    monkeypatch.setattr(spio.compiler, "compile_many", slow_compile)
    monkeypatch.setattr(autotune, "time_kernel", slow_time)
    monkeypatch.setattr(script, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    compiled.clear()
    timed.clear()
    slow = ["--csv", str(tmp_path / "c.csv"), "--batches", "8", "--layers", "4",
            "--max-configs", "2", "--budget-s", "1"]  # fmt: skip
    assert script.main(slow) == 0
    assert clock[0] <= 1.0
    kernels = [job for job in compiled if not job.name.startswith("sum_slots")]
    assert 0 < len(timed) == len(kernels) == len(ps.read_samples(tmp_path / "c.csv")[0])
    layers = {(s.family, s.params) for s in ps.read_samples(tmp_path / "c.csv")[0]}
    assert 1 <= len(layers) <= 2


def test_perf_sample_stops_within_its_budget_and_resumes_per_device(tmp_path, monkeypatch):
    """On a fake clock: a compile starts only with 1.25 times the slowest compile's time left, a
    config is timed only while the budget lasts, and rows another GPU measured are timed again."""
    import spio.compiler
    from spio.kernels import autotune

    attrs = _fake_gpu(monkeypatch)
    clock, step, timed, lock = [0.0], {}, [], threading.Lock()

    def advance(seconds):
        with lock:
            clock[0] += seconds

    def compile_many(jobs, **kw):
        advance(step["compile"])
        return [None] * len(jobs)

    def time_kernel(family, params, kernel, *args, **kw):
        advance(step["time"])
        timed.append(kernel.name)
        return 1e-5

    monkeypatch.setattr(spio.compiler, "compile_many", compile_many)
    monkeypatch.setattr(autotune, "time_kernel", time_kernel)
    script = load_script("perf_sample")
    monkeypatch.setattr(script, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def run(name, budget, compile_s, time_s):
        clock[0] = 0.0
        step.update(compile=compile_s, time=time_s)
        timed.clear()
        args = ["--csv", str(tmp_path / name), "--batches", "8", "--dtypes", "fp16",
                "--layers", "2", "--max-configs", "4", "--budget-s", str(budget)]  # fmt: skip
        assert script.main(args) == 0
        return {(s.family, s.params) for s in ps.read_samples(tmp_path / name)[0]}

    assert len(run("a.csv", 0.85, 0.4, 0.001)) == 1  # 0.45 s left: no second 0.4 s compile
    run("b.csv", 0.45, 0.4, 0.02)
    assert len(timed) == 3  # 0.05 s left after the compile: 3 timings, not the layer's 4 or more
    run("c.csv", 100, 0, 0)
    first = len(timed)
    attrs["name"] = "Other GPU"
    run("c.csv", 100, 0, 0)
    assert len(timed) == first > 0


def test_perf_sample_refuses_a_csv_of_other_columns_before_timing(tmp_path, monkeypatch, capsys):
    """A CSV of an older spio (no variant column) cannot take new rows: the run says so before
    it times anything, instead of losing its first layer to a failed append."""
    _fake_gpu(monkeypatch)
    old = tmp_path / "old.csv"
    old.write_text(",".join(ps.SAMPLE_COLUMNS[:-1]) + "\n")
    script = load_script("perf_sample")
    assert script.main(["--csv", str(old)]) == 2
    error = capsys.readouterr().err
    assert "no variant column" in error and "start a new one" in error
    assert script.main(["--csv", str(tmp_path / "new.csv"), "--families", "conv2d_gw8_bogus"]) == 2
    assert "unknown families conv2d_gw8_bogus" in capsys.readouterr().err


def test_perf_sample_names_a_row_it_cannot_read_before_timing(tmp_path, monkeypatch, capsys):
    """A CSV whose last row a kill cut off mid-append (gpu_check.sh stops runs with timeout):
    one message naming the file and the row, exit 2, not a traceback on every resume."""
    import spio.compiler

    _fake_gpu(monkeypatch)
    monkeypatch.setattr(spio.compiler, "compile_many", lambda *a, **k: pytest.fail("compiled"))
    cut = tmp_path / "cut.csv"
    ps.append_samples(cut, ps.read_samples(syn.CSV_PATH)[0][:3])
    cut.write_text(cut.read_text()[:-60] + "\n")  # cut, then its line ended (below: not)
    script = load_script("perf_sample")
    assert script.main(["--csv", str(cut)]) == 2
    error = capsys.readouterr().err
    assert f"perf_sample: cannot read {cut}: {cut}: data row 3: " in error
    assert "mend or remove that row" in error
    # Cut in its last column, or only its line's end: the row still reads, but the next row
    # appended had run on from it (a garbled row, the next run's resume short of configs).
    for cut_bytes in (2, 4):
        cut.unlink()
        ps.append_samples(cut, ps.read_samples(syn.CSV_PATH)[0][:3])
        cut.write_bytes(cut.read_bytes()[:-cut_bytes])
        assert len(ps.read_samples(cut)[0]) == 3
        assert script.main(["--csv", str(cut)]) == 2
        error = capsys.readouterr().err
        assert f"perf_sample: {cut}'s last line does not end" in error
        with pytest.raises(ValueError, match="last line does not end"):
            ps.append_samples(cut, ps.read_samples(syn.CSV_PATH)[0][3:4])
    # Two rows run together are refused where they are read, not parsed as one.
    glued = tmp_path / "glued.csv"
    ps.append_samples(glued, ps.read_samples(syn.CSV_PATH)[0][:2])
    lines = glued.read_text().splitlines(keepends=True)
    glued.write_text(lines[0] + lines[1].rstrip("\r\n")[:-3] + lines[2])
    with pytest.raises(ValueError, match="data row 1: the row has 26 fields more than the header"):
        ps.read_samples(glued)


def test_perf_sample_lists_take_at_least_one_value(capsys):
    """`--dtypes` with no value had made a traceback (with --extra-layers) or timed nothing and
    exited 0; an empty --families had meant every family."""
    for script, argv in (
        ("perf_sample", ["--dtypes", "--extra-layers", "2"]),
        ("perf_sample", ["--batches"]),
        ("perf_sample", ["--families"]),
        ("train_perf_model", [str(syn.CSV_PATH), "--families"]),
        ("train_perf_model", [str(syn.CSV_PATH), "--arch"]),
    ):
        with pytest.raises(SystemExit) as exit_:
            load_script(script).main(argv)
        assert exit_.value.code == 2
        assert "expected at least one argument" in capsys.readouterr().err


def test_perf_sample_always_times_the_picks_and_their_unweighed_variants(monkeypatch):
    import random

    script = load_script("perf_sample")
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    small = P(64, 64, 8, 8, padding=1)
    pick = family.default_config(small)
    chosen = script.configs_to_sample(family, small, random.Random(0), max_configs=5)
    anchors = [pick] + [dataclasses.replace(pick, block_n=n) for n in (2, 4, 8)]
    assert all(c in chosen for c in anchors) and 5 < len(chosen) <= 5 + len(anchors)
    assert len(set(chosen)) == len(chosen)
    assert chosen[: len(anchors)] == anchors  # the picks first
    every = script.configs_to_sample(family, small, random.Random(0))
    assert sorted(every) == sorted(family.configs(small))  # all of them already, each once
    assert every[: len(anchors)] == anchors
    # With a model for the device, its pick and the pick's variants too.
    model_pick = pm.rank_configs(family, small, H200, pm.PACKAGED_MODELS_DIR)[0][0]
    monkeypatch.setenv("SPIO_PERF_MODELS", str(pm.PACKAGED_MODELS_DIR))
    pm.clear_caches()
    chosen = script.configs_to_sample(family, small, random.Random(0), 5, H200)
    pm.clear_caches()
    assert model_pick in chosen
    assert all(dataclasses.replace(model_pick, block_n=n) in chosen for n in (2, 4, 8))


# --- the heuristic's machine -----------------------------------------------------------------


def test_the_heuristic_counts_residency_under_the_gpus_own_limits():
    """An sm_86 SM holds 1,536 threads and 100 KiB of shared memory (sm_90: 2,048 and 228 KiB):
    the heuristic used to count every GPU's resident blocks as an H200's."""
    h200, rtx3090 = fd.machine_of("sm_90", 132), fd.machine_of("sm_86", 82)
    assert h200 == fd.H200_CLASS and fd.machine_of("sm_90") == fd.H200_CLASS
    assert rtx3090.sms == 82 and rtx3090.limits == occupancy.LIMITS["sm_86"]
    assert fd.machine_of("sm_130", 0) == fd.H200_CLASS  # no limits of its own: sm_90's
    # 128 threads, 72 registers, 31.5 KiB: 7 blocks resident by registers on either SM, but 3 by
    # shared memory on sm_86. Enough blocks for every SM; the bytes in flight scale with them.
    args = (100_000, 128, 72, 31_584, 2_048)
    assert fd.latency_cover(*args) == fd.latency_cover(*args, fd.H200_CLASS) == 7 * 2_048 / 32_768
    assert fd.latency_cover(*args, rtx3090) == 3 * 2_048 / 32_768
    # Fewer SMs are filled by fewer blocks: 82 blocks fill an RTX 3090, not an H200.
    assert fd.latency_cover(82, 128, 72, 31_584, 32_768, rtx3090) == 1.0
    assert fd.latency_cover(82, 128, 72, 31_584, 32_768) == 82 / 132


def test_without_a_model_a_gpu_gets_the_heuristics_pick_for_its_own_limits(
    fake_device, monkeypatch, tmp_path
):
    """An RTX 3090 (sm_86, 82 SMs, no model) gets the config the heuristic ranks first for its
    machine, which on this layer is not the H200-class pick; the autotune candidates come from
    the same ranking."""
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))  # no models at all
    rtx3090 = pm.DeviceIdentity(arch="sm_86", name="NVIDIA GeForce RTX 3090", driver="13.0", sms=82)
    monkeypatch.setattr(pm, "device_identity", lambda d: rtx3090)
    layer = P(128, 64, 64, 64, padding=1)
    for name, (factory, options) in CALLS.items():
        family = pm.FAMILIES[name]
        picked = pm.select_config(factory, layer, fake_device, **options)
        assert picked == family.default_config(layer, machine=rtx3090.machine)
        ranked, model = pm.rank_configs(family, layer, rtx3090, tmp_path)
        assert model is None and ranked[0] == picked
        assert factory.default_config(layer, **options) == family.default_config(layer)
    wgrad = pm.FAMILIES["conv2d_gw8_wgrad"]
    assert wgrad.default_config(layer, machine=rtx3090.machine) != wgrad.default_config(layer)
    # The H200-class pick keeps 7 blocks of an SM resident on sm_90, 3 on sm_86 (its shared
    # memory); the 3090's pick reads fewer halo rows for as many resident blocks.
    assert wgrad.default_config(layer).encode() == "g2_p32_q64_n4_w4_s6_k8"
    assert wgrad.default_config(layer, machine=rtx3090.machine).encode() == "g2_p64_q64_n4_w4_s6_k8"


def test_a_gpu_of_an_arch_without_known_limits_is_ranked_for_the_limits_it_reports(monkeypatch):
    """The driver reports each GPU's threads, resident blocks, registers and shared memory per
    SM: a GPU of an arch spio keeps no limits for (sm_130 here, a fake) is ranked for those, not
    for sm_90's. Resident blocks had always come from the arch's table entry."""
    from spio.cuda import driver

    attrs = {
        "arch": "sm_130",
        "name": "Fake sm_130 GPU",
        "sm_count": 84,
        "max_threads_per_sm": 1536,
        "max_blocks_per_sm": 24,
        "max_shared_memory_per_sm": 102400,
        "max_registers_per_sm": 65536,
    }
    monkeypatch.setattr(driver, "device_attributes", lambda ordinal=0: dict(attrs))
    monkeypatch.setattr(driver, "driver_version", lambda: (13, 0))
    pm._cuda_identity.cache_clear()
    try:
        identity = pm._cuda_identity(0)
    finally:
        pm._cuda_identity.cache_clear()
    limits = occupancy.SmLimits(threads=1536, blocks=24, shared_bytes=102400, registers=65536)
    assert identity.sms == 84 and identity.limits == limits
    assert identity.machine == fd.Machine(sms=84, limits=limits) != fd.machine_of("sm_130", 84)
    # Known archs report what spio.compiler.occupancy keeps for them.
    h200 = dict(attrs, arch="sm_90", max_threads_per_sm=2048, max_shared_memory_per_sm=233472)
    assert pm.reported_limits(dict(h200, max_blocks_per_sm=32)) == occupancy.LIMITS["sm_90"]
    unreported = {"arch": "sm_86", "max_threads_per_sm": 0, "max_blocks_per_sm": None}
    assert pm.reported_limits(unreported) == occupancy.LIMITS["sm_86"]  # 0 or None: the arch's
    # Resident blocks alone bind for small blocks: 32 single-warp blocks on sm_90, 24 here.
    assert occupancy.blocks_per_sm(identity.limits, 32, 32, 0) == 24
    assert occupancy.blocks_per_sm(occupancy.LIMITS["sm_90"], 32, 32, 0) == 32
    # On 96c 56x56 5x5 at N = 128 its FProp pick differs from the one for sm_90's limits.
    layer = P(128, 96, 56, 56, padding=2, r=5, s=5)
    fprop = pm.FAMILIES["conv2d_gw8_fprop"]
    assert fprop.default_config(layer, machine=identity.machine).encode() == "g2_p64_q64_w2_s8_k16"
    assert fprop.default_config(layer, machine=fd.machine_of("sm_130", 84)).encode() == (
        "g2_p64_q64_w2_s6_k16"
    )
    # sm_120 (experimental) has limits of its own now, where it had taken sm_90's.
    assert occupancy.limits_of("sm_120") == limits


def test_a_mistyped_models_folder_is_warned_of_once(monkeypatch, tmp_path, caplog):
    """SPIO_PERF_MODELS naming no folder: the heuristic ranks, as without models, but with a
    warning naming the setting (it was logged at info level, hidden by default, as if the
    folder simply held no model), where get_kernel picks (select_config) as where configs are
    ranked. An existing folder without models warns of nothing."""
    import torch

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    layer = P(128, 64, 64, 64, padding=1)
    identity = pm.DeviceIdentity("sm_90", "NVIDIA H200", "13.0", sms=132)
    monkeypatch.setattr(pm, "device_identity", lambda device: identity)
    for folder, warned in ((tmp_path, False), (tmp_path / "typo", True)):
        monkeypatch.setenv("SPIO_PERF_MODELS", str(folder))
        for pick in (
            lambda: pm.select_config(conv2d_gw8_kernel_factory, layer, torch.device("cuda")),
            lambda: pm.rank_configs(family, layer, identity)[0][0],
        ):
            pm.clear_caches()
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="spio"):
                assert pick() == pick() == family.default_config(layer)
            said = [r.getMessage() for r in caplog.records]
            assert said == ([f"SPIO_PERF_MODELS must name a folder of models (sm_XX/<family>.ubj), "
                             f"got {str(folder)!r}, not a folder; unset it for the shipped models: "
                             "using the analytic heuristic"] if warned else []), said  # fmt: skip
    pm.clear_caches()


def test_a_model_predicting_times_that_are_not_finite_is_not_used(
    fake_device, models, monkeypatch, caplog
):
    """Finite leaves that sum past float32's range: the model's ranking would be the configs'
    given order; it is warned of and the heuristic ranks instead."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    layer = P(n=32, c=64, h=28, w=28, padding=1)
    model = _find_model(family, H200, models)
    monkeypatch.setattr(
        type(model),
        "predict_log_seconds",
        lambda self, params, configs: np.full(len(configs), np.inf),
    )
    with caplog.at_level("WARNING", logger="spio"):
        ranked, used = pm.rank_configs(family, layer, H200, folder=models)
    assert used is None
    assert ranked == pm.heuristic_ranking(family, layer, family.configs(layer), H200.machine)
    assert "predicts a time that is not finite" in caplog.text
