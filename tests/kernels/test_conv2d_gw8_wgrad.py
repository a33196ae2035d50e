"""WGrad kernel: NVRTC builds for every arch, and dw (and dbias) against the float64 reference in
the CPU emulator (sampled configs in CI, more with -m slow) and on a GPU (-m cuda)."""

import numpy as np
import pytest

import spio
from spio.check import run_one
from spio.kernels import conv2d_gw8_wgrad_factory as wg
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.kernels.families import FAMILY_OF_PASS
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


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_sampled_configs_compile_without_spills(arch):
    assert_sample_compiles_without_spills("conv2d_gw8_wgrad", arch, count=8, seed=13)


def test_default_kernels_fit_the_launch_limits():
    """The heuristic's pick of every test layer builds kernels (both reductions) that a GPU can
    launch."""
    for params in CI_LAYERS + SLOW_LAYERS:
        for partials in (True, False):
            kernel = wg.make_kernel(params, wg.default_config(params), partials=partials)
            assert 32 <= kernel.threads <= 1024 and kernel.shared_mem_bytes <= wg.MAX_SHARED_BYTES
            assert kernel.grid[0] < 2**31 and max(kernel.grid[1:]) <= 65535, kernel.grid


@pytest.mark.parametrize(
    "bad",
    [
        dict(block_n=0),
        dict(block_q=12),
        dict(block_q=8, warp_q8=2),
        dict(groups=64),
    ],  # fmt: skip
)
def test_bad_configs_are_rejected(bad):
    with pytest.raises(ValueError, match="Conv2dGw8WgradConfig needs"):
        wg.Conv2dGw8WgradConfig(**bad)


def test_config_fields_of_the_wrong_type_are_type_errors():
    for bad in (True, 2.0, "2", None):
        with pytest.raises(TypeError, match="^Conv2dGw8WgradConfig needs an integer stages, got "):
            wg.Conv2dGw8WgradConfig(stages=bad)
    assert wg.Conv2dGw8WgradConfig(stages=np.int32(4)) == wg.Conv2dGw8WgradConfig(stages=4)


@pytest.mark.parametrize(
    "layer,arch",
    [
        (Conv2dGw8Params(n=256, c=512, h=8, w=8), "sm_80"),
        (Conv2dGw8Params(n=256, c=368, h=7, w=7), "sm_86"),
        (Conv2dGw8Params(n=128, c=1024, h=7, w=7, padding=2, r=5, s=5), "sm_90"),
    ],
    ids=["512c_8x8_sm80", "368c_7x7_sm86", "1024c_7x7_5x5_sm90"],
)
def test_the_heuristic_picks_no_images_per_block_no_gpu_has_run(layer, arch):
    """16 images a block had never run on a GPU, yet the heuristic's cost made them the pick of
    these layers on GPUs without a model (14 of 1,080 layer, batch and arch cases); they rank
    last now, as FProp/DGrad's keeps one image a block, and come first again once a GPU run
    takes 16 out of UNTIMED_BLOCK_N."""
    from spio.kernels.conv2d_gw8_factory import typical_machine
    from spio.kernels.families import FAMILY_OF_PASS
    from spio.kernels.perf_model import heuristic_ranking

    machine = typical_machine(arch)
    cheapest = min(wg.configs(layer), key=lambda c: (wg.estimated_cost(layer, c, machine), c))
    assert cheapest.block_n in wg.UNTIMED_BLOCK_N
    assert wg.default_config(layer, machine=machine).block_n not in wg.UNTIMED_BLOCK_N
    ranked = heuristic_ranking(FAMILY_OF_PASS["wgrad"], layer, wg.configs(layer), machine)
    untimed = [c.block_n in wg.UNTIMED_BLOCK_N for c in ranked]
    assert any(untimed) and untimed == sorted(untimed)


def _cases(layers, configs_per_layer, seed):
    for index, params in enumerate(layers):
        for config in sample_configs(params, "wgrad", configs_per_layer, seed + index):
            yield pytest.param(params, config, id=f"{params.encode()}-{config.encode()}")


@pytest.mark.parametrize("params,config", list(_cases(CI_LAYERS, 1, seed=3)))
def test_emulated_wgrad_matches_reference(params, config):
    check(params, "wgrad", config, "cpu")


@pytest.mark.parametrize("params", CI_LAYERS, ids=lambda p: p.encode())
def test_emulated_atomic_wgrad_matches_reference(params):
    """The atomic kernel (dw zeroed, blocks add into it), which spio runs where the partial sums
    would pass 64 MiB, against the float64 reference like the partial-sums one."""
    _check_atomic(params, wg.default_config(params))


def _column_warps(config) -> int:
    """Warps side by side along a WGrad tile's columns (each adds its own sums into dw)."""
    return config.block_q // (8 * config.warp_q8)


def _most_column_warps(params):
    """The first of the layer's configs with the most warps along a tile's columns."""
    return max(wg.configs(params), key=_column_warps)  # max keeps the first of equals


@pytest.mark.parametrize(
    "params",
    [p for p in CI_LAYERS if _column_warps(_most_column_warps(p)) > 1],
    ids=lambda p: p.encode(),
)
def test_emulated_atomic_wgrad_adds_every_warps_sums(params):
    """The atomic kernel with several warps along a tile's columns, each adding its own sums:
    the CI layers' default configs have one such warp, and a kernel that added only the first
    warp's sums had passed every test but the slow sweep (which runs the partial sums)."""
    _check_atomic(params, _most_column_warps(params))


def test_emulated_atomic_bias_gradient_adds_every_warps_and_blocks_sums():
    """Mutation testing (2026-12-06): an atomic dbias added by the first column warp alone had
    one test alone to catch it. Here a biased layer with several column warps and blocks of 4
    of its 5 images (the last block ragged), the bias gradient compared on its own."""
    import torch

    from spio.check import random_inputs
    from spio.reference import conv2d_gw8_bias_grad_ref, conv2d_gw8_tolerance

    params = Conv2dGw8Params(n=5, c=8, h=3, w=40, padding=1, r=3, s=3, has_bias=True)
    config = next(c for c in wg.configs(params) if _column_warps(c) > 1 and c.block_n == 4)
    t = random_inputs(params, seed=3)
    _, dbias = wg.wgrad(t["x"], t["dy"], params, kernel=wg.make_kernel(params, config))
    tolerance = conv2d_gw8_tolerance(params, "wgrad", t["dy"], torch.ones(1))
    tolerance.assert_close(dbias, conv2d_gw8_bias_grad_ref(t["dy"]), config.encode())


def _check_atomic(params, config):
    kernel = wg.make_kernel(params, config, partials=False)
    assert not kernel.info_value("partials")
    ratio = run_one(params, "wgrad", config, "cpu", kernel=kernel)
    assert ratio <= 1.0, f"{params.encode()} {config.encode()}: {ratio:.3g} x the tolerance"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("config", ["g1_p8_q64_n1_w4_s4_k16", "g1_p4_q64_n1_w1_s3_k8"])
def test_64_column_tiles(config, device):
    """WGrad tiles of 64 dy columns: 70 columns make one full tile and one of 6."""
    params = Conv2dGw8Params(n=1, c=16, h=5, w=70, padding=(1, 2), r=3, s=5, has_bias=True)
    check(params, "wgrad", FAMILY_OF_PASS["wgrad"].config_named(params, config), device)


def test_atomic_kernel_builds_where_partial_sums_would_pass_2_gib():
    """A config whose partial sums would pass 2 GiB still has its atomic kernel (it used to
    fail: the header declared the unused partial-sum tensors, too large for a TensorSpec);
    its partials kernel is refused, naming the bytes."""
    params = Conv2dGw8Params(n=256, c=96, h=56, w=56, padding=2, r=5, s=5)
    config = next(c for c in wg.configs(params) if wg.partial_bytes(params, c) > 2**31)
    kernel = wg.production_kernel(params, config)
    assert not kernel.info_value("partials")
    assert all("DWPart" not in text for _, text in kernel.headers)
    with pytest.raises(ValueError, match=r"partial sums would take \d+ bytes, more than the"):
        wg.make_kernel(params, config, partials=True)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("partials", [True, False], ids=["partials", "atomics"])
@pytest.mark.parametrize("block_n", [1, 4])
def test_one_build_serves_every_batch_size(block_n, partials, device):
    """The WGrad kernels take the batch size at launch: a layer's kernels for N = 5 and N = 9
    share one name and header (one build) and differ in their grids, and each batch's dw and
    dbias are right (partial sums: NaN-poisoned buffers, as many slots as that batch's grid;
    four images a block: the last block of either batch part empty, a "ragged" build that checks
    each image against the batch size; N = 8 fills its blocks and gets the build without)."""
    from spio.check import run_one

    layers = [
        Conv2dGw8Params(n=n, c=16, h=6, w=9, padding=1, r=3, s=2, has_bias=True) for n in (5, 9, 8)
    ]
    config = next(c for c in wg.configs(layers[0]) if c.block_n == block_n)
    kernels = [wg.make_kernel(p, config, partials=partials) for p in layers]
    assert kernels[0].name == kernels[1].name and kernels[0].headers == kernels[1].headers
    assert kernels[0].grid != kernels[1].grid
    assert (kernels[2].name == kernels[0].name) == (block_n == 1)
    assert ("__ragged" in kernels[0].name) == (block_n == 4) and "__ragged" not in kernels[2].name
    assert wg.partial_slots(layers[0], config) != wg.partial_slots(layers[1], config)
    for params, kernel in zip(layers, kernels, strict=True):
        ratio = run_one(params, "wgrad", config, device, kernel=kernel)
        assert ratio <= 1.0, f"N = {params.n}: worst error {ratio:.3g} times the tolerance"


#: Trial configs (eight 8-column runs a warp) as gpu_check's ablate step times them, and on
#: layers with a tile past the output's columns, several images a block and a partial group block.
TRIAL_CASES = [
    (Conv2dGw8Params(n=5, c=16, h=6, w=70, padding=(1, 2), r=3, s=5, has_bias=True),
     "g2_p4_q64_n4_w8_s3_k16"),
    (Conv2dGw8Params(n=2, c=24, h=9, w=64, padding=1, r=3, s=3, dtype="bf16"),
     "g2_p8_q64_n1_w8_s2_k8"),
]  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("partials", [True, False], ids=["partials", "atomics"])
@pytest.mark.parametrize("params,name", TRIAL_CASES, ids=[name for _, name in TRIAL_CASES])
def test_trial_configs_match_reference(params, name, partials, device):
    """A trial config is timed on a GPU before it may join the config space: it must compute
    dw (and dbias) right, with either reduction, though spio never picks it."""
    family = FAMILY_OF_PASS["wgrad"]
    config = family.config_named(params, name, trial=True)
    assert config not in family.configs(params)
    kernel = wg.make_kernel(params, config, partials=partials)
    ratio = run_one(params, "wgrad", config, device, kernel=kernel)
    assert ratio <= 1.0, f"{params.encode()} {name}: worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_trial_configs_compile_without_spills(arch):
    """The trial configs gpu_check times on the headline layer build for every arch without a
    warning or a spill."""
    from spio.bench.layers import layer_table
    from spio.compiler import compile_many

    (headline,) = [layer for layer in layer_table() if layer.name == "64c_64x64_3x3"]
    params = headline.params(128, "fp16")
    family = FAMILY_OF_PASS["wgrad"]
    names = ("g2_p64_q64_n1_w8_s2_k16", "g2_p32_q64_n4_w8_s6_k16")
    configs = [family.config_named(params, name, trial=True) for name in names]
    kernels = [family.make_kernel(params, config) for config in configs]
    results = compile_many([k.compile_job(arch) for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        assert result.warnings == [] and not result.resources[kernel.entry].spills, kernel.name


def test_spio_never_picks_a_trial_config():
    """Trial configs are apart from the space the heuristic, the models and autotuning rank:
    none is in configs(), and config_named finds one only when asked for trial configs."""
    params = TRIAL_CASES[0][0]
    family = FAMILY_OF_PASS["wgrad"]
    trial = family.trial_configs(params)
    assert trial and all(c.warp_q8 in wg.TRIAL_WARP_Q8 for c in trial)
    for layer in CI_LAYERS + SLOW_LAYERS + [params]:
        assert not set(family.configs(layer)) & set(family.trial_configs(layer))
    with pytest.raises(ValueError, match="has no config 'g2_p4_q64_n4_w8_s3_k16'"):
        family.config_named(params, "g2_p4_q64_n4_w8_s3_k16")
    assert FAMILY_OF_PASS["fprop"].trial_configs(params) == []


@pytest.mark.slow
@pytest.mark.parametrize("params,config", list(_cases(SLOW_LAYERS, SLOW_CONFIGS, seed=11)))
def test_emulated_wgrad_matches_reference_sweep(params, config):
    check(params, "wgrad", config, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("params,config", list(_cases(CI_LAYERS + SLOW_LAYERS, 2, seed=5)))
def test_gpu_wgrad_matches_reference(params, config, gpu_kernels_compiled):
    check(params, "wgrad", config, "cuda")


def test_every_config_has_its_own_kernel_name():
    params = Conv2dGw8Params(n=4, c=64, h=20, w=19, r=3, s=3)
    names = {wg.make_kernel(params, c).name for c in wg.configs(params)}
    assert len(names) == len(wg.configs(params))


@pytest.mark.parametrize(
    "params,config",
    [
        (
            Conv2dGw8Params(n=2, c=16, h=7, w=21, padding=1, r=3, s=3, has_bias=True),
            wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=16, warp_q8=2, mma_k=16),
        ),
        (
            Conv2dGw8Params(
                n=1, c=8, h=6, w=33, padding=(2, 1), r=5, s=2, dtype="bf16", has_bias=True
            ),
            wg.Conv2dGw8WgradConfig(groups=1, block_p=4, block_q=32, warp_q8=2, mma_k=16),
        ),
    ],
    ids=["fp16_3x3", "bf16_5x2"],
)
def test_emulated_wgrad_sixteen_pixels_per_mma(params, config):
    """mma_k = 16 sums two 8-pixel runs per m16n8k16 (dw and the fused bias gradient)."""
    assert config in wg.configs(params)
    check(params, "wgrad", config, "cpu")


@pytest.mark.parametrize(
    "params,config",
    [
        (  # several images per block (one block half empty), two warps per group, bias
            Conv2dGw8Params(n=5, c=16, h=6, w=9, padding=1, r=3, s=2, has_bias=True),
            wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=16, block_n=4, warp_q8=1),
        ),
        (  # odd R with m16n8k16, a partial group block (3 groups, 2 per block), ragged tiles
            Conv2dGw8Params(n=2, c=24, h=9, w=13, padding=(2, 1), r=5, s=3, dtype="bf16"),
            wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=16, warp_q8=2, mma_k=16),
        ),
    ],
    ids=lambda v: v.encode() if hasattr(v, "encode") else str(v),
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_partial_sums_cover_every_slot_and_match_reference(params, config, device):
    """The partials variant writes every slot of its buffers exactly where the sum expects it:
    NaN-poisoned buffers, summed, match the float64 reference (a missed slot would be NaN)."""
    import torch

    from spio.kernels.conv2d_gw8_factory import nhwc_operand
    from spio.reference import (
        conv2d_gw8_bias_grad_ref,
        conv2d_gw8_tolerance,
        conv2d_gw8_wgrad_ref,
    )

    assert config in wg.configs(params)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[params.dtype]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(params.input_shape, generator=gen).to(dtype).to(device)
    dy = torch.randn(params.output_shape, generator=gen).to(dtype).to(device)
    kernel = wg.make_kernel(params, config, partials=True)
    assert kernel.name.endswith("__partials")
    slots = wg.partial_slots(params, config)
    nan = float("nan")
    part_size = params.c * 8 * params.r * params.s
    dw_slots = torch.full((slots, part_size), nan, device=device)
    db_parts = torch.full((slots, params.c), nan, device=device) if params.has_bias else None
    kernel.launch(
        [dw_slots, db_parts, nhwc_operand(x), nhwc_operand(dy), params.n], torch.device(device)
    )
    dw_parts = _slots_as_weights(dw_slots, params)
    x, dy = x.cpu(), dy.cpu()
    want = conv2d_gw8_wgrad_ref(x.double(), dy.double(), params.padding, params.r, params.s)
    conv2d_gw8_tolerance(params, "wgrad", x, dy).assert_close(dw_parts.sum(0).cpu(), want)
    if params.has_bias:
        tol = conv2d_gw8_tolerance(params, "wgrad", dy, torch.ones(1))
        tol.assert_close(db_parts.sum(0).cpu(), conv2d_gw8_bias_grad_ref(dy.double()))
    x, dy = x.to(device), dy.to(device)
    # The wrapper gives the same sums (sum_slots adds the slots in its fixed order), and the
    # same bits on every run.
    dw, db = wg.wgrad(x, dy, params, kernel=kernel)
    assert torch.equal(dw, _slot_order_sum(dw_parts)) and torch.equal(
        dw, wg.wgrad(x, dy, params, kernel=kernel)[0]
    )
    if params.has_bias:
        assert torch.equal(db, _slot_order_sum(db_parts))
    assert wg.partial_bytes(params, config) == 4 * slots * (
        params.c * 8 * params.r * params.s + (params.c if params.has_bias else 0)
    )


@pytest.mark.parametrize("partials", [True, False], ids=["partials", "atomic"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_both_reductions_compile_without_spills(arch, partials):
    """Both kernels spio runs: per-warp partial sums (most layers) and atomics (where the
    partial sums would pass 64 MiB; no test layer is that large, so family-level sampling,
    which builds what spio would run, never builds an atomic kernel), without compiler
    warnings (layers with and without a bias, each kernel's other mma width unused)."""
    from spio.compiler import compile_many

    kernels = [wg.make_kernel(p, wg.default_config(p), partials=partials) for p in CI_LAYERS[:4]]
    for kernel, result in zip(
        kernels, compile_many([k.compile_job(arch) for k in kernels], progress=False), strict=True
    ):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        assert not result.resources[kernel.entry].spills, kernel.name
        assert result.warnings == [], kernel.name


def test_emulated_wgrad_with_several_copies_per_thread():
    """One warp copies 34 x elements a step: two copies per thread, the second partly idle (the
    row-independent part of each copy's addresses is worked out once per block)."""
    params = Conv2dGw8Params(n=2, c=8, h=9, w=40, padding=1, r=3, s=3, has_bias=True)
    config = wg.Conv2dGw8WgradConfig(groups=1, block_p=4, block_q=32, warp_q8=4, stages=3)
    assert config in wg.configs(params) and config.threads == 32
    check(params, "wgrad", config, "cpu")


@pytest.mark.parametrize(
    "params,config",
    [
        (Conv2dGw8Params(n=5, c=16, h=9, w=10, padding=1, r=3, s=3, has_bias=True),
         wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=16, block_n=4, warp_q8=2, stages=6)),
        (Conv2dGw8Params(n=2, c=8, h=11, w=7, padding=2, r=5, s=4),
         wg.Conv2dGw8WgradConfig(groups=1, block_p=8, block_q=8, warp_q8=1, stages=4, mma_k=8)),
    ],
    ids=["s6-images-across-steps", "s4-r5"],
)  # fmt: skip
def test_emulated_wgrad_deep_pipelines(params, config):
    """4 and 6 row buffers: more steps in flight than filter rows, and (block_n 4) steps that
    run across image boundaries; the dy ring then has R + 6 slots."""
    assert config in wg.configs(params)
    check(params, "wgrad", config, "cpu")


def _slots_as_weights(parts, params):
    """Partial-sum slots (slots, dw elements) in a slot's layout (wg.slot_dims), as (slots,
    *params.weight_shape) in PyTorch's weight layout."""
    dims = wg.slot_dims(params)
    shaped = parts.reshape(parts.shape[0], *dims.values())
    order = [0, *(1 + list(dims).index(d) for d in ("k8", "k", "c", "r", "s"))]
    return shaped.permute(order).reshape(parts.shape[0], *params.weight_shape)


def _slot_order_sum(parts):
    """The sum over t of parts[t] in fp32, in sum_slots' order: slot t in group t mod
    SUM_GROUPS, each group's slots added in increasing t to 0.0, then the group sums, group 0
    first, added to 0.0."""
    import torch

    total = torch.zeros_like(parts[0])
    for g in range(wg.SUM_GROUPS):
        group = torch.zeros_like(parts[0])
        for t in range(g, len(parts), wg.SUM_GROUPS):
            group += parts[t]
        total += group
    return total


def _in_order_sum(parts):
    """parts[0] + parts[1] + ... in fp32, in that order."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dw_dtype,dbias_dtype", [("fp32", "fp32"), ("fp16", "fp32"),
                                                  ("bf16", "bf16")])  # fmt: skip
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("slots", [7, 2 * wg.SUM_GROUPS * wg.SUM_BATCH + 5])
def test_sum_slots_adds_in_its_order_and_rounds_once(
    device, dw_dtype, dbias_dtype, channels_last, slots
):
    """sum_slots: every dw and dbias element is the fp32 sum of its slots in sum_slots' fixed
    order (_slot_order_sum; with more slots than a step's loads, the last step part-filled),
    rounded once to the gradient's dtype; dw's columns and dbias's come from their own buffers.
    With channels_last it writes dw in that order, each element where channels_last puts it."""
    import torch

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    params = Conv2dGw8Params(n=1, c=40, h=4, w=4, padding=1, r=3, s=2, has_bias=True)
    w_size = 40 * 8 * 3 * 2
    gen = torch.Generator().manual_seed(0)
    dw_parts = torch.randn(slots, w_size, generator=gen).to(device)
    db_parts = (torch.randn(slots, 40, generator=gen) * 100).to(device)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    dw = torch.full((40, 8, 3, 2), float("nan"), dtype=dtypes[dw_dtype], device=device)
    dw = dw.contiguous(memory_format=layout)
    db = torch.full((40,), float("nan"), dtype=dtypes[dbias_dtype], device=device)
    kernel = wg.sum_kernel(params, dw_dtype, dbias_dtype)
    assert kernel.grid[0] * wg.SUM_COLUMNS >= w_size + 40
    kernel.launch([dw, db, dw_parts, db_parts, slots, int(channels_last)], torch.device(device))
    want_dw = _slot_order_sum(_slots_as_weights(dw_parts, params)).to(dtypes[dw_dtype])
    assert dw.is_contiguous(memory_format=layout)
    assert torch.equal(dw, want_dw)
    assert torch.equal(db, _slot_order_sum(db_parts).to(dtypes[dbias_dtype]))
    if slots > wg.SUM_GROUPS and dw_dtype == "fp32":  # the order shows in the bits
        assert not torch.equal(_slot_order_sum(dw_parts), _in_order_sum(dw_parts))
    assert wg.sum_kernel(params, dw_dtype, dbias_dtype) is kernel  # built once
    with pytest.raises(ValueError, match="fp32, fp16 or bf16|among"):
        wg.sum_kernel(params, "fp64")


def test_sum_slots_name_stands_for_its_code():
    """sum_slots' code depends on the layer's channels, taps and bias and on the two dtypes:
    layers alike in those share its name, header and grid; a change in any gives another name
    and header."""
    import dataclasses

    base = Conv2dGw8Params(n=2, c=16, h=9, w=7, padding=1, r=3, s=2, has_bias=True)
    kernel = wg.sum_kernel(base, "fp16", "fp32")
    alike = dataclasses.replace(base, n=5, h=20, w=4, padding=0, dtype="bf16")
    twin = wg.sum_kernel(alike, "fp16", "fp32")
    assert (twin.name, twin.headers, twin.grid) == (kernel.name, kernel.headers, kernel.grid)
    others = [
        wg.sum_kernel(dataclasses.replace(base, c=24), "fp16", "fp32"),
        wg.sum_kernel(dataclasses.replace(base, r=2, s=3), "fp16", "fp32"),
        wg.sum_kernel(dataclasses.replace(base, has_bias=False), "fp16", "fp32"),
        wg.sum_kernel(base, "bf16", "fp32"),
        wg.sum_kernel(base, "fp16", "fp16"),
    ]
    assert len({k.name for k in [kernel, *others]}) == 6
    assert len({k.headers for k in [kernel, *others]}) == 6


def test_the_slots_are_laid_out_for_the_stores_and_read_in_their_order():
    """Speed, which the results cannot show: a slot holds each tap's 8 x 8 (k by c) innermost,
    so that a WGrad warp's store of one accumulator element touches 8 sectors across its lanes,
    and sum_slots enumerates dw in that same order, so that its warps' reads are coalesced."""
    from spio.generators import IndexSpec, TensorSpec

    params = Conv2dGw8Params(n=2, c=24, h=9, w=7, padding=1, r=3, s=2, has_bias=True)
    dims = wg.slot_dims(params)
    assert list(dims)[-2:] == ["k", "c"] and dims["k"] == dims["c"] == 8
    assert sorted(dims) == sorted(wg.dw_dims(params))
    part = TensorSpec("DWPart", "float", {"t": None, **dims}).generate()
    config = wg.configs(params)[0]
    assert part in dict(wg.make_kernel(params, config, partials=True).headers)[wg.HEADER_NAME]
    summing = dict(wg.sum_kernel(params).headers)[wg.SUM_HEADER_NAME]
    assert TensorSpec("DWPart", "const float", {"t": None, **dims}).generate() in summing
    assert IndexSpec("DwIdx", dims).generate() in summing


def test_one_partials_kernel_sums_into_each_pair_of_gradient_dtypes():
    """wgrad remembers each partials kernel's sum plan per pair of gradient dtypes: the same
    kernel summed into fp16 and bf16 gradients, then into fp32 ones, gives each the same fp32
    sums (sum_slots' fixed order) rounded once to its dtype (a plan reused across dtypes would
    write the wrong type)."""
    import torch

    params = Conv2dGw8Params(n=2, c=16, h=7, w=5, padding=1, r=3, s=3, has_bias=True)
    config = wg.Conv2dGw8WgradConfig(groups=1, block_p=4, block_q=8, warp_q8=1, stages=3)
    kernel = wg.make_kernel(params, config, partials=True)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(params.input_shape, generator=gen).half()
    dy = torch.randn(params.output_shape, generator=gen).half()
    halves = (torch.float16, torch.bfloat16)
    dw16, db16 = wg.wgrad(x, dy, params, kernel=kernel, dtypes=halves, poison=True)
    dw32, db32 = wg.wgrad(x, dy, params, kernel=kernel, poison=True)
    assert dw16.dtype == torch.float16 and db16.dtype == torch.bfloat16
    assert dw32.dtype == db32.dtype == torch.float32 and not dw32.isnan().any()
    assert torch.equal(dw16, dw32.half()) and torch.equal(db16, db32.bfloat16())


def test_sum_slots_builds_for_every_arch():
    from spio.compiler import compile_many

    params = Conv2dGw8Params(n=1, c=16, h=4, w=4, padding=1, has_bias=True)
    kernels = [wg.sum_kernel(params, a, b) for a, b in [("fp32", "fp32"), ("fp16", "bf16")]]
    jobs = [k.compile_job(arch) for k in kernels for arch in spio.supported_arch]
    for job, result in zip(jobs, compile_many(jobs, progress=False), strict=True):
        assert not isinstance(result, BaseException), (job.name, result)
        assert result.resources and not any(r.spills for r in result.resources.values()), job.name
        assert result.warnings == [], job.name  # each build leaves a round_to unused


def test_sixteen_images_per_block_only_on_small_images():
    """block_n 16 is offered where a block's work per image is small (at most SMALL_IMAGE output
    pixels), and computes the right dw across a partly filled last block (N = 19)."""
    small = Conv2dGw8Params(n=19, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True)
    big = Conv2dGw8Params(n=32, c=16, h=20, w=19, padding=1)
    assert any(c.block_n == 16 for c in wg.configs(small))
    assert not any(c.block_n == 16 for c in wg.configs(big))
    config = wg.Conv2dGw8WgradConfig(
        groups=2, block_p=4, block_q=8, block_n=16, warp_q8=1, stages=3
    )
    assert config in wg.configs(small)
    check(small, "wgrad", config, "cpu")
    assert wg.partial_slots(small, config) == 2 * 2  # 2 image blocks x 2 row tiles


def test_configs_span_tiles_up_to_the_output_and_threads_up_to_the_limit():
    """WGrad tiles reach the dy output rounded up (columns to 8, rows to a power of two): an
    18 x 17 dy gets 16 columns and 32 rows at most, and blocks of up to MAX_THREADS threads
    (8 groups of 16 columns, one 8-column run a warp: 16 warps), none more."""
    params = Conv2dGw8Params(n=1, c=64, h=20, w=19, padding=0)
    found = wg.configs(params)
    assert {c.block_q for c in found} == {8, 16}
    assert {c.block_p for c in found} == {4, 8, 16, 32}
    assert {c.groups for c in found} == {1, 2, 4, 8} and {c.block_n for c in found} == {1}
    assert max(c.threads for c in found) == wg.MAX_THREADS == 512
    assert wg.Conv2dGw8WgradConfig(groups=8, block_p=4, block_q=16, warp_q8=1) in found


def test_sixteen_images_per_block_up_to_small_image_pixels_inclusive():
    """SMALL_IMAGE bounds the output pixels inclusively: a 16 x 16 output (256 pixels) is offered
    16 images a block, a 16 x 17 one (272) is not; never with 2 stages (ptxas spills there)."""
    assert wg.SMALL_IMAGE == 16 * 16
    at_limit = Conv2dGw8Params(n=16, c=16, h=16, w=16, padding=1)
    past = Conv2dGw8Params(n=16, c=16, h=16, w=17, padding=1)
    sixteen = [c for c in wg.configs(at_limit) if c.block_n == 16]
    assert sixteen and {c.stages for c in sixteen} == set(wg.STAGES) - {2}
    assert not any(c.block_n == 16 for c in wg.configs(past))
    assert any(c.block_n == 4 for c in wg.configs(past))


def test_partial_sums_while_their_buffer_fits_the_limit(monkeypatch):
    """uses_partial_sums, and so the kernel production_kernel makes, follows the partial-sum
    buffer's size: up to PARTIAL_BYTES inclusive by default, MAX_PARTIAL_BYTES for a
    deterministic WGrad. Worked out by hand: a 2-image 8 x 8 output in 4-row, 8-column tiles of
    one warp column is 2 x 2 x 1 slots of 16 x 8 x 3 x 3 dw and 16 dbias values, in fp32."""
    params = Conv2dGw8Params(n=2, c=16, h=8, w=8, padding=1, r=3, s=3, has_bias=True)
    config = wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=8, block_n=1, warp_q8=1, stages=2)
    size = 4 * 4 * (16 * 8 * 3 * 3 + 16)
    assert wg.partial_slots(params, config) == 4 and wg.partial_bytes(params, config) == size
    assert wg.uses_partial_sums(params, config)
    assert wg.production_kernel(params, config).info_value("partials") is True
    monkeypatch.setattr(wg, "PARTIAL_BYTES", size)
    assert wg.uses_partial_sums(params, config)
    monkeypatch.setattr(wg, "PARTIAL_BYTES", size - 1)
    assert not wg.uses_partial_sums(params, config)
    assert wg.production_kernel(params, config).info_value("partials") is False
    assert wg.uses_partial_sums(params, config, deterministic=True)
    monkeypatch.setattr(wg, "MAX_PARTIAL_BYTES", size - 1)
    assert not wg.uses_partial_sums(params, config, deterministic=True)
    monkeypatch.setattr(wg, "PARTIAL_BYTES", size)
    assert wg.uses_partial_sums(params, config)


#: Layers whose tiles end inside the image: rows and columns of the last tiles past the output,
#: padding 0 (x rows and columns past the output's reach), R and S from 1 to 5, several images
#: per block.
NON_FINITE_LAYERS = [
    Conv2dGw8Params(n=2, c=16, h=13, w=21, padding=0, r=3, s=3),
    Conv2dGw8Params(n=1, c=16, h=10, w=18, padding=(2, 1), r=5, s=2, dtype="bf16", has_bias=True),
    Conv2dGw8Params(n=5, c=16, h=5, w=6, padding=1, r=3, s=3),
    Conv2dGw8Params(n=1, c=8, h=9, w=11, padding=0, r=1, s=4),
]


def _non_finite_cases():
    for index, params in enumerate(NON_FINITE_LAYERS):
        for config in sample_configs(params, "wgrad", 4, seed=40 + index):
            yield pytest.param(params, config, id=f"{params.encode()}-{config.encode()}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("params,config", list(_non_finite_cases()))
def test_non_finite_x_spreads_only_where_pytorch_does(params, config, device):
    """An inf (NaN) in x makes dw non-finite only at the taps where that pixel meets an output
    pixel, as in the float64 reference: not at the taps where it meets the zeros a tile holds
    past the output or outside the tile (inf * 0 = NaN). One non-finite pixel per group, placed in
    turn at the corners, the middle and next to tile edges; dw finite elsewhere and right."""
    h, w = params.h, params.w
    places = {(0, 0), (h - 1, w - 1), (h // 2, w // 2), (0, w - 1), (h - 1, 0)}
    places |= {(min(y, h - 1), min(x, w - 1)) for y in (3, 4, 8) for x in (7, 8, w - 2)}
    _assert_non_finite_x_spreads_only_where_pytorch_does(params, config, device, places)


def _assert_non_finite_x_spreads_only_where_pytorch_does(params, config, device, places):
    """The check of test_non_finite_x_spreads_only_where_pytorch_does, with an inf at each of
    `places` ((y, x) in x, image 0, channel 1) in turn, and a NaN at the mirrored pixel of the
    last image, channel 12 (where the layer has a second group)."""
    import torch

    from spio.check import error_ratio, random_inputs
    from spio.reference import conv2d_gw8_tolerance, conv2d_gw8_wgrad_ref

    t = random_inputs(params, seed=1)
    h, w = params.h, params.w
    kernel = wg.production_kernel(params, config)
    tol = conv2d_gw8_tolerance(params, "wgrad", t["x"], t["dy"])
    for y, x in sorted(places):
        xs = t["x"].clone()
        xs[0, 1, y, x] = float("inf")
        if params.c > 8:
            xs[-1, 12, h - 1 - y, w - 1 - x] = float("nan")
        dw, _ = wg.wgrad(xs.to(device), t["dy"].to(device), params, kernel=kernel, poison=True)
        dw = dw.cpu()
        expected = conv2d_gw8_wgrad_ref(xs, t["dy"], params.padding, params.r, params.s)
        finite = torch.isfinite(expected)
        assert not finite.all(), "the case puts no non-finite product into the sums"
        assert torch.equal(torch.isfinite(dw), finite), (
            f"pixel ({y}, {x}): non-finite at {(~torch.isfinite(dw) & finite).nonzero().tolist()}"
            f" where the reference is finite"
        )
        ratio = error_ratio(dw[finite], expected[finite], tol.atol, tol.rtol)
        assert ratio <= 1.0, f"pixel ({y}, {x}): worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize(
    "params,config",
    [
        # 5 output rows in tiles of 4: the last tile has 1 row, fewer than R - 1 = 2
        (Conv2dGw8Params(n=1, c=16, h=7, w=9, padding=0, r=3, s=3),
         wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=8, warp_q8=1, stages=3)),
        # 7 output rows in tiles of 4: the last has 3, fewer than R - 1 = 4, more than padding 1
        (Conv2dGw8Params(n=1, c=16, h=9, w=10, padding=1, r=5, s=2, dtype="bf16", has_bias=True),
         wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=8, warp_q8=1, stages=4)),
    ],
    ids=["r3-one-row", "r5-three-rows"],
)  # fmt: skip
def test_non_finite_x_in_a_last_row_tile_shorter_than_the_filter(params, config, device):
    """A last row tile with at most R - 1 output rows has no full step (full_steps = 0): every
    step is careful, step R - 1 too, whose dy rows past the output meet x rows inside x (those
    rows lie below the output only by less than R - 1 - padding). An inf in every x row in turn:
    the NON_FINITE_LAYERS' tiles all leave more than R - 1 rows or meet only padding there."""
    assert config in wg.configs(params)
    h, w = params.h, params.w
    places = {(y, x) for y in range(h) for x in (0, w - 1)}
    _assert_non_finite_x_spreads_only_where_pytorch_does(params, config, device, places)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize(
    "config",
    [
        # two warps along the tile's columns: the second's 8 columns all past the output
        wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=16, warp_q8=1, stages=3),
        # one warp, 16 pixels an mma: the mma's second 8-pixel run all past the output
        wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=16, warp_q8=2, stages=3, mma_k=16),
    ],
    ids=lambda c: c.encode(),
)
def test_non_finite_x_where_a_warp_or_run_starts_past_the_output(config, device):
    """24 output columns in tiles of 16 (padding 0, S = 3): the last tile's second 8 columns
    start at the output's edge, where x still has S - 1 columns. Their column masks depend on
    the warp's first column and on the run within a 16-pixel mma; x's last columns must reach
    only the taps that meet output columns (in the NON_FINITE_LAYERS, the columns a warp or a
    second run holds past the output meet only x's padding)."""
    params = Conv2dGw8Params(n=1, c=16, h=6, w=26, padding=0, r=3, s=3)
    assert params.q == 24 and config in wg.configs(params)
    h, w = params.h, params.w
    places = {(y, x) for y in (0, h // 2, h - 1) for x in (w - 3, w - 2, w - 1)}
    _assert_non_finite_x_spreads_only_where_pytorch_does(params, config, device, places)


def _load_via_regs_cases():
    """WGrad configs for the SPIO_LOAD_VIA_REGS timing variant: every stage count (1 to 5 steps in
    flight through registers), several images per block, partial tiles and group blocks."""
    import random

    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P

    layers = [
        P(n=3, c=24, h=20, w=19, padding=1, r=3, s=3, has_bias=True),
        P(n=2, c=16, h=11, w=10, padding=2, r=5, s=3, dtype="bf16"),
        P(n=17, c=8, h=6, w=5, padding=(0, 2), r=1, s=5, has_bias=True),
        P(n=1, c=40, h=3, w=17, padding=(1, 0), r=2, s=2),
    ]
    rng = random.Random(6)
    for params in layers:
        by_stages = {}
        for config in wg.configs(params):
            by_stages.setdefault(config.stages, []).append(config)
        for stages in sorted(by_stages):
            config = rng.choice(by_stages[stages])
            yield pytest.param(params, config, id=f"{params.encode()}-{config.encode()}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("params,config", list(_load_via_regs_cases()))
def test_load_via_regs_variant_matches_reference(params, config, device):
    """scripts/ablate_kernel.py's `ldg` variant of WGrad (x and dy rows through registers instead
    of cp.async), as spio runs it (partial sums or atomics), against the float64 reference."""
    from spio.check import run_one

    kernel = load_via_regs(wg.production_kernel(params, config))
    assert "SPIO_LOAD_VIA_REGS" in kernel.headers[0][1]
    ratio = run_one(params, "wgrad", config, device, kernel=kernel)
    assert ratio <= 1.0, f"{kernel.name}: worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_load_via_regs_variant_builds_without_spills(arch):
    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1)
    by_name = {c.encode(): c for c in wg.configs(params)}
    for name in ("g2_p32_q64_n4_w4_s6_k8", "g1_p64_q32_n1_w4_s2_k16", "g2_p32_q64_n4_w4_s3_k8"):
        kernel = load_via_regs(wg.production_kernel(params, by_name[name]))
        usage = kernel.compile(arch).resources[kernel.entry]
        assert not usage.spills and usage.registers * kernel.threads <= 65536, (name, usage)


SWIZZLED_CASES = [
    # every group count; x rows of a pixel count that is no multiple of 8; 16 pixels an mma;
    # several images a block (the last block partly past the batch); a last tile past the
    # output (column masks on swizzled rows)
    (Conv2dGw8Params(n=2, c=8, h=9, w=21, padding=1, r=3, s=3, has_bias=True),
     wg.Conv2dGw8WgradConfig(groups=1, block_p=4, block_q=16, warp_q8=2, stages=3, mma_k=16)),
    (Conv2dGw8Params(n=5, c=16, h=6, w=10, padding=2, r=5, s=3, dtype="bf16"),
     wg.Conv2dGw8WgradConfig(groups=2, block_p=8, block_q=16, block_n=4, warp_q8=1, stages=4)),
    (Conv2dGw8Params(n=1, c=40, h=7, w=26, padding=0, r=3, s=3),
     wg.Conv2dGw8WgradConfig(groups=4, block_p=4, block_q=16, warp_q8=1, stages=3)),
    (Conv2dGw8Params(n=2, c=64, h=5, w=13, padding=(1, 2), r=2, s=5, has_bias=True),
     wg.Conv2dGw8WgradConfig(groups=8, block_p=4, block_q=16, warp_q8=2, stages=6)),
]  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("partials", [True, False], ids=["partials", "atomics"])
@pytest.mark.parametrize(
    "params,config", SWIZZLED_CASES, ids=[c[1].encode() for c in SWIZZLED_CASES]
)
def test_swizzled_rows_match_reference(params, config, partials, device):
    """x and dy rows staged pixel-major and swizzled (scripts/ablate_kernel.py's `swizzled`,
    timed against the group-major rows) give the same results, with either reduction; its
    `ldg` form too."""
    assert config in wg.configs(params) or config in wg.trial_configs(params)
    kernel = wg.make_kernel(params, config, partials=partials, swizzled=True)
    assert kernel.name.endswith("__swz") and "swizzle_key" in kernel.headers[0][1]
    assert kernel.shared_mem_bytes <= wg.make_kernel(params, config).shared_mem_bytes
    for k in (kernel, load_via_regs(kernel)):
        ratio = run_one(params, "wgrad", config, device, kernel=k)
        assert ratio <= 1.0, f"{k.name}: worst error {ratio:.3g} times the tolerance"


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_swizzled_rows_build_without_spills(arch):
    """The headline layer's WGrad configs, swizzled, build for every arch without spills."""
    from spio.compiler import compile_many

    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1)
    by_name = {c.encode(): c for c in wg.configs(params)}
    names = ("g2_p64_q32_n1_w4_s2_k16", "g2_p32_q64_n4_w4_s6_k8", "g1_p64_q32_n1_w4_s2_k16")
    kernels = [wg.with_swizzled_stages(wg.production_kernel(params, by_name[n])) for n in names]
    results = compile_many([k.compile_job(arch) for k in kernels], progress=False)
    for kernel, result in zip(kernels, results, strict=True):
        assert not isinstance(result, BaseException), f"{kernel.name}: {result}"
        usage = result.resources[kernel.entry]
        assert not usage.spills and usage.registers * kernel.threads <= 65536, (kernel.name, usage)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("partials", [True, False], ids=["partials", "atomics"])
@pytest.mark.parametrize(
    "params,config", SWIZZLED_CASES, ids=[c[1].encode() for c in SWIZZLED_CASES]
)
def test_tma_rows_match_reference(params, config, partials, device):
    """x and dy rows brought in by tensor copies (scripts/ablate_kernel.py's `tma`: thread 0
    copies a step's two rows, which land swizzled, zeros outside x and dy and for the dy rows
    past the tile, an mbarrier a stage) give the same results with either reduction: every
    group count, several images a block with the last partly past the batch, masked columns."""
    import torch

    if device == "cuda" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("tensor copies (TMA) need sm_90 or newer")
    kernel = wg.make_kernel(params, config, partials=partials, tma=True)
    assert kernel.name.endswith("__tma") and kernel.info_value("tma")
    assert kernel.info_value("swizzled") and "#define SPIO_LOAD_VIA_TMA 1" in kernel.headers[0][1]
    assert wg.with_tma_stages(wg.make_kernel(params, config, partials=partials)) == kernel
    ratio = run_one(params, "wgrad", config, device, kernel=kernel)
    assert ratio <= 1.0, f"{kernel.name}: worst error {ratio:.3g} times the tolerance"


def test_tma_rows_build_for_sm_90_and_their_maps():
    """The headline layer's WGrad configs with tensor copies build for sm_90 without spills;
    the maps a launch passes are x's and dy's, boxes of one row of the block's groups; shared
    memory grows by the alignment room and an mbarrier a stage."""
    import torch

    from spio.cuda.tensor_map import TensorMap
    from spio.kernels import conv2d_gw8_factory as fd
    from tests.kernels.test_conv2d_gw8 import assert_tma_kernels_build

    params = Conv2dGw8Params(n=128, c=64, h=64, w=64, padding=1)
    by_name = {c.encode(): c for c in wg.configs(params)}
    names = ("g2_p64_q32_n1_w4_s2_k16", "g2_p32_q64_n4_w4_s6_k8", "g1_p64_q32_n1_w4_s2_k16")
    assert_tma_kernels_build(
        [wg.with_tma_stages(wg.production_kernel(params, by_name[n])) for n in names]
    )
    small = Conv2dGw8Params(n=1, c=16, h=5, w=9, padding=1)
    config = wg.Conv2dGw8WgradConfig(groups=2, block_p=4, block_q=16, warp_q8=2, stages=3)
    kernel = wg.make_kernel(small, config, tma=True)
    x = torch.zeros(small.input_shape, dtype=torch.half).to(memory_format=torch.channels_last)
    dy = torch.zeros(small.output_shape, dtype=torch.half).to(memory_format=torch.channels_last)
    x_box, dy_box = wg.row_boxes(kernel)  # what the launch encodes (row_map_argument)
    assert [fd.row_map(x, *x_box), fd.row_map(dy, *dy_box)] == [
        TensorMap.of_tensor(x, (1, 3, 2, 0), (16, 18, 1, 1), 32),
        TensorMap.of_tensor(dy, (1, 3, 2, 0), (16, 16, 1, 1), 32),
    ]
    swizzled = wg.make_kernel(small, config, swizzled=True)
    x_pad = fd.row_pitch(18, True, tma=True) - 18
    dy_pad = fd.row_pitch(16, True, tma=True) - 16
    rows = (3 * x_pad + (3 + 3) * dy_pad) * 2 * 16
    assert kernel.shared_mem_bytes - swizzled.shared_mem_bytes == rows + fd.tma_align(2) - 16 + 24


def test_tma_l2_promotion_is_the_tma_kernel_with_its_maps_promoted(monkeypatch):
    """make_kernel's tma_l2 (scripts/ablate_kernel.py's tma-l2-*) is the tma kernel under a name
    of its own, whose launches pass x's and dy's maps that promotion; it implies tma, the
    swizzled stages drop it, and a value of no promotion is refused by name. Emulated: the
    same results (the emulator has no L2)."""
    from spio.kernels import conv2d_gw8_factory as fd

    params, config = SWIZZLED_CASES[0]
    tma = wg.make_kernel(params, config, partials=True, tma=True)
    kernel = wg.make_kernel(params, config, partials=True, tma_l2=128)
    assert kernel.info_value("tma") and kernel.info_value("tma_l2") == 128
    assert kernel.name == f"{tma.name}__l2p128" and tma.info_value("tma_l2") == 0
    assert wg.with_tma_stages(wg.make_kernel(params, config, partials=True), l2=128) == kernel
    assert wg.with_swizzled_stages(kernel).name == tma.name.replace("__tma", "__swz")
    asked = spy_on_map_promotions(monkeypatch, wg)
    ratio = run_one(params, "wgrad", config, "cpu", kernel=kernel)
    assert ratio <= 1.0 and asked and set(asked) == {128} and len(asked) % 2 == 0
    with pytest.raises(ValueError, match="conv2d_gw8_wgrad make_kernel needs tma_l2 0, 64, 128"):
        wg.make_kernel(params, config, tma_l2=32)
    assert fd.check_tma_l2("here", np.int32(64)) == 64


def test_sum_kernels_follow_the_dtypes_asked_for():
    """sum_kernels gives the sum_slots kernels of the gradient dtypes asked for, as with_sums
    does, not fp32's whatever the dtypes; none for an atomic kernel."""
    layer = Conv2dGw8Params(n=2, c=16, h=8, w=8, has_bias=True)
    partials = wg.make_kernel(layer, wg.configs(layer)[0], partials=True)
    atomic = wg.make_kernel(layer, wg.configs(layer)[0], partials=False)
    assert wg.sum_kernels([partials, atomic], ("bf16", "fp16")) == [
        wg.sum_kernel(layer, "bf16", "fp16")
    ]
    assert wg.sum_kernels([atomic]) == []
