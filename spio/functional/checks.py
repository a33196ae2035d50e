"""Argument checks shared by the conv2d_gw8 custom ops and the eager path, and where work runs.

Each check raises ValueError naming the violated constraint and the value (TypeError for a
non-tensor where a tensor belongs); they work on fake (symbolic) tensors too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor

from spio import emulator
from spio.kernels.conv2d_gw8_params import (
    GROUP_WIDTH,
    MAX_FILTER,
    MIN_FILTER,
    check_tensor_arguments,
)

#: The largest padding taken: PyTorch's convolution's own limit (a larger one it refuses, or,
#: past int64, fails on with internal errors), where spio's layers and calls fall back to it.
MAX_PADDING = 2**62 - 1

#: The dtypes spio's kernels take (activations and weights).
KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def emulate_enabled() -> bool:
    """True when SPIO_EMULATE asks CPU tensors to go through the kernels in the emulator."""
    return emulator.is_enabled()


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype of the autocast region on `device_type`, or None outside one and on devices
    autocast does not know (e.g. "meta", where torch.is_autocast_enabled raises)."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
    except RuntimeError:
        return None
    return torch.get_autocast_dtype(device_type)


def cast_for_autocast(
    input: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The operands as spio's op takes them in an autocast region of `dtype`: input and weight
    cast to `dtype` in their own layouts, bias to fp32 (one rule for eager calls and the op, so
    that both launch the same kernels, those spio.precompile builds). A channels_last model's
    weight stays channels_last, as autocast leaves it for aten's convolution: its cast is a plain
    one, the kernels read it as held, and its gradient comes back in its layout, which autograd
    keeps as the parameter's (a contiguous cast cost a layout-changing copy each way a step,
    H200 runs 7 and 8: docs/perf/2026-12-04-h200.md). As autocast
    leaves them for aten's convolution, tensors that are not floating point and float64 tensors
    stay as they are, for the op's checks to name. (Autocast also leaves tensors on other
    devices alone; casting one changes nothing seen: `to` does not move it, and the op refuses
    tensors on different devices before it looks at dtypes.)
    The one cast rule of the op's autocast kernels and the eager path."""
    return (
        _autocast(input, dtype, torch.preserve_format),
        _autocast(weight, dtype, torch.preserve_format),
        _autocast(bias, torch.float32, torch.preserve_format),
    )


def autocast_operands(
    input: Tensor, weight: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The operands as the kernels get them: inside an autocast region, cast as the custom op
    casts them (cast_for_autocast); outside one, as they are."""
    dtype = autocast_dtype(input.device.type)
    if dtype is None:
        return input, weight, bias
    return cast_for_autocast(input, weight, bias, dtype)


@overload
def _autocast(t: Tensor, dtype: torch.dtype, fmt: torch.memory_format) -> Tensor: ...
@overload
def _autocast(t: None, dtype: torch.dtype, fmt: torch.memory_format) -> None: ...
def _autocast(t: Tensor | None, dtype: torch.dtype, fmt: torch.memory_format) -> Tensor | None:
    if t is None or not t.is_floating_point() or t.dtype == torch.float64:
        return t
    return t.to(dtype=dtype, memory_format=fmt)


def functorch_transform_active() -> bool:
    """True inside torch.vmap (or another torch.func transform), whose batched tensors only the
    custom op's registrations handle."""
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def derivative_transform(*tensors: Tensor | None, traced: bool = False) -> str | None:
    """The forward-mode or functional differentiation under way that spio's op cannot run in,
    or None: torch.func.grad/jvp (and friends) anywhere on the transform stack, or tensors with a
    forward-mode tangent (torch.autograd.forward_ad, or torch.func.jvp's, seen at the op's
    autograd kernel). PyTorch runs a custom op's autograd formula in neither, and spio has no
    forward-mode formula. Under torch.compile asked only where `traced`: at the op's autograd
    kernel, which runs in the trace's fake-tensor calls, not in code Dynamo traces (it cannot
    trace the functorch stack's query, and a layer's forward under it cannot fall back)."""
    if torch.compiler.is_compiling() and not traced:
        return None
    if functorch_transform_active():
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        for interpreter in retrieve_all_functorch_interpreters():
            if interpreter.key() in (TransformType.Grad, TransformType.Jvp):
                return f"inside torch.func's {interpreter.key().name.lower()} transform"
    if has_forward_tangent(*tensors):
        return "forward-mode AD (a tensor has a tangent)"
    return None


def has_forward_tangent(*tensors: Tensor | None) -> bool:
    """True when a tensor carries a forward-mode AD tangent (torch.autograd.forward_ad): the
    one part of derivative_transform left to ask once eager_path_applies has answered."""
    return forward_ad._current_level >= 0 and any(
        t is not None and forward_ad.unpack_dual(t).tangent is not None for t in tensors
    )


def gradients_wanted(ctx: Any) -> list[bool]:
    """Which of (input, weight, bias) a backward computes gradients for: those that need one
    (ctx.needs_input_grad, the forward's first three arguments) and that the running backward
    uses. torch.autograd.grad(loss, x) runs only the nodes on the way to x, so a weight's
    gradient is then not wanted (PyTorch's convolution leaves it out of its output_mask too): a
    saliency map, an adversarial step, a gradient penalty's first gradient run no WGrad. The
    engine is asked through its private _will_engine_execute_node; it raises for a leaf that
    autograd.grad captures (wanted), and outside the engine (traced: wanted)."""
    needs = [bool(m) for m in (*ctx.needs_input_grad, False, False)[:3]]
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    if will_execute is None:
        return needs
    # One edge per tensor argument, in order: input and weight first, then a bias if given.
    for i, (node, _) in enumerate(ctx.next_functions[:3]):
        if needs[i] and node is not None:
            try:
                needs[i] = bool(will_execute(node))
            except RuntimeError:
                pass
    return needs


def uses_kernels(device: torch.device) -> bool:
    """True when tensors on `device` run spio's kernels rather than PyTorch's convolution."""
    return device.type == "cuda" or (device.type == "cpu" and emulate_enabled())


#: device_problem's answers, by CUDA device index (a GPU's arch does not change).
_gpu_problems: dict[int, str | None] = {}


def device_problem(device: torch.device) -> str | None:
    """Why spio's kernels cannot run on `device`, or None: a GPU whose architecture spio does
    not build for (e.g. a Turing or Volta GPU, sm_75 or sm_70: the kernels need sm_80's
    cp.async), or one the NVRTC found cannot compile for (an sm_100 or sm_120 GPU, NVRTC before
    12.8). Asked on every Conv2dGw8 call: an answer is kept per device."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _gpu_problems:
        from spio import experimental_arch, supported_arch
        from spio.compiler.arch import arch_of, builds_for

        arch = arch_of(torch.cuda.get_device_capability(index))
        problem: str | None
        if not builds_for(arch):
            problem = (
                f"cuda:{index} ({torch.cuda.get_device_name(index)}) is {arch}, not one of "
                f"{', '.join(supported_arch)} (or the untested {', '.join(experimental_arch)})"
            )
        else:
            problem = _nvrtc_lacks(arch, index)
        _gpu_problems[index] = problem
    return _gpu_problems[index]


def _nvrtc_lacks(arch: str, index: int) -> str | None:
    """Why the NVRTC found cannot build for cuda:`index`, of `arch`, or None (also where no
    NVRTC loads: the first compile says so, with where spio looked)."""
    from spio.cuda import nvrtc

    try:
        problem = nvrtc.archs_lacking([arch])
    except (OSError, RuntimeError):  # CudaNotFoundError, NvrtcError
        return None
    return f"cuda:{index} ({torch.cuda.get_device_name(index)}): {problem}" if problem else None


# Under torch.compile Dynamo calls it while tracing and keeps the answer, as for
# torch.compiler.assume_constant_result (see spio.layers.conv2d_gw8._log_fallback_once).
device_problem._dynamo_marked_constant = True  # type: ignore[attr-defined]


def check_tensors(input: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """Raise TypeError naming the argument that is not a tensor (bias may be None)."""
    if isinstance(input, Tensor) and isinstance(weight, Tensor):  # every call: kept cheap
        if bias is None or isinstance(bias, Tensor):
            return
    check_tensor_arguments("conv2d_gw8", ("bias",), input=input, weight=weight, bias=bias)


def _shown(value: Any) -> Any:
    """A size (or a shape, as a tuple) as an error message shows it: under torch.compile with
    dynamic shapes a size is a symbol (s6), whose value this call has; the message names the
    value (asking it specializes the graph to it, harmless on the way to an error)."""
    if isinstance(value, (tuple, torch.Size)):
        return tuple(_shown(v) for v in value)
    return int(value) if isinstance(value, torch.SymInt) else value


def check_args(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: int,
    padding_y: int,
    padding_x: int,
    dilation: int,
    groups: int,
    kernel_dtype: bool = True,
) -> None:
    """Raise ValueError naming the violated constraint; works on fake (symbolic) tensors too.
    Arguments that are not tensors where tensors belong raise TypeError. `kernel_dtype`: also
    that tensors on a device running spio's kernels are fp16 or bf16 (the op's fake impl leaves
    that to the call: see _conv2d_gw8_fake)."""
    check_tensors(input, weight, bias)
    if stride != 1:
        raise ValueError(f"conv2d_gw8 needs stride 1, got {stride}")
    if dilation != 1:
        raise ValueError(f"conv2d_gw8 needs dilation 1, got {dilation}")
    if input.dim() != 4:
        raise ValueError(f"conv2d_gw8 needs a 4-D NCHW input, got {input.dim()}-D")
    if weight.dim() != 4:
        raise ValueError(f"conv2d_gw8 needs a 4-D weight (K, 8, R, S), got {weight.dim()}-D")
    tensors = {"input": input, "weight": weight} | ({} if bias is None else {"bias": bias})
    for name, t in tensors.items():
        if not t.is_floating_point():
            raise ValueError(f"conv2d_gw8 needs floating-point tensors, got {name} of {t.dtype}")
        if t.device != input.device:
            raise ValueError(
                f"conv2d_gw8 needs all tensors on one device, got input on {input.device} "
                f"and {name} on {t.device}"
            )
    c, k = input.shape[1], weight.shape[0]
    group_width, r, s = weight.shape[1], weight.shape[2], weight.shape[3]
    if group_width != GROUP_WIDTH:
        raise ValueError(f"conv2d_gw8 needs group width 8, got {_shown(group_width)}")
    if c % GROUP_WIDTH or c < GROUP_WIDTH:
        raise ValueError(f"conv2d_gw8 needs channels a positive multiple of 8, got {_shown(c)}")
    if groups != 1 and k == groups * GROUP_WIDTH and c != k:  # a layer met the wrong input
        raise ValueError(
            f"conv2d_gw8 with weight of shape {_shown(weight.shape)} and groups={groups} needs an "
            f"input of {groups * GROUP_WIDTH} channels, got input of shape {_shown(input.shape)}"
        )
    if k != c:
        raise ValueError(
            f"conv2d_gw8 needs as many output as input channels, got C={_shown(c)} "
            f"(input.shape[1]) and K={_shown(k)} (weight.shape[0])"
        )
    if groups != 1 and groups != c // GROUP_WIDTH:
        raise ValueError(
            f"conv2d_gw8 needs groups = C / 8 = {_shown(c // GROUP_WIDTH)} (or 1, implied by the "
            f"weight), got {groups}"
        )
    for name, value in (("R", r), ("S", s)):
        if not MIN_FILTER <= value <= MAX_FILTER:
            raise ValueError(
                f"conv2d_gw8 needs filter {name} in {MIN_FILTER}..{MAX_FILTER}, got {_shown(value)}"
            )
    if padding_y < 0 or padding_x < 0:
        raise ValueError(f"conv2d_gw8 needs non-negative padding, got ({padding_y}, {padding_x})")
    if padding_y > MAX_PADDING or padding_x > MAX_PADDING:
        raise ValueError(
            f"conv2d_gw8 needs padding at most {MAX_PADDING}, got ({padding_y}, {padding_x})"
        )
    if input.shape[2] < 1 or input.shape[3] < 1:
        h, w = _shown(input.shape[2:])
        raise ValueError(f"conv2d_gw8 needs an input image of at least 1x1, got {h}x{w}")
    p = input.shape[2] + 2 * padding_y - r + 1
    q = input.shape[3] + 2 * padding_x - s + 1
    if p <= 0 or q <= 0:
        p, q, h, w, r, s = _shown((p, q, *input.shape[2:], r, s))
        raise ValueError(
            f"conv2d_gw8 needs a non-empty output, got output size {p}x{q} for input {h}x{w}, "
            f"filter {r}x{s}, padding ({padding_y}, {padding_x})"
        )
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != k:
            raise ValueError(
                f"conv2d_gw8 needs a bias of shape ({_shown(k)},), got {_shown(bias.shape)}"
            )
        if bias.dtype not in (input.dtype, torch.float32):
            raise ValueError(
                f"conv2d_gw8 needs bias in fp32 or the input dtype {input.dtype}, got {bias.dtype}"
            )
    if weight.dtype != input.dtype:
        raise ValueError(
            f"conv2d_gw8 needs weight dtype equal to input dtype {input.dtype}, got {weight.dtype}"
        )
    if kernel_dtype and uses_kernels(input.device) and input.dtype not in KERNEL_DTYPES:
        device = input.device.type
        raise kernel_dtype_error(device, input.dtype, torch.is_autocast_enabled(device))


def kernel_dtype_error(device_type: str, dtype: torch.dtype, in_autocast: bool) -> ValueError:
    """The error for operands of `dtype` (neither fp16 nor bf16) where the kernels run, with a
    hint that fits: autocast casts fp32 operands of the forward, never float64 ones, and none of
    the backward op's (fp32 in an autocast region, `in_autocast`, reached an op it leaves)."""
    if dtype == torch.float64:
        hint = "torch.autocast leaves float64 tensors as they are: cast them"
    elif in_autocast:
        hint = "torch.autocast does not cast this op's operands: cast them"
    else:
        hint = "or torch.autocast"
    return ValueError(
        f"conv2d_gw8 on {device_type} needs fp16 or bf16 tensors ({hint}), got {dtype}"
    )


def memory_format(t: Tensor) -> torch.memory_format:
    """The memory format PyTorch's suggest_memory_format reads from t's strides: channels_last
    when t is stored NHWC or is a view with NHWC's stride order (a crop of an NHWC tensor), else
    contiguous. A tensor with no elements (an empty batch) is contiguous in every format: it
    counts as channels_last when its channel stride is below its column stride."""
    shape = t.shape
    if len(shape) != 4:
        return torch.contiguous_format
    nhwc = _nhwc_stride_order(shape, t.stride())
    return torch.channels_last if nhwc else torch.contiguous_format


def weight_grad_channels_last(weight: Tensor) -> bool:
    """Whether spio's WGrad should give dw channels_last: when `weight` is laid out so
    (memory_format, the op's rule: a 1x1 filter's channels_last weight is contiguous too, but has
    NHWC's strides). Autograd lays a gradient out as its parameter is (in a channels_last model,
    a copy kernel and an allocation a layer a step), or adds one laid out otherwise into .grad
    more slowly."""
    return memory_format(weight) is torch.channels_last


def fresh_strides(shape: tuple[int, ...], fmt: torch.memory_format) -> tuple[int, ...]:
    """The strides torch.empty(shape, memory_format=fmt) gives a 4-D tensor (NCHW or NHWC)."""
    n, c, h, w = shape
    if fmt == torch.channels_last:
        return (h * w * c, 1, w * c, c)
    return (c * h * w, h * w, w, 1)


def in_format(t: Tensor, fmt: torch.memory_format) -> Tensor:
    """t with exactly the strides of a fresh tensor in fmt (the fake impls promise those; for
    1x1 images NHWC's strides would pass is_contiguous too, but PyTorch's convolution gives
    these)."""
    if t.stride() == fresh_strides(tuple(t.shape), fmt):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device, memory_format=fmt).copy_(t)


def conv_format(input: Tensor, weight: Tensor) -> torch.memory_format:
    """The memory format PyTorch's convolution gives its output and input gradient (cuDNN's rule
    and its CPU backends'): channels_last when the input or the weight is laid out NHWC, else
    contiguous; for an empty batch, the input's alone."""
    shape = input.shape  # (each call to shape or stride() costs ~0.1-0.2 us: once each)
    if len(shape) == 4 and _nhwc_stride_order(shape, input.stride()):
        return torch.channels_last
    return torch.contiguous_format if 0 in shape else memory_format(weight)


def _nhwc_stride_order(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a 4-D view's strides rise in NHWC's order (C, W, H, N), each at least the span of
    the dims before it, as PyTorch's suggest_memory_format asks; a channel stride of 0 or an
    N stride equal to the channels' (the N11W case) does not count. With no elements: whether
    the channel stride is below the column stride. (Plain tuples: this runs on every call.)"""
    n, c, h, w = shape
    sn, sc, sh, sw = stride
    if not (n and c and h and w):
        return c > 1 and sc < sw
    if sc == 0 or sw < (sc * c if c > 1 else sc):
        return False
    least = sw * w if w > 1 else sw
    if sh < least:
        return False
    least = sh * h if h > 1 else sh
    return sn >= least and least != sc
