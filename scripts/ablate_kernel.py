"""Where a kernel's time goes: time it with parts of its work switched off, on a CUDA GPU.

For one layer and each pass, the kernel spio would pick (or --config) is timed as is and with the
ablation switches of spio/include/spio/ablation.h (SPIO_ABLATE_LOADS / _MMA / _STORES / _SYNC)
defined in its generated header. An ablated kernel computes garbage; only its time means something
(l2-256 and stagger are variants that stay correct):

    full         the real kernel
    no-stores    results kept only under an impossible condition (the work that makes them stays)
    no-mma       no tensor-core work (loads, barriers and stores stay)
    no-loads     no input-row reads (compute on whatever shared memory holds; FProp/DGrad
                 still read their weights)
    skeleton     no loads and no mma: index math, barriers and stores only
    loads-only   no mma and no global stores (the copies, ldmatrix, FProp/DGrad's output staging
                 in shared memory, waits and barriers stay)
    pipeline-only  FProp/DGrad's input pipeline alone: the row copies, waits and barriers, with
                 no ldmatrix, mma, staging or stores (run 6 read at 1.75 TB/s in loads-only where
                 the read probe's rows reached 3.3: is it the pipeline or the work beside it?)
    no-sync      no barrier per input row (warps no longer wait for each other)
    l2-256       the real kernel, its input copies asking L2 to prefetch 256 bytes (.L2::256B)
    stores-cs    FProp/DGrad, their output stored with st.global.cs (evict first): does the output
                 passing through L2 crowd out the input rows? (run 6: the stores add 12.5 µs)
    stagger      the real kernel, block b starting (b % 16) x 400 ns late: lockstep blocks stop
                 reading the same image rows at the same time
    loads-stagger  loads-only, staggered
    ldg          the real kernel, its input rows loaded into registers with plain 16-byte loads
                 and stored to shared memory (FProp/DGrad: configs whose stages - 1 divide R;
                 WGrad: any): is the per-thread cp.async path the bound?
    ldg-loads-only  loads-only, through registers
    ldg-pipeline-only  pipeline-only, through registers
    unmasked     WGrad without its careful steps (right for finite inputs; inf or NaN in x then
                 reaches more taps than in PyTorch): what the careful steps cost
    unroll-r     FProp/DGrad with the main loop unrolled by R steps only, each step dividing its
                 row for its input stage (right results): what the unroll to a multiple of the
                 stages gains (the same kernel where that unroll would be too long)
    copy-branch  WGrad with its row copies under branches, as before they were predicated and
                 the last steps copied zeros (right results): what the two changes gain
    swizzled     the real kernel with its input rows (WGrad: x and dy rows) staged pixel-major,
                 swizzled (right results; conv2d_gw8_factory.stage_layout), not group-major: a
                 warp's row copies land in contiguous bytes instead of a few chunks in each of G
                 rows. Runs 7-8 read at ~1.7 TB/s through the group-major pipeline, 2.8-3.0
                 into contiguous rows (the read probe)
    swizzled-loads-only, swizzled-pipeline-only  loads-only and pipeline-only, swizzled
    tma          the real kernel with its input rows (WGrad: x and dy rows) brought in by tensor
                 copies (sm_90's TMA: one thread copies a row, which lands swizzled, zeros
                 outside the input) into the swizzled buffers, waited for on an mbarrier a stage
                 (right results): the bulk copy engine read 3.0-3.4 TB/s in the read probe (run
                 6), cp.async rows 2.8-3.0
    tma-loads-only, tma-pipeline-only  loads-only and pipeline-only, by tensor copies
    tma-no-stores  no-stores, by tensor copies: what plain stores cost behind those loads
    tma-stores   FProp/DGrad, tma with its output rows stored by tensor copies too (one thread a
                 staged row, from swizzled staging; right results): the stores add ~12 µs over
                 no-stores (runs 6-7) where a copy moves as many bytes both ways in 38
    tma-l2-128, tma-l2-256  tma with its tensor maps asking L2 to fetch 128 or 256 bytes at once
                 (their L2 promotion; right results): CUTLASS's maps ask 128, spio's none

--config also takes a family's trial configs (WGrad's with 8 column runs a warp): correct in the
emulator, outside the space spio picks from until a GPU has timed them.

For WGrad it also times the whole wrapper both ways issue #6 asks to choose between: atomics into
a zeroed dw ("atomic+zero") and per-warp partial sums followed by a sum ("partials+sum").

If no-loads is much faster than full, the loads' latency or bandwidth bounds the kernel; if
no-mma or skeleton are close to full, issue and synchronisation do. A device copy of the pass's
bytes is timed alongside for scale, and a read-only pass (a sum) over half of them: the ceiling
for the input pipeline alone.

The "pass GB/s" column is the full pass's bytes (Conv2dStats) over that line's time, on every
line: a rate for comparing times, not what the line moved (loads-only reads only the inputs,
about half those bytes; the read line says what it read at its end).

    python scripts/ablate_kernel.py [--layer NAME-or-C,H,W[,R,S[,PAD_H,PAD_W]] ...]
                                    [--n 128] [--dtype fp16] [--passes fprop dgrad wgrad]
                                    [--config ENCODED ... | --heuristic]
"""

from __future__ import annotations

import argparse
import sys

from spio.args import no_gpu, positive_int, run_script

VARIANTS = {
    "full": (),
    "no-stores": ("SPIO_ABLATE_STORES",),
    "no-mma": ("SPIO_ABLATE_MMA",),
    "no-loads": ("SPIO_ABLATE_LOADS",),
    "skeleton": ("SPIO_ABLATE_LOADS", "SPIO_ABLATE_MMA"),
    "loads-only": ("SPIO_ABLATE_MMA", "SPIO_ABLATE_STORES"),
    "no-sync": ("SPIO_ABLATE_SYNC",),
    "l2-256": ("SPIO_L2_PREFETCH=256",),
    # FProp/DGrad's output stores as st.global.cs (streaming, evict first; correct results).
    "stores-cs": ("SPIO_STORE_STREAMING",),
    # Not ablations either: blocks start up to 15 x 400 ns apart, so that lockstep blocks stop
    # reading the same rows of their images at once.
    "stagger": ("SPIO_STAGGER_NS=400",),
    "loads-stagger": ("SPIO_ABLATE_MMA", "SPIO_ABLATE_STORES", "SPIO_STAGGER_NS=400"),
    # Input rows through registers instead of cp.async (correct results; FProp and DGrad).
    "ldg": ("SPIO_LOAD_VIA_REGS",),
    "ldg-loads-only": ("SPIO_LOAD_VIA_REGS", "SPIO_ABLATE_MMA", "SPIO_ABLATE_STORES"),
    # FProp/DGrad's input pipeline alone (copies, waits, barriers; no ldmatrix, staging or
    # stores), by cp.async and through registers: its read rate without the work beside it.
    "pipeline-only": ("SPIO_ABLATE_COMPUTE",),
    "ldg-pipeline-only": ("SPIO_LOAD_VIA_REGS", "SPIO_ABLATE_COMPUTE"),
    # WGrad without its careful steps (right for finite inputs): what keeping inf and NaN in x
    # from taps PyTorch keeps them from costs.
    "unmasked": ("SPIO_WGRAD_UNMASKED",),
    # FProp/DGrad's loop unrolled by R alone, as before the unroll to a multiple of the stages.
    "unroll-r": ("SPIO_UNROLL_BY_R",),
    # WGrad's row copies skipped by branches, as before they were predicated and the last steps
    # copied zeros.
    "copy-branch": ("SPIO_COPY_UNDER_BRANCH",),
}


#: Variants built with the input rows staged swizzled (make_kernel's `swizzled`), and the
#: VARIANTS entry whose switches they add (swizzled-pipeline-only: FProp and DGrad only).
SWIZZLED = {
    "swizzled": "full",
    "swizzled-loads-only": "loads-only",
    "swizzled-pipeline-only": "pipeline-only",
}


#: Variants whose input rows arrive by tensor copies (make_kernel's `tma`; sm_90 and newer), and
#: the VARIANTS entry whose switches they add (tma-pipeline-only: FProp and DGrad only).
TMA = {
    "tma": "full",
    "tma-loads-only": "loads-only",
    "tma-pipeline-only": "pipeline-only",
    "tma-no-stores": "no-stores",
    "tma-stores": "full",
    "tma-l2-128": "full",
    "tma-l2-256": "full",
}
#: The TMA variants whose output rows leave by tensor copies too (`tma_stores`; FProp and DGrad).
TMA_STORES = frozenset({"tma-stores"})
#: The TMA variants whose tensor maps ask L2 for more than a copy's sectors at once (make_kernel's
#: `tma_l2`, in bytes: CUTLASS's maps ask 128, spio's none).
TMA_L2 = {"tma-l2-128": 128, "tma-l2-256": 256}

#: Variants whose results must be the real kernel's: each is run once on the first input set and
#: its output compared with `full`'s (a timing of wrong results would look like a gain).
RIGHT_RESULTS = frozenset(
    {
        "swizzled",
        "tma",
        "tma-stores",
        *TMA_L2,
        "ldg",
        "l2-256",
        "stores-cs",
        "stagger",
        "unroll-r",
        "copy-branch",
    }
)


def result_of(family_name: str, params, kernel, args: list, device):
    """The output of one call of `kernel` on launch arguments `args` as spio runs it
    (autotune.pass_call), as a new fp32 tensor: FProp/DGrad's out, WGrad's dw. What the call
    writes into is NaN first (FProp/DGrad's out, shared by every variant checked on `args`;
    WGrad's partial sums), so that an element a variant leaves unwritten shows as NaN, not as
    the value an earlier kernel wrote there."""
    from spio.kernels import autotune

    if family_name.endswith("wgrad"):
        from spio.kernels.conv2d_gw8_wgrad_factory import wgrad

        return wgrad(args[2], args[3], params, kernel=kernel, poison=True)[0].float().clone()
    args[0].fill_(float("nan"))
    autotune.pass_call(family_name, params, kernel, args, device)()
    return args[0].float().clone()


def difference(reference, result, exact: bool) -> str | None:
    """None where `result` is `reference` (bit for bit with `exact`, else to 1e-3 of its largest
    magnitude: WGrad's atomics add in any order), else what differs."""
    import torch

    if torch.equal(reference, result):
        return None
    scale = reference.abs().max().item() or 1.0
    worst = (reference - result).abs().max().item()
    nan = bool(torch.isnan(result).any())
    if not exact and not nan and worst <= 1e-3 * scale:
        return None
    return f"max |difference| {worst:.3g}, max |full| {scale:.3g}" + (", NaN" if nan else "")


def build_variant(kernel, name: str):
    """`kernel` as variant `name` (of VARIANTS, SWIZZLED or TMA): the SWIZZLED and TMA ones are
    its factory's rebuild with other input buffers, plus their partner's switches."""
    if name not in SWIZZLED and name not in TMA:
        return kernel.with_defines(VARIANTS[name])
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    factory = {fd.SOURCE_FILE: fd, wg.SOURCE_FILE: wg}[kernel.source_file]
    if name in SWIZZLED:
        return factory.with_swizzled_stages(kernel).with_defines(VARIANTS[SWIZZLED[name]])
    if name in TMA_STORES:  # FProp/DGrad's alone (variant_applies)
        return fd.with_tma_stages(kernel, stores=True).with_defines(VARIANTS[TMA[name]])
    l2 = TMA_L2.get(name, 0)
    return factory.with_tma_stages(kernel, l2=l2).with_defines(VARIANTS[TMA[name]])


def first_line(error: BaseException) -> str:
    """The first line of `error`'s message (at most 120 characters), for a line of the table."""
    lines = str(error).strip().splitlines() or ["(no message)"]
    return lines[0][:120]


COLUMNS = (
    "µs: median time per call; pass GB/s: the full pass's bytes over that time, on every line "
    "(a rate for comparing times, not what the variant moved); vs full: time over full's."
)


def row(pass_: str, name: str, seconds: float, nbytes: int, full: float | None, note: str) -> str:
    """One line of the table: `nbytes` are the pass's, whatever the variant moved."""
    ratio = f"{seconds / full:8.2f}" if full else " " * 8
    return (
        f"{pass_:6s} {name:14s} {seconds * 1e6:6.1f} {nbytes / seconds / 1e9:9.0f} {ratio}  {note}"
    )


def variant_applies(name: str, pass_: str, params, config) -> bool:
    """Whether variant `name` can build for this pass and config: FProp and DGrad's `ldg` index
    their register slots by the R-step unroll, so it needs stages - 1 to divide R; `unmasked` and
    `copy-branch` are WGrad's alone, `unroll-r`, `stores-cs`, `tma-stores` and the
    `pipeline-only` ones FProp and DGrad's."""
    fprop_dgrad = name.endswith("pipeline-only") or name in ("stores-cs", *TMA_STORES)
    if fprop_dgrad and pass_ not in ("fprop", "dgrad"):
        return False
    if name.startswith("ldg") and pass_ in ("fprop", "dgrad"):
        return params.r % (config.stages - 1) == 0
    if name in ("unmasked", "copy-branch"):
        return pass_ == "wgrad"
    if name == "unroll-r":
        return pass_ in ("fprop", "dgrad")
    return True


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=COLUMNS)
    parser.add_argument(
        "--layer",
        nargs="+",
        default=["64c_64x64_3x3"],
        help="layers: names from the bench table, or shapes C,H,W[,R,S[,PAD_H,PAD_W]] "
        "(padding R//2, S//2 by default)",
    )
    parser.add_argument("--n", type=positive_int, default=128, help="batch size")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument(
        "--passes",
        nargs="+",
        choices=("fprop", "dgrad", "wgrad"),
        default=["fprop", "dgrad", "wgrad"],
    )
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--config",
        nargs="+",
        help="encoded tile configs to time, from the config space or on trial (e.g. WGrad's "
        "warp_q8 8; default: spio's choice)",
    )
    choice.add_argument(
        "--heuristic",
        action="store_true",
        help="time each layer's config by the analytic heuristic (what GPUs without a "
        "performance model run) instead of spio's choice on this GPU",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=[*VARIANTS, *SWIZZLED, *TMA],
        default=[*VARIANTS, *SWIZZLED, *TMA],
        help="ablation variants to time (default: all; full is always timed, first)",
    )
    parser.add_argument("--repeats", type=positive_int, default=50)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        return no_gpu("ablate_kernel")

    from spio.bench.layers import parse_layer

    try:
        layers = [parse_layer(text) for text in args.layer]
    except ValueError as error:
        print(f"ablate_kernel: {error}", file=sys.stderr)
        return 2
    worst = 0
    for layer in layers:
        status = ablate_layer(args, layer)
        if status == 2:
            return status
        worst = max(worst, status)
    return worst


def ablate_layer(args, layer) -> int:
    """Times the variants of each pass of one layer; 0, 1 where a variant did not build (the
    others are timed), or 2 for a config the layer lacks."""
    import torch

    from spio.bench.run import copy_call, copy_pairs
    from spio.bench.timing import Rotation, time_calls
    from spio.compiler import compile_many
    from spio.compiler.arch import has_bulk_copies
    from spio.cuda import driver
    from spio.kernels import autotune
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels.families import FAMILY_OF_PASS
    from spio.kernels.perf_model import device_identity, select_config
    from spio.kernels.stats import Conv2dStats

    params = layer.params(args.n, args.dtype)
    device = torch.device("cuda", torch.cuda.current_device())
    attrs = driver.device_attributes(device.index)
    stats = Conv2dStats(params)
    tensor_copies = has_bulk_copies(attrs["arch"])
    print(f"{attrs['name']} ({attrs['arch']}), layer {layer.name} N={args.n} {args.dtype}")
    # Every kernel of every pass and config first, then one parallel compile of them all: one
    # compile per config had left most workers idle (a config has a few variants).
    plan: dict[str, list[tuple[object, dict]]] = {}  # pass -> [(config, {variant: kernel})]
    status = 0
    for pass_ in args.passes:
        family = FAMILY_OF_PASS[pass_]
        if args.config:
            configs = named_configs(family, params, args.config)
            if configs is None:
                return 2
        elif args.heuristic:  # for this GPU's SMs and limits, as spio ranks without a model
            configs = [family.default_config(params, machine=device_identity(device).machine)]
        else:  # the config spio's get_kernel would use on this GPU
            configs = [select_config(_factory_of(family), params, device, **_options(family))]
        plan[pass_] = []
        for config in configs:
            base = family.make_kernel(params, config)
            # "full" first: the "vs full" column divides by it.
            names = ["full"] + [name for name in args.variants if name != "full"]
            skipped = [n for n in names if not variant_applies(n, pass_, params, config)]
            if skipped:
                print(f"{pass_:6s} {', '.join(skipped)}: not for {config.encode()} (see --help)")
            early = [n for n in names if n in TMA and n not in skipped and not tensor_copies]
            if early:
                print(f"{pass_:6s} {', '.join(early)}: tensor copies need sm_90 or newer")
                skipped += early
            kernels = {}
            for n in names:
                if n in skipped:
                    continue
                try:
                    kernels[n] = build_variant(base, n)
                except ValueError as error:  # e.g. tensor copies' stages past shared memory
                    print(f"{pass_:6s} {n:14s} not built: {error}")
                    status = 1
            plan[pass_].append((config, kernels))
    every = [k for configs in plan.values() for _, kernels in configs for k in kernels.values()]
    # With the sums that partials WGrad variants' timed calls run (built, not reported).
    sums = wg.sum_kernels(every)
    jobs = [k.compile_job(attrs["arch"]) for k in [*every, *sums]]
    results = compile_many(jobs, progress=False)[: len(every)]
    # A variant that does not build is reported on its line; the others are still timed.
    failed = {
        id(kernel): result
        for kernel, result in zip(every, results, strict=True)
        if isinstance(result, BaseException)
    }
    print(f"{'pass':6s} {'variant':14s} {'µs':>6s} {'pass GB/s':>9s} {'vs full':>8s}  config")
    for pass_, configs in plan.items():
        family = FAMILY_OF_PASS[pass_]
        nbytes = stats.bytes(pass_)
        copies = autotune.input_copies(family.name, params, attrs["l2_cache_bytes"])
        # One round of the input sets for every variant timed (Rotation): none starts on sets
        # the one before it has just read.
        arg_sets = Rotation(
            autotune.kernel_inputs(family.name, params, device, s) for s in range(copies)
        )
        for config, kernels in configs:
            full = None
            reference = None  # full's output, for the variants that must compute the same
            for name, kernel in kernels.items():
                if id(kernel) in failed:
                    print(f"{pass_:6s} {name:14s} did not build: {first_line(failed[id(kernel)])}")
                    status = 1
                    continue
                try:
                    seconds = autotune.time_kernel(
                        family.name, params, kernel, arg_sets, device, repeats=args.repeats
                    )
                except Exception as error:  # e.g. a tensor map the driver refuses: the rest run
                    kind = type(error).__name__
                    print(f"{pass_:6s} {name:14s} failed: {kind}: {first_line(error)}")
                    status = 1
                    continue
                if name == "full":
                    full = seconds
                print(row(pass_, name, seconds, nbytes, full, config.encode()))
                checked = name == "full" or name in RIGHT_RESULTS
                if arg_sets and checked and (name == "full" or reference is not None):
                    try:
                        result = result_of(family.name, params, kernel, arg_sets[0], device)
                    except Exception as error:
                        print(f"{pass_:6s} {name:14s} results not checked: {first_line(error)}")
                        status = 1
                        continue
                    if name == "full":
                        reference = result
                    elif wrong := difference(reference, result, exact=pass_ != "wgrad"):
                        print(f"{pass_:6s} {name:14s} WRONG results: {wrong}")
                        status = 1
            if pass_ == "wgrad" and full is None:  # its wrappers would run the same code
                print(f"{pass_:6s} reductions not timed: the config's kernel did not build")
            elif pass_ == "wgrad":  # issue #6: atomics into zeroed dw, or per-warp partials + a sum
                for name, seconds in time_wgrad_reductions(
                    params, config, arg_sets, attrs["arch"], args.repeats
                ).items():
                    # The sum alone moves its own bytes: the slots read, dw (and dbias) written.
                    moved = nbytes if name != "sum alone" else sum_bytes(params, config)
                    print(row(pass_, name, seconds, moved, full, REDUCTION_NOTES[name]))
        # The copy's pairs rotate as the kernels' inputs do, so neither finds its data in L2.
        pairs = copy_pairs(nbytes, torch.float16, device, attrs["l2_cache_bytes"])
        moved = 2 * pairs[0][0].nbytes
        timing = time_calls(copy_call(pairs), warmup=3, reps=args.repeats)
        copy = timing.median_ms * 1e-3
        print(row(pass_, "copy", copy, nbytes, None, f"moves {moved / 1e6:.1f} MB"))
        # A read-only pass over the copy's sources (a sum): the ceiling for the input pipeline
        # alone (loads-only reads the pass's inputs, about half its bytes).
        timing = time_calls(
            lambda i, p=pairs: p.take()[0].sum(dtype=torch.float32),
            warmup=3,
            reps=args.repeats,
        )
        read = timing.median_ms * 1e-3
        note = f"reads {moved / 2e6:.1f} MB: {moved / 2 / read / 1e9:.0f} GB/s"
        print(row(pass_, "read", read, nbytes, None, note))
    return status


def named_configs(family, params, names: list[str]) -> list | None:
    """The configs `names` of `family` for `params`, from its space or on trial (spio never
    runs those: each is said); None, having said which, if the layer lacks any."""
    configs, missing = [], []
    for name in names:
        try:
            configs.append(family.config_named(params, name, trial=True))
        except ValueError:
            missing.append(name)
    if missing:
        print(f"{family.pass_}: no config {', '.join(missing)} for this layer", file=sys.stderr)
        return None
    space = family.configs(params)
    for config in (c for c in configs if c not in space):
        name = config.encode()
        print(f"{family.pass_:6s} {name}: a trial config, outside the space spio picks from")
    return configs


#: What each of time_wgrad_reductions' timings covers.
REDUCTION_NOTES = {
    "atomic+zero": "whole wrapper, as autograd calls it",
    "partials+sum": "whole wrapper, as autograd calls it",
    "sum alone": "sum_slots over the config's slots (zeros), as the wrapper launches it",
}


def sum_bytes(params, config) -> int:
    """Bytes sum_slots moves for a partials WGrad of `config`: every slot read, one written."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    slots = wg.partial_slots(params, config)
    return wg.partial_bytes(params, config) * (slots + 1) // slots


def time_wgrad_reductions(params, config, arg_sets, arch, repeats) -> dict[str, float]:
    """Seconds per call of the WGrad wrapper with atomics (dw zeroed first) and with per-warp
    partial sums (then summed), on the inputs of arg_sets (rotated, continuing a Rotation's
    round); and of the sum alone, on partial-sum buffers of the config's slots
    (REDUCTION_NOTES)."""
    import torch

    from spio.bench.timing import Rotation, time_calls
    from spio.compiler import compile_many
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    atomic = wg.make_kernel(params, config, partials=False)
    partials = wg.make_kernel(params, config, partials=True)
    # (With the sum partials' calls run after it.)
    compile_many([k.compile_job(arch) for k in wg.with_sums([atomic, partials])], progress=False)
    rotation = Rotation.of(arg_sets)
    results = {}
    for name, kernel in (("atomic+zero", atomic), ("partials+sum", partials)):

        def call(i: int, kernel=kernel) -> None:
            x, dy = rotation.take()[2:4]
            wg.wgrad(x, dy, params, kernel=kernel)

        results[name] = time_calls(call, warmup=3, reps=repeats).median_ms * 1e-3
    device = arg_sets[0][2].device
    slots = wg.partial_slots(params, config)
    dw_size, c = wg.slot_columns(params)
    summing = wg.sum_kernel(params)
    args = [
        torch.empty(params.weight_shape, device=device),
        torch.empty(c, device=device) if c else None,
        torch.zeros(slots * dw_size, device=device),
        torch.zeros(slots * c, device=device) if c else None,
        slots,
        0,
    ]
    timing = time_calls(lambda i: summing.launch(args, device), warmup=3, reps=repeats)
    results["sum alone"] = timing.median_ms * 1e-3
    return results


def _factory_of(family):
    from spio.kernels.conv2d_gw8_factory import conv2d_gw8_kernel_factory
    from spio.kernels.conv2d_gw8_wgrad_factory import conv2d_gw8_wgrad_kernel_factory

    return conv2d_gw8_wgrad_kernel_factory if family.pass_ == "wgrad" else conv2d_gw8_kernel_factory


def _options(family) -> dict:
    return {"igrad": True} if family.pass_ == "dgrad" else {}


if __name__ == "__main__":
    run_script(main)
