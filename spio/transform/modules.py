"""Replace eligible nn.Conv2d modules by Conv2dGw8, and list the layer params a model meets.

Both walk the module tree instead of tracing, so they work on models FX cannot trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch import nn

from spio.kernels.conv2d_gw8_params import Conv2dGw8Params, dtype_name
from spio.layers.conv2d_gw8 import Conv2dGw8, module_ineligibility, resolve_padding
from spio.log import logger


def transform(
    model: nn.Module, include: Callable[[str, nn.Conv2d], bool] | None = None
) -> nn.Module:
    """Replace, in place, every eligible nn.Conv2d of model by a Conv2dGw8 sharing its Parameters.

    Eligible: exactly nn.Conv2d (subclasses are left alone), group width 8, C == K, stride 1,
    dilation 1, kernel 1..5, zeros padding that is symmetric. `include(name, conv)`, if given,
    is asked about each eligible convolution (`name` as in model.named_modules()) and keeps those
    it returns False for as they are: for instance a network's last stages, whose 7x7 and 8x8
    layers still run faster in cuDNN (docs/perf/). A module reachable by several paths is decided
    once, by its first name, and stays shared. Returns model (or its replacement if model itself
    is an eligible convolution).
    """
    if Conv2dGw8.match(model):
        if include is not None and not include("", model):
            logger.info("spio.transform replaced 0 of 1 nn.Conv2d modules (1 excluded)")
            return model
        logger.info("spio.transform replaced 1 of 1 nn.Conv2d modules")
        return Conv2dGw8.from_torch_module(model)
    names = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    replacements: dict[int, nn.Conv2d] = {}
    skipped: Counter[str] = Counter()
    excluded = 0
    for parent in list(model.modules()):
        prefix = names.get(id(parent), "")
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) not in replacements:
                if not isinstance(child, nn.Conv2d) or isinstance(child, Conv2dGw8):
                    continue
                reason = module_ineligibility(child)
                if reason is not None:
                    skipped[reason] += 1
                    continue
                if include is not None and not include(
                    f"{prefix}.{name}" if prefix else name, child
                ):
                    replacements[id(child)] = child  # kept as it is, wherever it appears
                    excluded += 1
                    continue
                replacements[id(child)] = Conv2dGw8.from_torch_module(child)
            parent._modules[name] = replacements[id(child)]
    replaced = len(replacements) - excluded
    total = len(replacements) + sum(skipped.values())
    note = f" ({excluded} excluded)" if excluded else ""
    logger.info("spio.transform replaced %d of %d nn.Conv2d modules%s", replaced, total, note)
    for reason, count in skipped.most_common():
        logger.debug("spio.transform kept %d nn.Conv2d: %s", count, reason)
    return model


def _activation_dtype(x: torch.Tensor) -> str:
    """The dtype a kernel would see for input x: its own, or autocast's, else fp16."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return dtype_name(x.dtype)
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        autocast_dtype = torch.get_autocast_dtype(device_type)
        if autocast_dtype in (torch.float16, torch.bfloat16):
            return dtype_name(autocast_dtype)
    return "fp16"


def _layer_params(module: nn.Conv2d, x: torch.Tensor) -> Conv2dGw8Params | None:
    if x.dim() == 3:
        x = x.unsqueeze(0)
    padding = resolve_padding(module.padding, module.kernel_size, module.dilation)
    if x.dim() != 4 or padding is None:
        return None
    n, c, h, w = x.shape
    r, s = module.kernel_size
    try:
        return Conv2dGw8Params(
            n, c, h, w, padding, r, s, module.bias is not None, _activation_dtype(x)
        )
    except ValueError as error:
        logger.debug("scan_modules skips a layer: %s", error)
        return None


def scan_modules(model: nn.Module, *inputs: object) -> list[Conv2dGw8Params]:
    """Run model(*inputs) once and return the distinct Conv2dGw8Params its spio layers meet.

    Counts Conv2dGw8 modules and nn.Conv2d modules that transform would replace, in the order
    first met. The pass runs without autograd, and every buffer (e.g. BatchNorm running
    statistics) is restored afterwards, so the model is left unchanged.
    """
    found: list[Conv2dGw8Params] = []

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        if args and isinstance(args[0], torch.Tensor):
            params = _layer_params(module, args[0])
            if params is not None and params not in found:
                found.append(params)

    modules = [m for m in model.modules() if isinstance(m, Conv2dGw8) or Conv2dGw8.match(m)]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
    return found
