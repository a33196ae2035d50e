"""Shared cases for the conv2d_gw8 kernel tests: layers, config samples, and one checked run.

Layers are small enough for the CPU emulator yet cover what the kernels must get right: all
filter sizes, padding 0, R//2 and larger than R (negative DGrad padding), odd sizes, images
smaller than a tile, several groups per block with a partial last block, batches of small
images (several images per block, the last block partly past the batch), bias, fp16 and bf16.
"""

from __future__ import annotations

import os
import random
import re

from spio.check import configs_to_run, run_one
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.kernels.families import FAMILIES, FAMILY_OF_PASS
from spio.kernels.layer_sets import compile_layer_set
from tests.conftest import load_script

P = Conv2dGw8Params

#: Layers every CI run emulates (each with its default config and sampled configs).
CI_LAYERS = [
    P(n=1, c=16, h=6, w=5, padding=1, r=3, s=3, has_bias=True),
    P(n=2, c=8, h=9, w=20, padding=(0, 2), r=1, s=5, has_bias=True),  # R = 1 with dbias
    P(n=1, c=24, h=7, w=19, padding=4, r=3, s=3),  # padding > R: DGrad pads by R-1-4 < 0
    P(n=1, c=16, h=11, w=10, padding=(2, 1), r=5, s=2, dtype="bf16", has_bias=True),
    P(n=1, c=40, h=5, w=33, padding=(1, 0), r=2, s=4),  # 5 groups: partial group blocks
    P(n=2, c=8, h=4, w=4, padding=0, r=4, s=1, dtype="bf16"),
    P(n=9, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True),  # 2, 4, 8 images per block
    P(n=1, c=16, h=5, w=70, padding=(1, 2), r=3, s=5),  # 70 columns: 64-column tiles
]

#: Wider sweep for `pytest -m slow`: every filter size and more shapes.
SLOW_LAYERS = [
    P(n=1, c=16, h=9, w=11, padding=(r // 2, s // 2), r=r, s=s, dtype=dtype, has_bias=bias)
    for r in range(1, 6)
    for s in range(1, 6)
    for dtype, bias in (("fp16", r % 2 == 1), ("bf16", s % 2 == 0))
] + [
    P(n=3, c=64, h=20, w=19, padding=1, r=3, s=3, has_bias=True),
    P(n=1, c=8, h=49, w=33, padding=2, r=5, s=5),
    P(n=2, c=128, h=6, w=5, padding=6, r=3, s=3, dtype="bf16"),
    # Batches of small images, for several images per FProp/DGrad block.
    P(n=9, c=32, h=7, w=7, padding=1, r=3, s=3, has_bias=True),
    P(n=11, c=24, h=4, w=9, padding=2, r=5, s=3, dtype="bf16"),
    P(n=8, c=16, h=3, w=3, padding=0, r=2, s=2),
]


#: Configs per layer in the `slow` sweep; SPIO_TEST_ALL_CONFIGS=1 runs every config (hours).
SLOW_CONFIGS = None if os.environ.get("SPIO_TEST_ALL_CONFIGS") == "1" else 4


def sample_configs(params: Conv2dGw8Params, pass_: str, count: int | None, seed: int) -> list:
    """The pass's default config plus `count` others drawn reproducibly (None: every config)."""
    if count is None:
        return list(FAMILY_OF_PASS[pass_].configs(params))
    return configs_to_run(params, pass_, count, seed)


def check(params: Conv2dGw8Params, pass_: str, config, device: str, seed: int = 0) -> None:
    """Run one kernel on random inputs into NaN-poisoned outputs and compare with the float64
    reference at the tolerance derived from accumulation depth (spio.check.run_one)."""
    ratio = run_one(params, pass_, config, device, seed)
    assert ratio <= 1.0, (
        f"{pass_} {params.encode()} {config}: worst error {ratio:.3g} times the tolerance"
    )


def assert_sample_compiles_without_spills(family: str, arch: str, count: int, seed: int) -> None:
    """Compile `count` kernels of `family` (one random config of each built-in layer, then a
    random subset) for `arch`: each must build without a compiler warning, spill nothing and
    fit the register file."""
    from spio.compiler import compile_many

    rng = random.Random(seed)
    fam = FAMILIES[family]
    kernels = [fam.make_kernel(p, rng.choice(fam.configs(p))) for p in compile_layer_set()]
    kernels = rng.sample(kernels, count)
    results = compile_many([k.compile_job(arch) for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        assert result.warnings == [], f"{kernel.name} on {arch}"
        usage = result.resources[kernel.entry]
        assert not usage.spills, f"{kernel.name} spills on {arch}: {usage}"
        assert usage.registers * kernel.threads <= 65536, f"{kernel.name}: {usage.registers} regs"
        # Its __launch_bounds__ are the threads it is launched with (fewer would fail the launch
        # on a GPU, which the emulator does not model).
        bounds = re.findall(r"\.maxntid\s+(\d+), 1, 1", result.ptx)
        assert bounds == [str(kernel.threads)], f"{kernel.name}: .maxntid {bounds}"


def load_via_regs(kernel):
    """`kernel` as scripts/ablate_kernel.py's `ldg` timing variant (input rows through registers
    instead of cp.async): a variant timed as a candidate fix must compute the same results."""
    return kernel.with_defines(load_script("ablate_kernel").VARIANTS["ldg"])


def spy_on_map_promotions(monkeypatch, factory) -> list[int]:
    """From now on (until monkeypatch undoes it), record the L2 promotion of every row map
    argument `factory` (conv2d_gw8_factory or conv2d_gw8_wgrad_factory) asks for, in order, in
    the list returned; the arguments are still made."""
    asked: list[int] = []
    real = factory.row_map_argument

    def spy(t, groups, pixels, device, l2_promotion=0):
        asked.append(l2_promotion)
        return real(t, groups, pixels, device, l2_promotion)

    monkeypatch.setattr(factory, "row_map_argument", spy)
    return asked
