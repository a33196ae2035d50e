"""FProp and DGrad kernels: NVRTC builds for every arch, and results against the float64
reference in the CPU emulator (sampled configs in CI, all with -m slow) and on a GPU (-m cuda)."""

import dataclasses
import itertools
import math
import re

import numpy as np
import pytest
import torch

import spio
from spio.check import random_inputs
from spio.kernels import conv2d_gw8_factory as fd
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.kernels.families import FAMILY_OF_PASS
from spio.kernels.perf_model import heuristic_ranking
from tests.kernels.conv2d_gw8_cases import (
    CI_LAYERS,
    SLOW_CONFIGS,
    SLOW_LAYERS,
    assert_sample_compiles_without_spills,
    check,
    load_via_regs,
    sample_configs,
    spy_on_map_promotions,
)

PASSES = ("fprop", "dgrad")


@pytest.mark.parametrize("arch", spio.supported_arch)
@pytest.mark.parametrize("family", ["conv2d_gw8_fprop", "conv2d_gw8_dgrad"])
def test_sampled_configs_compile_without_spills(family, arch):
    assert_sample_compiles_without_spills(family, arch, count=6, seed=7)


def test_default_kernels_fit_the_launch_limits():
    """The heuristic's pick of every test layer builds a kernel that a GPU can launch."""
    for params, igrad in itertools.product(CI_LAYERS + SLOW_LAYERS, (False, True)):
        kernel = fd.make_kernel(params, fd.default_config(params, igrad), igrad=igrad)
        assert 32 <= kernel.threads <= 1024 and kernel.shared_mem_bytes <= fd.MAX_SHARED_BYTES
        assert kernel.grid[0] < 2**31 and max(kernel.grid[1:]) <= 65535, kernel.grid


def test_sector_waste_charges_only_blocks_that_split_pixels():
    """A block holding all of a pixel's groups reads whole NHWC rows: no waste, even when the
    group count is odd (3 groups in blocks of 4 used to count 64 bytes moved per 48)."""
    three = Conv2dGw8Params(n=1, c=24, h=8, w=8)
    wide = Conv2dGw8Params(n=1, c=128, h=8, w=8)
    by_groups = {c.groups: c for c in fd.configs(three) + fd.configs(wide)}
    assert fd.sector_waste(three, by_groups[4]) == fd.sector_waste(three, by_groups[8]) == 1.0
    assert fd.sector_waste(three, by_groups[1]) == fd.sector_waste(wide, by_groups[1]) == 2.0
    assert fd.sector_waste(wide, by_groups[2]) == fd.sector_waste(wide, by_groups[8]) == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        dict(groups=0),
        dict(block_q=24),
        dict(block_q=16, warp_q16=2),
        dict(groups=64, block_q=64),
        dict(block_n=0),
    ],
)
def test_bad_configs_are_rejected(bad):
    with pytest.raises(ValueError, match="Conv2dGw8Config needs"):
        fd.Conv2dGw8Config(**bad)


@pytest.mark.parametrize("field", ["groups", "block_p", "block_q", "stages", "block_n"])
def test_config_fields_of_the_wrong_type_are_type_errors_and_numpys_ints_count(field):
    # groups=True equals groups=1 but would be encoded "gTrue"; a float, a string or None is
    # not an integer either. A numpy integer is one (as for Conv2dGw8Params), kept as an int.
    for bad in (True, 8.0, "8", None):
        with pytest.raises(TypeError, match=rf"^Conv2dGw8Config needs an integer {field}, got "):
            fd.Conv2dGw8Config(**{field: bad})
    default = getattr(fd.Conv2dGw8Config(), field)
    config = fd.Conv2dGw8Config(**{field: np.int64(default)})
    assert type(getattr(config, field)) is int and config == fd.Conv2dGw8Config()
    assert config.encode() == fd.Conv2dGw8Config().encode()


def test_kernel_names_encode_params_and_config():
    params = Conv2dGw8Params(n=2, c=16, h=8, w=8)
    a = fd.make_kernel(params, fd.Conv2dGw8Config(2, 4, 16, 1))
    b = fd.make_kernel(params, fd.Conv2dGw8Config(2, 8, 16, 1))
    c = fd.make_kernel(params, fd.Conv2dGw8Config(2, 4, 16, 1), igrad=True)
    assert len({a.name, b.name, c.name}) == 3
    assert params.encode_image() in a.name and "fprop" in a.name and "dgrad" in c.name
    # The batch size is a launch argument, not part of the code or its name.
    assert "n2_" not in a.name and a.name.startswith("conv2d_gw8_fprop__c16_h8_w8_")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("block_n", [1, 2])
@pytest.mark.parametrize("pass_", PASSES)
def test_one_build_serves_every_batch_size(pass_, block_n, device):
    """The kernels take the batch size at launch: a layer's kernels for N = 3 and N = 5 share
    one name and header (one build, one loaded module) and differ only in their grids, and each
    batch runs right (NaN-poisoned outputs against the float64 reference). With two images a
    block, the last block of either batch is half empty: a "ragged" build, which checks each
    image against the batch size; N = 4 fills its blocks and gets the build without the check.
    With one image a block all three share one build."""
    from spio.check import run_one

    igrad = pass_ == "dgrad"
    layers = [
        Conv2dGw8Params(n=n, c=16, h=6, w=5, padding=1, has_bias=not igrad) for n in (3, 5, 4)
    ]
    config = next(c for c in fd.configs(layers[0], igrad) if c.block_n == block_n)
    kernels = [fd.make_kernel(p, config, igrad) for p in layers]
    assert kernels[0].name == kernels[1].name and kernels[0].headers == kernels[1].headers
    assert kernels[0].grid != kernels[1].grid
    assert (kernels[2].name == kernels[0].name) == (block_n == 1)
    assert ("__ragged" in kernels[0].name) == (block_n == 2) and "__ragged" not in kernels[2].name
    for params, kernel in zip(layers, kernels, strict=True):
        ratio = run_one(params, pass_, config, device, kernel=kernel)
        assert ratio <= 1.0, f"N = {params.n}: worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ragged_builds_compile_without_spills(arch):
    """The builds for batches that their images per block do not divide (Block::ragged) check
    each image against the batch size: a few more registers, still no spill or warning (FProp,
    DGrad and WGrad, partials and atomics, on a small and the headline layer)."""
    from spio.compiler import compile_many
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    kernels = []
    for params in (
        Conv2dGw8Params(n=3, c=16, h=6, w=5, padding=1, has_bias=True),
        Conv2dGw8Params(n=127, c=64, h=64, w=64, padding=1),
    ):
        for igrad in (False, True):
            multi = [c for c in fd.configs(params, igrad) if c.block_n > 1]
            kernels += [fd.make_kernel(params, c, igrad) for c in multi[:: max(1, len(multi) // 3)]]
        multi = [c for c in wg.configs(params) if c.block_n > 1 and params.n % c.block_n]
        for config in multi[:: max(1, len(multi) // 2)]:
            kernels += [wg.make_kernel(params, config, partials=p) for p in (False, True)]
    assert all("__ragged" in k.name for k in kernels) and len(kernels) >= 12
    results = compile_many([k.compile_job(arch) for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        assert not result.resources[kernel.entry].spills, kernel.name
        assert result.warnings == [], kernel.name


def test_a_kernel_of_another_batch_size_is_refused():
    """Kernels of one name serve several batch sizes, each with its own grid: launching one
    made for 4 images on a batch of 2 would read past the batch (and one made for 3 on 5 would
    leave images unwritten). fprop, dgrad and wgrad refuse it, naming both."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    four, two = (Conv2dGw8Params(n=n, c=16, h=6, w=5, padding=1) for n in (4, 2))
    t = random_inputs(two, seed=0)
    config = next(c for c in fd.configs(four) if c.block_n == 2)
    wconfig = next(c for c in wg.configs(four) if c.block_n == 1)
    match = "was made for a batch of 4 images .* not 2"
    with pytest.raises(ValueError, match=match):
        fd.fprop(t["x"], t["w"], None, two, kernel=fd.make_kernel(four, config))
    with pytest.raises(ValueError, match=match):
        fd.dgrad(t["dy"], t["w"], two, kernel=fd.make_kernel(four, config, igrad=True))
    with pytest.raises(ValueError, match=match):
        wg.wgrad(t["x"], t["dy"], two, kernel=wg.make_kernel(four, wconfig, partials=True))
    assert fd.make_kernel(four, config).name == fd.make_kernel(two, config).name  # one build


def test_a_kernel_of_another_layer_is_refused():
    """A kernel computes the layer it was made for: one of another image size, dtype or bias
    had been launched on the caller's tensors, checked for its batch size alone (NaNs from
    reads past the image, a bias dropped from y and from its gradient). DGrad reads no bias:
    the bias-free layer's kernel serves a layer with one."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    layer = Conv2dGw8Params(n=2, c=16, h=6, w=5, padding=1, has_bias=True)
    t = random_inputs(layer, seed=0)
    others = [
        dataclasses.replace(layer, h=4),
        dataclasses.replace(layer, has_bias=False),
        dataclasses.replace(layer, dtype="bf16"),
        dataclasses.replace(layer, padding=(1, 2), s=5),
    ]
    for other in others:
        match = f"was made for layer {other.encode()}, not {layer.encode()}"
        with pytest.raises(ValueError, match=re.escape(match)):
            fd.fprop(t["x"], t["w"], t["bias"], layer, kernel=fd.make_kernel(other))
        with pytest.raises(ValueError, match=re.escape(match)):
            wg.wgrad(t["x"], t["dy"], layer, kernel=wg.make_kernel(other, partials=True))
        if other.has_bias:
            with pytest.raises(ValueError, match=re.escape(match)):
                fd.dgrad(t["dy"], t["w"], layer, kernel=fd.make_kernel(other, igrad=True))
    no_bias = fd.make_kernel(dataclasses.replace(layer, has_bias=False), igrad=True)
    fd.check_layer(no_bias, layer, "dgrad")  # no error


def test_layers_too_large_for_a_kernel_are_refused():
    """The kernels index with C++ ints: a batch whose activations pass 2 GiB gets no kernel
    (spio.functional runs it in chunks), one just under does."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels.conv2d_gw8_params import MAX_TENSOR_BYTES

    image = 64 * 64 * 64 * 2
    fits = Conv2dGw8Params(n=MAX_TENSOR_BYTES // image, c=64, h=64, w=64)
    too_many = dataclasses.replace(fits, n=fits.n + 1)
    for make in (fd.make_kernel, lambda p: fd.make_kernel(p, igrad=True), wg.make_kernel):
        assert make(fits).name
        with pytest.raises(ValueError, match=r"activations take 2147483648 bytes, more than"):
            make(too_many)


def test_layers_whose_weight_gradient_is_too_large_for_a_kernel_are_refused():
    """WGrad's fp32 weight gradient is indexed with C++ ints too: millions of channels had got
    kernels, failing later in the generated header."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    wide = Conv2dGw8Params(n=1, c=2**22, h=1, w=1, padding=2, r=5, s=5)
    for make in (fd.make_kernel, lambda p: fd.make_kernel(p, igrad=True), wg.make_kernel):
        with pytest.raises(ValueError, match=r"fp32 weight gradient takes 3355443200 bytes"):
            make(wide)
    assert wg.make_kernel(dataclasses.replace(wide, c=2**20)).name


def test_wrong_dtype_is_rejected():
    import torch

    params = Conv2dGw8Params(n=1, c=8, h=4, w=4)
    x = torch.randn(params.input_shape)
    w = torch.randn(params.weight_shape)
    with pytest.raises(ValueError, match="fp16 kernels need torch.float16"):
        fd.fprop(x, w, None, params)


def test_tensors_of_other_shapes_and_a_stray_or_missing_bias_are_rejected():
    """The factory functions check what they launch on (spio check, autotune and the scripts
    call them directly): a batch smaller than params.n was read out of bounds, a bias given to
    a layer without one was dropped, and a missing one was read through a null pointer."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    params = Conv2dGw8Params(n=2, c=16, h=5, w=6)
    x = torch.randn(params.input_shape).half()
    one = x[:1]
    w = torch.randn(params.weight_shape).half()
    dy = torch.randn(params.output_shape).half()
    bias = torch.randn(16)
    calls = [
        (
            lambda: fd.fprop(one, w, None, params),
            r"x of layer .* \(2, 16, 5, 6\), got \(1, 16, 5, 6\)",
        ),
        (lambda: fd.fprop(x, w[:8], None, params), r"weight .* must have shape \(16, 8, 3, 3\)"),
        (lambda: fd.fprop(x, w, bias, params), "has_bias=False, but the bias given is a tensor"),
        (
            lambda: fd.fprop(x, w, None, dataclasses.replace(params, has_bias=True)),
            "bias given is None",
        ),
        (
            lambda: fd.fprop(x, w, bias[:8], dataclasses.replace(params, has_bias=True)),
            r"bias .* \(16,\)",
        ),
        (lambda: fd.dgrad(dy[:1], w, params), r"dy of layer .* must have shape"),
        (lambda: wg.wgrad(x, dy[:, :8], params), r"dy of layer .* must have shape"),
        (lambda: wg.wgrad(one, dy, params), r"x of layer .* must have shape"),
    ]
    for call, message in calls:
        with pytest.raises(ValueError, match=message):
            call()


def _emulated_cases(layers, configs_per_layer, seed):
    for index, params in enumerate(layers):
        for pass_ in PASSES:
            for config in sample_configs(params, pass_, configs_per_layer, seed + index):
                yield pytest.param(
                    pass_, params, config, id=f"{pass_}-{params.encode()}-{config.encode()}"
                )


@pytest.mark.parametrize("pass_,params,config", list(_emulated_cases(CI_LAYERS, 1, seed=3)))
def test_emulated_kernel_matches_reference(pass_, params, config):
    check(params, pass_, config, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize(
    "pass_,params,config", list(_emulated_cases(SLOW_LAYERS, SLOW_CONFIGS, seed=11))
)
def test_emulated_kernel_matches_reference_sweep(pass_, params, config):
    check(params, pass_, config, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize(
    "pass_,params,config", list(_emulated_cases(CI_LAYERS + SLOW_LAYERS, 2, seed=5))
)
def test_gpu_kernel_matches_reference(pass_, params, config, gpu_kernels_compiled):
    check(params, pass_, config, "cuda")


@pytest.mark.parametrize("shape", ["default", "k16_ragged"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("pass_", ["fprop", "dgrad"])
def test_emulated_output_is_rounded_to_nearest(pass_, dtype, shape):
    """The tolerance allows an ulp, so it cannot tell rounding modes apart. With operands on a
    grid of 1/64 the fp32 sums are exact, so each output must be the float64 reference rounded
    to nearest, bit for bit (rounding toward zero got about a third of them wrong). Also with
    two filter columns an mma (k16), blocks of 2 of 3 images and of 2 of 3 groups: the one
    default-config layer had been the only guard of each dtype's rounding (mutation testing,
    2026-12-06)."""
    from spio.reference import conv2d_gw8_dgrad_ref, conv2d_gw8_fprop_ref

    n, c, h, w = (1, 16, 6, 7) if shape == "default" else (3, 24, 5, 9)
    params = Conv2dGw8Params(
        n=n, c=c, h=h, w=w, padding=1, r=3, s=3, dtype=dtype, has_bias=pass_ == "fprop"
    )
    config = None
    if shape != "default":
        family = FAMILY_OF_PASS[pass_]
        config = next(
            c for c in family.configs(params) if (c.mma_k, c.block_n, c.groups) == (16, 2, 2)
        )
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(0)

    def on_grid(shape):
        return torch.randint(-64, 65, shape, generator=gen).double() / 64

    nhwc = torch.channels_last
    w = on_grid(params.weight_shape).to(half)
    if pass_ == "fprop":
        x = on_grid(params.input_shape).to(half).contiguous(memory_format=nhwc)
        bias = on_grid((params.c,)).float() if params.has_bias else None
        got = fd.fprop(x, w, bias, params, config)
        want = conv2d_gw8_fprop_ref(x, w, bias, params.padding)
    else:
        dy = on_grid(params.output_shape).to(half).contiguous(memory_format=nhwc)
        got = fd.dgrad(dy, w, params, config)
        want = conv2d_gw8_dgrad_ref(dy, w, params.padding, (params.h, params.w))
    wrong = (got.double() != want.to(half).double()).sum().item()
    assert wrong == 0, f"{wrong} of {got.numel()} outputs not rounded to nearest"


def test_configs_span_tiles_up_to_the_output_rounded_up():
    """configs offers tiles up to the pass's output rounded up (columns to 16, rows and groups to
    a power of two), so one tile can cover a whole row of the output: DGrad's output is the
    layer's input, larger than FProp's here. A 7 x 18 FProp output (3 groups) gets 4 groups,
    32 columns and 8 rows at most; DGrad's 9 x 20 one 16 rows. mma_k 16 pairs filter columns s
    and s + 1, so a one-column filter has only mma_k 8. Counts by hand: (groups 1, 2, 4) x
    (q16 w1, q32 w1, q32 w2) x (4 rows with 2 stages, or 8 or 16 rows with any of 5) x mma_k."""
    params = Conv2dGw8Params(n=1, c=24, h=9, w=20, padding=0, r=3, s=3)
    for igrad, rows, count in ((False, {4, 8}, 3 * 3 * 6 * 2), (True, {4, 8, 16}, 3 * 3 * 11 * 2)):
        found = fd.configs(params, igrad)
        assert {c.groups for c in found} == {1, 2, 4}
        assert {(c.block_q, c.warp_q16) for c in found} == {(16, 1), (32, 1), (32, 2)}
        assert {c.block_p for c in found} == rows
        assert {c.mma_k for c in found} == {8, 16}
        assert len(found) == count, igrad
        assert FAMILY_OF_PASS["dgrad" if igrad else "fprop"].configs(params) == found
    one_column = Conv2dGw8Params(n=1, c=24, h=9, w=20, padding=0, r=3, s=1)
    for igrad in (False, True):
        assert {c.mma_k for c in fd.configs(one_column, igrad)} == {8}


def test_estimated_cost_counts_every_tile_of_a_ragged_output():
    """estimated_cost, worked out by hand for 8-row tiles of a 9 x 16 output (64 channels, all 8
    groups a block, 256 threads, 2 stages): 2 row tiles, so 2 blocks reading 10 input rows of 18
    columns each; traffic (2 x 10 x 18 x 8 + 1152) / (2 x 1152) = 1.75 of the ideal. The blocks
    keep one 18-column row of 8 groups (2304 bytes) in flight on 2 of 132 SMs: latency cover
    2/132 x 2304/32768. A tile count rounded down would see one block and no overrun."""
    params = Conv2dGw8Params(n=1, c=64, h=9, w=16, padding=1, r=3, s=3)
    config = fd.Conv2dGw8Config(groups=8, block_p=8, block_q=16, warp_q16=1, stages=2)
    assert config in fd.configs(params) and config.threads == 256
    cover = 2 / 132 * 2304 / 32768
    assert fd.estimated_cost(params, config) == pytest.approx(1.75 / cover)
    assert fd.estimated_cost(params, config, igrad=True) == pytest.approx(1.75 / cover)


def test_dgrad_kernels_read_no_bias_whatever_bias_elem_says():
    """DGrad reads no bias, so bias_elem (the bias in the activations' dtype) does not make a
    second DGrad kernel of a biased layer: one kernel, under one name, serves both flags. FProp
    of the same layer has the variant; FProp of a layer without a bias does not."""
    params = Conv2dGw8Params(n=1, c=16, h=6, w=5, padding=1, has_bias=True)
    config = fd.Conv2dGw8Config(2, 8, 16, 1)
    plain = fd.make_kernel(params, config, igrad=True)
    flagged = fd.make_kernel(params, config, igrad=True, bias_elem=True)
    assert flagged.name == plain.name and flagged.headers == plain.headers
    assert flagged.info_value("bias_elem") is False
    assert fd.make_kernel(params, config, bias_elem=True).name.endswith("__belem")
    unbiased = dataclasses.replace(params, has_bias=False)
    assert "__belem" not in fd.make_kernel(unbiased, config, bias_elem=True).name


@pytest.mark.parametrize("igrad", [False, True])
def test_every_config_has_its_own_kernel_name(igrad):
    params = Conv2dGw8Params(n=2, c=64, h=20, w=19, r=3, s=3)
    names = {fd.make_kernel(params, c, igrad).name for c in fd.configs(params, igrad)}
    assert len(names) == len(fd.configs(params, igrad))


@pytest.mark.parametrize(
    "params",
    [
        Conv2dGw8Params(n=1, c=16, h=7, w=9, padding=1, r=3, s=3, has_bias=True),  # pair + single
        Conv2dGw8Params(n=1, c=8, h=5, w=17, padding=(1, 0), r=2, s=2),  # one pair
        Conv2dGw8Params(n=1, c=16, h=6, w=12, padding=2, r=5, s=5, dtype="bf16"),  # 2 pairs + 1
    ],
    ids=lambda p: p.encode(),
)
@pytest.mark.parametrize("pass_", PASSES)
def test_emulated_two_taps_per_mma(pass_, params):
    """mma_k = 16 pairs filter columns s, s + 1 into one m16n8k16 (odd S leaves one m16n8k8)."""
    config = dataclasses.replace(fd.default_config(params, pass_ == "dgrad"), mma_k=16)
    assert config in fd.configs(params, pass_ == "dgrad")
    check(params, pass_, config, "cpu")


@pytest.mark.parametrize(
    "pass_,params,config",
    [
        # one warp copies 34 elements a row: two copies per thread, the second partly idle
        ("fprop", Conv2dGw8Params(n=1, c=16, h=9, w=40, padding=1, r=3, s=3),
         "g1_p8_q32_w2_s2_k8"),
        # 16 warps copy 280 elements a row: some threads copy nothing; 3 of 8 groups absent
        ("dgrad", Conv2dGw8Params(n=1, c=40, h=5, w=33, padding=(1, 0), r=2, s=4),
         "g8_p8_q32_w1_s3_k16"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.encode(),
)  # fmt: skip
def test_emulated_input_copies_per_thread(pass_, params, config):
    """Each thread's row-independent copy addresses are worked out once per block: check blocks
    whose threads copy more than one element a row, or none."""
    check(params, pass_, FAMILY_OF_PASS[pass_].config_named(params, config), "cpu")


@pytest.mark.parametrize(
    "pass_,params,config",
    [
        ("fprop", Conv2dGw8Params(n=2, c=32, h=8, w=8, padding=1, r=3, s=3, has_bias=True),
         "g2_p8_q16_w1_s8_k16"),  # 8 of the tile's 10 rows in flight
        ("dgrad", Conv2dGw8Params(n=1, c=16, h=13, w=7, padding=2, r=5, s=3),
         "g1_p16_q16_w1_s6_k8"),  # two tiles; 6 stages over 20 rows, negative padding
        ("fprop", Conv2dGw8Params(n=1, c=24, h=40, w=20, padding=1, r=3, s=3, has_bias=True),
         "g2_p32_q16_w1_s8_k16"),  # a long tile: 8 stages over 34 rows; a second, short tile
    ],
    ids=lambda v: v if isinstance(v, str) else v.encode(),
)  # fmt: skip
def test_emulated_deep_pipelines(pass_, params, config):
    """Up to 7 input rows in flight (STAGES 6 and 8): the stage ring and cp.async wait counts
    stay right with more stages than filter rows, on short and long tiles."""
    check(params, pass_, FAMILY_OF_PASS[pass_].config_named(params, config), "cpu")


WIDE = Conv2dGw8Params(n=1, c=16, h=5, w=70, padding=(1, 2), r=3, s=5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize(
    "pass_,config",
    [("fprop", "g2_p8_q64_w2_s4_k16"), ("fprop", "g1_p4_q64_w1_s2_k8"),
     ("dgrad", "g2_p8_q64_w2_s6_k16"), ("dgrad", "g1_p8_q64_w1_s3_k8")],
)  # fmt: skip
def test_64_column_tiles(pass_, config, device):
    """Tiles of 64 output columns (the sm_90 model picks them for wide layers, e.g. DGrad of
    96c 56x56 5x5): 70 columns make one full tile and one of 6."""
    check(WIDE, pass_, FAMILY_OF_PASS[pass_].config_named(WIDE, config), device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize(
    "pass_,params,config",
    [
        ("fprop", Conv2dGw8Params(n=5, c=16, h=6, w=5, padding=1, r=3, s=3, has_bias=True),
         "g2_p8_q16_w1_s4_k16_n2"),  # 3 blocks of images, the last one half past the batch
        ("dgrad", Conv2dGw8Params(n=5, c=16, h=6, w=5, padding=1, r=3, s=3),
         "g1_p8_q16_w1_s8_k8_n4"),  # 7 rows in flight across image boundaries
        ("dgrad", Conv2dGw8Params(n=3, c=24, h=4, w=7, padding=4, r=3, s=3),
         "g4_p4_q16_w1_s3_k16_n2"),  # negative DGrad padding; a partial group block
        ("fprop", Conv2dGw8Params(n=8, c=8, h=4, w=4, padding=0, r=4, s=1, dtype="bf16"),
         "g1_p4_q16_w1_s2_k8_n8"),  # one block, 8 images, 4x4 -> 1x4 outputs
        ("fprop", Conv2dGw8Params(n=4, c=32, h=7, w=9, padding=(2, 1), r=5, s=2, dtype="bf16",
                                  has_bias=True),
         "g4_p8_q16_w1_s6_k16_n4"),  # R = 5: the unrolled slots do not line up with images
    ],
    ids=lambda v: v if isinstance(v, str) else v.encode(),
)  # fmt: skip
def test_multi_image_blocks(pass_, params, config, device):
    """A block streams the tiles of block_n images one after another, its pipeline and output
    ring running on across image boundaries: rows that would mix two images must be dropped,
    and images past the batch neither read nor written."""
    named = FAMILY_OF_PASS[pass_].config_named(params, config)
    kernel = fd.make_kernel(params, named, igrad=pass_ == "dgrad")
    assert kernel.grid[0] == math.ceil(params.n / named.block_n) * math.ceil(
        params.groups / named.groups
    )
    check(params, pass_, named, device)


@pytest.mark.parametrize(
    "device,order_seed",
    [("cpu", "1"), ("cpu", "2"), ("cpu", "3"), pytest.param("cuda", "", marks=pytest.mark.cuda)],
)
@pytest.mark.parametrize("pass_", PASSES)
def test_multi_image_blocks_of_partial_tiles(pass_, device, order_seed, monkeypatch):
    """configs() offers several images a block only where a tile is the whole image, but the
    kernel streams any tile: here 3 row tiles of 4 in a 10-row image, so that output rows whose
    filter rows straddle two images fall inside the next tile and must be dropped, not stored.
    In index order the next tile's block would overwrite them: the emulator runs the blocks in
    shuffled orders (SPIO_EMULATOR_ORDER_SEED), as a GPU may."""
    monkeypatch.setenv("SPIO_EMULATOR_ORDER_SEED", order_seed)
    params = Conv2dGw8Params(n=3, c=16, h=10, w=7, padding=1, r=3, s=3, has_bias=True)
    config = fd.Conv2dGw8Config(2, 4, 16, 1, stages=3, mma_k=16, block_n=2)
    assert config not in fd.configs(params, pass_ == "dgrad")
    check(params, pass_, config, device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_multi_image_blocks_through_registers(device):
    """The `ldg` timing variant streams images the same way."""
    from spio.check import run_one

    params = Conv2dGw8Params(n=3, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True)
    for pass_ in PASSES:
        config = fd.Conv2dGw8Config(2, 8, 16, 1, stages=4, mma_k=16, block_n=2)
        assert config in fd.configs(params, pass_ == "dgrad")
        kernel = load_via_regs(fd.make_kernel(params, config, igrad=pass_ == "dgrad"))
        ratio = run_one(params, pass_, config, device, kernel=kernel)
        assert ratio <= 1.0, f"{kernel.name}: worst error {ratio:.3g} times the tolerance"


def test_multi_image_configs_only_where_a_tile_is_the_whole_image():
    small = Conv2dGw8Params(n=4, c=64, h=8, w=8, padding=1)
    multi = [c for c in fd.configs(small) if c.block_n > 1]
    assert {c.block_n for c in multi} == {2, 4}  # not 8: more than the batch
    assert all(c.block_p >= small.p and c.block_q >= small.q for c in multi)
    assert all(c.encode().endswith(f"_n{c.block_n}") for c in multi)
    assert not any("_n" in c.encode() for c in fd.configs(small) if c.block_n == 1)
    large = Conv2dGw8Params(n=4, c=64, h=80, w=80, padding=1)
    assert all(c.block_n == 1 for c in fd.configs(large))
    # The analytic heuristic has no term for a block's fixed costs: it keeps one image a block,
    # also where only two images a block give a deep pipeline (outputs of under 8 rows).
    assert fd.default_config(small).block_n == 1
    for tiny in (
        Conv2dGw8Params(n=64, c=512, h=4, w=4, padding=1),
        Conv2dGw8Params(n=8, c=96, h=8, w=8, padding=0, r=5, s=5),
    ):
        for igrad in (False, True):
            pick = fd.default_config(tiny, igrad)
            family = FAMILY_OF_PASS["dgrad" if igrad else "fprop"]
            assert pick.block_n == 1
            assert pick == heuristic_ranking(family, tiny, fd.configs(tiny, igrad))[0]
    with pytest.raises(ValueError, match="conv2d_gw8_fprop has no config 'g2_p8_q16_w1_s4_k16_n8'"):
        FAMILY_OF_PASS["fprop"].config_named(small, "g2_p8_q16_w1_s4_k16_n8")


def test_deep_pipelines_only_for_tiles_of_eight_rows_or_more():
    params = Conv2dGw8Params(n=8, c=64, h=64, w=64, padding=1, r=3, s=3)
    deep = [c for c in fd.configs(params) if c.stages > 2]
    assert {c.block_p for c in deep} == {8, 16, 32, 64}
    assert {c.stages for c in deep if c.block_p == 64} == {3, 4, 6, 8}
    # Never more stages than input rows, even for one filter row (rows = block_p + R - 1).
    one_row = Conv2dGw8Params(n=8, c=64, h=64, w=64, padding=0, r=1, s=3)
    assert any(c.stages == 8 for c in fd.configs(one_row))
    assert all(c.stages <= c.block_p for c in fd.configs(one_row))


def _misaligned_channels_last(t):
    """A copy of t (N, C, H, W) stored channels_last two bytes past a 16-byte boundary."""
    n, c, h, w = t.shape
    storage = torch.empty(t.numel() + 8, dtype=t.dtype)
    offset = next(i for i in range(8) if (storage.data_ptr() + 2 * i) % 16 == 2)
    view = storage.as_strided((n, c, h, w), (h * w * c, 1, w * c, c), offset)
    view.copy_(t)
    assert view.is_contiguous(memory_format=torch.channels_last) and view.data_ptr() % 16 == 2
    return view


@pytest.mark.parametrize("pass_", PASSES)
def test_misaligned_inputs_are_realigned(pass_):
    """cp.async needs 16-byte aligned sources: a channels_last view at an odd offset is copied.
    Into NaN-poisoned outputs, against the float64 reference at the derived tolerance."""
    from spio.check import _poisoned, error_ratio
    from spio.reference import conv2d_gw8_dgrad_ref, conv2d_gw8_fprop_ref, conv2d_gw8_tolerance

    params = Conv2dGw8Params(n=1, c=16, h=5, w=7, padding=1)
    t = random_inputs(params, seed=0)
    x, w, dy = t["x"], t["w"], t["dy"]
    if pass_ == "fprop":
        out = _poisoned(params.output_shape, x, "cpu")
        got = fd.fprop(_misaligned_channels_last(x), w, None, params, out=out)
        want = conv2d_gw8_fprop_ref(x, w, None, params.padding)
        tol = conv2d_gw8_tolerance(params, "fprop", x, w)
    else:
        out = _poisoned(params.input_shape, dy, "cpu")
        got = fd.dgrad(_misaligned_channels_last(dy), w, params, out=out)
        want = conv2d_gw8_dgrad_ref(dy, w, params.padding, (params.h, params.w))
        tol = conv2d_gw8_tolerance(params, "dgrad", dy, w)
    assert error_ratio(got, want, tol.atol, tol.rtol) <= 1.0


def test_tensors_on_different_devices_are_rejected():
    """The kernels take every tensor's address as one on the launch device: a weight or an out
    elsewhere (a host address on the GPU) had been launched on (here "meta" stands in for a
    second device)."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    params = Conv2dGw8Params(n=1, c=8, h=4, w=4, has_bias=True)
    t = random_inputs(params, seed=0)
    x, w, dy, b = t["x"], t["w"], t["dy"], t["bias"]
    elsewhere = {name: v.to("meta") for name, v in t.items()}
    with pytest.raises(ValueError, match="one device, got x on cpu, weight on meta, bias on cpu"):
        fd.fprop(x, elsewhere["w"], b, params)
    with pytest.raises(ValueError, match="one device, got x on cpu, weight on cpu, bias on meta"):
        fd.fprop(x, w, elsewhere["bias"], params)
    with pytest.raises(ValueError, match="one device, got dy on meta, weight on cpu"):
        fd.dgrad(elsewhere["dy"], w, params)
    with pytest.raises(ValueError, match="one device, got x on cpu, dy on meta"):
        wg.wgrad(x, elsewhere["dy"], params)
    out = torch.empty(params.output_shape, dtype=x.dtype, device="meta")
    with pytest.raises(ValueError, match="on cpu, got torch.float16 .* on meta"):
        fd.fprop(x, w, b, params, out=out)
    with pytest.raises(ValueError, match="on cpu, got torch.float16 .* on meta"):
        fd.dgrad(dy, w, params, out=torch.empty(params.input_shape, dtype=x.dtype, device="meta"))


def test_bad_out_is_rejected():
    params = Conv2dGw8Params(n=1, c=8, h=4, w=4)
    t = random_inputs(params, seed=0)
    x, w = t["x"], t["w"]
    with pytest.raises(ValueError, match="out must be torch.float16 of shape"):
        fd.fprop(x, w, None, params, out=torch.empty(1, 8, 3, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="channels_last contiguous"):
        fd.fprop(x, w, None, params, out=torch.empty(params.output_shape, dtype=torch.float16))
    # 8 bytes past a 16-byte boundary: fine for 4-byte stores, not for the kernel's 16-byte ones.
    storage = torch.empty(math.prod(params.output_shape) + 16, dtype=torch.float16)
    offset = next(i for i in range(8, 16) if (storage.data_ptr() + 2 * i) % 16 == 8)
    n, c, h, w_ = params.output_shape
    out = storage.as_strided(params.output_shape, (h * w_ * c, 1, w_ * c, c), offset)
    assert out.is_contiguous(memory_format=torch.channels_last) and out.data_ptr() % 16 == 8
    with pytest.raises(ValueError, match="16-byte aligned"):
        fd.fprop(x, w, None, params, out=out)
    # In place (the layer keeps its size with padding 1): blocks would read rows others wrote.
    nhwc = x.contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="must not share memory with an operand"):
        fd.fprop(nhwc, w, None, params, out=nhwc)
    with pytest.raises(ValueError, match="must not share memory with an operand"):
        dy = t["dy"].contiguous(memory_format=torch.channels_last)
        fd.dgrad(dy, w, params, out=dy)


def test_out_may_share_a_buffer_with_operands_but_no_bytes():
    """Disjoint views of one buffer had been refused as sharing memory (the storages were
    compared), and a bias in out's bytes had been taken (the bias was not checked). The bias
    starts at out's first byte past its end: adjacent is disjoint."""
    from spio.check import error_ratio
    from spio.reference import conv2d_gw8_fprop_ref, conv2d_gw8_tolerance

    params = Conv2dGw8Params(n=1, c=8, h=4, w=4, has_bias=True)
    t = random_inputs(params, seed=1)
    size = math.prod(params.output_shape)
    buffer = torch.full((2 * size + 16,), float("nan"), dtype=torch.float16)
    n, c, h, w_ = params.output_shape
    out = buffer[:size].view(n, h, w_, c).permute(0, 3, 1, 2)  # then the bias, then x
    bias = buffer[size : size + 8].copy_(t["bias"])
    x = buffer[size + 16 :].view(t["x"].shape).copy_(t["x"])
    y = fd.fprop(x, t["w"], bias, params, out=out)
    assert y.data_ptr() == out.data_ptr()
    want = conv2d_gw8_fprop_ref(t["x"], t["w"], bias.clone(), params.padding)  # as rounded
    tol = conv2d_gw8_tolerance(params, "fprop", t["x"], t["w"])
    assert error_ratio(y, want, tol.atol, tol.rtol) <= 1.0
    with pytest.raises(ValueError, match="must not share memory with an operand"):
        fd.fprop(x, t["w"], buffer[size - 8 : size], params, out=out)  # out's last 8


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_variants_read_channels_last_weights_and_half_bias(dtype, device):
    """The weights_cl / bias_elem variants read PyTorch's channels_last weight ([K, R, S, 8] in
    memory) and a bias in the activations' dtype as held; R != S catches a swapped r and s."""
    from spio.reference import conv2d_gw8_dgrad_ref, conv2d_gw8_fprop_ref, conv2d_gw8_tolerance

    params = Conv2dGw8Params(n=2, c=24, h=7, w=9, padding=(2, 1), r=4, s=3, has_bias=True,
                             dtype=dtype)  # fmt: skip
    t = random_inputs(params, seed=3)
    w_cl = t["w"].contiguous(memory_format=torch.channels_last).to(device)
    bias = t["bias"].to(t["x"].dtype)
    x, dy = t["x"].to(device), t["dy"].to(device)
    assert not w_cl.is_contiguous() and fd.operand_layout(w_cl, bias) == (True, True)
    base = fd.make_kernel(params, fd.default_config(params))
    kernel = fd.variant(base, *fd.operand_layout(w_cl, bias))
    assert kernel.name == base.name + "__wcl__belem" and fd.variant(kernel, False, False) == base
    y = fd.fprop(x, w_cl, bias.to(device), params, kernel=kernel).cpu()
    expected = conv2d_gw8_fprop_ref(t["x"], t["w"], bias, params.padding)
    conv2d_gw8_tolerance(params, "fprop", t["x"], t["w"]).assert_close(y, expected)
    dbase = fd.make_kernel(params, fd.default_config(params, igrad=True), igrad=True)
    dkernel = fd.variant(dbase, True, False)
    dx = fd.dgrad(dy, w_cl, params, kernel=dkernel).cpu()
    expected = conv2d_gw8_dgrad_ref(t["dy"], t["w"], params.padding, (params.h, params.w))
    conv2d_gw8_tolerance(params, "dgrad", t["dy"], t["w"]).assert_close(dx, expected)


@pytest.mark.parametrize("weights_cl", [False, True])
@pytest.mark.parametrize("igrad", [False, True])
def test_weights_are_copied_as_held_into_partly_filled_blocks(igrad, weights_cl):
    """The kernels copy the block's run of weights in 16-byte chunks as held: a misaligned weight
    (a view 2 bytes past a boundary) is realigned first, and a block whose last groups lie past
    the layer's (3 groups, 2 per block) zero-fills them. R != S catches a swapped r and s."""
    from spio.reference import conv2d_gw8_dgrad_ref, conv2d_gw8_fprop_ref, conv2d_gw8_tolerance

    params = Conv2dGw8Params(n=2, c=24, h=6, w=7, padding=(1, 2), r=2, s=5, has_bias=not igrad)
    t = random_inputs(params, seed=5)
    fmt = torch.channels_last if weights_cl else torch.contiguous_format
    storage = torch.empty(t["w"].numel() + 8, dtype=t["w"].dtype)
    offset = next(i for i in range(8) if (storage.data_ptr() + 2 * i) % 16 == 2)
    k, c, r, s = t["w"].shape
    strides = (r * s * c, 1, s * c, c) if weights_cl else (c * r * s, r * s, s, 1)
    w = storage.as_strided(t["w"].shape, strides, offset)
    w.copy_(t["w"])
    assert w.is_contiguous(memory_format=fmt) and w.data_ptr() % 16 == 2
    config = next(cf for cf in fd.configs(params, igrad) if cf.groups == 2)
    kernel = fd.make_kernel(params, config, igrad, weights_cl=weights_cl)
    if igrad:
        got = fd.dgrad(t["dy"], w, params, kernel=kernel)
        want = conv2d_gw8_dgrad_ref(t["dy"], t["w"], params.padding, (params.h, params.w))
        conv2d_gw8_tolerance(params, "dgrad", t["dy"], t["w"]).assert_close(got, want)
    else:
        got = fd.fprop(t["x"], w, t["bias"], params, kernel=kernel)
        want = conv2d_gw8_fprop_ref(t["x"], t["w"], t["bias"], params.padding)
        conv2d_gw8_tolerance(params, "fprop", t["x"], t["w"]).assert_close(got, want)


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_sampled_variants_compile_without_spills(arch):
    """The weights_cl / bias_elem variants (the kernels a channels_last, half-precision model
    runs) of sampled configs build without spills or compiler warnings, like the plain
    kernels."""
    import random

    from spio.compiler import compile_many

    rng = random.Random(7)
    kernels = []
    for params in CI_LAYERS[:4]:
        params = dataclasses.replace(params, has_bias=True)
        for igrad in (False, True):
            base = fd.make_kernel(params, rng.choice(fd.configs(params, igrad)), igrad)
            kernels.append(fd.variant(base, True, not igrad))
    results = compile_many([k.compile_job(arch) for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        assert not result.resources[kernel.entry].spills, kernel.name
        assert result.warnings == [], kernel.name
        assert kernel.name.endswith("__wcl__belem" if not kernel.info_value("igrad") else "__wcl")


def _load_via_regs_cases():
    """Layers and configs for the SPIO_LOAD_VIA_REGS timing variant (STAGES - 1 must divide R):
    1, 3 and 5 rows in flight, tiles taller and shorter than the image, partial group blocks,
    a ragged batch."""
    import random

    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P

    layers = [
        P(n=2, c=24, h=20, w=19, padding=1, r=3, s=3, has_bias=True),
        P(n=1, c=16, h=11, w=10, padding=2, r=5, s=3, dtype="bf16"),
        P(n=2, c=8, h=9, w=20, padding=(0, 2), r=1, s=5),
        P(n=1, c=40, h=3, w=17, padding=(1, 0), r=3, s=2),
    ]
    rng = random.Random(5)
    for params in layers:
        for pass_ in PASSES:
            configs = fd.configs(params, pass_ == "dgrad")
            fitting = [c for c in configs if params.r % (c.stages - 1) == 0]
            for config in rng.sample(fitting, min(3, len(fitting))):
                yield pytest.param(
                    pass_, params, config, id=f"{pass_}-{params.encode()}-{config.encode()}"
                )
    # Several images a block on a batch they do not divide: the ragged build's image checks.
    ragged = P(n=3, c=16, h=6, w=5, padding=1, r=3, s=3, has_bias=True)
    for pass_ in PASSES:
        configs = fd.configs(ragged, pass_ == "dgrad")
        config = next(c for c in configs if c.block_n == 2 and ragged.r % (c.stages - 1) == 0)
        yield pytest.param(
            pass_, ragged, config, id=f"{pass_}-{ragged.encode()}-{config.encode()}-ragged"
        )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("pass_,params,config", list(_load_via_regs_cases()))
def test_load_via_regs_variant_matches_reference(pass_, params, config, device):
    """The timing variant whose input rows travel through registers instead of cp.async
    (scripts/ablate_kernel.py's `ldg`) must compute the same results: it is timed as a fix."""
    from spio.check import run_one

    kernel = load_via_regs(fd.make_kernel(params, config, igrad=pass_ == "dgrad"))
    assert "SPIO_LOAD_VIA_REGS" in kernel.headers[0][1]
    ratio = run_one(params, pass_, config, device, kernel=kernel)
    assert ratio <= 1.0, f"{kernel.name}: worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_load_via_regs_variant_builds_without_spills(arch):
    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1)
    for name in ("g8_p64_q64_w2_s4_k16", "g8_p64_q16_w1_s4_k16", "g8_p64_q16_w1_s2_k16"):
        config = {c.encode(): c for c in fd.configs(params)}[name]
        kernel = load_via_regs(fd.make_kernel(params, config))
        usage = kernel.compile(arch).resources[kernel.entry]
        assert not usage.spills and usage.registers * kernel.threads <= 65536, (name, usage)


def test_every_collected_gpu_kernel_test_has_a_kernel(request):
    """The session fixture that compiles the `cuda` kernel tests' kernels up front must make
    each one: it once failed on a config given by name, and every GPU kernel test errored."""
    from tests.kernels.conftest import gpu_test_kernels

    kernels, failures = gpu_test_kernels(request.session.items)
    assert failures == []
    if any(i.get_closest_marker("cuda") for i in request.session.items if "kernels" in i.nodeid):
        assert kernels  # the collected GPU kernel tests name kernels


SWIZZLED_CASES = [
    # (pass, params, config): every group count, rows of a pixel count that is no multiple of 8
    # (the key runs on across the row's end), several copies per thread, stages and images.
    ("fprop", Conv2dGw8Params(n=1, c=8, h=6, w=21, padding=1, r=3, s=3, has_bias=True),
     fd.Conv2dGw8Config(1, 8, 32, 2, stages=3, mma_k=16)),
    ("dgrad", Conv2dGw8Params(n=1, c=16, h=9, w=20, padding=(2, 1), r=5, s=3),
     fd.Conv2dGw8Config(2, 8, 16, 1, stages=4, mma_k=8)),
    ("fprop", Conv2dGw8Params(n=3, c=40, h=5, w=7, padding=1, r=3, s=3, dtype="bf16"),
     fd.Conv2dGw8Config(4, 8, 16, 1, stages=3, mma_k=16, block_n=2)),
    ("dgrad", Conv2dGw8Params(n=2, c=64, h=7, w=33, padding=(1, 0), r=2, s=4),
     fd.Conv2dGw8Config(8, 8, 32, 1, stages=6, mma_k=16)),
    ("fprop", Conv2dGw8Params(n=1, c=64, h=4, w=66, padding=(0, 2), r=1, s=5, has_bias=True),
     fd.Conv2dGw8Config(8, 4, 64, 2, stages=2, mma_k=8)),
]  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize(
    "pass_,params,config", SWIZZLED_CASES, ids=[f"{c[0]}-{c[2].encode()}" for c in SWIZZLED_CASES]
)
def test_swizzled_stages_match_reference(pass_, params, config, device):
    """Input rows staged pixel-major and swizzled (scripts/ablate_kernel.py's `swizzled`,
    timed against the group-major stages as a fix for the row pipeline's read rate) must
    compute the same results; its `ldg` form too where it builds."""
    from spio.check import run_one

    kernel = fd.make_kernel(params, config, igrad=pass_ == "dgrad", swizzled=True)
    assert kernel.name.endswith("__swz") and "swizzle_key" in kernel.headers[0][1]
    group_major = fd.make_kernel(params, config, igrad=pass_ == "dgrad")
    assert "swizzle_key" not in group_major.headers[0][1]
    assert kernel.shared_mem_bytes <= group_major.shared_mem_bytes  # no odd-pitch padding
    kernels = [kernel]
    if params.r % (config.stages - 1) == 0:
        kernels.append(load_via_regs(kernel))
    for k in kernels:
        ratio = run_one(params, pass_, config, device, kernel=k)
        assert ratio <= 1.0, f"{k.name}: worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_swizzled_stages_build_without_spills(arch):
    """The headline layer's configs (those the GPU check times swizzled) and a sample of others
    build for every arch, spilling nothing; the swizzled kernel keeps its entry's name apart."""
    from spio.compiler import compile_many

    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1)
    names = ("g8_p64_q32_w1_s4_k16", "g8_p64_q64_w2_s4_k16", "g8_p64_q16_w1_s4_k16")
    configs = {c.encode(): c for c in fd.configs(params)}
    kernels = [fd.make_kernel(params, configs[n], igrad=i, swizzled=True) for n in names
               for i in (False, True)]  # fmt: skip
    results = compile_many([k.compile_job(arch) for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        usage = result.resources[kernel.entry]
        assert kernel.entry.endswith("__swz"), kernel.entry  # profiler traces tell it apart
        assert not usage.spills and usage.registers * kernel.threads <= 65536, (kernel.name, usage)


def test_a_swizzled_kernels_operand_variants_stay_swizzled():
    """fprop()'s operand variants (channels_last weights, a half bias) of a swizzled kernel are
    swizzled too: a timing must not fall back to the group-major stages unseen."""
    params = Conv2dGw8Params(n=1, c=16, h=8, w=8, padding=1, has_bias=True)
    kernel = fd.make_kernel(params, fd.default_config(params), swizzled=True)
    other = fd.variant(kernel, weights_cl=True, bias_elem=True)
    assert other.info_value("swizzled") and other.name.endswith("__wcl__belem__swz")
    assert fd.with_swizzled_stages(fd.make_kernel(params)).name == kernel.name
    both = fd.make_kernel(params, weights_cl=True, bias_elem=True)
    assert fd.with_swizzled_stages(both).name == f"{both.name}__swz"  # the operands' flags kept


@pytest.mark.parametrize("groups,pixels", [(8, 34), (4, 18), (2, 66), (1, 20)])
def test_stage_layouts_where_copies_land_and_where_ldmatrix_reads(groups, pixels):
    """What the swizzled layout is for, on the stage spec the kernels are built with
    (stage_layout): a warp's 32 row copies (InputLoadIdx's order: a pixel's groups, then the
    next pixel's) land in 512 contiguous bytes, where group-major rows scatter them over the
    groups' rows; and in both layouts ldmatrix reads one group's 8 consecutive pixels (from any
    first pixel) from 8 different 16-byte bank slots."""
    from spio.generators import TensorSpec

    for swizzled in (False, True):
        spec = TensorSpec("S", "uint4", *fd.stage_layout("stage", 2, groups, pixels, swizzled))
        order = [(i // groups, i % groups) for i in range(pixels * groups)]  # (x, c8)
        for warp in range(len(order) // 32):
            landed = sorted(spec.offset(stage=1, x=x, c8=g) for x, g in order[32 * warp :][:32])
            contiguous = landed == list(range(landed[0], landed[0] + 32))
            assert contiguous == (swizzled or groups == 1), (swizzled, warp, landed)
        for g in range(groups):
            for first in range(pixels - 7):
                slots = {spec.offset(stage=1, x=x, c8=g) % 8 for x in range(first, first + 8)}
                assert len(slots) == 8, (swizzled, g, first, sorted(slots))


def _skip_without_tensor_copies(device):
    if device == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("tensor copies (TMA) need sm_90 or newer")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("stores", [False, True], ids=["tma", "tma-stores"])
@pytest.mark.parametrize(
    "pass_,params,config", SWIZZLED_CASES, ids=[f"{c[0]}-{c[2].encode()}" for c in SWIZZLED_CASES]
)
def test_tma_stages_match_reference(pass_, params, config, stores, device):
    """Input rows brought in by tensor copies (scripts/ablate_kernel.py's `tma`: one thread a
    row, landing swizzled, zeros outside the input, an mbarrier a stage) must compute the same
    results, on every group count, halo and padding (negative coordinates, rows above and below
    the image), several images a block and a ragged last block of images; and so must output
    rows stored by tensor copies too (`tma-stores`), which leave out columns, rows, groups and
    images past the output's edges (SWIZZLED_CASES has each)."""
    from spio.check import run_one

    _skip_without_tensor_copies(device)
    kernel = fd.make_kernel(params, config, igrad=pass_ == "dgrad", tma=True, tma_stores=stores)
    assert kernel.name.endswith("__tmaio" if stores else "__tma") and kernel.info_value("tma")
    assert kernel.info_value("swizzled") and "swizzle_key" in kernel.headers[0][1]
    assert "#define SPIO_LOAD_VIA_TMA 1" in kernel.headers[0][1]
    assert f"#define SPIO_STORE_VIA_TMA {int(stores)}" in kernel.headers[0][1]
    ratio = run_one(params, pass_, config, device, kernel=kernel)
    assert ratio <= 1.0, f"{kernel.name}: worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_tma_stages_with_a_ragged_batch_and_wide_channels(device):
    """Images past the batch (a ragged last block of images: the map's N extent stops the
    copies), a layer with more channels than a block's groups (the box's channels start at
    the block's first group, C's stride spans the others), and DGrad with a negative padding
    of its own (the copies' columns and rows start inside dy), and several images a block on
    part of each image; with the output rows stored by tensor copies too."""
    from spio.check import run_one

    _skip_without_tensor_copies(device)
    cases = [
        ("fprop", Conv2dGw8Params(n=3, c=16, h=4, w=6, padding=1),
         fd.Conv2dGw8Config(2, 4, 16, 1, stages=2, mma_k=8, block_n=2)),
        ("dgrad", Conv2dGw8Params(n=2, c=48, h=6, w=9, padding=2, r=5, s=5),
         fd.Conv2dGw8Config(2, 8, 16, 1, stages=3, mma_k=16)),
        # padding past R - 1: DGrad's own padding is negative, its rows start inside dy
        ("dgrad", Conv2dGw8Params(n=1, c=16, h=9, w=11, padding=(3, 4), r=3, s=3),
         fd.Conv2dGw8Config(2, 8, 16, 1, stages=2, mma_k=8)),
        # two images a block on tiles of part of an image (configs() offers none such): the
        # rows that mix two images fall inside the output, and must be neither stored nor kept
        ("fprop", Conv2dGw8Params(n=2, c=16, h=12, w=6, padding=1),
         fd.Conv2dGw8Config(2, 4, 16, 1, stages=3, mma_k=8, block_n=2)),
    ]  # fmt: skip
    for (pass_, params, config), stores in itertools.product(cases, (False, True)):
        kernel = fd.make_kernel(params, config, igrad=pass_ == "dgrad", tma=True, tma_stores=stores)
        assert fd.ragged(params, config.block_n) == (params.n == 3)
        ratio = run_one(params, pass_, config, device, kernel=kernel)
        assert ratio <= 1.0, f"{kernel.name}: worst error {ratio:.3g} times the tolerance"


def test_tma_l2_promotion_is_the_tma_kernel_with_its_maps_promoted(monkeypatch):
    """make_kernel's tma_l2 (scripts/ablate_kernel.py's tma-l2-128 and -256) builds the tma
    kernel's code under a name of its own, and its launches pass every map (input rows, and
    with tma_stores the output rows) that promotion; it implies tma, and the swizzled stages
    drop it. Emulated: the same results (the emulator has no L2)."""
    from spio.check import run_one

    def code(kernel):  # the header's lines but its guard's and the entry's name
        return [
            line
            for line in kernel.headers[0][1].splitlines()
            if "SPIO_GEN_" not in line and "SPIO_KERNEL_ENTRY" not in line
        ]

    pass_, params, config = SWIZZLED_CASES[0]
    tma = fd.make_kernel(params, config, tma=True)
    for l2 in (64, 128, 256):
        kernel = fd.make_kernel(params, config, tma_l2=l2)
        assert kernel.info_value("tma") and kernel.info_value("tma_l2") == l2
        assert kernel.name == f"{tma.name}__l2p{l2}" and code(kernel) == code(tma)
        assert fd.with_tma_stages(fd.make_kernel(params, config), l2=l2) == kernel
    assert tma.info_value("tma_l2") == 0 and fd.with_tma_stages(tma).name == tma.name
    stores = fd.make_kernel(params, config, tma_stores=True, tma_l2=128)
    assert stores.name.endswith("__tmaio__l2p128")
    assert not fd.with_swizzled_stages(stores).info_value("tma_l2")
    assert fd.with_swizzled_stages(stores).name.endswith("__swz")
    asked = spy_on_map_promotions(monkeypatch, fd)
    shape = (params.n, params.c, params.h, params.w)
    out = torch.empty(shape, dtype=torch.half).to(memory_format=torch.channels_last)
    source = torch.zeros_like(out)
    maps = fd.map_arguments(stores, out, source, torch.device("cpu"))
    assert len(maps) == 2 and asked == [128, 128]
    assert fd.row_map(source, 1, 8, 256).l2_promotion == 256
    ratio = run_one(params, pass_, config, "cpu", kernel=fd.make_kernel(params, config, tma_l2=256))
    assert ratio <= 1.0
    for value, error, said in [
        (100, ValueError, "needs tma_l2 0, 64, 128 or 256 (bytes of L2 promotion), got 100"),
        ("128", TypeError, "needs tma_l2 an int (bytes of L2 promotion), got '128'"),
        (True, TypeError, "needs tma_l2 an int (bytes of L2 promotion), got True"),
    ]:
        with pytest.raises(error) as raised:
            fd.make_kernel(params, config, tma_l2=value)
        assert str(raised.value) == f"conv2d_gw8 make_kernel {said}"
    assert fd.make_kernel(params, config, tma_l2=np.int64(128)).info_value("tma_l2") == 128


@pytest.mark.parametrize("groups,pixels", [(8, 34), (4, 18), (2, 66), (1, 20)])
def test_tma_stage_layout_is_where_tensor_copies_land(groups, pixels):
    """The stages a `tma` kernel is built with put each element where a tensor copy with
    tma_swizzle lands it: box element (pixel x, chunk g) at byte (x * groups + g) * 16 of the
    stage, its chunk bits [4, 4 + log2(S / 16)) XORed with address bits [7, ...), the pattern
    CUTLASS encodes for CU_TENSOR_MAP_SWIZZLE_32B/64B/128B (spio.cuda.tensor_map; a GPU run
    confirms it); every stage starts at tma_align bytes (the kernel aligns the first), so the
    address bits are the stage offset's."""
    from spio.generators import TensorSpec

    dims, swizzle = fd.stage_layout("stage", 3, groups, pixels, swizzled=False, tma=True)
    spec = TensorSpec("S", "uint4", dims, swizzle)
    span = fd.tma_swizzle(groups)
    align = fd.tma_align(groups)
    pitch = fd.row_pitch(pixels, True, tma=True) * groups * 16
    assert pitch % align == 0 and align % 128 == 0
    for stage in range(3):
        for x in range(pixels):
            for g in range(groups):
                linear = stage * pitch + (x * groups + g) * 16
                if span:
                    linear ^= ((linear >> 7) & (span // 16 - 1)) << 4
                assert spec.offset(stage=stage, x=x, c8=g) * 16 == linear, (stage, x, g)


def assert_tma_kernels_build(kernels) -> None:
    """`kernels` (tensor-copy builds) compile for sm_90 without spills or warnings, and their
    copies take the tensor map where the launch put it, in the parameter space (its generic
    address, cvta.param): a by-value map without __grid_constant__ is copied to local memory
    first (a __local_depot), and a tensor copy from a local address faults on a GPU."""
    from spio.compiler import compile_many

    results = compile_many([k.compile_job("sm_90") for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        usage = result.resources[kernel.entry]
        assert not usage.spills and usage.registers * kernel.threads <= 65536, (kernel.name, usage)
        assert result.warnings == [], result.warnings  # (bulk_copy.h's unused state was one)
        assert "cp.async.bulk.tensor.4d.shared::cluster.global.tile" in result.ptx
        assert "cvta.param.u64" in result.ptx
        assert "__local_depot" not in result.ptx


def test_tma_kernels_need_sm_90_and_say_so():
    """A `tma` kernel builds for sm_90 without spills; for sm_80 the compile fails naming the
    arch it needs (spio/thread/bulk_copy.h)."""

    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1)
    configs = {c.encode(): c for c in fd.configs(params)}
    names = ("g8_p64_q32_w1_s4_k16", "g8_p64_q64_w2_s4_k16", "g8_p64_q16_w1_s4_k16")
    kernels = [fd.make_kernel(params, configs[n], igrad=i, tma=True) for n in names
               for i in (False, True)]  # fmt: skip
    assert_tma_kernels_build(kernels)
    with pytest.raises(Exception, match="needs sm_90 or newer"):
        kernels[0].compile("sm_80")


def test_tma_kernel_flags_names_and_shared_memory():
    """tma implies the swizzled layout; the operand variants keep it; shared memory grows by the
    stages' alignment room and an mbarrier a stage, and a config that would then exceed the
    limit is refused naming it."""
    params = Conv2dGw8Params(n=1, c=64, h=8, w=40, padding=1, has_bias=True)
    config = fd.Conv2dGw8Config(8, 8, 32, 1, stages=4, mma_k=16)
    kernel = fd.make_kernel(params, config, tma=True)
    swizzled = fd.make_kernel(params, config, swizzled=True)
    in_x = 32 + 2
    stages = 4 * 8 * 16 * fd.row_pitch(in_x, True, tma=True)
    assert fd.row_pitch(in_x, True, tma=True) == 40
    assert kernel.shared_mem_bytes - swizzled.shared_mem_bytes == (
        stages - 4 * 8 * 16 * in_x + fd.tma_align(8) - 16 + 8 * 4
    )
    other = fd.variant(kernel, weights_cl=True, bias_elem=True)
    assert other.info_value("tma") and other.name.endswith("__wcl__belem__tma")
    assert fd.with_tma_stages(fd.make_kernel(params, config)).name == kernel.name
    assert (fd.tma_align(1), fd.tma_align(8)) == (128, 1024)
    assert (fd.tma_swizzle(1), fd.tma_swizzle(4)) == (0, 64)
    big = Conv2dGw8Params(n=1, c=64, h=64, w=64, padding=1)
    wide = fd.Conv2dGw8Config(8, 8, 64, 2, stages=8, mma_k=8)
    assert wide in fd.configs(big)  # 96,256 bytes group-major, 102,448 with tensor copies
    with pytest.raises(ValueError, match="needs 102448 bytes of shared memory with tma=True"):
        fd.make_kernel(big, wide, tma=True)


def test_tma_store_kernels_build_for_sm_90():
    """Kernels that also store their output rows by tensor copies build for sm_90 without spills
    or warnings, with the store, its commit, the wait before each barrier (read), the one before
    the block ends (complete) and the staging threads' async-proxy fences in their PTX."""
    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1, has_bias=True)
    configs = {c.encode(): c for c in fd.configs(params)}
    names = ("g8_p64_q32_w1_s4_k16", "g8_p64_q64_w2_s4_k16", "g8_p64_q16_w1_s4_k16")
    kernels = [fd.make_kernel(params, configs[n], igrad=i, tma_stores=True) for n in names
               for i in (False, True)]  # fmt: skip
    assert_tma_kernels_build(kernels)
    ptx = kernels[0].compile("sm_90").ptx
    for instruction in (
        "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group",
        "cp.async.bulk.commit_group",
        "cp.async.bulk.wait_group.read 0",
        "cp.async.bulk.wait_group 0",
    ):
        assert instruction in ptx, instruction
    # The staging threads' fences for the stores come on top of the input refills' (which the
    # emulator, not modelling the async proxy, cannot miss).
    loads_only = fd.make_kernel(params, kernels[0].info_value("config"), tma=True)
    fence = "fence.proxy.async.shared::cta"
    assert ptx.count(fence) > loads_only.compile("sm_90").ptx.count(fence) > 0


def test_tma_store_kernel_flags_names_and_shared_memory():
    """tma_stores implies tma; the operand variants keep it; its output staging is unpadded
    (two rows of one 16-byte chunk a pixel less than the padded one); without tma's alignment
    the header refuses it."""
    params = Conv2dGw8Params(n=1, c=64, h=8, w=40, padding=1, has_bias=True)
    config = fd.Conv2dGw8Config(8, 8, 32, 1, stages=4, mma_k=16)
    kernel = fd.make_kernel(params, config, tma_stores=True)
    loads_only = fd.make_kernel(params, config, tma=True)
    assert kernel.info_value("tma_stores") and kernel.info_value("tma")
    assert not loads_only.info_value("tma_stores")
    assert kernel.name == loads_only.name.replace("__tma", "__tmaio")
    assert loads_only.shared_mem_bytes - kernel.shared_mem_bytes == 2 * 32 * 16
    other = fd.variant(kernel, weights_cl=True, bias_elem=True)
    assert other.info_value("tma_stores") and other.name.endswith("__wcl__belem__tmaio")
    assert fd.with_tma_stages(fd.make_kernel(params, config), stores=True).name == kernel.name
    with pytest.raises(ValueError, match="tma_stores needs tma"):
        fd.generate_header(params, config, False, False, False, "e", tma_stores=True)


def test_row_map_arguments_are_encoded_once_per_tensor(monkeypatch):
    """A row map's launch argument is encoded once for a tensor's address, shape, strides and
    dtype (and box and L2 promotion): the same tensor, or another at the same address and of the
    same shape, gets the kept one; another address, shape, box or promotion, a new one; the
    oldest beyond MAP_ARGUMENTS_KEPT are dropped. What is kept is what encoding gives."""
    monkeypatch.setattr(fd, "_MAP_ARGUMENTS", type(fd._MAP_ARGUMENTS)())
    monkeypatch.setattr(fd, "MAP_ARGUMENTS_KEPT", 3)
    cpu = torch.device("cpu")
    x = torch.zeros(2, 16, 4, 8, dtype=torch.half).to(memory_format=torch.channels_last)
    first = fd.row_map_argument(x, 2, 16, cpu)
    assert first == fd.row_map(x, 2, 16).emulator_bytes()
    assert fd.row_map_argument(x, 2, 16, cpu) is first
    assert fd.row_map_argument(x.view(x.shape), 2, 16, cpu) is first  # same address and layout
    assert fd.row_map_argument(x, 2, 24, cpu) is not first  # another box
    y = x.clone(memory_format=torch.channels_last)
    assert fd.row_map_argument(y, 2, 16, cpu) == fd.row_map(y, 2, 16).emulator_bytes() != first
    assert fd.row_map_argument(x, 2, 16, cpu) is first and len(fd._MAP_ARGUMENTS) == 3
    fd.row_map_argument(x[:1], 2, 16, cpu)  # another shape: the least recently used (x, 24) goes
    assert len(fd._MAP_ARGUMENTS) == 3 and fd.row_map_argument(x, 2, 16, cpu) is first
    assert all(key[-2:] == (16, 0) for key in fd._MAP_ARGUMENTS)  # pixels, L2 promotion
    # Two tensors at one address, of one shape and dtype, with other strides: two maps.
    storage = torch.zeros(2 * 4 * 16 * 16, dtype=torch.half)
    dense = storage[: 2 * 4 * 8 * 16].view(2, 4, 8, 16).permute(0, 3, 1, 2)
    wide = storage.view(2, 4, 16, 16).permute(0, 3, 1, 2)[:, :, :, :8]
    assert dense.data_ptr() == wide.data_ptr() and dense.shape == wide.shape
    for t in (dense, wide):
        assert fd.row_map_argument(t, 2, 16, cpu) == fd.row_map(t, 2, 16).emulator_bytes()
    assert fd.row_map_argument(dense, 2, 16, cpu) != fd.row_map_argument(wide, 2, 16, cpu)
    # Another L2 promotion: a map of its own (the same bytes in the emulator's layout).
    promoted = fd.row_map_argument(x, 2, 16, cpu, 128)
    assert promoted is not fd.row_map_argument(x, 2, 16, cpu) and promoted == first


@pytest.mark.parametrize("groups,pixels", [(8, 32), (4, 16), (2, 64), (1, 48)])
def test_tma_output_staging_is_where_tensor_copies_read(groups, pixels):
    """The output staging a `tma_stores` kernel is built with (output_staging) holds each
    chunk where a tensor copy with tma_swizzle reads box element (pixel x, chunk g), as the
    input stages do (test_tma_stage_layout_is_where_tensor_copies_land); both its rows, and the
    staging itself after the stages and weights, start at multiples of tma_align. A warp's
    staging writes (lane l: pixel x0 + l / 4, its group's chunk, pair l % 4) fall in 32
    different banks, as in the padded layout that plain stores read (but for one group a block,
    whose padded pixels span 32 bytes: two lanes a bank there)."""
    from spio.generators import TensorSpec

    spec = fd.output_staging("__half2", pixels, groups, tma_stores=True)
    span, align = fd.tma_swizzle(groups), fd.tma_align(groups)
    pitch = pixels * groups * 16
    assert pitch % align == 0
    for buf in range(2):
        for x in range(pixels):
            for g in range(groups):
                linear = buf * pitch + (x * groups + g) * 16
                if span:
                    linear ^= ((linear >> 7) & (span // 16 - 1)) << 4
                assert spec.offset(buf=buf, x=x, k8=g) * 16 == linear, (buf, x, g)
    padded = fd.output_staging("__half2", pixels, groups, tma_stores=False)
    for g, x0 in itertools.product(range(groups), range(0, pixels, 8)):
        banks = {(spec.offset(buf=1, x=x0 + lane // 4 % 8, k8=g) * 4 + lane % 4) % 32
                 for lane in range(32)}  # fmt: skip
        assert len(banks) == 32, (g, x0, sorted(banks))
        banks = {padded.offset(buf=1, x=x0 + lane // 4 % 8, k8=g, k2=lane % 4) % 32
                 for lane in range(32)}  # fmt: skip
        assert len(banks) == (16 if groups == 1 else 32), ("padded", g, x0, sorted(banks))
    layer = Conv2dGw8Params(n=1, c=8 * groups, h=16, w=pixels, padding=2, r=5, s=3)
    for config in fd.configs(layer):
        in_x = config.block_q + layer.s - 1
        stages = TensorSpec("S", "uint4", *fd.stage_layout("stage", 3, config.groups, in_x, True,
                                                          tma=True))  # fmt: skip
        weights = config.groups * layer.r * layer.s * 64 * 2  # SmemWeights::num_bytes
        assert (stages.size * 16 + weights) % fd.tma_align(config.groups) == 0, config


@pytest.mark.parametrize("offset", [16, 528, 1008])
def test_tma_kernels_align_their_stages_wherever_shared_memory_starts(offset, monkeypatch):
    """A GPU promises dynamic shared memory 16-byte alignment only; the tensor-copy kernels round
    their stages (and, storing output rows by tensor copies, their output staging after them) up
    to the swizzle's repeat within the room the factory leaves. Emulated with
    the buffer starting `offset` bytes past a 1024-byte boundary (SPIO_EMULATOR_SHARED_OFFSET),
    every pass still matches the reference: misaligned stages would be refused (the emulator
    checks a swizzled copy's destination) and too little room would run past the buffer."""
    from spio.check import run_one
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    monkeypatch.setenv("SPIO_EMULATOR_SHARED_OFFSET", str(offset))
    cases = (SWIZZLED_CASES[3], SWIZZLED_CASES[1])  # 8 and 2 groups
    for (pass_, params, config), stores in itertools.product(cases, (False, True)):
        kernel = fd.make_kernel(params, config, igrad=pass_ == "dgrad", tma=True, tma_stores=stores)
        ratio = run_one(params, pass_, config, "cpu", kernel=kernel)
        assert ratio <= 1.0, f"{kernel.name}, offset {offset}: {ratio:.3g} times the tolerance"
    params = Conv2dGw8Params(n=2, c=32, h=5, w=13, padding=(1, 2), r=2, s=5)
    config = wg.Conv2dGw8WgradConfig(groups=4, block_p=4, block_q=16, warp_q8=2, stages=3)
    kernel = wg.make_kernel(params, config, partials=True, tma=True)
    ratio = run_one(params, "wgrad", config, "cpu", kernel=kernel)
    assert ratio <= 1.0, f"{kernel.name}, offset {offset}: {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("value", ["sixteen", "8", "1024"])
def test_the_emulated_shared_offset_must_be_a_multiple_of_16_below_1024(monkeypatch, value):
    """Refused naming the setting at the launch too (spio's commands check it before any work)."""
    from spio.check import run_one

    monkeypatch.setenv("SPIO_EMULATOR_SHARED_OFFSET", value)
    params, config = SWIZZLED_CASES[1][1:]
    with pytest.raises(
        ValueError, match="SPIO_EMULATOR_SHARED_OFFSET must be a multiple of 16 in 0..1008"
    ):
        run_one(params, "dgrad", config, "cpu")


def test_a_kernel_of_another_pass_is_refused():
    """FProp ran a DGrad kernel (wrong numbers, no error), and a WGrad kernel read FProp's
    arguments as its own (out of bounds); each pass now refuses another's kernel."""
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    layer = Conv2dGw8Params(n=1, c=8, h=6, w=6, padding=1)
    t = random_inputs(layer, 0)
    fprop_k, dgrad_k = fd.make_kernel(layer), fd.make_kernel(layer, igrad=True)
    wgrad_k = wg.make_kernel(layer)
    calls = {
        "fprop": lambda k: fd.fprop(t["x"], t["w"], None, layer, kernel=k),
        "dgrad": lambda k: fd.dgrad(t["dy"], t["w"], layer, kernel=k),
        "wgrad": lambda k: wg.wgrad(t["x"], t["dy"], layer, kernel=k),
    }
    kernels = {"fprop": fprop_k, "dgrad": dgrad_k, "wgrad": wgrad_k}
    for pass_, call in calls.items():
        for other, kernel in kernels.items():
            if other != pass_:
                match = f"computes {other}, not {pass_}"
                with pytest.raises(ValueError, match=match):
                    call(kernel)


def test_a_config_of_the_other_family_is_a_type_error():
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    layer = Conv2dGw8Params(n=1, c=8, h=4, w=4)
    with pytest.raises(TypeError, match="needs a Conv2dGw8Config, got Conv2dGw8WgradConfig"):
        fd.make_kernel(layer, wg.Conv2dGw8WgradConfig())
    with pytest.raises(TypeError, match="needs a Conv2dGw8WgradConfig, got Conv2dGw8Config"):
        wg.make_kernel(layer, fd.Conv2dGw8Config())


def test_a_block_may_have_exactly_the_shared_memory_limit():
    """A kernel needing MAX_SHARED_BYTES fits; one byte more does not (no config of the layer
    table lands on the limit, so the boundary is pinned here)."""
    limit = fd.MAX_SHARED_BYTES
    assert fd.check_shared_mem(limit, "k", tma=False) == limit
    with pytest.raises(ValueError, match=f"k needs {limit + 1} bytes of shared memory"):
        fd.check_shared_mem(limit + 1, "k", tma=False)
