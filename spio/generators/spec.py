"""The protocol every generator spec implements, plus the name and dimension checks they share.

A spec describes one piece of a generated C++ header. `generate()` (in `header.py`) asks each spec
which section it goes in (macros or definitions), which names it defines (to reject duplicates),
which dependencies it needs (includes and the host/device prelude, emitted once each in a fixed
order) and for its C++ text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

#: Header sections, emitted in this order: macros, then dependencies, then definitions.
SECTION_MACROS = 0
SECTION_DEFINITIONS = 1

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


@dataclass(frozen=True, order=True)
class Dependency:
    """A snippet of preprocessor text that some specs need; `order` fixes where it goes."""

    order: int
    text: str


#: Dependencies, in the order the header emits them.
VECTOR_TYPES = Dependency(
    0,
    "#if !defined(__CUDACC_RTC__)\n#include <vector_types.h>\n#endif",
)
CUDA_FP16 = Dependency(1, "#include <cuda_fp16.h>")
CUDA_BF16 = Dependency(2, "#include <cuda_bf16.h>")
FRAGMENTS = Dependency(3, "#include <spio/warp/fragments.h>")
#: SPIO_GEN_FN: __host__ __device__ under a CUDA compiler (nvcc, NVRTC), plain inline otherwise.
HOST_DEVICE = Dependency(
    4,
    "#ifndef SPIO_GEN_FN\n"
    "#if defined(__CUDACC__)\n"
    "#define SPIO_GEN_FN __host__ __device__ __forceinline__\n"
    "#else\n"
    "#define SPIO_GEN_FN inline\n"
    "#endif\n"
    "#endif",
)


@runtime_checkable
class Spec(Protocol):
    """What `generate()` needs from a spec."""

    #: SECTION_MACROS or SECTION_DEFINITIONS.
    section: ClassVar[int]

    @property
    def class_name(self) -> str | None:
        """The C++ class or struct this spec defines, or None (macros)."""
        ...

    def defined_names(self) -> tuple[str, ...]:
        """Every name this spec puts in the header's global scope (classes, macros)."""
        ...

    def dependencies(self) -> tuple[Dependency, ...]:
        """Includes and preludes the generated text needs."""
        ...

    def generate(self) -> str:
        """The spec's C++ text."""
        ...


# C++20 keywords and alternative tokens, plus names the preprocessor or NVRTC treat specially.
CXX_KEYWORDS = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not
    not_eq nullptr operator or or_eq private protected public register reinterpret_cast requires
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq defined
    """.split()
)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DIM_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


#: CUDA's vector types and half-precision typedefs (vector_types.h, cuda_fp16.h, cuda_bf16.h,
#: which every kernel includes): a generated name equal to one redefines it or changes its meaning.
_VECTOR_BASES = "char uchar short ushort int uint long ulong longlong ulonglong float double"
CUDA_TYPE_NAMES = frozenset(
    f"{base}{lanes}" for base in _VECTOR_BASES.split() for lanes in (1, 2, 3, 4)
) | {"dim3", "half", "half2", "nv_bfloat16", "nv_bfloat162"}
#: CUDA's built-in variables.
CUDA_BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize"})
#: Macros of the C and C++ standard headers that CUDA's headers (or the CPU emulator's host
#: compiler) bring in: a generated name equal to one is replaced by the preprocessor. Those of
#: <climits>, <cstdint> and <cfloat> by their pattern (INT32_MAX, SIZE_MAX, UINT_LEAST8_MAX, ...).
STANDARD_MACROS = frozenset(
    "NULL assert offsetof errno EOF INFINITY NAN HUGE_VAL HUGE_VALF CHAR_BIT MB_LEN_MAX".split()
)
_LIMIT_MACRO = re.compile(
    r"(?:U?INT(?:8|16|32|64|PTR|MAX)?|U?INT_(?:LEAST|FAST)(?:8|16|32|64)|S?CHAR|UCHAR|U?SHRT"
    r"|U?LONG|U?LLONG|SIZE|PTRDIFF|WCHAR|WINT|SIG_ATOMIC|(?:FLT|DBL|LDBL)(?:_TRUE)?)"
    r"_(?:MAX|MIN|C|EPSILON|DIG|MANT_DIG|MAX_EXP|MIN_EXP|MAX_10_EXP|MIN_10_EXP|WIDTH)\Z"
)
#: Prefixes of the CUDA headers' own macros (cuda_fp16.h tests NV_IS_DEVICE, of nv/target;
#: cuda.h defines CUDA_VERSION, cuda_runtime_api.h CUDART_VERSION).
CUDA_MACRO_PREFIXES = ("NV_", "CUDA_", "CUDART_")
#: Namespaces a generated class of the name would clash with.
NAMESPACES = frozenset({"spio", "std"})


def check_identifier(spec: str, what: str, name: object, macro: bool = False) -> str:
    """Return `name` if it is a usable C++ identifier, else raise ValueError naming spec and value.

    Rejects empty and non-ASCII names, C++ keywords, CUDA's type names and built-in variables,
    the standard headers' macros (`NULL`, `assert`, `INT32_MAX`, ...) and names of the CUDA
    headers' macro prefixes (`NV_`, `CUDA_`, `CUDART_`), the namespaces `spio` (spio's
    headers') and `std`, reserved names (`__x`, `_X`) and, but for a `macro`'s name, `SPIO_`
    names (spio's headers and the CPU emulator define macros of that prefix).
    """
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(f"{spec}: {what} must be a C++ identifier, got {name!r}")
    if name in CXX_KEYWORDS:
        raise ValueError(f"{spec}: {what} {name!r} is a C++ keyword")
    if name in CUDA_TYPE_NAMES:
        raise ValueError(f"{spec}: {what} {name!r} is the name of a CUDA type")
    if name in CUDA_BUILTINS:  # (macros in the CPU emulator: a kernel using one would not build)
        raise ValueError(f"{spec}: {what} {name!r} is a CUDA built-in variable")
    if name in STANDARD_MACROS or _LIMIT_MACRO.match(name):
        raise ValueError(f"{spec}: {what} {name!r} is a macro of the standard headers")
    if name.startswith(CUDA_MACRO_PREFIXES):
        raise ValueError(
            f"{spec}: {what} {name!r} has a prefix of the CUDA headers' own macros "
            f"({', '.join(CUDA_MACRO_PREFIXES)})"
        )
    if name in NAMESPACES:
        raise ValueError(f"{spec}: {what} {name!r} is the name of a namespace")
    if name.startswith("SPIO_") and not macro:
        raise ValueError(
            f"{spec}: {what} {name!r} starts with SPIO_, the prefix of the macros of spio's "
            "headers and of the CPU emulator"
        )
    if name.startswith("__") or re.match(r"_[A-Z]", name):
        raise ValueError(f"{spec}: {what} {name!r} is reserved for the C++ implementation")
    return name


def check_dim_name(spec: str, name: object) -> str:
    """Dimension names are lower-case identifiers, so their upper-case extent constants differ;
    the constant must be a usable name too (`null` would define `NULL`)."""
    check_identifier(spec, "dimension name", name)
    assert isinstance(name, str)
    if not _DIM_NAME.match(name):
        raise ValueError(
            f"{spec}: dimension name must be lower case ([a-z][a-z0-9_]*) so that its extent "
            f"constant {name.upper()!r} differs from it, got {name!r}"
        )
    check_identifier(spec, f"dimension {name!r}'s extent constant", name.upper())
    return name


def check_unique_members(spec: str, class_name: str, members: list[str]) -> None:
    """Raise ValueError when two members of one class, or a member and the class, share a name."""
    seen: set[str] = set()
    for member in members:
        if member == class_name:
            raise ValueError(f"{spec}: member name {member!r} equals the class name")
        if member in seen:
            raise ValueError(f"{spec}: member name {member!r} would be defined twice")
        seen.add(member)


@dataclass(frozen=True)
class Dim:
    """One tensor dimension of `extent` indices stored in `padded` slots (default: `extent`).

    Padding grows the stride of every outer dimension without adding indices, e.g.
    `Dim(8, 9)` on the innermost dim of shared memory staggers rows to avoid bank conflicts.
    In a dims dict, `8` means `Dim(8)` and `(8, 9)` means `Dim(8, 9)`.

    The outermost dim may have no extent (`None` in a dims dict: `Dim(None)`): its extent is
    given at run time, e.g. a batch of images whose count each launch passes. No stride depends
    on it, so the generated class has every stride but no extent constant for it and no size.
    """

    extent: int | None
    padded: int | None = None

    @property
    def stored(self) -> int | None:
        """Number of slots the dimension occupies (None: given at run time); the next-outer dim's
        stride is a multiple."""
        return self.extent if self.padded is None else self.padded


def normalize_dims(
    spec: str, dims: object, allow_padding: bool = True
) -> tuple[tuple[str, Dim], ...]:
    """Check a dims mapping (outermost first) and return it as ((name, Dim), ...). The outermost
    value may be None (Dim(None)): an extent given at run time."""
    if not isinstance(dims, Mapping) or not dims:
        raise ValueError(f"{spec}: dims must be a non-empty dict of name -> extent, got {dims!r}")
    result = []
    for pos, (name, value) in enumerate(dims.items()):
        check_dim_name(spec, name)
        # `(extent, padded)` means `Dim(extent, padded)`, for a run-time extent too.
        as_dim = Dim(*value) if isinstance(value, tuple) and len(value) == 2 else value
        if as_dim is None or (isinstance(as_dim, Dim) and as_dim.extent is None):
            if pos > 0:
                raise ValueError(
                    f"{spec}: dim {name!r} at position {pos} cannot have its extent given at "
                    f"run time (only the outermost dim can), got {value!r}"
                )
            if isinstance(as_dim, Dim) and as_dim.padded is not None:
                raise ValueError(
                    f"{spec}: dim {name!r} of run-time extent cannot be padded, got {value!r}"
                )
            result.append((name, Dim(None)))
            continue
        if isinstance(as_dim, Dim):
            dim = as_dim
        elif isinstance(value, int) and not isinstance(value, bool):
            dim = Dim(value)
        else:
            raise ValueError(
                f"{spec}: dim {name!r} must be an int, an (extent, padded) tuple, a Dim, or None "
                f"(outermost only: given at run time), got {value!r}"
            )
        for what, number in (("extent", dim.extent), ("padded length", dim.padded)):
            if what == "padded length" and number is None:
                continue
            if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
                raise ValueError(
                    f"{spec}: dim {name!r} {what} must be a positive int, got {number!r}"
                )
        assert dim.extent is not None  # checked above
        if dim.padded is not None and dim.padded < dim.extent:
            raise ValueError(
                f"{spec}: dim {name!r} padded length {dim.padded} is smaller than its extent "
                f"{dim.extent}"
            )
        if dim.padded == dim.extent:
            dim = Dim(dim.extent)  # one spelling per layout, so equal layouts compare equal
        if not allow_padding and dim.stored != dim.extent:
            raise ValueError(f"{spec}: dim {name!r} cannot be padded here, got {dim!r}")
        result.append((name, dim))
    total = math.prod(dim.stored for _, dim in result if dim.stored is not None)
    if total > INT32_MAX:
        raise ValueError(f"{spec}: dims span {total} elements, more than a C++ int holds")
    return tuple(result)
