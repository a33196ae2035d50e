"""The kernel sources work out no lane's role by hand: a lane's elements of the mma's matrices come
from the generated fragment classes, the rows whose addresses it gives to ldmatrix from
spio/warp/ldmatrix.h (conv2d_gw8_factory.generate_header, conv2d_gw8_wgrad_factory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import spio

SOURCES = Path(spio.__file__).parent / "src"
KERNELS = ["conv2d_gw8.cu", "conv2d_gw8_wgrad.cu"]

#: `lane` as the one argument of an ldmatrix helper or the first of a fragment class's accessor.
_NAMED_USE = re.compile(
    r"spio::ldmatrix_(?:row|matrix)<[124]>\(lane\)|\b(?:TapFrag|AccFrag|XFrag|DwFrag)::\w+\(lane,"
)


def _code(text: str) -> str:
    """`text` without its // comments (the kernels have no /* */ ones)."""
    assert "/*" not in text
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def lane_uses_by_hand(text: str) -> list[str]:
    """The lines of kernel source `text` that use `lane` other than as the warp's lane number's
    one definition or an argument of the named helpers."""
    found = []
    for line in _code(text).splitlines():
        rest = _NAMED_USE.sub("", line.replace("const int lane = threadIdx.x % 32;", ""))
        if re.search(r"\blane\b", rest):
            found.append(line.strip())
    return found


@pytest.mark.parametrize("source", KERNELS)
def test_kernels_name_every_lane_role(source):
    text = (SOURCES / source).read_text()
    assert "const int lane = threadIdx.x % 32;" in text
    assert _NAMED_USE.search(text)
    assert lane_uses_by_hand(text) == []


@pytest.mark.parametrize(
    "line",
    [
        "const int k = c8 * 8 + lane / 4;",
        "x(warp_x + lane % 8)",
        "if (lane % 4 == 0) {",
        "const int i = TapFrag::k(lane, 0) + lane;",
        "spio::ldmatrix_row<3>(lane)",
    ],
)
def test_a_lane_worked_out_by_hand_is_found(line):
    assert lane_uses_by_hand(f"    {line}  // lane") == [line]
