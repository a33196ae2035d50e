"""Write the kernels' resource report (registers, spills, shared memory, occupancy) to markdown.

For every layer of the benchmark table at one batch size, each kernel family's default config for a
GPU of each supported arch (the analytic heuristic's pick for that arch's limits and a typical GPU's
SM count, `spio.kernels.conv2d_gw8_factory.TYPICAL_GPU`) is compiled with NVRTC for that arch;
ptxas' report gives registers, spills and static shared memory, and the theoretical occupancy
follows from the arch's per-SM limits (CUDA programming guide, compute capability table). Where
nvdisasm is installed, each kernel's main loop is read from its SASS too (spio.compiler.sass):
instructions a warp issues per row step. Where a shipped performance model covers the layer on
an H200 (sm_90), its pick, which is what spio runs there, follows as a row of its own ("sm_90,
model"). Each kernel is built as spio runs it on its arch (with SPIO_TMA set, sm_90's with tensor
copies; docs/perf/resources.md is made without it). No GPU is needed. Commit the output under
docs/perf/ so that register, shared-memory or instruction-count regressions show in review:

    python scripts/resource_report.py --out docs/perf/resources.md
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import spio
from spio.args import folder_write_error, positive_int, run_script
from spio.bench.layers import layer_table
from spio.compiler import CompileResult, compile_many
from spio.compiler.cache import write_atomically
from spio.compiler.occupancy import LIMITS, blocks_per_sm
from spio.compiler.sass import find_nvdisasm, loop_report
from spio.kernels.conv2d_gw8_factory import TYPICAL_GPU, typical_machine
from spio.kernels.families import FAMILIES, with_tensor_copies
from spio.kernels.perf_model import PACKAGED_MODELS_DIR, DeviceIdentity, rank_configs

#: The GPU whose shipped models' picks the report adds (what spio runs on it).
H200 = DeviceIdentity(arch="sm_90", name="NVIDIA H200", driver="13.0", sms=132)


def _steps(full_step, nvdisasm: str | None) -> str:
    """The main loop's instructions per row step, with its mma and ldmatrix: '162 (24, 20)'.
    `full_step`: the compile result of the build with only a full step's code in the loop."""
    if not isinstance(full_step, CompileResult):
        return f"not counted: {full_step}"
    loop = loop_report(full_step.cubin, nvdisasm) if nvdisasm else None
    if loop is None:
        return "–" if nvdisasm is None else "no loop"
    return f"{loop.per_step:.0f} ({loop.per_step_of('HMMA'):.0f}, {loop.per_step_of('LDSM'):.0f})"


def _out_problem(path: Path) -> str | None:
    """Why the report cannot be written to `path`, or None: checked before the minutes of
    compiles, so that a mistyped --out is not found only after them."""
    if path.is_dir():
        return f"--out {path} is a folder; name the markdown file to write"
    error = folder_write_error(path.parent, create=False)
    if error is not None:
        return f"--out {path}: cannot write a file in {path.parent}: {error.strerror or error}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="markdown file to write (default: print)")
    parser.add_argument("--n", type=positive_int, default=128, help="batch size (default 128)")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    args = parser.parse_args(argv)
    if args.out is not None and (problem := _out_problem(args.out)):
        parser.error(problem)
    try:  # before the minutes of compiles
        nvdisasm = find_nvdisasm()
    except ValueError as error:  # SPIO_NVDISASM naming no program
        parser.error(str(error))

    jobs = []  # ((layer name, family, config, kernel), arch, picked by a model)
    for layer in layer_table():
        params = layer.params(args.n, args.dtype)
        for family in FAMILIES.values():
            for arch in spio.supported_arch:
                config = family.default_config(params, machine=typical_machine(arch))
                kernel = with_tensor_copies(family.make_kernel(params, config), arch)
                jobs.append(((layer.name, family, config, kernel), arch, False))
            ranked, model = rank_configs(family, params, H200, PACKAGED_MODELS_DIR)
            if model is not None:
                kernel = with_tensor_copies(family.make_kernel(params, ranked[0]), "sm_90")
                row = (layer.name, family, ranked[0], kernel)
                jobs.append((row, "sm_90", True))
    results = compile_many([row[3].compile_job(arch) for row, arch, _ in jobs], desc="compiling")
    # The instructions per step are counted on a build with only a full step's code in the loop:
    # a second build only for the families that have one (WGrad).
    second = [i for i, ((_, family, _, _), _, _) in enumerate(jobs) if family.full_step_defines]
    counted = list(results)
    seconds = compile_many(
        [jobs[i][0][3].with_defines(jobs[i][0][1].full_step_defines).compile_job(jobs[i][1])
         for i in second],
        desc="compiling full steps",
    )  # fmt: skip
    for i, result in zip(second, seconds, strict=True):
        counted[i] = result

    steps_note = (
        "Instr/step: SASS instructions a warp issues per full row step of the main loop (per "
        "barrier; `spio.compiler.sass`), of which mma.sync and ldmatrix; WGrad's are counted "
        "without the careful copy of the step that only a tile's edge steps take "
        "(SPIO_WGRAD_UNMASKED)."
        if nvdisasm
        else "Instr/step: not counted (no nvdisasm on the machine that made this report)."
    )
    lines = [
        f"# Kernel resource report ({args.dtype}, N = {args.n})",
        "",
        f"Made on {datetime.date.today()} by `python scripts/resource_report.py"
        f" --n {args.n} --dtype {args.dtype}` (NVRTC, no GPU): each family's default config "
        "per layer of the benchmark table, the analytic heuristic's pick for a GPU of the arch ("
        + ", ".join(f"{arch}: {gpu}'s {sms} SMs" for arch, (gpu, sms) in TYPICAL_GPU.items())
        + "; where a performance model applies, spio runs its pick instead: for an H200, the "
        'rows marked "sm_90, model", the shipped sm_90 models\' picks). Occupancy is '
        "theoretical: "
        "resident warps per SM from ptxas' registers and the block's shared memory under the "
        f"arch's limits, as a share of the SM's maximum. {steps_note}",
        "",
        "| layer | kernel | config | arch | regs | spill B | smem B | threads | blocks/SM "
        "| occupancy | instr/step (mma, ldmatrix) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    failures = 0
    for ((name, family, config, kernel), arch, by_model), result, full_step in zip(
        jobs, results, counted, strict=True
    ):
        shown = f"{arch}, model" if by_model else arch
        if not isinstance(result, CompileResult):
            failures += 1
            lines.append(
                f"| {name} | {family.name} | {config.encode()} | {shown} | FAILED: {result} |"
            )
            continue
        usage = result.resources[kernel.entry]
        smem = usage.shared_bytes + kernel.shared_mem_bytes
        limits = LIMITS[arch]
        blocks = blocks_per_sm(limits, kernel.threads, usage.registers, smem)
        occupancy = blocks * kernel.threads / limits.threads
        spills = usage.spill_stores + usage.spill_loads
        failures += spills > 0
        lines.append(
            f"| {name} | {family.name.removeprefix('conv2d_gw8_')} | {config.encode()} | {shown} | "
            f"{usage.registers} | {spills} | {smem} | {kernel.threads} | {blocks} | "
            f"{occupancy:.0%} | {_steps(full_step, nvdisasm)} |"
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        write_atomically(args.out, text.encode())  # an earlier report stays whole until then
        print(f"wrote {args.out} ({len(jobs)} kernels)")
    else:
        print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    run_script(main)
