"""Bad specs raise ValueError naming the spec and the offending value."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spio.generators import (
    Dim,
    FragmentSpec,
    IndexSpec,
    MacroSpec,
    ParamsSpec,
    TensorSpec,
    generate,
)
from tests.generators.conftest import FRAGMENTS_H

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def make(kind: str, name: object):
    """A spec of `kind` with class name `name` and otherwise valid arguments."""
    if kind == "tensor":
        return TensorSpec(name, "float", {"n": 2})
    if kind == "index":
        return IndexSpec(name, {"n": 2})
    if kind == "params":
        return ParamsSpec(name, {"p": 1})
    if kind == "fragment":
        return FragmentSpec(name, "FragC_m16n8_f32", row="q", col="k")
    return MacroSpec({name: 1})


KINDS = ["tensor", "index", "params", "fragment", "macro"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "name", ["", "1abc", "a-b", "a b", "né", None, 3, "class", "int", "__x", "_X"]
)
def test_bad_names(kind, name):
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        make(kind, name)


@given(st.text(max_size=12).filter(lambda s: not IDENTIFIER.match(s)))
def test_non_identifiers_rejected(name):
    for kind in KINDS:
        with pytest.raises(ValueError, match="identifier"):
            make(kind, name)


@pytest.mark.parametrize(
    "keyword", ["const", "namespace", "while", "nullptr", "and", "template", "defined"]
)
def test_keywords_rejected_everywhere(keyword):
    for kind in KINDS:
        with pytest.raises(ValueError, match=f"'{keyword}' is a C\\+\\+ keyword"):
            make(kind, keyword)
    with pytest.raises(ValueError, match="keyword"):
        TensorSpec("T", "float", {keyword: 2})
    with pytest.raises(ValueError, match="keyword"):
        ParamsSpec("P", {keyword: 2})
    with pytest.raises(ValueError, match="keyword"):
        FragmentSpec("F", "FragC_m16n8_f32", row=keyword, col="k")


@pytest.mark.parametrize(
    "first, second",
    [
        (TensorSpec("Out", "float", {"n": 2}), IndexSpec("Out", {"n": 2})),
        (ParamsSpec("Block", {"p": 1}), ParamsSpec("Block", {"q": 1})),
        (MacroSpec({"ACC": 1}), FragmentSpec("ACC", "FragC_m16n8_f32", row="q", col="k")),
        (MacroSpec({"SPIO_X": 1}), MacroSpec({"SPIO_X": 2})),
    ],
)
def test_duplicate_names_in_one_header(first, second):
    name = first.defined_names()[0]
    with pytest.raises(ValueError, match=f"name '{name}' is defined twice"):
        generate([first, second])


@pytest.mark.parametrize(
    "macro, other, where",
    [
        ("N", TensorSpec("Input", "float", {"n": 4, "c": 8}), "TensorSpec"),  # its extent N
        ("X", IndexSpec("T", {"x": 4}), "IndexSpec"),  # an extent constant
        ("defined", None, None),  # a keyword: refused by MacroSpec itself
        (
            "SPIO_HOST_DEVICE",
            FragmentSpec("Acc", "FragC_m16n8_f32", row="q", col="k"),
            "fragments.h",
        ),
    ],
)
def test_a_macro_naming_an_identifier_of_the_header_is_refused(macro, other, where):
    """The preprocessor replaces a macro's name in all the code after it: a MacroSpec N beside
    a tensor whose extent constant is N gave a header that failed to compile (`static constexpr
    int 128`), where the clash is a ValueError naming the macro and where it is used."""
    if other is None:
        with pytest.raises(ValueError, match="keyword"):
            MacroSpec({macro: 1})
        return
    with pytest.raises(ValueError) as error:
        generate([MacroSpec({macro: 128}), other])
    message = str(error.value)
    assert f"macro {macro!r} of MacroSpec" in message and where in message, message


@pytest.mark.parametrize("name", ["h", "x", "Tile", "tile_m"])
def test_a_macro_name_must_be_upper_case(name):
    """The CUDA headers after the macros are not read for clashes: #define h 1 broke
    cuda_fp16.h (a parameter h) and #define x 1 vector_types.h, where the header had passed."""
    with pytest.raises(ValueError, match=f"must be upper case .*got {name!r}"):
        MacroSpec({name: 1})


def test_include_lines_comments_and_strings_are_not_code():
    """No macro replaces inside an #include's header name, a comment or a string literal."""
    from spio.generators.header import _code_names

    text = (
        '#include <spio/X_FILE.h>\n// NOTE: COMMENT\n/* BLOCK */ const char *s = "STRING"; int y;'
    )
    assert _code_names(text) == {"const", "char", "s", "int", "y"}


def test_macros_may_name_each_other():
    """A macro's text may name another macro; SPIO_-prefixed macros never meet generated
    names."""
    header = generate(
        [
            MacroSpec({"SPIO_A": 2, "SPIO_B": "SPIO_A"}),
            TensorSpec("T", "float", {"x": 4}),
        ]
    )
    assert "#define SPIO_B SPIO_A" in header


@pytest.mark.parametrize("name", ["float4", "uint4", "half2", "dim3", "nv_bfloat16"])
def test_cuda_type_names_are_refused(name):
    """A TensorSpec named float4 redefined CUDA's type (a compile error where both are seen),
    and a dim named uint4 beside a uint4 dtype changed its meaning."""
    with pytest.raises(ValueError, match=f"'{name}' is the name of a CUDA type"):
        TensorSpec(name, "float", {"n": 2})
    with pytest.raises(ValueError, match=f"'{name}' is the name of a CUDA type"):
        TensorSpec("T", "uint4", {name: 4})


def test_macro_ints_must_fit_the_preprocessors_64_bits():
    assert "#define A (-9223372036854775807 - 1)" in generate([MacroSpec({"A": -(2**63)})])
    for value in (2**63, 2**70, -(2**63) - 1):
        with pytest.raises(ValueError, match=f"macro 'A' must fit in 64 bits, got {value}"):
            MacroSpec({"A": value})


def test_reserved_macro_and_non_specs():
    with pytest.raises(ValueError, match="SPIO_GEN_FN"):
        generate([MacroSpec({"SPIO_GEN_FN": 1})])
    with pytest.raises(ValueError, match="not a spec"):
        generate(["struct X {};"])


@pytest.mark.parametrize("extent", [0, -1, -8, True, 2.0, "4", None])
def test_bad_extents(extent):
    with pytest.raises(ValueError, match=r"TensorSpec 'T'.*'k8'.*" + re.escape(repr(extent))):
        TensorSpec("T", "float", {"n": 2, "k8": extent})
    with pytest.raises(ValueError, match=r"IndexSpec 'I'.*'k8'.*" + re.escape(repr(extent))):
        IndexSpec("I", {"n": 2, "k8": extent})


@pytest.mark.parametrize("padded", [0, -9, 7, 1])
def test_padding_smaller_than_extent(padded):
    with pytest.raises(ValueError, match=rf"TensorSpec 'T'.*'k8'.*{padded}"):
        TensorSpec("T", "float", {"k8": (8, padded)})
    with pytest.raises(ValueError, match=rf"TensorSpec 'T'.*'k8'.*{padded}"):
        TensorSpec("T", "float", {"k8": Dim(8, padded)})


@pytest.mark.parametrize(
    "dims", [{}, None, [("n", 2)], {"n": (2, 3, 4)}, {"N": 2}, {"_n": 2}, {"nC": 2}]
)
def test_bad_dims(dims):
    with pytest.raises(ValueError, match="TensorSpec 'T'"):
        TensorSpec("T", "float", dims)


def test_index_dims_cannot_be_padded():
    with pytest.raises(ValueError, match=r"IndexSpec 'I'.*'n' cannot be padded"):
        IndexSpec("I", {"n": (2, 3)})


@pytest.mark.parametrize(
    "dim", ["size", "get", "stride_n", "ptr_", "data_type", "flat", "of", "offset", "i_"]
)
def test_dim_names_that_clash_with_members(dim):
    with pytest.raises(ValueError, match=f"TensorSpec 'T'.*'{dim}'"):
        TensorSpec("T", "float", {"n": 2, dim: 3})


def test_dim_name_equal_to_class_name():
    with pytest.raises(ValueError, match="equals the class name"):
        IndexSpec("n", {"n": 2})
    with pytest.raises(ValueError, match="'K' equals the class name"):
        FragmentSpec("K", "FragC_m16n8_f32", row="q", col="k")
    with pytest.raises(ValueError, match="'Index' equals the class name"):
        TensorSpec("Index", "float", {"n": 2})


def test_too_large_tensor():
    with pytest.raises(ValueError, match="TensorSpec 'Big'"):
        TensorSpec("Big", "uint4", {"a": 2**16, "b": 2**13})
    with pytest.raises(ValueError, match="IndexSpec 'Big'"):
        IndexSpec("Big", {"a": 2**16, "b": 2**16})


@pytest.mark.parametrize(
    "dtype",
    ["half", "float16", "torch.float16", "const", "const const float", "uint4*", "", 3, None],
)
def test_unknown_dtypes(dtype):
    with pytest.raises(ValueError, match=r"TensorSpec 'T'.*dtype.*" + re.escape(repr(dtype))):
        TensorSpec("T", dtype, {"n": 2})


@pytest.mark.parametrize("fragment_type", ["FragC_m16n8_f16", "fragc_m16n8_f32", "", "FragA"])
def test_unknown_fragment_types(fragment_type):
    with pytest.raises(ValueError, match=f"FragmentSpec 'F'.*{re.escape(repr(fragment_type))}"):
        FragmentSpec("F", fragment_type, row="q", col="k")


@pytest.mark.parametrize(
    "row, col",
    [("q", "q"), ("row", "k"), ("q", "reg"), ("rows", "k"), ("Q", "k"), ("q", ""), ("q", "k-1")],
)
def test_bad_fragment_dims(row, col):
    with pytest.raises(ValueError, match="FragmentSpec 'F'"):
        FragmentSpec("F", "FragA_m16n8k8_f16", row=row, col=col)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"h": 2, "k": 4}, "must multiply to the fragment's 16 rows"),
        ({"h": 2, "k": 16}, "must multiply to the fragment's 16 rows"),
        ({"h": 0, "k": 8}, "row dim 'h' needs a positive extent, got 0"),
        ({"h": True, "k": 16}, "row dim 'h' needs a positive extent, got True"),
        ({"h": 2.0, "k": 8}, "row dim 'h' needs a positive extent, got 2.0"),
        ({"h": 2, "c": 8}, "'c'"),  # the column's name too
        ({"H": 2, "k": 8}, "lower case"),
        ({}, "row must be a dim name or a non-empty mapping"),
        (["h", "k"], "row must be a dim name or a non-empty mapping"),
        (None, "row must be a dim name or a non-empty mapping"),
    ],
)
def test_bad_split_fragment_dims(row, message):
    with pytest.raises(ValueError, match=f"FragmentSpec 'F'.*{re.escape(message)}"):
        FragmentSpec("F", "FragC_m16n8_f32", row=row, col="c")


def test_split_fragment_dims_compare_by_value():
    one = FragmentSpec("F", "FragC_m16n8_f32", row={"h": 2, "k": 8}, col="c")
    assert one == FragmentSpec("F", "FragC_m16n8_f32", row={"h": 2, "k": 8}, col="c")
    assert hash(one) == hash(FragmentSpec("F", "FragC_m16n8_f32", row={"h": 2, "k": 8}, col="c"))
    assert one != FragmentSpec("F", "FragC_m16n8_f32", row={"k": 8, "h": 2}, col="c")
    assert one != FragmentSpec("F", "FragC_m16n8_f32", row="hk", col="c")


@pytest.mark.parametrize(
    "value", ["8", None, 2**31, -(2**31) - 1, float("inf"), float("nan"), [1], 1e300, -1e39, 1e-60]
)
def test_bad_param_values(value):
    with pytest.raises(ValueError, match=r"ParamsSpec 'Block'.*'p'"):
        ParamsSpec("Block", {"p": value})


def _fragment_members() -> list[str]:
    """Members declared in the bodies of spio/warp/fragments.h's fragment structs, read from it."""
    bodies = re.findall(
        r"^struct (?:OperandFragment|Frag\w+) \{\n(.*?)^\};", FRAGMENTS_H.read_text(), re.M | re.S
    )
    member = re.compile(
        r"^ {4}(?:SPIO_HOST_DEVICE\s+)?(?:static\s+)?(?:constexpr\s+)?"
        r"(?:using\s+(\w+)\s*=|(?:typename\s+)?[\w:<>]+\s+(\w+)\s*[\[(;=])",
        re.M,
    )
    names = {a or b for body in bodies for a, b in member.findall(body)}
    assert len(bodies) == 2 and {"reg", "row", "get_reg", "to_half2"} <= names  # the parse works
    return sorted(names)


@pytest.mark.parametrize("member", [*_fragment_members(), "fragment_type"])
def test_fragment_dims_cannot_hide_base_members(member):
    """A row or column dim named after a member of the fragment base (or FragmentSpec's typedef)
    would hide it."""
    with pytest.raises(ValueError, match=f"FragmentSpec 'F'.*'{member}'"):
        FragmentSpec("F", "FragA_m16n8k8_f16", row=member, col="k")


def test_limits_are_inclusive():
    """2**31 - 1 elements and the whole int32 range fit (one more fails: tests above)."""
    assert "size = 2147483647;" in IndexSpec("I", {"n": 2**31 - 1}).generate()
    text = ParamsSpec("Block", {"hi": 2**31 - 1, "lo": -(2**31)}).generate()
    assert "int hi = 2147483647;" in text and "int lo = -2147483648;" in text


def test_tensor_bytes_must_fit_an_int():
    """num_bytes is a C++ int: 2**28 doubles (2 GiB) are refused though their count fits."""
    with pytest.raises(
        ValueError, match="TensorSpec 'T': 268435456 elements of double exceed 2 GiB"
    ):
        TensorSpec("T", "double", {"a": 2**14, "b": 2**14})
    assert TensorSpec("T", "double", {"a": 2**14, "b": 2**14 - 1}).num_bytes == 2**31 - 2**17


def test_param_floats_at_the_edges_of_float32():
    """1e300 read back as inf and 1e-60 as 0 (g++ only warned); the float32 range itself is fine."""
    text = ParamsSpec("Block", {"big": 3.0e38, "small": 1.5e-45, "zero": 0.0}).generate()
    # (each the decimal of its float32 value: 1.5e-45 is the smallest subnormal, 2**-149)
    assert "big = 3.0000000054977558e+38f" in text and "zero = 0.0f" in text
    assert "small = 1.401298464324817e-45f" in text


def test_a_param_float_halfway_between_two_float32s_reads_as_python_rounds_it():
    """The literal was the double's decimal, which C++ rounds straight to float: for a double
    halfway between two float32 values that gave the other neighbour than float32(value)."""
    import struct

    value = 1 + 3 * 2**-24  # halfway between 1 + 2**-23 and 1 + 2**-22
    want = struct.unpack("f", struct.pack("f", value))[0]
    text = ParamsSpec("P", {"f": value}).generate()
    assert f"f = {want!r}f;" in text and want == 1 + 2**-22


@pytest.mark.parametrize("values", [{}, None, {"p": 1, "Block": 2}])
def test_bad_param_dicts(values):
    with pytest.raises(ValueError, match="ParamsSpec 'Block'"):
        ParamsSpec("Block", values)


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "x \\", "", "  ", None, float("nan"), [1]])
def test_bad_macro_values(value):
    with pytest.raises(ValueError, match=r"MacroSpec.*'SPIO_X'"):
        MacroSpec({"SPIO_X": value})


def test_bad_header_name():
    with pytest.raises(ValueError, match="header_name"):
        generate([ParamsSpec("P", {"p": 1})], header_name="...")


@pytest.mark.parametrize(
    "spec, message",
    [
        (lambda: ParamsSpec("P", {"warpSize": 32}), "CUDA built-in variable"),
        (lambda: TensorSpec("threadIdx", "float", {"n": 2}), "CUDA built-in variable"),
        (lambda: IndexSpec("I", {"blockDim": 2}), "CUDA built-in variable"),
        (lambda: ParamsSpec("P", {"SPIO_GEN_FN": 1}), "starts with SPIO_"),
        (lambda: TensorSpec("SPIO_DEVICE", "float", {"n": 2}), "starts with SPIO_"),
        (lambda: FragmentSpec("spio", "FragC_m16n8_f32", row="q", col="k"), "namespace"),
        (lambda: TensorSpec("std", "__half", {"n": 2}), "'std' is the name of a namespace"),
        (lambda: TensorSpec("T", "float", {"spio_device": 4}), "constant 'SPIO_DEVICE'"),
        (lambda: TensorSpec("T", "float", {"spio_gen_fn": 4}), "starts with SPIO_"),
        (lambda: TensorSpec("T", "float", {"null": 4}), "'NULL' is a macro of the standard"),
        (lambda: IndexSpec("I", {"assert": 4}), "'assert' is a macro of the standard"),
        (lambda: MacroSpec({"NV_IS_DEVICE": 1}), "prefix of the CUDA headers' own macros"),
        (lambda: TensorSpec("T", "float", {"int32_max": 4}), "'INT32_MAX' is a macro of"),
        (lambda: TensorSpec("T", "float", {"size_max": 4}), "'SIZE_MAX' is a macro of"),
        (lambda: TensorSpec("T", "float", {"uint_least8_max": 4}), "'UINT_LEAST8_MAX' is a"),
        (lambda: TensorSpec("T", "float", {"cudart_version": 4}), "prefix of the CUDA headers'"),
        (lambda: TensorSpec("CUDA_T", "float", {"n": 4}), "prefix of the CUDA headers'"),
    ],
)
def test_names_that_are_macros_or_namespaces_elsewhere_are_refused(spec, message):
    """Each was accepted and gave a header that failed to compile, some only in the CPU
    emulator (which defines warpSize, threadIdx, ... as macros); a dim's upper-case extent
    constant is checked as a name too (spio_device, null), and a macro named NV_IS_DEVICE broke
    cuda_fp16.h."""
    with pytest.raises(ValueError, match=message):
        spec()


@pytest.mark.parametrize("text", ["1 /* tile", "2 */", '"abc', "it's"])
def test_macro_text_that_would_break_the_header_is_refused(text):
    with pytest.raises(ValueError, match="block comments or an unpaired quote"):
        MacroSpec({"SPIO_A": text})


@pytest.mark.parametrize("text", ["1'024", "0x1'F", "1'000'000"])
def test_macro_text_may_use_digit_separators(text):
    """A C++14 digit separator is no quote (the unpaired-quote rule had refused 1'024)."""
    assert f"#define SPIO_A {text}" in generate([MacroSpec({"SPIO_A": text})], "m.h")
