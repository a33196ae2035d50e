"""Instructions per row step in a kernel's main loop, read from its SASS; no GPU needed.

Compiles kernels with NVRTC and counts, with spio.compiler.sass, the instructions a warp issues per
row step of the main loop (per barrier), with the mma, ldmatrix and cp.async among them. Fewer
instructions for the same mma and loads is work a warp no longer has to issue; whether that makes
a kernel faster only a GPU can say. The count is of a full step: WGrad is built without the careful
copy of its step that only the steps at a tile's edges take (Family.full_step_defines).

    python scripts/sass_loop.py             # each family's heuristic config on the bench layers
    python scripts/sass_loop.py --family conv2d_gw8_wgrad \\
        --layer n128_c64_h64_w64_pad1x1_r3_s3_bias0_fp16 --config g2_p32_q64_n4_w4_s6_k8

Needs nvdisasm (CUDA toolkit, or `pip install nvidia-cuda-nvdisasm`; SPIO_NVDISASM names it).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--family", help="a kernel family, e.g. conv2d_gw8_wgrad (default: all)")
    parser.add_argument("--layer", help="Conv2dGw8Params.encode() text (default: bench layers)")
    parser.add_argument(
        "--config", action="append", help="config name, repeatable (default: the heuristic's)"
    )
    parser.add_argument("--batch", type=int, default=128, help="N of the bench layers")
    args = parser.parse_args(argv)

    from spio.bench.layers import layer_table
    from spio.compiler.sass import find_nvdisasm, loop_report
    from spio.kernels import Conv2dGw8Params
    from spio.kernels.families import FAMILIES, get_family

    try:
        families = [get_family(args.family)] if args.family else list(FAMILIES.values())
    except ValueError as error:
        sys.exit(f"sass_loop: {error}")
    if args.layer:
        layers = [Conv2dGw8Params.decode(args.layer)]
    else:
        layers = [layer.params(args.batch, "fp16") for layer in layer_table()]
    nvdisasm = find_nvdisasm()
    if nvdisasm is None:
        sys.exit("sass_loop: no nvdisasm; `pip install nvidia-cuda-nvdisasm` or set SPIO_NVDISASM")
    print(f"{'family':18s} {'layer':42s} {'config':26s} {'regs':>4s} {'/step':>6s} "
          f"{'mma':>4s} {'ldsm':>4s} {'cp.async':>8s}")  # fmt: skip
    for family in families:
        for params in layers:
            configs = {c.encode(): c for c in family.configs(params)}
            names = args.config or [family.default_config(params).encode()]
            for name in names:
                if name not in configs:
                    sys.exit(f"sass_loop: {family.name} has no config {name} for {params.encode()}")
                kernel = family.make_kernel(params, configs[name])
                result = kernel.compile(args.arch)
                registers = max(r.registers for r in result.resources.values())
                full_step = kernel.with_defines(family.full_step_defines)
                counted = result if full_step is kernel else full_step.compile(args.arch)
                loop = loop_report(counted.cubin, nvdisasm)
                row = f"{family.name:18s} {params.encode():42s} {name:26s} {registers:4d}"
                if loop is None:
                    print(f"{row} no loop")
                    continue
                mma, ldsm, copies = (loop.per_step_of(op) for op in ("HMMA", "LDSM", "LDGSTS"))
                print(f"{row} {loop.per_step:6.1f} {mma:4.1f} {ldsm:4.1f} {copies:8.1f}")
    print(
        f"per full row step (per barrier of the main loop), SASS for {args.arch}; regs of the "
        "kernel as spio runs it, instructions of a build with only a full step's code in the loop "
        "(WGrad: SPIO_WGRAD_UNMASKED, without the careful copy its tile-edge steps take)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
