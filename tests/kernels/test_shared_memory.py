"""A launch's dynamic shared memory is exactly what its kernel carves out of it: the factories work
out `shared_mem_bytes` in Python (row_pitch, output_pitch, tma_align), the kernels place their
buffers one after another by the generated classes' sizes (conv2d_gw8.cu: SmemInput, SmemWeights,
SmemOutput, then a tensor-copy build's mbarriers; conv2d_gw8_wgrad.cu: SmemX, SmemDy, then the
mbarriers). Checked over sampled configs of every variant, where the emulator checks the configs it
runs."""

from __future__ import annotations

import random
import re

import pytest

from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels import conv2d_gw8_wgrad_factory as wg
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

LAYERS = [
    Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1, r=3, s=3),
    Conv2dGw8Params(n=3, c=136, h=20, w=19, padding=2, r=5, s=4, has_bias=True, dtype="bf16"),
    Conv2dGw8Params(n=1, c=8, h=6, w=5, padding=0, r=1, s=2),
]
CONFIGS_PER_LAYER = 60


def generated_bytes(header: str, cls: str) -> int:
    """`cls::num_bytes` of a generated header."""
    body = header[header.index(f"class {cls} {{") :]
    return int(re.search(r"static constexpr int num_bytes = (\d+);", body).group(1))


def header_of(kernel) -> str:
    ((_, header),) = kernel.headers
    return header


def sampled(configs: list, seed: int) -> list:
    return random.Random(seed).sample(configs, min(CONFIGS_PER_LAYER, len(configs)))


def barriers(groups: int, stages: int) -> int:
    """What a tensor-copy build adds: room to align its buffers, then one mbarrier a stage."""
    return fd.tma_align(groups) - 16 + 8 * stages


def check_carving(make_kernel, configs: list, buffers: tuple[str, ...], tma: bool) -> None:
    """For each config, `make_kernel(config)`'s shared_mem_bytes is its generated `buffers`'
    num_bytes (plus, with `tma`, the alignment room and mbarriers); at least 5 configs build."""
    checked = 0
    for config in configs:
        try:
            kernel = make_kernel(config)
        except ValueError:  # too much shared memory with the tensor copies' alignment
            assert tma
            continue
        header = header_of(kernel)
        carved = sum(generated_bytes(header, buffer) for buffer in buffers)
        if tma:
            carved += barriers(config.groups, config.stages)
        assert kernel.shared_mem_bytes == carved, config.encode()
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("params", LAYERS, ids=lambda p: p.encode())
@pytest.mark.parametrize(
    "variant",
    [{}, {"igrad": True}, {"swizzled": True}, {"tma": True}, {"tma": True, "tma_stores": True}],
    ids=["fprop", "dgrad", "swizzled", "tma", "tma-stores"],
)
def test_fprop_dgrad_shared_memory_is_their_buffers(params, variant):
    check_carving(
        lambda config: fd.make_kernel(params, config, **variant),
        sampled(fd.configs(params, igrad=variant.get("igrad", False)), seed=1),
        ("SmemInput", "SmemWeights", "SmemOutput"),
        variant.get("tma", False),
    )


@pytest.mark.parametrize("params", LAYERS, ids=lambda p: p.encode())
@pytest.mark.parametrize(
    "variant",
    [{}, {"partials": True}, {"swizzled": True}, {"partials": True, "tma": True}],
    ids=["atomic", "partials", "swizzled", "tma"],
)
def test_wgrad_shared_memory_is_its_buffers(params, variant):
    check_carving(
        lambda config: wg.make_kernel(params, config, **variant),
        sampled(wg.configs(params), seed=2),
        ("SmemX", "SmemDy"),
        variant.get("tma", False),
    )
