"""Replace eligible nn.Conv2d modules by Conv2dGw8, and list the layer params a model meets.

Both walk the module tree instead of tracing, so they work on models FX cannot trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from spio.functional._kernels import (
    PASSES,
    images_per_launch,
    pass_mask_or_flag,
    too_large_to_launch,
)
from spio.functional.checks import KERNEL_DTYPES, autocast_dtype
from spio.kernels import autotune
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params, as_flag, dtype_name
from spio.kernels.kernel import Kernel, build_kernels
from spio.layers.conv2d_gw8 import (
    Conv2dGw8,
    compiled_in_place,
    conv_arguments,
    fixed_ineligibility,
    ineligibility,
    mendable_problem,
    pytorch_standing_in,
    receive_hooks,
    resolve_padding,
    restore_problem,
)
from spio.log import logger, progress_bar

#: What transform's `include` may answer: True (spio runs every pass), False (the convolution
#: stays as it is), or the names of the passes spio runs ("fprop", "dgrad", "wgrad"; none is False).
Included = bool | Iterable[str]


def _check_model(model: object, caller: str, kwargs: object = None) -> None:
    """TypeError naming the caller when model is not an nn.Module, or kwargs (the keyword
    arguments of the model's call, where the caller takes them) neither None nor a dict."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"spio.{caller} needs an nn.Module, got {type(model).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(
            f"spio.{caller}: kwargs must be a dict of the model call's keyword arguments, got "
            f"{type(kwargs).__name__}"
        )


def transform(
    model: nn.Module, include: Callable[[str, nn.Conv2d], Included] | None = None
) -> nn.Module:
    """Replace, in place, every eligible nn.Conv2d of model by a Conv2dGw8 sharing its Parameters.

    Eligible: exactly nn.Conv2d (subclasses are left alone; one parametrized with
    torch.nn.utils.parametrize keeps its parametrizations), group width 8, C == K, stride 1,
    dilation 1, kernel 1..5, zeros padding that is symmetric, no forward set on the instance,
    not compiled in place (conv.compile(): transform first), and a weight that is a whole
    Parameter: a conv kept for its weight or its compile gets a warning saying how to mend it
    (the deprecated torch.nn.utils.weight_norm's weight is a plain tensor; in a model already
    wrapped in FSDP it is a shard, or a plain tensor: transform before wrapping the model).
    `include(name, conv)`, if given, is asked about each eligible convolution (`name` as in
    model.named_modules()) and keeps those it returns False for as they are: for instance a
    network's last stages, whose 7x7 and 8x8 layers still run faster in cuDNN (docs/perf/). It
    may instead return the passes spio should run, e.g. ("fprop", "dgrad"), leaving the others
    to PyTorch (Conv2dGw8.spio_passes). A Conv2dGw8 already in model (transformed before) is
    asked too where include is given, and its spio_passes set to the answer (False: none, so
    PyTorch runs it), so that `transform(model, include=where_faster(model, x))` applies to a
    transformed model as to a fresh one. A module reachable by several paths is decided once, by
    its first name, and stays shared. Returns model (or its replacement if model itself is an
    eligible convolution). Raises TypeError when model is not an nn.Module or include is not
    callable; when include answers anything but True, False or pass names, it raises, leaving
    model as it was, as Conv2dGw8.spio_passes does for that value: TypeError for an answer of
    another type (1.0, None), ValueError for unknown pass names.
    """
    _check_model(model, "transform")
    if include is not None and not callable(include):
        raise TypeError(
            "spio.transform: include must be a function of (name, conv) or None, got "
            f"{type(include).__name__}"
        )
    if isinstance(model, Conv2dGw8) and include is not None:
        model.spio_passes = _passes(include, "", model)
        logger.info("spio.transform set the passes of 1 Conv2dGw8: %s", model.spio_passes)
        return model
    if Conv2dGw8.match(model):
        return _transform_conv(model, include)
    # Every convolution decided first (include is asked, and its answers checked, before the
    # model changes: an error leaves it as it was), then replaced.
    plan = _plan(model, include)
    _apply(plan)
    _log_plan(plan, model)
    return model


def _transform_conv(conv: nn.Conv2d, include: Callable | None) -> nn.Module:
    """transform of a model that is itself an eligible nn.Conv2d: its replacement, or conv as
    it is where include keeps it."""
    passes = _passes(include, "", conv)
    if not passes:
        logger.info("spio.transform replaced 0 of 1 nn.Conv2d modules (1 excluded)")
        return conv
    logger.info("spio.transform replaced 1 of 1 nn.Conv2d modules")
    replacement = Conv2dGw8.from_torch_module(conv, passes)
    receive_hooks(replacement, conv)
    return replacement


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What transform does to a model, decided before anything in it changes."""

    #: By id, each nn.Conv2d decided: its Conv2dGw8, or itself where include keeps it as it is.
    replacements: dict[int, nn.Conv2d] = dataclasses.field(default_factory=dict)
    #: By id, the nn.Conv2d replaced (their hooks go to their replacements).
    originals: dict[int, nn.Conv2d] = dataclasses.field(default_factory=dict)
    #: (parent, name, id of the conv) for the places of the convs in replacements.
    places: list[tuple[nn.Module, str, int]] = dataclasses.field(default_factory=list)
    #: By id, the Conv2dGw8 layers met (transformed before) and the passes include gave them.
    respecified: dict[int, tuple[Conv2dGw8, int]] = dataclasses.field(default_factory=dict)
    #: By id, the distinct ineligible modules kept, and why.
    skipped: dict[int, str] = dataclasses.field(default_factory=dict)
    #: The reasons among skipped's a user can mend (a weight, a compile), and how many convs each.
    mendable: Counter[str] = dataclasses.field(default_factory=Counter)


def _plan(model: nn.Module, include: Callable | None) -> _Plan:
    """transform's decisions for model (not itself an eligible nn.Conv2d), model unchanged:
    include asked about each convolution once, by its first name, and its answers checked."""
    names: dict[int, str] = {}  # each module's first name
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), name)
    plan = _Plan()
    if isinstance(model, nn.Conv2d) and not isinstance(model, Conv2dGw8):  # match said no: why
        _keep(model, plan.skipped, plan.mendable)
    for parent in list(model.modules()):
        prefix = names.get(id(parent), "")
        for name, child in list(parent._modules.items()):
            if isinstance(child, Conv2dGw8):
                if include is not None and id(child) not in plan.respecified:
                    passes = _passes(include, _qualified(prefix, name), child)
                    plan.respecified[id(child)] = (child, passes)
                continue
            if not isinstance(child, nn.Conv2d):
                continue
            if id(child) not in plan.replacements and id(child) not in plan.skipped:
                if _keep(child, plan.skipped, plan.mendable):
                    continue
                passes = _passes(include, _qualified(prefix, name), child)
                if not passes:
                    plan.replacements[id(child)] = child  # kept as it is, wherever it appears
                    continue
                plan.replacements[id(child)] = Conv2dGw8.from_torch_module(child, passes)
                plan.originals[id(child)] = child
            if id(child) in plan.replacements:
                plan.places.append((parent, name, id(child)))
    return plan


def _qualified(prefix: str, name: str) -> str:
    """The name of submodule `name` of the module named `prefix`, as named_modules gives it."""
    return f"{prefix}.{name}" if prefix else name


def _apply(plan: _Plan) -> None:
    """transform's changes: each replacement put in its places with its original's hooks, and
    the passes include gave set on the Conv2dGw8 layers met."""
    for parent, name, key in plan.places:
        # A conv within a conv replaced too goes into the replacement (which shares its
        # submodules; the replaced one is dropped).
        _set_child(plan.replacements.get(id(parent), parent), name, plan.replacements[key])
    for key, original in plan.originals.items():
        receive_hooks(plan.replacements[key], original)
    for layer, passes in plan.respecified.values():
        layer.spio_passes = passes


def _log_plan(plan: _Plan, model: nn.Module) -> None:
    """transform's log lines once plan is applied to model: how many convolutions it replaced,
    how it set the passes of the Conv2dGw8 layers met, and why it kept the others."""
    convs = [m for m in plan.replacements.values() if isinstance(m, Conv2dGw8)]
    excluded = len(plan.replacements) - len(convs)  # (include's: kept as they are)
    total = len(plan.replacements) + len(plan.skipped)
    note = f" ({excluded} excluded)" if excluded else ""
    if any(m.spio_passes != PASSES for m in convs):  # some passes left to PyTorch: say how many
        note += f"; spio runs {_pass_counts(convs)} of their passes"
    logger.info("spio.transform replaced %d of %d nn.Conv2d modules%s", len(convs), total, note)
    if plan.respecified:  # a second transform, with include: what it made of the layers it found
        layers = [layer for layer, _ in plan.respecified.values()]
        logger.info(
            "spio.transform set the passes of %d Conv2dGw8 layers by include: spio runs %s "
            "of their passes",
            len(layers),
            _pass_counts(layers),
        )
    # Nothing taken, excluded, or taken before (a second call): the user sees why at the default
    # level.
    none_taken = not plan.replacements and not any(
        isinstance(m, Conv2dGw8) for m in model.modules()
    )
    for reason, count in Counter(plan.skipped.values()).most_common():
        # (every reason a warning where nothing was taken: the user sees why at the default
        # level; else only those the user can mend)
        log = logger.warning if reason in plan.mendable or none_taken else logger.debug
        log("spio.transform kept %d nn.Conv2d: %s", count, reason)


def _pass_counts(layers: list[Conv2dGw8]) -> str:
    """How many of `layers` run each pass on spio's kernels: "fprop 2, dgrad 2, wgrad 0"."""
    return ", ".join(f"{p} {sum(p in m.spio_passes for m in layers)}" for p in PASSES)


def _keep(conv: nn.Conv2d, skipped: dict[int, str], mendable: Counter[str]) -> bool:
    """Whether transform keeps `conv` as it is; if so, records why (counting it as mendable
    where the user can change that)."""
    reason = fixed_ineligibility(conv)
    if reason is None:
        reason = mendable_problem(conv)
        if reason is None:
            return False
        mendable[reason] += 1
    elif _may_become_eligible(conv):
        reason = (
            f"is an uninitialised {type(conv).__name__}, whose channels are not known yet: run "
            "one forward pass before transform"
        )
        mendable[reason] += 1
    skipped[id(conv)] = reason
    return True


def _may_become_eligible(conv: nn.Conv2d) -> bool:
    """Whether `conv` is an uninitialised lazy conv (nn.LazyConv2d) that its first call, which
    sets its in_channels, could make an eligible nn.Conv2d: all else is known before it."""
    if not (isinstance(conv, LazyModuleMixin) and conv.has_uninitialized_params()):
        return False
    # (eligible only with as many input channels as output channels)
    arguments = {**conv_arguments(conv), "in_channels": conv.out_channels}
    return ineligibility(**arguments) is None


def untransform(model: nn.Module) -> nn.Module:
    """Replace, in place, every Conv2dGw8 of model by a plain nn.Conv2d sharing its Parameters:
    the inverse of transform. The model then runs PyTorch's convolution everywhere (as it
    does under torch.onnx.export without this). A module reachable by several paths
    stays shared. Returns model (or its replacement if model itself is a Conv2dGw8). Raises
    ValueError, leaving model as it was, naming the layers that cannot be given back and why
    (`restore_problem`): a weight that is a shard or not a Parameter (FSDP's wrappers swap the
    full weights in on the modules they wrapped: untransform before wrapping; torch.nn.utils.prune
    and the deprecated torch.nn.utils.weight_norm: remove them first), a forward set on the
    instance, or a subclass of Conv2dGw8. A Conv2dGw8 compiled in place gives an nn.Conv2d that
    is not (with a warning)."""
    _check_model(model, "untransform")
    stuck: dict[str, list[str]] = {}  # why: the layers' names
    for name, module in model.named_modules():
        reason = restore_problem(module) if isinstance(module, Conv2dGw8) else None
        if reason is not None:
            stuck.setdefault(reason, []).append(repr(name))
    if stuck:
        count = sum(map(len, stuck.values()))
        reasons = "; ".join(
            ", ".join(names[:3]) + (", ..." if len(names) > 3 else "") + f" {reason}"
            for reason, names in stuck.items()
        )
        raise ValueError(
            f"spio.untransform changed nothing: {count} Conv2dGw8 layers cannot be given back "
            f"as nn.Conv2d: {reasons}"
        )
    replacements: dict[int, nn.Conv2d] = {}
    compiled = 0

    def restored(conv: Conv2dGw8) -> nn.Conv2d:
        nonlocal compiled
        if id(conv) not in replacements:
            replacements[id(conv)] = conv.to_torch_module()
            compiled += compiled_in_place(conv) is not None
        return replacements[id(conv)]

    originals: dict[int, Conv2dGw8] = {}
    if isinstance(model, Conv2dGw8):
        result: nn.Module = restored(model)
        originals[id(model)] = model
    else:
        result = model
        for parent in list(model.modules()):
            for name, child in list(parent._modules.items()):
                if isinstance(child, Conv2dGw8):
                    # Into parent's replacement where it has one (a conv within a conv).
                    _set_child(replacements.get(id(parent), parent), name, restored(child))
                    originals[id(child)] = child
    for key, original in originals.items():
        receive_hooks(replacements[key], original)
    logger.info("spio.untransform restored %d nn.Conv2d modules", len(replacements))
    if compiled:
        logger.warning(
            "spio.untransform: %d Conv2dGw8 were compiled in place (Module.compile); the "
            "nn.Conv2d restored are not: compile after untransform",
            compiled,
        )
    return result


def _set_child(parent: nn.Module, name: str, child: nn.Module) -> None:
    """parent's submodule `name` replaced by child. A torch.compile'd module (OptimizedModule)
    calls the module it wrapped, bound when it was made: it is made to call the new one."""
    parent._modules[name] = child
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not loaded: nothing compiled
    if name == "_orig_mod" and eval_frame and isinstance(parent, eval_frame.OptimizedModule):
        parent._initialize()


def _passes(include: Callable | None, name: str, conv: nn.Conv2d) -> int:
    """The passes spio runs for `conv` by include's answer, as bits (0: keep conv as it is).
    An answer that is none of True, False, a pass name or pass names is an error naming it, as
    Conv2dGw8.spio_passes gives for the same value: TypeError for an answer of another type
    (1.0, None, a number: bits are spio_passes', not include's), ValueError for unknown pass
    names. (numpy's bool is a bool: np.prod(conv.kernel_size) < 49.)"""
    answer = True if include is None else include(name, conv)
    return pass_mask_or_flag(
        answer,
        f"spio.transform: include({name!r}, conv) must return True, False or pass names "
        f"among {PASSES}",
        bits=False,
    )


def _activation_dtype(x: torch.Tensor) -> str | None:
    """The dtype a kernel would see for input x: autocast's, in a region (it casts fp16, bf16 and
    fp32 inputs to its dtype, not float64), else its own; None where no kernel runs (fp32
    outside autocast, float64: the layer runs PyTorch's convolution). On the meta device, where
    nothing runs and autocast does not apply, a model's layers are listed as fp16."""
    region = autocast_dtype(x.device.type)
    if region in KERNEL_DTYPES and x.dtype != torch.float64:
        return dtype_name(region)
    if x.dtype in KERNEL_DTYPES:
        return dtype_name(x.dtype)
    return "fp16" if x.device.type == "meta" else None


def _layer_params(module: nn.Conv2d, x: torch.Tensor, dtype: str) -> Conv2dGw8Params | None:
    """The layer of this call, with the filter size of the weight it runs (which may differ from
    kernel_size, as F.conv2d allows), padded as its padding says for that size."""
    if x.dim() == 3:
        x = x.unsqueeze(0)
    weight = module.weight
    size = tuple(weight.shape[-2:]) if weight.dim() == 4 else module.kernel_size
    padding = resolve_padding(module.padding, size, module.dilation)
    if x.dim() != 4 or padding is None:
        return None
    n, c, h, w = x.shape
    r, s = size
    try:
        return Conv2dGw8Params(n, c, h, w, padding, r, s, module.bias is not None, dtype)
    except ValueError as error:
        logger.debug("scan_modules skips a layer: %s", error)
        return None


def scan_modules(
    model: nn.Module, *inputs: object, kwargs: dict | None = None
) -> list[Conv2dGw8Params]:
    """Run model(*inputs, **kwargs) once and return the distinct Conv2dGw8Params its spio layers
    meet.

    Counts Conv2dGw8 modules and nn.Conv2d modules that transform would replace, in the order
    first met. PyTorch's convolution stands in for spio's layers: no kernel is built or launched.
    Under torch.autocast a layer is listed in autocast's dtype, as it runs. Calls that run
    PyTorch's convolution are left out: fp32 inputs outside autocast and float64 ones anywhere
    (with a warning: call it under autocast as the model will run; on the meta device, where
    nothing runs, they are listed as fp16), and Conv2dGw8 layers whose stride, dilation, groups
    or padding_mode were changed after construction. The pass runs without autograd, and every
    buffer (e.g. BatchNorm running statistics) and the random-number state are restored
    afterwards, so the model is left unchanged, but for lazy modules (nn.LazyConv2d, ...), which
    the pass initialises as any first call does.
    """
    _check_model(model, "scan_modules", kwargs)
    return list(dict.fromkeys(params for _, params, _ in _layers_met(model, inputs, kwargs)))


def _call_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The input tensor of a module call, positional or keyword, or None."""
    input = args[0] if args else kwargs.get("input")
    return input if isinstance(input, torch.Tensor) else None


def _layers_met(
    model: nn.Module, inputs: tuple, kwargs: dict | None
) -> list[tuple[nn.Module, Conv2dGw8Params, bool]]:
    """(module, params, nhwc) for each call of a spio-eligible convolution in one forward pass of
    model(*inputs, **kwargs), in order, without autograd; nhwc: the call's input was a contiguous
    channels_last tensor. PyTorch's convolution stands in for spio's layers (`_stand_in_calls`):
    listing a model's layers builds and launches no kernel. Buffers and the random-number state
    are restored afterwards."""
    met: list[tuple[nn.Module, Conv2dGw8Params, bool]] = []
    no_kernel_dtype = 0  # calls in fp32 outside autocast, or in float64

    def record(module: nn.Conv2d, input: torch.Tensor) -> None:
        nonlocal no_kernel_dtype
        fallback = module._ineligibility_now() if isinstance(module, Conv2dGw8) else None
        if fallback is not None:  # runs PyTorch's convolution, as its forward logs
            logger.debug("scan_modules skips a layer that %s", fallback)
            return
        dtype = _activation_dtype(input)
        if dtype is None:
            no_kernel_dtype += 1
            return
        params = _layer_params(module, input, dtype)
        if params is not None:
            met.append((module, params, input.is_contiguous(memory_format=torch.channels_last)))

    def before(module: nn.Conv2d, args: tuple, kwargs: dict) -> None:
        input = _call_input(args, kwargs)
        if input is not None:
            record(module, input)

    layers = [m for m in model.modules() if isinstance(m, Conv2dGw8)]
    convs = [m for m in model.modules() if not isinstance(m, Conv2dGw8) and Conv2dGw8.match(m)]
    handles = [m.register_forward_pre_hook(before, with_kwargs=True) for m in convs]
    try:
        _stand_in_calls(model, layers, inputs, kwargs, training=False, on_call=record)
    finally:
        for handle in handles:
            handle.remove()
    if no_kernel_dtype:
        logger.warning(
            "%d calls of spio-eligible convolutions got inputs no kernel takes (fp32 outside "
            "torch.autocast, or float64): spio's kernels take fp16 and bf16, so these run "
            "PyTorch's convolution and are not listed. Call under torch.autocast, as the model "
            "will run.",
            no_kernel_dtype,
        )
    return met


def _unwrapped(model: nn.Module, caller: str = "spio.precompile") -> nn.Module:
    """The module that a DistributedDataParallel wrapper, or a DataParallel one over one GPU,
    runs (through any nesting of them); model itself if it is neither. A DataParallel over
    several GPUs splits the batch, so its layers run other batch sizes than the inputs' (and
    its replicas are other modules): ValueError naming `caller`."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(model, nn.DataParallel):
            if len(model.device_ids) > 1:
                raise ValueError(
                    f"{caller}: DataParallel splits each batch over its "
                    f"{len(model.device_ids)} GPUs, and spio picks each layer's kernels per "
                    f"batch size; call {caller}(model.module, x_part) with one GPU's part of "
                    "the batch (what it finds serves every GPU of that architecture)"
                )
            model = model.module
        else:
            return model


def _forward_once(model: nn.Module, inputs: tuple, kwargs: dict | None, grad: bool) -> None:
    """model(*inputs, **kwargs) once, its output dropped, with autograd on only if `grad`, and
    eagerly where torch.compile would compile (a compiled model, or modules compiled in place,
    would otherwise trace the caller's hooks and recompile later). Afterwards every buffer (e.g.
    BatchNorm's running statistics) and torch's random-number state (e.g. what dropout drew)
    are as they were, and so are the buffers' autograd version counters: a graph of an earlier
    forward that saved a buffer (BatchNorm saves its running statistics) still runs its
    backward, as after a plain forward of the model."""
    # Each module's buffers by name: a forward may also set a new tensor in a buffer's place
    # (self.mean = 0.9 * self.mean + ...), which the old one is put back over.
    slots = [
        (module, name, buffer, buffer.detach().clone())
        for module in model.modules()
        for name, buffer in module._buffers.items()
        if buffer is not None
    ]
    buffers = list({id(b): b for _, _, b, _ in slots}.values())
    kwargs = kwargs or {}
    tensors = [*_tensors_in((inputs, kwargs)), *model.parameters()]  # (nested inputs too)
    gpus = sorted({t.device.index or 0 for t in tensors if t.is_cuda})
    with contextlib.ExitStack() as versions:
        # Version counters are set back on leaving, after the values (inference tensors keep
        # none): else a saved buffer's graph refuses its backward ("modified by an inplace
        # operation") although the values are the ones it saved.
        for buffer in buffers:
            if not buffer.is_inference():
                versions.enter_context(torch.autograd._unsafe_preserve_version_counter(buffer))
        try:
            with (
                torch.random.fork_rng(devices=gpus),
                torch.set_grad_enabled(grad),
                torch.compiler.set_stance("force_eager"),
            ):
                model(*inputs, **kwargs)
        finally:
            with torch.no_grad():
                for module, name, buffer, saved in slots:
                    module._buffers[name] = buffer
                    if not buffer.is_inference():  # an inference tensor cannot have changed
                        buffer.copy_(saved)


def precompile(
    model: nn.Module,
    *inputs: object,
    kwargs: dict | None = None,
    training: bool | None = None,
    double_backward: bool = False,
    progress: bool = True,
) -> list[Kernel]:
    """Build, in parallel and ahead of time, every spio kernel that model(*inputs, **kwargs)
    launches, and in training its backward pass too, so that their first calls only load them.

    Otherwise each layer builds its kernels one at a time at its first call: 0.14-0.29 s each
    with NVRTC (README's figures, one core of an AMD EPYC), and a layer in training launches
    three or four, so a model's first step can stall for a minute or more. This runs the model
    once with PyTorch's convolution standing in for spio's (with autograd on in training, to
    learn which gradients each layer will be asked for), picks each Conv2dGw8 call's kernels as
    that call will pick them, and builds them all at once (SPIO_WORKERS processes, or threads
    for emulator libraries, with a progress bar unless `progress` is False) into the disk cache:
    cubins for the inputs' GPU, emulator libraries for CPU tensors with SPIO_EMULATE=1.

    `kwargs`: keyword arguments of the model's call. `training`: whether to build the
    backward's kernels too (default: model.training). A layer that runs without autograd in
    training (e.g. inside a reentrant checkpoint, whose backward runs it again with autograd)
    gets DGrad and the WGrad its parameters ask for. `double_backward`: in training, also the
    kernels of a backward through the backward (backward(create_graph=True), e.g. a gradient
    penalty).

    Call it as the model will run: on its device, in its memory format, with each batch size
    it will see (a kernel takes the batch size at launch, but a layer's tile config, and so
    its kernel, is picked, and autotuned, per batch size; and a batch that the config's images
    per block do not divide has a build of its own: a smaller last batch is another call), and
    under torch.autocast if it trains under it. The forward runs eagerly even where the model
    or its modules are compiled; a DistributedDataParallel wrapper is looked through, and so is
    a DataParallel over one GPU (over several it splits the batch: ValueError; call it on
    model.module with one GPU's part of the batch). A model without Conv2dGw8 layers (not yet
    transformed) builds nothing, with a warning.
    Buffers and torch's random-number state are restored afterwards. With SPIO_AUTOTUNE=1 it
    tunes too: a first stand-in forward finds the layers not tuned yet, their candidate configs
    are built all at once, and then each layer's are timed on the GPU (a second progress bar).
    Returns the kernels; raises RuntimeError naming any kernel that failed to build.
    """
    _check_model(model, "precompile", kwargs)
    double_backward = as_flag("spio.precompile", "double_backward", double_backward)
    progress = as_flag("spio.precompile", "progress", progress)
    model = _unwrapped(model)
    if training is None:
        training = model.training
    else:
        training = as_flag("spio.precompile", "training", training, "True, False or None")
    layers = [m for m in model.modules() if isinstance(m, Conv2dGw8)]  # (each once)
    start = time.perf_counter()
    to_tune = _candidates_to_tune(
        model, layers, inputs, kwargs, training, double_backward, progress
    )
    found: dict[tuple[torch.device, str], Kernel] = {}
    timing = progress_bar(
        total=sum(to_tune),
        desc="timing the candidate configs of spio layers (SPIO_AUTOTUNE=1)",
        unit="layer pass",
        disable=not progress or not sum(to_tune),
    )

    why_not: Counter[str] = Counter()  # calls that launch no spio kernel, by why

    def choose(module: Conv2dGw8, input: torch.Tensor) -> None:
        kernels = module.spio_kernels(input, training, double_backward)
        if not kernels:
            why_not[module._why_no_kernels(input)] += 1
        for kernel in kernels:
            found.setdefault((input.device, kernel.name), kernel)
        if to_tune:  # the calls come in the same order: this one has tuned its passes
            timing.update(to_tune.pop(0))

    try:
        calls, strays = _stand_in_calls(model, layers, inputs, kwargs, training, choose)
    finally:
        timing.close()
    _warn_if_nothing_to_build(layers, calls, len(found), strays, why_not)
    failures: dict[str, str] = {}
    for device in dict.fromkeys(device for device, _ in found):
        kernels = [k for (d, _), k in found.items() if d == device]
        failures |= build_kernels(kernels, device, progress=progress)
    if failures:
        raise RuntimeError(
            f"spio.precompile: {len(failures)} of {len(found)} kernels failed to build:\n"
            + "\n".join(f"{name}: {error}" for name, error in failures.items())
        )
    logger.info(
        "spio.precompile: %d kernels for %d spio layer calls, ready in %.1f s",
        len(found),
        calls,
        time.perf_counter() - start,
    )
    return list(found.values())


def _candidates_to_tune(
    model: nn.Module,
    layers: list[Conv2dGw8],
    inputs: tuple,
    kwargs: dict | None,
    training: bool,
    double_backward: bool,
    progress: bool,
) -> list[int]:
    """precompile's first stand-in run, with SPIO_AUTOTUNE=1 and Conv2dGw8 layers: finds the
    layers' passes not tuned yet and builds their candidate configs' kernels (_build_candidates)
    for the timing run. Returns, per call, how many of its passes it leaves to tune (none
    without autotuning)."""
    to_tune: list[int] = []
    if not (layers and autotune.autotune_enabled()):
        return to_tune
    with autotune.collecting() as wanted:

        def collect(module: Conv2dGw8, input: torch.Tensor) -> None:
            known = len(wanted)
            module.spio_kernels(input, backward=training, double_backward=double_backward)
            to_tune.append(len(wanted) - known)

        _stand_in_calls(model, layers, inputs, kwargs, training, collect)
    _build_candidates(wanted, progress)
    return to_tune


def _warn_if_nothing_to_build(
    layers: list[Conv2dGw8], calls: int, kernels: int, strays: int, why_not: Counter[str]
) -> None:
    """precompile's warning, saying why, where it found no kernel to build among `calls` calls
    of `layers`: no Conv2dGw8 layers; none called (`strays`: calls of the nn.Conv2d they
    replaced, warned of already); or no call that runs spio's kernels (`why_not`: the calls by
    their reason, from Conv2dGw8._why_no_kernels)."""
    if not layers:
        logger.warning(
            "spio.precompile: the model has no Conv2dGw8 layers (spio.transform makes them); "
            "nothing to build"
        )
    elif not calls and strays:
        logger.warning(
            "spio.precompile: the model called none of its %d Conv2dGw8 layers, but %d times "
            "the nn.Conv2d they replaced (above); nothing was built",
            len(layers),
            strays,
        )
    elif not calls:
        logger.warning(
            "spio.precompile: the model called none of its %d Conv2dGw8 layers (a model "
            "traced by torch.fx or scripted calls spio's op without them); nothing was built",
            len(layers),
        )
    elif not kernels:
        reasons = "; ".join(f"{count} of {reason}" for reason, count in why_not.most_common())
        logger.warning(
            "spio.precompile: none of the %d Conv2dGw8 calls runs spio's kernels (calls by "
            "why: %s); nothing to build",
            calls,
            reasons,
        )


def _stand_in_calls(
    model: nn.Module,
    layers: list[Conv2dGw8],
    inputs: tuple,
    kwargs: dict | None,
    training: bool,
    on_call: Callable[[Conv2dGw8, torch.Tensor], object],
) -> tuple[int, int]:
    """Run model(*inputs, **kwargs) once (`_forward_once`, autograd on if `training`) with PyTorch's
    convolution standing in for spio's in `layers`, calling on_call(module, input) before each
    of their calls; returns how many there were, and how many calls went to the nn.Conv2d
    a layer replaced (warned of here). Only the calls of this thread, and of threads
    started during the run (the model's own, as nn.DataParallel's are), count and run PyTorch's
    convolution (pytorch_standing_in): the layers are not changed, and the calls of threads that
    were there before (an inference server's) run as ever, uncounted."""
    calls = 0
    strays = 0
    lock = threading.Lock()  # (the model's threads may call at once)
    with pytorch_standing_in(layers) as run:

        def before(module: Conv2dGw8, args: tuple, kwargs: dict) -> None:
            nonlocal calls, strays
            if threading.get_ident() in run.existing:  # another thread's call, not this run's
                return
            if id(module) not in run.ids:  # a module sharing a layer's hooks: the conv it replaced
                with lock:
                    strays += 1
                return
            input = _call_input(args, kwargs)
            if input is not None:
                with lock:
                    calls += 1
                    on_call(module, input)

        handles = [m.register_forward_pre_hook(before, with_kwargs=True) for m in layers]
        try:
            _forward_once(model, inputs, kwargs, grad=training)
        finally:
            for handle in handles:
                handle.remove()
    if strays:
        logger.warning(
            "%d calls of an nn.Conv2d that spio.transform replaced: the model reaches it other "
            "than through its submodules (a plain list or dict, say), so those calls run "
            "PyTorch's convolution; register the container as an nn.ModuleList or "
            "nn.ModuleDict before transforming",
            strays,
        )
    return calls, strays


def _build_candidates(wanted: autotune.Wanted, progress: bool) -> None:
    """Build the candidate configs' kernels of every layer to tune (SPIO_AUTOTUNE=1), all at
    once per device, for autotuning to time. A candidate that fails to build is only logged
    here: autotuning counts it as slowest and says why."""
    by_device: dict[object, list[Kernel]] = {}
    for family, device, kernels, unmade in wanted.values():
        for config, error in unmade.items():  # autotune reports it too, with its config
            logger.debug("spio.precompile: %s %s: %s", family.name, config.encode(), error)
        by_device.setdefault(device, []).extend(kernels)
    for device, kernels in by_device.items():
        for name, error in build_kernels(kernels, device, progress=progress).items():
            logger.debug("spio.precompile: candidate %s failed to build: %s", name, error)


#: A layer timer for where_faster: (params, pass, impl "spio" or "torch") -> seconds per call.
LayerTimer = Callable[[Conv2dGw8Params, str, str], float]


def where_faster(
    model: nn.Module,
    *inputs: object,
    kwargs: dict | None = None,
    training: bool = True,
    timer: LayerTimer | None = None,
) -> Callable[[str, nn.Conv2d], tuple[str, ...]]:
    """An `include` for transform that runs spio only for the passes it runs faster, by measurement.

    Runs model(*inputs, **kwargs) once (as scan_modules; under autocast if the model will run
    under it) to learn the layer each eligible convolution computes, then times every distinct
    layer on the inputs' GPU, in spio and in PyTorch: FProp, DGrad and WGrad each (FProp alone with
    `training=False`). The returned function gives, for each convolution, the passes whose spio
    time was at most PyTorch's (with `training=False`: all three if FProp was, else none); no
    pass for convolutions the forward pass did not reach, which then stay as they are, nor for
    those of another model (it knows modules by identity: time the model you will transform); a
    module called on several layers gets the passes spio won on all of them. It logs one line
    per layer (info level). Use:
    spio.transform(model, include=spio.transform.where_faster(model, x)).
    Both implementations are timed in channels_last, the layout spio's kernels read; a warning
    says so when the convolutions met other layouts. A batch too large for one launch is timed
    on a chunk of it, as spio runs it; a layer spio's kernels never run (one image too large)
    gets no pass. The random-number state is left as it was. `timer` replaces the GPU timing
    (tests); without one, ValueError unless the tensors among inputs and kwargs (in lists,
    tuples and dicts too) are on exactly one GPU. A DataParallel over several GPUs is refused
    (its replicas are other modules): time its `.module` on one GPU's part of the batch.
    """
    _check_model(model, "transform.where_faster", kwargs)
    training = as_flag("spio.transform.where_faster", "training", training)
    # Its replicas over several GPUs would be the modules met, not those transform replaces.
    model = _unwrapped(model, "spio.transform.where_faster")
    # The GPU first: inputs elsewhere are refused before the forward pass (whose fallback
    # warnings on CPU tensors would come first, and use up the once-only one).
    device = None if timer is not None else _cuda_device((inputs, kwargs))
    met = _layers_met(model, inputs, kwargs)
    layers = list(dict.fromkeys(params for _, params, _ in met))
    timed = PASSES if training else ("fprop",)
    cases = {params: _timed_layer(params) for params in layers}
    # Timing draws random inputs: the caller's random-number state is left as it was.
    gpus = [device.index] if device is not None and torch.cuda.is_available() else []
    rng = torch.random.fork_rng(devices=gpus)
    with rng:
        faster = _time_layers(cases, timed, training, timer, device)
    not_nhwc = sum(not nhwc for _, _, nhwc in met)
    if not_nhwc:
        logger.warning(
            "where_faster: %d of the %d convolution calls it met got inputs that are not "
            "contiguous channels_last tensors. It times both implementations in channels_last, "
            "the layout spio's kernels read; in another layout spio's layers copy their "
            "activations in and out on every call, which this timing leaves out. Convert the "
            "model and its inputs first: .to(memory_format=torch.channels_last).",
            not_nhwc,
            len(met),
        )
    chosen: dict[int, tuple[str, ...]] = {}
    for module, params, _ in met:  # a module called on several layers: the passes faster on all
        previous = chosen.get(id(module), PASSES)
        chosen[id(module)] = tuple(p for p in previous if p in faster[params])

    def include(name: str, conv: nn.Conv2d) -> tuple[str, ...]:
        return chosen.get(id(conv), ())

    return include


def _timed_layer(params: Conv2dGw8Params) -> Conv2dGw8Params | None:
    """The layer where_faster times for `params`: itself, or, where its batch passes what one
    launch takes, a chunk of it (spio runs such a batch in chunks of that many images, and
    both implementations are timed on one); None where spio's kernels never run it (one
    image's activations, or its weight gradient, pass what a launch takes: PyTorch runs it)."""
    if too_large_to_launch(params):
        return None
    chunk = images_per_launch(params)
    return params if params.n <= chunk else dataclasses.replace(params, n=chunk)


def _time_layers(
    cases: dict[Conv2dGw8Params, Conv2dGw8Params | None],
    timed: tuple[str, ...],
    training: bool,
    timer: LayerTimer | None,
    device: torch.device | None,
) -> dict[Conv2dGw8Params, tuple[str, ...]]:
    """where_faster's timing: for each layer (and the layer timed for it, _timed_layer), the
    passes spio runs, logged a line a layer."""
    if timer is None:
        assert device is not None  # (where_faster found it)
        timer = _gpu_layer_timer(device)
        _compile_for_timing(
            [(case, p) for case in dict.fromkeys(cases.values()) if case for p in timed], device
        )
    faster: dict[Conv2dGw8Params, tuple[str, ...]] = {}
    for params, case in cases.items():
        if case is None:
            faster[params] = ()
            logger.info(
                "where_faster: %s: too large for spio's kernels (PyTorch runs it); spio runs "
                "nothing (PyTorch's layer)",
                params.encode(),
            )
            continue
        times = {p: (timer(case, p, "spio"), timer(case, p, "torch")) for p in timed}
        won = tuple(p for p, (spio_s, torch_s) in times.items() if spio_s <= torch_s)
        faster[params] = won if training else (PASSES if won else ())
        logger.info(
            "where_faster: %s: %s%s; spio runs %s",
            params.encode(),
            ", ".join(
                f"{p} spio {s * 1e6:.1f} us / PyTorch {t * 1e6:.1f} us"
                for p, (s, t) in times.items()
            ),
            "" if case == params else f" (timed on a chunk of {case.n} images, as spio runs it)",
            "+".join(faster[params]) or "nothing (PyTorch's layer)",
        )
    return faster


def _tensors_in(value: object) -> Iterator[torch.Tensor]:
    """The tensors in `value`, and in the lists, tuples and dicts in it, at any depth."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def _cuda_device(inputs: object) -> torch.device:
    """The one GPU the tensors in `inputs` (nested in lists, tuples and dicts too) are on."""
    devices = {t.device for t in _tensors_in(inputs)}
    cuda = [d for d in devices if d.type == "cuda"]
    if len(cuda) != 1:  # none, or several: which one's times would decide is not for spio to pick
        raise ValueError(
            "where_faster times layers on the one GPU the inputs are on; got inputs on "
            f"{', '.join(sorted(str(d) for d in devices)) or 'no tensor'}"
        )
    return cuda[0]


def _compile_for_timing(cases: list[tuple[Conv2dGw8Params, str]], device: torch.device) -> None:
    """Compile spio's kernels of the (layer, pass) cases to time, in parallel, before timing
    them one by one; a kernel that fails to compile fails its timing, with NVRTC's log."""
    from spio.bench.run import precompile as compile_cases

    for name, error in compile_cases(cases, device).items():
        logger.warning("where_faster: %s: %s", name, error)


def _gpu_layer_timer(device: torch.device) -> LayerTimer:
    """Times a pass as `spio bench` does (spio.bench.run.PassCase: rotated inputs, CUDA events),
    median of 20 calls; a layer's inputs for each pass are made once, for both implementations."""
    from spio.bench.run import PassCase
    from spio.bench.timing import l2_cache_bytes, time_calls

    l2 = l2_cache_bytes(device.index or 0)
    cases: dict[tuple, PassCase] = {}  # one layer's passes at a time: both impls time each

    def timer(params: Conv2dGw8Params, pass_: str, impl: str) -> float:
        key = (params, pass_)
        if key not in cases:
            if any(layer != params for layer, _ in cases):
                cases.clear()
            cases[key] = PassCase(params, pass_, l2, device=device)
        case = cases[key]
        call = case.spio_call() if impl == "spio" else case.torch_call()
        with torch.cuda.device(device):
            return time_calls(call, warmup=3, reps=20).median_ms * 1e-3

    return timer
