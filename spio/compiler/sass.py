"""The main loop of a compiled kernel, read from its SASS (nvdisasm), for instruction counts.

Each of spio's kernels streams rows through one loop with one barrier per row step, so the
instructions between two barriers are what a warp issues per row: index arithmetic, copies,
ldmatrix and mma. `loop_report(cubin, nvdisasm)` disassembles a cubin and counts them. No GPU
is needed, but nvdisasm is: it comes with a CUDA toolkit or NVIDIA's `nvidia-cuda-nvdisasm`
wheel (the `test` extra installs it); `find_nvdisasm` finds it, SPIO_NVDISASM names it
explicitly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .. import env

_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]\s+")


@dataclass(frozen=True)
class LoopReport:
    """The main loop once around: its instructions, barriers and opcode counts."""

    instructions: int
    barriers: int
    counts: Counter  # by opcode: HMMA (mma.sync), LDSM (ldmatrix), LDGSTS (cp.async), ...

    @property
    def per_step(self) -> float:
        """Instructions per row step (per barrier)."""
        return self.instructions / max(self.barriers, 1)

    def per_step_of(self, opcode: str) -> float:
        return self.counts[opcode] / max(self.barriers, 1)


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


def find_nvdisasm() -> str | None:
    """nvdisasm from SPIO_NVDISASM, PATH, or NVIDIA's nvdisasm wheel; None if there is none.
    ValueError where SPIO_NVDISASM names no program (not a silent search elsewhere)."""
    explicit = env.path_or_name("SPIO_NVDISASM")
    if explicit:
        if shutil.which(explicit) is None:
            raise ValueError(
                f"SPIO_NVDISASM must name nvdisasm, got {os.environ['SPIO_NVDISASM']!r}, no program"
            )
        return explicit
    found = shutil.which("nvdisasm")
    if found:
        return found
    for entry in sys.path:
        found_here = list(Path(entry).glob("nvidia/cu*/bin/nvdisasm")) if entry else []
        if found_here:  # the newest CUDA's (cu13 over cu12): an older one may not read a cubin
            return str(max(found_here, key=_cuda_major))
    return None


def _cuda_major(nvdisasm: Path) -> int:
    """The CUDA major version of a wheel's nvidia/cuNN/bin/nvdisasm; 0 for another folder."""
    folder = nvdisasm.parent.parent.name.removeprefix("cu")
    return int(folder) if folder.isdigit() else 0


def disassemble(cubin: bytes, nvdisasm: str) -> str:
    """nvdisasm's listing of a cubin; RuntimeError with nvdisasm's own message where it fails
    (e.g. an older nvdisasm first on PATH that cannot read a newer arch's cubin)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run(
            [nvdisasm, "-c", str(path)],
            capture_output=True,
            encoding="utf-8",
            errors="replace",
        )
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip() or "no message"
        raise RuntimeError(f"{nvdisasm} failed (exit {done.returncode}): {said}")
    return done.stdout


def loop_report(cubin: bytes, nvdisasm: str) -> LoopReport | None:
    """The main loop of the kernel in `cubin`."""
    return main_loop(disassemble(cubin, nvdisasm))
