"""FragmentSpec: an mma fragment type of spio/warp/fragments.h with named row and column dims."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .spec import (
    FRAGMENTS,
    HOST_DEVICE,
    SECTION_DEFINITIONS,
    Dependency,
    check_dim_name,
    check_identifier,
    check_unique_members,
)

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


@dataclass(frozen=True)
class FragmentSpec:
    """A class `name` deriving from `spio::<fragment_type>` whose row and column dims are named.

    C++: `FragmentSpec("Acc", "FragC_m16n8_f32", row="q", col="k")` gives `Acc::q(lane, idx)` and
    `Acc::k(lane, idx)` (the row and column of the lane's element idx) and extents `Acc::Q`,
    `Acc::K` (the matrix's rows and columns).
    """

    name: str
    fragment_type: str
    row: str
    col: str

    section: ClassVar[int] = SECTION_DEFINITIONS

    def __post_init__(self) -> None:
        label = f"FragmentSpec {self.name!r}"
        check_identifier(label, "name", self.name)
        if self.fragment_type not in FRAGMENT_TYPES:
            raise ValueError(
                f"{label}: unknown fragment type {self.fragment_type!r}; known: "
                + ", ".join(FRAGMENT_TYPES)
            )
        check_dim_name(label, self.row)
        check_dim_name(label, self.col)
        members = _BASE_MEMBERS + [self.row, self.col, self.row.upper(), self.col.upper()]
        check_unique_members(label, self.name, members)

    @property
    def class_name(self) -> str:
        """The C++ class this spec defines."""
        return self.name

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, columns) of the fragment's matrix."""
        return FRAGMENT_TYPES[self.fragment_type]

    def defined_names(self) -> tuple[str, ...]:
        """Global names this spec defines."""
        return (self.name,)

    def dependencies(self) -> tuple[Dependency, ...]:
        """spio/warp/fragments.h and the host/device function prelude."""
        return (FRAGMENTS, HOST_DEVICE)

    def generate(self) -> str:
        """The C++ class."""
        base = f"spio::{self.fragment_type}"
        rows, cols = self.shape
        fn = "static SPIO_GEN_FN constexpr int"
        return "\n".join(
            [
                f"/// {base} with rows named {self.row} ({rows}) and columns named {self.col} "
                f"({cols}).",
                f"class {self.name} : public {base} {{",
                "  public:",
                f"    using fragment_type = {base};",
                f"    static constexpr int {self.row.upper()} = {rows};",
                f"    static constexpr int {self.col.upper()} = {cols};",
                f"    /// Row ({self.row}) of this lane's element idx.",
                f"    {fn} {self.row}(int lane, int idx) {{",
                "        return fragment_type::row(lane, idx);",
                "    }",
                f"    /// Column ({self.col}) of this lane's element idx.",
                f"    {fn} {self.col}(int lane, int idx) {{",
                "        return fragment_type::col(lane, idx);",
                "    }",
                "};",
            ]
        )
