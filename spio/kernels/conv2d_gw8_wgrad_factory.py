"""WGrad kernel of the group-width-8 convolution: tile configs, generated header, launch shape.

The kernel source is spio/src/conv2d_gw8_wgrad.cu; its leading comment states the algorithm.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..generators import (
    FragmentSpec,
    IndexSpec,
    MacroSpec,
    ParamsSpec,
    Spec,
    TensorSpec,
    generate,
)
from ..memo import remember
from .conv2d_gw8_factory import (
    ELEMENT_TYPES,
    FRAGMENT_ELEMENTS,
    H200_CLASS,
    MAX_SHARED_BYTES,
    MAX_THREADS,
    WGRAD_SOURCE_FILE,
    Machine,
    _check_dtype,
    _check_shapes,
    check_call,
    check_config,
    check_flags,
    check_layer,
    check_shared_mem,
    check_tma_l2,
    grid_tiles,
    input_columns,
    latency_cover,
    nhwc_operand,
    ragged,
    row_map_argument,
    row_pitch,
    sector_waste,
    stage_layout,
    tma_align,
    tma_room,
)
from .conv2d_gw8_params import (
    MAX_TENSOR_BYTES,
    Conv2dGw8Params,
    check_params,
    check_tensor_bytes,
)
from .kernel import Kernel, KernelFactory, entry_symbol

if TYPE_CHECKING:
    import torch
    from torch import Tensor

SOURCE_FILE = WGRAD_SOURCE_FILE
HEADER_NAME = "conv2d_gw8_wgrad_gen.h"

#: The second pass of the partial-sums variant (spio/src/sum_slots.cu).
SUM_SOURCE_FILE = "sum_slots.cu"
SUM_HEADER_NAME = "sum_slots_gen.h"
SUM_ENTRY = "spio_sum_slots"
#: A sum_slots block: SUM_COLUMNS output elements, one a lane; SUM_GROUPS warps, each summing
#: every SUM_GROUPS-th slot of them, SUM_BATCH loads in flight at a time.
SUM_COLUMNS = 32
SUM_GROUPS = 8
SUM_BATCH = 16
#: C++ types of the gradients sum_slots writes, by dtype name.
SUM_TYPES = {"fp32": "float", "fp16": "__half", "bf16": "__nv_bfloat16"}


@dataclass(frozen=True, order=True)
class Conv2dGw8WgradConfig:
    """A tile config: groups per block, dy rows and columns per block, images per block, the
    number of 8-column runs each warp computes, the row buffers (stages - 1 steps in flight), and
    the pixels per mma: 8 (m16n8k8) or 16 (two runs per m16n8k16, half the mma instructions)."""

    groups: int = 8
    block_p: int = 16
    block_q: int = 32
    block_n: int = 1
    warp_q8: int = 2
    stages: int = 2
    mma_k: int = 8

    def __post_init__(self) -> None:
        fields = ("groups", "block_p", "block_q", "block_n", "warp_q8", "stages", "mma_k")
        check_config(
            self, "Conv2dGw8WgradConfig", fields, self._mma_k_error, runs="warp_q8", run_width=8
        )

    def _mma_k_error(self) -> str | None:
        if self.mma_k not in (8, 16) or self.warp_q8 % (self.mma_k // 8):
            return (
                f"Conv2dGw8WgradConfig needs mma_k 8, or 16 with an even warp_q8; got mma_k "
                f"{self.mma_k}, warp_q8 {self.warp_q8}"
            )
        return None

    @property
    def warps(self) -> int:
        return self.groups * self.block_q // (8 * self.warp_q8)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def encode(self) -> str:
        return (
            f"g{self.groups}_p{self.block_p}_q{self.block_q}_n{self.block_n}_w{self.warp_q8}"
            f"_s{self.stages}_k{self.mma_k}"
        )


def shared_mem_bytes(
    params: Conv2dGw8Params,
    config: Conv2dGw8WgradConfig,
    swizzled: bool = False,
    tma: bool = False,
) -> int:
    """`stages` slots of x rows plus R + stages slots of dy rows (the ring and a zero row), each
    row_pitch chunks a group; with `tma`, also room to align the rows (tma_align) and one
    mbarrier a stage."""
    x_row = config.groups * row_pitch(input_columns(params, config), swizzled, tma) * 16
    dy_row = config.groups * row_pitch(config.block_q, swizzled, tma) * 16
    extra = tma_room(config.groups, config.stages) if tma else 0
    return config.stages * x_row + (params.r + config.stages) * dy_row + extra


#: Row buffers per block. On the H200 the input pipeline alone (ablated kernel: no mma, no
#: stores) of the 64c 64x64 layer's WGrad took 69 us with 2 stages, against 38 us for a copy of the
#: same bytes (docs/perf/2026-11-29-h200-2/ablate.log): more steps in flight may help.
STAGES = (2, 3, 4, 6)

#: Images per block. 16 only for images of at most SMALL_IMAGE output pixels: there a block's work
#: per image is small, and each block writes one slot of partial sums for all its images, so more
#: images per block write (and sum) fewer slots. The 512c 8x8 and 368c 7x7 layers' WGrad at
#: N = 128, with the 4 images per block of the 2026-11-29 H200 runs' pick (g4_p8_q8_n4_w1_s3_k8;
#: docs/perf/2026-11-29-h200-2/bench_fp16.csv), writes partial sums of 28 % and 37 % of the bytes
#: of x and dy (counted from the shapes), then reads them again to sum them. Not with 2
#: stages: ptxas then unrolls the whole loop over the block's rows (even with #pragma unroll 1)
#: and spills at 16 images.
BLOCK_N = (1, 4, 16)
SMALL_IMAGE = 256

#: Images per block the analytic heuristic cannot judge (named when no GPU had run them; the H200
#: run of 2026-11-29 had 1 and 4): it ranks their configs last, as FProp/DGrad's keeps one image
#: per block, so that a GPU without a model never runs one untimed, and autotuning times them as
#: the pick's unjudged variants. A model that has not measured them ranks them last too (they are
#: not among its `config_values`). H200 run 7 (2026-12-04) timed them on 256c 16x16 and 512c 8x8:
#: never the fastest sampled config (the best of them 1.13-1.60x the layer's best); the sm_90
#: model trained on it ranks them by what it learned.
UNTIMED_BLOCK_N = (16,)


#: 8-column runs a warp computes in the config space.
WARP_Q8 = (1, 2, 4)

#: Runs a warp in trial configs only (trial_configs): 8 runs issue 24-34 % fewer instructions a
#: pixel than 4 on the 64c 64x64 3x3 layer (scripts/sass_loop.py, sm_90), at 84 registers and
#: 64-thread blocks, but no GPU has timed them. The analytic heuristic, which does not count
#: instructions, would pick them for that layer on every GPU without a model, so they stay out
#: of configs() until a GPU run (gpu_check's ablate step) shows whether they are faster.
TRIAL_WARP_Q8 = (8,)


def configs(params: Conv2dGw8Params) -> list[Conv2dGw8WgradConfig]:
    """Every tile config worth trying for this layer, in a fixed order."""
    check_params(params, "conv2d_gw8_wgrad configs")
    return _space(params, WARP_Q8)


def trial_configs(params: Conv2dGw8Params) -> list[Conv2dGw8WgradConfig]:
    """Configs on trial for this layer: built, emulated against the reference in the tests and
    timed by `scripts/ablate_kernel.py --config`, but outside configs(), so spio never picks
    one (neither the heuristic nor a model nor autotuning sees them)."""
    return _space(params, TRIAL_WARP_Q8)


def _space(params: Conv2dGw8Params, warp_q8s: tuple[int, ...]) -> list[Conv2dGw8WgradConfig]:
    """The configs with these runs a warp that fit this layer, in a fixed order."""
    max_groups = 1 << math.ceil(math.log2(params.groups))
    max_q = max(8, 8 * math.ceil(params.q / 8))
    max_p = max(4, 1 << math.ceil(math.log2(params.p)))
    found = []
    for groups, block_q, warp_q8, block_p, block_n, stages, mma_k in itertools.product(
        (1, 2, 4, 8), (8, 16, 32, 64), warp_q8s, (4, 8, 16, 32, 64), BLOCK_N, STAGES, (8, 16)
    ):
        if groups > max_groups or block_q > max_q or block_p > max_p or block_n > params.n:
            continue
        if block_n > 4 and (params.p * params.q > SMALL_IMAGE or stages < 3):
            continue
        if block_q % (8 * warp_q8) or groups * block_q // (8 * warp_q8) > MAX_THREADS // 32:
            continue
        if warp_q8 % (mma_k // 8):
            continue
        config = Conv2dGw8WgradConfig(groups, block_p, block_q, block_n, warp_q8, stages, mma_k)
        if shared_mem_bytes(params, config) <= MAX_SHARED_BYTES:
            found.append(config)
    return found


def estimated_cost(
    params: Conv2dGw8Params, config: Conv2dGw8WgradConfig, machine: Machine = H200_CLASS
) -> float:
    """A unitless cost for ranking configs without measurements: x and dy traffic (halo, tile
    overrun and sector waste included) relative to the ideal, plus the cross-block reduction spio
    runs for this config (partial sums written and summed, or atomics), divided by how well the
    resident blocks cover DRAM latency on `machine`."""
    tiles = grid_tiles(params, config)
    tiles_y, tiles_x = tiles["y"], tiles["x"]
    groups = tiles["c8"] * config.groups
    blocks = math.prod(tiles.values())
    useful = params.p * params.q * params.groups * params.n
    n_run = math.ceil(params.n / config.block_n) * config.block_n
    x_read = tiles_y * (config.block_p + params.r - 1) * tiles_x * input_columns(params, config)
    dy_read = tiles_y * config.block_p * tiles_x * config.block_q
    traffic = (x_read + dy_read) * groups * n_run / (2 * useful)
    if uses_partial_sums(params, config):  # each slot written once, then read by sum_slots
        reduction = partial_bytes(params, config) / (16 * useful)
    else:  # fp32 atomics, a few pixel reads' worth each
        reduction = blocks * config.warps * 32 * ((params.r + 1) // 2) * params.s * 4 / (8 * useful)
    registers = 40 + ((params.r + 1) // 2) * params.s * 4 + params.s
    step_bytes = (config.stages - 1) * config.groups * (2 * config.block_q + params.s - 1) * 16
    cover = latency_cover(
        blocks, config.threads, registers, shared_mem_bytes(params, config), step_bytes, machine
    )
    return (sector_waste(params, config) * traffic + reduction) / cover


def heuristic_key(
    params: Conv2dGw8Params, config: Conv2dGw8WgradConfig, machine: Machine = H200_CLASS
) -> tuple:
    """How the analytic heuristic orders configs for `machine`: images per block it cannot judge
    last (UNTIMED_BLOCK_N), then by estimated_cost, then config order."""
    untimed = config.block_n in UNTIMED_BLOCK_N
    return (untimed, estimated_cost(params, config, machine), config)


def default_config(params: Conv2dGw8Params, machine: Machine = H200_CLASS) -> Conv2dGw8WgradConfig:
    """The heuristic's first config for `machine` (where no performance model applies)."""
    return min(configs(params), key=lambda c: heuristic_key(params, c, machine))


def partial_slots(params: Conv2dGw8Params, config: Conv2dGw8WgradConfig) -> int:
    """Slots of the partial-sum buffers with `partials`: one per warp of a dy tile (all groups of
    a warp's column runs share a slot, each writing its own channels)."""
    tiles = grid_tiles(params, config)
    return tiles["n"] * tiles["y"] * tiles["x"] * _warps_x8(config)


def _warps_x8(config: Conv2dGw8WgradConfig) -> int:
    """Warps across a tile's columns, each with its config.warp_q8 runs of 8 (WarpIdx::X8)."""
    return config.block_q // (8 * config.warp_q8)


def dw_dims(params: Conv2dGw8Params) -> dict[str, int]:
    """dw's dims in PyTorch's contiguous order [K, 8, R, S], its output channel split into the
    group (k8) and the channel within it (k): what the WGrad kernel and sum_slots index."""
    return {"k8": params.groups, "k": 8, "c": 8, "r": params.r, "s": params.s}


def dbias_dims(params: Conv2dGw8Params) -> dict[str, int]:
    """dbias's dims, its channel split as dw's output channel (dw_dims)."""
    return {"k8": params.groups, "k": 8}


def slot_dims(params: Conv2dGw8Params) -> dict[str, int]:
    """A partial-sum slot's dw: dw_dims' dims with each tap's 8 x 8 (k by c) innermost, so that
    a WGrad warp's store of one accumulator element across its lanes (k and c vary, the tap is
    fixed) touches 8 32-byte sectors, half of each, which its store of the next element (the
    next c) fills. In PyTorch's order (c's stride R * S floats) it touched 32 where R * S >= 4
    (24, 16 and 8 where R * S is 3, 2 and 1). sum_slots reads the slots in this order and
    writes dw in its own."""
    return {"k8": params.groups, "r": params.r, "s": params.s, "k": 8, "c": 8}


def part_specs(params: Conv2dGw8Params, element: str) -> list[Spec]:
    """The partial-sum buffers of a partials WGrad: slot t outermost (partial_slots of them,
    given at launch), each slot a dw (slot_dims) and a dbias (dbias_dims). `element`: "float"
    for the WGrad kernel, which writes them, "const float" for sum_slots, which reads them."""
    return [
        TensorSpec("DWPart", element, {"t": None, **slot_dims(params)}),
        TensorSpec("DBiasPart", element, {"t": None, **dbias_dims(params)}),
    ]


def slot_columns(params: Conv2dGw8Params) -> tuple[int, int]:
    """fp32 values per partial-sum slot: (dw's, dbias's; 0 without has_bias)."""
    return math.prod(params.weight_shape), params.c if params.has_bias else 0


def partial_bytes(params: Conv2dGw8Params, config: Conv2dGw8WgradConfig) -> int:
    """Bytes of the partial-sum buffers (dw and, with has_bias, dbias) of a `partials` kernel."""
    return 4 * partial_slots(params, config) * sum(slot_columns(params))


#: The largest partial-sum buffer a deterministic WGrad allocates; beyond it PyTorch computes dw.
MAX_PARTIAL_BYTES = 256 * 2**20
#: The largest partial-sum buffer the default WGrad allocates; beyond it blocks add into dw with
#: atomics. On the H200 (N = 128, docs/perf/2026-11-29-h200-2.md) per-warp partial sums and one
#: sum beat atomics into a zeroed dw by 19-31 % on the 64c 64x64 and 128c 32x32 3x3 layers and by
#: 6-11 % on the two smallest, tied on two and lost by 1.5-2.7 % on four.
PARTIAL_BYTES = 64 * 2**20


def uses_partial_sums(
    params: Conv2dGw8Params, config: Conv2dGw8WgradConfig, deterministic: bool = False
) -> bool:
    """Whether spio's WGrad of `params` with tile `config` sums per-warp partials: while their
    buffer fits in PARTIAL_BYTES (MAX_PARTIAL_BYTES under deterministic algorithms)."""
    limit = MAX_PARTIAL_BYTES if deterministic else PARTIAL_BYTES
    return partial_bytes(params, config) <= limit


def production_kernel(params: Conv2dGw8Params, config: Conv2dGw8WgradConfig) -> Kernel:
    """The kernel spio runs for `params` with tile `config` by default: the partial-sums variant
    when uses_partial_sums, else the atomic one. Autotuning and perf sampling time this one (with
    `wgrad`, which adds the sum or the zeroing), so configs are ranked by what runs."""
    return make_kernel(params, config, partials=uses_partial_sums(params, config))


def generate_header(
    params: Conv2dGw8Params,
    config: Conv2dGw8WgradConfig,
    partials: bool,
    entry: str,
    swizzled: bool = False,
    tma: bool = False,
) -> str:
    """The C++ header that specialises conv2d_gw8_wgrad.cu for one layer and config; `entry`:
    the kernel's symbol (SPIO_KERNEL_ENTRY, the name of the kernel function in the source);
    `swizzled`: the x and dy row buffers' layout (conv2d_gw8_factory.stage_layout); `tma`: the
    rows arrive by tensor copies (sm_90; swizzled, aligned; the kernel then takes x's and dy's
    tensor maps)."""
    c8 = params.groups
    in_x = input_columns(params, config)
    tiles = grid_tiles(params, config)
    warps_x8 = _warps_x8(config)
    specs: list[Spec] = [
        MacroSpec(
            {
                "SPIO_WGRAD_ELEMENT": ELEMENT_TYPES[params.dtype][0],
                "SPIO_WGRAD_BF16": int(params.dtype == "bf16"),
                "SPIO_WGRAD_HAS_BIAS": int(params.has_bias),
                "SPIO_WGRAD_PARTIALS": int(partials),
                "SPIO_KERNEL_ENTRY": entry,
                "SPIO_LOAD_VIA_TMA": int(tma),
                "SPIO_TMA_ALIGN": tma_align(config.groups),
            }
        ),
        ParamsSpec(
            "Conv",
            {"r": params.r, "s": params.s, "pad_h": params.padding_h, "pad_w": params.padding_w},
        ),
        ParamsSpec(
            "Block",
            {
                "c8": config.groups,
                "y": config.block_p,
                "x": config.block_q,
                "n": config.block_n,
                "ragged": ragged(params, config.block_n),
                "warp_x8": config.warp_q8,
                "threads": config.threads,
                "stages": config.stages,
                "mma_k": config.mma_k,
            },
        ),
        # The batch size (n) is given at launch: one build serves every batch size (see ragged).
        TensorSpec("Input", "const uint4", {"n": None, "y": params.h, "x": params.w, "c8": c8}),
        TensorSpec("DOutput", "const uint4", {"n": None, "y": params.p, "x": params.q, "k8": c8}),
        TensorSpec("DW", "float", dw_dims(params)),
        TensorSpec("DBias", "float", dbias_dims(params)),
        TensorSpec(
            "SmemX",
            "uint4",
            *stage_layout("stage", config.stages, config.groups, in_x, swizzled, tma),
        ),
        TensorSpec(
            "SmemDy",
            "uint4",
            *stage_layout(
                "slot", params.r + config.stages, config.groups, config.block_q, swizzled, tma
            ),
        ),
        IndexSpec("BlockIdx", {**tiles, "n": None}),  # (n stays outermost)
        IndexSpec("WarpIdx", {"c8": config.groups, "x8": warps_x8}),
        IndexSpec("XLoadIdx", {"x": in_x, "c8": config.groups}),
        IndexSpec("DyLoadIdx", {"x": config.block_q, "c8": config.groups}),
        # The mma's operands and accumulator, their rows and columns named: A is dy, 16 rows
        # (rp: the tap pair's row, r0 or r1; k: the channel) by 8 pixels, B is x, 8 pixels by 8
        # channels c, and the accumulator holds dw's taps of the pair, (rp, k) by c.
        FragmentSpec("XFrag", f"FragB_m16n8k8_{FRAGMENT_ELEMENTS[params.dtype]}", "x", "c"),
        FragmentSpec("DwFrag", "FragC_m16n8_f32", {"rp": 2, "k": 8}, "c"),
    ]
    if partials:
        # A slot (t) per warp of the grid's dy tiles (partial_slots): PartSlot, the images' blocks
        # (n, as many as the batch asks), rows and columns of dy tiles and runs of columns in a
        # tile; each of the tile's warps writes its own groups of the slot.
        specs += [
            IndexSpec("PartSlot", {"n": None, "y": tiles["y"], "x": tiles["x"], "x8": warps_x8}),
            *part_specs(params, "float"),
        ]
    return generate(specs)


def make_kernel(
    params: Conv2dGw8Params,
    config: Conv2dGw8WgradConfig | None = None,
    partials: bool = False,
    swizzled: bool = False,
    tma: bool = False,
    tma_l2: int = 0,
) -> Kernel:
    """The WGrad kernel for `params` with tile `config` (bias gradient too when has_bias).

    `partials`: each warp stores its sums to its own slot of a partial-sum buffer
    (partial_slots(params, config) slots) instead of adding them atomically; the caller sums the
    slots (see `wgrad`). The result then does not depend on the order the blocks run in.
    `swizzled`: x and dy rows staged pixel-major, swizzled (conv2d_gw8_factory.stage_layout;
    by default spio runs the group-major kernels, with SPIO_TMA the tensor-copy ones, and
    scripts/ablate_kernel.py times the others). `tma`: those
    rows brought in by tensor copies (sm_90 and newer only; implies `swizzled`). `tma_l2`:
    their maps' L2 promotion in bytes (0, 64, 128 or 256; implies `tma`), as FProp's make_kernel.
    """
    check_params(params, "conv2d_gw8_wgrad make_kernel")
    partials, swizzled, tma = check_flags(
        "conv2d_gw8_wgrad make_kernel", partials=partials, swizzled=swizzled, tma=tma
    )
    tma_l2 = check_tma_l2("conv2d_gw8_wgrad make_kernel", tma_l2)
    if config is not None and not isinstance(config, Conv2dGw8WgradConfig):
        raise TypeError(
            f"conv2d_gw8_wgrad make_kernel needs a Conv2dGw8WgradConfig, got "
            f"{type(config).__name__}"
        )
    config = config or default_config(params)
    check_tensor_bytes(params)
    tma = tma or tma_l2 > 0
    swizzled = swizzled or tma
    smem = check_shared_mem(
        shared_mem_bytes(params, config, swizzled, tma),
        f"WGrad config {config.encode()} of layer {params.encode()}",
        tma,
    )
    if partials and partial_bytes(params, config) > MAX_TENSOR_BYTES:
        # (Only then: the atomic kernel of such a config still builds.)
        raise ValueError(
            f"conv2d_gw8 WGrad of layer {params.encode()} with config {config.encode()}: its "
            f"partial sums would take {partial_bytes(params, config)} bytes, more than the "
            f"{MAX_TENSOR_BYTES} a kernel takes; the atomic kernel (partials=False) has none"
        )
    blocks = math.prod(grid_tiles(params, config).values())
    # The code does not depend on the batch size (given at launch) beyond `ragged`: neither
    # does the name.
    name = (
        f"conv2d_gw8_wgrad__{params.encode_image()}__{config.encode()}"
        + ("__ragged" if ragged(params, config.block_n) else "")
        + ("__partials" if partials else "")
        + ("__tma" if tma else "__swz" if swizzled else "")
        + (f"__l2p{tma_l2}" if tma_l2 else "")  # (the same code: another launch's maps)
    )
    entry = entry_symbol(name)
    return Kernel(
        name=name,
        source_file=SOURCE_FILE,
        entry=entry,
        headers=((HEADER_NAME, generate_header(params, config, partials, entry, swizzled, tma)),),
        grid=(blocks, 1, 1),
        block=(config.threads, 1, 1),
        shared_mem_bytes=smem,
        info=(
            ("params", params),
            ("config", config),
            ("partials", partials),
            ("tma_l2", tma_l2),
            ("tma", tma),
            ("swizzled", swizzled),
        ),
    )


def with_swizzled_stages(kernel: Kernel) -> Kernel:
    """`kernel` (same params, config and reduction) with its x and dy rows staged swizzled
    (stage_layout): the layout scripts/ablate_kernel.py times against the group-major one."""
    return _remade(kernel, swizzled=True, tma=False, tma_l2=0)


def with_tma_stages(kernel: Kernel, l2: int = 0) -> Kernel:
    """`kernel` (same params, config and reduction) with its x and dy rows brought in by tensor
    copies into swizzled buffers (sm_90 and newer), with `l2` their maps' L2 promotion
    (make_kernel's `tma_l2`): the loader scripts/ablate_kernel.py times against cp.async."""
    return _remade(kernel, tma=True, tma_l2=l2)


def _remade(kernel: Kernel, **changes: Any) -> Kernel:
    """make_kernel with `kernel`'s arguments (its info: what make_kernel was given), but for
    `changes`."""
    return make_kernel(**dict(kernel.info) | changes)


def row_boxes(kernel: Kernel) -> tuple[tuple[int, int], tuple[int, int]]:
    """(groups, pixels) of a `tma` WGrad kernel's x and dy row boxes (row_map): a box is one row
    of a step, the block's groups across its Block::x + S - 1 columns of x or Block::x of dy."""
    params, config = kernel.info_value("params"), kernel.info_value("config")
    return (config.groups, input_columns(params, config)), (config.groups, config.block_q)


def _launch(kernel: Kernel, dw, dbias, x, dy, images: int, device) -> None:
    """Launches a WGrad kernel (atomic or partials) on x and dy (NHWC), adding the tensor maps a
    `tma` kernel takes."""
    args = [dw, dbias, x, dy, images]
    if kernel.info_value("tma"):
        (x_box, dy_box), l2 = row_boxes(kernel), kernel.info_value("tma_l2", 0)
        args += [row_map_argument(x, *x_box, device, l2), row_map_argument(dy, *dy_box, device, l2)]
    kernel.launch(args, device)


@functools.lru_cache(maxsize=1024)  # called on every partials WGrad: build each one once
def sum_kernel(
    params: Conv2dGw8Params, dw_dtype: str = "fp32", dbias_dtype: str = "fp32"
) -> Kernel:
    """The kernel that sums a partials WGrad's slots into dw (and dbias, with params.has_bias)
    of dtypes `dw_dtype` and `dbias_dtype` ("fp32", "fp16" or "bf16"), rounding once. Its code
    depends on the layer's channels, taps and bias and on the two dtypes, and so does its name:
    layers that share them share a build (the slots and dw's layout are launch arguments)."""
    for dtype in (dw_dtype, dbias_dtype):
        if dtype not in SUM_TYPES:
            raise ValueError(f"sum_kernel needs dtypes among {sorted(SUM_TYPES)}, got {dtype!r}")
    dw_type, dbias_type = SUM_TYPES[dw_dtype], SUM_TYPES[dbias_dtype]
    dw = dw_dims(params)
    channels_last = {"k8": dw["k8"], "k": 8, "r": params.r, "s": params.s, "c": 8}  # [K, R, S, 8]
    sums = TensorSpec("SmemSums", "float", {"g": SUM_GROUPS, "e": SUM_COLUMNS})
    header = generate(
        [
            ParamsSpec("Sum", {"has_bias": params.has_bias, "batch": SUM_BATCH}),
            *part_specs(params, "const float"),
            TensorSpec("DW", dw_type, dw),
            TensorSpec("DWChannelsLast", dw_type, channels_last),
            TensorSpec("DBias", dbias_type, dbias_dims(params)),
            # The output elements: dw's in a slot's order (reads coalesced), then dbias's;
            # SumElement::E of them a block, one a lane of each warp (g: its group of slots).
            IndexSpec("DwIdx", slot_dims(params)),
            IndexSpec("DBiasIdx", dbias_dims(params)),
            IndexSpec("SumThread", {"g": SUM_GROUPS, "e": SUM_COLUMNS}),
            IndexSpec("SumElement", {"block": None, "e": SUM_COLUMNS}),
            # Slot t of group g at load j of a step: the groups' slots interleave.
            IndexSpec("SlotIdx", {"step": None, "j": SUM_BATCH, "g": SUM_GROUPS}),
            sums,
        ]
    )
    columns = sum(slot_columns(params))
    bias = "_bias" if params.has_bias else ""
    assert sums.num_bytes is not None  # (its extents are all known)
    return Kernel(
        name=f"sum_slots__c{params.c}_r{params.r}_s{params.s}{bias}__{dw_dtype}_{dbias_dtype}",
        source_file=SUM_SOURCE_FILE,
        entry=SUM_ENTRY,
        headers=((SUM_HEADER_NAME, header),),
        grid=(math.ceil(columns / SUM_COLUMNS), 1, 1),
        block=(SUM_GROUPS * SUM_COLUMNS, 1, 1),
        shared_mem_bytes=sums.num_bytes,
        info=(("dtypes", (dw_dtype, dbias_dtype)),),
    )


def with_sums(
    kernels: Iterable[Kernel], dtypes: tuple[str, str] = ("fp32", "fp32")
) -> list[Kernel]:
    """`kernels`, each partials WGrad kernel followed by the sum_slots kernel that `wgrad` runs
    after it into gradients of `dtypes` (dw's, dbias's: sum_kernel's); each name once. What to
    build before timing or checking."""
    found = {}
    for kernel in kernels:
        found[kernel.name] = kernel
        if kernel.info_value("partials"):
            summing = sum_kernel(kernel.info_value("params"), *dtypes)
            found[summing.name] = summing
    return list(found.values())


def sum_dtype_pairs(params: Conv2dGw8Params) -> list[tuple[str, str]]:
    """Every (dw, dbias) dtype pair spio may sum a partials WGrad of `params` into: dw in the
    weight's dtype, the layer's (a half model) or fp32 (autocast's fp32 master weights, and the
    op's own fp32 gradients); dbias in the bias's, either of those where the layer has one (the
    op's fp32 otherwise)."""
    dtypes = [params.dtype, "fp32"]
    biases = dtypes if params.has_bias else ["fp32"]
    return [(dw, dbias) for dw in dtypes for dbias in biases]


def sum_kernels(
    kernels: Iterable[Kernel], dtypes: tuple[str, str] = ("fp32", "fp32")
) -> list[Kernel]:
    """with_sums' sum_slots kernels alone: those the partials WGrad kernels among `kernels` run
    after them, each once. For callers that keep `kernels` in their own order."""
    kernels = list(kernels)
    names = {kernel.name for kernel in kernels}
    return [kernel for kernel in with_sums(kernels, dtypes) if kernel.name not in names]


def wgrad(
    x: Tensor,
    dy: Tensor,
    params: Conv2dGw8Params,
    config: Conv2dGw8WgradConfig | None = None,
    kernel: Kernel | None = None,
    dtypes: tuple[torch.dtype, torch.dtype] | None = None,
    poison: bool = False,
    validated: bool = False,
    channels_last: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(dw, dbias) of conv2d_gw8 with the WGrad kernel: dw (C, 8, R, S); dbias (C,) when
    params.has_bias, else None; both fp32 or, with `dtypes` = (dw dtype, dbias dtype) as torch
    dtypes, rounded once to those. x and dy (N, C, ., .) in any memory layout. dw is contiguous,
    or with `channels_last` in torch.channels_last (a channels_last weight's layout: autograd
    then keeps it as the weight's gradient without laying it out again).

    A `partials` kernel (make_kernel(..., partials=True)) writes per-warp sums into one buffer,
    which sum_slots then sums in a fixed order: the result is the same on every run.
    `poison` (for checks) fills the buffers the partials path writes with NaN first, so that an
    element a kernel skips shows as NaN; the atomic path adds into zeroed buffers, whose missed
    contributions only the comparison with a reference can show. `validated`: as for fprop."""
    import torch

    if not validated:
        check_call("conv2d_gw8 wgrad", params, kernel, x=x, dy=dy)
        _check_dtype(params, x, dy)
        _check_shapes(params, x=x, dy=dy)
        if dtypes is not None:
            _check_gradient_dtypes(dtypes)
    kernel = kernel or make_kernel(params, config)
    check_layer(kernel, params, "wgrad")
    device = x.device
    dw_dtype, dbias_dtype = dtypes or (torch.float32, torch.float32)
    if kernel.info_value("partials"):
        slots, dw_size, dbias_size, summing = _partials_plan(kernel, params, dw_dtype, dbias_dtype)
        dw_part = torch.empty(slots * dw_size, dtype=torch.float32, device=device)
        dbias_part = (
            torch.empty(slots * dbias_size, dtype=torch.float32, device=device)
            if params.has_bias
            else None
        )
        layout = torch.channels_last if channels_last else torch.contiguous_format
        dw = torch.empty(params.weight_shape, dtype=dw_dtype, device=device, memory_format=layout)
        dbias = torch.empty(params.c, dtype=dbias_dtype, device=device) if params.has_bias else None
        if poison:
            for buffer in (dw_part, dbias_part, dw, dbias):
                if buffer is not None:
                    buffer.fill_(math.nan)
        _launch(kernel, dw_part, dbias_part, nhwc_operand(x), nhwc_operand(dy), params.n, device)
        summing.launch([dw, dbias, dw_part, dbias_part, slots, int(channels_last)], device)
        return dw, dbias
    dw = torch.zeros(params.weight_shape, dtype=torch.float32, device=device)
    dbias = torch.zeros(params.c, dtype=torch.float32, device=device) if params.has_bias else None
    _launch(kernel, dw, dbias, nhwc_operand(x), nhwc_operand(dy), params.n, device)
    if channels_last:  # one copy for the dtype and the layout
        dw = dw.to(dw_dtype, memory_format=torch.channels_last)
    elif dw_dtype != torch.float32:
        dw = dw.to(dw_dtype)
    if dbias is not None and dbias_dtype != torch.float32:
        dbias = dbias.to(dbias_dtype)
    return dw, dbias


#: (partials kernel name, batch size, dw dtype, dbias dtype) -> (slots, dw and dbias values per
#: slot, the sum_slots kernel): worked out once, as wgrad runs on every backward pass. (The name
#: leaves out the batch size, on which the slots depend.) Past MAX_PLANS entries it starts over,
#: so that batch sizes changing on every call do not each keep a plan.
_partials_plans: dict[tuple, tuple[int, int, int, Kernel]] = {}
MAX_PLANS = 4096


def _partials_plan(kernel: Kernel, params: Conv2dGw8Params, dw_dtype, dbias_dtype):
    key = (kernel.name, params.n, dw_dtype, dbias_dtype)
    plan = _partials_plans.get(key)
    if plan is None:
        slots = partial_slots(params, kernel.info_value("config"))
        dw_size, dbias_size = slot_columns(params)
        summing = sum_kernel(
            params, gradient_dtype_name(dw_dtype), gradient_dtype_name(dbias_dtype)
        )
        plan = remember(_partials_plans, key, (slots, dw_size, dbias_size, summing), MAX_PLANS)
    return plan


def _check_gradient_dtypes(dtypes: Any) -> None:
    """wgrad's `dtypes` must be a pair of (dw, dbias) torch dtypes among fp32, fp16 and bf16:
    TypeError for what is not a pair of dtypes, ValueError for another dtype (an int32 dw would
    be the sums truncated)."""
    import torch

    if (
        not isinstance(dtypes, (tuple, list))
        or len(dtypes) != 2
        or not all(isinstance(d, torch.dtype) for d in dtypes)
    ):
        raise TypeError(
            f"conv2d_gw8 wgrad needs dtypes a (dw, dbias) pair of torch dtypes, got {dtypes!r}"
        )
    if any(d not in _gradient_dtype_names() for d in dtypes):
        raise ValueError(
            "conv2d_gw8 wgrad needs dtypes (dw, dbias) among torch.float32, torch.float16 and "
            f"torch.bfloat16, got {tuple(dtypes)}"
        )


def _gradient_dtype_names() -> dict:
    """The dtypes WGrad writes its gradients in, and their names (sum_kernel's dtype names)."""
    import torch

    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def gradient_dtype_name(dtype) -> str:
    names = _gradient_dtype_names()
    if dtype not in names:
        raise ValueError(f"WGrad gradients are fp32, fp16 or bf16, got {dtype}")
    return names[dtype]


#: WGrad (and the bias gradient) of the group-width-8 convolution.
conv2d_gw8_wgrad_kernel_factory = KernelFactory(
    name="conv2d_gw8_wgrad",
    configs=configs,
    make_kernel=make_kernel,
    default_config=default_config,
)
