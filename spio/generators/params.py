"""ParamsSpec (a struct of compile-time constants) and MacroSpec (#define lines)."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .spec import (
    INT32_MAX,
    INT32_MIN,
    SECTION_DEFINITIONS,
    SECTION_MACROS,
    Dependency,
    check_identifier,
    check_unique_members,
)

#: Macro names: upper case, as C++ code names its macros and no other identifier.
_MACRO_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")
#: A C++14 digit separator (1'024), which is no quote.
_DIGIT_SEPARATOR = re.compile(r"(?<=[0-9A-Fa-f])'(?=[0-9A-Fa-f])")


def _float_literal(spec: str, key: str, value: float, single: bool = False) -> str:
    """The C++ literal of `value` (digits only; `single`: checked to be a float32 value that
    neither overflows nor rounds to zero, for a `float` member)."""
    if not math.isfinite(value):
        raise ValueError(f"{spec}: value {key!r} must be finite, got {value!r}")
    if single:
        try:
            rounded = struct.unpack("f", struct.pack("f", value))[0]
        except OverflowError:
            rounded = math.inf
        if not math.isfinite(rounded) or (rounded == 0.0 and value != 0.0):
            raise ValueError(f"{spec}: value {key!r} does not fit a 32-bit float, got {value!r}")
        value = rounded  # (the decimal of the float32 value: read as float, no second rounding)
    text = repr(float(value))
    return text if ("e" in text or "." in text) else text + ".0"


def _check_mapping(spec: str, values: object) -> Mapping:
    if not isinstance(values, Mapping) or not values:
        raise ValueError(f"{spec}: values must be a non-empty dict, got {values!r}")
    return values


@dataclass(frozen=True)
class ParamsSpec:
    """A struct `name` of `static constexpr` members: ints (32-bit), bools and floats.

    C++: `ParamsSpec("Block", {"p": 8, "ok": True})` -> `struct Block { static constexpr int p = 8;
    static constexpr bool ok = true; };`
    """

    name: str
    values: Mapping[str, int | bool | float] = field(compare=False)
    # The rendered members; equality and hashing use them (True and 1 differ).
    _members: tuple[str, ...] = field(init=False, repr=False)

    section: ClassVar[int] = SECTION_DEFINITIONS

    def __post_init__(self) -> None:
        label = f"ParamsSpec {self.name!r}"
        check_identifier(label, "name", self.name)
        members = []
        for key, value in _check_mapping(label, self.values).items():
            check_identifier(label, "value name", key)
            members.append(self._member(label, key, value))
        check_unique_members(label, self.name, list(self.values))
        object.__setattr__(self, "_members", tuple(members))

    @staticmethod
    def _member(label: str, key: str, value: object) -> str:
        if isinstance(value, bool):
            return f"static constexpr bool {key} = {'true' if value else 'false'};"
        if isinstance(value, int):
            if not INT32_MIN <= value <= INT32_MAX:
                raise ValueError(f"{label}: value {key!r} does not fit a 32-bit int, got {value}")
            return f"static constexpr int {key} = {value};"
        if isinstance(value, float):
            return f"static constexpr float {key} = {_float_literal(label, key, value, True)}f;"
        raise ValueError(f"{label}: value {key!r} must be an int, bool or float, got {value!r}")

    @property
    def class_name(self) -> str:
        """The C++ struct this spec defines."""
        return self.name

    def defined_names(self) -> tuple[str, ...]:
        """Global names this spec defines."""
        return (self.name,)

    def dependencies(self) -> tuple[Dependency, ...]:
        """None: the struct holds only constants."""
        return ()

    def generate(self) -> str:
        """The C++ struct."""
        lines = [f"/// Compile-time parameters {self.name}.", f"struct {self.name} {{"]
        lines += [f"    {member}" for member in self._members]
        lines.append("};")
        return "\n".join(lines)


@dataclass(frozen=True)
class MacroSpec:
    """`#define NAME value` lines, emitted before everything else in the header.

    Values are ints (negative ones parenthesized), bools (1 or 0, usable in `#if`), floats, or
    strings of replacement text without line breaks.
    """

    values: Mapping[str, int | bool | float | str] = field(compare=False)
    # (name, replacement text) pairs; equality and hashing use them.
    _defines: tuple[tuple[str, str], ...] = field(init=False, repr=False)

    section: ClassVar[int] = SECTION_MACROS

    def __post_init__(self) -> None:
        defines = []
        for key, value in _check_mapping("MacroSpec", self.values).items():
            check_identifier("MacroSpec", "macro name", key, macro=True)
            if not _MACRO_NAME.match(key):
                raise ValueError(
                    f"MacroSpec: macro name must be upper case ([A-Z][A-Z0-9_]*), so that it "
                    f"replaces no identifier of the headers after it (cuda_fp16.h names a "
                    f"parameter h), got {key!r}"
                )
            defines.append((key, self._replacement(key, value)))
        object.__setattr__(self, "_defines", tuple(defines))

    @staticmethod
    def _replacement(key: str, value: object) -> str:
        label = "MacroSpec"
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, int):
            if not -(2**63) <= value < 2**63:  # the preprocessor's intmax_t
                raise ValueError(f"{label}: macro {key!r} must fit in 64 bits, got {value}")
            if value == -(2**63):  # 9223372036854775808 alone is unsigned to the preprocessor
                return f"({value + 1} - 1)"
            return f"({value})" if value < 0 else str(value)
        if isinstance(value, float):
            text = _float_literal(label, key, value)
            return f"({text})" if value < 0 else text
        if isinstance(value, str):
            if (
                any(c in value for c in "\n\r\\")
                or not value.strip()
                or "/*" in value
                or "*/" in value
                or value.count('"') % 2
                or _DIGIT_SEPARATOR.sub("", value).count("'") % 2
            ):
                raise ValueError(
                    f"{label}: macro {key!r} text must be non-empty, on one line, without "
                    f"backslashes, block comments or an unpaired quote, got {value!r}"
                )
            return value.strip()
        raise ValueError(
            f"{label}: macro {key!r} must be an int, bool, float or str, got {value!r}"
        )

    @property
    def class_name(self) -> None:
        """Macros define no class."""
        return None

    def defined_names(self) -> tuple[str, ...]:
        """The macro names."""
        return tuple(key for key, _ in self._defines)

    def dependencies(self) -> tuple[Dependency, ...]:
        """None."""
        return ()

    def generate(self) -> str:
        """The #define lines."""
        return "\n".join(f"#define {key} {text}" for key, text in self._defines)
