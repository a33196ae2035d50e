"""ParamsSpec and MacroSpec headers compiled with g++: every value reads back exactly."""

from __future__ import annotations

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from spio.generators import MacroSpec, ParamsSpec, generate

# Each example compiles a C++ program; shrinking a failure would take minutes, and the
# failing program's expected-vs-actual diff already says what is wrong.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: (
        s not in {"int", "do", "if", "for", "new", "and", "or", "not", "xor", "asm", "try", "spio"}
    )
)
VALUES = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.booleans(),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
)


def _printer(name: str, value: object, expr: str) -> str:
    if isinstance(value, float):
        return f'  std::printf("{name} %a\\n", (double){expr});'
    return f'  std::printf("{name} %lld\\n", (long long){expr});'


def _parse(stdout: str) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for line in stdout.splitlines():
        key, text = line.split(" ")
        out[key] = float.fromhex(text) if "0x" in text else int(text)
    return out


@settings(max_examples=6, deadline=None, phases=NO_SHRINK)
@given(st.lists(st.dictionaries(NAMES, VALUES, min_size=1, max_size=10), min_size=1, max_size=4))
def test_params_values_read_back(cxx, structs):
    """ints, bools and float32 values read back exactly; types are int, bool, float."""
    specs = [ParamsSpec(f"Params{i}", values) for i, values in enumerate(structs)]
    body, expected = [], {}
    for i, values in enumerate(structs):
        for key, value in values.items():
            expr = f"Params{i}::{key}"
            ctype = {bool: "bool", int: "int", float: "float"}[type(value)]
            body.append(f"  static_assert(std::is_same<decltype({expr}), const {ctype}>::value);")
            body.append(_printer(f"{i}.{key}", value, expr))
            expected[f"{i}.{key}"] = int(value) if isinstance(value, bool) else value
    program = "\n".join(
        [
            '#include "p.h"',
            "#include <cstdio>",
            "#include <type_traits>",
            "int main() {",
            *body,
            "}",
        ]
    )
    assert _parse(cxx.run(program, {"p.h": generate(specs)})) == expected


def test_a_float_halfway_between_two_float32s_reads_back_as_float32_rounds_it(cxx):
    """A double halfway between two float32 values: its own decimal, which C++ rounds straight
    to float, read back as the other neighbour (1 + 2**-23) than float32(value) (1 + 2**-22)."""
    value = 1 + 3 * 2**-24
    program = "\n".join(
        ['#include "p.h"', "#include <cstdio>", "int main() {", _printer("f", 0.0, "P::f"), "}"]
    )
    got = _parse(cxx.run(program, {"p.h": generate([ParamsSpec("P", {"f": value})])}))
    assert got == {"f": 1 + 2**-22}


@settings(max_examples=4, deadline=None, phases=NO_SHRINK)
@given(st.dictionaries(NAMES.map(lambda s: "SPIO_" + s.upper()), VALUES, min_size=1, max_size=12))
def test_macro_values_read_back(cxx, values):
    """Macro values expand to the same number, negative ones safely inside expressions."""
    body, expected = [], {}
    for key, value in values.items():
        body.append(_printer(key, value, key))
        body.append(_printer(key + "_neg", value, f"-{key}"))
        expected[key] = int(value) if isinstance(value, bool) else value
        expected[key + "_neg"] = -expected[key]
    program = "\n".join(['#include "m.h"', "#include <cstdio>", "int main() {", *body, "}"])
    header = generate([MacroSpec(values)])
    stdout = cxx.run(program, {"m.h": header})
    assert _parse(stdout) == expected


def test_macro_floats_are_doubles(cxx):
    """A float macro is a double literal: values outside the float32 range read back exactly."""
    values = {"SPIO_BIG": 1e300, "SPIO_TINY": -1e-300}
    body = [_printer(key, value, key) for key, value in values.items()]
    program = "\n".join(['#include "m.h"', "#include <cstdio>", "int main() {", *body, "}"])
    assert _parse(cxx.run(program, {"m.h": generate([MacroSpec(values)])})) == values


def test_macros_usable_in_preprocessor_and_as_text(cxx):
    """bools become 1/0 for #if; strings are replacement text (here a type)."""
    spec = MacroSpec({"SPIO_ON": True, "SPIO_OFF": False, "SPIO_T": "double", "SPIO_N": -3})
    program = """
#include "m.h"
#include <cstdio>
#include <type_traits>
#if SPIO_ON && !SPIO_OFF && SPIO_N < 0
static_assert(std::is_same<SPIO_T, double>::value, "string macro is a type");
int main() { std::printf("ok %d\\n", 2 * SPIO_N); }
#endif
"""
    assert cxx.values(program, {"m.h": generate([spec])}) == {"ok": -6}


def test_the_lowest_int64_macro_is_negative_in_if_and_in_code(cxx):
    """-2**63 was written (-9223372036854775808): the literal alone is unsigned to the
    preprocessor, so `#if` saw it as positive (and g++ warned)."""
    spec = MacroSpec({"SPIO_LOW": -(2**63), "SPIO_HIGH": 2**63 - 1})
    program = """
#include "m.h"
#include <cstdio>
#include <type_traits>
#if SPIO_LOW < 0 && SPIO_HIGH > 0 && SPIO_LOW + SPIO_HIGH == -1
static_assert(std::is_same<decltype(SPIO_LOW), long>::value, "a 64-bit signed int");
int main() { std::printf("ok %d\\n", SPIO_LOW < 0); }
#endif
"""
    assert cxx.values(program, {"m.h": generate([spec])}) == {"ok": 1}
