"""FProp and DGrad kernels of the group-width-8 convolution: configs, generated header, launch.

The kernel source is spio/src/conv2d_gw8.cu; its leading comment states the algorithm. This module
enumerates its tile configs for a layer, generates the header that fixes sizes and index arithmetic,
and ranks configs by an analytic cost (`default_config`, used where no performance model applies;
spio.kernels.perf_model.select_config chooses).
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..compiler.arch import has_bulk_copies
from ..compiler.occupancy import LIMITS, RESERVED_SHARED_PER_BLOCK, SmLimits, limits_of
from ..env import choice
from ..generators import (
    FragmentSpec,
    IndexSpec,
    MacroSpec,
    ParamsSpec,
    Spec,
    TensorSpec,
    generate,
)
from .conv2d_gw8_params import (
    Conv2dGw8Params,
    as_flag,
    as_integer,
    check_params,
    check_tensor_arguments,
    check_tensor_bytes,
    torch_dtype,
)
from .kernel import Kernel, KernelFactory, entry_symbol

if TYPE_CHECKING:
    from torch import Tensor

    from .conv2d_gw8_wgrad_factory import Conv2dGw8WgradConfig

SOURCE_FILE = "conv2d_gw8.cu"
HEADER_NAME = "conv2d_gw8_gen.h"

MAX_THREADS = 512
# The smallest per-block opt-in limit among the supported archs (sm_86 and sm_89: 99 KiB).
MAX_SHARED_BYTES = 99 * 1024

#: C++ element and pair types of each dtype.
ELEMENT_TYPES = {"fp16": ("__half", "__half2"), "bf16": ("__nv_bfloat16", "__nv_bfloat162")}
#: The suffix of each dtype's operand fragment types (spio/warp/fragments.h: FragB_m16n8k8_f16).
FRAGMENT_ELEMENTS = {"fp16": "f16", "bf16": "bf16"}


def check_config(
    config: Any,
    name: str,
    fields: tuple[str, ...],
    mma_k_error: Callable[[], str | None],
    *,
    runs: str,
    run_width: int,
    name_warps: bool = False,
) -> None:
    """The checks both kernels' tile configs share, in this order: every one of `fields` an
    integer (as_integer: numpy's are kept as ints; not a bool, which would be encoded "gTrue"),
    positive, stages >= 2, mma_k (`mma_k_error` gives the message of a bad one; called only once
    the fields are ints), block_q a multiple of `run_width` times the `runs` field (a warp's
    columns), 32..1024 threads a block (with `name_warps`, the message also gives the warps).
    Raises TypeError for a field that is not an integer, else ValueError, naming `name`, the
    config's class."""
    for field in fields:
        value = getattr(config, field)
        integer = as_integer(value)
        if integer is None:
            raise TypeError(f"{name} needs an integer {field}, got {value!r}")
        if integer < 1:
            raise ValueError(f"{name} needs {field} a positive int, got {value!r}")
        if type(value) is not int:  # (frozen: the one way to set it)
            object.__setattr__(config, field, integer)
    if config.stages < 2:
        raise ValueError(f"{name} needs stages >= 2, got {config.stages}")
    error = mma_k_error()
    if error is not None:
        raise ValueError(error)
    warp_columns = run_width * getattr(config, runs)
    if config.block_q % warp_columns:
        raise ValueError(
            f"{name} needs block_q a multiple of {run_width} * {runs} = {warp_columns}, "
            f"got {config.block_q}"
        )
    if not 32 <= config.threads <= 1024:
        warps = f" ({config.warps} warps)" if name_warps else ""
        raise ValueError(f"{name} needs 32..1024 threads per block, got {config.threads}{warps}")


@dataclass(frozen=True, order=True)
class Conv2dGw8Config:
    """A tile config: groups (of 8 channels) per block, output rows and columns per block, the
    number of 16-column runs each warp computes, the input-row buffers (stages - 1 rows are in
    flight while one is computed), the mma depth: 8 (one filter tap per m16n8k8) or 16 (two
    taps s, s + 1 per m16n8k16, half the mma instructions), and the images per block (the block
    streams its tile of each image in turn, its pipeline running on from one to the next, with
    the weights read once)."""

    groups: int = 8
    block_p: int = 16
    block_q: int = 32
    warp_q16: int = 1
    stages: int = 2
    mma_k: int = 8
    block_n: int = 1

    def __post_init__(self) -> None:
        fields = ("groups", "block_p", "block_q", "warp_q16", "stages", "mma_k", "block_n")
        check_config(
            self,
            "Conv2dGw8Config",
            fields,
            self._mma_k_error,
            runs="warp_q16",
            run_width=16,
            name_warps=True,
        )

    def _mma_k_error(self) -> str | None:
        if self.mma_k not in (8, 16):
            return f"Conv2dGw8Config needs mma_k 8 or 16, got {self.mma_k}"
        return None

    @property
    def warps(self) -> int:
        return self.groups * self.block_q // (16 * self.warp_q16)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def encode(self) -> str:
        """e.g. g8_p64_q16_w1_s4_k16; _n4 follows for 4 images per block (none for one, the
        name configs had before there was a choice)."""
        images = f"_n{self.block_n}" if self.block_n > 1 else ""
        return (
            f"g{self.groups}_p{self.block_p}_q{self.block_q}_w{self.warp_q16}_s{self.stages}"
            f"_k{self.mma_k}{images}"
        )


@dataclass(frozen=True)
class _Geometry:
    """The convolution as the kernel sees it: In (ih x iw) -> Out (oh x ow) with signed padding."""

    in_h: int
    in_w: int
    out_h: int
    out_w: int
    pad_h: int
    pad_w: int

    @staticmethod
    def of(params: Conv2dGw8Params, igrad: bool) -> _Geometry:
        if igrad:  # dy (p x q) -> dx (h x w), padding R-1-pad (negative when pad > R-1)
            return _Geometry(
                params.p,
                params.q,
                params.h,
                params.w,
                params.r - 1 - params.padding_h,
                params.s - 1 - params.padding_w,
            )
        return _Geometry(params.h, params.w, params.p, params.q, params.padding_h, params.padding_w)


def pad_odd(n: int) -> int:
    """n rounded up to an odd number: an odd stride in 16-byte units avoids bank conflicts."""
    return n if n % 2 else n + 1


def row_pitch(pixels: int, swizzled: bool, tma: bool = False) -> int:
    """The 16-byte chunks a staged row of `pixels` pixels spans per group (stage_layout):
    group-major rows are padded to an odd pitch, swizzled ones are not, and rows that tensor
    copies fill are padded to a multiple of 8 pixels, so that each starts at a multiple of its
    swizzle's repeat (tma_align)."""
    if tma:
        return -(-pixels // 8) * 8
    return pixels if swizzled else pad_odd(pixels)


def input_columns(params: Conv2dGw8Params, config: Conv2dGw8Config | Conv2dGw8WgradConfig) -> int:
    """The input columns a tile of config.block_q output columns reads: its block_q plus the
    filter's S - 1 halo (FProp's x, DGrad's dy, WGrad's x)."""
    return config.block_q + params.s - 1


def tma_align(groups: int) -> int:
    """The byte alignment of a stage that tensor copies fill with `groups` 16-byte chunks a pixel:
    the repeat of their swizzle (8 rows of its span, the span 16 * groups bytes: 32, 64 or 128;
    one group is unswizzled, and tensor copies land at multiples of 128 bytes)."""
    return 128 * groups


def tma_room(groups: int, stages: int) -> int:
    """The shared memory a tensor-copy build needs beyond its buffers: room to round them up to
    tma_align (dynamic shared memory starts 16-byte aligned) and one 8-byte mbarrier a stage."""
    return tma_align(groups) - 16 + 8 * stages


def tma_swizzle(groups: int) -> int:
    """The swizzle span, in bytes, of the tensor map that fills such stages: a pixel's groups
    (TensorSpec's swizzle keys the same chunks by the same bits: stage_layout)."""
    return 16 * groups if groups > 1 else 0


def check_shared_mem(smem: int, what: str, tma: bool) -> int:
    """`smem`, the shared memory a kernel (`what`: its config and layer) needs, if a block may
    have it (configs() offers only configs that fit with group-major stages; other layouts need
    more); else ValueError naming both."""
    if smem > MAX_SHARED_BYTES:
        raise ValueError(
            f"{what} needs {smem} bytes of shared memory with tma={tma}, more than the "
            f"{MAX_SHARED_BYTES} a block may have"
        )
    return smem


def row_map(t, groups: int, pixels: int, l2_promotion: int = 0):
    """The tensor map a `tma` kernel reads the rows of `t` (N, C, H, W, channels_last) through:
    dims C, W, H, N, innermost first; a box is one staged row, `groups` groups across `pixels`
    columns, swizzled as the stages are (tma_swizzle); `l2_promotion` as make_kernel's `tma_l2`."""
    from ..cuda.tensor_map import TensorMap

    box = (8 * groups, pixels, 1, 1)
    return TensorMap.of_tensor(t, (1, 3, 2, 0), box, tma_swizzle(groups), l2_promotion)


#: Launch arguments of recent row maps (row_map_argument), newest last, and the lock of its
#: updates (autograd's per-device threads may launch at once).
_MAP_ARGUMENTS: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
_MAP_ARGUMENTS_LOCK = threading.Lock()
MAP_ARGUMENTS_KEPT = 256


def row_map_argument(t, groups: int, pixels: int, device, l2_promotion: int = 0):
    """row_map(t, groups, pixels, l2_promotion)'s launch argument on `device`, encoded once for a
    tensor of that address, shape, strides and dtype (what the map holds) and kept among the last
    MAP_ARGUMENTS_KEPT: a training step meets the same activations' addresses again (PyTorch's
    caching allocator), and encoding a call's two maps took ~29 µs of host time (CPU, emulator
    layout), against ~4 µs kept."""
    key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, device, groups, pixels, l2_promotion)
    with _MAP_ARGUMENTS_LOCK:
        argument = _MAP_ARGUMENTS.get(key)
        if argument is not None:
            _MAP_ARGUMENTS.move_to_end(key)
            return argument
    argument = row_map(t, groups, pixels, l2_promotion).argument(device)  # (may raise: unlocked)
    with _MAP_ARGUMENTS_LOCK:
        _MAP_ARGUMENTS[key] = argument
        if len(_MAP_ARGUMENTS) > MAP_ARGUMENTS_KEPT:
            _MAP_ARGUMENTS.popitem(last=False)
    return argument


def shared_mem_bytes(
    params: Conv2dGw8Params,
    config: Conv2dGw8Config,
    swizzled: bool = False,
    tma: bool = False,
    tma_stores: bool = False,
) -> int:
    """Dynamic shared memory of one block: the input-row stages (row_pitch), the weights and the
    two output staging rows (output_pitch); with `tma`, also room to align the stages (tma_align;
    dynamic shared memory starts 16-byte aligned) and one mbarrier a stage."""
    in_x = input_columns(params, config)
    extra = tma_room(config.groups, config.stages) if tma or tma_stores else 0
    return (
        config.stages * config.groups * row_pitch(in_x, swizzled, tma or tma_stores) * 16
        + config.groups * params.r * params.s * 64 * 2
        + 2 * config.block_q * output_pitch(config.groups, tma_stores) * 16
        + extra
    )


def output_pitch(groups: int, tma_stores: bool) -> int:
    """The 16-byte chunks a staged output pixel spans (output_staging): its groups, padded by one
    against bank conflicts, or unpadded (and swizzled) where tensor copies store the rows."""
    return groups if tma_stores else groups + 1


def output_staging(pair: str, pixels: int, groups: int, tma_stores: bool) -> TensorSpec:
    """SmemOutput, the two staging rows of output pixels, pixel-major (output_pitch): a pixel's
    groups of output pairs padded by one 16-byte chunk against bank conflicts; for tensor copies
    (`tma_stores`), 16-byte chunks swizzled as the input stages are (stage_layout), the layout a
    tensor copy with tma_swizzle stores from."""
    k8 = (groups, output_pitch(groups, tma_stores))
    if tma_stores:
        return TensorSpec("SmemOutput", "uint4", {"buf": 2, "x": pixels, "k8": k8}, True)
    return TensorSpec("SmemOutput", pair, {"buf": 2, "x": pixels, "k8": k8, "k2": 4})


#: Input-row buffers per block. On the H200 the input pipeline alone (ablated kernel, no mma, no
#: stores) of the 64c 64x64 layer ran in 53 us with 2 stages and 43 us with 4; a device copy read
#: the same bytes (while writing as many) in 38 us (docs/perf/2026-11-29-h200-2/ablate.log). Rows
#: in flight mattered up to 3, so up to 7 may be.
STAGES = (2, 3, 4, 6, 8)


#: Images per block. More than one only where a block's tile is the whole image: small images,
#: whose blocks are otherwise short enough that reading the weights and filling and draining the
#: pipeline take much of their time.
BLOCK_NS = (1, 2, 4, 8)


def configs(params: Conv2dGw8Params, igrad: bool = False) -> list[Conv2dGw8Config]:
    """Every tile config worth trying for this layer, in a fixed order: FProp's, or with
    `igrad` DGrad's (whose convolution maps dy to dx)."""
    check_params(params, "conv2d_gw8 configs")
    igrad = as_flag("conv2d_gw8 configs", "igrad", igrad)  # (numpy's bools count, as elsewhere)
    geo = _Geometry.of(params, igrad)
    max_groups = 1 << math.ceil(math.log2(params.groups))  # no more than the layer has, rounded
    max_q = max(16, 16 * math.ceil(geo.out_w / 16))
    max_p = max(4, 1 << math.ceil(math.log2(geo.out_h)))
    found = []
    mma_ks = (8, 16) if params.s > 1 else (8,)  # one filter column has no pair to share an mma
    for groups, block_q, warp_q16, block_p, stages, mma_k, block_n in itertools.product(
        (1, 2, 4, 8), (16, 32, 64), (1, 2), (4, 8, 16, 32, 64), STAGES, mma_ks, BLOCK_NS
    ):
        if groups > max_groups or block_q > max_q or block_p > max_p:
            continue
        whole_image = block_p >= geo.out_h and block_q >= geo.out_w
        if block_n > 1 and (not whole_image or block_n > params.n):
            continue
        if block_q % (16 * warp_q16) or stages > 2 and block_p * block_n < 8:
            continue
        config = Conv2dGw8Config(groups, block_p, block_q, warp_q16, stages, mma_k, block_n)
        if config.threads <= MAX_THREADS and shared_mem_bytes(params, config) <= MAX_SHARED_BYTES:
            found.append(config)
    return found


@dataclass(frozen=True)
class Machine:
    """The GPU the analytic heuristic ranks configs for: its SM count and per-SM limits (the
    threads, blocks, registers and shared memory that decide how many blocks are resident)."""

    sms: int
    limits: SmLimits


#: The machine assumed where no GPU is known (an H100/H200-class one): the one the heuristic's
#: ranking was checked against (run 5's samples), and the one the perf models' features assume.
H200_CLASS = Machine(sms=132, limits=LIMITS["sm_90"])


def machine_of(arch: str, sms: int = 0, limits: SmLimits | None = None) -> Machine:
    """The heuristic's machine for a GPU of `arch` with `sms` SMs (0, unknown: the H200's) and
    per-SM `limits` (as the GPU reports them; None: the arch's entry in
    spio.compiler.occupancy.LIMITS, sm_90's for an arch without one). sm_86 and sm_89 hold 1,536
    threads and 100 KiB of shared memory an SM, against 2,048 and 228 KiB on sm_90, so a config
    that keeps seven blocks resident on an H200 may keep three on an RTX 3090."""
    return Machine(sms=sms if sms > 0 else H200_CLASS.sms, limits=limits or limits_of(arch))


#: The GPU whose SM count stands for each arch where no GPU is at hand (the resource report,
#: scripts/sass_loop.py): the arch's per-SM limits do not depend on the GPU, its SMs do.
TYPICAL_GPU = {
    "sm_80": ("A100", 108),
    "sm_86": ("RTX 3090", 82),
    "sm_89": ("RTX 4090", 128),
    "sm_90": ("H200", 132),
}


def typical_machine(arch: str) -> Machine:
    """machine_of a TYPICAL_GPU of `arch` (the H200's SM count for an arch without one)."""
    return machine_of(arch, TYPICAL_GPU.get(arch, ("", 0))[1])


#: Bytes each SM must keep in flight to cover DRAM latency (~4 TB/s x ~1 us / 132 SMs). The same
#: figure on every machine: spio cannot read a GPU's memory bandwidth or latency.
BYTES_IN_FLIGHT_PER_SM = 32 * 1024


def sector_waste(params: Conv2dGw8Params, config) -> float:
    """Bytes moved per useful byte when a block's pixel spans config.groups * 16 contiguous bytes:
    DRAM moves whole 32-byte sectors, so one group alone (16 bytes) wastes half of each. A block
    with all of a pixel's groups reads whole rows, contiguous in NHWC: no waste."""
    if config.groups >= params.groups:
        return 1.0
    span = config.groups * 16
    return math.ceil(span / 32) * 32 / span


def latency_cover(
    blocks: int,
    threads: int,
    registers: int,
    smem: int,
    bytes_per_block: int,
    machine: Machine = H200_CLASS,
) -> float:
    """Fraction (0..1] of the DRAM latency-bandwidth product the resident blocks keep in flight
    on `machine`. `registers` is an estimate (the config is not compiled), so residency is
    counted by the simple rules, not spio.compiler.occupancy's allocation units."""
    registers = min(255, 8 * math.ceil(registers / 8))
    limits = machine.limits
    per_sm = min(
        limits.blocks,
        limits.registers // (registers * threads),
        limits.threads // threads,
        limits.shared_bytes // max(smem + RESERVED_SHARED_PER_BLOCK, 1),
    )
    resident = min(max(per_sm, 1), math.ceil(blocks / machine.sms))
    busy_sms = min(1.0, blocks / machine.sms)
    return busy_sms * min(1.0, resident * bytes_per_block / BYTES_IN_FLIGHT_PER_SM)


def estimated_cost(
    params: Conv2dGw8Params,
    config: Conv2dGw8Config,
    igrad: bool = False,
    machine: Machine = H200_CLASS,
) -> float:
    """A unitless cost for ranking configs without measurements: memory traffic (halo, tile overrun
    and sector waste included) relative to the ideal, divided by how well the resident blocks cover
    DRAM latency on `machine`. It has no term for what a block pays once (reading the weights,
    filling and draining the pipeline), so it cannot weigh several images per block; where an output
    has under 8 rows, only a multi-image block has a deep pipeline, which its latency term rewards.
    default_config therefore keeps to one image per block: only measurements (a perf model trained
    on such configs, autotuning) choose more."""
    geo = _Geometry.of(params, igrad)
    tiles = grid_tiles(params, config, igrad)
    tiles_y, tiles_x = tiles["y"], tiles["x"]
    groups = tiles["c8"] * config.groups
    blocks = math.prod(tiles.values())
    useful = geo.out_h * geo.out_w * params.groups
    in_x = input_columns(params, config)
    read = tiles_y * (config.block_p + params.r - 1) * tiles_x * in_x
    computed = tiles_y * config.block_p * tiles_x * config.block_q * groups
    traffic = (read * groups + useful) / (2 * useful)
    compute = computed / useful
    registers = 40 + 4 * params.r * config.warp_q16 + params.r * params.s
    row_bytes = config.groups * in_x * 16
    cover = latency_cover(
        blocks,
        config.threads,
        registers,
        shared_mem_bytes(params, config),
        (config.stages - 1) * row_bytes,
        machine,
    )
    return sector_waste(params, config) * max(traffic, 0.5 * compute) / cover


def heuristic_key(
    params: Conv2dGw8Params,
    config: Conv2dGw8Config,
    igrad: bool = False,
    machine: Machine = H200_CLASS,
) -> tuple:
    """How the analytic heuristic orders configs for `machine`: by estimated_cost; of equal
    costs, m16n8k16 (half the mma instructions) first. On the H200 samples of run 5
    (docs/perf/2026-11-29-h200-2/run5/perf_samples.csv, 19 FProp and 18 DGrad layers) the
    tie-break took the heuristic's median regret over the best sampled config from 1.067 to 1.057
    (FProp) and from 1.047 to 1.044 (DGrad)."""
    return (estimated_cost(params, config, igrad, machine), -config.mma_k, config)


def default_config(
    params: Conv2dGw8Params, igrad: bool = False, machine: Machine = H200_CLASS
) -> Conv2dGw8Config:
    """The heuristic's first config of one image per block for `machine` (where no performance
    model applies), the head of perf_model.heuristic_ranking: see estimated_cost."""
    single = [c for c in configs(params, igrad) if c.block_n == 1]
    return min(single, key=lambda c: heuristic_key(params, c, igrad, machine))


def ragged(params: Conv2dGw8Params, block_n: int) -> bool:
    """Whether a batch of params.n images leaves the last block of `block_n` images partly empty.
    The kernels take the batch size at launch; only such a kernel checks each image against it
    (Block::ragged), so kernels of the batch sizes block_n divides share one build without the
    check, and those of the others another."""
    return params.n % block_n != 0


def grid_tiles(params: Conv2dGw8Params, config, igrad: bool = False) -> dict[str, int]:
    """Blocks along each dimension of the grid, outermost first: of the output's tiles (with
    `igrad`, dx's; WGrad's config tiles dy, the output of igrad=False)."""
    geo = _Geometry.of(params, igrad)
    return {
        "n": math.ceil(params.n / config.block_n),
        "c8": math.ceil(params.groups / config.groups),
        "y": math.ceil(geo.out_h / config.block_p),
        "x": math.ceil(geo.out_w / config.block_q),
    }


def stage_layout(
    name: str, count: int, groups: int, pixels: int, swizzled: bool, tma: bool = False
) -> tuple[dict[str, int | tuple[int, int]], bool]:
    """(dims, swizzle) of a TensorSpec of `count` shared-memory row buffers (dim `name`) of
    `pixels` pixels of `groups` 16-byte chunks: the input rows the kernels stage. Group-major
    (the default): [name][c8][x], the pitch padded to odd against bank conflicts, so that
    ldmatrix reads a group's pixels side by side, while a warp's row copies land in `groups`
    rows. `swizzled`: pixel-major [name][x][c8], a warp's copies landing in contiguous bytes as
    they lie in global memory, the group XORed with a key of the pixel so that ldmatrix still
    reads a group's 8 pixels from 8 bank slots (TensorSpec's swizzle). Why both exist:
    docs/perf/2026-12-04-predictions-2.md. `tma` (swizzled too): the rows padded to a multiple
    of 8 pixels (row_pitch), the layout a tensor copy with tma_swizzle lands at tma_align."""
    if swizzled or tma:
        x = row_pitch(pixels, True, tma)
        return {name: count, "x": pixels if x == pixels else (pixels, x), "c8": groups}, True
    return {name: count, "c8": groups, "x": (pixels, row_pitch(pixels, swizzled))}, False


def generate_header(
    params: Conv2dGw8Params,
    config: Conv2dGw8Config,
    igrad: bool,
    weights_cl: bool,
    bias_elem: bool,
    entry: str,
    swizzled: bool = False,
    tma: bool = False,
    tma_stores: bool = False,
) -> str:
    """The C++ header that specialises conv2d_gw8.cu for one layer and config. `weights_cl`: the
    weights are read in channels_last memory ([K, R, S, 8]) instead of contiguous ([K, 8, R, S]);
    `bias_elem`: the bias is read in the activations' dtype instead of fp32; `entry`: the
    kernel's symbol (SPIO_KERNEL_ENTRY, the name of the kernel function in conv2d_gw8.cu);
    `swizzled`: the input-row stages' layout (stage_layout); `tma`: input rows arrive by tensor
    copies (sm_90; swizzled stages, aligned; the kernel then takes the input's tensor map);
    `tma_stores` (with `tma`): output rows leave by tensor copies (staged unpadded and swizzled,
    aligned as the stages are; the kernel then also takes the output's tensor map)."""
    if tma_stores and not tma:
        raise ValueError("tma_stores needs tma (the staging rows' alignment comes with it)")
    geo = _Geometry.of(params, igrad)
    element, pair = ELEMENT_TYPES[params.dtype]
    c8 = params.groups
    in_x = input_columns(params, config)
    tiles = grid_tiles(params, config, igrad)
    k, r, s = params.c, params.r, params.s

    # PyTorch's channels_last weight is [K, R, S, 8] in memory.
    def weight_dims(k: int) -> dict[str, int]:
        return {"k": k, "r": r, "s": s, "c": 8} if weights_cl else {"k": k, "c": 8, "r": r, "s": s}

    specs: list[Spec] = [
        MacroSpec(
            {
                "SPIO_CONV_ELEMENT": element,
                "SPIO_CONV_IGRAD": int(igrad),
                "SPIO_CONV_HAS_BIAS": int(params.has_bias and not igrad),
                "SPIO_KERNEL_ENTRY": entry,
                "SPIO_LOAD_VIA_TMA": int(tma),
                "SPIO_STORE_VIA_TMA": int(tma_stores),
                "SPIO_TMA_ALIGN": tma_align(config.groups),
            }
        ),
        ParamsSpec("Conv", {"r": params.r, "s": params.s, "pad_h": geo.pad_h, "pad_w": geo.pad_w}),
        ParamsSpec(
            "Block",
            {
                "c8": config.groups,
                "y": config.block_p,
                "x": config.block_q,
                "warp_x16": config.warp_q16,
                "threads": config.threads,
                "stages": config.stages,
                "mma_k": config.mma_k,
                "n": config.block_n,
                "ragged": ragged(params, config.block_n),
            },
        ),
        # The batch size (n) is given at launch: one build serves every batch size (see ragged).
        TensorSpec("Input", "const uint4", {"n": None, "y": geo.in_h, "x": geo.in_w, "c8": c8}),
        TensorSpec("Output", pair, {"n": None, "y": geo.out_h, "x": geo.out_w, "k8": c8, "k2": 4}),
        TensorSpec("Weights", f"const {element}", weight_dims(k)),
        TensorSpec("Bias", f"const {pair if bias_elem else 'float2'}", {"k8": c8, "k2": 4}),
        TensorSpec(
            "SmemInput",
            "uint4",
            *stage_layout("stage", config.stages, config.groups, in_x, swizzled, tma),
        ),
        # The block's groups of the weights, in their global layout (copied as they are).
        TensorSpec("SmemWeights", element, {"c8": config.groups, **weight_dims(8)}),
        output_staging(pair, config.block_q, config.groups, tma_stores),
        IndexSpec("BlockIdx", {**tiles, "n": None}),  # (n stays outermost)
        IndexSpec(
            "WarpIdx", {"c8": config.groups, "x16": config.block_q // (16 * config.warp_q16)}
        ),
        IndexSpec("InputLoadIdx", {"x": in_x, "c8": config.groups}),
        IndexSpec("OutputStoreIdx", {"x": config.block_q, "c8": config.groups}),
        IndexSpec("WeightChunkIdx", {"c8": config.groups, "chunk": 8 * params.r * params.s}),
        # The mma's operands and accumulator, their rows and columns named: A is 16 input pixels
        # by 8 channels, B a tap's weights, 8 input channels c by 8 output channels k (DGrad: of
        # dx by of dy), and the accumulator 16 output pixels x by those k, in the pairs (k2)
        # Output stores them in (k1: the channel in its pair).
        FragmentSpec("TapFrag", f"FragB_m16n8k8_{FRAGMENT_ELEMENTS[params.dtype]}", "c", "k"),
        FragmentSpec("AccFrag", "FragC_m16n8_f32", "x", {"k2": 4, "k1": 2}),
    ]
    return generate(specs)


def check_flags(where: str, **flags: Any) -> tuple[bool, ...]:
    """`flags`' values as plain bools (as_flag: numpy's and 0-d bool tensors count, as
    elsewhere in spio's API), in order; TypeError naming the first that is not a bool."""
    return tuple(as_flag(where, name, value) for name, value in flags.items())


def check_tma_l2(where: str, tma_l2: Any) -> int:
    """make_kernel's `tma_l2` as an int, the L2 promotion in bytes (0, 64, 128 or 256) of the
    tensor maps a `tma` kernel takes; TypeError or ValueError naming `where` and the value."""
    from ..cuda.tensor_map import L2_PROMOTIONS

    value = as_integer(tma_l2)
    if value is None:
        raise TypeError(f"{where} needs tma_l2 an int (bytes of L2 promotion), got {tma_l2!r}")
    if value not in L2_PROMOTIONS:
        raise ValueError(
            f"{where} needs tma_l2 0, 64, 128 or 256 (bytes of L2 promotion), got {value}"
        )
    return value


def make_kernel(
    params: Conv2dGw8Params,
    config: Conv2dGw8Config | None = None,
    igrad: bool = False,
    weights_cl: bool = False,
    bias_elem: bool = False,
    swizzled: bool = False,
    tma: bool = False,
    tma_stores: bool = False,
    tma_l2: int = 0,
) -> Kernel:
    """The FProp (or, with igrad, DGrad) kernel for `params` with tile `config`; `weights_cl`
    reads channels_last weights, `bias_elem` (FProp with a bias) a bias in the activations'
    dtype, `swizzled` stages input rows pixel-major (see generate_header; by default spio runs
    the group-major kernels, with SPIO_TMA the tensor-copy ones, and scripts/ablate_kernel.py
    times the others), `tma` fills those stages by tensor copies (sm_90 and newer only; implies
    `swizzled`), `tma_stores` also stores the output rows by tensor copies (implies `tma`),
    `tma_l2` (bytes: 0, 64, 128 or 256; implies `tma`) has L2 fetch that much at once for the
    copies (their tensor maps' L2 promotion; CUTLASS asks 128, spio by default none). The tile
    loop is the same in every variant."""
    check_params(params, "conv2d_gw8 make_kernel")
    # (igrad: its header would define SPIO_CONV_IGRAD as int(igrad); the others pick variants)
    igrad, weights_cl, bias_elem, swizzled, tma, tma_stores = check_flags(
        "conv2d_gw8 make_kernel",
        igrad=igrad,
        weights_cl=weights_cl,
        bias_elem=bias_elem,
        swizzled=swizzled,
        tma=tma,
        tma_stores=tma_stores,
    )
    tma_l2 = check_tma_l2("conv2d_gw8 make_kernel", tma_l2)
    if config is not None and not isinstance(config, Conv2dGw8Config):
        raise TypeError(
            f"conv2d_gw8 make_kernel needs a Conv2dGw8Config, got {type(config).__name__}"
        )
    config = config or default_config(params, igrad)
    check_tensor_bytes(params)
    tma = tma or tma_stores or tma_l2 > 0
    swizzled = swizzled or tma
    smem = check_shared_mem(
        shared_mem_bytes(params, config, swizzled, tma, tma_stores),
        f"config {config.encode()} of layer {params.encode()}",
        tma,
    )
    bias_elem = bias_elem and params.has_bias and not igrad
    variant = (
        ("__ragged" if ragged(params, config.block_n) else "")
        + ("__wcl" if weights_cl else "")
        + ("__belem" if bias_elem else "")
        + ("__tmaio" if tma_stores else "__tma" if tma else "__swz" if swizzled else "")
        + (f"__l2p{tma_l2}" if tma_l2 else "")  # (the same code: another launch's maps)
    )
    blocks = math.prod(grid_tiles(params, config, igrad).values())
    kind = "dgrad" if igrad else "fprop"
    # The code does not depend on the batch size (given at launch) beyond `ragged`: neither does
    # the name, so kernels of one layer and config share one build, whatever their grids.
    name = f"conv2d_gw8_{kind}__{params.encode_image()}__{config.encode()}{variant}"
    entry = entry_symbol(name)
    return Kernel(
        name=name,
        source_file=SOURCE_FILE,
        entry=entry,
        headers=(
            (
                HEADER_NAME,
                generate_header(
                    params, config, igrad, weights_cl, bias_elem, entry, swizzled, tma, tma_stores
                ),
            ),
        ),
        grid=(blocks, 1, 1),
        block=(config.threads, 1, 1),
        shared_mem_bytes=smem,
        info=(
            ("params", params),
            ("config", config),
            ("igrad", igrad),
            ("weights_cl", weights_cl),
            ("bias_elem", bias_elem),
            ("tma_l2", tma_l2),
            ("tma_stores", tma_stores),
            ("tma", tma),
            ("swizzled", swizzled),
        ),
    )


def operand_layout(weight, bias=None) -> tuple[bool, bool]:
    """(weights_cl, bias_elem) of the kernel variant that reads `weight` and `bias` as they are
    held: channels_last weights, a bias in half precision. Other weight layouts get (False, ...):
    fprop and dgrad copy them into the contiguous layout."""
    import torch

    weights_cl = not weight.is_contiguous() and weight.is_contiguous(
        memory_format=torch.channels_last
    )
    return weights_cl, bias is not None and bias.dtype != torch.float32


def variant(kernel: Kernel, weights_cl: bool, bias_elem: bool) -> Kernel:
    """`kernel` (same params, config and stage layout) reading weights and bias as make_kernel's
    flags say."""
    if (weights_cl, bias_elem) == (kernel.info_value("weights_cl"), kernel.info_value("bias_elem")):
        return kernel
    return _remade(kernel, weights_cl=weights_cl, bias_elem=bias_elem)


def _remade(kernel: Kernel, **changes: Any) -> Kernel:
    """make_kernel with `kernel`'s arguments (its info: what make_kernel was given), but for
    `changes`."""
    return make_kernel(**dict(kernel.info) | changes)


def with_swizzled_stages(kernel: Kernel) -> Kernel:
    """`kernel` (same params, config, operand layouts) with its input rows staged swizzled
    (stage_layout): the layout scripts/ablate_kernel.py times against the group-major one."""
    return _remade(kernel, swizzled=True, tma=False, tma_stores=False, tma_l2=0)


#: SPIO_TMA's values, and what each moves by tensor copies (sm_90's TMA): (the input rows of
#: every pass, FProp/DGrad's output rows). Off by default: the H200 has not timed them yet
#: (docs/perf/2026-12-04-predictions-2.md). Read here, where torch is not imported, so that
#: `spio compile` checking its settings first does not take the seconds torch takes to import.
TENSOR_COPIES = {"off": (False, False), "loads": (True, False), "loads+stores": (True, True)}


def tensor_copies(arch: str | None = None) -> tuple[bool, bool]:
    """(input rows, FProp/DGrad output rows) by tensor copies, as SPIO_TMA says (unset: off),
    in kernels run on `arch` ('sm_90'): neither on an arch without tensor copies
    (has_bulk_copies). `arch` None: as the setting says (the CPU emulator runs them all).
    ValueError for a setting that is none of TENSOR_COPIES', whatever the arch.
    (Whether a config's stages fit with them: families.Family.tensor_copies.)"""
    copies = TENSOR_COPIES[choice("SPIO_TMA", tuple(TENSOR_COPIES))]
    if arch is not None and not has_bulk_copies(arch):
        return False, False
    return copies


def with_tma_stages(kernel: Kernel, stores: bool = False, l2: int = 0) -> Kernel:
    """`kernel` (same params, config, operand layouts) with its input rows brought in by tensor
    copies into swizzled stages (sm_90 and newer), with `stores` its output rows stored by
    tensor copies too, and with `l2` their maps' L2 promotion (make_kernel's `tma_l2`): what
    scripts/ablate_kernel.py times against cp.async and plain stores."""
    return _remade(kernel, tma=True, tma_stores=stores, tma_l2=l2)


def input_box(kernel: Kernel) -> tuple[int, int]:
    """(groups, pixels) of the box of the row map (row_map) a `tma` kernel reads its input (x or
    dy) through: the block's groups across its input columns."""
    params, config = kernel.info_value("params"), kernel.info_value("config")
    return config.groups, input_columns(params, config)


def output_box(kernel: Kernel) -> tuple[int, int]:
    """(groups, pixels) of the box of the row map a `tma_stores` kernel writes its output (y or
    dx) through: the block's groups across its output columns."""
    config = kernel.info_value("config")
    return config.groups, config.block_q


def map_arguments(kernel: Kernel, out, source, device) -> list:
    """The tensor maps a `tma` (and `tma_stores`) kernel takes after its other arguments, for
    output `out` and input `source` (NHWC), as launch arguments (row_map_argument): none for
    the others."""
    maps = []
    l2 = kernel.info_value("tma_l2", 0)
    if kernel.info_value("tma"):
        maps.append(row_map_argument(source, *input_box(kernel), device, l2))
    if kernel.info_value("tma_stores"):
        maps.append(row_map_argument(out, *output_box(kernel), device, l2))
    return maps


def _launch(kernel: Kernel, out, source, weight, bias, images: int, device) -> None:
    """Launches an FProp/DGrad kernel on `source` (x or dy, NHWC) into `out`, with the tensor maps
    it takes (map_arguments)."""
    args = [out, source, weight, bias, images, *map_arguments(kernel, out, source, device)]
    kernel.launch(args, device)


def _aligned_in(t, fmt):
    """`t` contiguous in memory format `fmt` and 16-byte aligned (the kernels copy 16-byte chunks
    with cp.async, which faults on a misaligned address); is_contiguous is cheaper than a no-op
    contiguous() call."""
    if not t.is_contiguous(memory_format=fmt):
        t = t.contiguous(memory_format=fmt)
    return t if t.data_ptr() % 16 == 0 else t.clone(memory_format=fmt)


def nhwc_operand(t):
    """`t` (N, C, H, W) in channels_last memory, the kernels' NHWC layout, 16-byte aligned: `t`
    itself where it is that already, else a copy (which every kernel then takes as it is)."""
    import torch

    return _aligned_in(t, torch.channels_last)


def _weight_as(kernel: Kernel, weight):
    """weight in the memory layout `kernel` reads (contiguous, or channels_last for a weights_cl
    variant), 16-byte aligned."""
    import torch

    fmt = torch.channels_last if kernel.info_value("weights_cl") else torch.contiguous_format
    return _aligned_in(weight, fmt)


def _bias_as(kernel: Kernel, bias, dtype):
    """bias as `kernel` reads it: fp32, or the activations' `dtype` for a bias_elem variant;
    contiguous and aligned for its pair loads (8 bytes for float2, 4 for a half pair)."""
    import torch

    if bias is None:
        return None
    want, align = (dtype, 4) if kernel.info_value("bias_elem") else (torch.float32, 8)
    if bias.dtype != want or not bias.is_contiguous():
        bias = bias.to(want).contiguous()
    return bias if bias.data_ptr() % align == 0 else bias.clone()


#: The WGrad kernels' source (conv2d_gw8_wgrad_factory's), named here for kernel_pass.
WGRAD_SOURCE_FILE = "conv2d_gw8_wgrad.cu"


def kernel_pass(kernel: Kernel) -> str | None:
    """The pass `kernel` computes: "fprop" or "dgrad" (this module's, by their "igrad" info),
    "wgrad", or None for a kernel of neither source."""
    if kernel.source_file == SOURCE_FILE:
        return "dgrad" if kernel.info_value("igrad") else "fprop"
    return "wgrad" if kernel.source_file == WGRAD_SOURCE_FILE else None


def check_layer(kernel: Kernel, params: Conv2dGw8Params, pass_: str) -> None:
    """A kernel computes the pass and the layer it was made for, on its batch size's grid: the
    caller's pass (`pass_`: "fprop", "dgrad" or "wgrad") and layer must be those (kernels of one
    name serve several batch sizes, so one is easily taken for another; a kernel of another pass
    would read its arguments as other tensors). DGrad, which reads no bias, serves a layer with
    or without one. ValueError naming what differs."""
    computes = kernel_pass(kernel)
    if computes != pass_:
        raise ValueError(
            f"conv2d_gw8 kernel {kernel.name} computes {computes or 'no conv2d_gw8 pass'}, not "
            f"{pass_}: make it with {pass_}'s factory"
        )
    made_for = kernel.info_value("params")
    if made_for is None or made_for is params:
        return
    if made_for.n != params.n:
        raise ValueError(
            f"conv2d_gw8 kernel {kernel.name} was made for a batch of {made_for.n} images (its "
            f"grid), not {params.n}: make it with this batch's params"
        )
    if made_for == params or (kernel.info_value("igrad") and _same_but_bias(made_for, params)):
        return
    raise ValueError(
        f"conv2d_gw8 kernel {kernel.name} was made for layer {made_for.encode()}, not "
        f"{params.encode()}: make it with this layer's params"
    )


def _same_but_bias(a: Conv2dGw8Params, b: Conv2dGw8Params) -> bool:
    """Whether a and b are one layer but for has_bias (dataclasses.replace would validate anew:
    slower than a whole launch's other checks)."""
    fields = ("n", "c", "h", "w", "padding", "r", "s", "dtype")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def _check_out(out, shape: tuple, dtype, device, *operands) -> None:
    """A caller-provided output must be what the kernel writes: NHWC, the right shape and dtype,
    on the operands' device, 16-byte aligned (FProp/DGrad store whole 8-channel chunks), and in
    no operand's memory (blocks would read what others have written)."""
    import torch

    if not isinstance(out, torch.Tensor):
        raise TypeError(f"conv2d_gw8 out must be a tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"conv2d_gw8 out must be {dtype} of shape {tuple(shape)} on {device}, got "
            f"{out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if not out.is_contiguous(memory_format=torch.channels_last) or out.data_ptr() % 16:
        raise ValueError(
            "conv2d_gw8 out must be channels_last contiguous and 16-byte aligned, got strides "
            f"{tuple(out.stride())} at address {out.data_ptr():#x}"
        )
    if any(t is not None and _overlap(out, t) for t in operands):
        raise ValueError(
            "conv2d_gw8 out must not share memory with an operand (x, dy, weight, bias)"
        )


def _overlap(a, b) -> bool:
    """Whether the bytes two tensors span (first element to last, gaps included) overlap:
    disjoint views of one buffer do not."""
    if not a.numel() or not b.numel():
        return False
    (a_lo, a_hi), (b_lo, b_hi) = _bytes_spanned(a), _bytes_spanned(b)
    return a_lo < b_hi and b_lo < a_hi


def _bytes_spanned(t) -> tuple[int, int]:
    """[first, last + 1) byte addresses of a tensor with elements."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def check_call(where: str, params: Any, kernel: Any, **tensors: Any) -> None:
    """TypeError naming the argument of a launch function (`where`: "conv2d_gw8 fprop", ...)
    that is not of its kind: params a Conv2dGw8Params, kernel a Kernel or None, each of
    `tensors` a tensor (a bias, `bias`, may be None). For callers that have not validated
    their arguments; the shapes and dtypes are _check_shapes' and _check_dtype's."""
    check_params(params, where)
    if kernel is not None and not isinstance(kernel, Kernel):
        raise TypeError(f"{where} needs kernel to be a Kernel or None, got {type(kernel).__name__}")
    check_tensor_arguments(where, ("bias",), **tensors)


def _check_dtype(params: Conv2dGw8Params, *tensors) -> None:
    expected = torch_dtype(params.dtype)
    for t in tensors:
        if t is not None and t.dtype != expected:
            raise ValueError(
                f"conv2d_gw8 {params.dtype} kernels need {expected} tensors, got {t.dtype}"
            )


def _check_shapes(params: Conv2dGw8Params, **tensors) -> None:
    """Each named tensor must have its shape under `params` (x, dy, weight, bias): the kernels
    index by `params`, so a tensor of another shape would be read out of bounds. All must be
    on one device (a kernel would take another device's address as its own)."""
    shapes = {
        "x": params.input_shape,
        "dy": params.output_shape,
        "weight": params.weight_shape,
        "bias": (params.c,),
    }
    for name, t in tensors.items():
        if t is not None and t.shape != shapes[name]:
            raise ValueError(
                f"conv2d_gw8 {name} of layer {params.encode()} must have shape "
                f"{shapes[name]}, got {tuple(t.shape)}"
            )
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"conv2d_gw8 tensors must be on one device, got {where}")
    if "bias" in tensors and (tensors["bias"] is not None) != params.has_bias:
        raise ValueError(
            f"conv2d_gw8 layer {params.encode()} has has_bias={params.has_bias}, but the bias "
            f"given is {'None' if tensors['bias'] is None else 'a tensor'}"
        )


def fprop(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    params: Conv2dGw8Params,
    config: Conv2dGw8Config | None = None,
    out: Tensor | None = None,
    kernel: Kernel | None = None,
    validated: bool = False,
) -> Tensor:
    """y = conv2d_gw8(x, weight) + bias with the FProp kernel; x (N, C, H, W) and weight
    (C, 8, R, S) in any layout, bias (C,) or None. Whatever `kernel` does not read as given (see
    operand_layout and variant) is copied into what it reads. Returns y in channels_last memory.
    `validated`: the caller has checked the tensors' dtypes and shapes against `params` (as
    spio.functional's layers do, once per call signature), so they are not checked again."""
    import torch

    if not validated:
        check_call("conv2d_gw8 fprop", params, kernel, x=x, weight=weight, bias=bias)
        _check_dtype(params, x, weight)
        _check_shapes(params, x=x, weight=weight, bias=bias)
    kernel = kernel or make_kernel(params, config)
    check_layer(kernel, params, "fprop")
    if out is None:
        out = torch.empty(
            params.output_shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last
        )
    else:
        _check_out(out, params.output_shape, x.dtype, x.device, x, weight, bias)
    bias = _bias_as(kernel, bias, x.dtype)
    _launch(kernel, out, nhwc_operand(x), _weight_as(kernel, weight), bias, params.n, x.device)
    return out


def dgrad(
    dy: Tensor,
    weight: Tensor,
    params: Conv2dGw8Params,
    config: Conv2dGw8Config | None = None,
    out: Tensor | None = None,
    kernel: Kernel | None = None,
    validated: bool = False,
) -> Tensor:
    """dx = the input gradient of conv2d_gw8 for output gradient dy, with the DGrad kernel.
    Returns dx (N, C, H, W) in channels_last memory. `validated` as for fprop."""
    import torch

    if not validated:
        check_call("conv2d_gw8 dgrad", params, kernel, dy=dy, weight=weight)
        _check_dtype(params, dy, weight)
        _check_shapes(params, dy=dy, weight=weight)
    kernel = kernel or make_kernel(params, config, igrad=True)
    check_layer(kernel, params, "dgrad")
    if out is None:
        out = torch.empty(
            params.input_shape, dtype=dy.dtype, device=dy.device, memory_format=torch.channels_last
        )
    else:
        _check_out(out, params.input_shape, dy.dtype, dy.device, dy, weight)
    _launch(kernel, out, nhwc_operand(dy), _weight_as(kernel, weight), None, params.n, dy.device)
    return out


#: FProp and DGrad (igrad=True) of the group-width-8 convolution.
conv2d_gw8_kernel_factory = KernelFactory(
    name="conv2d_gw8",
    configs=configs,
    make_kernel=make_kernel,
    default_config=default_config,
    options=("igrad",),
)
