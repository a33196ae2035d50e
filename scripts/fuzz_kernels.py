"""Random layers, tile configs and kernel variants in the CPU emulator, against float64 references.

The tests emulate fixed layers (tests/kernels/conv2d_gw8_cases.py) with sampled configs; this
draws everything at random instead, for as long as it is given: a layer (R, S, each side's
padding, odd and tiny images, batch, groups, bias, fp16 or bf16), a pass, one of its configs
and a variant (FProp/DGrad: operands as a half model holds them, swizzled stages, input rows by
tensor copies, output rows too; WGrad: per-warp partial sums or atomics, swizzled, tensor
copies), and checks the kernel on random inputs into NaN-poisoned outputs at the tolerance
spio check uses (spio.check.run_one; hazard checks on), with its blocks and threads run in a
shuffled order and its shared memory at a random 16-byte offset, as a GPU may run and place
them. Each case is drawn from (--seed, its index) alone, so a failure's line reproduces it:
`--seed S --case I`. The kernels of --batch cases are built in parallel (SPIO_WORKERS) before
they run. With --device cuda the cases run on the GPU instead (tensor copies only where it has
them, sm_90; a sticky CUDA error ends the run, naming the case to go on from). Exit 1 on any
failure, 2 for --device cuda without a GPU.

    python scripts/fuzz_kernels.py --minutes 60            # until an hour is up
    python scripts/fuzz_kernels.py --seed 3 --case 41      # one case again
    python scripts/fuzz_kernels.py --device cuda --minutes 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import random
import time
import traceback
from collections.abc import Iterator

from spio.args import no_gpu, non_negative_int, positive_float, positive_int, run_script

PASSES = ("fprop", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn case: the layer, pass, config and the kernel variant's flags."""

    index: int
    params: object  # Conv2dGw8Params
    pass_: str
    config: object
    held: bool  # FProp/DGrad: channels_last weights (+ a half bias); WGrad: half, channels_last dw
    partials: bool  # WGrad: per-warp partial sums and sum_slots (else atomics)
    swizzled: bool
    tma: bool  # input rows by tensor copies (implies swizzled)
    tma_stores: bool  # FProp/DGrad: output rows by tensor copies too
    # How the emulator runs it: blocks and threads in an order shuffled by this seed, dynamic
    # shared memory this many bytes past a 1024-byte boundary (as a GPU may place it).
    order_seed: int
    shared_offset: int

    def line(self) -> str:
        flags = [name for name in ("held", "swizzled", "tma", "tma_stores") if getattr(self, name)]
        if self.pass_ == "wgrad":
            flags.insert(0, "partials" if self.partials else "atomic")
        return (f"{self.pass_} {self.params.encode()} {self.config.encode()} "
                f"[{' '.join(flags) or 'plain'}] order {self.order_seed} "
                f"smem +{self.shared_offset}")  # fmt: skip


def draw_layer(rng: random.Random):
    """A random layer small enough to emulate in seconds: mostly tiny images, sometimes one wide
    or tall enough for several tiles, batches for several images a block (up to 17), up to 16
    groups."""
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    r, s = rng.randint(1, 5), rng.randint(1, 5)
    # Each side padded from 0 to past its filter (DGrad's padding R-1-pad goes negative).
    pad_h, pad_w = rng.randint(0, r + 2), rng.randint(0, s + 2)
    big = rng.random() < 0.2
    h = rng.randint(max(1, r - 2 * pad_h), 40 if big else 12)
    w = rng.randint(max(1, s - 2 * pad_w), 72 if big else 20)
    # Batches that fill blocks of 2, 4, 8 and 16 images, and that leave the last one part empty.
    n = rng.choice((1, 1, 2, 3, 4, 5, 8, 9, 16, 17)) if not big else 1
    groups = rng.choice((1, 1, 2, 2, 3, 4, 5, 8, 16)) if not big else rng.randint(1, 3)
    return Conv2dGw8Params(
        n=n,
        c=8 * groups,
        h=h,
        w=w,
        padding=(pad_h, pad_w),
        r=r,
        s=s,
        has_bias=rng.random() < 0.5,
        dtype=rng.choice(("fp16", "bf16")),
    )


def draw_case(seed: int, index: int) -> Case:
    """Case `index` of run `seed`: the same two numbers give the same case."""
    from spio.kernels.families import FAMILY_OF_PASS

    rng = random.Random(f"{seed}:{index}")
    params = draw_layer(rng)
    pass_ = rng.choice(PASSES)
    config = rng.choice(FAMILY_OF_PASS[pass_].configs(params))
    tma = rng.random() < 0.4
    return Case(
        index=index,
        params=params,
        pass_=pass_,
        config=config,
        held=rng.random() < 0.5,
        partials=pass_ == "wgrad" and rng.random() < 0.7,
        swizzled=tma or rng.random() < 0.3,
        tma=tma,
        tma_stores=tma and pass_ != "wgrad" and rng.random() < 0.5,
        order_seed=rng.randrange(1, 2**31),
        shared_offset=16 * rng.randrange(64),
    )


def build(case: Case, arch: str | None = None):
    """The case's kernel as run_one launches it (held FProp/DGrad: the variant reading
    channels_last weights, and a half bias), or None where it cannot run: tensor copies on a
    GPU without them (`arch`: the GPU's; None, the emulator, runs them all), or stages that do
    not fit shared memory with them (make_kernel refuses those; spio runs such a config with
    cp.async)."""
    from spio.check import held_layout
    from spio.compiler.arch import has_bulk_copies
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    if case.tma and arch is not None and not has_bulk_copies(arch):
        return None
    try:
        if case.pass_ == "wgrad":
            return wg.make_kernel(case.params, case.config, partials=case.partials,
                                  swizzled=case.swizzled, tma=case.tma)  # fmt: skip
        layout = held_layout(case.params, case.pass_) if case.held else (False, False)
        weights_cl, bias_elem = layout
        return fd.make_kernel(case.params, case.config, igrad=case.pass_ == "dgrad",
                              weights_cl=weights_cl, bias_elem=bias_elem, swizzled=case.swizzled,
                              tma=case.tma, tma_stores=case.tma_stores)  # fmt: skip
    except ValueError as error:
        if case.tma and "shared memory" in str(error):
            return None
        raise


def prebuild(cases: list[Case], device: str, arch: str | None) -> None:
    """Builds the cases' kernels in parallel into the disk cache (SPIO_WORKERS processes or
    threads), so that each case's run only loads them; a case whose kernel cannot be made or
    built fails at its run, which makes or builds it again."""
    import torch

    from spio.check import launched_by_run
    from spio.kernels.kernel import build_kernels

    kernels = []
    for case in cases:
        try:
            kernel = build(case, arch)
        except Exception:  # its run reports it
            continue
        if kernel is not None:
            kernels += launched_by_run(kernel, case.held)
    build_kernels(kernels, torch.device(device), progress=False)


def run_case(case: Case, device: str = "cpu", arch: str | None = None) -> tuple[str, str]:
    """("pass" | "fail" | "unfit" | "lost", detail) of one case on `device` ("cpu", the
    emulator, or "cuda", whose `arch` it is). "lost": a failure that left the GPU unusable for
    the rest of the process (a sticky CUDA error)."""
    from spio.check import _sticky, run_one

    try:
        kernel = build(case, arch)
    except Exception:  # a kernel spio would make for this config: a failure, not a stop
        return "fail", traceback.format_exc(limit=-3).rstrip()
    if kernel is None:
        if case.tma and arch is not None:
            return "unfit", f"no tensor copies on {arch}"
        return "unfit", "stages do not fit shared memory with tensor copies"
    # (Read at each emulated launch; a GPU ignores them.)
    emulation = {"SPIO_EMULATOR_ORDER_SEED": str(case.order_seed),
                 "SPIO_EMULATOR_SHARED_OFFSET": str(case.shared_offset)}  # fmt: skip
    try:
        with environment(emulation):
            ratio = run_one(case.params, case.pass_, case.config, device, seed=case.index,
                            kernel=kernel, as_held=case.held)  # fmt: skip
    except Exception as error:  # any error is a failure to report, not a reason to stop the run
        lost = device != "cpu" and _sticky(error, device)
        return "lost" if lost else "fail", traceback.format_exc(limit=-3).rstrip()
    if ratio <= 1.0:
        return "pass", f"{ratio:.3f} of the tolerance"
    return "fail", f"worst error {ratio:.3g} times the tolerance"


@contextlib.contextmanager
def environment(settings: dict[str, str]):
    """The environment variables `settings` set meanwhile; the caller's back afterwards."""
    kept = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in kept.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a fuzzing run (this script's and scripts/fuzz_layers.py's): which cases,
    for how long, on which device."""
    parser.add_argument("--seed", type=non_negative_int, default=0, help="the run's seed")
    parser.add_argument("--minutes", type=positive_float, default=10.0,
                        help="stop drawing cases after this long (default 10)")  # fmt: skip
    parser.add_argument("--cases", type=positive_int, help="stop after this many cases")
    parser.add_argument("--first", type=non_negative_int, default=0,
                        help="index of the first case (to go on from an earlier run)")  # fmt: skip
    parser.add_argument("--case", type=non_negative_int, help="run case CASE of --seed alone")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the emulator (default); cuda: the GPU")  # fmt: skip


def case_indices(args: argparse.Namespace) -> Iterator[int]:
    """The indices of the cases a run's options ask for (add_run_options), in order."""
    if args.case is not None:
        return iter([args.case])
    if args.cases is not None:
        return iter(range(args.first, args.first + args.cases))
    return itertools.count(args.first)


def print_failures(script: str, args: argparse.Namespace, failed: list[str]) -> None:
    """A line a failed case (its `--seed S --case I` and description): the command that runs
    it again."""
    where = "" if args.device == "cpu" else f" --device {args.device}"
    for line in failed:
        print(f"failed: python scripts/{script}{where} {line}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_options(parser)
    parser.add_argument("--batch", type=positive_int, default=16,
                        help="cases whose kernels are built in parallel (default 16)")  # fmt: skip
    return parser.parse_args(argv)


def device_arch(device: str) -> str | None:
    """The GPU's arch for "cuda" (e.g. sm_90); None for the emulator."""
    if device == "cpu":
        return None
    import torch

    from spio.cuda import driver
    from spio.kernels.kernel import cuda_ordinal

    return driver.device_attributes(cuda_ordinal(torch.device(device)))["arch"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return no_gpu("fuzz_kernels")
    arch = device_arch(args.device)
    indices = case_indices(args)
    deadline = time.monotonic() + 60 * args.minutes
    counts = {"pass": 0, "fail": 0, "unfit": 0}
    failed = []
    lost = False
    while not lost and (args.case is not None or time.monotonic() < deadline):
        cases = [draw_case(args.seed, index) for index in itertools.islice(indices, args.batch)]
        if not cases:
            break
        prebuild(cases, args.device, arch)
        for case in cases:
            if args.case is None and time.monotonic() > deadline:
                break
            started = time.monotonic()
            outcome, detail = run_case(case, args.device, arch)
            lost = outcome == "lost"
            counts["fail" if lost else outcome] += 1
            print(f"case {case.index}: {outcome} in {time.monotonic() - started:.1f} s: "
                  f"{case.line()}: {detail}", flush=True)  # fmt: skip
            if outcome in ("fail", "lost"):
                failed.append(f"--seed {args.seed} --case {case.index}: {case.line()}")
            if lost:
                print(f"the GPU is unusable in this process after that error (a sticky CUDA "
                      f"error): go on with --first {case.index + 1}")  # fmt: skip
                break
        if args.case is not None:
            break
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['unfit']} did not fit "
          f"(seed {args.seed}, {arch or 'emulator'})")  # fmt: skip
    print_failures("fuzz_kernels.py", args, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
