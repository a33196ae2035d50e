"""torch.library custom ops for the group-width-8 convolution: forward, backward, fake, autocast.

`spio::conv2d_gw8` computes F.conv2d(input, weight, bias, padding=(padding_y, padding_x),
groups=C // 8) for NCHW-shaped tensors with group width 8 and C == K. Gradients come from
`spio::conv2d_gw8_backward`, which computes only the gradients its output mask asks for, and
whose own gradients (double backward) come from the two ops again (`_double_backward`).

Where the work runs: CUDA tensors (and CPU tensors when SPIO_EMULATE=1) go to spio's kernels
through `spio.functional._kernels`, each pass unless `passes` (bits fprop=1, dgrad=2, wgrad=4;
default all) leaves it to PyTorch; other CPU tensors use PyTorch's convolution in the input's
dtype, so a transformed model runs anywhere.

Autocast: a custom rule (not torch.library.register_autocast, which casts every floating tensor,
bias included, to one fixed dtype) casts input and weight to the autocast dtype of the region,
fp16 or bf16 (each in its own layout), and the bias to fp32, which is what the kernels take: one
rule, `checks.cast_for_autocast`, which the eager path applies too.
"""

from __future__ import annotations

from typing import List  # noqa: UP035

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from spio.kernels.conv2d_gw8_params import check_tensor_arguments

from . import _kernels
from ._kernels import ALL_PASSES, check_passes
from .checks import (
    cast_for_autocast,
    check_args,
    check_tensors,
    conv_format,
    derivative_transform,
    emulate_enabled,
    fresh_strides,  # noqa: F401 (as it was: tests import it from here)
    gradients_wanted,
    in_format,
    kernel_dtype_error,
    memory_format,
    uses_kernels,
)

__all__ = [
    "check_args",
    "conv2d_gw8",
    "conv2d_gw8_backward",
    "emulate_enabled",
    "memory_format",
    "uses_kernels",
]


def _empty(shape, like: Tensor, fmt: torch.memory_format, dtype=None) -> Tensor:
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device, memory_format=fmt)


def _grad_dtype(grad_output: Tensor) -> torch.dtype:
    """Weight and bias gradients are fp32 (float64 for float64 inputs)."""
    return torch.promote_types(grad_output.dtype, torch.float32)


@torch.library.custom_op("spio::conv2d_gw8", mutates_args=())
def conv2d_gw8(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int = 1,
    padding_y: int = 0,
    padding_x: int = 0,
    dilation: int = 1,
    groups: int = 1,
    passes: int = ALL_PASSES,
) -> Tensor:
    """The custom op spio::conv2d_gw8 behind spio.functional.conv2d_gw8 (spio.functional.eager),
    whose docstring says what the arguments mean; that function calls it wherever something must
    see the op, and skips its dispatch elsewhere."""
    check_passes(passes)
    check_tensors(input, weight, bias)
    fmt = conv_format(input, weight)
    if uses_kernels(input.device):  # validated once per call signature, with its kernels
        layer = _kernels.layer(input, weight, bias, padding_y, padding_x, stride, dilation, groups)
        out = layer.forward(input, weight, bias, passes)
    else:
        check_args(input, weight, bias, stride, padding_y, padding_x, dilation, groups)
        out = _kernels.torch_fprop(input, weight, bias, (padding_y, padding_x))
    return in_format(out, fmt)


@conv2d_gw8.register_fake
def _conv2d_gw8_fake(input, weight, bias=None, stride=1, padding_y=0, padding_x=0, dilation=1,
                     groups=1, passes=ALL_PASSES):  # fmt: skip
    check_passes(passes)
    # fp32 operands are not refused here: strict torch.export traces an autocast region without
    # applying it (its graph applies it when run, and the op's autocast kernel casts them then).
    # A call that runs with them still raises, in the op.
    check_args(input, weight, bias, stride, padding_y, padding_x, dilation, groups,
               kernel_dtype=False)  # fmt: skip
    n, c, h, w = input.shape
    r, s = weight.shape[2], weight.shape[3]
    shape = (n, c, h + 2 * padding_y - r + 1, w + 2 * padding_x - s + 1)
    return _empty(shape, input, conv_format(input, weight))


@torch.library.custom_op("spio::conv2d_gw8_backward", mutates_args=())
def conv2d_gw8_backward(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    padding_y: int,
    padding_x: int,
    output_mask: List[bool],  # noqa: UP006 (torch 2.6's infer_schema refuses list[bool])
    passes: int = ALL_PASSES,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_input, grad_weight, grad_bias) of conv2d_gw8, computing only where output_mask is True.

    A gradient not asked for is returned as an empty tensor. grad_input has the input's dtype,
    channels_last where the input or the weight is (as F.conv2d's); grad_weight (the weight's
    memory format) and grad_bias are fp32 (float64 for
    float64 inputs): the caller casts them to the parameters' dtypes. `passes` as for conv2d_gw8
    (its dgrad and wgrad bits).
    """
    _check_backward_tensors(grad_output, input, weight)
    check_passes(passes)
    layer = None
    if uses_kernels(input.device):  # input and weight validated once per call signature
        layer = _kernels.layer(input, weight, None, padding_y, padding_x)
    _check_backward_args(grad_output, input, weight, padding_y, padding_x, output_mask, layer)
    need_input, need_weight, need_bias = output_mask
    grad_dtype = _grad_dtype(grad_output)
    if layer is not None:
        mask = (need_input, need_weight, need_bias)  # output_mask's 3 bools, as a tuple
        dx, dw, db = layer.backward(grad_output, input, weight, mask, passes)
    else:
        dx, dw = _kernels.torch_grads(
            grad_output, input, weight, (padding_y, padding_x), need_input, need_weight
        )
        db = grad_output.sum(dim=(0, 2, 3), dtype=grad_dtype) if need_bias else None
    # Both paths above computed each gradient output_mask asks for.
    empty = (0,)  # an unrequested gradient: an empty placeholder
    if need_input:
        assert dx is not None
        dx = in_format(dx.to(input.dtype), conv_format(input, weight))
    else:
        dx = input.new_empty(empty)
    if need_weight:
        assert dw is not None
        dw = in_format(dw.to(grad_dtype), memory_format(weight))
    else:
        dw = input.new_empty(empty, dtype=grad_dtype)
    if need_bias:
        assert db is not None
    else:
        db = input.new_empty(empty, dtype=grad_dtype)
    return dx, dw, db


def _documented(op) -> None:
    """Show the op function's docstring and signature on its CustomOpDef, whose own are
    torch's generic ones: help(spio.functional.conv2d_gw8_backward) and IDEs then read them."""
    import inspect

    op.__doc__ = op._init_fn.__doc__
    op.__signature__ = inspect.signature(op._init_fn)


_documented(conv2d_gw8)
_documented(conv2d_gw8_backward)


def _check_backward_tensors(grad_output, input, weight) -> None:
    """TypeError naming the backward's tensor argument that is not a tensor (its schema lets
    None through)."""
    check_tensor_arguments(
        "conv2d_gw8_backward", grad_output=grad_output, input=input, weight=weight
    )


def _check_backward_args(
    grad_output, input, weight, padding_y, padding_x, output_mask, layer=None
) -> None:
    """Raise ValueError on bad backward arguments; `layer`: input and weight already validated."""
    if len(output_mask) != 3:
        raise ValueError(f"conv2d_gw8_backward needs an output mask of 3 bools, got {output_mask}")
    if layer is None:
        check_args(input, weight, None, 1, padding_y, padding_x, 1, 1)
        r, s = weight.shape[2], weight.shape[3]
        n, c, h, w = input.shape
        expected = (n, c, h + 2 * padding_y - r + 1, w + 2 * padding_x - s + 1)
    else:  # (the batch size from input: an empty batch's layer has params for one image)
        expected = (input.shape[0], *layer.params.output_shape[1:])
    if tuple(grad_output.shape) != expected:
        raise ValueError(
            f"conv2d_gw8_backward needs grad_output of shape {expected}, "
            f"got {tuple(grad_output.shape)}"
        )
    if grad_output.dtype != input.dtype or grad_output.device != input.device:
        raise ValueError(
            f"conv2d_gw8_backward needs grad_output of {input.dtype} on {input.device}, "
            f"got {grad_output.dtype} on {grad_output.device}"
        )


@conv2d_gw8_backward.register_fake
def _conv2d_gw8_backward_fake(grad_output, input, weight, padding_y, padding_x, output_mask,
                              passes=ALL_PASSES):  # fmt: skip
    _check_backward_tensors(grad_output, input, weight)
    check_passes(passes)
    _check_backward_args(grad_output, input, weight, padding_y, padding_x, output_mask)
    need_input, need_weight, need_bias = output_mask
    grad_dtype = _grad_dtype(grad_output)
    contiguous = torch.contiguous_format
    none = (0,)  # an unrequested gradient: an empty, contiguous placeholder
    return (
        _empty(input.shape, input, conv_format(input, weight))
        if need_input
        else _empty(none, input, contiguous),
        _empty(weight.shape, weight, memory_format(weight), grad_dtype)
        if need_weight
        else _empty(none, weight, contiguous, grad_dtype),
        _empty((weight.shape[0],), weight, contiguous, grad_dtype)
        if need_bias
        else _empty(none, weight, contiguous, grad_dtype),
    )


def _meta_slice(t: Tensor | None, dim: int | None) -> Tensor | None:
    """A meta tensor laid out as one slice of t under torch.vmap (t without its vmapped
    dimension `dim`): for the fake implementations' checks and layouts where vmap has no slice."""
    if t is None:
        return None
    keep = [i for i in range(t.dim()) if dim is None or i != dim % t.dim()]
    return torch.empty_strided([t.shape[i] for i in keep], [t.stride(i) for i in keep],
                               dtype=t.dtype, device="meta")  # fmt: skip


def _slice(t: Tensor | None, dim: int | None, i: int) -> Tensor | None:
    """Slice i of t under torch.vmap (t itself where it is not batched, dim None)."""
    if t is None or dim is None:
        return t
    return t.select(dim, i)


def _none_of(one: Tensor, device: torch.device) -> Tensor:
    """The stack of no slice like `one` on `device`: shape (0, *one's), one's layout within."""
    return torch.empty_strided((0, *one.shape), (max(one.numel(), 1), *one.stride()),
                               dtype=one.dtype, device=device)  # fmt: skip


@conv2d_gw8.register_vmap
def _conv2d_gw8_vmap(info, in_dims, input, weight, bias=None, stride=1, padding_y=0, padding_x=0,
                     dilation=1, groups=1, passes=ALL_PASSES):  # fmt: skip
    """torch.vmap: inputs batched over one weight (and bias) are one call, the vmapped dimension
    folded into the images; batched weights or biases (e.g. a vmapped ensemble), one call per
    slice."""
    # The dispatcher leaves out trailing arguments equal to their defaults (bias None, padding
    # 0, ...), and with them their in_dims: those are None.
    x_dim, w_dim, b_dim = (*in_dims, None, None)[:3]
    rest = (stride, padding_y, padding_x, dilation, groups, passes)
    if w_dim is None and b_dim is None:
        x = input.movedim(x_dim, 0)
        y = conv2d_gw8(x.flatten(0, 1), weight, bias, *rest)
        return y.unflatten(0, x.shape[:2]), 0

    if info.batch_size == 0:  # no slice to compute: one slice's checks and layout, none of it
        one = _conv2d_gw8_fake(_meta_slice(input, x_dim), _meta_slice(weight, w_dim),
                               _meta_slice(bias, b_dim), *rest)  # fmt: skip
        return _none_of(one, input.device), 0

    slices = [
        conv2d_gw8(_slice(input, x_dim, i), _slice(weight, w_dim, i), _slice(bias, b_dim, i), *rest)
        for i in range(info.batch_size)
    ]
    return torch.stack(slices), 0


@conv2d_gw8_backward.register_vmap
def _conv2d_gw8_backward_vmap(info, in_dims, grad_output, input, weight, padding_y, padding_x,
                              output_mask, passes=ALL_PASSES):  # fmt: skip
    """torch.vmap over the backward (autograd.grad(is_grads_batched=True), a vectorized
    jacobian, torch.vmap over autograd.grad): grad_input alone of a batched grad_output over one
    weight is one call, the vmapped dimension folded into the images (the input is read for its
    shape alone then); other calls, one per slice (weight and bias gradients sum over the images,
    so the slices cannot be folded). PyTorch's fallback would make one call per slice in every
    case, and ask the user to report spio's missing rule to PyTorch."""
    dy_dim, x_dim, w_dim = in_dims[:3]
    mask = [bool(m) for m in output_mask]
    rest = (padding_y, padding_x, output_mask, passes)
    if info.batch_size == 0:  # no slice to compute: one slice's checks and layouts, none of it
        one = _conv2d_gw8_backward_fake(_meta_slice(grad_output, dy_dim),
                                        _meta_slice(input, x_dim), _meta_slice(weight, w_dim),
                                        *rest)  # fmt: skip
        return tuple(
            _none_of(t, input.device) if wanted else torch.empty_like(t, device=input.device)
            for t, wanted in zip(one, mask, strict=True)
        ), tuple(0 if wanted else None for wanted in mask)
    if mask == [True, False, False] and w_dim is None:
        x = _slice(input, x_dim, 0)
        if dy_dim is None:  # a batched input, read for its shape alone: one answer for all
            return conv2d_gw8_backward(grad_output, x, weight, *rest), (None, None, None)
        dy = grad_output.movedim(dy_dim, 0)
        images = dy.shape[0] * dy.shape[1]
        stand_in = torch.empty((images, *x.shape[1:]), dtype=x.dtype, device=x.device,
                               memory_format=conv_format(x, weight))  # fmt: skip
        dx, dw, db = conv2d_gw8_backward(dy.flatten(0, 1), stand_in, weight, *rest)
        return (dx.unflatten(0, dy.shape[:2]), dw, db), (0, None, None)

    slices = [
        conv2d_gw8_backward(
            _slice(grad_output, dy_dim, i), _slice(input, x_dim, i), _slice(weight, w_dim, i), *rest
        )
        for i in range(info.batch_size)
    ]
    outputs = tuple(
        torch.stack(parts) if wanted else parts[0]  # an unrequested one: an empty placeholder
        for parts, wanted in zip(zip(*slices, strict=True), mask, strict=True)
    )
    return outputs, tuple(0 if wanted else None for wanted in mask)


def _setup_context(ctx, inputs, output) -> None:
    input, weight, bias, _stride, padding_y, padding_x, _dilation, _groups, passes = inputs
    need_weight = ctx.needs_input_grad[1]
    ctx.save_for_backward(input if need_weight else None, weight)
    ctx.input_meta = (input.shape, input.dtype, input.device, conv_format(input, weight))
    ctx.padding = (padding_y, padding_x)
    ctx.passes = passes
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.weight_dtype = weight.dtype


def _backward(ctx, grad_output):
    input, weight = ctx.saved_tensors
    # (needs_input_grad lacks the trailing arguments the dispatcher left out for equalling their
    # defaults: a call without bias and with no padding has (input, weight) only.)
    mask = gradients_wanted(ctx)
    if not any(mask):
        return (None,) * 9
    if input is None:
        # Only grad_input is needed: the backward op takes the input for its shape alone.
        shape, dtype, device, fmt = ctx.input_meta
        input = torch.empty(shape, dtype=dtype, device=device, memory_format=fmt)
    dx, dw, db = conv2d_gw8_backward(grad_output, input, weight, *ctx.padding, mask, ctx.passes)
    return (
        dx if mask[0] else None,
        dw.to(ctx.weight_dtype) if mask[1] else None,
        db.to(ctx.bias_dtype) if mask[2] else None,
    ) + (None,) * 6


conv2d_gw8.register_autograd(_backward, setup_context=_setup_context)


def _setup_backward_context(ctx, inputs, output) -> None:
    grad_output, input, weight, padding_y, padding_x, output_mask, passes = inputs
    ctx.save_for_backward(grad_output, input, weight)
    ctx.padding = (padding_y, padding_x)
    ctx.mask = [bool(m) for m in output_mask]
    ctx.passes = passes
    # A gradient of an output nothing used arrives as None, not as zeros: _double_backward then
    # runs no convolution on it (two full passes that added zeros, with kernels that
    # spio.precompile(double_backward=True) had no reason to build).
    ctx.set_materialize_grads(False)


def _double_backward(ctx, grad_dx, grad_dw, grad_db):
    """Gradients through the backward op (double backward, e.g. a gradient penalty), by the
    same two ops, so they run spio's kernels and are differentiable in turn.

    FProp, DGrad and WGrad are one trilinear form T(x, w, dy) = <FProp(x, w), dy> =
    <x, DGrad(dy, w)> = <w, WGrad(x, dy)>, with dx = dT/dx and dw = dT/dw. So <g, dx> = T(g, w, dy)
    has gradients FProp(g, w) for dy and WGrad(g, dy) for w; <g, dw> = T(x, g, dy) has FProp(x, g)
    for dy and DGrad(dy, g) for x; <g, db> = <g, sum of dy> gives g itself for dy."""
    dy, x, w = ctx.saved_tensors
    need_dy, need_x, need_w = ctx.needs_input_grad[:3]
    pad, passes = ctx.padding, ctx.passes
    g_dy = g_x = g_w = None
    if ctx.mask[0] and grad_dx is not None:
        g = grad_dx.to(dy.dtype)
        if need_dy:
            g_dy = conv2d_gw8(g, w, None, 1, *pad, 1, 1, passes)
        if need_w:
            g_w = conv2d_gw8_backward(dy, g, w, *pad, [False, True, False], passes)[1]
            g_w = g_w.to(w.dtype)
    if ctx.mask[1] and grad_dw is not None:
        g = grad_dw.to(x.dtype)
        if need_dy:
            term = conv2d_gw8(x, g, None, 1, *pad, 1, 1, passes)
            g_dy = term if g_dy is None else g_dy + term
        if need_x:
            g_x = conv2d_gw8_backward(dy, x, g, *pad, [True, False, False], passes)[0]
    if ctx.mask[2] and grad_db is not None and need_dy:
        term = grad_db.to(dy.dtype).view(1, -1, 1, 1).expand_as(dy)
        g_dy = term if g_dy is None else g_dy + term
    return g_dy, g_x, g_w, None, None, None, None


conv2d_gw8_backward.register_autograd(_double_backward, setup_context=_setup_backward_context)


def _refuse_derivative_transforms(op) -> None:
    """Make the op's autograd kernel raise where PyTorch would not run its autograd formula:
    under torch.func.grad or jvp, and on operands with forward-mode tangents. There the generated
    kernel runs the op below autograd, and the tangent came back as zero, silently (under
    torch.func.jvp the op's implementation sees no sign of the transform; its autograd kernel,
    which this wraps for CPU and CUDA tensors, sees the tangents)."""
    from torch._library.autograd import make_autograd_impl

    generated = make_autograd_impl(op._opoverload, op)

    def kernel(keyset, *args, **kwargs):
        reason = derivative_transform(*(a for a in args if isinstance(a, Tensor)), traced=True)
        if reason is not None:
            # (One wording for both: where a compiled graph meets this, torch 2.13 reports
            # is_compiling(), torch 2.11's Dynamo fake-tensor run does not. A layer's forward
            # cannot ask inside torch.compile, so cannot fall back there.)
            raise RuntimeError(
                f"{op._qualname} cannot run {reason}: PyTorch does not run a custom op's "
                "autograd formula there, and spio has no forward-mode formula. Use F.conv2d, "
                "or a spio.layers.Conv2dGw8 module, which falls back to PyTorch's convolution "
                "there outside torch.compile (inside it, spio.untransform the model)"
            )
        return generated(keyset, *args, **kwargs)

    for key in ("AutogradCPU", "AutogradCUDA"):
        op._lib.impl(op._name, kernel, key, with_keyset=True)


_refuse_derivative_transforms(conv2d_gw8)
_refuse_derivative_transforms(conv2d_gw8_backward)


def _register_autocast(device_type: str) -> None:
    """Cast the operands as checks.cast_for_autocast says (input and weight to the region's
    autocast dtype in their layouts; bias to fp32), then run the op."""
    key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key_name))

    def kernel(_keyset, input, weight, bias=None, stride=1, padding_y=0, padding_x=0,
               dilation=1, groups=1, passes=ALL_PASSES):  # fmt: skip
        dtype = torch.get_autocast_dtype(device_type)
        operands = cast_for_autocast(input, weight, bias, dtype)
        # (Here: inside the op, PyTorch runs its kernel with autocast off.)
        if operands[0].dtype == torch.float64 and uses_kernels(input.device):
            raise kernel_dtype_error(input.device.type, torch.float64, in_autocast=True)
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return conv2d_gw8._opoverload(
                *operands,
                stride,
                padding_y,
                padding_x,
                dilation,
                groups,
                passes,
            )

    conv2d_gw8._lib.impl(conv2d_gw8._name, kernel, key_name, with_keyset=True)


for _device_type in ("cuda", "cpu"):
    _register_autocast(_device_type)


# torch.utils.flop_counter.FlopCounterMode counts the ops' multiply-adds as it counts
# aten.convolution's: 2 per product, the bias left out.
def _flops_per_pass(output_shape, weight_shape) -> int:
    """2 * N * K * P * Q * (8 * R * S): one pass of the convolution."""
    n, k, p, q = output_shape
    return 2 * n * k * p * q * weight_shape[1] * weight_shape[2] * weight_shape[3]


@register_flop_formula(torch.ops.spio.conv2d_gw8)
def _conv2d_gw8_flops(input_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
    return _flops_per_pass(out_shape, weight_shape)


@register_flop_formula(torch.ops.spio.conv2d_gw8_backward)
def _conv2d_gw8_backward_flops(
    grad_output_shape, input_shape, weight_shape, padding_y, padding_x, output_mask, *args,
    **kwargs,
) -> int:  # fmt: skip
    """DGrad and WGrad each cost a forward pass; the bias gradient, a sum, is left out."""
    return _flops_per_pass(grad_output_shape, weight_shape) * (output_mask[0] + output_mask[1])
