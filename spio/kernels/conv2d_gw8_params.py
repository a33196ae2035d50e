"""Layer parameters of the group-width-8, stride-1 2-D convolution, shared by all three passes.

Importing this module does not import torch; only `Conv2dGw8Params.from_tensors` needs it.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor

#: Channels per group: the k-depth of the m16n8k8 tensor-core instruction.
GROUP_WIDTH = 8

#: Smallest and largest filter height / width the kernels support.
MIN_FILTER, MAX_FILTER = 1, 5

#: Activation dtypes the kernels take, by short name.
DTYPES = ("fp16", "bf16")
#: Bytes per element: activations and weights in fp16/bf16; bias and weight gradient in fp32.
ACTIVATION_BYTES = 2
FP32_BYTES = 4
#: The largest activation tensor a kernel takes, in bytes: the kernels index with C++ ints.
#: spio.functional runs larger batches in chunks of images.
MAX_TENSOR_BYTES = 2**31 - 1

# Numbers as encode writes them (ASCII digits, no leading zeros), so that decoding a name and
# encoding it again gives the same name.
_INT = "0|[1-9][0-9]*"
_ENCODED = re.compile(
    rf"n(?P<n>{_INT})_c(?P<c>{_INT})_h(?P<h>{_INT})_w(?P<w>{_INT})_pad(?P<ph>{_INT})x(?P<pw>{_INT})"
    rf"_r(?P<r>{_INT})_s(?P<s>{_INT})_bias(?P<bias>[01])_(?P<dtype>fp16|bf16)"
)


def as_integer(value: Any) -> int | None:
    """value as an int where it is an integer (an int, or what has __index__: numpy's, a 0-d
    integer tensor), not a bool; else None. The one rule of spio's public API for an int
    argument: another value is a TypeError naming it."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or _bool_typed(value):
        return None  # (a bool tensor's __index__ answers 0 or 1)
    if getattr(value, "ndim", 0) != 0:
        return None  # (a one-element tensor's __index__ answers its element)
    try:
        return operator.index(value)
    except TypeError:
        return None


def _bool_typed(value: Any) -> bool:
    """Whether value is a numpy or torch bool (a scalar or an array of them)."""
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def as_bool(value: Any) -> bool | None:
    """value as a bool where it is one: a bool, numpy's, or a 0-d bool tensor; else None."""
    if type(value) is bool:
        return value
    if _bool_typed(value) and getattr(value, "ndim", 1) == 0:
        return bool(value)
    return None


def as_flag(where: str, name: str, value: Any, allowed: str = "True or False") -> bool:
    """value as a plain bool (as_bool); else TypeError naming `where`, the argument, what it
    takes (`allowed`) and the value."""
    flag = as_bool(value)
    if flag is None:
        raise TypeError(f"{where} needs {name} {allowed}, got {value!r}")
    return flag


def check_tensor_arguments(where: str, optional: tuple[str, ...] = (), **tensors: Any) -> None:
    """TypeError naming `where` and the first of `tensors` that is not a tensor (those named in
    `optional` may be None). Imports torch only when called."""
    import torch

    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) and not (name in optional and t is None):
            kind = "a tensor or None" if name in optional else "a tensor"
            raise TypeError(f"{where} needs {name} to be {kind}, got {type(t).__name__}")


def _as_bool(value: Any) -> bool | None:
    """value as a bool where it is one (as_bool), or an integer 0 or 1 (as has_bias has always
    taken them; numpy's and a 0-d tensor's too, as every int field takes them: as_integer);
    else None."""
    flag = as_bool(value)
    if flag is None and as_integer(value) in (0, 1):
        flag = bool(as_integer(value))
    return flag


def check_params(params: Any, where: str) -> None:
    """TypeError naming `where` for a params argument that is not a Conv2dGw8Params (a tuple,
    an encoded name: decode one first)."""
    if not isinstance(params, Conv2dGw8Params):
        hint = " (Conv2dGw8Params.decode reads an encoded name)" if isinstance(params, str) else ""
        raise TypeError(f"{where} needs a Conv2dGw8Params, got {params!r}{hint}")


def _as_int(name: str, value: Any) -> int:
    """Return value as an int (as_integer); TypeError naming the argument for bools, floats
    (even whole ones) and other non-integers."""
    integer = as_integer(value)
    if integer is None:
        raise TypeError(f"Conv2dGw8Params needs an integer {name}, got {value!r}")
    return integer


def _as_padding(padding: Any) -> tuple[int, int]:
    """Normalise an int or a (pad_h, pad_w) pair to a pair of ints."""
    if isinstance(padding, (tuple, list)):
        if len(padding) != 2:
            raise ValueError(f"Conv2dGw8Params needs padding as an int or a pair, got {padding!r}")
        return (_as_int("padding", padding[0]), _as_int("padding", padding[1]))
    pad = _as_int("padding", padding)
    return (pad, pad)


def dtype_name(dtype: Any) -> str:
    """Return "fp16" or "bf16" for a torch dtype or a short name; ValueError for anything else."""
    names = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"} | {n: n for n in DTYPES}
    key = str(dtype).removeprefix("torch.")
    if key not in names:
        raise ValueError(f"conv2d_gw8 needs dtype fp16 or bf16, got {dtype}")
    return names[key]


@functools.cache
def torch_dtype(name: str):
    """The torch dtype of a layer dtype name ("fp16" or "bf16"; KeyError for another). torch is
    imported at the first call: this module stays importable without it."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


@dataclass(frozen=True)
class Conv2dGw8Params:
    """Shape of one grouped convolution: group width 8, stride 1, dilation 1, C == K.

    Tensors are NCHW-shaped as in PyTorch: input (n, c, h, w), weight (c, 8, r, s),
    output (n, c, p, q). `padding` is an int or a (pad_h, pad_w) pair; it is stored as a pair.
    `dtype` is "fp16" or "bf16", or a torch dtype or name for one ("float16", "bfloat16",
    "half"); it is stored as the short name.
    """

    n: int
    c: int
    h: int
    w: int
    padding: tuple[int, int] = field(default=(1, 1))
    r: int = 3
    s: int = 3
    has_bias: bool = False
    dtype: str = "fp16"

    if TYPE_CHECKING:
        # The constructor as type checkers should see it: it takes padding and dtype in more
        # forms than the fields hold after __post_init__ normalises them, and a dataclass
        # cannot annotate the two apart. Only type checkers read this: at run time the dataclass
        # generates __init__ from the fields above (same names, order and defaults).
        def __init__(
            self,
            n: int,
            c: int,
            h: int,
            w: int,
            padding: int | tuple[int, int] = (1, 1),
            r: int = 3,
            s: int = 3,
            has_bias: bool = False,
            dtype: str | torch.dtype = "fp16",
        ) -> None: ...

    def __post_init__(self) -> None:
        for name in ("n", "c", "h", "w", "r", "s"):
            object.__setattr__(self, name, _as_int(name, getattr(self, name)))
        object.__setattr__(self, "padding", _as_padding(self.padding))
        has_bias = _as_bool(self.has_bias)
        if has_bias is None:
            integer = as_integer(self.has_bias)
            error = ValueError if integer is not None else TypeError  # 2, or "yes"
            raise error(f"Conv2dGw8Params needs has_bias True or False, got {self.has_bias!r}")
        object.__setattr__(self, "has_bias", has_bias)
        try:
            object.__setattr__(self, "dtype", dtype_name(self.dtype))
        except ValueError:
            # A name or a torch dtype of another precision is a bad value; anything else
            # (None, a number) is not a dtype at all.
            named = isinstance(self.dtype, str) or type(self.dtype).__module__ == "torch"
            raise (ValueError if named else TypeError)(
                f"Conv2dGw8Params needs dtype fp16 or bf16 (or torch.float16, torch.bfloat16), "
                f"got {self.dtype!r}"
            ) from None
        for name in ("n", "h", "w"):
            if getattr(self, name) < 1:
                raise ValueError(f"Conv2dGw8Params needs {name} >= 1, got {getattr(self, name)}")
        if self.c <= 0 or self.c % GROUP_WIDTH:
            raise ValueError(
                f"conv2d_gw8 needs channels a positive multiple of {GROUP_WIDTH}, got {self.c}"
            )
        for name in ("r", "s"):
            value = getattr(self, name)
            if not MIN_FILTER <= value <= MAX_FILTER:
                raise ValueError(
                    f"conv2d_gw8 needs filter {name.upper()} in {MIN_FILTER}..{MAX_FILTER}, "
                    f"got {value}"
                )
        if min(self.padding) < 0:
            raise ValueError(f"conv2d_gw8 needs non-negative padding, got {self.padding}")
        if self.p <= 0 or self.q <= 0:
            raise ValueError(
                f"conv2d_gw8 needs a non-empty output, got output size {self.p}x{self.q} "
                f"for input {self.h}x{self.w}, filter {self.r}x{self.s}, padding {self.padding}"
            )

    @property
    def padding_h(self) -> int:
        """Rows of zero padding above and below the input."""
        return self.padding[0]

    @property
    def padding_w(self) -> int:
        """Columns of zero padding left and right of the input."""
        return self.padding[1]

    @property
    def p(self) -> int:
        """Output height (stride 1)."""
        return self.h + 2 * self.padding_h - self.r + 1

    @property
    def q(self) -> int:
        """Output width (stride 1)."""
        return self.w + 2 * self.padding_w - self.s + 1

    @property
    def k(self) -> int:
        """Output channels; always equal to the input channels."""
        return self.c

    @property
    def groups(self) -> int:
        """Number of groups of 8 channels."""
        return self.c // GROUP_WIDTH

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        """Shape of the input tensor, (n, c, h, w)."""
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """Shape of the weight tensor, (k, 8, r, s), as nn.Conv2d stores it."""
        return (self.c, GROUP_WIDTH, self.r, self.s)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        """Shape of the output tensor, (n, c, p, q), as the torch tensor shape."""
        return (self.n, self.c, self.p, self.q)

    def encode(self) -> str:
        """Return a compact string naming this layer, e.g. for cache keys and benchmark tables."""
        return (
            f"n{self.n}_c{self.c}_h{self.h}_w{self.w}_pad{self.padding_h}x{self.padding_w}"
            f"_r{self.r}_s{self.s}_bias{int(self.has_bias)}_{self.dtype}"
        )

    def encode_image(self) -> str:
        """`encode` without the batch size, e.g. "c64_h64_w64_pad1x1_r3_s3_bias0_fp16": what a
        kernel's name carries of its layer. The kernels take the batch size at launch, so one
        build of a layer and tile config serves every batch size that its images per block
        divide (a "ragged" build the others). `decode` does not read it."""
        return self.encode().removeprefix(f"n{self.n}_")

    @classmethod
    def decode(cls, text: str) -> Conv2dGw8Params:
        """Inverse of `encode`."""
        if not isinstance(text, str):
            raise TypeError(f"Conv2dGw8Params.decode needs a str, got {text!r}")
        match = _ENCODED.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"not an encoded Conv2dGw8Params: {text!r}")
        g = match.groupdict()
        return cls(
            n=int(g["n"]),
            c=int(g["c"]),
            h=int(g["h"]),
            w=int(g["w"]),
            padding=(int(g["ph"]), int(g["pw"])),
            r=int(g["r"]),
            s=int(g["s"]),
            has_bias=g["bias"] == "1",
            dtype=g["dtype"],
        )

    @classmethod
    def from_tensors(
        cls, input: Tensor, weight: Tensor, bias: Tensor | None = None, padding: Any = 1
    ) -> Conv2dGw8Params:
        """Return the params of conv2d_gw8(input, weight, bias, padding), checking the tensors.

        input is (n, c, h, w), weight (c, 8, r, s) in the same fp16/bf16 dtype; bias, if any,
        has c elements. TypeError naming an operand that is not a tensor.
        """
        import torch

        for name, t in (("input", input), ("weight", weight), ("bias", bias)):
            if not isinstance(t, torch.Tensor) and not (name == "bias" and t is None):
                kind = "a tensor or None" if name == "bias" else "a tensor"
                got = type(t).__name__
                raise TypeError(
                    f"Conv2dGw8Params.from_tensors needs {name} to be {kind}, got {got}"
                )
        if input.dim() != 4:
            raise ValueError(f"conv2d_gw8 needs a 4-D input, got {input.dim()}-D")
        if weight.dim() != 4:
            raise ValueError(f"conv2d_gw8 needs a 4-D weight, got {weight.dim()}-D")
        n, c, h, w = input.shape
        k, group_width, r, s = weight.shape
        if group_width != GROUP_WIDTH:
            raise ValueError(f"conv2d_gw8 needs group width 8, got {group_width}")
        if k != c:
            raise ValueError(f"conv2d_gw8 needs as many output as input channels, got C={c}, K={k}")
        dtype = dtype_name(input.dtype)
        if weight.dtype != input.dtype:
            raise ValueError(
                f"conv2d_gw8 needs weight dtype equal to input dtype {input.dtype}, "
                f"got {weight.dtype}"
            )
        if bias is not None and tuple(bias.shape) != (k,):
            raise ValueError(f"conv2d_gw8 needs a bias of shape ({k},), got {tuple(bias.shape)}")
        if bias is not None and not bias.is_floating_point():
            raise ValueError(f"conv2d_gw8 needs a floating-point bias, got {bias.dtype}")
        return cls(n, c, h, w, padding=padding, r=r, s=s, has_bias=bias is not None, dtype=dtype)


def image_bytes(params: Conv2dGw8Params) -> int:
    """Bytes of one image of the layer's larger activation tensor (input or output; 2-byte
    elements)."""
    per_image = max(math.prod(params.input_shape[1:]), math.prod(params.output_shape[1:]))
    return per_image * ACTIVATION_BYTES


def weight_grad_bytes(params: Conv2dGw8Params) -> int:
    """Bytes of the layer's fp32 weight gradient, its largest weight-side tensor."""
    return math.prod(params.weight_shape) * FP32_BYTES


def check_tensor_bytes(params: Conv2dGw8Params) -> None:
    """ValueError where the layer's larger activation tensor or its fp32 weight gradient passes
    MAX_TENSOR_BYTES, naming its size."""
    largest = params.n * image_bytes(params)
    if largest > MAX_TENSOR_BYTES:
        raise ValueError(
            f"conv2d_gw8 layer {params.encode()}: its activations take {largest} bytes, more "
            f"than the {MAX_TENSOR_BYTES} a kernel takes (spio.functional runs such a batch in "
            "chunks of images)"
        )
    if weight_grad_bytes(params) > MAX_TENSOR_BYTES:
        raise ValueError(
            f"conv2d_gw8 layer {params.encode()}: its fp32 weight gradient takes "
            f"{weight_grad_bytes(params)} bytes, more than the {MAX_TENSOR_BYTES} a kernel takes "
            "(spio.functional runs such a layer with PyTorch)"
        )
