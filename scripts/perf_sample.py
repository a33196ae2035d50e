"""Measure every tile config of spio's kernel families over a sweep of layers on a CUDA GPU.

Appends one CSV row per (family, layer, config): family, arch, device name, driver, layer params,
config fields, median time per launch (CUDA events after warm-up, inputs rotated when they fit in
L2), effective bandwidth, spio version and the variant timed: the kernel as spio runs it on this
GPU, its rows moved by tensor copies where SPIO_TMA asks (perf_samples.kernel_variant).
scripts/train_perf_model.py trains the performance models from these rows.

Work comes in resumable chunks: rows already in the CSV for this device are skipped, and the run
stops after --budget-s seconds (at most 450, so a chunk stays under 8 minutes); repeated runs
complete a sweep. The next layer's kernels compile in parallel (spio.compiler.compile_many, cached
on disk) while the current one is timed, when that compile should end within the budget. The run
overruns the budget only if a compile takes longer than 1.25 times the slowest before it (or
the first one, which always starts). Each layer's picks (the heuristic's, the model's) come
first; with --round K the sweep takes at most K configs of each layer in turn, round after round
(each round's set drawn as without it, so resuming works the same), so that a run cut short has
sampled every layer a little rather than a few layers fully.

    python scripts/perf_sample.py --csv perf_samples.csv [--budget-s 360] [--families ...]

Needs a CUDA GPU; without one it exits with status 2 and a message.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spio.args import no_gpu, non_negative_int, positive_int, run_script

#: Chunks stay under 8 minutes: the budget is checked before each config is timed.
MAX_BUDGET_S = 450


def sweep_layers(batches=(32, 64, 128, 256), dtypes=("fp16", "bf16"), extra: int = 0, seed=0):
    """The bench layer table's shapes (spio/bench/layers.py) and two more, each at every batch
    size and dtype, plus `extra` random layers for variety."""
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P

    shapes = [
        dict(c=64, h=64, w=64, r=3, s=3),
        dict(c=128, h=32, w=32, r=3, s=3),
        dict(c=256, h=16, w=16, r=3, s=3),
        dict(c=512, h=8, w=8, r=3, s=3),
        dict(c=96, h=56, w=56, r=5, s=5),
        dict(c=192, h=28, w=28, r=5, s=5),
        dict(c=128, h=32, w=32, r=1, s=3),
        dict(c=128, h=32, w=32, r=3, s=1),
        # widths of timm regnetx_002's four stages at 224x224: its stride-1 group-width-8
        # layers are 152c 14x14 and 368c 7x7 (spio/bench/layers.py); the first two stages'
        # widths are extra shapes (odd group counts, larger images)
        dict(c=24, h=56, w=56, r=3, s=3),
        dict(c=56, h=28, w=28, r=3, s=3),
        dict(c=152, h=14, w=14, r=3, s=3),
        dict(c=368, h=7, w=7, r=3, s=3),
    ]
    layers = []
    for shape, n, dtype in itertools.product(shapes, batches, dtypes):
        pad = (shape["r"] // 2, shape["s"] // 2)
        layers.append(P(n=n, padding=pad, dtype=dtype, **shape))
    rng = random.Random(seed)
    for _ in range(extra):
        r, s = rng.choice([(3, 3), (5, 5), (1, 3), (3, 1), (1, 1), (2, 2), (4, 4), (3, 5)])
        size = rng.choice([7, 8, 14, 16, 28, 32, 56, 64])
        layers.append(
            P(
                n=rng.choice([8, 16, 32, 64, 128]),
                c=8 * rng.randint(1, 64),
                h=size,
                w=size + rng.choice([0, 0, 1, 5]),
                padding=(rng.randint(0, r // 2 + 1), rng.randint(0, s // 2 + 1)),
                r=r,
                s=s,
                has_bias=rng.random() < 0.3,
                dtype=rng.choice(list(dtypes)),
            )
        )
    return layers


def configs_to_sample(family, params, rng, max_configs: int = 0, identity=None) -> list:
    """The configs of one layer to time: every one, or `max_configs` drawn with `rng`; and
    always, first, the picks and the configs that differ from a pick only in fields its ranking
    cannot weigh
    (`unjudged_variants` of the heuristic's pick for `identity`'s machine, and of the model's where
    one applies to `identity`), so that a model trained on the samples learns those fields next to
    the configs that matter (for now: the heuristic's pick's 2, 4 and 8 images per FProp/DGrad
    block and 16 per WGrad block; the shipped models' picks', FProp's several images a block)."""
    from spio.kernels import perf_model as pm

    configs = family.configs(params)
    chosen = list(configs)
    if max_configs and len(configs) > max_configs:
        chosen = sorted(rng.sample(configs, max_configs))
    machine = identity.machine if identity is not None else pm.H200_CLASS
    rankings = [(pm.heuristic_ranking(family, params, configs, machine), None)]
    if identity is not None:
        ranked, model = pm.rank_configs(family, params, identity)
        if model is not None:
            rankings.append((ranked, model))
    first: list = []
    for ranked, model in rankings:
        for config in [ranked[0], *pm.unjudged_variants(family, model, ranked[0], configs)]:
            if config not in first:
                first.append(config)
    return first + [c for c in chosen if c not in first]


def in_rounds(work: list, size: int) -> list:
    """`work` ((family, params, configs) per layer, in sweep order) as rounds of at most `size`
    configs of each layer in turn: a budget cut short then leaves a shallower sample of every
    layer instead of a full one of the first few. 0: as it is."""
    if size <= 0:
        return list(work)
    longest = max((len(todo) for _, _, todo in work), default=0)
    return [
        (family, params, todo[start : start + size])
        for start in range(0, longest, size)
        for family, params, todo in work
        if start < len(todo)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=Path("perf_samples.csv"), help="CSV to extend")
    parser.add_argument("--budget-s", type=float, default=360.0, help="stop after this long")
    parser.add_argument("--families", nargs="+", help="kernel families (default: all)")
    parser.add_argument("--dtypes", nargs="+", choices=("fp16", "bf16"), default=["fp16", "bf16"])
    parser.add_argument("--batches", nargs="+", type=positive_int, default=[32, 64, 128, 256])
    parser.add_argument(
        "--extra-layers", type=non_negative_int, default=0, help="random layers to add"
    )
    parser.add_argument(
        "--layers", type=non_negative_int, default=0, help="only the first N layers (0: all)"
    )
    parser.add_argument(
        "--max-configs",
        type=non_negative_int,
        default=0,
        help="sample this many per layer (0: every config)",
    )
    parser.add_argument(
        "--round",
        type=non_negative_int,
        default=0,
        help="time at most this many configs of each layer in turn, round after round "
        "(0: layer by layer)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=non_negative_int, default=0, help="CUDA device ordinal")
    parser.add_argument("--warmup", type=non_negative_int, default=5)
    parser.add_argument("--repeats", type=positive_int, default=25)
    parser.add_argument(
        "--workers", type=non_negative_int, default=0, help="compile processes (0: all cores)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.budget_s <= MAX_BUDGET_S:
        parser.error(f"--budget-s must be in (0, {MAX_BUDGET_S}] seconds, got {args.budget_s}")

    start = time.monotonic()
    try:
        import torch
    except ImportError:
        print("perf_sample: needs PyTorch with CUDA; torch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        return no_gpu("perf_sample")

    import spio
    from spio.bench.timing import Rotation
    from spio.compiler import compile_many
    from spio.cuda import driver
    from spio.kernels import autotune
    from spio.kernels.conv2d_gw8_wgrad_factory import sum_kernels
    from spio.kernels.families import FAMILIES, get_family, with_tensor_copies
    from spio.kernels.perf_model import identity_of
    from spio.kernels.perf_samples import (
        Sample,
        append_samples,
        check_sample_columns,
        kernel_variant,
        read_samples,
        sample_key,
    )

    unknown = sorted(set(args.families or ()) - set(FAMILIES))
    if unknown:
        print(
            f"perf_sample: unknown families {', '.join(unknown)}; known: {', '.join(FAMILIES)}",
            file=sys.stderr,
        )
        return 2
    try:
        check_sample_columns(args.csv)  # before any timing: the rows must fit the file
    except ValueError as error:
        print(f"perf_sample: {error}", file=sys.stderr)
        return 2
    families = [get_family(name) for name in (args.families or FAMILIES)]
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    attrs = driver.device_attributes(args.device)
    major, minor = driver.driver_version()
    arch, name, drv = attrs["arch"], attrs["name"], f"{major}.{minor}"
    done = set()
    if args.csv.exists():
        try:
            done = {s.key() for s in read_samples(args.csv)[0] if s.device == name}
        except (OSError, ValueError) as error:  # e.g. a row cut off by a kill mid-append
            print(
                f"perf_sample: cannot read {args.csv}: {error}; mend or remove that row (a run "
                "stopped while it wrote leaves its last row cut off), or start a new CSV",
                file=sys.stderr,
            )
            return 2
    rng = random.Random(args.seed)
    work = []  # (family, params, configs still to measure)
    layers = sweep_layers(args.batches, args.dtypes, args.extra_layers, args.seed)
    identity = identity_of(attrs, (major, minor))
    for layer in layers[: args.layers or None]:
        for family in families:
            params = family.layer_as_run(layer)  # DGrad of a biased layer: the bias-free kernel
            configs = configs_to_sample(family, params, rng, args.max_configs, identity)
            todo = [
                c
                for c in configs
                if sample_key(family.name, name, params, c, kernel_variant(family, params, c, arch))
                not in done
            ]
            if todo:
                work.append((family, params, todo))
    work = in_rounds(work, args.round)
    total = sum(len(todo) for _, _, todo in work)
    print(f"perf_sample: {name} ({arch}, driver {drv}): {total} configs to time", flush=True)

    from tqdm import tqdm

    measured = failed = 0
    bar = tqdm(total=total, unit="config", desc="timing")

    def compile_layer(index: int):
        began = time.monotonic()
        family, params, todo = work[index]
        # As spio runs them on this GPU (tensor copies where SPIO_TMA asks: the variant says).
        kernels = [with_tensor_copies(family.make_kernel(params, c), arch) for c in todo]
        # And the sum a partials WGrad's timed call runs (its build failing fails those calls).
        sums = sum_kernels(kernels)
        jobs = [k.compile_job(arch) for k in [*kernels, *sums]]
        results = compile_many(jobs, workers=args.workers or None, progress=False)
        return kernels, results[: len(kernels)], time.monotonic() - began

    def seconds_left() -> float:
        return args.budget_s - (time.monotonic() - start)

    # Compile the next layer's kernels (in parallel processes) while this layer is timed, but
    # only when that compile should end within the budget (judged by the slowest compile so
    # far): a compile cannot be stopped once started, and waiting for it would overrun.
    slowest = 0.0
    with ThreadPoolExecutor(max_workers=1) as ahead:
        pending = ahead.submit(compile_layer, 0) if work and seconds_left() > 0 else None
        for index, (family, params, todo) in enumerate(work):
            if pending is None:
                break
            kernels, results, seconds = pending.result()
            pending = None
            slowest = max(slowest, seconds)
            if seconds_left() <= 0:
                break
            if index + 1 < len(work) and seconds_left() > 1.25 * slowest:
                pending = ahead.submit(compile_layer, index + 1)
            copies = autotune.input_copies(family.name, params, attrs["l2_cache_bytes"])
            arg_sets = Rotation(  # one round for all the configs timed on them
                autotune.kernel_inputs(family.name, params, device, seed) for seed in range(copies)
            )
            rows = []
            for config, kernel, result in zip(todo, kernels, results, strict=True):
                if seconds_left() <= 0:
                    break
                bar.update()
                if isinstance(result, BaseException):
                    print(f"perf_sample: {kernel.name} did not compile: {result}", file=sys.stderr)
                    failed += 1
                    continue
                try:
                    seconds = autotune.time_kernel(
                        family.name,
                        params,
                        kernel,
                        arg_sets,
                        device,
                        warmup=args.warmup,
                        repeats=args.repeats,
                    )
                except Exception as error:
                    print(f"perf_sample: {kernel.name} failed: {error}", file=sys.stderr)
                    failed += 1
                    continue
                rows.append(
                    Sample(
                        family=family.name,
                        arch=arch,
                        device=name,
                        driver=drv,
                        spio_version=spio.__version__,
                        synthetic=False,
                        params=params,
                        config=config,
                        seconds=seconds,
                        date=datetime.date.today().isoformat(),
                        variant=kernel_variant(family, params, config, arch),
                    )
                )
            measured += append_samples(args.csv, rows)  # after each layer: a stop loses little
            del arg_sets
    bar.close()
    left = total - measured - failed
    print(
        f"perf_sample: measured {measured}, failed {failed} (compile or launch errors, above; "
        f"not in the CSV: a later run tries them again), {left} not reached"
        f"{'; run again to continue' if left else ''}; rows in {args.csv}"
    )
    return 1 if failed else 0  # a kernel that fails to build or launch is a defect


if __name__ == "__main__":
    run_script(main)
