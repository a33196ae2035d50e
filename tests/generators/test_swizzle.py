"""TensorSpec(swizzle=True): where elements land (g++ against Python arithmetic), the bank slots
a fixed innermost index takes over 8 consecutive key-dim indices, and the conditions' errors."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spio.generators import Dim, TensorSpec, generate
from tests.generators.test_tensor import NO_SHRINK


def reference_offset(stage: int, x: int, g: int, xs: int, groups: int) -> int:
    """Element (stage, x, g) of a [stage][xs][groups] tensor whose g is XORed with x's key:
    (x / (8 / groups)) % groups, written as the layout's definition, not the generator's."""
    key = (x // (8 // groups)) % groups
    return (stage * xs + x) * groups + (g ^ key)


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
def test_a_groups_column_of_8_pixels_takes_8_bank_slots(groups):
    """The layout's purpose: for each group, any 8 consecutive pixels (any start) lie in 8
    different 16-byte slots of the 128-byte bank line, so ldmatrix reading them does not
    conflict; and each pixel's groups stay in its own `groups` elements (a permutation)."""
    for g in range(groups):
        for start in range(24):
            slots = {reference_offset(0, x, g, 40, groups) % 8 for x in range(start, start + 8)}
            assert len(slots) == 8, (groups, g, start, sorted(slots))
    for x in range(40):
        placed = sorted(reference_offset(0, x, g, 40, groups) for g in range(groups))
        assert placed == list(range(x * groups, (x + 1) * groups))


@settings(max_examples=4, deadline=None, phases=NO_SHRINK)
@given(data=st.data())
def test_swizzled_cursor_and_index_place_elements_by_the_layout(cxx, data):
    """Cursor moves in any order and split into parts, Index.offset() and swizzle_key, compiled
    with g++, against reference_offset."""
    specs, body, expected = [], [], {}
    for t, groups in enumerate([1, 2, 4, 8]):
        xs = data.draw(st.integers(9, 40), label=f"xs{t}")
        cls = f"T{t}"
        specs.append(TensorSpec(cls, "int", {"stage": 3, "x": xs, "c8": groups}, swizzle=True))
        body.append(f'P("{cls}.size", {cls}::size);')
        expected[f"{cls}.size"] = 3 * xs * groups
        for m in range(6):
            stage = data.draw(st.integers(0, 2), label="stage")
            x = data.draw(st.integers(0, xs - 1), label="x")
            g = data.draw(st.integers(0, groups - 1), label="g")
            x1 = data.draw(st.integers(-x, xs), label="x1")  # x as two moves: x1 + (x - x1)
            moves = [f".stage({stage})", f".x({x1})", f".c8({g})", f".x({x - x1})"]
            chain = "".join(data.draw(st.permutations(moves), label="order"))
            body.append(f'P("{cls}.move{m}", {cls}(nullptr){chain}.get() - ({cls}::data_type *)0);')
            flat = (stage * xs + x) * groups + g
            body.append(f'P("{cls}.idx{m}", {cls}::Index({flat}).offset());')
            want = reference_offset(stage, x, g, xs, groups)
            assert specs[-1].offset(stage=stage, x=x, c8=g) == want  # Python's, the same
            expected[f"{cls}.move{m}"] = expected[f"{cls}.idx{m}"] = want
        for x in range(-9, 17):  # o mod 8 decides the key, negative o too
            body.append(f'P("{cls}.key{x}", {cls}::swizzle_key({x}));')
            expected[f"{cls}.key{x}"] = ((x % 8) // (8 // groups)) % groups
    header = generate(specs, "swizzled.h")
    assert cxx.printed({"swizzled.h": header}, body) == expected


@pytest.mark.parametrize(
    "dims, message",
    [
        ({"c8": 8}, "two dims or more, got 1"),
        ({"x": 4, "c8": 3}, "innermost dim 'c8' unpadded with 1, 2, 4 or 8 indices, got c8(3)"),
        ({"x": 4, "c8": 16}, "got c8(16)"),
        ({"x": 4, "c8": (8, 9)}, "got c8(8, padded to 9)"),
        ({"x": None, "c8": 8}, "dim 'x' (the key's) of a known extent"),
        ({"x": 4, "x_": 8}, "member name 'x_' would be defined twice"),
    ],
)
def test_swizzle_conditions_are_named(dims, message):
    with pytest.raises(ValueError, match=r"TensorSpec 'S'.*" + re.escape(message)):
        TensorSpec("S", "uint4", dims, swizzle=True)


@pytest.mark.parametrize("value", [1, 0, None, "yes"])
def test_swizzle_must_be_a_bool(value):
    with pytest.raises(ValueError, match=f"swizzle must be True or False, got {value!r}"):
        TensorSpec("S", "uint4", {"x": 4, "c8": 8}, swizzle=value)


def test_unswizzled_tensor_is_unchanged_by_the_option():
    """swizzle=False (the default) generates the plain cursor, a pointer and nothing else."""
    dims = {"x": 5, "c8": Dim(8, 9)}
    text = generate([TensorSpec("S", "uint4", dims, swizzle=False)])
    assert text == generate([TensorSpec("S", "uint4", dims)])
    assert "swizzle_key" not in text and "x_;" not in text and "c8_;" not in text
    assert "S c8(int i) const { return S(ptr_ + i * stride_c8); }" in text


def test_python_offset_of_a_plain_tensor_and_its_errors():
    spec = TensorSpec("S", "uint4", {"stage": 3, "c8": 2, "x": (5, 7)})
    assert spec.offset(stage=2, c8=1, x=4) == 2 * 14 + 7 + 4
    with pytest.raises(ValueError, match=r"'S'.offset needs dims \['stage', 'c8', 'x'\]"):
        spec.offset(stage=0, x=1)


def test_every_short_move_chain_lands_where_the_layout_says(cxx):
    """Exhaustive where the Hypothesis test samples: for 1, 2, 4 and 8 groups and a padded key
    dim, the cursor moved to pixel a, group g1, pixel +b and group +(g - g1) (moves of -16..16
    pixels, intermediate groups outside 0..E-1 too) is at (a + b, g), as is Index.offset()."""
    specs, body, expected = [], [], {}
    for groups in (1, 2, 4, 8):
        cls = f"E{groups}"
        spec = TensorSpec(cls, "int", {"stage": 2, "x": (40, 43), "c8": groups}, swizzle=True)
        specs.append(spec)
        body += [
            "{",
            "  long long sum = 0, bad = 0;",
            "  for (int a = -16; a <= 16; ++a)",
            "    for (int b = -16; b <= 16; ++b)",
            f"      for (int g = 0; g < {groups}; ++g)",
            f"        for (int g1 = -2; g1 <= {groups} + 1; ++g1) {{",
            f"          const long long got = {cls}(nullptr).stage(1).x(a).c8(g1).x(b).c8(g - g1)"
            f".get() - ({cls}::data_type *)0;",
            f"          const int x = a + b, key = {cls}::swizzle_key(x);",
            f"          const long long want = {cls}::stride_stage + x * {cls}::stride_x"
            " + (g ^ key);",
            "          bad += got != want;",
            "          sum += got;",
            "        }",
            f'  P("{cls}.bad", bad);',
            f'  P("{cls}.sum", sum);',
            "}",
        ]
        expected[f"{cls}.bad"] = 0
        expected[f"{cls}.sum"] = sum(
            spec.offset(stage=1, x=a + b, c8=g)
            for a in range(-16, 17)
            for b in range(-16, 17)
            for g in range(groups)
            for _ in range(-2, groups + 2)
        )
    header = generate(specs, "exhaustive.h")
    assert cxx.printed({"exhaustive.h": header}, body) == expected
