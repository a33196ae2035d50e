"""In-situ benchmark: a table layer inside ConvFirst-style and MBConv-style block stacks.

Isolated timings can flatter a kernel (warm caches, no neighbours). Here the gw8 layer runs in a
training step of a small residual stack, with spio's kernels (through the path the custom ops
use) or PyTorch's (F.conv2d and convolution_backward, cuDNN), and torch.profiler attributes GPU
kernel time to each pass through record_function ranges named `bench::<impl>::<pass>`.

- ConvFirst-style block: gw8 conv (C) -> BatchNorm -> 1x1 C->4C -> ReLU -> 1x1 4C->C, + input.
- MBConv-style block: 1x1 C/4->C -> BN -> ReLU -> gw8 conv (C) -> BN -> ReLU -> 1x1 C->C/4 -> BN,
  + input. The gw8 conv of both styles is exactly the table layer (C, H, W, R, S, padding).

The profiler does not always link the kernels launched inside a range in a backward function to
that range (pytorch/pytorch#144778, pytorch/kineto#1132). So each pass is also bracketed by CUDA
events on its stream while profiling. Where the profiler attributes no kernel to a pass, the
table uses the event time, marked "(e)". It includes any gap in which the GPU waited for the
host, so for small layers it is an upper bound on the kernel time.

Importing this module imports torch.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..functional.checks import weight_grad_channels_last
from ..kernels.conv2d_gw8_params import GROUP_WIDTH, torch_dtype
from ..kernels.stats import PASSES
from .layers import BenchLayer
from .results import RunInfo, write_rows

STYLES = ("convfirst", "mbconv")
IMPLS = ("spio", "torch")


def _range(impl: str, pass_: str) -> str:
    return f"bench::{impl}::{pass_}"


class _PassEvents:
    """CUDA event pairs bracketing each pass, by (impl, pass), while a profile is taken."""

    def __init__(self):
        self.pairs: dict[tuple[str, str], list] = defaultdict(list)

    def us_per_call(self, key: tuple[str, str]) -> float:
        """Mean GPU time between the events of each call (call after torch.cuda.synchronize)."""
        pairs = self.pairs.get(key, [])
        if not pairs:
            return math.nan
        return sum(start.elapsed_time(end) for start, end in pairs) * 1e3 / len(pairs)


_events: _PassEvents | None = None  # set by profile_passes while it profiles


@contextmanager
def _pass(impl: str, pass_: str):
    """A profiler range for one pass and, while profiling, CUDA events around it."""
    with torch.profiler.record_function(_range(impl, pass_)):
        events = _events
        if events is None:
            yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        events.pairs[(impl, pass_)].append((start, end))


class _SpioConv(torch.autograd.Function):
    """gw8 conv through spio's production kernel path (spio.functional._kernels: the config the
    custom ops pick for this device); each pass inside its own profiler range."""

    @staticmethod
    def forward(ctx, x, weight, padding):
        from ..functional import _kernels

        layer = _kernels.layer(x, weight, None, *padding)
        with _pass("spio", "fprop"):
            y = layer.fprop(x, weight, None)
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        with _pass("spio", "dgrad"):
            dx = ctx.layer.dgrad(dy, weight)
        with _pass("spio", "wgrad"):  # dw in the weight's dtype, rounded in the pass as the op does
            dw, _ = ctx.layer.wgrad(
                x, dy, with_bias=False, dtypes=(weight.dtype, weight.dtype),
                channels_last=weight_grad_channels_last(weight),
            )  # fmt: skip
            dw = dw.to(weight.dtype)  # a no-op, except where PyTorch's fallback gave fp32
        return dx, dw, None


class _TorchConv(torch.autograd.Function):
    """gw8 conv through F.conv2d and convolution_backward (dx and dw requested separately)."""

    @staticmethod
    def forward(ctx, x, weight, padding):
        with _pass("torch", "fprop"):
            y = F.conv2d(x, weight, None, 1, padding, 1, x.shape[1] // GROUP_WIDTH)
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        args = ([1, 1], list(ctx.padding), [1, 1], False, [0, 0], x.shape[1] // GROUP_WIDTH)
        aten = torch.ops.aten.convolution_backward
        with _pass("torch", "dgrad"):
            dx = aten(dy, x, weight, None, *args, [True, False, False])[0]
        with _pass("torch", "wgrad"):
            dw = aten(dy, x, weight, None, *args, [False, True, False])[1]
        return dx, dw, None


class GwConv(nn.Module):
    """A group-width-8, stride-1, bias-free conv running spio's kernels or PyTorch's."""

    def __init__(self, layer: BenchLayer, impl: str):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"GwConv impl must be one of {', '.join(IMPLS)}, got {impl!r}")
        self.impl = impl
        self.padding = tuple(layer.padding)
        weight = (
            torch.randn(layer.c, GROUP_WIDTH, layer.r, layer.s)
            / (GROUP_WIDTH * layer.r * layer.s) ** 0.5
        )
        self.weight = nn.Parameter(weight)

    def forward(self, x):
        fn = _SpioConv if self.impl == "spio" else _TorchConv
        return fn.apply(x, self.weight, self.padding)


class ConvFirstBlock(nn.Module):
    """gw8 conv -> BN -> 1x1 expand (4x) -> ReLU -> 1x1 project, with a residual connection."""

    def __init__(self, layer: BenchLayer, impl: str):
        super().__init__()
        c = layer.c
        self.conv = GwConv(layer, impl)
        self.norm = nn.BatchNorm2d(c)
        self.expand = nn.Conv2d(c, 4 * c, 1, bias=False)
        self.project = nn.Conv2d(4 * c, c, 1, bias=False)

    def forward(self, x):
        return x + self.project(F.relu(self.expand(self.norm(self.conv(x)))))


class MBConvBlock(nn.Module):
    """1x1 expand (C/4 -> C) -> BN/ReLU -> gw8 conv -> BN/ReLU -> 1x1 project -> BN, residual."""

    def __init__(self, layer: BenchLayer, impl: str):
        super().__init__()
        c = layer.c
        if c % 4:
            raise ValueError(f"MBConvBlock needs channels divisible by 4, got {c}")
        self.expand = nn.Conv2d(c // 4, c, 1, bias=False)
        self.norm1 = nn.BatchNorm2d(c)
        self.conv = GwConv(layer, impl)
        self.norm2 = nn.BatchNorm2d(c)
        self.project = nn.Conv2d(c, c // 4, 1, bias=False)
        self.norm3 = nn.BatchNorm2d(c // 4)

    def forward(self, x):
        y = F.relu(self.norm1(self.expand(x)))
        y = F.relu(self.norm2(self.conv(y)))
        return x + self.norm3(self.project(y))


def make_stack(style: str, layer: BenchLayer, impl: str, depth: int = 4) -> nn.Sequential:
    """`depth` blocks of `style` ("convfirst" or "mbconv") around the layer."""
    block = {"convfirst": ConvFirstBlock, "mbconv": MBConvBlock}.get(style)
    if block is None:
        raise ValueError(f"stack style must be one of {', '.join(STYLES)}, got {style!r}")
    return nn.Sequential(*(block(layer, impl) for _ in range(depth)))


def stack_input_channels(style: str, layer: BenchLayer) -> int:
    """Channels the stack takes as input."""
    return layer.c if style == "convfirst" else layer.c // 4


def training_step(stack: nn.Module, x: torch.Tensor) -> None:
    """Forward, a scalar loss, backward; gradients are dropped afterwards."""
    stack(x).float().square().mean().backward()
    for p in stack.parameters():
        p.grad = None


@dataclass(frozen=True)
class InSituRow:
    """GPU time of one pass of the gw8 layer inside a stack, from torch.profiler."""

    layer: str
    style: str
    n: int
    dtype: str
    impl: str
    pass_: str
    calls: int
    us_per_call: float  # summed GPU kernel time under the pass's range, per call (profiler)
    kernels: str  # "name:us;..." per call, the kernels behind that time
    event_us_per_call: float  # GPU time between CUDA events around the pass, per call
    step_ms: float  # median training-step time of the whole stack (CUDA events)
    gpu: str
    driver: str
    torch: str
    spio: str
    date: str
    command: str


def _kernels_under(event) -> list[tuple[str, float]]:
    """(name, µs) of every GPU kernel attributed to event or its CPU descendants."""
    found = [(k.name, float(k.duration)) for k in getattr(event, "kernels", [])]
    for child in getattr(event, "cpu_children", []):
        found += _kernels_under(child)
    return found


def profile_passes(stack: nn.Module, x: torch.Tensor, steps: int) -> dict[tuple[str, str], dict]:
    """Per (impl, pass): calls and GPU kernel time by kernel name over `steps` profiled steps.

    ("spio", "all") holds every spio kernel seen, attributed to a range or not: the fallback when
    the profiler does not link the driver-API launches to their ranges.
    """
    from torch.profiler import ProfilerActivity, profile

    global _events
    _events = events = _PassEvents()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                training_step(stack, x)
            torch.cuda.synchronize()
    finally:
        _events = None
    found, spio_kernels = tally_events(prof.events())
    for key, entry in found.items():
        entry["event_us"] = events.us_per_call(key)
    found[("spio", "all")] = {"calls": steps, "kernels": spio_kernels}
    return found


def tally_events(events) -> tuple[dict[tuple[str, str], dict], dict[str, float]]:
    """From profiler events: calls and kernel µs by name per (impl, pass), and µs per spio kernel
    name, attributed to a range or not.

    A `bench::impl::pass` range counts once, as its CPU event: recent PyTorch also reports each
    record_function range as a GPU-side user annotation of the same name, which would count it
    twice.
    """
    from torch.autograd import DeviceType

    found: dict[tuple[str, str], dict] = {}
    spio_kernels: dict[str, float] = defaultdict(float)
    for event in events:
        on_cpu = event.device_type == DeviceType.CPU
        if event.name.startswith("spio_") and not on_cpu:  # every spio entry point
            spio_kernels[event.name] += float(event.device_time_total)
        if not event.name.startswith("bench::") or not on_cpu:
            continue
        _, impl, pass_ = event.name.split("::")
        entry = found.setdefault((impl, pass_), {"calls": 0, "kernels": defaultdict(float)})
        entry["calls"] += 1
        for name, us in _kernels_under(event):
            entry["kernels"][name] += us
    return found, spio_kernels


def step_time_ms(stack: nn.Module, x: torch.Tensor, steps: int) -> float:
    """Median wall time of a training step on the GPU (CUDA events)."""
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        training_step(stack, x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_insitu(
    layers: list[BenchLayer],
    n: int,
    dtype: str,
    info: RunInfo,
    passes: tuple[str, ...] = PASSES,
    depth: int = 4,
    warmup: int = 5,
    steps: int = 20,
    csv_path: Path | None = None,
) -> list[InSituRow]:
    """Profile every layer in both stack styles with both implementations; needs a CUDA GPU.
    A stack that fails (e.g. out of memory) is reported and left out, and the others go on
    (not where the CUDA context broke). With `csv_path`, the rows so far are written there
    after each stack, so that a run stopped early keeps what it measured."""
    from .run import cudnn_at_its_best, precompile, sweep

    precompile(  # WGrad's sums into the weight's dtype, as _SpioConv's wgrad asks
        [(layer.params(n, dtype), pass_) for layer in layers for pass_ in PASSES],
        torch.device("cuda", 0),
    )
    cudnn_at_its_best()  # (the command the rows carry says so: cli's run_info)
    cases = [(layer, style, impl) for layer in layers for style in STYLES for impl in IMPLS]

    def measure(layer: BenchLayer, style: str, impl: str):
        return _profile_stack(layer, style, impl, n, dtype, info, passes, depth, warmup, steps)

    # (write_insitu_csv looked up at each write: a test may stand in for it)
    def write(rows: list, path: Path) -> Path:
        return write_insitu_csv(rows, path)

    return sweep(cases, measure, write, csv_path, desc="in-situ", unit="stack")


def _profile_stack(
    layer: BenchLayer,
    style: str,
    impl: str,
    n: int,
    dtype: str,
    info: RunInfo,
    passes: tuple[str, ...],
    depth: int,
    warmup: int,
    steps: int,
) -> tuple[list[InSituRow], bool]:
    """The rows of one stack (none where it fails, reported), and whether the run may go on
    (not where the CUDA context broke). A function of its own so that the stack's tensors are
    freed when it returns, before the next stack allocates its own."""
    from .run import usable_after

    failure = None
    try:
        torch.manual_seed(0)
        stack = make_stack(style, layer, impl, depth)
        tensor_dtype = torch_dtype(dtype)
        # nn.Module.to takes memory_format (torch documents it), but torch's overloads omit it.
        stack = stack.to(device="cuda", dtype=tensor_dtype, memory_format=torch.channels_last)  # type: ignore[call-overload]
        shape = (n, stack_input_channels(style, layer), layer.h, layer.w)
        x = torch.randn(shape, device="cuda", dtype=tensor_dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        for _ in range(warmup):
            training_step(stack, x)
        step_ms = step_time_ms(stack, x, steps)
        measured = profile_passes(stack, x, steps)
    except Exception as error:  # without its traceback, whose frames hold what was allocated
        failure = error.with_traceback(None)
    if failure is not None:
        torch.cuda.empty_cache()  # what the stack allocated before it failed, now freed
        return [], usable_after(failure, f"in-situ {style} stack of {layer.name} ({impl})")
    rows = []
    for pass_ in passes:
        entry = measured.get((impl, pass_), {"calls": 0, "kernels": {}, "event_us": math.nan})
        calls = max(entry["calls"], 1)
        per_kernel = {k: us / calls for k, us in entry["kernels"].items()}
        us_per_call = sum(per_kernel.values())
        kernels = ";".join(f"{k}:{us:.1f}" for k, us in sorted(per_kernel.items()))
        if entry["calls"] and not per_kernel:  # launches not linked to the range
            seen = measured.get(("spio", "all"), {"kernels": {}})["kernels"]
            us_per_call = float("nan")
            kernels = "not attributed; per step: " + ";".join(
                f"{k}:{us / steps:.1f}" for k, us in sorted(seen.items())
            )
        rows.append(
            InSituRow(
                layer=layer.name,
                style=style,
                n=n,
                dtype=dtype,
                impl=impl,
                pass_=pass_,
                calls=entry["calls"],
                us_per_call=us_per_call,
                kernels=kernels,
                event_us_per_call=entry["event_us"],
                step_ms=step_ms,
                gpu=info.gpu,
                driver=info.driver,
                torch=info.torch,
                spio=info.spio,
                date=info.date,
                command=info.command,
            )  # fmt: skip
        )
    return rows, True


def write_insitu_csv(rows: list[InSituRow], path: Path) -> Path:
    """Write in-situ rows to path."""
    return write_rows(rows, path, InSituRow)


def _measured(row: InSituRow | None) -> tuple[float, str] | None:
    """(µs per call, "" from the profiler or "(e)" from the CUDA events), or None."""
    if row is None or not row.calls:
        return None
    if row.us_per_call > 0:  # NaN compares false
        return row.us_per_call, ""
    if row.event_us_per_call > 0:
        return row.event_us_per_call, "(e)"
    return None


def _cell(measured: tuple[float, str] | None) -> str:
    return "-" if measured is None else f"{measured[1]}{measured[0]:.1f}"


def format_insitu_table(rows: list[InSituRow]) -> str:
    """µs per pass of spio and PyTorch in each stack, the speedup, and each stack's step time."""
    by_key: dict[tuple, dict[str, InSituRow]] = {}
    for row in rows:
        by_key.setdefault((row.layer, row.style, row.n, row.pass_), {})[row.impl] = row
    header = (
        f"{'layer':<16} {'stack':<9} {'N':>4} {'pass':<5} {'spio us':>9} {'torch us':>9} "
        f"{'speedup':>7} {'spio step ms':>12} {'torch step ms':>13}"
    )
    lines = [header, "-" * len(header)]
    mixed_any = False
    for (layer, style, n, pass_), impls in by_key.items():
        spio, torch_row = impls.get("spio"), impls.get("torch")
        spio_us, torch_us = _measured(spio), _measured(torch_row)
        speedup = "-"
        if spio_us and torch_us:
            mixed = spio_us[1] != torch_us[1]  # one profiler time, one event time
            mixed_any |= mixed
            speedup = f"{torch_us[0] / spio_us[0]:.2f}x" + ("*" if mixed else "")
        lines.append(
            f"{layer:<16} {style:<9} {n:>4} {pass_:<5} "
            f"{_cell(spio_us):>9} {_cell(torch_us):>9} "
            f"{speedup:>7} "
            f"{'-' if spio is None else f'{spio.step_ms:.3f}':>12} "
            f"{'-' if torch_row is None else f'{torch_row.step_ms:.3f}':>13}"
        )
    if any("(e)" in line for line in lines[2:]):
        lines.append("(e): CUDA-event time around the pass (no kernel attributed by the profiler)")
    if mixed_any:
        lines.append(
            "*: a profiler time against an event time, which also counts host gaps: not like "
            "for like"
        )
    return "\n".join(lines)
