"""The seam between the conv2d_gw8 custom ops and spio's kernels (GPU, or the CPU emulator).

The custom ops in `spio.functional.conv2d_gw8_op` call these functions for CUDA tensors, and for
CPU tensors when SPIO_EMULATE=1. Contract:

- The ops have already validated every argument (see `Conv2dGw8Params.from_tensors`): tensors are
  NCHW-shaped, on one device, input/weight/grad_output in params.dtype (fp16 or bf16), bias fp32
  or params.dtype. They may be in any memory format and may be non-contiguous (e.g. an expanded
  grad_output); the kernel wrappers convert to the NHWC (channels_last) layout the kernels read.
- Each function returns new tensors on the input's device, never views of an argument.

`layer()` is where the ops and the eager path meet: it validates a call signature (shapes,
dtypes, devices, padding) once and returns its `Layer`, which keeps that layer's kernels, so a
model pays validation, config selection and kernel lookup once per layer, not on every call.
A batch whose activations pass what a kernel takes (MAX_TENSOR_BYTES) runs in chunks of images
(`_ChunkedLayer`); an empty batch, or one image past it, runs in PyTorch (`_TorchLayer`).

Passes: a call's `passes` (bits FPROP, DGRAD, WGRAD) says which of its passes run spio's
kernels; the others run PyTorch's convolution (cuDNN on a GPU) in the tensors' dtype. That keeps
cuDNN for a pass it runs faster, e.g. WGrad, while spio runs the others (see where_faster).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

import torch
from torch import Tensor

from spio.kernels import autotune, conv2d_gw8_factory, conv2d_gw8_params, families
from spio.kernels import conv2d_gw8_wgrad_factory as wf
from spio.kernels.conv2d_gw8_factory import tensor_copies
from spio.kernels.conv2d_gw8_params import (
    GROUP_WIDTH,
    Conv2dGw8Params,
    as_bool,
    as_integer,
    image_bytes,
    weight_grad_bytes,
)
from spio.kernels.families import FAMILY_OF_PASS
from spio.kernels.kernel import Kernel, KernelFactory
from spio.log import logger
from spio.memo import remember

from .checks import (
    KERNEL_DTYPES,
    check_args,
    device_problem,
    in_format,
    memory_format,
    weight_grad_channels_last,
)

#: The passes of a convolution, and their bits in a call's `passes` (those running spio's kernels).
PASSES = ("fprop", "dgrad", "wgrad")
FPROP, DGRAD, WGRAD = 1, 2, 4
ALL_PASSES = FPROP | DGRAD | WGRAD
PASS_BITS = dict(zip(PASSES, (FPROP, DGRAD, WGRAD), strict=True))


def pass_mask(passes: Iterable[str] | int) -> int:
    """The `passes` bits of pass names ("fprop", "dgrad", "wgrad"), or of bits already (the op's
    `passes` argument: an int, or an integer such as numpy's). TypeError for a value of another
    type (a bool, a float, None, names that are not strings), ValueError for unknown names or
    bits out of range; its callers (pass_mask_or_flag: Conv2dGw8.spio_passes, transform's
    include check) say what they take, in the error's type."""
    if isinstance(passes, bool):  # an int to Python, but no bits: the callers take it first
        raise TypeError(f"conv2d_gw8 passes must be pass names or bits, got {passes!r}")
    bits = as_integer(passes)
    if bits is not None:
        check_passes(bits)
        return bits
    # tuple() raises TypeError for a value that is neither names nor bits (a float, None).
    names = (passes,) if isinstance(passes, str) else tuple(passes)  # type: ignore[arg-type]
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"conv2d_gw8 pass names must be strings, got {names}")
    unknown = [name for name in names if name not in PASS_BITS]
    if unknown:
        raise ValueError(f"conv2d_gw8 passes must be among {PASSES}, got {unknown}")
    mask = 0
    for name in names:
        mask |= PASS_BITS[name]
    return mask


def pass_mask_or_flag(value: object, takes: str, bits: bool = True) -> int:
    """The `passes` bits of value: every pass for True, none for False (numpy's bools and 0-d
    bool tensors too: as_bool), else pass_mask's; with `bits` False, of pass names only. An
    error names `takes` (what the caller takes) and value, of pass_mask's type: the one parser
    of Conv2dGw8.spio_passes and of transform's include answers."""
    flag = as_bool(value)
    if flag is not None:
        return ALL_PASSES if flag else 0
    try:
        passes = value
        if not bits:  # (names as a tuple: an integer, or a 0-d integer tensor, is a TypeError)
            if not isinstance(value, (str, Iterable)):
                raise TypeError
            passes = (value,) if isinstance(value, str) else tuple(value)
        return pass_mask(passes)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise type(error)(f"{takes}, got {value!r}") from None


def pass_names(mask: int) -> tuple[str, ...]:
    """The pass names of `passes` bits, in pass order."""
    return tuple(name for name, bit in PASS_BITS.items() if mask & bit)


def check_passes(passes: int) -> None:
    """Raise ValueError unless `passes` is a combination of FPROP, DGRAD and WGRAD (the op's
    schema has already made it an int)."""
    if not 0 <= passes <= ALL_PASSES:
        raise ValueError(
            f"conv2d_gw8 needs passes in 0..{ALL_PASSES} (bits fprop=1, dgrad=2, wgrad=4), "
            f"got {passes!r}"
        )


def torch_fprop(input: Tensor, weight: Tensor, bias: Tensor | None, padding: tuple[int, int]):
    """conv2d_gw8 by PyTorch's convolution, in the input's dtype. An fp32 bias beside fp16 or
    bf16 operands (a mix F.conv2d refuses; the op's autocast keeps the bias fp32) is added in
    fp32, as the kernels add it, to the convolution without it, and the sum rounded to the
    input's dtype (once more than by the kernels, whose convolution is not rounded first): it
    had been rounded to half before it was added, as nn.Conv2d's is under autocast. Any other
    bias is cast to the input's dtype."""
    groups = weight.shape[0] // GROUP_WIDTH
    if bias is not None and bias.dtype == torch.float32 and input.dtype in KERNEL_DTYPES:
        y = torch.nn.functional.conv2d(input, weight, None, padding=padding, groups=groups)
        return plus_fp32_bias(y, bias, input.dtype)
    b = None if bias is None else bias.to(input.dtype)
    return torch.nn.functional.conv2d(input, weight, b, padding=padding, groups=groups)


def plus_fp32_bias(y: Tensor, bias: Tensor, dtype: torch.dtype) -> Tensor:
    """y + bias, added in fp32 and rounded to `dtype` once (C, H, W last, batched or not)."""
    return (y.float() + bias.view(-1, 1, 1)).to(dtype)


def torch_grads(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    padding: tuple[int, int],
    need_input: bool,
    need_weight: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """(dx, dw) of conv2d_gw8 by PyTorch's convolution_backward, in the input's dtype; None for
    a gradient not asked for."""
    dx, dw, _ = torch.ops.aten.convolution_backward(
        grad_output,
        input,
        weight,
        None,
        [1, 1],
        list(padding),
        [1, 1],
        False,
        [0, 0],
        weight.shape[0] // GROUP_WIDTH,
        [need_input, need_weight, False],
    )
    return dx, dw


# Kernel choice per (factory, layer, device, options, SPIO_TMA): config selection and header
# generation run once per layer, not on every call, with the settings (SPIO_PERF_MODELS,
# SPIO_AUTOTUNE) of that first call. None: no partial-sums kernel (its buffer would be too big).
# A layer met at a new batch size is a new layer here. Past MAX_CHOICES entries it starts over
# (as _layers does), so that batch sizes changing on every call do not each keep their choices:
# the layers then choose again (the same kernels, unless the settings changed meanwhile).
_chosen: dict[tuple, Kernel | None] = {}
MAX_CHOICES = 16384


def with_tensor_copies(kernel: Kernel | None, device: torch.device) -> Kernel | None:
    """`kernel` as SPIO_TMA asks: with its rows moved by tensor copies where `device` has them
    (an sm_90 or newer GPU, or the CPU emulator), else as it is; also as it is where its config
    would need more shared memory that way (logged). (families.with_tensor_copies, which
    autotuning and perf sampling apply too.)"""
    from spio.kernels.perf_model import device_identity

    if kernel is None or not tensor_copies()[0]:
        return kernel
    arch = None  # the CPU emulator
    if getattr(device, "type", None) != "cpu":  # a GPU, or None (no device: the plain kernel)
        identity = device_identity(device)
        if identity is None:
            return kernel
        arch = identity.arch
    made = families.with_tensor_copies(kernel, arch)
    if made is kernel and tensor_copies(arch)[0]:  # asked for, but the stages would not fit
        logger.info(
            "conv2d_gw8: SPIO_TMA left out for %s: its stages with tensor copies would pass a "
            "block's %d bytes of shared memory",
            kernel.name,
            conv2d_gw8_factory.MAX_SHARED_BYTES,
        )
    return made


def _kernel(factory: KernelFactory, params: Conv2dGw8Params, device: torch.device, **options):
    key = (factory.name, params, device, tuple(sorted(options.items())), tensor_copies())
    return _recalled_or_made(
        _chosen,
        key,
        device,
        lambda: with_tensor_copies(factory.get_kernel(params, device, **options), device),
    )


_K = TypeVar("_K", bound=Kernel | None)


def _recalled_or_made(
    store: dict, key: Hashable, device: torch.device, make: Callable[[], _K]
) -> _K:
    """The kernel chosen for `key` in `store`, or else make()'s, remembered there as the choice
    unless autotuning had to wait (autotune.deferred): while `device` captures a CUDA graph, or
    while spio.precompile collects what to tune. That choice serves this call only (see
    spio.kernels.perf_model.select_config), so that a later call tunes."""
    try:  # (one read: another thread may empty store between a test and a read)
        return store[key]
    except KeyError:
        pass
    kernel = make()
    if not autotune.deferred(device):
        remember(store, key, kernel, MAX_CHOICES)
    return kernel


def fprop_kernel(params: Conv2dGw8Params, device: torch.device) -> Kernel:
    """The FProp kernel for params on device (chosen once per layer and device)."""
    return _kernel(conv2d_gw8_factory.conv2d_gw8_kernel_factory, params, device)


def dgrad_kernel(params: Conv2dGw8Params, device: torch.device) -> Kernel:
    """The DGrad kernel for params on device (chosen once per layer and device). DGrad reads no
    bias, so a layer with one gets the kernel of the layer without: the eager path asks with
    the forward's params and the backward op without a bias, and both then run one kernel."""
    params = FAMILY_OF_PASS["dgrad"].layer_as_run(params)
    return _kernel(conv2d_gw8_factory.conv2d_gw8_kernel_factory, params, device, igrad=True)


def wgrad_kernel(
    params: Conv2dGw8Params, device: torch.device, with_bias: bool, deterministic: bool = False
) -> Kernel | None:
    """The WGrad kernel for params on device, computing the bias gradient too when `with_bias`.

    Its partial-sums variant (per-warp sums, then one sum; the same bits on every run) when the
    buffer fits in PARTIAL_BYTES, else the atomic one. `deterministic`: always the partial-sums
    variant; where the chosen config's buffer would pass MAX_PARTIAL_BYTES, that of the
    best-ranked config whose buffer fits, or None (PyTorch computes dw) where none does.
    """
    if params.has_bias != with_bias:
        params = dataclasses.replace(params, has_bias=with_bias)
    atomic = _kernel(wf.conv2d_gw8_wgrad_kernel_factory, params, device)
    # (params too: a kernel's name leaves out the batch size, its grid and slots do not.)
    key = ("wgrad", params, atomic.name, device, deterministic, tensor_copies())
    try:  # (one read: another thread may empty _chosen between a test and a read)
        return _chosen[key]
    except KeyError:
        pass
    config = atomic.info_value("config")
    if wf.uses_partial_sums(params, config, deterministic):
        kernel = with_tensor_copies(wf.make_kernel(params, config, partials=True), device)
    elif not deterministic:
        kernel = atomic
    else:
        kernel = _deterministic_wgrad(params, device, config)
    return remember(_chosen, key, kernel, MAX_CHOICES)


def _deterministic_wgrad(params: Conv2dGw8Params, device: torch.device, pick) -> Kernel | None:
    """The partial-sums kernel of the best-ranked WGrad config whose buffer fits in
    MAX_PARTIAL_BYTES (`pick`'s does not), as the perf model (or the analytic heuristic) ranks
    them; None where no config's does."""
    from spio.kernels import perf_model as pm

    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    identity = pm.device_identity(device)
    if identity is None:
        ranked = pm.heuristic_ranking(family, params, family.configs(params))
    else:
        ranked = pm.rank_configs(family, params, identity)[0]
    fits = next((c for c in ranked if wf.uses_partial_sums(params, c, deterministic=True)), None)
    needed = wf.partial_bytes(params, pick) >> 20
    limit = wf.MAX_PARTIAL_BYTES >> 20
    if fits is None:
        logger.info(
            "conv2d_gw8 %s: the deterministic WGrad would need %d MiB of partial sums (limit %d "
            "MiB) in every config; PyTorch computes this weight gradient",
            params.encode(),
            needed,
            limit,
        )
        return None
    logger.info(
        "conv2d_gw8 %s: the deterministic WGrad runs config %s, whose partial sums fit in %d MiB "
        "(the chosen %s would need %d MiB)",
        params.encode(),
        fits.encode(),
        limit,
        pick.encode(),
        needed,
    )
    return with_tensor_copies(wf.make_kernel(params, fits, partials=True), device)


class Layer:
    """One call signature (shapes, dtypes, devices, padding): its validated parameters, and its
    kernels once first needed. Both the custom ops and the eager path run through it, so a model
    pays validation, config selection and kernel lookup once per layer, not once per call."""

    __slots__ = (
        "params",
        "device",
        "_dgrad_params",
        "_fprop",
        "_dgrad",
        "_wgrad",
        "_layout_checked",
    )

    def __init__(self, params: Conv2dGw8Params, device: torch.device):
        self.params = params
        self.device = device
        # DGrad's layer (bias-free: dgrad_kernel), one object so that the kernel's check of the
        # layer it is given is an identity test, not a comparison of every field.
        self._dgrad_params = FAMILY_OF_PASS["dgrad"].layer_as_run(params)
        # Kernels by (weights_cl, bias_elem): the variant that reads the weight and bias as the
        # caller holds them (conv2d_gw8_factory.operand_layout), so neither is copied per call.
        self._fprop: dict[tuple[bool, bool], Kernel] = {}
        self._dgrad: dict[bool, Kernel] = {}
        self._wgrad: dict[tuple[bool, bool], Kernel | None] = {}  # (bias, deterministic)
        self._layout_checked = False

    def forward(self, input: Tensor, weight: Tensor, bias: Tensor | None, passes: int) -> Tensor:
        """y, by spio's FProp if `passes` has FPROP, else by PyTorch (same dtype and layout)."""
        if passes & FPROP:
            if not self._layout_checked:
                self._check_layout(input)
            return self.fprop(input, weight, bias)
        return torch_fprop(input, weight, bias, self.params.padding)

    @staticmethod
    def _dy_for_both(grad_output: Tensor) -> Tensor:
        """dy for a backward that runs both DGrad and WGrad kernels: laid out NHWC once for both,
        not once in each (a dy in another layout, e.g. from a .float() after the layer, was
        copied twice)."""
        return conv2d_gw8_factory.nhwc_operand(grad_output)

    def backward(
        self,
        grad_output: Tensor,
        input: Tensor | None,
        weight: Tensor,
        mask: tuple[bool, bool, bool],
        passes: int,
        dtypes: tuple[torch.dtype, torch.dtype] | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """(dx, dw, dbias) where `mask` asks for them (else None): dx in the input's dtype; dw and
        dbias fp32, or `dtypes` (dw's, dbias's). DGrad and WGrad run spio's kernels where
        `passes` says so, PyTorch's convolution_backward otherwise; the bias gradient comes from
        spio's WGrad pass over dy when that runs, else from a sum over dy."""
        need_input, need_weight, need_bias = mask
        dw_dtype, db_dtype = dtypes or (torch.float32, torch.float32)
        dx = dw = db = None
        spio_dgrad = bool(need_input and passes & DGRAD)
        spio_wgrad = bool(need_weight and passes & WGRAD)
        # (The layout before _dy_for_both lays dy out NHWC.)
        if not self._layout_checked and (spio_dgrad or spio_wgrad):
            self._check_layout(grad_output, *([input] if spio_wgrad else []))
        if spio_dgrad and spio_wgrad:
            grad_output = self._dy_for_both(grad_output)
        if spio_dgrad:
            dx = self.dgrad(grad_output, weight)
        if spio_wgrad:
            assert input is not None, "callers keep the input for a weight gradient"
            cl = weight_grad_channels_last(weight)  # dw in the weight's layout
            dw, db = self.wgrad(input, grad_output, need_bias, dtypes, channels_last=cl)
        torch_input = need_input and not passes & DGRAD
        torch_weight = need_weight and not passes & WGRAD
        if torch_input and input is None:  # not kept without a weight gradient: its shape will do
            input = self.stand_in_input(grad_output, memory_format(grad_output))
        if torch_input or torch_weight:
            assert input is not None, "kept for a weight gradient, else the stand-in above"
            torch_dx, torch_dw = torch_grads(
                grad_output, input, weight, self.params.padding, torch_input, torch_weight
            )
            dx = torch_dx if torch_input else dx
            if torch_weight:  # (PyTorch's follows the input's layout: the weight's, as spio's)
                assert torch_dw is not None
                dw = in_format(torch_dw, memory_format(weight))
        if dw is not None and dw.dtype != dw_dtype:  # PyTorch's: the input's dtype, or fp32
            dw = dw.to(dw_dtype)
        if need_bias:
            if db is None:
                db = grad_output.sum(dim=(0, 2, 3), dtype=torch.float32)
            if db.dtype != db_dtype:
                db = db.to(db_dtype)
        return dx, dw, db

    def _check_layout(self, *activations: Tensor | None) -> None:
        """At a layer's first pass on spio's kernels (its forward's FProp, its backward's DGrad
        or WGrad): whether its activations (x, dy) are copied into the NHWC layout the kernels
        read, on a GPU, which the user can avoid; logged once per process, as every layer of an
        NCHW model does it. Not asked where PyTorch runs the pass: nothing is copied there."""
        global _layout_logged
        self._layout_checked = True
        if (
            _layout_logged
            or self.device.type != "cuda"
            or all(
                t is None or t.is_contiguous(memory_format=torch.channels_last) for t in activations
            )
        ):
            return
        _layout_logged = True
        logger.warning(
            "conv2d_gw8 %s: an activation is not a contiguous channels_last tensor. spio's "
            "kernels read and write NHWC, so each pass copies its activations into that layout "
            "(and an NCHW model's results back): up to twice the memory traffic of the "
            "convolution itself. Convert the model and its inputs: "
            ".to(memory_format=torch.channels_last). (Logged once.)",
            self.params.encode(),
        )

    def kernels(
        self,
        weight: Tensor,
        bias: Tensor | None,
        passes: int,
        needs: tuple[bool, bool, bool],
        deterministic: bool,
    ) -> list[Kernel]:
        """The kernels a call with these operands launches, chosen as its passes choose them:
        FProp where `passes` has it, and for the gradients `needs` (input, weight, bias) asks
        for, DGrad and WGrad where `passes` has them (with the sum over WGrad's partial sums, in
        the gradient dtypes of the eager path and of the op). For spio.precompile."""
        found = []
        if passes & FPROP:
            found.append(self.fprop_kernel(conv2d_gw8_factory.operand_layout(weight, bias)))
        need_input, need_weight, need_bias = needs
        if need_input and passes & DGRAD:
            found.append(self.dgrad_kernel(conv2d_gw8_factory.operand_layout(weight)[0]))
        wgrad = None
        if need_weight and passes & WGRAD:
            wgrad = self.wgrad_kernel(need_bias, deterministic)  # None: PyTorch's
        if wgrad is not None:
            found.append(wgrad)
            if wgrad.info_value("partials"):
                params = dataclasses.replace(self.params, has_bias=need_bias)
                bias_dtype = torch.float32 if bias is None else bias.dtype
                eager = (wf.gradient_dtype_name(weight.dtype), wf.gradient_dtype_name(bias_dtype))
                for dtypes in dict.fromkeys([eager, ("fp32", "fp32")]):
                    found.append(wf.sum_kernel(params, *dtypes))
        return found

    def stand_in_input(self, grad_output: Tensor, fmt: torch.memory_format) -> Tensor:
        """An uninitialised input for grad_output's batch, for callers that did not keep the
        input (no weight gradient) and pass it on for its shape alone."""
        return torch.empty(
            (grad_output.shape[0], *self.params.input_shape[1:]),
            dtype=grad_output.dtype,
            device=grad_output.device,
            memory_format=fmt,
        )

    def fprop(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        kernel = self.fprop_kernel(conv2d_gw8_factory.operand_layout(weight, bias))
        return conv2d_gw8_factory.fprop(
            input, weight, bias, self.params, kernel=kernel, validated=True
        )

    def dgrad(self, grad_output: Tensor, weight: Tensor) -> Tensor:
        kernel = self.dgrad_kernel(conv2d_gw8_factory.operand_layout(weight)[0])
        return conv2d_gw8_factory.dgrad(
            grad_output, weight, self._dgrad_params, kernel=kernel, validated=True
        )

    def fprop_kernel(self, layout: tuple[bool, bool]) -> Kernel:
        """The FProp kernel reading weight and bias as `layout` (weights_cl, bias_elem) says."""
        # (Each call: a hit is one read, with no closure made; Kernel has no __bool__.)
        return self._fprop.get(layout) or _recalled_or_made(
            self._fprop,
            layout,
            self.device,
            lambda: conv2d_gw8_factory.variant(fprop_kernel(self.params, self.device), *layout),
        )

    def dgrad_kernel(self, weights_cl: bool) -> Kernel:
        """The DGrad kernel, reading channels_last weights when `weights_cl`."""
        return self._dgrad.get(weights_cl) or _recalled_or_made(
            self._dgrad,
            weights_cl,
            self.device,
            lambda: conv2d_gw8_factory.variant(
                dgrad_kernel(self._dgrad_params, self.device), weights_cl, False
            ),
        )

    def wgrad(
        self,
        input: Tensor,
        grad_output: Tensor,
        with_bias: bool,
        dtypes: tuple[torch.dtype, torch.dtype] | None = None,
        channels_last: bool = False,
    ):
        """(dw, dbias) from x and dy: dw of shape params.weight_shape; dbias (C,) computed in
        the same pass when `with_bias`, else None; fp32, or `dtypes` (dw's, dbias's) where
        spio's kernels compute them (PyTorch's fallback gives fp32: callers cast what is not
        their dtype). Where spio's kernels compute dw it is contiguous, or with
        `channels_last` (a channels_last weight's) channels_last; PyTorch's fallback gives
        convolution_backward's layout.

        The kernel is wgrad_kernel's choice: per-warp partial sums then a sum (the same bits on
        every run), or, for layers whose partial sums would pass PARTIAL_BYTES, fp32 atomics
        (the last bits vary from run to run). Under torch.use_deterministic_algorithms(True)
        the partial sums always: the chosen config's, or where its buffer would pass
        MAX_PARTIAL_BYTES the best-ranked config's whose buffer fits; PyTorch's where none does."""
        deterministic = torch.are_deterministic_algorithms_enabled()
        kernel = self.wgrad_kernel(with_bias, deterministic)
        if kernel is None:  # deterministic, every config's partial sums too big: PyTorch's, fp32
            return _pytorch_wgrad(input, grad_output, self.params, with_bias)
        if deterministic:
            _log_deterministic_once()
        # The kernel's own layer: this one with has_bias = with_bias (wgrad_kernel chose it for
        # that), the very object, so wf.wgrad's check of it is an identity test.
        params = kernel.info_value("params")
        return wf.wgrad(
            input, grad_output, params, kernel=kernel, dtypes=dtypes, validated=True,
            channels_last=channels_last,
        )  # fmt: skip

    def wgrad_kernel(self, with_bias: bool, deterministic: bool) -> Kernel | None:
        """wgrad_kernel's choice for this layer (None: PyTorch computes dw; a None kept goes on
        to _recalled_or_made, which finds it)."""
        return self._wgrad.get((with_bias, deterministic)) or _recalled_or_made(
            self._wgrad,
            (with_bias, deterministic),
            self.device,
            lambda: wgrad_kernel(self.params, self.device, with_bias, deterministic),
        )


class _TorchLayer(Layer):
    """A call the kernels cannot take although its arguments are valid, so PyTorch's convolution
    runs every pass: no images (N = 0, which nn.Conv2d allows: an empty output, zero dw and
    dbias), or one image's tensor too large for the kernels (`MAX_TENSOR_BYTES`). Its params
    are the layer's with N = 1, so every other constraint is checked as for any call."""

    __slots__ = ()

    def forward(self, input: Tensor, weight: Tensor, bias: Tensor | None, passes: int) -> Tensor:
        return super().forward(input, weight, bias, 0)

    def backward(self, grad_output, input, weight, mask, passes, dtypes=None):
        return super().backward(grad_output, input, weight, mask, 0, dtypes)

    def kernels(self, weight, bias, passes, needs, deterministic):
        return []


#: The largest tensor a kernel takes (the kernels index with C++ ints); larger batches run in
#: chunks of images. (A name of this module: tests lower it to make chunks of small batches.)
MAX_TENSOR_BYTES = conv2d_gw8_params.MAX_TENSOR_BYTES


def batch_chunks(n: int, limit: int) -> list[tuple[int, int]]:
    """[start, stop) ranges splitting a batch of n into the fewest chunks of at most `limit`
    images, as even as they come: sizes differ by at most one (so at most two sets of kernels),
    the larger first."""
    count = -(-n // limit)
    size, extra = divmod(n, count)
    stops = [0]
    for i in range(count):
        stops.append(stops[-1] + size + (i < extra))
    return list(itertools.pairwise(stops))


class _ChunkedLayer(Layer):
    """A batch whose activations pass MAX_TENSOR_BYTES, run in chunks of images that do not:
    FProp and DGrad write each chunk's slice of one output; WGrad adds the chunks' fp32 weight
    (and bias) gradients in chunk order, so the sum is as repeatable as each chunk's WGrad (the
    same bits on every run with partial sums, not with atomics)."""

    __slots__ = ("_chunks",)

    def __init__(self, params: Conv2dGw8Params, device: torch.device, limit: int):
        super().__init__(params, device)
        by_size: dict[int, Layer] = {}
        self._chunks = []
        for start, stop in batch_chunks(params.n, limit):
            size = stop - start
            if size not in by_size:
                by_size[size] = Layer(dataclasses.replace(params, n=size), device)
            self._chunks.append((start, stop, by_size[size]))

    @staticmethod
    def _dy_for_both(grad_output: Tensor) -> Tensor:
        """dy as given: each chunk lays out its own slice (at most MAX_TENSOR_BYTES at a time),
        where one NHWC copy of the whole dy would hold it all through the chunks."""
        return grad_output

    def kernels(self, weight, bias, passes, needs, deterministic):
        chunks = {id(chunk): chunk for _, _, chunk in self._chunks}.values()
        return [k for c in chunks for k in c.kernels(weight, bias, passes, needs, deterministic)]

    def fprop(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        out = self._empty_nhwc(self.params.output_shape, input)
        layout = conv2d_gw8_factory.operand_layout(weight, bias)
        for start, stop, chunk in self._chunks:
            conv2d_gw8_factory.fprop(
                input[start:stop],
                weight,
                bias,
                chunk.params,
                out=out[start:stop],
                kernel=chunk.fprop_kernel(layout),
            )
        return out

    def dgrad(self, grad_output: Tensor, weight: Tensor) -> Tensor:
        out = self._empty_nhwc(self.params.input_shape, grad_output)
        weights_cl = conv2d_gw8_factory.operand_layout(weight)[0]
        for start, stop, chunk in self._chunks:
            conv2d_gw8_factory.dgrad(
                grad_output[start:stop],
                weight,
                chunk.params,
                out=out[start:stop],
                kernel=chunk.dgrad_kernel(weights_cl),
            )
        return out

    def wgrad(self, input, grad_output, with_bias, dtypes=None, channels_last=False):
        dw = db = None
        for start, stop, chunk in self._chunks:
            part_w, part_b = chunk.wgrad(
                input[start:stop], grad_output[start:stop], with_bias, channels_last=channels_last
            )
            dw = part_w if dw is None else dw.add_(part_w)
            if with_bias:
                db = part_b if db is None else db.add_(part_b)
        if dtypes is not None:
            dw = dw.to(dtypes[0])
            db = None if db is None else db.to(dtypes[1])
        return dw, db

    @staticmethod
    def _empty_nhwc(shape: tuple[int, ...], like: Tensor) -> Tensor:
        return torch.empty(
            shape, dtype=like.dtype, device=like.device, memory_format=torch.channels_last
        )


#: At most this many call signatures are remembered; a model has a few dozen. Past it the cache
#: starts over, so that shapes changing on every call do not each keep a Layer. The kernels
#: chosen (_chosen, bounded by MAX_CHOICES) and the loaded kernels are kept apart: they are what
#: a shape seen again would need.
MAX_SIGNATURES = 4096

_layers: dict[tuple, Layer] = {}


def layer(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    pad_y: int,
    pad_x: int,
    stride: int = 1,
    dilation: int = 1,
    groups: int = 1,
) -> Layer:
    """The validated Layer of this call; check_args raises on the first call with bad arguments
    (a bad call is never cached)."""
    key = (
        input.shape,
        input.dtype,
        input.device,
        weight.shape,
        weight.dtype,
        weight.device,
        None if bias is None else (bias.shape, bias.dtype, bias.device),
        pad_y,
        pad_x,
        stride,
        dilation,
        groups,
    )
    found = _layers.get(key)
    if found is None:
        check_args(input, weight, bias, stride, pad_y, pad_x, dilation, groups)
        problem = device_problem(input.device)
        if problem is not None:
            raise ValueError(f"conv2d_gw8 needs a GPU spio's kernels run on: {problem}")
        found = remember(
            _layers, key, _new_layer(input, weight, bias, (pad_y, pad_x)), MAX_SIGNATURES
        )
    return found


def _new_layer(input: Tensor, weight: Tensor, bias: Tensor | None, padding) -> Layer:
    """The Layer that runs this (checked) call: one batch, chunks of it, or PyTorch."""
    n = input.shape[0]
    # Params of one image first: a shape-only stand-in, so that N = 0 is checked like N = 1.
    one = torch.empty((1, *input.shape[1:]), dtype=input.dtype, device="meta")
    params = Conv2dGw8Params.from_tensors(one, weight, bias, padding=padding)
    too_large = too_large_to_launch(params)
    if n == 0 or too_large:
        for what, size, most in too_large:
            logger.info(
                "conv2d_gw8 %s: %s %d MiB, more than the kernels' %d MiB; PyTorch runs this layer",
                params.encode(),
                what,
                size >> 20,
                most >> 20,
            )
        return _TorchLayer(params, input.device)
    params = dataclasses.replace(params, n=n)
    limit = images_per_launch(params)
    if n > limit:
        return _ChunkedLayer(params, input.device, limit)
    return Layer(params, input.device)


def too_large_to_launch(params: Conv2dGw8Params) -> list[tuple[str, int, int]]:
    """What of the layer passes what one launch of its kernels takes even at one image, as
    (what, bytes, the most a launch takes): [] where its kernels run it (a batch of more than
    images_per_launch in chunks), else PyTorch runs it. (The weight gradient's limit is the
    kernels' own: tests lower this module's MAX_TENSOR_BYTES for chunks.)"""
    parts = [
        ("one image's activations take", image_bytes(params), MAX_TENSOR_BYTES),
        ("its fp32 weight gradient takes", weight_grad_bytes(params),
         conv2d_gw8_params.MAX_TENSOR_BYTES),
    ]  # fmt: skip
    return [(what, size, most) for what, size, most in parts if size > most]


def images_per_launch(params: Conv2dGw8Params) -> int:
    """The most images of the layer one launch takes: a larger batch runs in chunks of this
    many (where too_large_to_launch finds nothing)."""
    return MAX_TENSOR_BYTES // image_bytes(params)


#: Whether deterministic mode's choice of the partial sums has been logged.
_deterministic_logged = False
#: Whether a layer has warned that its activations are not channels_last (Layer._check_layout).
_layout_logged = False


def _log_deterministic_once() -> None:
    """Says once that deterministic mode picks the partial sums (where PyTorch computes the
    gradient instead, wgrad_kernel logs why)."""
    global _deterministic_logged
    if _deterministic_logged:
        return
    _deterministic_logged = True
    logger.info(
        "deterministic algorithms are on: conv2d_gw8 weight gradients use spio's "
        "partial-sums WGrad (per-warp sums, then a sum over them) up to %d MiB of partials",
        wf.MAX_PARTIAL_BYTES >> 20,
    )


def _pytorch_wgrad(input, grad_output, params: Conv2dGw8Params, with_bias: bool):
    """dw (and dbias) from PyTorch, for layers whose partial-sum buffer would be too large in
    every config (deterministic mode)."""
    # In fp32, as the kernel accumulates: fp16/bf16 values are exact in fp32 (and in TF32).
    weight = torch.empty(params.weight_shape, dtype=torch.float32, device=input.device)
    _, dw = torch_grads(grad_output.float(), input.float(), weight, params.padding, False, True)
    dbias = grad_output.sum(dim=(0, 2, 3), dtype=torch.float32) if with_bias else None
    return dw, dbias
