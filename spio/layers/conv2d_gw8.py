"""Conv2dGw8: an nn.Conv2d whose forward runs spio::conv2d_gw8 (group width 8, stride 1, C == K)."""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeGuard, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Proxy
from torch.nn.modules.module import _WrappedHook
from torch.nn.modules.utils import _pair
from torch.nn.parameter import is_lazy
from torch.nn.utils import parametrize

from spio.functional import _kernels
from spio.functional._kernels import ALL_PASSES, PASSES, pass_mask_or_flag, pass_names
from spio.functional.checks import (
    KERNEL_DTYPES,
    autocast_dtype,
    autocast_operands,
    check_args,
    check_tensors,
    conv_format,
    derivative_transform,
    device_problem,
)
from spio.functional.conv2d_gw8_op import uses_kernels
from spio.functional.eager import conv2d_gw8_eager, eager_path_applies, op_or_export
from spio.kernels.conv2d_gw8_params import (
    GROUP_WIDTH,
    MAX_FILTER,
    MIN_FILTER,
    as_integer,
)
from spio.kernels.kernel import Kernel
from spio.log import logger

_FULL = (torch.float32, torch.float64)
_logged_fallbacks: set[str] = set()
_Conv = TypeVar("_Conv", bound=nn.Conv2d)


class StandIn:
    """One run of a model by spio.precompile or scan_modules with PyTorch's convolution standing
    in for spio's in `ids` (the layers' ids): for calls from the thread that runs it and from
    threads started during the run (the model's own: nn.DataParallel's, a pool that
    starts its threads on first use), not from threads that were there before it (an inference
    server's, say), whose calls run as ever. The layers themselves are not changed."""

    def __init__(self, layers: Iterable[nn.Module]) -> None:
        self.ids = frozenset(id(layer) for layer in layers)
        # (the threads there before it but this one)
        self.existing = frozenset(t.ident for t in threading.enumerate()) - {threading.get_ident()}

    def covers(self, layer: nn.Module) -> bool:
        """Whether this call of `layer` (the current thread's) runs PyTorch's convolution."""
        return id(layer) in self.ids and threading.get_ident() not in self.existing


#: The StandIn runs in progress in the process (a call looks no further while there are none).
_stand_ins: tuple[StandIn, ...] = ()
_stand_in_lock = threading.Lock()


@contextlib.contextmanager
def pytorch_standing_in(layers: Iterable[nn.Module]) -> Iterator[StandIn]:
    """Within the block, calls of `layers` the run covers (StandIn) run PyTorch's convolution."""
    global _stand_ins
    run = StandIn(layers)
    with _stand_in_lock:
        _stand_ins = (*_stand_ins, run)
    try:
        yield run
    finally:
        with _stand_in_lock:
            _stand_ins = tuple(r for r in _stand_ins if r is not run)


def _standing_in(layer: nn.Module) -> bool:
    """Whether a run of pytorch_standing_in covers this call of `layer`."""
    return any(run.covers(layer) for run in _stand_ins)


#: What a Conv2dGw8 takes as padding, as its errors say.
PADDING_TAKEN = "padding of one or two ints, 'valid', or 'same' with odd kernel sizes"


def resolve_padding(padding: Any, kernel_size: Any, dilation: Any = 1) -> tuple[int, int] | None:
    """Padding as an (pad_h, pad_w) pair of ints, or None when it is not one.

    "valid" is (0, 0); "same" is ((r - 1) // 2, (s - 1) // 2) for odd filters at dilation 1 and
    None otherwise (PyTorch pads an even filter asymmetrically). An integer (an int or numpy's,
    not a bool), or a sequence of one or two, is both sides, as nn.Conv2d and F.conv2d take
    it; other lengths, other strings, bools and non-integers are None.
    """
    if isinstance(padding, str):  # first: `==` on an array of paddings is elementwise
        if padding == "valid":
            return (0, 0)
        r, s = _pair(kernel_size)
        if padding != "same" or _pair(dilation) != (1, 1) or r % 2 == 0 or s % 2 == 0:
            return None
        return ((r - 1) // 2, (s - 1) // 2)
    pad = _integers(padding)
    if pad is None or len(pad) not in (1, 2):
        return None
    return (pad[0], pad[-1])


def _integers(value: Any) -> tuple[int, ...] | None:
    """value as a tuple of ints, as nn.Conv2d takes a size (an integer, or a sequence of them,
    e.g. a tuple, a list or a numpy array), or None where it is not one. Integers are ints and
    what has __index__ (numpy's, 0-d integer tensors), not bools: F.conv2d refuses a bool
    stride, padding or dilation at every call, where nn.Conv2d took them at construction."""
    try:
        items = tuple(value) if isinstance(value, Iterable) else (value,)
    except TypeError:  # a 0-d tensor, which nn.Conv2d cannot take either
        return None
    ints = tuple(map(as_integer, items))
    return None if None in ints else ints  # type: ignore[return-value]


def type_problem(
    in_channels: Any,
    out_channels: Any,
    kernel_size: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
) -> str | None:
    """Why these nn.Conv2d arguments are of a type a Conv2dGw8 cannot take (a TypeError in its
    constructor), or None: sizes that are not integers or sequences of them (floats, even whole
    ones, bools, None, strings), padding that is neither those nor a string."""
    for name, value in (
        ("in_channels", in_channels),
        ("out_channels", out_channels),
        ("groups", groups),
    ):
        if as_integer(value) is None:
            return f"needs an integer {name}, got {value!r}"
    for name, value in (("kernel size", kernel_size), ("stride", stride), ("dilation", dilation)):
        if _integers(value) is None:
            return f"needs a {name} of an int or a pair of ints, got {value!r}"
    if not isinstance(padding, str) and _integers(padding) is None:
        return f"needs {PADDING_TAKEN}, got {padding!r}"
    return None


def ineligibility(
    in_channels: int,
    out_channels: int,
    kernel_size: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    padding_mode: str = "zeros",
) -> str | None:
    """Why an nn.Conv2d with these arguments cannot run spio's kernels, or None if it can
    (type_problem's reasons first)."""
    reason = type_problem(in_channels, out_channels, kernel_size, stride, padding, dilation, groups)
    if reason is not None:
        return reason
    size = _pair(kernel_size)
    if len(size) != 2:  # nn.Conv2d takes it, and fails at its first call
        return f"needs a kernel size of an int or a pair of ints, got {kernel_size!r}"
    r, s = size
    if groups < 1:
        return f"needs groups >= 1, got {groups}"
    if in_channels % groups or in_channels // groups != GROUP_WIDTH:
        return f"needs group width 8, got in_channels={in_channels}, groups={groups}"
    if out_channels != in_channels:
        return f"needs out_channels == in_channels, got {out_channels} != {in_channels}"
    # One value or two, as F.conv2d takes them (a sequence of one is both).
    for name, value in (("stride", stride), ("dilation", dilation)):
        ints = _integers(value)
        if ints is None or len(ints) not in (1, 2) or set(ints) != {1}:
            return f"needs {name} 1, got {_pair(value)}"
    if not (MIN_FILTER <= r <= MAX_FILTER and MIN_FILTER <= s <= MAX_FILTER):
        return f"needs a kernel size in {MIN_FILTER}..{MAX_FILTER}, got {(r, s)}"
    if padding_mode != "zeros":
        return f"needs padding_mode 'zeros', got {padding_mode!r}"
    pad = resolve_padding(padding, (r, s), dilation)
    if pad is None:
        return f"needs {PADDING_TAKEN}, got {padding!r} for kernel size {(r, s)}"
    if min(pad) < 0:
        return f"needs non-negative padding, got {pad}"
    return None


def module_ineligibility(module: nn.Module) -> str | None:
    """Why `module` cannot be replaced by a Conv2dGw8, or None if it can."""
    reason = fixed_ineligibility(module)
    if reason is not None:
        return reason
    assert isinstance(module, nn.Conv2d)  # exactly one (or a parametrized one): asked above
    return mendable_problem(module)


#: The nn.Conv2d arguments ineligibility judges (all but bias, device and dtype).
_CONV_ARGUMENTS = tuple(inspect.signature(ineligibility).parameters)


def conv_arguments(conv: nn.Conv2d) -> dict[str, Any]:
    """conv's nn.Conv2d constructor arguments but bias, device and dtype, as it holds them."""
    return {name: getattr(conv, name) for name in _CONV_ARGUMENTS}


def fixed_ineligibility(module: nn.Module) -> str | None:
    """Why `module` cannot be replaced by a Conv2dGw8 for a reason its user cannot mend (its
    class, its arguments, a forward set on the instance), or None. Asked first: a module's weight
    is read only where these allow (an uninitialised LazyConv2d's has no shape)."""
    if parametrize.type_before_parametrizations(module) is not nn.Conv2d:
        return f"is a {type(module).__name__}, not exactly nn.Conv2d"
    assert isinstance(module, nn.Conv2d)  # a parametrized one's class derives from nn.Conv2d
    reason = ineligibility(**conv_arguments(module))
    if reason is not None:
        return reason
    if "forward" in vars(module):
        return "has a forward of its own (set on the instance)"
    return None  # (hooks travel: _share_hooks)


def mendable_problem(conv: nn.Conv2d) -> str | None:
    """Why an otherwise eligible conv is kept for something its user can mend (transform warns
    of these), or None: a compile in place, or a weight that is not a whole Parameter."""
    return compiled_in_place(conv) or weight_problem(conv)


def compiled_in_place(module: nn.Module) -> str | None:
    """Why a module compiled in place (`module.compile(...)`) is kept, or None: its replacement
    would run uncompiled, and its compile options are not known to carry them over. A user can
    mend it (transform warns): transform first, then compile."""
    if getattr(module, "_compiled_call_impl", None) is None:
        return None
    return "was compiled in place (Module.compile): transform before compiling"


def weight_problem(conv: nn.Conv2d, undo: bool = False) -> str | None:
    """Why conv's weight keeps it from being replaced, or None: a weight that is not a
    Parameter, which a replacement could not share (torch.nn.utils.prune and the deprecated
    torch.nn.utils.weight_norm set a plain tensor at each call, as FullyShardedDataParallel with
    use_orig_params=False does), or a shard (_weight_shard). A user can mend either: transform
    warns of them. `undo`: the mend named is for untransform's replacement, not transform's."""
    if parametrize.is_parametrized(conv, "weight"):
        return None
    weight = conv._parameters.get("weight")
    if not isinstance(weight, nn.Parameter):
        return _weight_setter(conv, undo)
    return _weight_shard(conv, weight, undo)


def _weight_setter(conv: nn.Conv2d, undo: bool) -> str:
    """What sets conv's weight, a plain tensor, at each call, as far as its hooks tell, and
    the mend (for transform, or for untransform if `undo`)."""
    prune = sys.modules.get("torch.nn.utils.prune")  # none pruned before it is loaded
    # The deprecated reparametrizations (torch.nn.utils.<name>, hook class), and their mends.
    deprecated = (("weight_norm", "WeightNorm"), ("spectral_norm", "SpectralNorm"))
    for hook in conv._forward_pre_hooks.values():
        if prune is not None and isinstance(hook, prune.BasePruningMethod):
            mend = "prune.remove it first" if undo else "transform before pruning"
            return f"is pruned (torch.nn.utils.prune), its weight not a Parameter: {mend}"
        for name, kind in deprecated:
            module = sys.modules.get(f"torch.nn.utils.{name}")  # no such hook before it loads
            if module is not None and isinstance(hook, getattr(module, kind)):
                mend = (
                    f"remove it first (torch.nn.utils.remove_{name})"
                    if undo
                    else f"use torch.nn.utils.parametrizations.{name}"
                )
                return (
                    "has a weight that is neither a Parameter nor parametrized: the deprecated "
                    f"torch.nn.utils.{name} ({mend})"
                )
    return (
        "has a weight that is neither a Parameter nor parametrized: a model already wrapped "
        f"in FSDP? ({_before_wrapping(undo)})"
    )


def _before_wrapping(undo: bool) -> str:
    return f"{'untransform' if undo else 'transform'} the model before wrapping it"


def _weight_shard(conv: nn.Conv2d, weight: nn.Parameter, undo: bool) -> str | None:
    """Why conv's weight Parameter (not parametrized) is a shard, or None if it is whole. A
    wrapper that shards parameters (FSDP1's FullyShardedDataParallel, FSDP2's fully_shard on an
    ancestor) keeps a shard in the module between calls and swaps the full weight in at each
    call, on this module object: a module put in its place would keep the shard (a 1-D view, or
    a DTensor) and fail.
    `undo`: the mend named is for untransform's replacement."""
    if is_lazy(weight):
        return None  # (an uninitialised weight has no shape yet)
    dtensor = sys.modules.get("torch.distributed.tensor")  # no DTensor before it is loaded
    if dtensor is not None and isinstance(weight, dtensor.DTensor):
        return (
            "has a DTensor weight, a shard (a model already wrapped in FSDP's fully_shard?): "
            + _before_wrapping(undo)
        )
    if weight.dim() != 4:  # FSDP1's shards are 1-D views of its flat parameter
        expected = (conv.out_channels, conv.in_channels // conv.groups, *conv.kernel_size)
        return (
            f"has a weight of shape {tuple(weight.shape)}, not {expected}, a shard (a model "
            f"already wrapped in FullyShardedDataParallel?): {_before_wrapping(undo)}"
        )
    return None  # (a whole weight of another shape is the layer's to run, as nn.Conv2d runs it)


def restore_problem(conv: nn.Conv2d) -> str | None:
    """Why conv (a Conv2dGw8) cannot be given back as a plain nn.Conv2d, or None: a subclass (its
    own forward or attributes would be lost), a forward set on the instance (it calls this
    module: the nn.Conv2d would still run spio), or its weight (weight_problem)."""
    if "forward" in vars(conv):
        return (
            "has a forward of its own (set on the instance, e.g. by accelerate's hooks), which "
            "calls this layer: remove it first"
        )
    # (The weight first: FSDP2's fully_shard on the layer itself makes it a subclass, and its
    # DTensor weight says what to do.)
    problem = weight_problem(conv, undo=True)
    kind = parametrize.type_before_parametrizations(conv)
    if problem is None and kind is not Conv2dGw8:
        return (
            f"is a {kind.__name__}, a subclass of Conv2dGw8: an nn.Conv2d in its place would "
            "lose what the subclass adds"
        )
    return problem


def _bind_conv2d_args(args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = inspect.signature(nn.Conv2d.__init__).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return dict(list(bound.arguments.items())[1:])


def _log_fallback_once(reason: str) -> bool:
    """Log why a Conv2dGw8 call runs F.conv2d, once per reason. Under torch.compile it runs
    when the call is traced (below), so a compiled model says why too and stays one graph."""
    if reason not in _logged_fallbacks:
        _logged_fallbacks.add(reason)
        logger.warning("Conv2dGw8 falls back to F.conv2d: %s", reason)
    return True


# What torch.compiler.assume_constant_result(_log_fallback_once) does: Dynamo calls the function
# while tracing and keeps its result as a constant, instead of tracing a logging call, which
# breaks the graph (and fails fullgraph=True). Set directly, as the public function imports
# torch._dynamo, which would add a second to importing spio.
_log_fallback_once._dynamo_marked_constant = True  # type: ignore[attr-defined]


class Conv2dGw8(nn.Conv2d):
    """nn.Conv2d (same arguments, Parameters and state_dict) that runs spio's grouped conv.

    Only group width 8, out_channels == in_channels, stride 1, dilation 1, kernel 1..5,
    zeros padding: other arguments raise a ValueError naming the constraint, and arguments of a
    type it cannot take (a float, a bool, None or a string for a size) a TypeError naming the
    argument (make_conv2d gives a plain nn.Conv2d for them instead). Inputs the op cannot
    take (where the kernels run, on CUDA or on the CPU with SPIO_EMULATE=1: fp32 outside
    autocast, and float64; anywhere: float64 under autocast, integer tensors), inputs on a GPU
    spio builds no kernels for (e.g. a T4, sm_75), and calls under torch.func.grad or jvp or
    with forward-mode AD tangents fall back to F.conv2d, logging the reason once; so does a
    layer whose stride, dilation, groups or padding_mode, or whose weight's filter size, were set
    after construction to values spio cannot run (nn.Conv2d's forward reads them at each call;
    "same" pads by the weight's filter size, as F.conv2d does). On the CPU without
    SPIO_EMULATE, fp32 and float64 inputs outside autocast run PyTorch's convolution, as the op
    does there, without a message.

    `spio_passes` names the passes that run spio's kernels, of "fprop", "dgrad" and "wgrad" (all
    by default); the others run PyTorch's convolution (cuDNN on a GPU), e.g. where cuDNN's WGrad
    is faster (spio.transform.where_faster measures that per pass).
    """

    __jit_unused_properties__ = ["spio_passes"]  # TorchScript: not part of a scripted layer
    # Nor are these (the eager path's; a class annotation TorchScript cannot read).
    __jit_ignored_attributes__ = ["_spio_padding_size", "_spio_eligible_shape"]

    def __init__(  # nn.Conv2d's arguments, spelled out: skip_init and help() read them
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: Literal["zeros", "reflect", "replicate", "circular"] = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        args = (in_channels, out_channels, kernel_size, stride, padding, dilation, groups)
        reason = type_problem(*args)
        if reason is not None:
            raise TypeError(f"Conv2dGw8 {reason}")
        reason = ineligibility(*args, padding_mode)
        if reason is not None:
            raise ValueError(f"Conv2dGw8 {reason}")
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
            padding_mode=padding_mode,
            device=device,
            dtype=dtype,
        )
        self._pass_bits = ALL_PASSES
        self._spio_padding_of: Any = None
        self._spio_padding = self._padding_ints(self.weight)
        self._spio_eligible_shape = tuple(self.weight.shape)

    # The filter size "same" was last resolved for (_padding_ints), and the weight's shape last
    # found eligible (_ineligibility_now); here too for layers pickled before they were kept.
    _spio_padding_size: tuple[int, ...] = ()
    _spio_eligible_shape: tuple[int, ...] = ()

    def _padding_ints(self, weight: Tensor) -> tuple[int, int]:
        """The (pad_h, pad_w) the kernels take for `weight` (the layer's, as its call reads it).
        `padding` stays as given ("same", "valid" or ints), as nn.Conv2d keeps it, so that repr
        and untransform give it back; these ints are resolved from it again whenever it was set
        anew, and "same" whenever the weight's filter size changed (F.conv2d pads by it: a
        weight of another size set after construction leaves kernel_size as it was)."""
        if self.padding is not self._spio_padding_of or (
            isinstance(self.padding, str) and self._filter_size(weight) != self._spio_padding_size
        ):
            size = self._filter_size(weight)
            pad = resolve_padding(self.padding, size, self.dilation)
            if pad is None:  # set after construction: the constructor's error
                wrong_type = not isinstance(self.padding, str) and _integers(self.padding) is None
                raise (TypeError if wrong_type else ValueError)(
                    f"Conv2dGw8 needs {PADDING_TAKEN}, got {self.padding!r} for kernel size {size}"
                )
            if torch.compiler.is_compiling():  # Dynamo's `is` holds for no tuple: no store
                return pad  # to replay after every call (strict torch.export warns of one)
            self._spio_padding, self._spio_padding_of = pad, self.padding
            self._spio_padding_size = size
        return self._spio_padding

    def __prepare_scriptable__(self) -> Conv2dGw8:
        """torch.jit.script calls this first: the scripted branch of forward reads
        _spio_padding as it stands then, and runs the op, which takes stride 1 and dilation 1
        whatever the layer's attributes say (ValueError where they were set to others)."""
        weight = self.weight
        reason = self._ineligibility_now(weight)
        if reason is not None:
            raise ValueError(
                f"Conv2dGw8 {reason}: a scripted layer runs spio's op, which cannot; script "
                "its .to_torch_module() instead"
            )
        self._padding_ints(weight)
        return self

    def _filter_size(self, weight: Tensor) -> tuple[int, ...]:
        """The filter size of `weight` (R, S), as F.conv2d reads it; kernel_size where
        torch.fx.symbolic_trace gives a Proxy for the weight, whose shape it cannot branch on."""
        if isinstance(weight, Proxy):
            return self.kernel_size
        return tuple(weight.shape[-2:])

    def _ineligibility_now(self, weight: Tensor | None = None) -> str | None:
        """Why the layer's stride, dilation, groups, padding or padding_mode, or its weight's
        filter size (`weight`: the layer's, as its call reads it), set after construction (as
        nn.Conv2d allows: its forward reads them at each call), are ones spio's kernels cannot
        run, or None. Cheap while they are as constructed. A padding counts only where
        nn.Conv2d runs it ("same" on an even filter); one neither can take (negative, floats,
        three values) is the kernels' to refuse (_padding_ints, the op's checks), with a clearer
        error than nn.Conv2d's."""
        weight = self.weight if weight is None else weight
        if (
            self.padding is self._spio_padding_of
            and (isinstance(weight, Proxy) or weight.shape == self._spio_eligible_shape)
            and self.stride == (1, 1)
            and self.dilation == (1, 1)
            and self.padding_mode == "zeros"
            and self.groups * GROUP_WIDTH == self.in_channels
        ):
            return None
        padding = "same" if isinstance(self.padding, str) and self.padding == "same" else 0
        channels = (self.in_channels, self.out_channels)
        if not isinstance(weight, Proxy):  # (the channels F.conv2d reads from the weight)
            if weight.dim() != 4:  # (F.conv2d then says what is wrong, as nn.Conv2d's does)
                return f"has a weight of {weight.dim()} dims, not 4"
            channels = (weight.shape[1] * self.groups, weight.shape[0])
        reason = ineligibility(
            *channels,
            self._filter_size(weight),
            self.stride,
            padding,
            self.dilation,
            self.groups,
            self.padding_mode,
        )
        if reason is not None:
            return f"{reason} (set after construction)"
        if not isinstance(weight, Proxy) and not torch.compiler.is_compiling():
            self._spio_eligible_shape = tuple(weight.shape)  # (no store for Dynamo to replay)
        return None

    @property
    def spio_passes(self) -> tuple[str, ...]:
        """The passes that run spio's kernels ("fprop", "dgrad", "wgrad"); the others PyTorch's.
        Set it to True (every pass) or False (none), as transform's `include` answers, to pass
        names (one or several), or to the op's bits (FProp 1, DGrad 2, WGrad 4). numpy's bool
        and a 0-d bool tensor count as bools."""
        return pass_names(self._pass_bits)

    @spio_passes.setter
    def spio_passes(self, passes: bool | int | Iterable[str]) -> None:
        self._pass_bits = pass_mask_or_flag(
            passes,
            f"Conv2dGw8.spio_passes must be True, False, pass names among {PASSES} or "
            f"bits 0..{ALL_PASSES}",
        )

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self._pass_bits != ALL_PASSES:
            text += f", spio_passes={self.spio_passes}"
        return text

    @classmethod
    def make(cls, *args: Any, **kwargs: Any) -> nn.Conv2d:
        """A Conv2dGw8 when nn.Conv2d(*args, **kwargs) is eligible, else that nn.Conv2d."""
        arguments = _bind_conv2d_args(args, kwargs)
        reason = ineligibility(**{k: arguments[k] for k in _CONV_ARGUMENTS})
        if reason is not None:
            logger.debug("make_conv2d keeps nn.Conv2d: %s", reason)
            return nn.Conv2d(**arguments)
        return cls(**arguments)

    @staticmethod
    def match(module: nn.Module) -> TypeGuard[nn.Conv2d]:
        """True when module is exactly an nn.Conv2d that spio can run (subclasses never match;
        one parametrized by torch.nn.utils.parametrize, e.g. weight_norm, does)."""
        return module_ineligibility(module) is None

    @classmethod
    def from_torch_module(
        cls, module: nn.Conv2d, passes: bool | int | Iterable[str] = PASSES
    ) -> Conv2dGw8:
        """A Conv2dGw8 computing the same function, sharing module's Parameters (not copies),
        buffers, submodules (parametrizations included) and hooks (the same dicts: handles
        taken on module still remove them), running spio's kernels for `passes` (see
        spio_passes). ValueError, naming why, when module is an nn.Conv2d that `match` does not
        accept; TypeError when it is no nn.Conv2d at all."""
        if not isinstance(module, nn.Conv2d):
            raise TypeError(
                f"Conv2dGw8.from_torch_module needs an nn.Conv2d, got {type(module).__name__}"
            )
        reason = module_ineligibility(module)
        if reason is not None:
            raise ValueError(f"Conv2dGw8.from_torch_module: the module {reason}")
        bits = pass_mask_or_flag(
            passes,
            f"Conv2dGw8.from_torch_module needs passes True, False, pass names among {PASSES} "
            f"or bits 0..{ALL_PASSES}",
        )
        new = _sharing(cls, module)
        new.spio_passes = bits
        return new

    def to_torch_module(self) -> nn.Conv2d:
        """A plain nn.Conv2d computing the same function, sharing this module's Parameters,
        buffers, submodules (parametrizations included) and hooks (the inverse of
        from_torch_module). Not compiled, if this module was compiled in place. ValueError,
        naming why, where it cannot be (restore_problem)."""
        reason = restore_problem(self)
        if reason is not None:
            raise ValueError(f"Conv2dGw8.to_torch_module: the module {reason}")
        return _sharing(nn.Conv2d, self)

    def forward(self, input: Tensor) -> Tensor:
        """nn.Conv2d's output for input (N, C, H, W) or (C, H, W): by spio's kernels where they
        run, in input's memory format; by F.conv2d where they cannot (see the class docstring)."""
        if torch.jit.is_scripting():  # TorchScript compiles this branch alone: the op, 4-D input
            pad_h, pad_w = self._spio_padding
            return torch.ops.spio.conv2d_gw8(
                input, self.weight, self.bias, 1, pad_h, pad_w, 1, self.groups, self._pass_bits
            )
        weight = self.weight  # (once: a parametrized layer computes it at each read)
        reason = self._ineligibility_now(weight)
        if reason is not None:  # nn.Conv2d's forward, which reads them
            y = _with_fp32_bias(self._conv_forward, input, weight, self.bias)
            _log_fallback_once(f"the layer {reason}")
            return y
        passes = self._pass_bits
        # (pytorch_standing_in; not while torch.compile traces, which would guard on _stand_ins
        # and recompile when a precompile runs in another thread)
        if not torch.compiler.is_compiling() and _stand_ins and _standing_in(self):
            passes = 0
        return conv2d_gw8_layer(
            input, weight, self.bias, self._padding_ints(weight), self.groups, passes
        )

    def _kernel_operands(
        self, input: Tensor, weight: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None, tuple[int, int]]:
        """(x, weight, bias, padding) as a call on `input` gives them to the kernels: a batch
        of one for a 3-D input, cast as autocast casts them; `weight` the layer's as read once."""
        x = input.unsqueeze(0) if input.dim() == 3 else input
        x, cast_weight, bias = autocast_operands(x, weight, self.bias)
        return x, cast_weight, bias, self._padding_ints(weight)

    def _why_no_kernels(self, input: Tensor) -> str:
        """Why a call on `input` for which spio_kernels found none launches no spio kernel,
        for spio.precompile's warning: the device, the fallback's reason, or the passes."""
        kernels, reason = _route(input, self.weight, self.bias)
        if not kernels:
            if input.device.type == "cpu":
                return "CPU tensors without SPIO_EMULATE=1 (PyTorch's convolution runs them)"
            return f"{input.device.type} tensors (PyTorch's convolution runs them)"
        if not self._pass_bits:
            return "every pass left to PyTorch (spio_passes is empty)"
        ineligible = self._ineligibility_now(self.weight)
        if reason is not None or ineligible is not None:
            return f"a fallback to F.conv2d: {reason or f'the layer {ineligible}'}"
        x, weight, bias, padding = self._kernel_operands(input, self.weight)
        if isinstance(_kernels.layer(x, weight, bias, *padding), _kernels._TorchLayer):
            return (
                "an empty batch, or one image's tensors past the kernels' limit (PyTorch's "
                "convolution runs the layer)"
            )
        return (
            "no pass the call runs left to spio (spio_passes; under deterministic algorithms, "
            "a WGrad whose partial sums fit in no config's limit runs PyTorch's)"
        )

    def spio_kernels(
        self, input: Tensor, backward: bool | None = None, double_backward: bool = False
    ) -> list[Kernel]:
        """The kernels a call of this layer on `input` launches, chosen as that call chooses
        them (chosen, not built; see spio.precompile): none where it falls back to F.conv2d or
        input's device runs no kernels; FProp if spio runs it; and DGrad and WGrad if spio runs
        them and the backward will ask for their gradients. `backward`: None, as autograd
        stands now (grad mode, and what requires grad); False, no backward; True, the backward
        of a training step: also where autograd is off now (e.g. in a reentrant checkpoint's
        forward, which the backward runs again with autograd), with DGrad then, and WGrad for
        the parameters that require grad. `double_backward`: with a backward, also the kernels
        of a backward through it (create_graph=True, e.g. a gradient penalty). Raises the call's
        ValueError for bad arguments."""
        own_weight = self.weight
        kernels, reason = _route(input, own_weight, self.bias)
        if not kernels or reason is not None or self._ineligibility_now(own_weight) is not None:
            return []
        x, weight, bias, padding = self._kernel_operands(input, own_weight)
        layer = _kernels.layer(x, weight, bias, *padding)
        grad = torch.is_grad_enabled() if backward is None else backward
        # Gradients autograd cannot show now (a bool: `needs` holds bools).
        assumed = bool(backward) and not torch.is_grad_enabled()
        needs = (  # the operands as given: an autocast cast without autograd requires none
            grad and (input.requires_grad or assumed),
            grad and own_weight.requires_grad,
            grad and self.bias is not None and self.bias.requires_grad,
        )
        deterministic = torch.are_deterministic_algorithms_enabled()
        found = layer.kernels(weight, bias, self._pass_bits, needs, deterministic)
        if double_backward and grad:
            # A backward through the backward (create_graph=True) runs the passes again on
            # gradients, without a bias: FProp of them, DGrad, and WGrad with the weight's.
            plain = _kernels.layer(x, weight, None, *padding)
            found += plain.kernels(
                weight, None, self._pass_bits, (True, True, False), deterministic
            )
        return found


def _unsupported(input: Tensor, weight: Tensor, bias: Tensor | None, kernels: bool) -> str | None:
    """Why the spio op cannot take this input (so the layer uses F.conv2d), or None.
    `kernels`: whether input's device runs spio's kernels (uses_kernels)."""
    if input.dim() not in (3, 4):
        return f"input is {input.dim()}-D"
    if not input.is_floating_point():
        return f"input is {input.dtype}"
    if input.device != weight.device:
        return f"input on {input.device}, weight on {weight.device}"
    if kernels:
        problem = device_problem(input.device)
        if problem is not None:
            return problem
    dtype = autocast_dtype(input.device.type)
    if dtype is not None:
        if torch.float64 in (input.dtype, weight.dtype, getattr(bias, "dtype", None)):
            return (
                "float64 tensors under autocast (which leaves float64 as it is: convert the "
                "model and its inputs to float32 for autocast to cast them)"
            )
        if kernels and dtype not in KERNEL_DTYPES:
            return f"autocast to {dtype} (spio's kernels take {_HALF_NAMES}: autocast to one)"
        return None
    if input.dtype != weight.dtype:
        return f"input {input.dtype} and weight {weight.dtype} differ"
    if bias is not None and bias.dtype not in (input.dtype, torch.float32):
        return f"bias {bias.dtype} with input {input.dtype}"
    if kernels and input.dtype not in KERNEL_DTYPES:
        if torch.float64 in (input.dtype, weight.dtype):
            mend = (
                ", and autocast leaves float64 as it is: convert the model with .half() or "
                ".bfloat16(), or to float32 and run it under torch.autocast"
            )
        else:
            mend = ": run the model under torch.autocast, or convert it with .half() or .bfloat16()"
        return (
            f"{input.dtype} {input.device.type} tensors outside autocast (spio's kernels take "
            f"{_HALF_NAMES}{mend})"
        )
    return None


#: The dtypes spio's kernels take, as the fallback's reasons name them.
_HALF_NAMES = "torch.float16 and torch.bfloat16"


def _with_fp32_bias(
    conv: Callable[[Tensor, Tensor, Tensor | None], Tensor],
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
) -> Tensor:
    """conv(input, weight, bias) where a layer falls back to PyTorch's convolution. A half layer
    may hold an fp32 bias, which spio's kernels add in fp32 and F.conv2d refuses beside half
    operands: there the bias is added in fp32 to the convolution without it, so that it is not
    rounded to half first and its gradient is summed in fp32 (as by spio's WGrad; a half sum
    overflowed); the sum is rounded to half once more than by the kernels, whose convolution is
    not rounded before the bias is added. Any other bias (or one of another shape than the
    output channels') goes to conv as it is: autocast casts it itself, and a mismatch is conv's
    to refuse, as nn.Conv2d's."""
    if (
        bias is None
        or bias.dtype != torch.float32
        or tuple(bias.shape) != (weight.shape[0],)
        or input.dtype not in KERNEL_DTYPES
        or weight.dtype != input.dtype
        or autocast_dtype(input.device.type) is not None
    ):
        return conv(input, weight, bias)
    return _kernels.plus_fp32_bias(conv(input, weight, None), bias, input.dtype)


def _route(input: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[bool, str | None]:
    """(whether input's device runs spio's kernels, why the call falls back to F.conv2d or
    None): where a Conv2dGw8 call goes, for conv2d_gw8_layer and spio_kernels alike. An input
    that is not a tensor is a TypeError naming it, as in nn.Conv2d."""
    check_tensors(input, weight, bias)
    kernels = input.is_cuda or uses_kernels(input.device)
    reason = _unsupported(input, weight, bias, kernels) or derivative_transform(input, weight, bias)
    return kernels, reason


def conv2d_gw8_layer(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    padding: tuple[int, int],
    groups: int,
    passes: int,
) -> Tensor:
    """What a Conv2dGw8 computes: spio's kernels (without the custom op's dispatch in plain
    eager mode; see eager_path_applies), or F.conv2d where they cannot run, logging why once.

    A function of tensors and plain values, wrapped for torch.fx (below), so that
    torch.fx.symbolic_trace records a Conv2dGw8 call as one node, as it records an nn.Conv2d,
    instead of tracing into checks that branch on tensor properties.
    """
    kernels, reason = _route(input, weight, bias)
    if reason is not None:
        y = _with_fp32_bias(
            lambda x, w, b: F.conv2d(x, w, b, 1, padding, 1, groups), input, weight, bias
        )
        _log_fallback_once(reason)  # after: an input F.conv2d rejects too gets its error alone
        return y
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    pad_h, pad_w = padding
    if kernels and eager_path_applies(x, weight, bias):
        y = conv2d_gw8_eager(x, weight, bias, pad_h, pad_w, passes, 1, 1, groups)  # no dispatch
    elif not kernels and _reference_applies(x, weight, bias):
        # What the op runs on this device (PyTorch's convolution), called directly: autograd is
        # PyTorch's own, with no op dispatch, and the gradients are the op's (in fp32 and
        # float64 the op too computes them in the input's dtype).
        check_args(x, weight, bias, 1, pad_h, pad_w, 1, groups)
        y = _kernels.torch_fprop(x, weight, bias, padding).contiguous(
            memory_format=conv_format(x, weight)
        )
    else:
        y = op_or_export(x, weight, bias, 1, pad_h, pad_w, 1, groups, passes)
    return y.squeeze(0) if unbatched else y


torch.fx.wrap("conv2d_gw8_layer")


def _reference_applies(input: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether a call on a device without spio's kernels may run PyTorch's convolution itself
    rather than through the custom op: fp32 or float64 outside autocast (the op computes half
    precision's weight and bias gradients in fp32, and casts the bias to fp32 under autocast,
    which a direct call would not), where the eager path may skip the op at all."""
    return (
        input.dtype in _FULL
        and autocast_dtype(input.device.type) is None
        and eager_path_applies(input, weight, bias)
    )


def _sharing(cls: type[_Conv], module: nn.Conv2d) -> _Conv:
    """A `cls` with module's hyperparameters, training mode, and Parameters, buffers and
    submodules (the same objects, not copies): weight and bias, and any a user or library added,
    so that state_dict keys and what an optimizer holds stay as they were."""
    new = cls(**conv_arguments(module), bias=module.bias is not None, device="meta")
    for name, parameter in module._parameters.items():  # weight, bias (maybe None), any added
        new.register_parameter(name, parameter)
    if parametrize.is_parametrized(module):
        # torch.nn.utils.parametrize: each parametrized tensor (weight, say) is a property of the
        # module's own class, computed from module.parametrizations (a submodule, shared below
        # with the others). `new` gets a class of the same kind over cls, and no Parameter of
        # that name (the property would hide the meta one cls made, but not from state_dict).
        # Ignore: nn.Module.__getattr__ is typed Tensor | Module; parametrize made this
        # attribute a ModuleDict, whose keys are the parametrized tensors' names.
        for name in module.parametrizations:  # type: ignore[union-attr]
            new._parameters.pop(name, None)
        new.__class__ = _parametrized_class(cls, type(module))
    for name, buffer in module._buffers.items():
        persistent = name not in module._non_persistent_buffers_set
        new.register_buffer(name, buffer, persistent=persistent)
    for name, child in module._modules.items():
        new.add_module(name, child)
    new.train(module.training)
    # Attributes a user or library set on the module (e.g. a tag); not Conv2dGw8's own, nor a
    # compile in place (Module.compile), which compiled a call of `module` itself.
    for name, value in vars(module).items():
        if name not in vars(new) and name not in (
            "_pass_bits",
            "_spio_padding",
            "_spio_padding_of",
            "_spio_padding_size",
            "_spio_eligible_shape",
            "_compiled_call_impl",
        ):
            setattr(new, name, value)
    _share_hooks(new, module)
    return new


def _parametrized_class(cls: type[nn.Conv2d], parametrized: type[nn.Module]) -> type:
    """A class over cls with the properties and methods parametrize gave `parametrized` (as
    parametrize.register_parametrization builds one: "Parametrized" + the name, one base)."""
    own = {k: v for k, v in vars(parametrized).items() if k not in ("__dict__", "__weakref__")}
    return type(f"Parametrized{cls.__name__}", (cls,), own)


class _FirstAlive:
    """What a module-receiving hook holds for its module (weakref.ref(module) in torch's
    _WrappedHook) when two modules share it: the first while it lives, then the second."""

    def __init__(self, first: nn.Module | None, second: nn.Module | None) -> None:
        self._refs = tuple(None if m is None else weakref.ref(m) for m in (first, second))

    def modules(self) -> tuple[nn.Module | None, nn.Module | None]:
        """Both modules, None for one that is gone."""
        first, second = (None if ref is None else ref() for ref in self._refs)
        return first, second

    def __call__(self) -> nn.Module | None:
        first, second = self.modules()
        return first if first is not None else second


class _SharedModuleHook(_WrappedHook):
    """A module-receiving hook two modules share (_share_hooks), receiving _FirstAlive's module.
    A copy or pickle keeps both modules, so that it resolves to the copies of those copied with
    it: torch's hook kept the first alone, and a copy of the second (the layer, copied while the
    conv it was made from lives) got a copy of the first that nothing held, "a dead Module"."""

    def __getstate__(self) -> dict:
        shared: Any = self.module  # (a _FirstAlive, where torch's class keeps a weakref)
        return {"hook": self.hook, "with_module": True, "modules": shared.modules()}

    def __setstate__(self, state: dict) -> None:
        self.hook = state["hook"]
        self.with_module = True
        self.module = _FirstAlive(*state["modules"])  # type: ignore[assignment]


def _share_hooks(new: nn.Module, module: nn.Module) -> None:
    """Give `new` module's hooks (forward, backward, state_dict, load_state_dict, of every kind):
    the same dicts, not copies, so that the handles a user holds still remove them. A hook
    registered to receive the module (register_load_state_dict_pre_hook) receives `module`
    while it lives, then `new` (a conversion whose result takes module's place, as a user's
    `model.conv = Conv2dGw8.from_torch_module(model.conv)`); `receive_hooks` makes it `new` at
    once where new has taken module's place (transform, untransform)."""
    for name, value in vars(module).items():
        if "hook" not in name:
            continue
        vars(new)[name] = value  # the dicts, and _is_full_backward_hook (a flag)
    for hook in _module_hooks(module):
        if hook.module() is module:
            hook.module = _FirstAlive(module, new)
            hook.__class__ = _SharedModuleHook  # (in place: the dicts' entries stay the same)


def _module_hooks(module: nn.Module) -> list:
    """module's hooks that receive a module (torch's _WrappedHook with with_module)."""
    dicts = [value for name, value in vars(module).items() if "hook" in name]
    return [
        hook
        for value in dicts
        if isinstance(value, dict)
        for hook in value.values()
        if getattr(hook, "with_module", False)
    ]


def receive_hooks(new: nn.Module, old: nn.Module) -> None:
    """`new` has taken the place of `old`, whose hooks it shares (from_torch_module,
    to_torch_module): the hooks that received `old` receive `new` from now on."""
    for hook in _module_hooks(new):
        if hook.module() in (old, new):
            hook.module = weakref.ref(new)
            if isinstance(hook, _SharedModuleHook):
                hook.__class__ = _WrappedHook  # type: ignore[assignment]


def make_conv2d(*args: Any, **kwargs: Any) -> nn.Conv2d:
    """nn.Conv2d(*args, **kwargs), as a Conv2dGw8 when spio can run it."""
    return Conv2dGw8.make(*args, **kwargs)
