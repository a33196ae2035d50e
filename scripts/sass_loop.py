"""Instructions per row step in a kernel's main loop, read from its SASS; no GPU needed.

Each kernel streams rows through a loop with one barrier per row step, so the instructions
between two barriers are what a warp issues per row: index arithmetic, copies, ldmatrix and mma.
This script compiles kernels with NVRTC, disassembles the cubin with nvdisasm, finds the main loop
(the longest backward branch whose body holds a barrier) and prints its instructions per barrier,
with the mma, ldmatrix and cp.async among them. Fewer instructions for the same mma and loads is
work a warp no longer has to issue; whether that makes a kernel faster only a GPU can say.

    python scripts/sass_loop.py             # each family's heuristic config on the bench layers
    python scripts/sass_loop.py --family conv2d_gw8_wgrad \\
        --layer n128_c64_h64_w64_pad1x1_r3_s3_bias0_fp16 --config g2_p32_q64_n4_w4_s6_k8

nvdisasm comes with a CUDA toolkit or NVIDIA's `nvidia-cuda-nvdisasm` wheel; set SPIO_NVDISASM to
its path if it is not found on PATH or in the wheel.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]\s+")
_COUNTED = ("HMMA", "LDSM", "LDGSTS")  # mma.sync, ldmatrix, cp.async


@dataclass(frozen=True)
class LoopReport:
    instructions: int  # in the loop body, once around
    barriers: int
    counts: Counter  # by opcode (HMMA, LDSM, LDGSTS, ...)

    @property
    def per_step(self) -> float:
        return self.instructions / max(self.barriers, 1)


def opcode(instruction: str) -> str:
    """The opcode without predicate or modifiers: '@P0 HMMA.1688.F32 R0, ...' -> 'HMMA'."""
    return _PREDICATE.sub("", instruction).split()[0].split(".")[0]


def main_loop(sass: str) -> LoopReport | None:
    """The longest loop (a backward branch and the instructions from its target) that holds a
    barrier, in nvdisasm output; None when there is none."""
    labels: dict[str, int] = {}
    instructions: list[str] = []
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        found = _INSTRUCTION.match(line)
        if found:
            instructions.append(found.group(2))
    best: list[str] | None = None
    for end, instruction in enumerate(instructions):
        branch = _BRANCH.search(instruction)
        if not branch or labels.get(branch.group(1), end + 1) > end:
            continue
        body = instructions[labels[branch.group(1)] : end + 1]
        if any(opcode(i) == "BAR" for i in body) and (best is None or len(body) > len(best)):
            best = body
    if best is None:
        return None
    counts = Counter(opcode(i) for i in best)
    return LoopReport(len(best), counts["BAR"], counts)


def find_nvdisasm() -> str:
    """nvdisasm from SPIO_NVDISASM, PATH, or NVIDIA's nvdisasm wheel."""
    explicit = os.environ.get("SPIO_NVDISASM")
    if explicit:
        return explicit
    found = shutil.which("nvdisasm")
    if found:
        return found
    for entry in sys.path:
        for candidate in sorted(Path(entry).glob("nvidia/cu*/bin/nvdisasm")) if entry else ():
            return str(candidate)
    sys.exit(
        "sass_loop: nvdisasm not found; `pip install nvidia-cuda-nvdisasm`, or set SPIO_NVDISASM"
    )


def disassemble(cubin: bytes, nvdisasm: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run(
            [nvdisasm, "-c", str(path)], check=True, capture_output=True, text=True
        ).stdout


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
    print(f"{'family':18s} {'layer':42s} {'config':26s} {'regs':>4s} {'/step':>6s} "
          f"{'mma':>4s} {'ldsm':>4s} {'cp.async':>8s}")  # fmt: skip
    for family in families:
        for params in layers:
            configs = {c.encode(): c for c in family.configs(params)}
            names = args.config or [family.default_config(params).encode()]
            for name in names:
                if name not in configs:
                    sys.exit(f"sass_loop: {family.name} has no config {name} for {params.encode()}")
                result = family.make_kernel(params, configs[name]).compile(args.arch)
                loop = main_loop(disassemble(result.cubin, nvdisasm))
                registers = max(r.registers for r in result.resources.values())
                if loop is None:
                    print(
                        f"{family.name:18s} {params.encode():42s} {name:26s} {registers:4d} no loop"
                    )
                    continue
                mma, ldsm, copies = (loop.counts[op] / loop.barriers for op in _COUNTED)
                print(
                    f"{family.name:18s} {params.encode():42s} {name:26s} {registers:4d} "
                    f"{loop.per_step:6.1f} {mma:4.1f} {ldsm:4.1f} {copies:8.1f}"
                )
    print("per row step (per barrier of the main loop), SASS for", args.arch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
