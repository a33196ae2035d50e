"""A light eager path to spio's kernels for Conv2dGw8 modules and spio.functional.conv2d_gw8.

A torch.library custom op pays its dispatch (schema parsing, fake-tensor plumbing, autograd
wrapper) on every call: on an H200 host that measured 73 µs over F.conv2d's own 19 µs in the
first run (docs/perf/2026-11-29-h200.md) and 28 µs over its 20 µs in run 5
(docs/perf/2026-11-29-h200-2.md), more than a small layer's kernel. In plain eager mode
Conv2dGw8 and `conv2d_gw8` (the public function) call `conv2d_gw8_eager` instead, which goes
straight to the same kernel seam (`spio.functional._kernels`). Wherever something must see the
op (torch.compile, jit tracing, a torch.func transform, a TorchDispatchMode such as
FakeTensorMode or make_fx, tensor subclasses: `eager_path_applies`) they call the custom op,
whose fake and autograd registrations those need. Both compute the same thing; the tests compare
them.

What keeps it light:
- a layer's validation, parameters and kernels are found once per call signature (shapes, dtypes,
  devices, padding) and reused (`_kernels.Layer`, shared with the custom ops);
- without autograd (no_grad, or no tensor requiring grad) the kernels run directly, without an
  autograd.Function;
- channels_last weights and a half bias are read as held by kernel variants, not copied;
- the launch itself skips the per-call lookups (see `spio.kernels.kernel.Kernel`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.overrides import handle_torch_function, has_torch_function

from spio.kernels.conv2d_gw8_params import as_integer

from . import _kernels
from ._kernels import ALL_PASSES, check_passes
from .checks import (
    autocast_operands,
    check_tensors,
    conv_format,
    functorch_transform_active,
    gradients_wanted,
    has_forward_tangent,
    in_format,
    uses_kernels,
)
from .conv2d_gw8_op import conv2d_gw8 as conv2d_gw8_op
from .onnx_export import exported_conv2d, onnx_exporting


class _Conv2dGw8(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        layer: _kernels.Layer,
        passes: int,
    ):
        need_weight = ctx.needs_input_grad[1]
        ctx.save_for_backward(input if need_weight else None, weight)
        ctx.layer = layer
        ctx.passes = passes
        ctx.input_format = conv_format(input, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return in_format(layer.forward(input, weight, bias, passes), ctx.input_format)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        input, weight = ctx.saved_tensors
        mask = tuple(gradients_wanted(ctx))
        # create_graph: gradients that are differentiable in turn. Batched gradients
        # (autograd.grad(is_grads_batched=True), a vectorized jacobian, torch.vmap over a
        # backward): a batched grad_output, which only the op's batching rules take.
        if torch.is_grad_enabled() or _batched(grad_output):
            return _differentiable_backward(ctx, grad_output, input, weight, mask)
        # The weight and bias gradients in their parameters' dtypes, rounded once.
        dtypes = (weight.dtype, ctx.bias_dtype or torch.float32)
        dx, dw, db = ctx.layer.backward(grad_output, input, weight, mask, ctx.passes, dtypes)
        if dx is not None:
            dx = in_format(dx, ctx.input_format)
        return dx, dw, db, None, None


def _batched(t: Tensor) -> bool:
    """Whether t is batched by torch.vmap or by autograd's own vmap (is_grads_batched)."""
    return functorch_transform_active() or torch._C._functorch.is_legacy_batchedtensor(t)


def _differentiable_backward(ctx, grad_output, input, weight, mask):
    """The gradients by the custom backward op, whose autograd formula (double backward) records
    them; for backward(create_graph=True), e.g. a gradient penalty. Same kernels, same values."""
    from .conv2d_gw8_op import conv2d_gw8_backward

    if input is None:  # not kept without a weight gradient: the op takes it for its shape alone
        input = ctx.layer.stand_in_input(grad_output, ctx.input_format)
    dx, dw, db = conv2d_gw8_backward(grad_output, input, weight, *ctx.layer.params.padding,
                                     list(mask), ctx.passes)  # fmt: skip
    return (
        dx if mask[0] else None,
        dw.to(weight.dtype) if mask[1] else None,
        db.to(ctx.bias_dtype) if mask[2] else None,
        None,
        None,
    )


#: Tensor types the eager path launches kernels on.
_PLAIN = (Tensor, torch.nn.Parameter)


def eager_path_applies(input: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether a call may take `conv2d_gw8_eager` rather than the custom op: not while
    torch.compile or torch.jit.trace records (they must see the op), nor inside a torch.func
    transform (the op's vmap rule batches the call), nor under a TorchDispatchMode
    (FakeTensorMode, make_fx, FlopCounterMode, ...: the mode must see the op, and fake tensors
    have no memory to launch on), nor for tensor subclasses. On every module call: kept cheap."""
    return not (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or functorch_transform_active()
        or torch._C._len_torch_dispatch_stack() > 0
        or type(input) not in _PLAIN
        or type(weight) not in _PLAIN
        or (bias is not None and type(bias) not in _PLAIN)
    )


def conv2d_gw8_eager(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    padding_y: int,
    padding_x: int,
    passes: int = ALL_PASSES,
    stride: int = 1,
    dilation: int = 1,
    groups: int = 1,
) -> Tensor:
    """spio::conv2d_gw8 for tensors that run spio's kernels, without the custom-op dispatch.

    Autocast is applied as the custom op applies it: input and weight to the region's dtype, bias
    to fp32. Validation is the custom op's own. `passes`, `stride`, `dilation` and `groups` as
    for the op.
    """
    input, weight, bias = autocast_operands(input, weight, bias)
    layer = _kernels.layer(input, weight, bias, padding_y, padding_x, stride, dilation, groups)
    if torch.is_grad_enabled() and (
        input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return _Conv2dGw8.apply(input, weight, bias, layer, passes)
    return in_format(layer.forward(input, weight, bias, passes), conv_format(input, weight))


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
    """Grouped conv2d with group width 8, stride 1, C == K: input (N, C, H, W), weight (C, 8, R, S).

    The custom op `torch.ops.spio.conv2d_gw8` (same arguments, results and errors, but for
    arguments of the wrong type: see below), called without its dispatch cost where nothing
    needs to see the op: in plain eager mode, on tensors that run spio's kernels, with int
    arguments. Elsewhere (torch.compile, tracing, torch.func, dispatch modes, CPU tensors
    without SPIO_EMULATE) it calls the op.

    `bias`: (C,), fp32 or the input's dtype, or None. `padding_y`, `padding_x`: rows and columns
    of zeros padded on both sides (each its own argument, padding_x 0 unless given: where
    F.conv2d's fifth argument pads both, this one's pads the rows alone, so name them).
    `stride` and `dilation` must be 1, and `groups` C // 8, or 1 to mean "implied by the
    weight": they are accepted for F.conv2d compatibility. An fp32 bias is added in fp32. Input and
    weight share one floating dtype, which must be fp16 or bf16 where spio's kernels run, unless
    torch.autocast casts them (and the bias to fp32). The output is channels_last where the
    input or the weight is (as F.conv2d's), else contiguous. `passes`: which passes run spio's
    kernels, as bits (fprop 1, dgrad 2, wgrad 4); the others run PyTorch's convolution. Only
    where spio's kernels run at all (CUDA; CPU with SPIO_EMULATE).

    Autograd: gradients as conv2d_gw8_backward computes them, differentiable in turn (double
    backward).
    Unsupported arguments raise ValueError naming the constraint, and arguments of the wrong
    type (not a tensor; not an integer, or a bool, where an int belongs) TypeError naming the
    argument, as F.conv2d and Conv2dGw8 refuse them (the raw op's schema raises RuntimeError,
    and takes a bool as an int); under torch.func.grad or jvp, or with forward-mode AD
    tangents, it raises RuntimeError (a Conv2dGw8 module falls back to F.conv2d there).
    """
    if (
        # Exactly ints (not bools: _check_types refuses them), as the op's schema takes them.
        type(stride) is int
        and type(padding_y) is int
        and type(padding_x) is int
        and type(dilation) is int
        and type(groups) is int
        and type(passes) is int
        # (eager_path_applies also asks for plain tensors, no compile and no torch.func
        # transform: what derivative_transform asks, but for forward-mode tangents.)
        and eager_path_applies(input, weight, bias)
        and (input.is_cuda or uses_kernels(input.device))
        and not has_forward_tangent(input, weight, bias)  # the op raises there
    ):
        check_passes(passes)
        return conv2d_gw8_eager(
            input, weight, bias, padding_y, padding_x, passes, stride, dilation, groups
        )
    operands = (input, weight) if bias is None else (input, weight, bias)
    if has_torch_function(operands):  # an fx Proxy, a tensor subclass or mode that overrides it
        return handle_torch_function(
            conv2d_gw8, operands, input, weight, bias, stride, padding_y, padding_x, dilation,
            groups, passes,
        )  # fmt: skip
    _check_types(input, weight, bias, stride, padding_y, padding_x, dilation, groups, passes)
    return op_or_export(input, weight, bias, stride, padding_y, padding_x, dilation, groups, passes)


def op_or_export(*args: Any) -> Tensor:
    """The custom op on `args` (its own, in its schema's order: input, weight, bias, stride,
    padding_y, padding_x, dilation, groups, passes), or, while torch.onnx.export runs, what the
    export records in its place (spio.functional.onnx_export): where conv2d_gw8 and Conv2dGw8
    layers call the op."""
    call = exported_conv2d if onnx_exporting() else conv2d_gw8_op
    return call(*args)


_INT_ARGUMENTS = ("stride", "padding_y", "padding_x", "dilation", "groups", "passes")


def _check_types(
    input: Tensor, weight: Tensor, bias: Tensor | None, *ints: int | torch.SymInt
) -> None:
    """TypeError naming the argument of the wrong type: a tensor operand that is not a tensor,
    or an int argument that is not an integer (an int, a SymInt, or what has __index__, e.g.
    numpy's) or is a bool (F.conv2d refuses those, and passes=True would be FProp alone where
    Conv2dGw8.spio_passes = True is every pass). Before the op, whose schema would raise a
    RuntimeError for some of these (a float, a list for a tensor) and take the others."""
    check_tensors(input, weight, bias)
    for name, value in zip(_INT_ARGUMENTS, ints, strict=True):
        # (A SymInt is one, but its __index__ would specialize a compiled graph to its value.)
        if isinstance(value, torch.SymInt):
            continue
        integer = as_integer(value)
        if integer is None:
            raise TypeError(f"conv2d_gw8 needs an integer {name}, got {value!r}")
        if not -(2**63) <= integer < 2**63:  # (the op's schema would fail on it unnamed)
            raise ValueError(f"conv2d_gw8 needs {name} within int64, got {value!r}")


def _script_as_the_op() -> None:
    """TorchScript compiles a call of conv2d_gw8 in scripted code as the op spio::conv2d_gw8 (a
    builtin, as torch's own functions are), so a scripted model saves and loads with it; where
    that registry is missing, it calls the Python function, as it calls ignored functions."""
    try:
        from torch.jit._builtins import _register_builtin
    except ImportError:
        torch.jit.ignore(conv2d_gw8)
        return
    _register_builtin(conv2d_gw8, "spio::conv2d_gw8")


_script_as_the_op()
