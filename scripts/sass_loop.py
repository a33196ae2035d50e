"""Instructions per row step in a kernel's main loop, read from its SASS; no GPU needed.

Compiles kernels with NVRTC and counts, with spio.compiler.sass, the instructions a warp issues per
row step of the main loop (per barrier), with the mma, ldmatrix and cp.async among them, next to
the kernel's registers and resident blocks per SM (spio.compiler.occupancy). Fewer instructions
for the same mma and loads is work a warp no longer has to issue; whether that makes a kernel
faster only a GPU can say. The count is of a full step: WGrad is built without the careful copy
of its step that only the steps at a tile's edges take (Family.full_step_defines). Each kernel is
built as spio runs it on --arch (with SPIO_TMA set, sm_90's with tensor copies).

    python scripts/sass_loop.py             # each family's heuristic config on the bench layers
    python scripts/sass_loop.py --family conv2d_gw8_wgrad \\
        --layer n128_c64_h64_w64_pad1x1_r3_s3_bias0_fp16 --config g2_p32_q64_n4_w4_s6_k8

With --against VARIANT (a variant of scripts/ablate_kernel.py, e.g. copy-branch or unroll-r) each
kernel is also built as that variant, and each line compares the two: how a kernel change moved
the counts, when the variant builds the code from before it. --sample N takes N random configs of
the bench layers instead of the heuristic's, and the last line sums the comparison up:

    python scripts/sass_loop.py --family conv2d_gw8_wgrad --against copy-branch --sample 64

Needs nvdisasm (CUDA toolkit, or `pip install nvidia-cuda-nvdisasm`; SPIO_NVDISASM names it).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from spio.args import positive_int, run_script


def _variants():
    """scripts/ablate_kernel.py's variant names, build_variant (a kernel as one of them) and
    variant_applies."""
    scripts = str(Path(__file__).resolve().parent)
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from ablate_kernel import SWIZZLED, TMA, VARIANTS, build_variant, variant_applies

    return [*VARIANTS, *SWIZZLED, *TMA], build_variant, variant_applies


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import spio

    variants, _, _ = _variants()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # spio's archs: each has per-SM limits (blocks per SM are worked out for each kernel) and a
    # typical GPU whose heuristic pick is counted.
    parser.add_argument("--arch", default="sm_90", choices=list(spio.supported_arch))
    parser.add_argument("--family", help="a kernel family, e.g. conv2d_gw8_wgrad (default: all)")
    parser.add_argument("--layer", help="Conv2dGw8Params.encode() text (default: bench layers)")
    parser.add_argument(
        "--config",
        action="append",
        help="config name, of the space or on trial; repeatable (default: the heuristic's)",
    )
    parser.add_argument("--batch", type=positive_int, default=128, help="N of the bench layers")
    parser.add_argument(
        "--against",
        choices=sorted(set(variants) - {"full"}),
        help="also build each kernel as this ablate_kernel.py variant and compare",
    )
    parser.add_argument(
        "--sample", type=int, help="N random configs of the layers instead of the heuristic's"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for --sample")
    args = parser.parse_args(argv)
    if args.sample is not None and args.sample < 1:
        parser.error(f"--sample needs a positive count, got {args.sample}")
    if args.sample and args.config:
        parser.error("--sample and --config both choose the configs: give one")
    return args


def choose_cases(args: argparse.Namespace, families: list, layers: list) -> list[tuple]:
    """(family, params, config) to count: the named configs, a random sample of all of them, or
    each layer's heuristic config for a typical GPU of --arch (TYPICAL_GPU)."""
    from spio.kernels.conv2d_gw8_factory import typical_machine

    if args.sample:
        every = [(f, p, c) for f in families for p in layers for c in f.configs(p)]
        chosen = random.Random(args.seed).sample(every, min(args.sample, len(every)))
        return sorted(chosen, key=lambda case: (case[0].name, case[1].encode(), case[2].encode()))
    cases = []
    for family in families:
        for params in layers:
            if args.config:
                for name in args.config:
                    try:
                        config = family.config_named(params, name, trial=True)
                        cases.append((family, params, config))
                        if config not in family.configs(params):
                            print(f"{name}: a trial config, outside the space spio picks from")
                    except ValueError as error:
                        sys.exit(f"sass_loop: {error}")
            else:  # the heuristic's pick for a typical GPU of the arch, as resource_report's
                config = family.default_config(params, machine=typical_machine(args.arch))
                cases.append((family, params, config))
    return cases


def cell(old, new, width: int, fmt: str = "") -> str:
    """`new`, or `old->new` where there is an old value, right-aligned in `width`."""
    text = f"{new:{fmt}}" if old is None else f"{old:{fmt}}->{new:{fmt}}"
    return f"{text:>{width}s}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from spio.bench.layers import layer_table
    from spio.compiler import CompileResult, compile_many
    from spio.compiler.occupancy import LIMITS, blocks_per_sm
    from spio.compiler.sass import find_nvdisasm, loop_report
    from spio.kernels import Conv2dGw8Params
    from spio.kernels.families import FAMILIES, get_family, with_tensor_copies

    try:
        families = [get_family(args.family)] if args.family else list(FAMILIES.values())
    except ValueError as error:
        sys.exit(f"sass_loop: {error}")
    if args.layer:
        try:
            layers = [Conv2dGw8Params.decode(args.layer)]
        except ValueError as error:
            sys.exit(f"sass_loop: --layer {args.layer!r}: {error}")
    else:
        layers = [layer.params(args.batch, "fp16") for layer in layer_table()]
    try:
        nvdisasm = find_nvdisasm()
    except ValueError as error:  # SPIO_NVDISASM naming no program
        sys.exit(f"sass_loop: {error}")
    if nvdisasm is None:
        sys.exit("sass_loop: no nvdisasm; `pip install nvidia-cuda-nvdisasm` or set SPIO_NVDISASM")
    _, build_variant, variant_applies = _variants()
    cases = []
    for family, params, config in choose_cases(args, families, layers):
        if args.against and not variant_applies(args.against, family.pass_, params, config):
            print(f"{family.name} {params.encode()} {config.encode()}: no {args.against} build")
            continue
        cases.append((family, params, config))
    if not cases:
        sys.exit("sass_loop: nothing to count")

    # Per case: the kernel as run (registers) and its full-step build (the count); with
    # --against, the same two of the variant. Builds equal to another are compiled once.
    builds = []
    for family, params, config in cases:
        kernel = with_tensor_copies(family.make_kernel(params, config), args.arch)  # (SPIO_TMA)
        versions = [kernel]
        if args.against:
            versions.append(build_variant(kernel, args.against))
        for version in versions:
            builds += [version, version.with_defines(family.full_step_defines)]
    unique = list({build.name: build for build in builds}.values())
    compiled = compile_many([b.compile_job(args.arch) for b in unique], desc="compiling")
    by_name = {build.name: result for build, result in zip(unique, compiled, strict=True)}

    limits = LIMITS[args.arch]
    failures = 0
    ratios, rose, lost, gained = [], 0, 0, 0

    def measure(run, full):
        """(registers, blocks per SM, loop report or None) of one build, or the error of a build
        that failed."""
        result, counted = by_name[run.name], by_name[full.name]
        for build in (result, counted):
            if not isinstance(build, CompileResult):
                return build
        usage = result.resources[run.entry]
        smem = usage.shared_bytes + run.shared_mem_bytes
        blocks = blocks_per_sm(limits, run.threads, usage.registers, smem)
        return usage.registers, blocks, loop_report(counted.cubin, nvdisasm)

    print(f"{'family':18s} {'layer':42s} {'config':26s} {'regs':>9s} {'blocks':>7s} "
          f"{'/step':>13s} {'mma':>4s} {'ldsm':>4s} {'cp.async':>8s}")  # fmt: skip
    per_case = 4 if args.against else 2
    for index, (family, params, config) in enumerate(cases):
        run, full, *before = builds[per_case * index : per_case * (index + 1)]
        now = measure(run, full)
        then = measure(*before) if before else None
        row = f"{family.name:18s} {params.encode():42s} {config.encode():26s}"
        error = next((m for m in (now, then) if isinstance(m, BaseException)), None)
        if error is not None:
            failures += 1
            print(f"{row} FAILED: {str(error).strip()[:2000]}")
            continue
        registers, blocks, loop = now
        old_registers, old_blocks, old_loop = then or (None, None, None)
        row += f" {cell(old_registers, registers, 9)} {cell(old_blocks, blocks, 7)}"
        if then is not None:
            lost += blocks < old_blocks
            gained += blocks > old_blocks
        if loop is None or (then is not None and old_loop is None):
            print(f"{row} no loop")
            continue
        old_step = old_loop.per_step if old_loop else None
        if old_step is not None:
            ratios.append(loop.per_step / old_step)
            rose += loop.per_step > old_step
        mma, ldsm, copies = (loop.per_step_of(op) for op in ("HMMA", "LDSM", "LDGSTS"))
        print(f"{row} {cell(old_step, loop.per_step, 13, '.1f')} "
              f"{mma:4.1f} {ldsm:4.1f} {copies:8.1f}")  # fmt: skip
    print(
        f"per full row step (per barrier of the main loop), SASS for {args.arch}; regs and "
        "blocks/SM of the kernel as spio runs it, instructions of a build with only a full "
        "step's code in the loop (WGrad: SPIO_WGRAD_UNMASKED, without the careful copy its "
        "tile-edge steps take)"
        + (f"; a->b: the {args.against} build, then the kernel" if args.against else "")
    )
    if ratios:
        print(
            f"against {args.against}: instructions a step a median {statistics.median(ratios):.2f}"
            f" of {args.against}'s (from {min(ratios):.2f} to {max(ratios):.2f}; {rose} of "
            f"{len(ratios)} rose); blocks per SM lower on {lost}, higher on {gained} of "
            f"{len(cases)} kernels"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    run_script(main)
