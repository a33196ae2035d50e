"""FragmentSpec: an mma fragment type of spio/warp/fragments.h with named row and column dims."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .spec import (
    FRAGMENTS,
    HOST_DEVICE,
    SECTION_DEFINITIONS,
    Dependency,
    Dim,
    check_dim_name,
    check_identifier,
    check_unique_members,
)
from .tensor import describe_dims, index_digits

#: Fragment types of spio/warp/fragments.h (namespace spio) -> (rows, columns) of their matrix.
#: A is M x K (row-major operand), B is K x N, C/D is M x N; see docs/primitives.md.
FRAGMENT_TYPES: dict[str, tuple[int, int]] = {
    "FragA_m16n8k8_f16": (16, 8),
    "FragA_m16n8k8_bf16": (16, 8),
    "FragB_m16n8k8_f16": (8, 8),
    "FragB_m16n8k8_bf16": (8, 8),
    "FragA_m16n8k16_f16": (16, 16),
    "FragA_m16n8k16_bf16": (16, 16),
    "FragB_m16n8k16_f16": (16, 8),
    "FragB_m16n8k16_bf16": (16, 8),
    "FragC_m16n8_f32": (16, 8),
}

# Members of the fragment base types (the contract's and spio's helpers) and our typedef: a row or
# column dim with one of these names would hide it.
_BASE_MEMBERS = [
    "reg",
    "num_regs",
    "num_elements",
    "row",
    "col",
    "rows",
    "cols",
    "fill",
    "zero",
    "get",
    "set",
    "get_reg",
    "set_reg",
    "element_type",
    "pair_type",
    "fragment_type",
    "to_half2",
    "to_bfloat162",
]


#: A fragment's row or column dims: one name for the whole axis, or names and extents outermost
#: first whose product is the axis's length (the matrix index splits as a flat index does).
AxisDims = str | Mapping[str, int]


def _axis_dims(label: str, axis: str, dims: object, length: int) -> tuple[tuple[str, int], ...]:
    """Checked (name, extent) pairs, outermost first, of a row or column `dims` of `length`."""
    if isinstance(dims, str):
        return ((check_dim_name(label, dims), length),)
    if not isinstance(dims, Mapping) or not dims:
        raise ValueError(
            f"{label}: {axis} must be a dim name or a non-empty mapping of names to extents, "
            f"got {dims!r}"
        )
    pairs = []
    for name, extent in dims.items():
        check_dim_name(label, name)
        if isinstance(extent, bool) or not isinstance(extent, int) or extent < 1:
            raise ValueError(
                f"{label}: {axis} dim {name!r} needs a positive extent, got {extent!r}"
            )
        pairs.append((name, extent))
    if math.prod(extent for _, extent in pairs) != length:
        raise ValueError(
            f"{label}: the {axis} dims' extents {dict(pairs)} must multiply to the fragment's "
            f"{length} {axis}s"
        )
    return tuple(pairs)


@dataclass(frozen=True)
class FragmentSpec:
    """A class `name` deriving from `spio::<fragment_type>` whose row and column dims are named.

    C++: `FragmentSpec("Acc", "FragC_m16n8_f32", row="q", col="k")` gives `Acc::q(lane, idx)` and
    `Acc::k(lane, idx)` (the row and column of the lane's element idx) and extents `Acc::Q`,
    `Acc::K` (the matrix's rows and columns). A row or column given as a mapping of dims,
    outermost first, splits it as a flat index: `row={"h": 2, "k": 8}` on a 16-row fragment
    gives `Acc::h(lane, idx)` (row / 8) and `Acc::k(lane, idx)` (row % 8), with `Acc::H == 2`
    and `Acc::K == 8`.
    """

    name: str
    fragment_type: str
    row: AxisDims = field(compare=False)
    col: AxisDims = field(compare=False)
    # Checked copies of row and col; equality and hashing use them.
    _rows: tuple[tuple[str, int], ...] = field(init=False, repr=False)
    _cols: tuple[tuple[str, int], ...] = field(init=False, repr=False)

    section: ClassVar[int] = SECTION_DEFINITIONS

    def __post_init__(self) -> None:
        label = f"FragmentSpec {self.name!r}"
        check_identifier(label, "name", self.name)
        if self.fragment_type not in FRAGMENT_TYPES:
            raise ValueError(
                f"{label}: unknown fragment type {self.fragment_type!r}; known: "
                + ", ".join(FRAGMENT_TYPES)
            )
        rows, cols = FRAGMENT_TYPES[self.fragment_type]
        object.__setattr__(self, "_rows", _axis_dims(label, "row", self.row, rows))
        object.__setattr__(self, "_cols", _axis_dims(label, "column", self.col, cols))
        names = [name for name, _ in self._rows + self._cols]
        members = _BASE_MEMBERS + names + [name.upper() for name in names]
        check_unique_members(label, self.name, members)

    @property
    def class_name(self) -> str:
        """The C++ class this spec defines."""
        return self.name

    def defined_names(self) -> tuple[str, ...]:
        """Global names this spec defines."""
        return (self.name,)

    def dependencies(self) -> tuple[Dependency, ...]:
        """spio/warp/fragments.h and the host/device function prelude."""
        return (FRAGMENTS, HOST_DEVICE)

    def generate(self) -> str:
        """The C++ class."""
        base = f"spio::{self.fragment_type}"
        lines = [
            f"/// {base}, rows {_describe(self._rows)}, columns {_describe(self._cols)}.",
            f"class {self.name} : public {base} {{",
            "  public:",
            f"    using fragment_type = {base};",
        ]
        lines += [
            f"    static constexpr int {name.upper()} = {extent};"
            for name, extent in self._rows + self._cols
        ]
        for axis, dims in (("row", self._rows), ("col", self._cols)):
            digits = index_digits(f"fragment_type::{axis}(lane, idx)", [e for _, e in dims])
            for (name, _), expr in zip(dims, digits, strict=True):
                what = "Row" if axis == "row" else "Column"
                whole = f" ({what.lower()}s {_describe(dims)})" if len(dims) > 1 else ""
                lines += [
                    f"    /// {what} {name} of this lane's element idx{whole}.",
                    f"    static SPIO_GEN_FN constexpr int {name}(int lane, int idx) {{",
                    f"        return {expr};",
                    "    }",
                ]
        lines.append("};")
        return "\n".join(lines)


def _describe(dims: tuple[tuple[str, int], ...]) -> str:
    """`q(16)` or `h(2) > k(8)`, as TensorSpec's dims are described."""
    return describe_dims(tuple((name, Dim(extent)) for name, extent in dims))
