"""FragmentSpec headers compiled with g++ against a stub of the fragment contract: the named row and
column accessors give the PTX ISA layout of every fragment type."""

from __future__ import annotations

import random
import re

import pytest

from spio.generators import FRAGMENT_TYPES, FragmentSpec, generate
from tests.generators.conftest import FRAGMENTS_H


def reference_layout(fragment_type: str, lane: int, idx: int) -> tuple[int, int]:
    """(row, col) of element idx of `lane` per the PTX ISA mma.m16n8k8 / m16n8k16 layouts."""
    g, t = lane >> 2, lane % 4
    if fragment_type.startswith("FragA_m16n8k8") or fragment_type == "FragC_m16n8_f32":
        return g + 8 * (idx // 2), 2 * t + idx % 2
    if fragment_type.startswith("FragB_m16n8k8"):
        return 2 * t + idx, g
    if fragment_type.startswith("FragA_m16n8k16"):
        return g + 8 * ((idx // 2) % 2), 2 * t + idx % 2 + 8 * (idx // 4)
    if fragment_type.startswith("FragB_m16n8k16"):
        return 2 * t + idx % 2 + 8 * (idx // 2), g
    raise AssertionError(fragment_type)


ELEMENTS = {"A_m16n8k8": 4, "B_m16n8k8": 2, "A_m16n8k16": 8, "B_m16n8k16": 4, "C_m16n8": 4}


def num_elements(fragment_type: str) -> int:
    return next(n for key, n in ELEMENTS.items() if fragment_type.startswith("Frag" + key))


def test_reference_layout_covers_each_matrix_once():
    """Sanity of the Python reference: the 32 lanes cover every matrix element exactly once."""
    for fragment_type, (rows, cols) in FRAGMENT_TYPES.items():
        cells = [
            reference_layout(fragment_type, lane, i)
            for lane in range(32)
            for i in range(num_elements(fragment_type))
        ]
        assert sorted(cells) == [(r, c) for r in range(rows) for c in range(cols)], fragment_type


@pytest.mark.parametrize("seed", [0, 1])
def test_named_accessors_follow_the_fragment_layout(cxx, seed):
    """Name::<row>(lane, idx) and Name::<col>(lane, idx) for all lanes, elements and types."""
    rng = random.Random(seed)
    names = ["q", "k", "c", "n", "p", "k8", "c8", "x", "w", "r"]
    specs, body, expected = [], [], {}
    for i, fragment_type in enumerate(FRAGMENT_TYPES):
        row, col = rng.sample(names, 2)
        cls = f"Frag{i}"
        specs.append(FragmentSpec(cls, fragment_type, row=row, col=col))
        rows, cols = FRAGMENT_TYPES[fragment_type]
        body += [
            f'  static_assert(std::is_base_of<spio::{fragment_type}, {cls}>::value, "base");',
            f'  static_assert({cls}::{row.upper()} == {rows}, "rows");',
            f'  static_assert({cls}::{col.upper()} == {cols}, "cols");',
            f"  {{ {cls} f{{}}; (void)f.reg[{cls}::num_regs - 1]; }}",
            "  for (int lane = 0; lane < 32; ++lane)",
            f"    for (int i = 0; i < {num_elements(fragment_type)}; ++i)",
            f'      std::printf("{cls} %d %d %d %d\\n", lane, i, {cls}::{row}(lane, i),'
            f" {cls}::{col}(lane, i));",
        ]
        for lane in range(32):
            for idx in range(num_elements(fragment_type)):
                expected[(cls, lane, idx)] = reference_layout(fragment_type, lane, idx)
    program = "\n".join(
        [
            '#include "f.h"',
            "#include <cstdio>",
            "#include <type_traits>",
            "int main() {",
            *body,
            "}",
        ]
    )
    got = {}
    for line in cxx.run(program, {"f.h": generate(specs)}).splitlines():
        cls, lane, idx, r, c = line.split()
        got[(cls, int(lane), int(idx))] = (int(r), int(c))
    assert got == expected


@pytest.mark.parametrize(
    "fragment_type, row, col",
    [
        ("FragC_m16n8_f32", {"h": 2, "k": 8}, "c"),
        ("FragC_m16n8_f32", "x", {"k2": 4, "e": 2}),
        ("FragA_m16n8k16_f16", {"a": 2, "b": 2, "g": 4}, {"t": 2, "u": 8}),
        ("FragB_m16n8k8_bf16", {"p": 8}, {"k": 1, "c": 8}),
    ],
)
def test_split_dims_decompose_the_row_and_column(cxx, fragment_type, row, col):
    """Dims given as a mapping are the row's (column's) index split outermost first, as a flat
    index: their extent constants and accessors for every lane and element."""
    rows, cols = FRAGMENT_TYPES[fragment_type]
    spec = FragmentSpec("F", fragment_type, row=row, col=col)
    row_dims = row if isinstance(row, dict) else {row: rows}
    col_dims = col if isinstance(col, dict) else {col: cols}
    names = [*row_dims, *col_dims]
    body = [f'  static_assert(F::{name.upper()} == {extent}, "{name}");'
            for name, extent in {**row_dims, **col_dims}.items()]  # fmt: skip
    calls = ", ".join(f"F::{name}(lane, i)" for name in names)
    body += [
        "  for (int lane = 0; lane < 32; ++lane)",
        f"    for (int i = 0; i < {num_elements(fragment_type)}; ++i)",
        f'      std::printf("%d %d{" %d" * len(names)}\\n", lane, i, {calls});',
    ]
    program = "\n".join(['#include "f.h"', "#include <cstdio>", "int main() {", *body, "}"])

    def split(index: int, dims: dict[str, int]) -> list[int]:
        parts = []
        for extent in reversed(dims.values()):
            parts.append(index % extent)
            index //= extent
        assert index == 0
        return parts[::-1]

    got = cxx.run(program, {"f.h": generate([spec])}).splitlines()
    want = []
    for lane in range(32):
        for idx in range(num_elements(fragment_type)):
            r, c = reference_layout(fragment_type, lane, idx)
            values = [lane, idx, *split(r, row_dims), *split(c, col_dims)]
            want.append(" ".join(map(str, values)))
    assert got == want


def test_every_fragment_type_of_the_spio_header_is_known():
    declared = re.findall(r"^(?:using|struct) (Frag\w+)", FRAGMENTS_H.read_text(), re.MULTILINE)
    assert sorted(FRAGMENT_TYPES) == sorted(declared)


def test_fragment_header_includes_the_fragment_contract():
    """The only spio include of a generated header is spio/warp/fragments.h, once."""
    header = generate(
        [
            FragmentSpec("A", "FragA_m16n8k16_bf16", row="q", col="c"),
            FragmentSpec("B", "FragB_m16n8k16_bf16", row="c", col="k"),
        ]
    )
    includes = [line for line in header.splitlines() if line.startswith("#include")]
    assert includes == ["#include <spio/warp/fragments.h>"]
    assert "class A : public spio::FragA_m16n8k16_bf16" in header
