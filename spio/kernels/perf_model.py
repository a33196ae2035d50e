"""Kernel selection: an XGBoost performance model per kernel family and GPU arch.

A model predicts, for one layer, the run time of every tile config of a kernel family from features
of the layer, the config and a few derived quantities (the terms of the analytic `estimated_cost`,
blocks, threads, shared memory). `select_config` ranks all configs with one batched prediction and
returns the fastest; without a model for the device's arch, or for a layer whose batch size lies
outside the range the model was measured at (`PerfModel.coverage_gap`), it falls back to the
analytic heuristic (and logs that once). With SPIO_AUTOTUNE=1 the top-k configs of whichever ranking
applies are timed on first use and the winner is kept in a disk cache (`spio.kernels.autotune`).

Models live in `spio/perf_models/<arch>/<family>.ubj` (or a device-specific
`<arch>/<device-slug>/<family>.ubj`, preferred when present) with a JSON of metadata beside each;
SPIO_PERF_MODELS points the loader at another folder. Nothing is downloaded. The models are
trained by XGBoost from measured samples (`spio.kernels.perf_samples`,
scripts/train_perf_model.py); spio reads and evaluates their trees itself (`spio.kernels.trees`),
so using them needs no xgboost.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import env
from ..compiler.occupancy import SmLimits, limits_of
from ..log import logger
from ..memo import remember
from .conv2d_gw8_factory import H200_CLASS, Machine, machine_of
from .conv2d_gw8_params import Conv2dGw8Params
from .families import FAMILIES, Family, family_of
from .kernel import cuda_ordinal
from .perf_samples import ARCH_NAME
from .stats import Conv2dStats
from .trees import TreeEnsemble, read_ubjson

#: Folder of the models shipped in the package.
PACKAGED_MODELS_DIR = Path(__file__).resolve().parent.parent / "perf_models"

#: Version of the feature set and target; a model whose JSON names another version is refused.
FEATURE_VERSION = 1

#: What a model predicts: log of seconds per byte that must move. Within one layer this is log
#: time minus a constant, so it ranks configs exactly as log time does, while sparing the trees
#: from learning the layer's size.
TARGET = "log_seconds_per_byte"

#: A model is trusted from 1/COVER_FACTOR of the smallest to COVER_FACTOR times the largest batch
#: size it was measured at (`PerfModel.coverage_gap`); outside that the analytic heuristic decides.
COVER_FACTOR = 2


class PerfModelError(RuntimeError):
    """A model file that cannot be used: unreadable, corrupted, or for other features."""


# --------------------------------------------------------------------------------------------
# Features (vectorised over the configs of one layer: a layer has up to a few hundred)

_PARAM_FEATURES = (
    "n", "c", "groups", "h", "w", "pad_h", "pad_w", "r", "s", "has_bias", "bf16",
    "out_h", "out_w", "log_bytes", "log_macs",
)  # fmt: skip
_DERIVED_FEATURES = (
    "threads", "smem_bytes", "blocks", "log_blocks", "tiles_y", "tiles_x", "overrun_y",
    "overrun_x", "halo", "traffic", "compute", "sector_waste", "fill", "resident", "waves",
    "log_bytes_in_flight",
)  # fmt: skip

#: A rough machine model for the derived features (an H100/H200-class GPU). The model is trained
#: per arch, so these only shape the features; they need not match the GPU exactly.
_SMS = 132
_THREADS_PER_SM = 2048
_SHARED_BYTES_PER_SM = 228 * 1024


@functools.cache
def feature_names(family: Family) -> tuple[str, ...]:
    """The model's input columns for `family`, in order."""
    configs = tuple(f"cfg_{name}" for name in family.config_fields)
    return _PARAM_FEATURES + configs + _DERIVED_FEATURES


def _config_columns(family: Family, configs: Sequence) -> dict[str, np.ndarray]:
    names = family.config_fields
    getter = operator.attrgetter(*names)
    table = np.array([getter(c) for c in configs], dtype=np.float64).reshape(len(configs), -1)
    return {name: table[:, i] for i, name in enumerate(names)}


def features(family: Family, params: Conv2dGw8Params, configs: Sequence) -> np.ndarray:
    """Feature matrix (len(configs) x len(feature_names)), float32, for one layer."""
    if not configs:
        raise ValueError(f"{family.name} features need at least one config, got none")
    cfg = _config_columns(family, configs)
    g, r, s = params.groups, params.r, params.s
    wgrad = family.pass_ == "wgrad"
    smem = np.array([family.shared_mem_bytes(params, c) for c in configs], dtype=np.float64)
    threads = np.array([c.threads for c in configs], dtype=np.float64)
    cg, bp, bq = cfg["groups"], cfg["block_p"], cfg["block_q"]
    stages = cfg["stages"]
    groups_run = np.ceil(g / cg) * cg
    # The shipped models were trained on this formula, which charges waste to blocks that hold
    # all of an odd group count (e.g. 3 groups in blocks of 4); conv2d_gw8_factory.sector_waste
    # no longer does. Adopt that with the next FEATURE_VERSION, once the WGrad model can be
    # retrained from samples of the kernels as spio runs them.
    span = np.minimum(cg, g) * 16
    sector = np.ceil(span / 32) * 32 / span if g > 1 else np.ones(len(configs))
    # Each block spans block_n images (WGrad sums them; FProp and DGrad stream them in turn).
    images = np.ceil(params.n / cfg["block_n"])
    n_run = images * cfg["block_n"]
    if wgrad:  # tiles of dy
        out_h, out_w = params.p, params.q
        row_bytes = cg * (2 * bq + s - 1) * 16
    else:  # tiles of the output (dx for DGrad)
        out_h, out_w = (params.h, params.w) if family.pass_ == "dgrad" else (params.p, params.q)
        row_bytes = cg * (bq + s - 1) * 16
    tiles_y, tiles_x = np.ceil(out_h / bp), np.ceil(out_w / bq)
    blocks = images * tiles_y * tiles_x * (groups_run / cg)
    useful = out_h * out_w * g * params.n
    read = tiles_y * (bp + r - 1) * tiles_x * (bq + s - 1)
    computed = tiles_y * bp * tiles_x * bq
    traffic = (read + computed) * groups_run * n_run / (2 * useful)
    compute = computed * groups_run * n_run / useful
    resident = np.maximum(
        1,
        np.minimum.reduce(
            [
                np.full(len(configs), 32.0),
                _THREADS_PER_SM // threads,
                _SHARED_BYTES_PER_SM // (smem + 1024),
            ]
        ),
    )
    resident = np.minimum(resident, np.ceil(blocks / _SMS))
    stats = Conv2dStats(params)
    values = {
        "n": params.n,
        "c": params.c,
        "groups": g,
        "h": params.h,
        "w": params.w,
        "pad_h": params.padding_h,
        "pad_w": params.padding_w,
        "r": r,
        "s": s,
        "has_bias": float(params.has_bias),
        "bf16": float(params.dtype == "bf16"),
        "out_h": out_h,
        "out_w": out_w,
        "log_bytes": math.log(stats.bytes(family.pass_)),
        "log_macs": math.log(stats.macs),
        **{f"cfg_{name}": column for name, column in cfg.items()},
        "threads": threads,
        "smem_bytes": smem,
        "blocks": blocks,
        "log_blocks": np.log(blocks),
        "tiles_y": tiles_y,
        "tiles_x": tiles_x,
        "overrun_y": tiles_y * bp / out_h,
        "overrun_x": tiles_x * bq / out_w,
        "halo": read / computed,
        "traffic": traffic,
        "compute": compute,
        "sector_waste": sector,
        "fill": np.minimum(1.0, blocks / _SMS),
        "resident": resident,
        "waves": blocks / (_SMS * resident),
        "log_bytes_in_flight": np.log(resident * (stages - 1) * row_bytes),
    }
    names = feature_names(family)
    matrix = np.empty((len(configs), len(names)), dtype=np.float32)
    for i, name in enumerate(names):
        matrix[:, i] = values[name]
    return matrix


def target_offset(family: Family, params: Conv2dGw8Params) -> float:
    """log(bytes that must move): predicted log time = prediction + this offset."""
    return math.log(Conv2dStats(params).bytes(family.pass_))


# --------------------------------------------------------------------------------------------
# Devices and model files


@dataclass(frozen=True)
class DeviceIdentity:
    """What decides which model (and which autotune cache entry) applies to a GPU, and, where no
    model does, the machine the analytic heuristic ranks configs for (arch and SM count)."""

    arch: str
    name: str
    driver: str
    sms: int = 0  # streaming multiprocessors; 0: unknown (the heuristic assumes an H200's)
    limits: SmLimits | None = None  # per SM, as the GPU reports them; None: the arch's

    @property
    def slug(self) -> str:
        return device_slug(self.name)

    @property
    def machine(self) -> Machine:
        """The machine the analytic heuristic ranks configs for on this GPU."""
        return machine_of(self.arch, self.sms, self.limits)


def device_slug(name: str) -> str:
    """A folder name for a device name: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


@functools.cache
def _cuda_identity(ordinal: int) -> DeviceIdentity:
    from ..cuda import driver

    return identity_of(driver.device_attributes(ordinal), driver.driver_version())


def identity_of(attrs: dict, driver_version: tuple[int, int]) -> DeviceIdentity:
    """The identity of a GPU from its driver attributes (spio.cuda.driver.device_attributes) and
    the driver's CUDA version."""
    major, minor = driver_version
    return DeviceIdentity(
        arch=attrs["arch"],
        name=attrs["name"],
        driver=f"{major}.{minor}",
        sms=attrs["sm_count"],
        limits=reported_limits(attrs),
    )


def reported_limits(attrs: dict) -> SmLimits:
    """A GPU's per-SM limits from its driver attributes (threads, resident blocks, registers,
    shared memory); a value it reports as 0 or not at all comes from the arch's entry in
    spio.compiler.occupancy.LIMITS (sm_90's for an arch without one)."""
    known = limits_of(attrs["arch"])

    def reported(key: str, default: int) -> int:
        value = attrs.get(key)
        return value if isinstance(value, int) and value > 0 else default

    return SmLimits(
        threads=reported("max_threads_per_sm", known.threads),
        blocks=reported("max_blocks_per_sm", known.blocks),
        shared_bytes=reported("max_shared_memory_per_sm", known.shared_bytes),
        registers=reported("max_registers_per_sm", known.registers),
    )


def device_identity(device: Any) -> DeviceIdentity | None:
    """Arch, name and driver of a CUDA torch.device; None for None or a non-CUDA device."""
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    return _cuda_identity(cuda_ordinal(device))


def models_dir() -> Path:
    """Where models are looked up: SPIO_PERF_MODELS, else the package's spio/perf_models."""
    folder = env.path("SPIO_PERF_MODELS")
    return folder if folder is not None else PACKAGED_MODELS_DIR


def models_setting_problem() -> str | None:
    """What is wrong with SPIO_PERF_MODELS, or None: set to something that is not a folder (a
    typo must not pass for "no models": the heuristic would pick every config unannounced)."""
    folder = env.path("SPIO_PERF_MODELS")
    if folder is None or folder.is_dir():
        return None
    return (
        f"SPIO_PERF_MODELS must name a folder of models (sm_XX/<family>.ubj), got "
        f"{os.environ['SPIO_PERF_MODELS']!r}, not a folder; unset it for the shipped models"
    )


def check_models_setting() -> None:
    """ValueError, naming SPIO_PERF_MODELS, where models_setting_problem finds one."""
    problem = models_setting_problem()
    if problem is not None:
        raise ValueError(problem)


def model_path(folder: Path, family: str, arch: str, device_name: str | None = None) -> Path:
    """`<folder>/<arch>[/<device-slug>]/<family>.ubj`; ValueError for an arch that is not
    one (a name such as `../x` would put the file elsewhere)."""
    if not ARCH_NAME.fullmatch(arch):
        raise ValueError(f"perf model arch must be an arch such as sm_90, got {arch!r}")
    base = Path(folder) / arch
    if device_name is not None:
        base = base / device_slug(device_name)
    return base / f"{family}.ubj"


def model_candidates(folder: Path, family: str, identity: DeviceIdentity) -> list[Path]:
    """Model files that apply to a device, most specific first."""
    return [
        model_path(folder, family, identity.arch, identity.name),
        model_path(folder, family, identity.arch),
    ]


def read_meta(meta_path: str | os.PathLike) -> dict:
    """A model's JSON metadata (without loading the model); PerfModelError if it is
    unreadable or not a JSON object."""
    import json

    try:
        meta = json.loads(Path(meta_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PerfModelError(f"perf model metadata {meta_path} is unreadable: {error}") from None
    if not isinstance(meta, dict):
        raise PerfModelError(f"perf model metadata {meta_path} is not a JSON object")
    return meta


def first_line(error: BaseException) -> str:
    """The first line of an error's message, or its type's name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@dataclass(frozen=True)
class PerfModel:
    """A trained model of one kernel family's run time, with the metadata stored beside it."""

    family: Family
    path: Path
    meta: dict = field(compare=False, repr=False)
    trees: TreeEnsemble = field(compare=False, repr=False)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        family: str | None = None,
        identity: DeviceIdentity | None = None,
    ) -> PerfModel:
        """Load `<family>.ubj` and its `<family>.json`; PerfModelError if either is unusable,
        or, where given, the model is of another family than `family` or for another device
        than `identity`: another arch, or (a per-device model) another device name."""
        path = Path(path)
        meta = read_meta(path.with_suffix(".json"))
        model_family = _check_meta(path, meta, family, identity)
        data = _read_model_file(path, meta)
        try:  # checked as it is read: a damaged file is an error, never a crash or a wrong tree
            trees = TreeEnsemble.from_model(read_ubjson(data))
        except ValueError as error:
            raise PerfModelError(
                f"perf model {path} is unreadable or corrupted: {first_line(error)}"
            ) from None
        if trees.n_features != len(feature_names(model_family)):
            raise PerfModelError(
                f"perf model {path} takes {trees.n_features} features, "
                f"expected {len(feature_names(model_family))}"
            )
        _check_batch_sizes(path, meta)
        _check_config_values(path, meta, model_family)
        return cls(family=model_family, path=path, meta=meta, trees=trees)

    @property
    def batch_range(self) -> tuple[float, float] | None:
        """(lowest, highest) batch size the model is trusted at: half the smallest to twice the
        largest measured one; None for a model that does not record its batch sizes."""
        sizes = self.meta.get("batch_sizes")
        if not sizes:
            return None
        return min(sizes) / COVER_FACTOR, float(max(sizes) * COVER_FACTOR)

    def coverage_gap(self, params: Conv2dGw8Params) -> tuple[str, str] | None:
        """(reason, explanation) when `params.n` lies outside batch_range, else None (always
        None for a model without batch sizes; dtype is not checked: fp16 and bf16 move the same
        bytes). The reason ('batch sizes below the range' or '... above the range') groups log
        lines; the explanation names the batch size and the measured range."""
        bounds = self.batch_range
        if bounds is None or bounds[0] <= params.n <= bounds[1]:
            return None
        side = "below" if params.n < bounds[0] else "above"
        sizes = ", ".join(str(n) for n in sorted(self.meta["batch_sizes"]))
        return f"batch sizes {side} the range", (
            f"batch size {params.n} is {side} the range it covers, {bounds[0]:g} to "
            f"{bounds[1]:g} (measured at batch sizes {sizes})"
        )

    def predict_log_seconds(self, params: Conv2dGw8Params, configs: Sequence) -> np.ndarray:
        """Predicted log run time (seconds) of each config, in one batched call."""
        matrix = features(self.family, params, configs)
        prediction = self.trees.predict(matrix)
        return prediction.astype(np.float64) + target_offset(self.family, params)

    def measured(self, config) -> bool:
        """Whether every field of `config` has a value the model was trained on (its metadata's
        `config_values`; a model without them takes every config as measured). A value never
        measured, such as a new config dimension, is one the trees cannot tell apart."""
        values = self.meta.get("config_values")
        if values is None:
            return True
        return all(getattr(config, name) in allowed for name, allowed in values.items())

    def rank(self, params: Conv2dGw8Params, configs: Sequence) -> list:
        """configs ordered from the fastest predicted to the slowest (ties: config order); the
        configs it was not trained on like (`measured`) follow, in their given order."""
        measured = [self.measured(c) for c in configs]
        known = [c for c, m in zip(configs, measured, strict=True) if m]
        unknown = [c for c, m in zip(configs, measured, strict=True) if not m]
        if not known:
            return unknown
        predicted = self.predict_log_seconds(params, known)
        if not np.isfinite(predicted).all():  # (its values sum past float32's range)
            raise PerfModelError(
                f"perf model {self.path} predicts a time that is not finite for layer "
                f"{params.encode()}"
            )
        return [known[i] for i in np.argsort(predicted, kind="stable")] + unknown


def _check_meta(
    path: Path, meta: dict, expected: str | None, identity: DeviceIdentity | None
) -> Family:
    """The model's family; PerfModelError unless the metadata says what this spio computes:
    a known family (`expected`, where given), TARGET, this feature set, and `identity`'s arch
    and (for a per-device model) device."""
    name = meta.get("family")
    family = FAMILIES.get(name) if isinstance(name, str) else None
    if family is None:
        raise PerfModelError(
            f"perf model {path} is for family {name!r}; known families: {', '.join(FAMILIES)}"
        )
    if expected is not None and name != expected:
        raise PerfModelError(f"perf model {path} is a model of {name}, not of {expected}")
    if meta.get("target") != TARGET:
        raise PerfModelError(
            f"perf model {path} predicts {meta.get('target')!r}; this spio reads {TARGET!r}"
        )
    version = meta.get("feature_version")
    if type(version) is not int or version != FEATURE_VERSION:  # (not True, not 1.0)
        newer = type(version) is int and version > FEATURE_VERSION
        raise PerfModelError(
            f"perf model {path} was trained on feature set version {version!r}; this spio "
            f"computes version {FEATURE_VERSION} ("
            + (
                "a newer spio trained it: upgrade spio to use it)"
                if newer
                else "retrain it with scripts/train_perf_model.py of spio's source)"
            )
        )
    features = meta.get("features")
    if not isinstance(features, list) or tuple(features) != feature_names(family):
        raise PerfModelError(
            f"perf model {path} lists features {features!r}; feature set version "
            f"{FEATURE_VERSION} of {name} is {list(feature_names(family))}"
        )
    if identity is not None:
        arch = identity.arch
        _check_made_for(path, meta, arch, f"the device's {arch}", identity.slug, identity.name)
    return family


def _check_made_for(
    path: Path, meta: dict, arch: str, arch_named: str, slug: str | None, device_named: str
) -> None:
    """PerfModelError unless the metadata's arch is `arch` and its device_slug, where it has one
    and `slug` is given, is `slug`: a model trained for the arch, and measured on the device,
    where spio would use it (a device's, or a folder's). `arch_named` and `device_named` name
    the expected arch and device in the message."""
    if meta.get("arch") != arch:
        raise PerfModelError(
            f"perf model {path} was trained for {meta.get('arch')!r}, not for {arch_named}"
        )
    recorded = meta.get("device_slug")
    if slug is not None and recorded is not None and recorded != slug:
        raise PerfModelError(
            f"perf model {path} was measured on {meta.get('device')!r}, not on {device_named}"
        )


def _read_model_file(path: Path, meta: dict) -> bytes:
    """The model file's bytes; PerfModelError where it cannot be read or lacks the
    `model_sha256` its metadata records (where it records one): a damaged or replaced file."""
    import hashlib

    expected = meta.get("model_sha256")
    if expected is not None and not isinstance(expected, str):
        raise PerfModelError(
            f"perf model metadata {path.with_suffix('.json')} has model_sha256 {expected!r}; "
            "expected a hex string"
        )
    try:
        data = path.read_bytes()
    except OSError as error:
        raise PerfModelError(f"perf model {path} is unreadable: {error}") from None
    if expected is None:
        return data
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected.lower():
        raise PerfModelError(
            f"perf model {path} is corrupted or replaced: its SHA-256 is {digest}, its metadata "
            f"records {expected}"
        )
    return data


def check_model_file(meta_path: Path, meta: dict) -> None:
    """PerfModelError unless the model file beside metadata `meta_path` exists and, where its
    metadata records a SHA-256, has those bytes: what `spio info` can check of a model without
    loading it (its trees are read and checked at first use)."""
    path = meta_path.with_suffix(".ubj")
    if not path.is_file():
        raise PerfModelError(f"perf model {path} is missing (its metadata {meta_path} is there)")
    _read_model_file(path, meta)


def check_model_slot(folder: Path, meta_path: Path, meta: dict) -> None:
    """PerfModelError unless the model whose metadata `meta` lies at `meta_path` in `folder` is
    one spio would use from that place (model_path): of the family its file is named for, what
    this spio computes (_check_meta), trained for the arch of its folder and, one folder down,
    measured on that folder's device. What `spio info` checks of a model besides its file."""
    path = meta_path.with_suffix(".ubj")
    _check_meta(path, meta, path.stem, None)
    parts = meta_path.relative_to(folder).parts  # arch, [device slug,] file
    if len(parts) > 3:
        raise PerfModelError(f"perf model {path} is not where spio looks for one")
    slug = parts[1] if len(parts) == 3 else None  # (a folder of its own: a device's model)
    arch_named = f"the {parts[0]} of its folder"
    _check_made_for(path, meta, parts[0], arch_named, slug, f"the device of its folder ({slug})")


def _check_batch_sizes(path: Path, meta: dict) -> None:
    """PerfModelError unless `batch_sizes`, where present, is a non-empty list of positive
    integers (an empty one would have read as a model trusted at every batch size)."""
    sizes = meta.get("batch_sizes")
    if sizes is None:
        return
    if (
        not isinstance(sizes, list)
        or not sizes
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes)
    ):
        raise PerfModelError(
            f"perf model metadata {path.with_suffix('.json')} has batch_sizes {sizes!r}; "
            "expected a non-empty list of positive integers"
        )


def _check_config_values(path: Path, meta: dict, family: Family) -> None:
    """PerfModelError unless `config_values`, where present, maps config fields of `family` to
    lists of integers."""
    values = meta.get("config_values")
    if values is None:
        return
    if (
        not isinstance(values, dict)
        or not set(values) <= set(family.config_fields)
        or not all(
            isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
            for v in values.values()
        )
    ):
        raise PerfModelError(
            f"perf model metadata {path.with_suffix('.json')} has config_values {values!r}; "
            f"expected lists of integers for fields of {', '.join(family.config_fields)}"
        )


_models: dict[tuple, PerfModel | PerfModelError] = {}
_warned: set[Any] = set()
_selected: dict[tuple, tuple[Any, str]] = {}  # select_config's key -> (config, how chosen)
#: Past this many selections _selected starts over (a layer met at a new batch or image size is
#: a new selection), so that sizes changing on every call do not each keep one; a tuned layer
#: then reads its choice from the autotune cache again.
MAX_SELECTED = 16384
_lock = threading.Lock()


def _warn_once(key: Any, message: str, *args: Any, level: Callable = logger.warning) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    level(message, *args)


def _file_state(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def load_model_cached(
    path: Path, family: str | None = None, identity: DeviceIdentity | None = None
) -> PerfModel:
    """PerfModel.load, memoised (its PerfModelError too) by the arguments and the size and
    modification time of the model and its metadata."""
    key = (str(path), family, identity, _file_state(path), _file_state(path.with_suffix(".json")))
    model = _models.get(key)
    if model is None:
        try:
            model = PerfModel.load(path, family, identity)
        except PerfModelError as error:
            model = error
        with _lock:
            _models[key] = model
    if isinstance(model, PerfModelError):
        raise model
    return model


def loadable_models(
    family: Family, identity: DeviceIdentity, folder: Path | None = None
) -> Iterator[PerfModel]:
    """The models of `family` for `identity` that load, most specific first (a per-device
    model, then the arch's). Unusable files are logged once and skipped."""
    folder = models_dir() if folder is None else Path(folder)
    for path in model_candidates(folder, family.name, identity):
        try:
            if not path.is_file():
                _absent_model_file(path)  # (none there, for this device or arch: no model)
                continue
            meta_path = path.with_suffix(".json")
            if not (meta_path.is_symlink() or meta_path.exists()):
                raise PerfModelError(
                    f"perf model {path} has no metadata: {meta_path.name} is missing beside it "
                    "(copy both files train_perf_model.py writes)"
                )
            yield load_model_cached(path, family.name, identity)
        except (PerfModelError, OSError) as error:  # OSError: also a folder it cannot enter
            _warn_once(("bad", str(path)), "ignoring perf model: %s", error)


def _absent_model_file(path: Path) -> None:
    """PerfModelError where model file `path`, not a file, is something else (a folder, a
    dangling link) or missing beside its metadata (a partial copy of a models folder): a
    model that was meant to apply. Nothing there at all is no error."""
    meta_path = path.with_suffix(".json")
    if path.is_symlink() or path.exists():
        raise PerfModelError(f"perf model {path} is not a file")
    if meta_path.exists():
        raise PerfModelError(f"perf model {path} is missing (its metadata {meta_path} is there)")


def clear_caches(models: bool = True) -> None:
    """Forget memoised selections, one-time warnings and (with `models`) loaded models."""
    with _lock:
        if models:
            _models.clear()
        _selected.clear()
        _warned.clear()
    _cuda_identity.cache_clear()


def rank_configs(
    family: Family, params: Conv2dGw8Params, identity: DeviceIdentity, folder: Path | None = None
) -> tuple[list, PerfModel | None]:
    """All configs of `family` for `params`, fastest first, and the model that ranked them.

    The model is the most specific one that loads, covers the batch size
    (`PerfModel.coverage_gap`) and has measured some of the layer's configs: a per-device model,
    else the arch's. The analytic heuristic ranks them instead (and the model returned is None)
    where none does. Each fallback is logged once per
    family, arch (or model file) and reason.
    """
    configs = family.configs(params)
    if not configs:
        raise ValueError(f"{family.name} has no tile config for layer {params.encode()}")
    looked_in = models_dir() if folder is None else Path(folder)
    found = False
    for model in loadable_models(family, identity, looked_in):
        found = True
        gap = model.coverage_gap(params)
        if gap is None and not any(model.measured(c) for c in configs):  # it would rank none
            reason = "layers none of whose configs it measured"
            gap = (reason, f"it has measured none of the configs of {params.encode()}")
        if gap is None:
            try:
                ranked = model.rank(params, configs)
            except PerfModelError as error:
                _warn_once(("rank", str(model.path)), "%s; not used", error)
                continue
            _note_other_device(model, identity)
            return ranked, model
        reason, explanation = gap
        _warn_once(
            ("uncovered", str(model.path), reason),
            "perf model %s does not apply: %s; using a less specific model where one applies, "
            "else the analytic heuristic (not logged again for %s)",
            model.path,
            explanation,
            reason,
            level=logger.info,
        )
    if not looked_in.is_dir():  # a typo must not pass for "no models" (info level, hidden)
        problem = models_setting_problem() if looked_in == models_dir() else None
        problem = problem or f"the perf models' folder {looked_in} is missing"
        _warn_once(("setting", problem), "%s: using the analytic heuristic", problem)
    elif not found:
        _warn_once(
            ("none", family.name, identity.arch, identity.name),
            "no perf model for %s on %s (%s) under %s; using the analytic heuristic",
            family.name,
            identity.arch,
            identity.name,
            looked_in,
            level=logger.info,
        )
    return heuristic_ranking(family, params, configs, identity.machine), None


def _note_other_device(model: PerfModel, identity: DeviceIdentity) -> None:
    """Log once per model file and device when an arch's model ranks configs for a GPU it was
    not measured on (the H200's sm_90 model for an H100 or H20): it applies to every GPU of its
    arch, but their SMs and bandwidth differ, so its ranking is an extrapolation there."""
    measured = model.meta.get("measured_on")
    if not isinstance(measured, list) or not measured or identity.name in measured:
        return
    _warn_once(
        ("other device", str(model.path), identity.name),
        "perf model %s was measured on %s, not on this %s; it ranks configs for every %s GPU, "
        "so its picks may not be this GPU's best (SPIO_AUTOTUNE=1 times its top candidates; "
        "a model measured on this GPU, in %s/%s/, would be preferred)",
        model.path,
        ", ".join(map(str, measured)),
        identity.name,
        identity.arch,
        identity.arch,
        identity.slug,
        level=logger.info,
    )


def unjudged_variants(family: Family, model: PerfModel | None, pick, configs: Sequence) -> list:
    """The configs that differ from `pick` only in what its ranking could not weigh: for a
    model, fields with values it was never trained on (`PerfModel.measured`); for the analytic
    heuristic, the fields `family.heuristic_ignores` and the values it cannot judge
    (`family.heuristic_untimed`). Autotuning times them besides the top-k, so that a config
    dimension no model has measured yet is still tried where it is timed. They are the pick's
    twins: several images a block, say, are tried where the pick's tile covers the whole image
    (the small images they are for), not with every whole-image tile of other layers, which
    would add three kernels a pass to most layers' tuning."""
    untimed: dict[str, tuple] = {}
    if model is None:
        untimed = dict(family.heuristic_untimed)
        fields = set(family.heuristic_ignores) | set(untimed)
    else:
        trained = model.meta.get("config_values") or {}
        fields = {f for f, v in trained.items() if any(getattr(c, f) not in v for c in configs)}
    if not fields:
        return []
    kept = [f for f in family.config_fields if f not in fields]

    def rest(config) -> tuple:
        return tuple(getattr(config, f) for f in kept)

    def weighed_apart(config) -> bool:
        """Whether it differs from the pick in a value of an untimed field that was run."""
        return any(
            getattr(config, f) != getattr(pick, f) and getattr(config, f) not in values
            for f, values in untimed.items()
        )

    return [c for c in configs if c != pick and rest(c) == rest(pick) and not weighed_apart(c)]


def heuristic_ranking(
    family: Family, params: Conv2dGw8Params, configs: Sequence, machine: Machine = H200_CLASS
) -> list:
    """configs in the analytic heuristic's order for `machine` (`family.heuristic_key`), those
    with another value than the default in a field it cannot weigh (`family.heuristic_ignores`)
    last: its cost would tie them with their default-valued twins and fill a top-k with copies."""
    defaults = family.config_type()

    def key(config) -> tuple:
        odd = any(getattr(config, f) != getattr(defaults, f) for f in family.heuristic_ignores)
        return (odd, family.heuristic_key(params, config, machine=machine))

    return sorted(configs, key=key)


def select_config(factory: Any, params: Conv2dGw8Params, device: Any = None, **options: Any) -> Any:
    """The tile config `factory.get_kernel` builds for `params` on `device`.

    CUDA device: the perf model's best config (SPIO_AUTOTUNE=1: the fastest of its top-k and of the
    pick's variants in fields the model cannot weigh (`unjudged_variants`), timed once and cached on
    disk); the analytic heuristic for the device's arch and SM count (SPIO_AUTOTUNE=1: the same,
    from its ranking) where no model applies, including a batch size the model does not cover
    and a layer none of whose configs it measured. No device or a CPU device: the analytic
    heuristic for an H200-class GPU. Selections are memoised per process, by the settings
    (SPIO_PERF_MODELS, SPIO_AUTOTUNE, SPIO_AUTOTUNE_TOPK, SPIO_TMA) too; the layers' kernel
    caches of spio.functional._kernels above them keep a layer's first choice. Inside a CUDA
    graph capture autotuning waits: the untuned pick serves that call only. So it does while
    spio.precompile collects the layers to tune (autotune.collecting), which records them.
    """
    family = family_of(factory.name, options)
    identity = device_identity(device) if family is not None else None
    if family is None or identity is None:
        return factory.default_config(params, **options)
    from . import autotune

    key, folder, top_k = _selection_key(family, params, identity, device)
    hit = _selected.get(key)
    if hit is not None:
        return hit[0]
    ranked, model = rank_configs(family, params, identity, folder)
    untuned = ranked[0]  # without a model, the heuristic's default_config for this GPU
    how = "heuristic" if model is None else f"model {model.path.parent.name}/{model.path.name}"
    if top_k is None:  # autotuning off
        return _remember(key, untuned, how)
    candidates = ranked[:top_k]
    candidates += [
        c for c in unjudged_variants(family, model, untuned, ranked) if c not in candidates
    ]
    if autotune.want(family, params, device, identity, candidates):
        return untuned  # spio.precompile builds the candidates first; not memoised
    if autotune.deferred(device):
        winner = autotune.cached_winner(family, params, identity, candidates)
        if winner is not None:  # tuned before (this process or another): what eager calls run
            return _remember(key, winner, "autotune")
        _warn_once(  # (once a family: a key per layer would grow with every batch size met)
            ("capture", family.name),
            "autotune: %s %s is first used inside a CUDA graph capture, where nothing can be "
            "timed; the capture gets %s, and the layer is tuned at its first use outside one "
            "(not logged again for this family's other layers)",
            family.name,
            params.encode(),
            untuned.encode(),
        )
        return untuned  # not memoised, so that a later call outside the capture tunes
    try:
        config = autotune.autotune(family, params, device, identity, candidates, model=model)
    except autotune.AutotuneFailed as error:  # (each config's failure was logged)
        # The untuned pick may well run (out of memory for timing's inputs, say); it is
        # remembered for this process, not on disk, so a later process tunes again.
        logger.warning("%s; running the untuned pick %s", error, untuned.encode())
        return _remember(key, untuned, how + " (autotune failed)")
    return _remember(key, config, "autotune")


def _remember(key: tuple, config: Any, how: str) -> Any:
    """Memoise select_config's choice `config` for `key`, chosen as `how` says; returns it."""
    with _lock:
        remember(_selected, key, (config, how), MAX_SELECTED)
    return config


def _selection_key(
    family: Family, params: Conv2dGw8Params, identity: DeviceIdentity, device: Any
) -> tuple[tuple, Path, int | None]:
    """(select_config's memo key, the models folder, SPIO_AUTOTUNE_TOPK or None when autotuning
    is off): the settings are part of the key, SPIO_TMA's tensor copies on this arch too
    (autotuning times the kernels with them: its winner under one setting is not the other's)."""
    from . import autotune
    from .conv2d_gw8_factory import tensor_copies

    folder = models_dir()
    top_k = autotune.top_k() if autotune.autotune_enabled() else None
    copies = tensor_copies(identity.arch)
    return (family.name, params, identity, str(folder), top_k, copies, device.index), folder, top_k


def selection_source(family: Family, params: Conv2dGw8Params, device: Any) -> str:
    """How select_config chose `family`'s config for `params` on `device` under the current
    settings: "model <arch>/<file>", "heuristic" (no model applies, or no GPU), "autotune",
    either of the first two with " (autotune failed)" where no candidate could be timed, or
    "not selected" where it has not chosen one (yet, or since clear_caches)."""
    identity = device_identity(device)
    if identity is None:
        return "heuristic"
    hit = _selected.get(_selection_key(family, params, identity, device)[0])
    return "not selected" if hit is None else hit[1]
