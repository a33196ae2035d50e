"""TensorSpec (a typed cursor over a strided, optionally padded array) and IndexSpec (a flat index
decomposed into named dims)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .dtypes import parse_dtype
from .spec import (
    HOST_DEVICE,
    INT32_MAX,
    SECTION_DEFINITIONS,
    Dependency,
    Dim,
    check_identifier,
    check_unique_members,
    normalize_dims,
)

_FN = "SPIO_GEN_FN constexpr"


def describe_dims(dims: tuple[tuple[str, Dim], ...]) -> str:
    """`n(4) > k8(8, padded to 9)`: the dims outermost first, for comments and errors."""
    parts = []
    for name, dim in dims:
        padded = f", padded to {dim.stored}" if dim.stored != dim.extent else ""
        extent = "run time" if dim.extent is None else dim.extent
        parts.append(f"{name}({extent}{padded})")
    return " > ".join(parts)


def _known_size(dims: tuple[tuple[str, Dim], ...]) -> int | None:
    """The product of the dims' stored lengths; None where the outermost is given at run time."""
    size = 1
    for _, dim in dims:
        if dim.stored is None:
            return None
        size *= dim.stored
    return size


def _inner_stored(dim: Dim) -> int:
    """The stored length of a dim that is not the outermost, so never given at run time."""
    assert dim.stored is not None
    return dim.stored


def _index_members(dims: tuple[tuple[str, Dim], ...], with_offset: bool) -> list[str]:
    names = [name for name, _ in dims]
    extra = ["size", "flat", "of", "i_"] + (["offset"] if with_offset else [])
    return [name.upper() for name in names] + names + extra


def index_digits(flat: str, extents: list[int | None]) -> list[str]:
    """C++ expressions of the digits of the flat index `flat` (an expression) over `extents`,
    outermost first, the innermost fastest; the outermost does not wrap (its extent may be None)."""
    digits = []
    for pos, extent in enumerate(extents):
        inner = math.prod(e for e in extents[pos + 1 :] if e is not None)
        digit = flat if inner == 1 else f"{flat} / {inner}"
        digits.append(f"{digit} % {extent}" if pos > 0 else digit)
    return digits


def _compose(dims: tuple[tuple[str, Dim], ...]) -> str:
    """C++ of the flat index of the dims' indices, named as the dims, outermost first (Horner's
    form: ((a * B + b) * C + c), so the innermost varies fastest)."""
    expr = dims[0][0]
    for name, dim in dims[1:]:
        expr = (
            f"({expr}) * {dim.extent} + {name}"
            if "+" in expr
            else f"{expr} * {dim.extent} + {name}"
        )
    return expr


def _index_class(
    class_name: str,
    dims: tuple[tuple[str, Dim], ...],
    strides: tuple[int, ...] | None,
    indent: str,
    swizzled: bool = False,
) -> list[str]:
    """C++ lines of a class decomposing a flat index over `dims` (innermost fastest).

    With `strides`, the class also gets offset(): the element offset in a padded tensor; with
    `swizzled`, in a tensor whose innermost index is stored XORed with the enclosing class's
    swizzle_key of the next dim's (TensorSpec's swizzle).
    """
    unpadded = tuple((name, Dim(dim.extent)) for name, dim in dims)
    size = _known_size(unpadded)
    lines = [
        f"/// Decomposes a flat index i >= 0 into {describe_dims(unpadded)}, the last fastest.",
        "/// The outermost dim does not wrap: i >= size gives an outermost index >= its extent."
        if size is not None
        else "/// The outermost dim does not wrap (its extent is given at run time).",
        f"class {class_name} {{",
        "  public:",
    ]
    lines += [
        f"    static constexpr int {name.upper()} = {dim.extent};"
        for name, dim in dims
        if dim.extent is not None
    ]
    if size is not None:
        lines += [
            "    /// Number of distinct indices: the product of the extents.",
            f"    static constexpr int size = {size};",
        ]
    lines += [
        "",
        f"    {_FN} explicit {class_name}(int i) : i_(i) {{}}",
        "    /// The flat index this object decomposes.",
        f"    {_FN} int flat() const {{ return i_; }}",
        "    /// The index whose dims' indices are these (outermost first; each but the outermost",
        "    /// below its extent): the flat index, composed as the accessors decompose it.",
        f"    static {_FN} {class_name} of({', '.join(f'int {name}' for name, _ in dims)}) {{",
        f"        return {class_name}({_compose(unpadded)});",
        "    }",
    ]
    digits = index_digits("i_", [dim.extent for _, dim in unpadded])
    for (name, _), expr in zip(dims, digits, strict=True):
        lines.append(f"    {_FN} int {name}() const {{ return {expr}; }}")
    if strides is not None:
        terms = [
            f"{name}()" if stride == 1 else f"{name}() * {stride}"
            for (name, _), stride in zip(dims, strides, strict=True)
        ]
        if swizzled:
            (key_dim, _), (swizzled_dim, _) = dims[-2:]
            terms[-1] = f"({swizzled_dim}() ^ swizzle_key({key_dim}()))"
        lines += [
            "    /// Element offset of this index in the tensor, padding included.",
            f"    {_FN} int offset() const {{ return {' + '.join(terms)}; }}",
        ]
    lines += ["", "  private:", "    int i_;", "};"]
    return [indent + line if line else "" for line in lines]


@dataclass(frozen=True)
class IndexSpec:
    """A class `name` that decomposes a flat index (e.g. threadIdx.x) into `dims`.

    `dims` maps lower-case names to positive extents, outermost first; the innermost varies fastest.
    The outermost extent may be None, given at run time: then there is no `Name::N` for it and
    no `Name::size`. C++: `Name idx(threadIdx.x); idx.n(); idx.flat(); Name::N; Name::size`;
    `Name::of(n, ...)` composes the index from the dims' indices, outermost first.
    """

    name: str
    dims: Mapping[str, int | None] = field(compare=False)
    # Checked copy of dims; equality and hashing use it, so dim order matters.
    _dims: tuple[tuple[str, Dim], ...] = field(init=False, repr=False)

    section: ClassVar[int] = SECTION_DEFINITIONS

    def __post_init__(self) -> None:
        label = f"IndexSpec {self.name!r}"
        check_identifier(label, "name", self.name)
        dims = normalize_dims(label, self.dims, allow_padding=False)
        check_unique_members(label, self.name, _index_members(dims, with_offset=False))
        object.__setattr__(self, "_dims", dims)

    @property
    def class_name(self) -> str:
        """The C++ class this spec defines."""
        return self.name

    def defined_names(self) -> tuple[str, ...]:
        """Global names this spec defines."""
        return (self.name,)

    def dependencies(self) -> tuple[Dependency, ...]:
        """The host/device function prelude."""
        return (HOST_DEVICE,)

    def generate(self) -> str:
        """The C++ class."""
        return "\n".join(_index_class(self.name, self._dims, None, ""))


@dataclass(frozen=True)
class TensorSpec:
    """A cursor class `name` over an array of `dtype` elements with named `dims`.

    `dims` maps lower-case names to extents, outermost first. A value is an extent (int), an
    `(extent, padded)` tuple or a `Dim`; a padded dim occupies `padded` slots, so every outer stride
    grows. Strides are derived: innermost 1, each outer one the next inner stride times its stored
    length. `dtype` is a C++ type name from `dtypes.ELEMENT_TYPES`, optionally "const ...".
    The outermost extent may be None, given at run time (e.g. the batch): the class then has
    its stride but no extent constant for it, and no `size` or `num_bytes`; the caller keeps
    the whole tensor's offsets within an int.
    C++: `Name t(ptr); t.n(i).k8(j).get(); *t; Name::N; Name::stride_n; Name::size;
    Name::num_bytes; Name::data_type; Name::Index idx(i); idx.n(); idx.offset()`.

    `swizzle=True` stores the innermost dim (E indices, E a power of two up to 8, unpadded) XORed
    with a key of the next dim's index o: element (..., o, i) lies at o * E + (i ^ key(o)), key(o)
    = (o mod 8) / (8 / E) (`Name::swizzle_key`). For 16-byte elements (a shared-memory row of
    pixels, each pixel's E 16-byte channel groups together) this puts a fixed i of any 8
    consecutive o in 8 different 16-byte bank slots, so ldmatrix reading 8 pixels of one group
    does not conflict, while each pixel's E elements stay side by side (whole-pixel copies). The
    cursor then also keeps the two dims' indices, and a move along either adds the change of the
    XOR part (none for a move by a multiple of 8 along the key dim, which the compiler folds as
    into a plain cursor), so moves add up in any order. It starts from the tensor's origin; its
    innermost index need be in 0..E-1 only where it is read.
    """

    name: str
    dtype: str
    dims: Mapping[str, int | tuple[int, int] | Dim | None] = field(compare=False)
    swizzle: bool = False
    # Checked copy of dims; equality and hashing use it, so dim order matters.
    _dims: tuple[tuple[str, Dim], ...] = field(init=False, repr=False)
    _dtype: tuple[str, int, Dependency | None] = field(init=False, repr=False, compare=False)

    section: ClassVar[int] = SECTION_DEFINITIONS

    def __post_init__(self) -> None:
        label = f"TensorSpec {self.name!r}"
        check_identifier(label, "name", self.name)
        dtype = parse_dtype(label, self.dtype)
        dims = normalize_dims(label, self.dims)
        names = [name for name, _ in dims]
        members = (
            ["data_type", "size", "num_bytes", "get", "Index", "ptr_"]
            + [name.upper() for name in names]
            + [f"stride_{name}" for name in names]
            + names
        )
        if not isinstance(self.swizzle, bool):
            raise ValueError(f"{label}: swizzle must be True or False, got {self.swizzle!r}")
        if self.swizzle and len(names) >= 2:  # the indices the cursor keeps
            members += ["swizzle_key", f"{names[-2]}_", f"{names[-1]}_"]
        check_unique_members(label, self.name, members)
        check_unique_members(f"{label} Index", "Index", _index_members(dims, with_offset=True))
        object.__setattr__(self, "_dims", dims)
        object.__setattr__(self, "_dtype", dtype)
        if self.swizzle:
            self._check_swizzle(label)
        # One outermost index's elements where the extent is given at run time.
        elements = self.size if self.size is not None else self.strides[0]
        if elements * dtype[1] > INT32_MAX:
            raise ValueError(f"{label}: {elements} elements of {dtype[0]} exceed 2 GiB")

    @property
    def class_name(self) -> str:
        """The C++ class this spec defines."""
        return self.name

    def _check_swizzle(self, label: str) -> None:
        """The swizzle's conditions (see the class docstring), ValueError naming the one unmet."""
        if len(self._dims) < 2:
            raise ValueError(f"{label}: swizzle needs two dims or more, got {len(self._dims)}")
        (outer, outer_dim), (inner, dim) = self._dims[-2:]
        if dim.extent not in (1, 2, 4, 8) or dim.stored != dim.extent:
            raise ValueError(
                f"{label}: swizzle needs the innermost dim {inner!r} unpadded with 1, 2, 4 or 8 "
                f"indices, got {describe_dims(self._dims[-1:])}"
            )
        if outer_dim.extent is None:
            raise ValueError(f"{label}: swizzle needs dim {outer!r} (the key's) of a known extent")

    @property
    def strides(self) -> tuple[int, ...]:
        """Element stride of each dim, outermost first; padding included."""
        strides = [1]
        for _, dim in reversed(self._dims[1:]):
            strides.append(strides[-1] * _inner_stored(dim))
        return tuple(reversed(strides))

    def offset(self, **indices: int) -> int:
        """The element offset of `indices` (every dim by name), as the C++ Index.offset() and
        cursor give it, the swizzle included: for checking a layout's properties in Python."""
        names = [name for name, _ in self._dims]
        if sorted(indices) != sorted(names):
            raise ValueError(f"TensorSpec {self.name!r}.offset needs dims {names}, got {indices}")
        terms = {name: indices[name] for name in names}
        if self.swizzle:
            (outer, _), (inner, dim) = self._dims[-2:]
            assert dim.extent is not None  # checked in __post_init__
            terms[inner] ^= (indices[outer] % 8) // (8 // dim.extent)
        return sum(terms[name] * stride for name, stride in zip(names, self.strides, strict=True))

    @property
    def size(self) -> int | None:
        """Elements spanned by the tensor, padding included; None where the outermost extent is
        given at run time."""
        return _known_size(self._dims)

    @property
    def num_bytes(self) -> int | None:
        """Bytes spanned by the tensor, padding included; None where the outermost extent is
        given at run time."""
        size = self.size
        return None if size is None else size * self._dtype[1]

    def defined_names(self) -> tuple[str, ...]:
        """Global names this spec defines."""
        return (self.name,)

    def dependencies(self) -> tuple[Dependency, ...]:
        """The element type's header, if any, and the host/device function prelude."""
        dtype_dep = self._dtype[2]
        return (HOST_DEVICE,) if dtype_dep is None else (dtype_dep, HOST_DEVICE)

    def generate(self) -> str:
        """The C++ class."""
        cls, ctype = self.name, self._dtype[0]
        strides = self.strides
        lines = [
            f"/// Cursor over {ctype} elements with dims {describe_dims(self._dims)}, "
            "innermost last"
            + (f", {self._dims[-1][0]} swizzled by {self._dims[-2][0]}." if self.swizzle else "."),
            "/// Moves return a new cursor; offsets are in elements and are not bounds-checked.",
            f"class {cls} {{",
            "  public:",
            f"    using data_type = {ctype};",
        ]
        lines += [
            f"    static constexpr int {n.upper()} = {d.extent};"
            for n, d in self._dims
            if d.extent is not None
        ]
        lines += [
            f"    static constexpr int stride_{n} = {s};"
            for (n, _), s in zip(self._dims, strides, strict=True)
        ]
        if self.size is None:
            lines += [
                f"    /// No size: the extent of {self._dims[0][0]} is given at run time.",
                f"    static_assert(sizeof(data_type) == {self._dtype[1]},",
                f'                  "{cls}: unexpected sizeof({ctype})");',
            ]
        else:
            lines += [
                "    /// Elements spanned, padding included.",
                f"    static constexpr int size = {self.size};",
                f"    static constexpr int num_bytes = {self.num_bytes};",
                "    static_assert(num_bytes == size * static_cast<int>(sizeof(data_type)),",
                f'                  "{cls}: unexpected sizeof({ctype})");',
            ]
        lines += self._swizzled_cursor() if self.swizzle else self._plain_cursor()
        lines += _index_class("Index", self._dims, strides, "    ", self.swizzle)
        lines += ["", "  private:", "    data_type *ptr_;"]
        if self.swizzle:  # the indices a move needs, and the constructor that sets them
            (outer, _), (inner, _) = self._dims[-2:]
            lines += [
                f"    int {outer}_;",
                f"    int {inner}_;",
                f"    /// At key-dim index {outer} and innermost index {inner}, element ptr.",
                f"    {_FN} {cls}(data_type *ptr, int {outer}, int {inner})",
                f"        : ptr_(ptr), {outer}_({outer}), {inner}_({inner}) {{}}",
            ]
        lines += ["};"]
        return "\n".join(lines)

    def _plain_cursor(self) -> list[str]:
        """Constructor, moves and access of a cursor that is a pointer."""
        cls = self.name
        lines = ["", f"    {_FN} explicit {cls}(data_type *ptr = nullptr) : ptr_(ptr) {{}}"]
        for name, _ in self._dims:
            lines.append(
                f"    {_FN} {cls} {name}(int i) const {{ return {cls}(ptr_ + i * stride_{name}); }}"
            )
        return lines + [
            "    /// The element pointer at the cursor.",
            f"    {_FN} data_type *get() const {{ return ptr_; }}",
            f"    {_FN} data_type &operator*() const {{ return *ptr_; }}",
            f"    {_FN} data_type *operator->() const {{ return ptr_; }}",
            "",
        ]

    def _swizzled_cursor(self) -> list[str]:
        """Constructor, moves and access of a swizzled cursor: the element's pointer, with the
        key dim's and the innermost dim's indices that a move needs to place the element anew."""
        cls = self.name
        (outer, _), (inner, inner_dim) = self._dims[-2:]
        assert inner_dim.extent is not None  # checked in __post_init__
        shift = (8 // inner_dim.extent).bit_length() - 1  # log2 of the o sharing a key
        lines = [
            "    /// The XOR key of the innermost index at key-dim index o: o mod 8 decides it.",
            f"    static {_FN} int swizzle_key(int o) {{ return (o & 7) >> {shift}; }}",
            "",
            f"    {_FN} explicit {cls}(data_type *ptr = nullptr) : {cls}(ptr, 0, 0) {{}}",
        ]
        for name, _ in self._dims[:-2]:
            lines.append(
                f"    {_FN} {cls} {name}(int i) const {{ "
                f"return {cls}(ptr_ + i * stride_{name}, {outer}_, {inner}_); }}"
            )
        o, i = f"{outer}_", f"{inner}_"
        # ptr_ is the element's address; a move along either dim adds the change of the XOR
        # part too, which for a move by a multiple of 8 along the key dim is zero (the key
        # repeats), so that the compiler folds such moves into the address as constants.
        lines += [
            f"    {_FN} {cls} {outer}(int i) const {{",
            f"        return {cls}(ptr_ + i * stride_{outer} + ({i} ^ swizzle_key({o} + i)) -",
            f"                     ({i} ^ swizzle_key({o})),",
            f"                 {o} + i, {i});",
            "    }",
            f"    {_FN} {cls} {inner}(int i) const {{",
            f"        const int key = swizzle_key({o});",
            f"        return {cls}(ptr_ + (({i} + i) ^ key) - ({i} ^ key), {o}, {i} + i);",
            "    }",
            f"    /// The element pointer at the cursor ({inner} stored XORed with its key).",
            f"    {_FN} data_type *get() const {{ return ptr_; }}",
            f"    {_FN} data_type &operator*() const {{ return *ptr_; }}",
            f"    {_FN} data_type *operator->() const {{ return ptr_; }}",
            "",
        ]
        return lines
