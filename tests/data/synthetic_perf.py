"""SYNTHETIC perf samples for the performance-model tests: a known formula plus noise, no GPU.

The run time of a config comes from `synthetic_seconds`, a made-up but structured machine model
(DRAM traffic with halo, tile overrun and sector waste; latency cover from resident blocks and
row stages; wave quantisation; tensor-core work; WGrad atomics; launch overhead). The tests train
on `synthetic_perf_samples.csv` and check that the model ranks configs as this formula does.
Nothing here describes a real GPU; never train a shipped model from it.

Regenerate the CSV (after the kernels' configs change) from the repository root with

    python -m tests.data.synthetic_perf
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels import conv2d_gw8_wgrad_factory as wg
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.kernels.families import FAMILIES
from spio.kernels.perf_samples import Sample, append_samples
from tests.conftest import load_script

CSV_PATH = Path(__file__).with_name("synthetic_perf_samples.csv")
DEVICE = "SYNTHETIC (no GPU)"
ARCH = "sm_90"
NOISE = 0.03  # sigma of the log-normal noise on every time
HEADER = (
    "# SYNTHETIC data for tests only: times come from tests/data/synthetic_perf.py (a formula "
    "plus 3% noise), not from any GPU. Never train a shipped model from this file.\n"
)

# The made-up machine.
SMS = 132
DRAM_BYTES_PER_S = 3.0e12
MMA_FLOPS = 250e12
IN_FLIGHT_BYTES = 48 * 1024
LAUNCH_S = 3e-6


def synthetic_seconds(family: str, params: Conv2dGw8Params, config) -> float:
    """Noise-free synthetic run time of one config of `family` on `params`."""
    fam = FAMILIES[family]
    g, r, s = params.groups, params.r, params.s
    cg, bp, bq = config.groups, config.block_p, config.block_q
    bn = config.block_n
    if family == "conv2d_gw8_wgrad":
        out_h, out_w = params.p, params.q
        smem = wg.shared_mem_bytes(params, config)
    else:
        out_h, out_w = (params.h, params.w) if fam.pass_ == "dgrad" else (params.p, params.q)
        smem = fd.shared_mem_bytes(params, config)
    blocks = (
        math.ceil(params.n / bn) * math.ceil(out_h / bp) * math.ceil(out_w / bq) * math.ceil(g / cg)
    )
    pixels_in = (bp + r - 1) * (bq + s - 1)
    sector = 2.0 if cg == 1 and g > 1 else 1.0
    dram = blocks * bn * (pixels_in + bp * bq) * cg * 16 * sector
    per_sm = max(1, min(16, 2048 // config.threads, (228 * 1024) // (smem + 1024)))
    resident = min(per_sm, math.ceil(blocks / SMS))
    in_flight = resident * (config.stages - 1) * cg * (bq + s - 1) * 16
    cover = min(1.0, blocks / SMS) * min(1.0, in_flight / IN_FLIGHT_BYTES) ** 0.5
    waves = blocks / (SMS * per_sm)
    tail = math.ceil(waves) / waves if waves > 0 else 1.0
    mma = blocks * bn * bp * bq * cg * 8 * 8 * r * s * 2 / MMA_FLOPS
    # mma_k = 16 issues half the mma instructions: faster tensor work, a little less issue overhead.
    k16 = getattr(config, "mma_k", 8) == 16
    mma *= 0.6 if k16 else 1.0
    issue = 1.0 if k16 else 1.04
    seconds = issue * max(dram / DRAM_BYTES_PER_S / max(cover, 0.1), mma) * (1 + 0.25 * (tail - 1))
    if family == "conv2d_gw8_wgrad":
        seconds += blocks * config.warps * 32 * r * s / 2e12  # fp32 atomics of partial sums
    return seconds + LAUNCH_S


def synthetic_layers(count: int, seed: int) -> list[Conv2dGw8Params]:
    """`count` distinct random layers (shapes, filters, paddings, bias, dtype)."""
    rng = random.Random(seed)
    layers: dict[str, Conv2dGw8Params] = {}
    while len(layers) < count:
        r, s = rng.choice([(3, 3), (3, 3), (5, 5), (1, 3), (3, 1), (1, 1), (2, 4)])
        size = rng.choice([7, 8, 14, 16, 28, 32, 56])
        params = Conv2dGw8Params(
            n=rng.choice([4, 8, 16, 32, 64]),
            c=rng.choice([8, 16, 32, 64, 96, 128, 256, 512]),
            h=size,
            w=size + rng.choice([0, 0, 3]),
            padding=(r // 2, s // 2),
            r=r,
            s=s,
            has_bias=rng.random() < 0.3,
            dtype=rng.choice(["fp16", "bf16"]),
        )
        layers[params.encode()] = params
    return list(layers.values())


def synthetic_samples(layers: int = 24, configs_per_layer: int = 80, seed: int = 0) -> list[Sample]:
    """Samples of every family on `layers` random layers, `configs_per_layer` random configs
    each, with log-normal noise."""
    rng = random.Random(seed + 1)
    samples = []
    for params in synthetic_layers(layers, seed):
        for family in FAMILIES.values():
            configs = family.configs(params)
            for config in rng.sample(configs, min(configs_per_layer, len(configs))):
                seconds = synthetic_seconds(family.name, params, config)
                samples.append(
                    Sample(
                        family=family.name,
                        arch=ARCH,
                        device=DEVICE,
                        driver="0.0",
                        spio_version="synthetic",
                        synthetic=True,
                        params=params,
                        config=config,
                        seconds=seconds * math.exp(rng.gauss(0.0, NOISE)),
                        date="synthetic",
                    )
                )
    return samples


def write_csv(path: Path = CSV_PATH, **kwargs) -> int:
    """(Re)write the synthetic CSV: the SYNTHETIC comment line, the header row, the samples."""
    body = path.with_suffix(".tmp")
    body.unlink(missing_ok=True)
    count = append_samples(body, synthetic_samples(**kwargs))
    path.write_text(HEADER + body.read_text())
    body.unlink()
    return count


def train_models(out: Path, *args: str) -> int:
    """Run scripts/train_perf_model.py on the synthetic CSV into `out`; returns its exit status."""
    return load_script("train_perf_model").main([str(CSV_PATH), "--out", str(out), *args])


if __name__ == "__main__":
    print(f"wrote {write_csv()} synthetic samples to {CSV_PATH}")
