#!/usr/bin/env python
"""Samples/s of a stock timm model with PyTorch's convolutions and, with --spio, spio's.

Both variants are timed in the same run on the same GPU from the same initial weights, so the ratio
is meaningful. Needs a CUDA GPU and timm; without either it exits with status 2 and says why.

    python scripts/timm_benchmark.py --model regnetx_002 --spio --amp-dtype bfloat16 \\
        --channels-last --bench train --batch-size 256 --img-size 224
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

from spio.args import positive_int


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


def _step_fn(model, args, x):
    import torch

    dtype = getattr(torch, args.amp_dtype)
    if args.bench == "inference":
        model.eval()

        def step():
            with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
                model(x)

    else:
        model.train()

        def step():
            with torch.autocast("cuda", dtype=dtype):
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
    times = []
    for _ in range(args.iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return args.batch_size / statistics.median(times)


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
