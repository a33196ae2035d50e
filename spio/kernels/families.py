"""The table of kernel families: the kernels of the grouped convolution's passes, by tile config.

A family is one kernel source specialised by tile configs. The compile sweep reaches the kernels
through this table alone; the other users branch on the family's name or pass too, so a new
family needs more than its entry: its launch arguments and call in `autotune.kernel_inputs` and
`pass_call`; its features in `perf_model.features` (by pass) and a model file per arch in
`spio/perf_models`; its bytes in `stats` and its tolerance in `spio.reference.tolerance` (by
pass); its timed variant in `perf_samples` (WGrad's); its multi-image configs in
`spio.bench.sanitize`; and where spio runs it, its calls in `functional._kernels`,
`check.run_one`, `spio.bench.run`'s `spio_call` and `spio.bench.insitu`. One whose parameters
are not Conv2dGw8Params (on which the `Family` fields are typed) needs its factory in
`spio.kernels.__init__` too and, where one factory serves two families (as conv2d_gw8's serves
FProp and DGrad), `family_of` below.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from . import conv2d_gw8_factory as fd
from . import conv2d_gw8_wgrad_factory as wg
from .conv2d_gw8_params import Conv2dGw8Params
from .kernel import Kernel


@dataclass(frozen=True)
class Family:
    """One kernel family: its configs, kernels, heuristic, and the pass whose bytes it moves.
    `make_kernel` makes the kernel spio runs for a config (for WGrad, the reduction variant
    `uses_partial_sums` picks), so what is compiled, timed and modelled is what runs; for FProp
    and DGrad it is the variant of contiguous weights and an fp32 bias, which stands in (in
    autotuning, sampling and the models) for the `__wcl` and `__belem` twins a channels_last or
    half model runs: the same tile and bytes, the weights read in another order (untimed)."""

    name: str
    pass_: str  # the Conv2dStats pass: fprop, dgrad or wgrad
    config_type: type
    configs: Callable[[Conv2dGw8Params], list]
    make_kernel: Callable[[Conv2dGw8Params, Any], Kernel]
    # The analytic heuristic's, each taking machine= (conv2d_gw8_factory.Machine; default: an
    # H200-class GPU) after its other arguments.
    heuristic_key: Callable[..., tuple]  # (params, config): the heuristic's order, ascending
    default_config: Callable[..., Any]  # (params)
    # (params, config, swizzled=False, tma=False[, tma_stores=False]): dynamic, per block
    shared_mem_bytes: Callable[..., int]
    # Config fields the heuristic's cost cannot weigh; autotuning tries the pick's variants in them.
    heuristic_ignores: tuple[str, ...] = ()
    # (config field, values the heuristic cannot judge: no GPU had run them when they came) pairs:
    # heuristic_key ranks them last; without a model, autotuning tries the pick's variants with
    # them too. (Pairs: a Family is hashed.)
    heuristic_untimed: tuple[tuple[str, tuple[int, ...]], ...] = ()
    reads_bias: bool = True  # DGrad does not
    # Defines (Kernel.with_defines) that leave in the main loop only the code of a full row step,
    # for counting its instructions (scripts/sass_loop.py, resource_report.py). WGrad's tile-edge
    # steps run a second, careful copy of the step's runs, which the steps between never take.
    full_step_defines: tuple[str, ...] = ()
    # (params): configs on trial, outside `configs` (spio never picks them), which the ablation
    # and SASS tools may name to time or count them.
    trial_configs: Callable[[Conv2dGw8Params], list] = lambda params: []

    def layer_as_run(self, params: Conv2dGw8Params) -> Conv2dGw8Params:
        """The layer whose kernel spio runs for this family's pass of `params`: a family that
        reads no bias (DGrad) runs the bias-free layer's kernel, so one kernel serves both."""
        if self.reads_bias or not params.has_bias:
            return params
        return replace(params, has_bias=False)

    def runnable_kernels(self, params: Conv2dGw8Params, config: Any) -> list[Kernel]:
        """Every kernel spio may run for this family's pass of `params` with `config` (what
        `spio compile` builds): of the layer as run (layer_as_run); FProp and DGrad reading the
        weights as held (contiguous, or channels_last: `__wcl`) and FProp's bias as given (fp32,
        or the input's dtype: `__belem`); WGrad as make_kernel makes it (partial sums or
        atomics, as spio runs the config), a partials kernel followed by the sum_slots kernels
        into each gradient dtype pair spio may ask for (sum_dtype_pairs)."""
        params = self.layer_as_run(params)
        kernel = self.make_kernel(params, config)
        if self.pass_ == "wgrad":
            if not kernel.info_value("partials"):
                return [kernel]
            return [kernel, *(wg.sum_kernel(params, *pair) for pair in wg.sum_dtype_pairs(params))]
        elems = (False, True) if self.reads_bias and params.has_bias else (False,)
        return [fd.variant(kernel, cl, elem) for cl in (False, True) for elem in elems]

    def tensor_copies(
        self, params: Conv2dGw8Params, config: Any, arch: str | None
    ) -> tuple[bool, bool]:
        """(input rows, output rows) moved by tensor copies in the kernel spio runs for `config`
        on `arch` (None: the CPU emulator): what SPIO_TMA asks there
        (conv2d_gw8_factory.tensor_copies; output rows in FProp and DGrad only), or neither
        where the config's stages would pass a block's shared memory with them (the cp.async
        kernel then runs). Autotuning, perf sampling, the models' training and `spio compile`
        follow it, as the layers do (`with_tensor_copies`)."""
        loads, stores = fd.tensor_copies(arch)
        stores = stores and self.pass_ != "wgrad"
        if not loads:
            return False, False
        extra = {"tma_stores": True} if stores else {}
        smem = self.shared_mem_bytes(params, config, swizzled=True, tma=True, **extra)
        return (True, stores) if smem <= fd.MAX_SHARED_BYTES else (False, False)

    @property
    def config_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.config_type))

    def config_from_fields(self, values: dict[str, Any]) -> Any:
        """The config whose fields are `values` (ints, or strings of ints). A field missing or
        empty takes its default: a config recorded before the field existed had that value."""
        given = {name: values.get(name, "") for name in self.config_fields}
        return self.config_type(
            **{name: int(value) for name, value in given.items() if str(value).strip() != ""}
        )

    def config_named(self, params: Conv2dGw8Params, name: str, trial: bool = False) -> Any:
        """The config of this family for `params` whose encode() is `name`, among its trial
        configs too with `trial`; ValueError if none."""
        for config in self.configs(params) + (self.trial_configs(params) if trial else []):
            if config.encode() == name:
                return config
        raise ValueError(f"{self.name} has no config {name!r} for layer {params.encode()}")


def _fprop_dgrad(name: str, pass_: str, igrad: bool) -> Family:
    bind = functools.partial
    return Family(
        name=name,
        pass_=pass_,
        config_type=fd.Conv2dGw8Config,
        configs=bind(fd.configs, igrad=igrad),
        make_kernel=bind(fd.make_kernel, igrad=igrad),
        heuristic_key=bind(fd.heuristic_key, igrad=igrad),
        default_config=bind(fd.default_config, igrad=igrad),
        shared_mem_bytes=fd.shared_mem_bytes,
        heuristic_ignores=("block_n",),  # no term for what a block pays once
        reads_bias=not igrad,
    )


FAMILIES: dict[str, Family] = {
    "conv2d_gw8_fprop": _fprop_dgrad("conv2d_gw8_fprop", "fprop", igrad=False),
    "conv2d_gw8_dgrad": _fprop_dgrad("conv2d_gw8_dgrad", "dgrad", igrad=True),
    "conv2d_gw8_wgrad": Family(
        name="conv2d_gw8_wgrad",
        pass_="wgrad",
        config_type=wg.Conv2dGw8WgradConfig,
        configs=wg.configs,
        make_kernel=wg.production_kernel,  # partial sums or atomics, as spio runs the config
        heuristic_key=wg.heuristic_key,
        default_config=wg.default_config,
        shared_mem_bytes=wg.shared_mem_bytes,
        full_step_defines=("SPIO_WGRAD_UNMASKED",),
        heuristic_untimed=(("block_n", wg.UNTIMED_BLOCK_N),),
        trial_configs=wg.trial_configs,
    ),
}


#: pass ("fprop", "dgrad", "wgrad") -> the family that computes it.
FAMILY_OF_PASS: dict[str, Family] = {family.pass_: family for family in FAMILIES.values()}


def family_of_kernel(kernel: Kernel) -> Family | None:
    """The family of a kernel the factories made (FProp, DGrad or WGrad, whatever its variant);
    None for another kernel (sum_slots, say)."""
    if kernel.source_file == wg.SOURCE_FILE:
        return FAMILIES["conv2d_gw8_wgrad"]
    if kernel.source_file == fd.SOURCE_FILE:
        return FAMILIES["conv2d_gw8_dgrad" if kernel.info_value("igrad") else "conv2d_gw8_fprop"]
    return None


def with_tensor_copies(kernel: Kernel, arch: str | None) -> Kernel:
    """`kernel` (same params, config, operand layouts and reduction) as spio runs it on `arch`
    (None: the CPU emulator): with its rows moved by tensor copies where Family.tensor_copies
    says so, else `kernel` itself (as is a kernel of no family, such as sum_slots: it moves no
    rows)."""
    family = family_of_kernel(kernel)
    if family is None:
        return kernel
    params, config = kernel.info_value("params"), kernel.info_value("config")
    loads, stores = family.tensor_copies(params, config, arch)
    if not loads:
        return kernel
    if family.pass_ == "wgrad":
        return wg.with_tma_stages(kernel)
    return fd.with_tma_stages(kernel, stores)


def family_of(factory_name: str, options: dict[str, Any]) -> Family | None:
    """The family a KernelFactory call selects for: by factory name (and igrad); None if unknown."""
    if factory_name == "conv2d_gw8":
        return FAMILIES["conv2d_gw8_dgrad" if options.get("igrad") else "conv2d_gw8_fprop"]
    return FAMILIES.get(factory_name)


def get_family(name: str) -> Family:
    """The Family called `name`; ValueError naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"kernel family must be one of {', '.join(FAMILIES)}, got {name!r}"
        ) from None
