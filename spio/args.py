"""Value types for argparse options, shared by `python -m spio` and the scripts: a bad value is a
usage error (exit 2) that names it."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"needs a positive integer, got {text!r}")
    return value


def unit_fraction(text: str) -> float:
    """A number in (0, 1]: a rate or a fraction of which some must be kept."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"needs a number in (0, 1], got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"needs a number >= 0, got {text!r}")
    return value
