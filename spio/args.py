"""Value types for argparse options, shared by `python -m spio` and the scripts: a bad value is a
usage error (exit 2) that names it."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _checked(text: str, parse: Callable[[str], float], ok: Callable[[float], bool], needs: str):
    """`text` parsed, where it parses and the value is `ok` (NaN is not); else the usage error."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"needs {needs}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _checked(text, int, lambda v: v >= 1, "a positive integer")


def unit_fraction(text: str) -> float:
    """A number in (0, 1]: a rate or a fraction of which some must be kept."""
    return _checked(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def non_negative_float(text: str) -> float:
    """A number >= 0."""
    return _checked(text, float, lambda v: v >= 0, "a number >= 0")
