"""Reading spio's environment settings: one parser for the on/off flags, so that all accept the
same words and reject the rest, one for settings that name one of a few choices, one for
integers, and two for paths (of folders and files; of libraries and programs)."""

import os
import re
from collections.abc import Callable
from pathlib import Path

#: The environment variables spio reads (the README's table; SPIO_TEST_* are its test suite's).
SETTINGS = (
    "SPIO_CACHE_DIR",
    "SPIO_WORKERS",
    "SPIO_LOGGER",
    "SPIO_EMULATE",
    "SPIO_AUTOTUNE",
    "SPIO_AUTOTUNE_TOPK",
    "SPIO_EMULATOR_ORDER_SEED",
    "SPIO_EMULATOR_SHARED_OFFSET",
    "SPIO_TMA",
    "SPIO_PERF_MODELS",
    "SPIO_NVRTC",
    "SPIO_CUDA_INCLUDE",
    "SPIO_NVDISASM",
    "SPIO_LIBCUDA",
    "SPIO_EMU_UCONTEXT",
)

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def flag(name: str) -> bool:
    """The on/off setting `name`: 1/true/yes/on is True; 0/false/no/off, empty or unset is False
    (any case, spaces ignored); any other value raises ValueError naming the setting and value."""
    text = os.environ.get(name, "")
    value = text.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off, got {text!r}")


def choice(name: str, choices: tuple[str, ...]) -> str:
    """The setting `name`, one of `choices` (any case, surrounding spaces ignored; empty or
    unset: the first); any other value raises ValueError naming the setting, the choices and
    the value."""
    text = os.environ.get(name, "")
    value = text.strip().lower()
    if not value:
        return choices[0]
    if value in choices:
        return value
    raise ValueError(f"{name} must be {', '.join(choices[:-1])} or {choices[-1]}, got {text!r}")


#: An integer setting's text: decimal digits, after a minus sign for a negative one (int() also
#: takes "1_0" and "+1").
_INTEGER = re.compile(r"-?[0-9]+")


def integer(
    name: str, need: str = "an integer", allowed: Callable[[int], bool] = lambda value: True
) -> int | None:
    """The integer setting `name` (decimal digits, negative after a minus sign, surrounding spaces
    ignored), or None where it is empty or unset; any other value, or one `allowed` refuses,
    raises ValueError naming the setting, what it needs (`need`) and the value."""
    text = os.environ.get(name, "")
    value = text.strip()
    if not value:
        return None
    try:
        number = int(value) if _INTEGER.fullmatch(value) else None
    except ValueError:  # past Python's limit on digits (4300): no setting means that
        number = None
    if number is not None and allowed(number):
        return number
    raise ValueError(f"{name} must be {need}, got {text!r}")


def path(name: str) -> Path | None:
    """The path setting `name` as an absolute path (`~` expanded, a relative path taken from the
    current folder, surrounding spaces ignored), or None where it is empty or unset. Absolute,
    so that what is checked is what is opened: a bare file name given to the dynamic loader is
    searched for on its path, not in the current folder."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    return Path(os.path.abspath(os.path.expanduser(value)))


def path_shown(name: str) -> str:
    """The path setting `name` for a message: NAME='value', and the absolute path path() makes
    of it where that differs."""
    text = os.environ.get(name, "")
    made = path(name)
    return f"{name}={text!r}" + (f" ({made})" if made is not None and str(made) != text else "")


def path_or_name(name: str) -> str | None:
    """The setting `name` naming a library or program: a bare name (no "/" after `~` is
    expanded) as it is, for the dynamic loader or PATH to find; a path as path() gives it;
    None where it is empty or unset."""
    value = os.path.expanduser(os.environ.get(name, "").strip())
    if not value:
        return None
    return value if "/" not in value else os.path.abspath(value)
