"""The isolated-layer benchmark: FProp, DGrad and WGrad of spio and of PyTorch (cuDNN), and a
device copy of the same bytes, for every layer of the table at several batch sizes, in one run.

spio runs through the factory functions (`fprop`, `dgrad`, `wgrad`) with the kernel the custom
ops would use on this GPU (`spio_kernel`: the performance model's pick, or the heuristic's);
PyTorch runs `F.conv2d` and, for the gradients, `aten.convolution_backward` (what autograd
calls) with only dx or only dw requested, so each pass is timed alone. Tensors are channels_last,
in the same dtype, filled with random values (never zeros), and rotated through enough copies to
defeat the L2 cache. cudnn.benchmark is on with no limit on the algorithms it tries, so cuDNN
picks its fastest algorithm during warm-up.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kernels.conv2d_gw8_params import Conv2dGw8Params, torch_dtype
from ..kernels.stats import PASSES, Conv2dStats
from ..log import logger
from .layers import BenchLayer
from .results import NOT_PREFILLED, BenchRow, RunInfo, write_csv
from .timing import Rotation, Timing, l2_cache_bytes, rotation_sets, time_calls

TIMING_METHOD = "cuda-events, stream pre-filled behind a spin kernel; median per call"


@dataclass(frozen=True)
class BenchSettings:
    """What to run and how many times."""

    layers: tuple[BenchLayer, ...]
    batch_sizes: tuple[int, ...]
    passes: tuple[str, ...] = PASSES
    dtype: str = "fp16"
    warmup: int = 5
    reps: int = 100

    def __post_init__(self) -> None:
        bad = [p for p in self.passes if p not in PASSES]
        if bad or not self.passes:
            raise ValueError(f"bench passes must be among {', '.join(PASSES)}, got {self.passes}")
        if self.dtype not in ("fp16", "bf16"):
            raise ValueError(f"bench dtype must be fp16 or bf16, got {self.dtype!r}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"bench batch sizes must be positive, got {self.batch_sizes}")


def driver_version() -> str:
    """The NVIDIA driver release from nvidia-smi, else the driver's CUDA API version."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                encoding="utf-8",
                errors="replace",
                timeout=20,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import ctypes

        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"CUDA driver API {version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        return "unknown"


#: What a bench's rows add to their command: its cuDNN baseline as cudnn_at_its_best sets it.
CUDNN_AT_ITS_BEST = " (cudnn.benchmark=True, benchmark_limit=0)"


def cudnn_at_its_best() -> str:
    """Sets cuDNN to pick its fastest algorithm for each shape (benchmark mode, every algorithm
    tried: the default limit of its v8 API is the first 10), for the baselines of `spio bench`
    and its --in-situ; returns what to add to the rows' command, which says so."""
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.benchmark_limit = 0
    return CUDNN_AT_ITS_BEST


def run_info(command: str, device_index: int = 0) -> RunInfo:
    """The GPU, driver, versions, date and command of this run."""
    import torch

    from .. import __version__

    return RunInfo(
        gpu=torch.cuda.get_device_name(device_index),
        driver=driver_version(),
        torch=torch.__version__,
        cuda=str(torch.version.cuda),
        spio=__version__,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command=command,
        timing=TIMING_METHOD,
    )


def spio_kernel(params: Conv2dGw8Params, pass_: str, device=None):
    """The Kernel spio launches for this pass on `device` (a torch.device) in a channels_last
    model, chosen as the custom ops choose it: the performance model of the device's arch where
    one covers the layer, else the analytic heuristic (also for device None or a CPU). FProp
    and DGrad read the weights channels_last, as model.to(memory_format=torch.channels_last)
    leaves them (the `__wcl` variant), and a bias, if any, in fp32."""
    from ..functional import _kernels
    from ..kernels.conv2d_gw8_factory import variant

    if pass_ == "fprop":
        return variant(_kernels.fprop_kernel(params, device), True, False)
    if pass_ == "dgrad":
        return variant(_kernels.dgrad_kernel(params, device), True, False)
    return _kernels.wgrad_kernel(params, device, with_bias=params.has_bias)


def selected_by(kernel, pass_: str, device) -> str:
    """How the tile config of `kernel` (spio_kernel's, for `pass_` on `device`) was chosen, as
    select_config recorded it: "model <arch>/<file>", "heuristic" or "autotune" (the first two
    with " (autotune failed)" where autotuning could time no candidate). Recorded with each
    bench row."""
    from ..kernels import perf_model as pm
    from ..kernels.families import FAMILY_OF_PASS

    return pm.selection_source(FAMILY_OF_PASS[pass_], kernel.info_value("params"), device)


def precompile(cases: Sequence[tuple[Conv2dGw8Params, str]], device) -> dict[str, str]:
    """Compile every spio kernel of `cases` (as chosen for `device`, a CUDA torch.device) in
    parallel into the disk cache, so timing loops only load cubins: with a partials WGrad
    kernel the sum_slots kernel into gradients of the layer's dtype (as the op sums a half
    weight's, and as the timed calls ask). Returns the kernels that failed: name -> error."""
    from ..kernels.conv2d_gw8_wgrad_factory import with_sums
    from ..kernels.kernel import build_kernels

    kernels = {}
    for params, pass_ in cases:
        kernel = spio_kernel(params, pass_, device)
        for built in with_sums([kernel], (params.dtype, params.dtype)):
            kernels[built.name] = built
    return build_kernels(list(kernels.values()), device)


class PassCase:
    """Rotation sets of random tensors for one pass of one layer, and the three timed calls.

    spio and PyTorch get the same tensors: activations and weights channels_last. Each writes
    a separate output per rotation set (PyTorch's are kept in the set until its next call), so
    that neither rewrites an output still in L2 that the other would have to write to DRAM.
    A biased layer's FProp adds a bias (fp32 for spio, as the ops pass it; the input's dtype for
    F.conv2d) and its WGrad computes the bias gradient too, in both."""

    def __init__(self, params: Conv2dGw8Params, pass_: str, l2_bytes: int, device="cuda"):
        import torch

        self.params = params
        self.pass_ = pass_
        self.stats = Conv2dStats(params)
        self.bytes = self.stats.bytes(pass_)
        self.sets = rotation_sets(self.bytes, l2_bytes)
        self.kernel = spio_kernel(params, pass_, torch.device(device))
        self.config = self.kernel.info_value("config")
        self.selected_by = selected_by(self.kernel, pass_, torch.device(device))
        dtype = torch_dtype(params.dtype)
        cl = torch.channels_last

        def randn(shape, scale=1.0):
            return (torch.randn(shape, device=device) * scale).to(dtype)

        sets = []
        for _ in range(self.sets):
            item = {"w": randn(params.weight_shape, 1 / 3)}
            item["w_cl"] = item["w"].contiguous(memory_format=cl)
            if pass_ in ("fprop", "wgrad"):
                item["x"] = randn(params.input_shape).contiguous(memory_format=cl)
            if pass_ in ("dgrad", "wgrad"):
                item["dy"] = randn(params.output_shape).contiguous(memory_format=cl)
            if pass_ == "dgrad":  # convolution_backward reads only x's shape and layout
                item["x"] = torch.empty(
                    params.input_shape, dtype=dtype, device=device, memory_format=cl
                )
            if pass_ == "fprop" and params.has_bias:  # fp32 for spio, as the op passes it
                item["bias"] = torch.randn(params.c, device=device)
                item["bias_torch"] = item["bias"].to(dtype)  # F.conv2d takes the input's dtype
            if pass_ == "fprop":
                item["out"] = torch.empty(
                    params.output_shape, dtype=dtype, device=device, memory_format=cl
                )
            if pass_ == "dgrad":
                item["out"] = torch.empty(
                    params.input_shape, dtype=dtype, device=device, memory_format=cl
                )
            sets.append(item)
        # One round for spio's and PyTorch's calls: each takes up where the other stopped.
        self.data = Rotation(sets)
        self.copy_data = copy_pairs(self.bytes, dtype, device, l2_bytes)
        self.copy_bytes = 2 * self.copy_data[0][0].nbytes

    def spio_call(self) -> Callable[[int], object]:
        """spio's kernel for this pass on the next rotation set."""
        from ..kernels import conv2d_gw8_factory as fd
        from ..kernels import conv2d_gw8_wgrad_factory as wg

        params, kernel, data, pass_ = self.params, self.kernel, self.data, self.pass_

        def call(i: int):
            item = data.take()
            if pass_ == "fprop":
                return fd.fprop(
                    item["x"],
                    item["w_cl"],
                    item.get("bias"),
                    params,
                    kernel=kernel,
                    out=item["out"],
                )
            if pass_ == "dgrad":
                return fd.dgrad(item["dy"], item["w_cl"], params, kernel=kernel, out=item["out"])
            # dw (and dbias) in the weight's dtype and layout, as the op gives a half,
            # channels_last weight's (and as PyTorch's convolution_backward writes them).
            return wg.wgrad(
                item["x"],
                item["dy"],
                params,
                kernel=kernel,
                dtypes=(item["w"].dtype, item["w"].dtype),
                channels_last=True,
            )

        return call

    def torch_call(self) -> Callable[[int], object]:
        """F.conv2d, or the dx-only / dw-only convolution_backward autograd would call."""
        import torch
        import torch.nn.functional as F

        p, data, pass_ = self.params, self.data, self.pass_
        padding = list(p.padding)
        mask = [pass_ == "dgrad", pass_ == "wgrad", pass_ == "wgrad" and p.has_bias]

        def call(i: int):
            item = data.take()
            item["torch_out"] = None  # freed first: its block may serve this call's output
            if pass_ == "fprop":
                bias = item.get("bias_torch")
                out = F.conv2d(item["x"], item["w_cl"], bias, 1, padding, 1, p.groups)
            else:
                out = torch.ops.aten.convolution_backward(
                    item["dy"], item["x"], item["w_cl"], None, [1, 1], padding, [1, 1], False,
                    [0, 0], p.groups, mask,
                )  # fmt: skip
            item["torch_out"] = out  # kept until this set's next call, as spio's item["out"]
            return out

        return call

    def copy_call(self) -> Callable[[int], object]:
        """A device-to-device copy moving (about) the same number of bytes as the pass."""
        return copy_call(self.copy_data)


def copy_pairs(nbytes: int, dtype: Any, device: Any, l2_bytes: int) -> Rotation[tuple[Any, Any]]:
    """(source, destination) pairs of a copy moving about `nbytes` (half read, half written),
    as many as rotation_sets says, so that no copy finds its data in L2."""
    import torch

    size = torch.empty((), dtype=dtype).element_size()
    elements = nbytes // (2 * size)
    sets = rotation_sets(2 * elements * size, l2_bytes)
    return Rotation(
        (
            torch.randn(elements, device=device).to(dtype),
            torch.empty(elements, dtype=dtype, device=device),
        )
        for _ in range(sets)
    )


def copy_call(pairs: Rotation[tuple[Any, Any]]) -> Callable[[int], object]:
    """Each call copies the next pair of the round."""

    def call(i: int):
        src, dst = pairs.take()
        return dst.copy_(src)

    return call


def _row(
    layer: BenchLayer, params: Conv2dGw8Params, pass_: str, impl: str, timing: Timing,
    nbytes: int, flops: int, sets: int, config: str, info: RunInfo, selected_by: str = "",
    kernel: str = "",
) -> BenchRow:  # fmt: skip
    return BenchRow(
        layer=layer.name, n=params.n, c=params.c, h=params.h, w=params.w, r=params.r,
        s=params.s, pad_h=params.padding_h, pad_w=params.padding_w, dtype=params.dtype,
        pass_=pass_, impl=impl, bytes=nbytes, flops=flops, median_ms=timing.median_ms,
        p10_ms=timing.p10_ms, p90_ms=timing.p90_ms, reps=timing.reps, rotation_sets=sets,
        config=config, gpu=info.gpu, driver=info.driver, torch=info.torch, cuda=info.cuda,
        spio=info.spio, date=info.date, command=info.command,
        timing=info.timing if timing.prefilled else info.timing + NOT_PREFILLED,
        selected_by=selected_by, kernel=kernel,
    )  # fmt: skip


def usable_after(error: Exception, case: str) -> bool:
    """Reports a failed case; whether the sweep may go on (not where the CUDA context broke)."""
    import torch

    logger.error("%s failed: %s", case, error)
    try:
        torch.cuda.synchronize()
    except RuntimeError as sticky:
        logger.error("CUDA context unusable, stopping the sweep: %s", sticky)
        return False
    return True


def run_bench(
    settings: BenchSettings, command: str, csv_path: Path | None = None
) -> list[BenchRow]:
    """Time every (layer, batch size, pass) of settings; needs a CUDA GPU. With `csv_path`,
    the rows so far are written there after each case, so that a sweep stopped by a time limit
    keeps what it measured."""
    import torch

    cases = [
        (layer, layer.params(n, settings.dtype), pass_)
        for layer in settings.layers
        for n in settings.batch_sizes
        for pass_ in settings.passes
    ]
    failed = precompile([(params, pass_) for _, params, pass_ in cases], torch.device("cuda", 0))
    for name, error in failed.items():
        logger.error("compile failed: %s: %s", name, error)
    info = run_info(command + cudnn_at_its_best())
    l2 = l2_cache_bytes()

    def measure(layer: BenchLayer, params: Conv2dGw8Params, pass_: str):
        return _bench_case(layer, params, pass_, settings, info, l2)

    return sweep(cases, measure, write_csv, csv_path, desc="benchmark", unit="case")


def sweep(
    cases: Sequence[tuple],
    measure: Callable[..., tuple[list, bool]],
    write: Callable[[list, Path], Path],
    csv_path: Path | None,
    desc: str,
    unit: str,
) -> list:
    """The rows of every case, measure(*case) -> (its rows, whether the sweep may go on), under
    a progress bar; with `csv_path`, the rows so far written there after each case
    (write_rows_so_far). Stops at a case after which the CUDA context is unusable."""
    from ..log import progress_bar

    rows: list = []
    writable = True
    for case in progress_bar(cases, desc=desc, unit=unit):
        case_rows, go_on = measure(*case)
        rows += case_rows
        if csv_path is not None and rows and writable:
            writable = write_rows_so_far(write, rows, csv_path)
        if not go_on:
            break
    return rows


def write_rows_so_far(write: Callable[[list, Path], Path], rows: list, path: Path) -> bool:
    """write(rows, path) during a sweep; whether it wrote. A failure (a disk filled since the
    sweep began) is logged and the sweep goes on: its caller writes the rows once more at the
    end, and says there whether they reached the file."""
    try:
        write(rows, path)
    except OSError as error:
        logger.error("cannot write %s (%s); timing goes on, the rows are written at the end", path,
                     error)  # fmt: skip
        return False
    return True


def _bench_case(
    layer: BenchLayer,
    params: Conv2dGw8Params,
    pass_: str,
    settings: BenchSettings,
    info: RunInfo,
    l2: int,
) -> tuple[list[BenchRow], bool]:
    """The rows of one case (without those that cannot be set up or timed, reported), and
    whether the sweep may go on (not where the CUDA context broke). A function of its own so
    that the case's tensors, and the calls holding them, are freed when it returns: before the
    next, often larger, case allocates its own."""
    import torch

    failure = None
    try:  # tensors for every set (e.g. out of memory at a large batch), calls, configs
        case = PassCase(params, pass_, l2)
        flops = case.stats.flops
        timed = {
            "spio": (case.spio_call(), flops, case.sets, case.config.encode()),
            "torch": (case.torch_call(), flops, case.sets, "cudnn"),
            "copy": (case.copy_call(), 0, len(case.copy_data), ""),
        }
    except Exception as error:  # without its traceback, whose frames hold what was allocated
        failure = error.with_traceback(None)
    if failure is not None:
        torch.cuda.empty_cache()  # what the case allocated before it failed, now freed
        return [], usable_after(failure, f"setting up {pass_} {params.encode()}")
    rows: list[BenchRow] = []
    for impl, (call, impl_flops, sets, config) in timed.items():
        nbytes = case.copy_bytes if impl == "copy" else case.bytes
        try:
            timing = time_calls(call, warmup=settings.warmup, reps=settings.reps)
        except Exception as error:  # report the case, keep the sweep going
            if not usable_after(error, f"{impl} {pass_} {params.encode()}"):
                return rows, False
            continue
        how, kernel = (case.selected_by, case.kernel.name) if impl == "spio" else ("", "")
        rows.append(_row(layer, params, pass_, impl, timing, nbytes, impl_flops, sets, config,
                         info, how, kernel))  # fmt: skip
    return rows, True
