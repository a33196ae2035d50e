"""Measured autotuning: time the performance model's top-k configs once, keep the winner on disk.

With SPIO_AUTOTUNE=1, `KernelFactory.get_kernel` on a CUDA device times, the first time it meets
a layer, the k configs the model (or, where none applies, the heuristic) ranks best
(SPIO_AUTOTUNE_TOPK, default 5) and the pick's variants in fields no model has measured, and
stores the fastest in `<cache_root>/autotune/`, keyed by device name, driver, spio version,
kernel family, layer params, the configs timed and a digest of their kernels' code and
compiler (`cache_key`). Later uses, in this process or another, read the entry and time
nothing. spio.precompile finds a model's layers to tune first (`collecting`), so that their
candidates build all at once.

The timing helpers here (`kernel_inputs`, `time_kernel`) are also what scripts/perf_sample.py uses
to measure the data the models are trained on. They time a pass as spio runs it: a WGrad time
includes its reduction (zeroing and atomics, or partial sums and their sum), and the kernels
timed move their rows as spio's would on that GPU (by tensor copies where SPIO_TMA asks:
`families.with_tensor_copies`), so a tuned pick is the fastest of what would run.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..env import flag, integer
from ..log import logger
from .conv2d_gw8_params import Conv2dGw8Params
from .kernel import Kernel, cuda_ordinal
from .stats import Conv2dStats

DEFAULT_TOP_K = 5

#: A timer: (family name, params, kernel, device) -> seconds per call of the pass (`pass_call`).
Timer = Callable[[str, Conv2dGw8Params, Kernel, Any], float]


def autotune_enabled() -> bool:
    """True when SPIO_AUTOTUNE=1 (or true, yes, on); then SPIO_AUTOTUNE_TOPK is checked too, so
    that a bad value raises ValueError wherever autotuning is consulted, not only on a GPU."""
    if not flag("SPIO_AUTOTUNE"):
        return False
    top_k()
    return True


def capturing(device: Any) -> bool:
    """True while a CUDA graph is being captured on `device`'s current stream. Timing configs
    then would synchronise with the GPU, which a capture forbids."""
    import torch

    if not torch.cuda.is_available():
        return False
    with torch.cuda.device(cuda_ordinal(device)):
        return torch.cuda.is_current_stream_capturing()


def deferred(device: Any) -> bool:
    """True when autotuning is on but must wait: while `device` captures a CUDA graph, or while
    spio.precompile collects what to build (`collecting`). The untuned choice then serves the
    call, and nothing may remember it, so that the layer's next selection tunes."""
    if not autotune_enabled():
        return False
    if _wanted.get() is not None:
        return True
    return getattr(device, "type", None) == "cuda" and capturing(device)


#: What spio.precompile's first pass found to tune (`collecting`): by autotune cache key,
#: (family, device, the candidates' kernels, {config: why its kernel could not be made}).
Wanted = dict[str, tuple[Any, Any, list, dict]]
_wanted: contextvars.ContextVar[Wanted | None] = contextvars.ContextVar(
    "spio_autotune_wanted", default=None
)


@contextlib.contextmanager
def collecting() -> Iterator[Wanted]:
    """Within: a layer whose selection would autotune is not tuned; its candidates are recorded
    in the yielded dict (`want`), for spio.precompile to build every layer's at once, and its
    untuned pick serves, remembered nowhere (`deferred`). Layers tuned before are not recorded."""
    wanted: Wanted = {}
    token = _wanted.set(wanted)
    try:
        yield wanted
    finally:
        _wanted.reset(token)


def want(
    family: Any, params: Conv2dGw8Params, device: Any, identity: Any, candidates: Sequence
) -> bool:
    """Inside `collecting`, record that `params` is to be tuned over `candidates` unless the
    autotune cache has a usable entry for it already (a damaged or outdated one is timed again,
    as autotune would at first use), and return True: the caller then serves its untuned pick.
    Outside, return False: the caller tunes now."""
    wanted = _wanted.get()
    if wanted is None:
        return False
    key, kernels, unmade = _tuning(family, params, identity, candidates)
    if key not in wanted and not _usable(_cache().get(key), family, params):
        wanted[key] = (family, device, [k for k in kernels if k is not None], unmade)
    return True


def top_k() -> int:
    """How many configs to time: SPIO_AUTOTUNE_TOPK (a positive int), default 5; ValueError
    naming the setting for any other value."""
    value = integer("SPIO_AUTOTUNE_TOPK", "a positive integer", lambda value: value >= 1)
    return DEFAULT_TOP_K if value is None else value


# --------------------------------------------------------------------------------------------
# Timing on a GPU


def kernel_inputs(family: str, params: Conv2dGw8Params, device: Any, seed: int = 0) -> list[Any]:
    """Launch arguments of one kernel of `family` for `params`: random inputs (never zeros) in
    the kernels' NHWC layout and an output, on `device`. For WGrad, dw and dbias (the first two)
    are None: its `pass_call` runs `wgrad`, which makes its own, and nothing else reads them."""
    import torch

    from .conv2d_gw8_params import torch_dtype

    dtype = torch_dtype(params.dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cl = torch.channels_last

    def randn(shape, dt=dtype):
        return torch.randn(shape, generator=gen).to(device=device, dtype=dt)

    def act(shape):
        return randn(shape).contiguous(memory_format=cl)

    weight = randn(params.weight_shape).contiguous()
    if family == "conv2d_gw8_fprop":
        out = torch.empty(params.output_shape, dtype=dtype, device=device, memory_format=cl)
        bias = randn((params.c,), torch.float32) if params.has_bias else None
        return [out, act(params.input_shape), weight, bias, params.n]
    if family == "conv2d_gw8_dgrad":
        out = torch.empty(params.input_shape, dtype=dtype, device=device, memory_format=cl)
        return [out, act(params.output_shape), weight, None, params.n]
    if family == "conv2d_gw8_wgrad":
        return [None, None, act(params.input_shape), act(params.output_shape), params.n]
    raise ValueError(f"kernel_inputs needs a conv2d_gw8 family, got {family!r}")


def input_copies(family: str, params: Conv2dGw8Params, l2_bytes: int) -> int:
    """Input sets to rotate through so that a launch does not find its data in L2: the bench's
    rule (spio.bench.timing.rotation_sets), so that autotune, the performance model's samples
    and `spio bench` time kernels alike: enough sets for about 3x the L2's bytes, at most
    MAX_SETS (512)."""
    from ..bench.timing import rotation_sets
    from .families import get_family

    size = Conv2dStats(params).bytes(get_family(family).pass_)
    return rotation_sets(size, l2_bytes)


def pass_call(
    family: str, params: Conv2dGw8Params, kernel: Kernel, args: list[Any], device: Any
) -> Callable[[], Any]:
    """One call of the pass that `kernel` (of `family`) computes, on the launch arguments `args`
    (kernel_inputs), as spio runs it: one launch for FProp and DGrad; for WGrad the whole
    wrapper, `wgrad` (zeroing dw then the atomic kernel, or the partial-sums kernel then
    sum_slots), so that a WGrad time includes its reduction."""
    if family == "conv2d_gw8_wgrad":
        from .conv2d_gw8_wgrad_factory import wgrad

        x, dy = args[2], args[3]
        return lambda: wgrad(x, dy, params, kernel=kernel)
    if kernel.info_value("tma"):  # its tensor maps, encoded once for every call
        from .conv2d_gw8_factory import map_arguments

        args = [*args, *map_arguments(kernel, args[0], args[1], device)]
    return lambda: kernel.launch(args, device)


def time_kernel(
    family: str,
    params: Conv2dGw8Params,
    kernel: Kernel,
    arg_sets: Sequence[list[Any]],
    device: Any,
    *,
    warmup: int = 5,
    repeats: int = 25,
) -> float:
    """Median seconds per call (`pass_call`) of `kernel` on a CUDA `device`, rotating through
    `arg_sets` (a `spio.bench.timing.Rotation` shared by the kernels timed on them continues
    its round from one kernel to the next).

    Uses the benchmark's timing (spio.bench.timing.time_calls): calls queued behind a spin
    kernel, so each event pair brackets one call's GPU work and not the host's launch cost.
    """
    import torch

    from ..bench.timing import Rotation, time_calls

    if not arg_sets:
        raise ValueError("time_kernel needs at least one set of kernel arguments, got none")
    rotation = Rotation.of(arg_sets)
    calls = [pass_call(family, params, kernel, args, device) for args in arg_sets]
    with torch.cuda.device(device):
        timing = time_calls(
            lambda i: calls[rotation.next_index()](),
            warmup=max(1, warmup),
            reps=max(1, repeats),
        )
    return timing.median_ms * 1e-3


class _DefaultTimer:
    """Times kernels on the GPU; `prepare` compiles the candidates in parallel beforehand, and
    `release` frees the inputs the candidates of one layer share."""

    def __init__(self) -> None:
        self._inputs: tuple[tuple, Sequence] | None = None  # (family, params, device), arg sets

    def __call__(self, family: str, params: Conv2dGw8Params, kernel: Kernel, device: Any) -> float:
        """Seconds per call (`pass_call`) of `kernel`, with inputs rotated when they fit in the
        device's L2 (made once for all the candidates of a layer)."""
        key = (family, params, str(device))
        if self._inputs is None or self._inputs[0] != key:
            self._inputs = None  # free the last layer's first
            from ..bench.timing import Rotation

            copies = input_copies(family, params, _l2_bytes(device))
            sets = Rotation(kernel_inputs(family, params, device, seed) for seed in range(copies))
            self._inputs = (key, sets)  # one round for all the layer's candidates
        return time_kernel(family, params, kernel, self._inputs[1], device)

    def prepare(self, kernels: Sequence[Kernel], arch: str) -> None:
        """Compiles `kernels` in parallel, with the sum that a partials WGrad's `pass_call` runs
        after it (one for all the layer's candidates)."""
        from ..compiler import compile_many
        from .conv2d_gw8_wgrad_factory import with_sums

        compile_many([k.compile_job(arch) for k in with_sums(kernels)], progress=False)

    def release(self) -> None:
        self._inputs = None


#: The timer autotune uses unless given another (tests replace it with a fake).
default_timer: Timer = _DefaultTimer()


def _l2_bytes(device: Any) -> int:
    from ..cuda import driver

    return int(driver.device_attributes(cuda_ordinal(device))["l2_cache_bytes"])


# --------------------------------------------------------------------------------------------
# The autotune cache


def cache_key(
    family: str, params: Conv2dGw8Params, identity: Any, candidates: Sequence, code: str
) -> str:
    """The cache key of a tuned layer: device name, driver, spio version, family, params, the
    configs timed, so that other candidates (another SPIO_AUTOTUNE_TOPK, or a performance
    model ranking others first) are timed anew, and `code` (`code_digest`), so that kernels
    changed since, or built by another compiler, are too."""
    from .. import __version__
    from ..compiler import hash_key

    timed = sorted(config.encode() for config in candidates)
    return hash_key(
        "autotune",
        identity.name,
        identity.driver,
        __version__,
        family,
        params.encode(),
        timed,
        code,
    )


def make_kernels(
    family: Any, params: Conv2dGw8Params, candidates: Sequence, arch: str
) -> tuple[list[Any], dict[Any, Exception]]:
    """(each candidate's kernel as spio runs it on `arch` (with tensor copies where SPIO_TMA
    asks: families.with_tensor_copies), None for one that cannot be made; config -> why not)."""
    from .families import with_tensor_copies

    kernels: list[Any] = []
    unmade: dict[Any, Exception] = {}
    for config in candidates:
        try:
            kernels.append(with_tensor_copies(family.make_kernel(params, config), arch))
        except Exception as error:  # a config that cannot be made counts as slowest
            unmade[config] = error
            kernels.append(None)
    return kernels, unmade


def code_digest(kernels: Sequence[Any]) -> str:
    """A digest of what the candidates' binaries are made of besides their configs, in any
    order: each kernel's source, generated headers and launch shape (None for one that cannot
    be made), the sum_slots kernel a partials WGrad's timing runs after it (with_sums), and the
    compiler (spio.compiler.toolchain_identity)."""
    from ..compiler import hash_key
    from ..compiler.compile import toolchain_identity
    from .conv2d_gw8_wgrad_factory import with_sums

    made = sorted(
        (k.name, k.source, list(k.headers), k.grid, k.block, k.shared_mem_bytes)
        for k in with_sums(k for k in kernels if k is not None)
    )
    unmade = sum(k is None for k in kernels)
    return hash_key("autotune-code", made, unmade, toolchain_identity())


def _cache():
    from ..compiler import DiskCache

    global _default_cache
    if _default_cache is None:
        _default_cache = DiskCache("autotune")
    return _default_cache


_default_cache = None

#: Held while one layer's candidates are timed, so that threads tuning other layers take turns:
#: a time brackets a call with events on the device's current stream (the default stream, which
#: threads share unless they set their own), and would count another thread's launches there;
#: kernels of two threads would share the GPU's SMs anyway; and the default timer keeps one
#: layer's inputs at a time.
_timing = threading.Lock()


class AutotuneFailed(RuntimeError):
    """No candidate config of a layer could be timed (each failed to build, to launch, or gave
    no time): select_config runs the untuned pick instead."""


def autotune(
    family: Any,
    params: Conv2dGw8Params,
    device: Any,
    identity: Any,
    candidates: Sequence,
    *,
    model: Any = None,
    timer: Timer | None = None,
    cache: Any = None,
) -> Any:
    """The fastest of `candidates` for `params` on `device`, measured once and then cached.

    Not to be called while `device`'s stream is capturing a CUDA graph (`capturing`).
    `family` is a spio.kernels.families.Family; `identity` the device's DeviceIdentity; `timer`
    defaults to `default_timer`; `cache` to DiskCache("autotune"). A config that fails to build
    or launch, or whose time is not a positive finite number (NaN, say), counts as infinitely slow
    (logged); AutotuneFailed (a RuntimeError) when every one does, ValueError for no
    candidates.
    """
    if not candidates:
        raise ValueError(f"autotune of {family.name} needs at least one candidate config")
    cache = _cache() if cache is None else cache
    key, kernels, unmade = _tuning(family, params, identity, candidates)

    def failed(config: Any, error: object) -> None:  # (the layer too: many may be tuning)
        logger.warning(
            "autotune: %s %s of layer %s failed: %s",
            family.name,
            config.encode(),
            params.encode(),
            error,
        )

    def build() -> tuple[bytes, dict]:
        run = timer or default_timer
        for config, error in unmade.items():
            failed(config, error)
        prepare = getattr(run, "prepare", None)
        if prepare is not None:
            prepare([k for k in kernels if k is not None], identity.arch)
        times = []
        with _timing:
            for config, kernel in zip(candidates, kernels, strict=True):
                seconds = math.inf
                if kernel is not None:
                    try:
                        seconds = float(run(family.name, params, kernel, device))
                        if not 0 < seconds < math.inf:  # NaN, 0: a broken timing, not a win
                            raise ValueError(f"its time was {seconds!r} s")
                    except Exception as error:  # one broken config must not stop tuning
                        seconds = math.inf
                        failed(config, error)
                times.append(seconds)
            release = getattr(run, "release", None)
            if release is not None:
                release()
        best = min(range(len(candidates)), key=lambda i: times[i])
        if not math.isfinite(times[best]):
            raise AutotuneFailed(
                f"autotune of {family.name} for {params.encode()}: all {len(candidates)} "
                "candidate configs failed"
            )
        winner = candidates[best]
        logger.info(
            "autotune: %s %s on %s: %s in %.2f us (of %d timed; %s pick %s)",
            family.name,
            params.encode(),
            identity.name,
            winner.encode(),
            times[best] * 1e6,
            len(candidates),
            "heuristic's" if model is None else "model's",
            candidates[0].encode(),
        )
        entry = {
            "family": family.name,
            "params": params.encode(),
            "device": identity.name,
            "driver": identity.driver,
            "config": {name: getattr(winner, name) for name in family.config_fields},
            "timed": {c.encode(): t for c, t in zip(candidates, times, strict=True)},
            "model": None if model is None else str(model.path),
        }
        return json.dumps(entry, sort_keys=True).encode(), {"family": family.name}

    payload, _meta, cached = cache.get_or_build(key, build)
    config, problem = _entry_config(family, params, payload)
    if problem is not None and cached:  # a damaged or outdated entry: a miss, timed again
        logger.warning("autotune: %s %s: %s; timing again", family.name, params.encode(), problem)
        cache.discard(key)
        payload, _meta, cached = cache.get_or_build(key, build)
        config, problem = _entry_config(family, params, payload)
    if problem is not None:  # not expected of an entry just built
        logger.warning("autotune: %s; using %s", problem, candidates[0].encode())
        return candidates[0]
    if cached:
        logger.debug("autotune: %s %s: cached %s", family.name, params.encode(), config.encode())
    return config


def cached_winner(
    family: Any, params: Conv2dGw8Params, identity: Any, candidates: Sequence
) -> Any | None:
    """The config autotune found fastest for `params` over `candidates` earlier (its disk cache
    entry, as autotune keys it), or None where it has none usable. Reads no GPU: for a CUDA
    graph capture, which cannot time, to run the tuned config as eager calls do."""
    entry = _cache().get(_tuning(family, params, identity, candidates)[0])
    if not _usable(entry, family, params):
        return None
    assert entry is not None
    return _entry_config(family, params, entry[0])[0]


def _tuning(
    family: Any, params: Conv2dGw8Params, identity: Any, candidates: Sequence
) -> tuple[str, list, dict]:
    """(the autotune cache key of `params` over `candidates`, their kernels as run on
    `identity`'s arch (None where one could not be made), {config: why its kernel could not be
    made}): the key covers the kernels' code, so a changed kernel, or the same config with its
    rows moved otherwise (SPIO_TMA), is timed again."""
    kernels, unmade = make_kernels(family, params, candidates, identity.arch)
    return (
        cache_key(family.name, params, identity, candidates, code_digest(kernels)),
        kernels,
        unmade,
    )


def _usable(entry: tuple[bytes, dict] | None, family: Any, params: Conv2dGw8Params) -> bool:
    """Whether a cache entry (payload, meta), or None for a miss, names a config to use."""
    return entry is not None and _entry_config(family, params, entry[0])[1] is None


def _entry_config(family: Any, params: Conv2dGw8Params, payload: bytes) -> tuple[Any, str | None]:
    """(the config an autotune cache entry names, None), or (None, why it is unusable)."""
    try:
        fields = json.loads(payload)["config"]
        if not isinstance(fields, dict):
            raise TypeError(f"its config is {fields!r}, not an object of fields")
        config = family.config_from_fields(fields)
    except (ValueError, KeyError, TypeError, OverflowError) as error:  # (an inf, int() refuses)
        return None, f"unusable cache entry ({type(error).__name__}: {error})"
    if config not in family.configs(params):
        return None, f"cached config {config.encode()} is no longer a config of {family.name}"
    return config, None
