"""Autotuning (SPIO_AUTOTUNE=1): the model's top-k configs are timed once, the winner is cached on
disk and reused without timing; fake timers on a fake device here, real ones under `-m cuda`."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import pytest

from spio.bench.timing import MAX_SETS, Rotation
from spio.kernels import autotune
from spio.kernels import perf_model as pm
from spio.kernels.conv2d_gw8_factory import conv2d_gw8_kernel_factory
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P
from spio.kernels.conv2d_gw8_wgrad_factory import conv2d_gw8_wgrad_kernel_factory
from tests.data import synthetic_perf as syn

H200 = pm.DeviceIdentity(arch="sm_90", name="NVIDIA H200", driver="13.0")
LAYER = P(n=16, c=64, h=28, w=28, padding=1)


class FakeCuda:
    type = "cuda"
    index = 0


class FakeTimer:
    """Records what it times; the *last* of the k candidates is the fastest, so a tuned choice
    differs from the model's first pick."""

    def __init__(self, fail=()):
        self.calls: list[tuple[str, str]] = []
        self.configs: list = []  # the configs of `calls`
        self.fail = set(fail)

    def __call__(self, family, params, kernel, device):
        config = dict(kernel.info)["config"]
        self.calls.append((family, config.encode()))
        self.configs.append(config)
        if config.encode() in self.fail:
            raise RuntimeError("launch failed")
        return 1e-3 / len(self.calls)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("perf_models")
    assert syn.train_models(out, "--trees", "60") == 0
    return out


@pytest.fixture
def tuned(monkeypatch, tmp_path, models):
    """SPIO_AUTOTUNE=1 on a fake H200 with a temporary cache folder and a fake timer."""
    monkeypatch.setenv("SPIO_AUTOTUNE", "1")
    monkeypatch.setenv("SPIO_TMA", "off")
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "4")
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPIO_PERF_MODELS", str(models))
    monkeypatch.setattr(pm, "device_identity", lambda d: H200 if d is not None else None)
    monkeypatch.setattr(autotune, "_default_cache", None)
    timer = FakeTimer()
    monkeypatch.setattr(autotune, "default_timer", timer)
    pm.clear_caches()
    yield timer
    pm.clear_caches()


def new_process(monkeypatch):
    """Forget everything held in memory, as a new process would."""
    pm.clear_caches()
    monkeypatch.setattr(autotune, "_default_cache", None)


def test_first_use_times_the_top_k_then_the_disk_cache_answers(tuned, monkeypatch, tmp_path):
    model = next(pm.loadable_models(pm.FAMILIES["conv2d_gw8_fprop"], H200))
    top = model.rank(LAYER, pm.FAMILIES["conv2d_gw8_fprop"].configs(LAYER))[:4]

    kernel = conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert tuned.calls == [("conv2d_gw8_fprop", c.encode()) for c in top]
    assert dict(kernel.info)["config"] == top[-1]  # the measured winner, not the model's pick
    entries = list((tmp_path / "cache" / "autotune").rglob("*"))
    assert any(e.is_file() and not e.name.endswith(".lock") for e in entries)

    # Same process: memoised. New process: read from disk. Neither times anything.
    tuned.calls.clear()
    assert conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda()) == kernel
    new_process(monkeypatch)
    assert conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda()) == kernel
    assert tuned.calls == []

    # Another family or layer is tuned on its own.
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda(), igrad=True)
    conv2d_gw8_wgrad_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert [family for family, _ in tuned.calls] == ["conv2d_gw8_dgrad"] * 4 + [
        "conv2d_gw8_wgrad"
    ] * 4


def test_a_layer_no_candidate_of_which_can_be_timed_runs_the_untuned_pick(tuned, caplog):
    """Every candidate failing (out of memory for timing's inputs, say) had failed the layer's
    call with a RuntimeError, and every later call tuned and failed again: now it runs the
    model's pick, with a warning, tuned no more in this process (nothing written to disk)."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    model = next(pm.loadable_models(family, H200))
    pick = model.rank(LAYER, family.configs(LAYER))[0]
    tuned.fail = {c.encode() for c in family.configs(LAYER)}
    with caplog.at_level(logging.WARNING, logger="spio"):
        kernel = conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert dict(kernel.info)["config"] == pick and len(tuned.calls) == 4
    assert f"all 4 candidate configs failed; running the untuned pick {pick.encode()}" in (
        caplog.text
    )
    assert pm.selection_source(family, LAYER, FakeCuda()).endswith(" (autotune failed)")
    assert conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda()) == kernel
    assert len(tuned.calls) == 4  # not tuned again


def test_inside_a_graph_capture_tuning_waits_for_a_later_call(tuned, monkeypatch, caplog):
    """Timing synchronises, which a CUDA graph capture forbids: a layer first met inside one runs
    the model's pick for that call, remembered nowhere (neither per process nor in the op's
    Layer), and is tuned at its first call outside."""
    from spio.functional import _kernels

    model = next(pm.loadable_models(pm.FAMILIES["conv2d_gw8_fprop"], H200))
    top = model.rank(LAYER, pm.FAMILIES["conv2d_gw8_fprop"].configs(LAYER))[:4]
    monkeypatch.setattr(_kernels, "_chosen", {})
    layer = _kernels.Layer(LAYER, FakeCuda())
    layout = (False, False)  # contiguous weights, no bias
    monkeypatch.setattr(autotune, "capturing", lambda d: True)
    with caplog.at_level("WARNING", logger="spio"):
        for _ in range(2):
            assert layer.fprop_kernel(layout).info_value("config") == top[0]
            layer.dgrad_kernel(False)
            layer.wgrad_kernel(False, False)
    assert tuned.calls == []
    # Only the WGrad reduction variant of the untuned config is kept (keyed by that config).
    assert [key[0] for key in _kernels._chosen] == ["wgrad"], list(_kernels._chosen)
    assert layer._fprop == layer._dgrad == layer._wgrad == {}
    assert sum("inside a CUDA graph capture" in r.message for r in caplog.records) == 3
    # Once a family: a key per layer had grown with every batch size met in captures.
    warned = len(pm._warned)
    other = _kernels.Layer(dataclasses.replace(LAYER, n=LAYER.n + 1), FakeCuda())
    other.fprop_kernel(layout)
    assert len(pm._warned) == warned

    monkeypatch.setattr(autotune, "capturing", lambda d: False)
    assert layer.fprop_kernel(layout).info_value("config") == top[-1]
    assert tuned.calls == [("conv2d_gw8_fprop", c.encode()) for c in top]
    assert layer._fprop[layout].info_value("config") == top[-1]
    tuned.calls.clear()
    assert layer.fprop_kernel(layout).info_value("config") == top[-1]
    assert tuned.calls == []


def test_cache_key_names_device_driver_version_family_params_candidates_and_code():
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    top = family.configs(LAYER)[:4]
    code = autotune.code_digest([family.make_kernel(LAYER, c) for c in top])

    def key(name=family.name, params=LAYER, identity=H200, candidates=top, code=code):
        return autotune.cache_key(name, params, identity, candidates, code)

    other_gpu = pm.DeviceIdentity("sm_90", "NVIDIA H100 80GB HBM3", "13.0")
    other_driver = pm.DeviceIdentity("sm_90", "NVIDIA H200", "12.8")
    assert len({
        key(),
        key(identity=other_gpu),
        key(identity=other_driver),
        key(name="conv2d_gw8_dgrad"),
        key(params=P(n=16, c=64, h=28, w=28, padding=0)),
        key(candidates=top[:3]),  # e.g. a smaller SPIO_AUTOTUNE_TOPK
        key(code="kernels changed since"),
    }) == 7  # fmt: skip
    assert key() == key(params=P(16, 64, 28, 28, padding=(1, 1)))
    reordered = autotune.code_digest([family.make_kernel(LAYER, c) for c in top[::-1]])
    assert key() == key(candidates=top[::-1], code=reordered)  # the same, ranked otherwise


def test_the_code_digest_changes_with_a_kernels_source_headers_or_the_compiler(monkeypatch):
    """A winner timed on other kernels is not reused: the key had named only the configs and
    spio's version, which stays the same across development commits."""
    import dataclasses

    from spio.compiler import compile as compile_module

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    kernels = [family.make_kernel(LAYER, c) for c in family.configs(LAYER)[:3]]
    digest = autotune.code_digest(kernels)
    assert autotune.code_digest(kernels) == digest
    header_name, text = kernels[1].headers[0]
    edited = dataclasses.replace(kernels[1], headers=((header_name, text + "// edited\n"),))
    assert autotune.code_digest([kernels[0], edited, kernels[2]]) != digest
    assert autotune.code_digest([kernels[0], None, kernels[2]]) != digest
    monkeypatch.setattr(compile_module, "toolchain_identity", lambda: ("another NVRTC",))
    assert autotune.code_digest(kernels) != digest


def test_the_code_digest_changes_with_the_sum_a_wgrad_timing_runs(monkeypatch):
    """A partials WGrad's time includes sum_slots, which runs after it: an edit to the sum's
    source must make its winner stale too (the digest had read the candidates' own kernels)."""
    from spio.kernels import kernel as kernel_module
    from spio.kernels.conv2d_gw8_wgrad_factory import SUM_SOURCE_FILE

    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    kernels = [family.make_kernel(LAYER, c) for c in family.configs(LAYER)[:3]]
    assert all(k.info_value("partials") for k in kernels)
    digest = autotune.code_digest(kernels)
    source = kernel_module.kernel_source
    monkeypatch.setattr(
        kernel_module,
        "kernel_source",
        lambda name: source(name) + ("// edited\n" if name == SUM_SOURCE_FILE else ""),
    )
    assert autotune.code_digest(kernels) != digest


def test_a_larger_top_k_tunes_again(tuned, monkeypatch):
    """The cached winner of the top 4 does not answer for the top 6, which may hold a faster
    config; the top 4 again is answered from the cache."""
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert len(tuned.calls) == 4
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "6")
    new_process(monkeypatch)
    tuned.calls.clear()
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert len(tuned.calls) == 6
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "4")
    new_process(monkeypatch)
    tuned.calls.clear()
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert tuned.calls == []


def test_a_new_top_k_in_the_same_process_tunes_again(tuned, monkeypatch):
    """Selections are memoised by the settings: SPIO_AUTOTUNE_TOPK changed in a running process
    times the new top-k rather than answering with the memoised pick of the old one."""
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert len(tuned.calls) == 4
    tuned.calls.clear()
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "6")
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert len(tuned.calls) == 6


def test_cache_entry_records_what_was_timed(tuned, tmp_path):
    from spio.compiler import DiskCache

    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    cache = DiskCache("autotune", root=tmp_path / "cache")
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    code = autotune.code_digest([family.make_kernel(LAYER, c) for c in tuned.configs])
    payload, _, cached = cache.get_or_build(
        autotune.cache_key("conv2d_gw8_fprop", LAYER, H200, tuned.configs, code),
        lambda: pytest.fail("not cached"),
    )
    entry = json.loads(payload)
    assert cached and entry["device"] == "NVIDIA H200" and entry["driver"] == "13.0"
    assert len(entry["timed"]) == 4 and entry["model"].endswith("conv2d_gw8_fprop.ubj")
    winner = pm.FAMILIES["conv2d_gw8_fprop"].config_from_fields(entry["config"])
    assert winner.encode() == min(entry["timed"], key=entry["timed"].get)


@pytest.mark.parametrize(
    "damage",
    ["not json", "no config", "no longer a config", "config null", "config a name", "an inf"],
)
def test_an_unusable_cache_entry_is_timed_again_and_replaced(damage, tuned, monkeypatch, caplog):
    """A damaged entry (not JSON, or without a config, or with a config that is no object of
    fields: that had been an AttributeError out of every selection of the layer; an infinite
    field, an OverflowError), or one naming
    a config the family no longer has, is a miss: it had given every later process the untuned
    pick, with the same warning, for good."""
    import logging

    from spio.compiler import DiskCache

    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    code = autotune.code_digest([family.make_kernel(LAYER, c) for c in tuned.configs])
    key = autotune.cache_key(family.name, LAYER, H200, tuned.configs, code)
    cache = DiskCache("autotune")
    entry = json.loads(cache.get(key)[0])
    entry["config"]["groups"] = 3
    if damage == "no config":
        del entry["config"]
    elif damage == "config null":
        entry["config"] = None
    elif damage == "config a name":
        entry["config"] = tuned.configs[-1].encode()
    bad = b"{not json" if damage == "not json" else json.dumps(entry).encode()
    if damage == "an inf":  # (JSON's 1e400 reads as inf, which int() refuses with OverflowError)
        bad = bad.replace(b'"groups": 3', b'"groups": 1e400')
    cache.discard(key)
    cache.get_or_build(key, lambda: (bad, {"family": family.name}))
    for attempt in range(2):
        new_process(monkeypatch)
        tuned.calls.clear()
        with caplog.at_level(logging.WARNING, logger="spio"):
            kernel = conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
        assert dict(kernel.info)["config"] == tuned.configs[-1]  # the measured winner
        if attempt == 0:
            assert len(tuned.calls) == 4 and "timing again" in caplog.text
        else:
            assert tuned.calls == []  # the entry was replaced
    assert caplog.text.count("timing again") == 1


@pytest.mark.parametrize("broken", [math.nan, 0.0, -1e-6, math.inf])
def test_a_config_timed_as_nan_or_zero_counts_as_failed(broken, tmp_path, caplog):
    """A NaN first time had won min() (every comparison with it is false) and, not finite, made
    tuning fail as if every candidate had; a time of 0 or less is no measurement either."""
    import logging

    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    candidates = family.configs(LAYER)[:3]

    def timer(family_name, params, kernel, device):
        config = dict(kernel.info)["config"]
        return broken if config == candidates[0] else 1e-3 * (1 + candidates.index(config))

    with caplog.at_level(logging.WARNING, logger="spio"):
        config = autotune.autotune(
            family, LAYER, FakeCuda(), H200, candidates, timer=timer, cache=_cache(tmp_path)
        )
    assert config == candidates[1]
    # (naming the layer too: with many layers tuning, a failure is placed by it)
    said = f"{candidates[0].encode()} of layer {LAYER.encode()} failed: its time was {broken!r} s"
    assert said in caplog.text


def test_a_failing_config_counts_as_slowest(monkeypatch, tmp_path):
    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    candidates = family.configs(LAYER)[:3]
    timer = FakeTimer(fail={candidates[2].encode()})  # would have been the fastest
    cache = _cache(tmp_path)
    config = autotune.autotune(
        family, LAYER, FakeCuda(), H200, candidates, timer=timer, cache=cache
    )
    assert config == candidates[1]
    other = P(n=2, c=16, h=9, w=9)
    others = family.configs(other)[:3]
    everything = FakeTimer(fail={c.encode() for c in others})
    with pytest.raises(RuntimeError, match="all 3 candidate configs failed"):
        autotune.autotune(family, other, FakeCuda(), H200, others, timer=everything, cache=cache)
    # A config whose kernel cannot be built is slowest too: it is never timed.
    real = family.make_kernel

    def unbuildable(params, config):
        if config == picks[0]:
            raise ValueError("cannot be built")
        return real(params, config)

    third = P(n=3, c=16, h=9, w=9)
    picks = family.configs(third)[:2]
    timer = FakeTimer()
    broken = dataclasses.replace(family, make_kernel=unbuildable)
    tuned = autotune.autotune(broken, third, FakeCuda(), H200, picks, timer=timer, cache=cache)
    assert tuned == picks[1] and timer.calls == [(family.name, picks[1].encode())]


def test_without_a_model_the_heuristic_top_k_is_timed(tuned, monkeypatch, tmp_path):
    (tmp_path / "none").mkdir()
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path / "none"))
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    ranked = sorted(family.configs(LAYER), key=lambda c: family.heuristic_key(LAYER, c))
    assert ranked[0] == conv2d_gw8_kernel_factory.default_config(LAYER)
    kernel = conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert tuned.calls == [("conv2d_gw8_fprop", c.encode()) for c in ranked[:4]]
    assert dict(kernel.info)["config"] == ranked[3]


def test_autotune_is_off_unless_asked(monkeypatch, models):
    monkeypatch.delenv("SPIO_AUTOTUNE", raising=False)
    assert not autotune.autotune_enabled()
    monkeypatch.setenv("SPIO_AUTOTUNE", "0")
    assert not autotune.autotune_enabled()
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "zero")
    with pytest.raises(
        ValueError, match="SPIO_AUTOTUNE_TOPK must be a positive integer, got 'zero'"
    ):
        autotune.top_k()
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "3")
    assert autotune.top_k() == 3


def test_autotune_flag_words_and_bad_values(monkeypatch):
    """SPIO_AUTOTUNE takes the words SPIO_EMULATE does (true and yes had read as off) and a bad
    value raises; with autotuning on, a bad SPIO_AUTOTUNE_TOPK raises when the flag is read."""
    monkeypatch.delenv("SPIO_AUTOTUNE_TOPK", raising=False)
    for on in ("1", "true", " Yes ", "ON"):
        monkeypatch.setenv("SPIO_AUTOTUNE", on)
        assert autotune.autotune_enabled()
    for off in ("0", "false", "no", "Off", ""):
        monkeypatch.setenv("SPIO_AUTOTUNE", off)
        assert not autotune.autotune_enabled()
    monkeypatch.setenv("SPIO_AUTOTUNE", "maybe")
    with pytest.raises(
        ValueError, match=r"^SPIO_AUTOTUNE must be 1/true/yes/on or 0/false/no/off, got 'maybe'$"
    ):
        autotune.autotune_enabled()
    for bad in ("-1", "0", "abc", "2.5"):
        monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", bad)
        monkeypatch.setenv("SPIO_AUTOTUNE", "0")
        assert not autotune.autotune_enabled()  # unused while autotuning is off
        monkeypatch.setenv("SPIO_AUTOTUNE", "1")
        with pytest.raises(
            ValueError, match=rf"^SPIO_AUTOTUNE_TOPK must be a positive integer, got '{bad}'$"
        ):
            autotune.autotune_enabled()


def test_kernel_inputs_match_the_kernels_argument_order():
    import torch

    params = P(n=2, c=16, h=6, w=7, padding=1, has_bias=True, dtype="bf16")
    fprop = autotune.kernel_inputs("conv2d_gw8_fprop", params, "cpu")
    assert [tuple(t.shape) for t in fprop[:4]] == [
        params.output_shape, params.input_shape, params.weight_shape, (16,)
    ]  # fmt: skip
    assert fprop[4] == params.n  # the batch size, a launch argument
    assert fprop[1].is_contiguous(memory_format=torch.channels_last)
    assert fprop[1].dtype == torch.bfloat16 and fprop[3].dtype == torch.float32
    assert fprop[1].abs().sum() > 0 and fprop[2].abs().sum() > 0  # never zeros
    dgrad = autotune.kernel_inputs("conv2d_gw8_dgrad", params, "cpu")
    assert tuple(dgrad[0].shape) == params.input_shape and dgrad[3] is None
    assert dgrad[4] == params.n
    wgrad = autotune.kernel_inputs("conv2d_gw8_wgrad", params, "cpu")
    assert wgrad[:2] == [None, None]  # dw and dbias: wgrad, which pass_call runs, makes its own
    assert tuple(wgrad[2].shape) == params.input_shape and wgrad[2].dtype == torch.bfloat16
    assert tuple(wgrad[3].shape) == params.output_shape and wgrad[4] == params.n
    a, b = (autotune.kernel_inputs("conv2d_gw8_fprop", params, "cpu", seed) for seed in (0, 1))
    assert not torch.equal(a[1], b[1])  # rotated input sets differ


def test_a_timed_wgrad_call_is_the_whole_pass_as_spio_runs_it(monkeypatch):
    """pass_call runs FProp and DGrad as one launch, WGrad as the `wgrad` wrapper: zeroing dw and
    atomics, or partial sums and sum_slots, whichever the kernel is (emulated here)."""
    import torch

    from spio.check import error_ratio
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.reference import conv2d_gw8_tolerance, conv2d_gw8_wgrad_ref

    monkeypatch.setenv("SPIO_EMULATE", "1")
    params = P(n=2, c=16, h=5, w=6, padding=1)
    cpu = torch.device("cpu")
    args = autotune.kernel_inputs("conv2d_gw8_wgrad", params, cpu, seed=2)
    config = wg.default_config(params)
    x, dy = args[2], args[3]
    expected = conv2d_gw8_wgrad_ref(x.double(), dy.double(), (1, 1), 3, 3)
    tol = conv2d_gw8_tolerance(params, "wgrad", x, dy)
    for partials in (False, True):
        kernel = wg.make_kernel(params, config, partials=partials)
        dw, dbias = autotune.pass_call("conv2d_gw8_wgrad", params, kernel, args, cpu)()
        assert error_ratio(dw, expected, tol.atol, tol.rtol) <= 1.0, partials
        assert dbias is None
    launched = []
    monkeypatch.setattr(type(kernel), "launch", lambda self, a, d: launched.append(a))
    fprop = autotune.kernel_inputs("conv2d_gw8_fprop", params, cpu)
    autotune.pass_call("conv2d_gw8_fprop", params, kernel, fprop, cpu)()
    assert launched == [fprop]


def test_inputs_rotate_only_when_they_fit_in_l2():
    l2 = 60 * 2**20
    small = P(n=1, c=64, h=16, w=16)
    assert autotune.input_copies("conv2d_gw8_fprop", small, l2) == MAX_SETS  # as spio bench
    big = P(n=256, c=64, h=64, w=64)
    assert autotune.input_copies("conv2d_gw8_fprop", big, l2) == 1
    mid = P(n=128, c=64, h=32, w=32)  # 33.6 MB per set: 3 x 60 MiB of other data between
    copies = autotune.input_copies("conv2d_gw8_wgrad", mid, l2)  # two uses: ceil(5.6) + 1 sets
    assert copies == 7


def _cache(tmp_path):
    from spio.compiler import DiskCache

    return DiskCache("autotune", root=tmp_path)


@pytest.mark.cuda
def test_autotune_on_a_gpu_times_once_and_reuses(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("SPIO_AUTOTUNE", "1")
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "3")
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_default_cache", None)
    pm.clear_caches()
    calls = []
    real = autotune.default_timer

    def counting(*args):
        calls.append(args[0])
        seconds = real(*args)
        assert 0 < seconds < 1
        return seconds

    monkeypatch.setattr(autotune, "default_timer", counting)
    device = torch.device("cuda", 0)
    params = P(n=8, c=64, h=32, w=32, padding=1, dtype="bf16")
    kernel = conv2d_gw8_kernel_factory.get_kernel(params, device)
    assert len(calls) == 3
    new_process(monkeypatch)
    assert conv2d_gw8_kernel_factory.get_kernel(params, device) == kernel
    assert len(calls) == 3
    x = torch.randn(params.input_shape, device=device, dtype=torch.bfloat16)
    w = torch.randn(params.weight_shape, device=device, dtype=torch.bfloat16)
    from spio.kernels.conv2d_gw8_factory import fprop

    y = fprop(x, w, None, params, config=dict(kernel.info)["config"])
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1, groups=params.groups)
    assert torch.allclose(y.double(), ref, atol=0.1, rtol=0.02)


def test_a_timer_may_prepare_all_candidates_before_timing(tmp_path):
    events = []

    class Preparing(FakeTimer):
        def prepare(self, kernels, arch):
            events.append(("prepare", arch, [dict(k.info)["config"] for k in kernels]))

        def __call__(self, *args):
            events.append(("time",))
            return super().__call__(*args)

    family = pm.FAMILIES["conv2d_gw8_dgrad"]
    candidates = family.configs(LAYER)[:3]
    autotune.autotune(
        family, LAYER, FakeCuda(), H200, candidates, timer=Preparing(), cache=_cache(tmp_path)
    )
    assert events == [("prepare", "sm_90", candidates)] + [("time",)] * 3


@pytest.mark.parametrize("setting", ["loads", "loads+stores"])
def test_tuning_times_the_kernels_with_the_tensor_copies_spio_runs(tuned, monkeypatch, setting):
    """With SPIO_TMA set, the candidates timed on an sm_90 GPU are the tensor-copy kernels that
    spio then runs for the layer (on an sm_86, the cp.async ones), and their winner is cached
    apart from the cp.async kernels': a change of setting tunes again."""
    names = []

    class Naming(FakeTimer):
        def __call__(self, family, params, kernel, device):
            names.append(kernel.name)
            return super().__call__(family, params, kernel, device)

    monkeypatch.setattr(autotune, "default_timer", Naming())
    suffix = {"loads": "__tma", "loads+stores": "__tmaio"}[setting]

    def tune(arch, value):
        """The kernel names timed tuning FProp and WGrad of LAYER in a new process."""
        identity = pm.DeviceIdentity(arch, f"GPU {arch}", "13.0")
        monkeypatch.setattr(pm, "device_identity", lambda d: identity)
        monkeypatch.setenv("SPIO_TMA", value)
        names.clear()
        new_process(monkeypatch)
        conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
        conv2d_gw8_wgrad_kernel_factory.get_kernel(LAYER, FakeCuda())
        return list(names)

    # In one process too: the selections remembered under one setting are not the other's.
    monkeypatch.setenv("SPIO_TMA", "off")
    new_process(monkeypatch)
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    monkeypatch.setenv("SPIO_TMA", setting)
    names.clear()
    conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert len(names) == 4 and all(name.endswith(suffix) for name in names), names

    copied = tune("sm_90", setting)
    assert len(copied) == 8
    for name in copied:  # (WGrad stores no rows)
        assert name.endswith("__tma" if name.startswith("conv2d_gw8_wgrad") else suffix), name
    plain = tune("sm_90", "off")
    assert len(plain) == 8 and not any("__tma" in name for name in plain), plain
    assert tune("sm_90", setting) == []  # its entry still on disk, beside the cp.async ones
    # An sm_86 has no tensor copies: the setting changes nothing timed, nor the entry.
    older = tune("sm_86", setting)
    assert len(older) == 8 and not any("__tma" in name for name in older), older
    assert tune("sm_86", "off") == []


def test_importing_selection_modules_loads_neither_xgboost_nor_torch():
    import subprocess
    import sys

    code = (
        "import sys, spio.kernels.perf_model, spio.kernels.autotune; "
        "print(sorted(m for m in ('xgboost', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, encoding="utf-8", check=True
    )
    assert out.stdout.strip() == "[]"


def test_multi_image_variants_of_the_pick_are_timed_and_their_winner_cached(tuned, monkeypatch):
    """No model has measured several images per FProp block yet: autotuning times the model's
    pick with 2, 4 and 8 images per block after its top-k, and keeps a winner among them."""
    small = P(n=32, c=64, h=4, w=4, padding=1)
    kernel = conv2d_gw8_kernel_factory.get_kernel(small, FakeCuda())
    timed = [name for _, name in tuned.calls]
    config = dict(kernel.info)["config"]
    assert len(timed) == 4 + 3 and not any("_n" in name for name in timed[:4])
    assert timed[4:] == [f"{timed[0]}_n{n}" for n in (2, 4, 8)]
    assert config.encode() == timed[-1] and config.block_n == 8  # the fake's fastest
    new_process(monkeypatch)
    tuned.calls.clear()
    assert dict(conv2d_gw8_kernel_factory.get_kernel(small, FakeCuda()).info)["config"] == config
    assert tuned.calls == []


def test_default_timer_makes_a_layers_inputs_once_for_all_its_candidates(monkeypatch):
    """Up to MAX_SETS rotated input sets per layer: made once for the k candidates, freed by release
    (autotune calls it after timing); the CUDA parts are stand-ins."""
    made, timed = [], []
    monkeypatch.setattr(autotune, "_l2_bytes", lambda device: 60 * 2**20)
    monkeypatch.setattr(autotune, "input_copies", lambda family, params, l2: 3)
    monkeypatch.setattr(autotune, "kernel_inputs", lambda *a: made.append(a) or [object()])
    given = []
    monkeypatch.setattr(
        autotune,
        "time_kernel",
        lambda f, p, kernel, sets, d: timed.append(len(sets)) or given.append(sets) or 1e-5,
    )
    timer = autotune._DefaultTimer()
    layer, other = P(n=2, c=16, h=8, w=8), P(n=4, c=16, h=8, w=8)
    for kernel in ("a", "b", "c"):
        timer("conv2d_gw8_fprop", layer, kernel, "cuda:0")
    assert len(made) == 3 and timed == [3, 3, 3]
    # One Rotation for the candidates: each kernel's timing goes on with the round.
    assert given[0] is given[1] is given[2] and isinstance(given[0], Rotation)
    timer("conv2d_gw8_fprop", other, "a", "cuda:0")  # another layer: its own inputs
    assert len(made) == 6
    timer.release()
    assert timer._inputs is None
    timer("conv2d_gw8_fprop", other, "b", "cuda:0")
    assert len(made) == 9


def test_default_timer_prepares_the_sum_a_partials_wgrad_runs(monkeypatch):
    """prepare compiles the candidates and, once, the sum_slots kernel that pass_call runs after
    a partials WGrad (left to its first timing, it would build there, serially, by itself)."""
    import spio.compiler
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    compiled = []
    monkeypatch.setattr(spio.compiler, "compile_many", lambda jobs, progress: compiled.append(jobs))
    layer = P(n=2, c=16, h=8, w=8, has_bias=True)
    configs = wg.configs(layer)[:2]
    partials = [wg.make_kernel(layer, c, partials=True) for c in configs]
    atomic = wg.make_kernel(layer, configs[0])
    autotune._DefaultTimer().prepare([*partials, atomic], "sm_90")
    names = [job.name for job in compiled[0]]
    summing = wg.sum_kernel(layer)
    assert names == [f"{k.name}.cu" for k in [partials[0], summing, partials[1], atomic]]
    assert {job.arch for job in compiled[0]} == {"sm_90"}
    compiled.clear()
    autotune._DefaultTimer().prepare([atomic], "sm_80")  # no partials: no sum
    assert [job.name for job in compiled[0]] == [f"{atomic.name}.cu"]


def test_cache_key_changes_with_spios_version(monkeypatch):
    """A release may change what a config compiles to in ways the code digest does not see."""
    import spio

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    top = family.configs(LAYER)[:2]
    code = autotune.code_digest([family.make_kernel(LAYER, c) for c in top])
    before = autotune.cache_key(family.name, LAYER, H200, top, code)
    monkeypatch.setattr(spio, "__version__", spio.__version__ + ".post1")
    assert autotune.cache_key(family.name, LAYER, H200, top, code) != before


def test_the_code_digest_changes_with_a_kernels_source_file_or_launch_shape(monkeypatch):
    """A winner timed on another kernel source, or launched with another grid, block or shared
    memory size, is not reused."""
    from spio.kernels import kernel as kernel_module

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    kernels = [family.make_kernel(LAYER, c) for c in family.configs(LAYER)[:2]]
    digest = autotune.code_digest(kernels)
    first = kernels[0]
    for change in (
        {"grid": (first.grid[0] + 1, *first.grid[1:])},
        {"block": (first.block[0] * 2, *first.block[1:])},
        {"shared_mem_bytes": first.shared_mem_bytes + 1024},
    ):
        other = dataclasses.replace(first, **change)
        assert autotune.code_digest([other, kernels[1]]) != digest, change
    real = kernel_module.kernel_source
    edited = {first.source_file: real(first.source_file) + "\n// edited\n"}
    monkeypatch.setattr(kernel_module, "kernel_source", lambda name: edited.get(name) or real(name))
    assert autotune.code_digest(kernels) != digest


def test_default_timer_makes_new_inputs_for_another_pass_of_the_same_layer(monkeypatch):
    """FProp, DGrad and WGrad of one layer take different arguments: another family's timing
    must not launch on the inputs made for the last one."""
    made = []
    monkeypatch.setattr(autotune, "_l2_bytes", lambda device: 60 * 2**20)
    monkeypatch.setattr(autotune, "input_copies", lambda family, params, l2: 1)
    monkeypatch.setattr(
        autotune, "kernel_inputs", lambda family, *a: made.append(family) or [family]
    )
    timed = []
    monkeypatch.setattr(
        autotune, "time_kernel", lambda f, p, kernel, sets, d: timed.append((f, sets[0])) or 1e-5
    )
    timer = autotune._DefaultTimer()
    layer = P(n=2, c=16, h=8, w=8)
    for family in ("conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad"):
        timer(family, layer, "kernel", "cuda:0")
    assert made == ["conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad"]
    assert all(f == args[0] for f, args in timed), timed


def test_kernel_inputs_follow_each_pass_where_the_output_is_smaller_than_the_input():
    """Unpadded, a layer's output is smaller than its input: DGrad reads the output gradient and
    writes the input's, WGrad reads the input then the output gradient (and gets no dw or
    dbias buffer, with a bias or without: wgrad makes its own)."""
    params = P(n=2, c=16, h=7, w=6, padding=0)
    assert params.output_shape != params.input_shape
    dgrad = autotune.kernel_inputs("conv2d_gw8_dgrad", params, "cpu")
    assert [tuple(dgrad[i].shape) for i in (0, 1)] == [params.input_shape, params.output_shape]
    wgrad = autotune.kernel_inputs("conv2d_gw8_wgrad", params, "cpu")
    assert wgrad[:2] == [None, None]  # dw and dbias: wgrad, which pass_call runs, makes its own
    assert [tuple(wgrad[i].shape) for i in (2, 3)] == [params.input_shape, params.output_shape]
    with_bias = dataclasses.replace(params, has_bias=True)
    biased = autotune.kernel_inputs("conv2d_gw8_wgrad", with_bias, "cpu")
    assert biased[:2] == [None, None]  # a bias's gradient too


def test_pass_call_gives_a_tma_kernel_its_inputs_tensor_map():
    """An FProp/DGrad kernel fed by tensor copies takes its input's map as one more argument
    (and one storing by them its output's after it): pass_call encodes them once per input set
    (not per call) and appends them."""
    import torch

    from spio.cuda.tensor_map import TensorMap
    from spio.kernels import conv2d_gw8_factory as fd

    params = P(n=1, c=16, h=8, w=8, padding=1)
    kernel = fd.make_kernel(params, tma=True)
    x = torch.zeros(params.input_shape, dtype=torch.half).to(memory_format=torch.channels_last)
    launched = []

    class Recording:
        def launch(self, args, device):
            launched.append(args)

        def info_value(self, key, default=None):
            return kernel.info_value(key, default)

    call = autotune.pass_call(
        "conv2d_gw8_fprop", params, Recording(), ["out", x, "w", None, 1], torch.device("cpu")
    )
    call()
    call()
    assert launched[0] is launched[1] and launched[0][:5] == ["out", x, "w", None, 1]
    assert launched[0][5] == fd.row_map(x, *fd.input_box(kernel)).emulator_bytes()
    assert fd.row_map(x, *fd.input_box(kernel)) == TensorMap.of_tensor(
        x, (1, 3, 2, 0), (16, 18, 1, 1), 32
    )
    plain = fd.make_kernel(params)
    launched.clear()

    class Plain(Recording):
        def info_value(self, key, default=None):
            return plain.info_value(key, default)

    autotune.pass_call("conv2d_gw8_fprop", params, Plain(), ["out", x], torch.device("cpu"))()
    assert launched == [["out", x]]
    # Output rows stored by tensor copies too: the output's map follows the input's.
    stores = fd.make_kernel(params, tma_stores=True)
    y = torch.zeros(params.output_shape, dtype=torch.half).to(memory_format=torch.channels_last)
    launched.clear()

    class Stores(Recording):
        def info_value(self, key, default=None):
            return stores.info_value(key, default)

    autotune.pass_call("conv2d_gw8_fprop", params, Stores(), [y, x], torch.device("cpu"))()
    assert launched == [[y, x, fd.row_map(x, *fd.input_box(stores)).emulator_bytes(),
                         fd.row_map(y, *fd.output_box(stores)).emulator_bytes()]]  # fmt: skip
    assert fd.row_map(y, *fd.output_box(stores)) == TensorMap.of_tensor(
        y, (1, 3, 2, 0), (16, 16, 1, 1), 32
    )


def test_time_kernel_rotates_through_the_input_sets_and_gives_seconds(monkeypatch):
    """Each timed call takes the next input set in turn; the median in milliseconds comes back
    in seconds. The CUDA parts (the device context and the event timing) are stand-ins."""
    import contextlib
    import types

    import torch

    import spio.bench.timing

    launched = []

    class Recording:
        def launch(self, args, device):
            launched.append(args[0])

        def info_value(self, key, default=None):
            return default

    def time_calls(call, warmup, reps):
        for i in range(warmup + reps):
            call(i)
        return types.SimpleNamespace(median_ms=2.5)

    monkeypatch.setattr(spio.bench.timing, "time_calls", time_calls)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    sets = [["a"], ["b"], ["c"]]
    seconds = autotune.time_kernel(
        "conv2d_gw8_fprop", LAYER, Recording(), sets, "cuda:0", warmup=1, repeats=5
    )
    assert seconds == pytest.approx(2.5e-3)
    assert launched == ["a", "b", "c", "a", "b", "c"]
    # Sets shared in a Rotation: the next kernel takes up the round where this one stopped
    # (the default timer's, one a layer for all its candidates), not on sets just read.
    shared = spio.bench.timing.Rotation(sets)
    for _ in range(2):
        autotune.time_kernel(
            "conv2d_gw8_fprop", LAYER, Recording(), shared, "cuda:0", warmup=1, repeats=1
        )
    assert launched[6:] == ["a", "b", "c", "a"]
    with pytest.raises(ValueError, match="at least one set of kernel arguments"):
        autotune.time_kernel("conv2d_gw8_fprop", LAYER, Recording(), [], "cuda:0")


def test_default_timer_makes_new_inputs_for_another_device(monkeypatch):
    """Inputs live on the device they were made for: the same layer timed on a second GPU gets
    its own."""
    made = []
    monkeypatch.setattr(autotune, "_l2_bytes", lambda device: 60 * 2**20)
    monkeypatch.setattr(autotune, "input_copies", lambda family, params, l2: 1)
    monkeypatch.setattr(
        autotune, "kernel_inputs", lambda family, params, device, seed: made.append(device) or [1]
    )
    monkeypatch.setattr(autotune, "time_kernel", lambda f, p, kernel, sets, d: 1e-5)
    timer = autotune._DefaultTimer()
    for device in ("cuda:0", "cuda:0", "cuda:1"):
        timer("conv2d_gw8_fprop", LAYER, "kernel", device)
    assert made == ["cuda:0", "cuda:1"]


def test_l2_size_is_read_from_the_device_timed(monkeypatch):
    import torch

    from spio.cuda import driver

    asked = []
    monkeypatch.setattr(
        driver, "device_attributes", lambda i: asked.append(i) or {"l2_cache_bytes": 50 << 20}
    )
    assert autotune._l2_bytes(torch.device("cuda", 1)) == 50 << 20
    assert asked == [1]


def test_autotune_releases_the_timers_inputs_after_timing_a_layer(tmp_path):
    """The default timer holds a layer's input sets (up to 512) until `release`: autotune calls
    it once the layer's candidates are timed, so they do not outlive the tuning."""
    events = []

    class Releasing(FakeTimer):
        def __call__(self, *args):
            events.append("time")
            return super().__call__(*args)

        def release(self):
            events.append("release")

    family = pm.FAMILIES["conv2d_gw8_fprop"]
    candidates = family.configs(LAYER)[:2]
    autotune.autotune(
        family, LAYER, FakeCuda(), H200, candidates, timer=Releasing(), cache=_cache(tmp_path)
    )
    assert events == ["time", "time", "release"]


def _fprop_with_an_unbuildable_second_candidate():
    """The FProp family with make_kernel raising for the second of LAYER's first three configs;
    and those three configs."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    candidates = family.configs(LAYER)[:3]
    real = family.make_kernel

    def unbuildable(params, config):
        if config == candidates[1]:
            raise ValueError("cannot be built")
        return real(params, config)

    return dataclasses.replace(family, make_kernel=unbuildable), candidates


def test_an_unbuildable_candidate_is_named_in_a_warning_and_never_prepared(tmp_path, caplog):
    """A config whose kernel cannot be made is neither compiled nor timed, and the log says
    which and why."""
    import logging

    broken, candidates = _fprop_with_an_unbuildable_second_candidate()

    prepared = []

    class Preparing(FakeTimer):
        def prepare(self, kernels, arch):
            prepared.extend(dict(k.info)["config"] for k in kernels)

    with caplog.at_level(logging.WARNING, logger="spio"):
        autotune.autotune(
            broken, LAYER, FakeCuda(), H200, candidates, timer=Preparing(), cache=_cache(tmp_path)
        )
    assert prepared == [candidates[0], candidates[2]]
    assert (
        f"{candidates[1].encode()} of layer {LAYER.encode()} failed: cannot be built" in caplog.text
    )


def test_top_k_defaults_to_five(monkeypatch):
    monkeypatch.delenv("SPIO_AUTOTUNE_TOPK", raising=False)
    assert autotune.top_k() == autotune.DEFAULT_TOP_K == 5
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", " ")
    assert autotune.top_k() == 5


def test_a_graph_capture_runs_the_winner_tuned_before(tuned, monkeypatch):
    """A capture cannot time, but it can read the autotune cache: a layer tuned before (here in
    an earlier process) had still been captured with the untuned pick, so the graph ran another
    config than eager calls did."""
    model = next(pm.loadable_models(pm.FAMILIES["conv2d_gw8_fprop"], H200))
    top = model.rank(LAYER, pm.FAMILIES["conv2d_gw8_fprop"].configs(LAYER))[:4]
    assert dict(conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda()).info)["config"] == top[-1]
    new_process(monkeypatch)
    tuned.calls.clear()
    monkeypatch.setattr(autotune, "capturing", lambda d: True)
    kernel = conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda())
    assert dict(kernel.info)["config"] == top[-1] and tuned.calls == []
    # Not tuned before (DGrad): the untuned pick, as before.
    dgrad = pm.FAMILIES["conv2d_gw8_dgrad"]
    pick = next(pm.loadable_models(dgrad, H200)).rank(LAYER, dgrad.configs(LAYER))[0]
    kernel = conv2d_gw8_kernel_factory.get_kernel(LAYER, FakeCuda(), igrad=True)
    assert dict(kernel.info)["config"] == pick and tuned.calls == []


def test_only_a_cuda_device_defers_tuning_for_a_graph_capture(monkeypatch):
    """Outside spio.precompile's collection, tuning waits only for a CUDA device's capture: a
    CPU device has no stream to capture."""
    import torch

    monkeypatch.setenv("SPIO_AUTOTUNE", "1")
    monkeypatch.setattr(autotune, "capturing", lambda device: True)
    assert autotune.deferred(FakeCuda())
    assert not autotune.deferred(torch.device("cpu"))
    monkeypatch.setattr(autotune, "capturing", lambda device: False)
    assert not autotune.deferred(FakeCuda())
    with autotune.collecting():
        assert autotune.deferred(FakeCuda()) and autotune.deferred(torch.device("cpu"))
    # With autotuning off nothing waits: a capture gets the usual choice, remembered.
    monkeypatch.setenv("SPIO_AUTOTUNE", "0")
    monkeypatch.setattr(autotune, "capturing", lambda device: True)
    assert not autotune.deferred(FakeCuda())


def test_collecting_records_a_layers_buildable_candidates_and_why_the_others_are_not(
    monkeypatch, tmp_path
):
    """Inside spio.precompile's collection `want` records the layer for its batch build: only
    the kernels that could be made (the batch builds them all), and the others' errors; outside
    it records nothing and asks the caller to tune now."""
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_default_cache", None)
    broken, candidates = _fprop_with_an_unbuildable_second_candidate()

    assert not autotune.want(broken, LAYER, FakeCuda(), H200, candidates)
    with autotune.collecting() as wanted:
        assert autotune.want(broken, LAYER, FakeCuda(), H200, candidates)
    ((recorded, device, kernels, unmade),) = wanted.values()
    assert recorded is broken and isinstance(device, FakeCuda)
    assert [dict(k.info)["config"] for k in kernels] == [candidates[0], candidates[2]]
    assert list(unmade) == [candidates[1]] and "cannot be built" in str(unmade[candidates[1]])


@pytest.mark.parametrize("entry", ["usable", "damaged", "outdated"])
def test_collecting_records_a_layer_whose_cache_entry_is_unusable(entry, monkeypatch, tmp_path):
    """spio.precompile tunes a layer whose autotune entry is damaged or names a config the
    family no longer has, as autotune would at first use (inside the training loop, which
    precompile is there to spare): it had counted any entry as tuned. A usable one still is."""
    from spio.compiler import DiskCache

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_default_cache", None)
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    monkeypatch.setenv("SPIO_TMA", "off")
    candidates = family.configs(LAYER)[:3]
    code = autotune.code_digest([family.make_kernel(LAYER, c) for c in candidates])
    key = autotune.cache_key(family.name, LAYER, H200, candidates, code)
    fields = {name: getattr(candidates[1], name) for name in family.config_fields}
    if entry == "outdated":
        fields["groups"] = 3
    payload = b"{not json" if entry == "damaged" else json.dumps({"config": fields}).encode()
    DiskCache("autotune").get_or_build(key, lambda: (payload, {"family": family.name}))
    with autotune.collecting() as wanted:
        assert autotune.want(family, LAYER, FakeCuda(), H200, candidates)
    assert (key in wanted) == (entry != "usable")


def test_input_copies_count_the_bytes_of_the_pass_timed():
    """WGrad also moves its fp32 weight gradient, large for wide 5x5 layers (4.60 MB a set, to
    FProp's and DGrad's 4.40 MB): ceil(3 x 60 MiB / set) + 1 sets for each."""
    l2 = 60 * 2**20
    wide = P(n=8, c=512, h=16, w=16, r=5, s=5, padding=2)
    copies = {f: autotune.input_copies(f"conv2d_gw8_{f}", wide, l2) for f in ("fprop", "wgrad")}
    assert copies == {"fprop": 44, "wgrad": 42}
