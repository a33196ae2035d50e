"""Value types for argparse options, shared by `python -m spio` and the scripts: a bad value is a
usage error (exit 2) that names it. The check of an output folder, made before the work; and the
scripts' way out (run_script)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def _checked(text: str, parse: Callable[[str], float], ok: Callable[[float], bool], needs: str):
    """`text` parsed, where it parses and the value is `ok` (NaN is not); else the usage error."""
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"needs {needs}, got {text!r}")
    return value


def non_empty(text: str) -> str:
    """A text with something besides spaces (an empty name would match every name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"needs a non-empty text, got {text!r}")
    return text


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _checked(text, int, lambda v: v >= 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (0 often meaning "all" or "none")."""
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def unit_fraction(text: str) -> float:
    """A number in (0, 1]: a rate or a fraction of which some must be kept."""
    return _checked(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def non_negative_float(text: str) -> float:
    """A number >= 0."""
    return _checked(text, float, lambda v: v >= 0, "a number >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (a time limit, say)."""
    return _checked(text, float, lambda v: 0 < v < float("inf"), "a finite number > 0")


def folder_write_error(folder: Path, create: bool = True) -> OSError | None:
    """Why no file can be written in `folder` (made first, with its parents, when `create`), or
    None: checked before minutes of work, so that a mistyped --out is not found only after them.
    It writes a temporary file, as a permission check (os.access) passes for root everywhere."""
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return error
    return None


def no_gpu(program: str) -> int:
    """Says on stderr that `program` needs a CUDA GPU, which this machine lacks; returns its exit
    status, 2 (a setup error, as `spio bench`'s)."""
    print(f"{program}: needs a CUDA GPU; none is available on this machine", file=sys.stderr)
    return 2


def run_script(main: Callable[[], int | None]) -> NoReturn:
    """A script's `if __name__ == "__main__"`: exit with main()'s status; Ctrl-C is one line,
    `<script>: interrupted`, and exit 130 as a shell reports SIGINT (as `spio`'s commands do),
    not a traceback."""
    try:
        status = main()
    except KeyboardInterrupt:
        print(f"\n{Path(sys.argv[0]).stem}: interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)
