"""Measure the host cost of launching a kernel through spio.cuda.driver.

Compiles an empty kernel with NVRTC, launches it many times from Python and reports microseconds
per launch, next to a one-element torch fill (a kernel launch through PyTorch) for scale. The
target is under 5 µs per launch. Needs a CUDA GPU; without one it exits with status 2 and a message.

    python scripts/bench_launch.py [--launches 10000] [--repeats 5] [--device 0]
"""

from __future__ import annotations

import argparse
import sys

from spio.args import no_gpu, positive_int, run_script

SOURCE = r"""
extern "C" __global__ void empty_kernel() {}
extern "C" __global__ void empty_kernel_args(float* out, int n, int stride, float scale) {}
"""

TARGET_US = 5.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=positive_int, default=10_000, help="launches per repeat")
    parser.add_argument(
        "--repeats", type=positive_int, default=5, help="timed repeats (median reported)"
    )
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("bench_launch: needs PyTorch with CUDA; torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        return no_gpu("bench_launch")

    from spio.bench.timing import host_us_per_call
    from spio.compiler import compile_cubin
    from spio.cuda import driver

    try:
        driver.init()
    except (driver.CudaDriverError, driver.CudaError) as e:
        print(f"bench_launch: the CUDA driver is not usable: {e}", file=sys.stderr)
        return 2

    torch.cuda.set_device(args.device)
    attrs = driver.device_attributes(args.device)
    module = driver.Module.load(compile_cubin(SOURCE, attrs["arch"]).cubin, args.device)
    empty = module.get_function("empty_kernel")
    with_args = module.get_function("empty_kernel_args")
    out = torch.empty(1024, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    fill = torch.empty(1, device="cuda")
    wrapped = driver.Pointer(out)

    cases = {
        "spio: no arguments": lambda: empty.launch(1, 32, (), 0, stream),
        "spio: tensor, int, int, float": lambda: with_args.launch(
            1, 32, (out, 1024, 1, 0.5), 0, stream
        ),
        "spio: Pointer, int, int, float": lambda: with_args.launch(
            1, 32, (wrapped, 1024, 1, 0.5), 0, stream
        ),
        "torch: fill_ of one element": lambda: fill.fill_(1.0),
    }
    major, minor = driver.driver_version()
    print(
        f"GPU {attrs['name']} ({attrs['arch']}), driver CUDA {major}.{minor}, "
        f"{args.launches} launches x {args.repeats} repeats, median"
    )
    print(f"{'case':34s} {'host µs/launch':>15s} {'with sync':>10s}")
    results = {}
    for name, launch in cases.items():
        host, total = host_us_per_call(launch, args.launches, args.repeats, torch.cuda.synchronize)
        results[name] = host
        print(f"{name:34s} {host:15.2f} {total:10.2f}")
    worst = max(v for k, v in results.items() if k.startswith("spio"))
    verdict = "met" if worst < TARGET_US else "MISSED"
    print(f"target < {TARGET_US:g} µs per spio launch: {verdict} (worst {worst:.2f} µs)")
    module.close()
    return 0


if __name__ == "__main__":
    run_script(main)
