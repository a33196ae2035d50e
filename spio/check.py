"""`python -m spio check`: a numerical self-test of every kernel pass in both dtypes.

Runs FProp, DGrad and WGrad (with the bias gradient where the layer has a bias) over a sample of
layers and tile configs on a CUDA GPU, or in the CPU emulator without one, and compares each
result with the float64 reference under the tolerance derived from accumulation depth
(`spio.reference.conv2d_gw8_tolerance`). Inputs are random and the buffers the kernels write are
poisoned with NaN first (WGrad's atomic kernel adds into zeros instead), so a kernel that skips
an element fails. Every other run of each pass holds its operands as a half-precision model does
(`held`), and some WGrad runs use the atomic kernel (`atomic`), so that each way spio runs a
pass is checked. One line per pass and dtype reports the worst
error as a fraction of the tolerance (<= 1 passes); any failure gives a non-zero exit status.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .kernels.conv2d_gw8_params import DTYPES, Conv2dGw8Params
from .kernels.stats import PASSES

P = Conv2dGw8Params

#: Small layers for the emulator: 3x3 with bias, a 1-row filter, padding larger than the filter
#: (negative DGrad padding), a tall non-square filter with 5 groups (partial group blocks), and
#: a tiny unpadded image with several images.
EMULATOR_LAYERS = (
    P(n=1, c=16, h=6, w=5, padding=1, r=3, s=3, has_bias=True),
    P(n=2, c=8, h=9, w=20, padding=(0, 2), r=1, s=5),
    P(n=1, c=24, h=7, w=19, padding=4, r=3, s=3),
    P(n=1, c=40, h=11, w=10, padding=(2, 1), r=5, s=2, has_bias=True),
    P(n=3, c=8, h=4, w=4, padding=0, r=4, s=1),
    # A batch of small images: the only layer here whose WGrad has configs with several images
    # a block (and FProp/DGrad ragged ones: 9 images in blocks of 2, 4 or 8). Without it every
    # emulated WGrad run was one image a block, and a kernel that read only a block's first
    # image passed the check (mutation testing, 2026-12-06).
    P(n=9, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True),
)

#: `spio check --quick`'s layers in the emulator: runs 0 (plain), 1 (held: the biased layer) and
#: 2 (WGrad's atomic kernel) of each pass, as `held` and `atomic` pick them.
QUICK_EMULATOR_LAYERS = (EMULATOR_LAYERS[1], EMULATOR_LAYERS[0], EMULATOR_LAYERS[4])

#: Extra layers on a GPU: table-sized shapes (several tiles, many groups, larger batches).
GPU_LAYERS = EMULATOR_LAYERS + (
    P(n=4, c=64, h=64, w=64, padding=1, r=3, s=3),
    P(n=2, c=96, h=56, w=56, padding=2, r=5, s=5, has_bias=True),
    P(n=8, c=368, h=7, w=7, padding=1, r=3, s=3),
    P(n=4, c=128, h=32, w=32, padding=(0, 1), r=1, s=3),
    P(n=3, c=152, h=14, w=14, padding=1, r=3, s=3, has_bias=True),
)


@dataclass(frozen=True)
class PassResult:
    """Every run of one pass in one dtype."""

    pass_: str
    dtype: str
    runs: int = 0
    worst: float = 0.0  # largest |error| / (atol + rtol * |expected|) over all runs and elements
    failures: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return self.runs > 0 and not self.failures

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        text = (
            f"{self.pass_:<5} {self.dtype}  {status}  worst error {self.worst:.3g} of tolerance "
            f"({self.runs} runs)"
        )
        if self.failures:
            text += f"; {len(self.failures)} failed, first: {self.failures[0]}"
        return text


def error_ratio(actual, expected, atol: float, rtol: float) -> float:
    """max |actual - expected| / (atol + rtol * |expected|); inf when actual has NaN or Inf."""
    import torch

    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.to(torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"shape {tuple(actual.shape)} differs from {tuple(expected.shape)}")
    if not torch.isfinite(actual).all():
        return math.inf
    allowed = atol + rtol * expected.abs()
    return float(((actual - expected).abs() / allowed).max())


def random_inputs(params: Conv2dGw8Params, seed: int) -> dict:
    """Random CPU tensors (never zeros) in the layer's dtype: x, w, dy, and an fp32 bias or None."""
    import torch

    from .kernels.conv2d_gw8_params import torch_dtype

    gen = torch.Generator().manual_seed(seed)
    dtype = torch_dtype(params.dtype)
    return {
        "x": torch.randn(params.input_shape, generator=gen).to(dtype),
        "w": (torch.randn(params.weight_shape, generator=gen) / 3).to(dtype),
        "dy": torch.randn(params.output_shape, generator=gen).to(dtype),
        "bias": torch.randn(params.c, generator=gen) if params.has_bias else None,
    }


def _poisoned(shape, like, device: str):
    import torch

    return torch.full(shape, float("nan"), dtype=like.dtype, device=device).contiguous(
        memory_format=torch.channels_last
    )


def run_one(
    params: Conv2dGw8Params,
    pass_: str,
    config,
    device: str,
    seed: int = 0,
    kernel=None,
    as_held: bool = False,
) -> float:
    """Worst error / tolerance of one kernel run (bias gradient included for WGrad). `kernel`:
    a kernel to run instead of the one spio makes for `config` (e.g. a timing variant).
    `as_held`: the operands as a half-precision model holds them: for FProp and DGrad,
    channels_last weights and (FProp) a bias in the activations' dtype, run by the kernel
    variant that reads them so (kernel_as_run's), where the others read an fp32 bias and
    contiguous weights; for WGrad, dw (channels_last) and dbias in the activations' dtype, as
    the gradients of such weights, where the others are fp32 and contiguous."""
    import torch

    from .kernels import conv2d_gw8_factory as fd
    from .kernels import conv2d_gw8_wgrad_factory as wg
    from .reference import (
        conv2d_gw8_bias_grad_ref,
        conv2d_gw8_dgrad_ref,
        conv2d_gw8_fprop_ref,
        conv2d_gw8_tolerance,
        conv2d_gw8_wgrad_ref,
    )

    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {', '.join(PASSES)}, got {pass_!r}")
    if kernel is None:
        kernel = kernel_as_run(params, pass_, config, device, as_held)
    elif as_held and pass_ in HELD_PASSES:  # a kernel given (a timing variant, say), as it
        kernel = fd.variant(kernel, *held_layout(params, pass_))  # reads operands held so
    t = random_inputs(params, seed)
    if as_held:
        t["w"] = t["w"].contiguous(memory_format=torch.channels_last)
        if t["bias"] is not None and pass_ == "fprop":
            t["bias"] = t["bias"].to(t["x"].dtype)  # the reference adds this rounded bias too
    dev: dict[str, Any] = {k: None if v is None else v.to(device) for k, v in t.items()}
    if pass_ == "fprop":
        out = _poisoned(params.output_shape, t["x"], device)
        out = fd.fprop(dev["x"], dev["w"], dev["bias"], params, config, out=out, kernel=kernel)
        expected = conv2d_gw8_fprop_ref(t["x"], t["w"], t["bias"], params.padding)
        tol = conv2d_gw8_tolerance(params, "fprop", t["x"], t["w"])
        return error_ratio(out, expected, tol.atol, tol.rtol)
    if pass_ == "dgrad":
        out = _poisoned(params.input_shape, t["dy"], device)
        out = fd.dgrad(dev["dy"], dev["w"], params, config, out=out, kernel=kernel)
        expected = conv2d_gw8_dgrad_ref(t["dy"], t["w"], params.padding, (params.h, params.w))
        tol = conv2d_gw8_tolerance(params, "dgrad", t["dy"], t["w"])
        return error_ratio(out, expected, tol.atol, tol.rtol)
    # As held: the gradients of half weights and bias, which sum_slots (or the atomic path's
    # copy) rounds once and lays out as the weights are.
    grad_dtype = t["x"].dtype if as_held else torch.float32
    dw, dbias = wg.wgrad(dev["x"], dev["dy"], params, kernel=kernel, poison=True,
                         dtypes=(grad_dtype, grad_dtype), channels_last=as_held)  # fmt: skip
    if as_held and not dw.is_contiguous(memory_format=torch.channels_last):
        return math.inf  # autograd would lay it out again, where the op promises not to
    if as_held and kernel.info_value("partials"):
        # sum_slots adds in a fixed order and rounds once: the held gradients are the fp32
        # ones rounded to nearest, bit for bit (a rounding toward zero is within the tolerance)
        dw32, dbias32 = wg.wgrad(dev["x"], dev["dy"], params, kernel=kernel, poison=True)
        same = torch.equal(dw.cpu(), dw32.cpu().to(grad_dtype))
        if dbias is not None and dbias32 is not None:
            same = same and torch.equal(dbias.cpu(), dbias32.cpu().to(grad_dtype))
        if not same:
            return math.inf
    expected = conv2d_gw8_wgrad_ref(t["x"], t["dy"], params.padding, params.r, params.s)
    tol = conv2d_gw8_tolerance(params, "wgrad", t["x"], t["dy"], out_dtype=grad_dtype)
    worst = error_ratio(dw, expected, tol.atol, tol.rtol)
    if params.has_bias:
        if dbias is None:
            return math.inf
        bias_tol = conv2d_gw8_tolerance(
            params, "wgrad", t["dy"], torch.ones(1), out_dtype=grad_dtype
        )
        expected_bias = conv2d_gw8_bias_grad_ref(t["dy"])
        worst = max(worst, error_ratio(dbias, expected_bias, bias_tol.atol, bias_tol.rtol))
    return worst


#: The passes whose kernels read the weights (and FProp's the bias) in the layout a model
#: holds them in, with a variant for each (conv2d_gw8_factory.variant).
HELD_PASSES = ("fprop", "dgrad")


def held(index: int) -> bool:
    """Whether a pass's run `index` (of one dtype) has its operands as a half-precision model
    holds them (run_one's `as_held`): every other one, the odd ones, in every pass. (All had
    read an fp32 bias and contiguous weights, so a kernel reading a bf16 bias as fp16 passed the
    check; and all WGrad runs had summed into fp32 contiguous gradients, so a sum_slots that
    wrote a channels_last dw in the contiguous layout passed it: mutation testing, 2026-12-06.)"""
    return index % 2 == 1


def atomic(index: int, pass_: str) -> bool:
    """Whether a pass's run `index` (of one dtype) runs WGrad's atomic kernel, which spio runs
    where a layer's partial sums would pass their limit (the check's layers are too small for
    that, so no run had checked it): one in four of WGrad's, none held."""
    return pass_ == "wgrad" and index % 4 == 2


def run_kind(index: int, pass_: str) -> str:
    """How run `index` of a pass runs, for its failure line: "" or " (as held)" or " (atomic)"."""
    return " (as held)" if held(index) else " (atomic)" if atomic(index, pass_) else ""


def held_layout(params: Conv2dGw8Params, pass_: str) -> tuple[bool, bool]:
    """(weights_cl, bias_elem) of the operands as held: channels_last weights, and for FProp
    a bias in the activations' dtype (DGrad reads none)."""
    return True, pass_ == "fprop" and params.has_bias


def kernel_as_run(
    params: Conv2dGw8Params,
    pass_: str,
    config,
    device: str,
    as_held: bool = False,
    use_atomics: bool = False,
):
    """The kernel spio runs for this pass, layer and config on `device`: its family's (for
    WGrad, per-warp partial sums and sum_slots while they fit, else atomics; with
    `use_atomics`, atomics), reading the operands as held where `as_held` (FProp and DGrad),
    with its rows moved by tensor copies where SPIO_TMA asks for them and the device has them."""
    import torch

    from .functional._kernels import with_tensor_copies
    from .kernels import conv2d_gw8_factory as fd
    from .kernels import conv2d_gw8_wgrad_factory as wg
    from .kernels.families import FAMILY_OF_PASS

    if use_atomics and pass_ == "wgrad":
        kernel = wg.make_kernel(params, config, partials=False)
    else:
        kernel = FAMILY_OF_PASS[pass_].make_kernel(params, config)
    if as_held and pass_ in HELD_PASSES:
        kernel = fd.variant(kernel, *held_layout(params, pass_))
    return with_tensor_copies(kernel, torch.device(device))


def kernel_of_run(params: Conv2dGw8Params, pass_: str, config, device: str, index: int):
    """The kernel of a pass's run `index` (`held` and `atomic` say which variant): the one
    precompile builds and run_jobs runs."""
    return kernel_as_run(params, pass_, config, device, held(index), atomic(index, pass_))


def configs_to_run(
    params: Conv2dGw8Params, pass_: str, extra: int, seed: int, device: str = "cpu"
) -> list:
    """The config spio picks for the pass plus `extra` others drawn reproducibly. On "cuda" the
    pick is the one spio runs there before any autotuning (its perf model's first, or the
    analytic heuristic's for that GPU); on the CPU, the heuristic's for an H200-class GPU."""
    import torch

    from .kernels import perf_model as pm
    from .kernels.families import FAMILY_OF_PASS

    family = FAMILY_OF_PASS[pass_]
    identity = pm.device_identity(torch.device(device))
    if identity is None:
        default = family.default_config(params)
    else:  # as select_config ranks them (DGrad: the bias-free layer's kernel)
        default = pm.rank_configs(family, family.layer_as_run(params), identity)[0][0]
    others = [c for c in family.configs(params) if c != default]
    return [default] + random.Random(seed).sample(others, min(extra, len(others)))


def check_jobs(
    device: str, layers: Sequence[Conv2dGw8Params], pass_: str, dtype: str, extra_configs: int
) -> list[tuple[Conv2dGw8Params, Any]]:
    """The (layer, config) runs of one pass in one dtype: layers re-typed to dtype, each with
    the config spio picks and extra_configs sampled ones (configs_to_run)."""
    typed = [replace(p, dtype=dtype) for p in layers]
    # The seed depends on the dtype too, so that fp16 and bf16 draw different configs: with one
    # seed a layer, both drew the same, and no emulated WGrad run had mma_k 16.
    salt = 100 * DTYPES.index(dtype)
    jobs = []
    for index, params in enumerate(typed):
        configs = configs_to_run(params, pass_, extra_configs, seed=index + salt, device=device)
        # Every other layer's pick last: with one sampled config a layer, the picks had all
        # been even runs, so none was ever run as held.
        jobs += [(params, config) for config in (configs[::-1] if index % 2 else configs)]
    return jobs


def run_jobs(
    device: str, pass_: str, dtype: str, jobs: Sequence[tuple[Conv2dGw8Params, Any]]
) -> PassResult:
    """Run one pass's (layer, config) runs, as check_jobs draws them, into its PassResult."""
    from .log import progress_bar

    result = PassResult(pass_, dtype)
    for index, (params, config) in enumerate(
        progress_bar(jobs, desc=f"{pass_} {dtype}", leave=False, unit="run")
    ):
        case = f"{params.encode()} {config.encode()}{run_kind(index, pass_)}"
        lost = False
        try:
            kernel = kernel_of_run(params, pass_, config, device, index)
            ratio = run_one(params, pass_, config, device, kernel=kernel, as_held=held(index))
        except Exception as error:  # a launch or build error is a failure, not a crash
            ratio, case = math.inf, f"{case}: {type(error).__name__}: {error}"
            lost = _sticky(error, device)
        failures = result.failures + ((case,) if not ratio <= 1.0 else ())
        result = replace(
            result, runs=result.runs + 1, worst=max(result.worst, ratio), failures=failures
        )
        if lost:
            raise ContextLost(result)
    return result


class ContextLost(RuntimeError):
    """A sticky CUDA error (an illegal address, a failed launch): the GPU context is unusable
    for the rest of the process, so every later run would fail with it. `result`: the pass's
    runs up to it."""

    def __init__(self, result: PassResult):
        super().__init__(result.failures[-1])
        self.result = result


def _driver() -> Any:
    """spio's CUDA driver module, or None in a source tree without the built extension (`python
    -m spio check` in a checkout installed with `pip install .`), where there is no GPU either."""
    try:
        from .cuda import driver
    except ImportError:
        return None
    return driver


def _sticky(error: BaseException, device: str) -> bool:
    """Whether `error` left the GPU context unusable: a sticky CUDA error from spio's driver,
    or any other error (a code not in that list, or PyTorch's own exceptions for the same
    errors: "an illegal memory access was encountered", ...) after which the context no longer
    synchronises."""
    driver = _driver()
    if driver is not None and isinstance(error, driver.CudaError):
        if error.code in driver.STICKY_ERRORS:
            return True
    if not device.startswith("cuda"):
        return False
    import torch

    try:
        torch.cuda.synchronize(device)
    except Exception:  # the context's sticky error, whoever raised it first
        return True
    return False


class SetupError(RuntimeError):
    """No kernel of the check could be built: the toolchain (the host C++ compiler, NVRTC or the
    CUDA headers) is missing or broken, which no kernel's result can say anything about."""


#: A kernel of no spio code that includes the CUDA headers spio's kernels include: where it
#: builds and spio's kernels do not, their code is at fault, not the toolchain.
PROBE_SOURCE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void spio_check_probe(int *out) { *out = 1; }
"""


def toolchain_problem(device: str) -> str | None:
    """Why a kernel of no spio code cannot be built for `device` (the emulator's host compiler,
    or NVRTC for the GPU's arch, with the CUDA headers), or None where it builds."""
    try:
        if device == "cpu":
            from .emulator.build import build_library

            # Built anew: a cached probe said nothing of a compiler broken since it was built.
            build_library(PROBE_SOURCE, name="spio_check_probe", use_cache=False)
        else:
            import torch

            from .compiler import compile_cubin
            from .cuda import driver
            from .kernels.kernel import cuda_ordinal

            ordinal = cuda_ordinal(torch.device(device))
            arch = driver.device_attributes(ordinal)["arch"]
            compile_cubin(PROBE_SOURCE, arch, use_cache=False)
    except Exception as error:  # whatever stops a build: a missing compiler, headers, NVRTC
        return f"{type(error).__name__}: {error}"
    return None


def precompile(
    jobs: Mapping[tuple[str, str], Sequence[tuple[Conv2dGw8Params, Any]]], device: str
) -> None:
    """Build every kernel of the check's runs (check_jobs, by pass and dtype), in parallel,
    into the disk cache: cubins for the GPU, emulator libraries for the CPU. A kernel that
    fails to build fails its run; when none builds and neither does a kernel of no spio code
    (toolchain_problem), SetupError says why (the first kernel's error). Where that probe
    builds, spio's own code is at fault: its runs fail (exit 1, not a setup error's 2)."""
    import torch

    from .kernels.kernel import build_kernels

    kernels: dict[str, Any] = {}
    for (pass_, _), runs in jobs.items():
        for index, (params, config) in enumerate(runs):
            kernel = kernel_of_run(params, pass_, config, device, index)
            kernels.update((k.name, k) for k in launched_by_run(kernel, held(index)))
    failures = build_kernels(kernels.values(), torch.device(device))
    if kernels and len(failures) == len(kernels) and toolchain_problem(device) is not None:
        where = "the GPU" if device == "cuda" else "the CPU emulator"
        first = next(iter(failures.values()))
        raise SetupError(
            f"none of the {len(kernels)} kernels could be built for {where}, so nothing was "
            f"checked: {first}\n`python -m spio info` shows where spio looked for its tools"
        )


def launched_by_run(kernel, as_held: bool = False) -> list:
    """The kernels run_one launches for `kernel` (what to build before it runs): the kernel and,
    for WGrad's partial sums, its sum_slots into fp32 gradients and, `as_held`, into the layer's
    dtype too (run_one compares the two)."""
    from .kernels.conv2d_gw8_wgrad_factory import with_sums

    found = with_sums([kernel])
    if as_held:
        dtype = kernel.info_value("params").dtype
        found += with_sums([kernel], (dtype, dtype))[1:]  # (the kernel itself is listed)
    return found


def run_check(
    device: str,
    layers: Sequence[Conv2dGw8Params],
    extra_configs: int = 1,
    passes: Sequence[str] = PASSES,
    dtypes: Sequence[str] = DTYPES,
    report: Callable[[str], None] = print,
) -> list[PassResult]:
    """Check every (pass, dtype); report one line each as it finishes."""
    jobs = {
        (pass_, dtype): check_jobs(device, layers, pass_, dtype, extra_configs)
        for dtype in dtypes
        for pass_ in passes
    }
    precompile(jobs, device)
    results: list[PassResult] = []
    for dtype in dtypes:
        for pass_ in passes:
            try:
                result = run_jobs(device, pass_, dtype, jobs[pass_, dtype])
            except ContextLost as lost:
                report(lost.result.line())
                report(
                    "the GPU is unusable in this process after that error (a sticky CUDA "
                    "error): the remaining runs were not made. CUDA_LAUNCH_BLOCKING=1 names "
                    "the kernel that caused it"
                )
                return [*results, lost.result]
            report(result.line())
            results.append(result)
    return results


def resolve_device(requested: str | None) -> str:
    """ "cuda" or "cpu": the requested device, else a GPU when torch sees one that spio's
    kernels run on (else the emulator, saying why). RuntimeError when "cuda" is requested and
    there is no such GPU."""
    import torch

    from .functional.checks import device_problem

    if requested == "cpu":
        return requested
    if not torch.cuda.is_available():
        why = _gpu_torch_cannot_use()
        if requested == "cuda":
            raise RuntimeError(
                "spio check --device cuda needs a CUDA GPU; none is available"
                + (f" ({why})" if why else "")
            )
        if why:
            print(f"{why}: checking in the CPU emulator")
        return "cpu"
    problem = device_problem(torch.device("cuda"))  # the current device
    if problem is None:
        return "cuda"
    if requested == "cuda":
        raise RuntimeError(f"spio check --device cuda: spio's kernels do not run on {problem}")
    print(f"spio's kernels do not run on {problem}: checking in the CPU emulator")
    return "cpu"


def _gpu_torch_cannot_use() -> str | None:
    """Where spio's driver sees a GPU that torch, a CPU build, cannot use: saying so (the
    check had gone to the emulator in silence); else None."""
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None):
        return None  # (a ROCm build has no CUDA either, but is no CPU build)
    driver = _driver()
    if driver is None:
        return None
    try:
        count = driver.device_count()
    except Exception:  # no driver: no GPU to speak of
        return None
    if count < 1:
        return None
    return (
        f"torch {torch.__version__} is a CPU build, so no GPU is available to it (spio's "
        f"driver sees {count}); install a CUDA build of torch to check the real kernels"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check command's options."""
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        help="cuda: the real kernels; cpu: the CPU emulator (default: cuda when a GPU spio's "
        "kernels run on is present, else cpu)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer layers and only the config spio picks for each pass",
    )


def _tensor_copies_note() -> str:
    """What SPIO_TMA has the check run, where it is set: the kernels spio runs under it."""
    from .kernels.conv2d_gw8_factory import tensor_copies

    loads, stores = tensor_copies()
    if not loads:
        return ""
    moved = "input and output rows" if stores else "input rows"
    return f"; SPIO_TMA: {moved} by tensor copies (sm_90 and newer GPUs, and the emulator)"


def cmd_check(args: argparse.Namespace) -> int:
    """Run the self-test; exit status 0 when every pass and dtype passed, 1 otherwise, 2 when
    it cannot run (no GPU for --device cuda, no kernel could be built)."""
    try:
        device = resolve_device(args.device)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 2
    layers: tuple[Conv2dGw8Params, ...]
    if device == "cuda":
        layers = GPU_LAYERS[:4] + GPU_LAYERS[-3:] if args.quick else GPU_LAYERS
        extra = 0 if args.quick else 2
    else:
        # Quick: a plain run, the biased layer as held (FProp's half bias, WGrad's half
        # gradients) and an atomic WGrad run.
        layers = QUICK_EMULATOR_LAYERS if args.quick else EMULATOR_LAYERS
        extra = 0 if args.quick else 1
    where = "GPU (real kernels)" if device == "cuda" else "CPU emulator"
    print(
        f"spio check on the {where}: {len(layers)} layers, the config spio picks and {extra} "
        f"sampled per layer, pass and dtype{_tensor_copies_note()}"
    )
    started = time.perf_counter()
    try:
        results = run_check(device, layers, extra_configs=extra)
    except SetupError as error:
        print(f"spio check: setup error: {error}", file=sys.stderr)
        return 2
    failed = [r for r in results if not r.passed]
    seconds = time.perf_counter() - started
    if failed:
        print(f"FAILED: {len(failed)} of {len(results)} pass/dtype checks ({seconds:.0f} s)")
        return 1
    print(f"all {len(results)} pass/dtype checks passed ({seconds:.0f} s)")
    return 0
