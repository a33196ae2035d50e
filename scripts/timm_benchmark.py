#!/usr/bin/env python
"""Samples/s of a stock timm model with PyTorch's convolutions and, with --spio, spio's.

Both variants are timed in the same run on the same GPU from the same initial weights, so the ratio
is meaningful. Needs a CUDA GPU and timm; without either it exits with status 2 and says why.

    python scripts/timm_benchmark.py --model regnetx_002 --spio --amp-dtype bfloat16 \\
        --channels-last --bench train --batch-size 256 --img-size 224

--cuda-graph also times each variant's step captured in a CUDA graph and replayed, which takes
the host's Python and launch work out of the step: what spio gains on the GPU where an eager step
is bound by its host. --profile then profiles a few more steps of each variant (torch.profiler,
CPU and CUDA) and prints where their GPU time goes: the costliest kernels per step, the kernel
launches, memcpy/memset ops and host synchronisations, and which kernels took more time per step
with spio than without. All variants are timed before any is profiled, so the profiler cannot
slow a timing.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time

from spio.args import positive_int, run_script


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; argparse exits with status 2 on bad arguments."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="timm model name, e.g. regnetx_002")
    parser.add_argument("--spio", action="store_true", help="also time the spio.transform'ed model")
    parser.add_argument(
        "--spio-where-faster",
        action="store_true",
        help="also time the model with spio only in the layers it ran faster here "
        "(spio.transform.where_faster)",
    )
    parser.add_argument(
        "--amp-dtype",
        choices=("float16", "bfloat16"),
        default="bfloat16",
        help="torch.autocast dtype (default bfloat16)",
    )
    parser.add_argument("--channels-last", action="store_true", help="NHWC model and inputs")
    parser.add_argument("--bench", choices=("train", "inference"), default="inference")
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--img-size", type=positive_int, default=224)
    parser.add_argument("--warmup", type=positive_int, default=10, help="untimed steps first")
    parser.add_argument("--iters", type=positive_int, default=30, help="timed steps")
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="also time each variant's step captured once in a CUDA graph and replayed: the "
        "GPU's time per step without the host's Python and launch work",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after timing, profile each variant's steps and print its costliest GPU kernels, "
        "and the kernels that grew with spio",
    )
    parser.add_argument(
        "--profile-steps",
        type=positive_int,
        default=3,
        help="steps each --profile profiles (default 3)",
    )
    return parser.parse_args(argv)


def missing_requirements() -> list[str]:
    """What this machine lacks to run the benchmark (empty when it can run)."""
    missing = []
    try:
        import torch
    except ImportError:
        return ["torch is not installed"]
    if not torch.cuda.is_available():
        missing.append("timm_benchmark needs a CUDA GPU; none is available on this machine")
    try:
        import timm  # noqa: F401
    except ImportError:
        missing.append("timm_benchmark needs timm: pip install timm (or spio[timm])")
    return missing


def _step_fn(model, args, x, cache_casts: bool = True):
    """The benchmark's step on `x`. `cache_casts`: autocast's cache of its weight casts, which a
    step captured in a CUDA graph goes without, as PyTorch's CUDA-graph notes ask."""
    import torch

    dtype = getattr(torch, args.amp_dtype)
    if args.bench == "inference":
        model.eval()

        def step():
            with torch.no_grad(), torch.autocast("cuda", dtype=dtype, cache_enabled=cache_casts):
                model(x)

    else:
        model.train()

        def step():
            with torch.autocast("cuda", dtype=dtype, cache_enabled=cache_casts):
                loss = model(x).float().logsumexp(-1).mean()
            loss.backward()
            for p in model.parameters():
                p.grad = None

    return step


def example_input(args):
    """A random batch of the benchmark's size and memory format, on the GPU."""
    import torch

    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device="cuda")
    return x.contiguous(memory_format=fmt)


def time_model(model, args) -> float:
    """Median samples/s over args.iters steps after args.warmup untimed ones; a model with spio
    layers has its kernels compiled first, in parallel (spio.precompile)."""
    import torch

    import spio
    from spio.layers import Conv2dGw8

    x = example_input(args)
    step = _step_fn(model, args, x)
    if any(isinstance(m, Conv2dGw8) for m in model.modules()):
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=getattr(torch, args.amp_dtype)):
            kernels = spio.precompile(model, x, training=args.bench == "train")
        print(f"spio.precompile: {len(kernels)} kernels in {time.perf_counter() - start:.1f} s")
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    return args.batch_size / median_seconds(step, args.iters)


def median_seconds(call, iters: int) -> float:
    """The median GPU time of `iters` calls of `call`, each between two CUDA events."""
    import torch

    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def time_graphed(model, args) -> float:
    """Median samples/s of args.iters replays of the model's step captured in one CUDA graph:
    what the GPU takes per step once the host's Python and launches are out of the way (a
    small model's eager step can be bound by them). After time_model, whose steps built and
    loaded its kernels; warmed up again on a side stream before the capture, as PyTorch's
    whole-network capture recipe does. Each replay does the eager step's work on an input of
    its size (the gradients go to the graph's own memory, as the eager step drops them)."""
    import torch

    step = _step_fn(model, args, example_input(args), cache_casts=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(args.warmup):
        graph.replay()
    torch.cuda.synchronize()
    return args.batch_size / median_seconds(graph.replay, args.iters)


# CUDA runtime calls that make the host wait for the GPU.
SYNC_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)


@dataclasses.dataclass
class KernelSummary:
    """GPU work per step: rows of (name, µs per step, calls per step), one per kernel or
    memcpy/memset, most time first; their total µs per step, the kernel launches per step (not
    counting memcpy/memset) and the memcpy/memset ops per step."""

    rows: list[tuple[str, float, float]]
    total_us: float
    launches: float
    memops: float


def is_memop(name: str) -> bool:
    """Whether a GPU activity the profiler names so is a memcpy or memset rather than a kernel."""
    return name.lower().startswith(("memcpy", "memset"))


def summarize_kernels(rows, steps: int) -> KernelSummary:
    """Per-step GPU work from (name, device µs, calls) over `steps` profiled steps; rows of the
    same name add up, and rows with no device time are left out."""
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    merged: dict[str, tuple[float, int]] = {}
    for name, us, count in rows:
        if us <= 0:
            continue
        total, calls = merged.get(name, (0.0, 0))
        merged[name] = (total + us, calls + count)
    per_step = sorted(
        ((name, us / steps, calls / steps) for name, (us, calls) in merged.items()),
        key=lambda row: (-row[1], row[0]),
    )
    return KernelSummary(
        rows=per_step,
        total_us=sum(us for _, us, _ in per_step),
        launches=sum(calls for name, _, calls in per_step if not is_memop(name)),
        memops=sum(calls for name, _, calls in per_step if is_memop(name)),
    )


def deltas(before: dict, after: dict) -> list[tuple]:
    """(key, after's value - before's) for every key whose value differs, a key absent from one
    side counting 0 there; largest growth first, largest shrinkage last."""
    changes = [(key, after.get(key, 0.0) - before.get(key, 0.0)) for key in before | after]
    return sorted((d for d in changes if d[1] != 0), key=lambda d: (-d[1], d[0]))


def kernel_deltas(base: KernelSummary, other: KernelSummary) -> list[tuple[str, float]]:
    """(name, other's µs per step - base's) for every kernel whose time differs (deltas)."""
    return deltas({n: us for n, us, _ in base.rows}, {n: us for n, us, _ in other.rows})


def short_name(name: str, width: int = 70) -> str:
    """A kernel's name for a table column: without "void " and the at::native and anonymous
    namespaces, which take room and tell the kernels apart no better, cut to `width` chars."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    name = name.replace("at::native::", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def format_kernel_table(
    title: str, summary: KernelSummary, steps: int, top: int = 15, step_us: float | None = None
) -> list[str]:
    """Lines of a table of the `top` kernels by GPU time per step, then one line of the rest and
    one of the totals; `step_us`, the step's timed length, tells how busy the GPU was."""
    rows = summary.rows[:top]
    lines = [
        f"{title}: GPU time per step ({steps} steps profiled), top {len(rows)} of "
        f"{len(summary.rows)} kernels and memcpy/memset"
    ]
    if not summary.rows:
        return lines + ["  no GPU activity recorded"]
    lines.append(f"  {'calls':>7} {'µs/step':>10} {'share':>6}  kernel")
    for name, us, calls in rows:
        share = us / summary.total_us
        lines.append(f"  {calls:7.1f} {us:10.1f} {share:6.1%}  {short_name(name)}")
    rest = summary.rows[top:]
    if rest:
        us = sum(r[1] for r in rest)
        lines.append(f"  {'':7} {us:10.1f} {us / summary.total_us:6.1%}  ({len(rest)} more)")
    busy = ""
    if step_us:
        busy = f" ({summary.total_us / step_us:.0%} of the {step_us:.0f} µs timed step)"
    lines.append(
        f"  GPU time {summary.total_us:.1f} µs/step{busy}; {summary.launches:.1f} kernel "
        f"launches, {summary.memops:.1f} memcpy/memset per step"
    )
    return lines


def format_syncs(syncs: dict[str, int], steps: int) -> str:
    """A line of the host synchronisations (SYNC_CALLS) seen over the profiled steps."""
    said = ", ".join(f"{name} {syncs[name]}" for name in SYNC_CALLS if syncs.get(name))
    return (
        f"  host syncs in {steps} steps: {said or 'none'} (the profiler's stop adds one "
        "cudaDeviceSynchronize)"
    )


def format_comparison(
    base_name: str, base: KernelSummary, name: str, other: KernelSummary, top: int = 8
) -> list[str]:
    """Lines comparing `other` with `base`: the change in GPU time, launches and memcpy/memset per
    step, then the `top` kernels whose time per step grew most and the `top` that shrank most
    (new: not run by `base`; gone: not run by `other`)."""
    lines = [
        f"{name} vs {base_name}: GPU time {other.total_us - base.total_us:+.1f} µs/step "
        f"({base.total_us:.1f} -> {other.total_us:.1f}), kernel launches "
        f"{other.launches - base.launches:+.1f}, memcpy/memset {other.memops - base.memops:+.1f}"
        " per step"
    ]
    before = {row[0] for row in base.rows}
    after = {row[0] for row in other.rows}
    changes = kernel_deltas(base, other)
    grew = [d for d in changes if d[1] > 0][:top]
    shrank = [d for d in reversed(changes) if d[1] < 0][:top]
    for label, chosen in (("grew most", grew), ("shrank most", shrank)):
        if chosen:
            lines.append(f"  {label} (µs/step):")
        for kernel, delta in chosen:
            mark = "new" if kernel not in before else "gone" if kernel not in after else ""
            lines.append(f"    {delta:+10.1f} {mark:4}  {short_name(kernel)}")
    return lines


def _device_type_name(evt) -> str | None:
    device_type = getattr(evt, "device_type", None)
    if device_type is None:
        return None
    return getattr(device_type, "name", str(device_type).rsplit(".", 1)[-1])


def kernel_rows(events) -> list[tuple[str, float, int]]:
    """(name, device µs, calls) of the GPU activities (kernels, memcpy, memset) among a
    profiler's key_averages(); the CPU ops, whose device time is their kernels', are left out."""
    rows = []
    for evt in events:
        if _device_type_name(evt) in (None, "CPU"):
            continue
        us = getattr(evt, "device_time_total", None)
        if us is None:  # older torch
            us = getattr(evt, "cuda_time_total", 0)
        if us:
            rows.append((evt.key, float(us), int(evt.count)))
    return rows


def host_syncs(events) -> dict[str, int]:
    """Calls of each SYNC_CALLS runtime function among a profiler's key_averages()."""
    syncs: dict[str, int] = {}
    for evt in events:
        if evt.key in SYNC_CALLS and _device_type_name(evt) in (None, "CPU"):
            syncs[evt.key] = syncs.get(evt.key, 0) + int(evt.count)
    return syncs


#: PyTorch ops that copy a tensor (their kernels show in the GPU table as copy kernels, without
#: saying which tensor): listed by input shapes to tell which.
COPY_OPS = ("aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous")


def copy_calls(events, steps: int) -> dict[tuple[str, str], float]:
    """Calls per step of each COPY_OPS op by its input shapes, from a profiler's
    key_averages(group_by_input_shape=True) over `steps` steps."""
    calls: dict[tuple[str, str], float] = {}
    for evt in events:
        if evt.key in COPY_OPS and _device_type_name(evt) in (None, "CPU"):
            key = (evt.key, str(getattr(evt, "input_shapes", None) or []))
            calls[key] = calls.get(key, 0.0) + int(evt.count) / steps
    return calls


def format_copy_comparison(
    base_name: str, base: dict, name: str, other: dict, top: int = 8
) -> list[str]:
    """Lines of the copying ops (copy_calls) whose calls per step differ between `other` and
    `base`, by input shapes: the `top` that `other` calls more, then the `top` it calls less
    (e.g. a tensor one of them lays out again every step)."""
    changes = deltas(base, other)
    more = [d for d in changes if d[1] > 0][:top]
    fewer = [d for d in reversed(changes) if d[1] < 0][:top]
    if not more and not fewer:
        return [f"{name} vs {base_name}: the same copying ops per step"]
    lines = [f"{name} vs {base_name}: copying ops per step by input shapes"]
    for (op, shapes), delta in more + fewer:
        lines.append(f"    {delta:+6.1f}  {op} {short_name(shapes, 90)}")
    return lines


def profile_model(model, args) -> tuple[KernelSummary, dict[str, int], dict]:
    """GPU work per step, host syncs and copying ops by input shapes (copy_calls) over
    args.profile_steps steps of the (warmed-up) model, after one unprofiled step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step = _step_fn(model, args, example_input(args))
    step()
    torch.cuda.synchronize()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True
    ) as prof:
        for _ in range(args.profile_steps):
            step()
    events = prof.key_averages()
    copies = copy_calls(prof.key_averages(group_by_input_shape=True), args.profile_steps)
    return summarize_kernels(kernel_rows(events), args.profile_steps), host_syncs(events), copies


def print_profiles(variants: dict, results: dict[str, float], args) -> None:
    """Profile each variant and print its table, then each spio variant against pytorch; a
    profile that fails says so, and the others go on."""
    summaries = {}
    copies = {}
    for name, model in variants.items():
        t0 = time.perf_counter()
        try:
            summary, syncs, copies[name] = profile_model(model, args)
        except Exception as e:  # the timings above stand; say why this profile is missing
            print(f"\nprofile of {name} failed: {type(e).__name__}: {e}")
            continue
        summaries[name] = summary
        step_us = args.batch_size / results[name] * 1e6
        print()
        print("\n".join(format_kernel_table(name, summary, args.profile_steps, step_us=step_us)))
        print(format_syncs(syncs, args.profile_steps))
        print(f"  ({time.perf_counter() - t0:.1f} s)")
    for name in ("spio", "spio-faster"):
        if name in summaries and "pytorch" in summaries:
            print()
            print(
                "\n".join(format_comparison("pytorch", summaries["pytorch"], name, summaries[name]))
            )
            print(
                "\n".join(format_copy_comparison("pytorch", copies["pytorch"], name, copies[name]))
            )


def print_graphed(variants: dict, args) -> dict[str, float]:
    """Time each variant's step in a CUDA graph (time_graphed) and print its samples/s, then
    each spio variant's against pytorch's; a capture that fails says why, and the others go
    on. Returns the samples/s of those that ran."""
    graphed = {}
    for name, model in variants.items():
        t0 = time.perf_counter()
        try:
            graphed[name] = time_graphed(model, args)
        except Exception as e:  # the eager timings stand; say why this one is missing
            print(f"{name:8s} in a CUDA graph failed: {type(e).__name__}: {e}")
            continue
        print(f"{name:8s} {graphed[name]:10.1f} samples/s in a CUDA graph  "
              f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    for name in ("spio", "spio-faster"):
        if name in graphed and "pytorch" in graphed:
            print(f"{name} / pytorch in CUDA graphs = {graphed[name] / graphed['pytorch']:.3f}")
    return graphed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_requirements()
    if missing:
        for line in missing:
            print(line, file=sys.stderr)
        return 2

    import timm
    import torch

    import spio.transform
    from spio.layers import Conv2dGw8

    torch.backends.cudnn.benchmark = True
    base = timm.create_model(args.model, pretrained=False).cuda()
    if args.channels_last:
        base = base.to(memory_format=torch.channels_last)
    variants = {"pytorch": base}
    if args.spio:
        variants["spio"] = spio.transform.transform(copy.deepcopy(base))
        n = sum(isinstance(m, Conv2dGw8) for m in variants["spio"].modules())
        print(f"spio.transform replaced {n} convolutions in {args.model}")
    if args.spio_where_faster:
        model = copy.deepcopy(base)
        x = example_input(args)
        with torch.autocast("cuda", dtype=getattr(torch, args.amp_dtype)):
            include = spio.transform.where_faster(model, x, training=args.bench == "train")
        variants["spio-faster"] = spio.transform.transform(model, include=include)
        convs = [m for m in model.modules() if isinstance(m, Conv2dGw8)]
        per_pass = ", ".join(
            f"{p} {sum(p in m.spio_passes for m in convs)}" for p in ("fprop", "dgrad", "wgrad")
        )
        print(
            f"spio.transform with where_faster replaced {len(convs)} convolutions in "
            f"{args.model} (spio runs {per_pass} of their passes)"
        )
    print(
        f"{args.model} {args.bench} batch {args.batch_size} img {args.img_size} "
        f"{args.amp_dtype} channels_last={args.channels_last} on {torch.cuda.get_device_name()}"
    )
    results = {}
    for name, model in variants.items():
        t0 = time.perf_counter()
        results[name] = time_model(model, args)
        print(f"{name:8s} {results[name]:10.1f} samples/s  ({time.perf_counter() - t0:.1f} s)")
    for name in ("spio", "spio-faster"):
        if name in results:
            print(f"{name} / pytorch = {results[name] / results['pytorch']:.3f}")
    if args.cuda_graph:
        print_graphed(variants, args)
    if args.profile:
        print_profiles(variants, results, args)
    return 0


if __name__ == "__main__":
    run_script(main)
