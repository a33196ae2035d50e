"""An outermost dim of extent None (given at run time, e.g. the batch): no extent constant, no
size or num_bytes, every stride; the text, g++ and NVRTC builds, errors and spec equality."""

from __future__ import annotations

import re

import pytest

import spio
from spio.generators import ELEMENT_TYPES, Dim, IndexSpec, TensorSpec, generate
from tests.generators.test_nvrtc import compile_for
from tests.generators.test_tensor import reference_decompose

# n given at run time; x padded, so stride_n (3 * 6 = 18) differs from the logical inner size 15.
ACT_DIMS: dict = {"n": None, "y": 3, "x": (5, 6)}


def code(text: str) -> str:
    """The generated text without its /// comments."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("///"))


def constants(text: str) -> dict[str, int]:
    """Every `static constexpr int NAME = VALUE;` of a generated class, nested Index included."""
    return {k: int(v) for k, v in re.findall(r"static constexpr int (\w+) = (-?\d+);", text)}


def test_runtime_outermost_text():
    """No N, size or num_bytes (the class's or its Index's); every other constant as before."""
    text = TensorSpec("Act", "float", ACT_DIMS).generate()
    cursor, index = text.split("class Index {")
    assert constants(cursor) == {"Y": 3, "X": 5, "stride_n": 18, "stride_y": 6, "stride_x": 1}
    assert constants(index) == {"Y": 3, "X": 5}
    for name in ("N", "size", "num_bytes"):
        assert not re.search(rf"\b{name}\b", code(text)), name
    assert "static_assert(sizeof(data_type) == 4," in cursor
    assert "constexpr Act n(int i) const { return Act(ptr_ + i * stride_n); }" in cursor
    assert "int n() const { return i_ / 15; }" in index
    assert "int offset() const { return n() * 18 + y() * 6 + x(); }" in index
    assert "n(run time) > y(3) > x(5, padded to 6)" in cursor
    # Dim(None) is the same dim as None.
    assert TensorSpec("Act", "float", {**ACT_DIMS, "n": Dim(None)}).generate() == text

    text = IndexSpec("Blk", {"n": None, "t": 4}).generate()
    assert constants(text) == {"T": 4}
    assert not re.search(r"\b(N|size)\b", code(text))
    assert "int n() const { return i_ / 4; }" in text and "int t() const { return i_ % 4; }" in text


def test_runtime_outermost_host(cxx):
    """g++: no N/size/num_bytes members; strides; cursor moves and Index digits (and offsets)
    for outermost indices far past any fixed extent, against Python."""
    specs = [
        TensorSpec("Act", "float", ACT_DIMS),
        TensorSpec("Vec", "double", {"n": None}),
        IndexSpec("Blk", {"n": None, "p": 7, "q": 3}),
    ]
    body, expected = [], {}
    members = {"Act": "N size num_bytes Y", "Act::Index": "N size Y", "Vec": "N size num_bytes"}
    members |= {"Blk": "N size P"}
    for cls, names in members.items():
        for name in names.split():
            body.append(f'  P("{cls}.has_{name}", has_{name}<{cls}>::value);')
            expected[f"{cls}.has_{name}"] = name in ("Y", "P")
    body += [
        '  P("Act.stride_n", Act::stride_n);',
        '  P("Act.stride_y", Act::stride_y);',
        '  P("Vec.stride_n", Vec::stride_n);',
        "  std::vector<float> act(2000 * Act::stride_n);",
        "  std::vector<double> vec(2000);",
    ]
    expected |= {"Act.stride_n": 18, "Act.stride_y": 6, "Vec.stride_n": 1}
    for n in (0, 1, 7, 1999):
        body.append(f'  P("Act.move{n}", Act(act.data()).n({n}).y(2).x(4).get() - act.data());')
        body.append(f'  P("Vec.move{n}", Vec(vec.data()).n({n}).get() - vec.data());')
        expected[f"Act.move{n}"] = n * 18 + 2 * 6 + 4
        expected[f"Vec.move{n}"] = n
    act_logical = [("n", None), ("y", 3), ("x", 5)]
    for flat in (0, 14, 15, 1234, 10**6 + 7, 10**8 + 3):
        digits = reference_decompose(act_logical, flat)
        for name, _ in act_logical:
            body.append(f'  P("Act.{flat}.{name}", Act::Index({flat}).{name}());')
            expected[f"Act.{flat}.{name}"] = digits[name]
        body.append(f'  P("Act.{flat}.offset", Act::Index({flat}).offset());')
        expected[f"Act.{flat}.offset"] = digits["n"] * 18 + digits["y"] * 6 + digits["x"]
        body.append(f'  static_assert(Act::Index({flat}).n() == {digits["n"]}, "constexpr");')
    blk_logical = [("n", None), ("p", 7), ("q", 3)]
    for flat in (0, 20, 21, 22, 999_999, 2**31 - 1):
        digits = reference_decompose(blk_logical, flat)
        for name, _ in blk_logical:
            body.append(f'  P("Blk.{flat}.{name}", Blk({flat}).{name}());')
            expected[f"Blk.{flat}.{name}"] = digits[name]
        body.append(f'  P("Vec.{flat}.n", Vec::Index({flat}).n());')
        expected[f"Vec.{flat}.n"] = flat
    detect = [
        f"template <typename T, typename = void> struct has_{name} : std::false_type {{}};\n"
        f"template <typename T> struct has_{name}<T, std::void_t<decltype(T::{name})>>"
        " : std::true_type {};"
        for name in ("N", "size", "num_bytes", "Y", "P")
    ]
    preamble = ("#include <type_traits>", "#include <vector>", *detect)
    assert cxx.printed({"runtime.h": generate(specs, "runtime.h")}, body, preamble) == expected


@pytest.mark.parametrize("arch", spio.supported_arch)
def test_runtime_outermost_compiles_with_nvrtc(arch):
    """Every dtype (its sizeof static_assert without num_bytes) and a run-time IndexSpec, used
    with the batch from a kernel argument."""
    specs = [IndexSpec("Blk", {"n": None, "t": 4})]
    body = ["  Blk blk(blockIdx.x * blockDim.x + threadIdx.x);", "  float acc = blk.t();"]
    for i, dtype in enumerate(sorted(ELEMENT_TYPES)):
        cls = f"T{i}"
        specs.append(TensorSpec(cls, dtype, {"n": None, "y": 3, "c8": (8, 9)}))
        body += [
            f"  {{ {cls} t(reinterpret_cast<{cls}::data_type *>(out));",
            f"    {cls}::Index idx(threadIdx.x);",
            "    if (blk.n() < batch) acc += (t.n(blk.n()).c8(idx.c8()).get() - t.get());",
            f"    acc += idx.n() + idx.offset() + {cls}::stride_n + {cls}::Y; }}",
        ]
    body.append("  out[threadIdx.x] = acc;")
    header = generate(specs, "generated.h")
    assert "num_bytes" not in header
    compile_for(arch, header, ["  const int batch = static_cast<int>(out[0]);", *body])


@pytest.mark.parametrize("kind", ["tensor", "index"])
@pytest.mark.parametrize("value", [None, Dim(None), (None, 3)])
def test_runtime_extent_only_on_the_outermost_dim(kind, value):
    label = {"tensor": "TensorSpec 'T'", "index": "IndexSpec 'I'"}[kind]
    for dims in ({"n": 2, "x": value}, {"n": None, "y": 2, "x": value}):
        with pytest.raises(ValueError, match=rf"{label}: dim 'x' .*only the outermost"):
            if kind == "tensor":
                TensorSpec("T", "float", dims)
            else:
                IndexSpec("I", dims)


@pytest.mark.parametrize("value", [Dim(None, 9), (None, 9)])
def test_runtime_extent_cannot_be_padded(value):
    with pytest.raises(ValueError, match=r"TensorSpec 'T': dim 'n' of run-time extent .*padded"):
        TensorSpec("T", "float", {"n": value, "x": 2})
    with pytest.raises(ValueError, match=r"IndexSpec 'I': dim 'n' of run-time extent .*padded"):
        IndexSpec("I", {"n": value})


def test_runtime_extent_bytes_of_one_outermost_index_must_fit_an_int():
    """One n's elements count: 2**28 doubles (2 GiB) are refused, padding included."""
    with pytest.raises(
        ValueError, match="TensorSpec 'T': 268435456 elements of double exceed 2 GiB"
    ):
        TensorSpec("T", "double", {"n": None, "x": 2**28})
    with pytest.raises(ValueError, match="TensorSpec 'T': 268435456 elements of .*2 GiB"):
        TensorSpec("T", "double", {"n": None, "x": (2**27, 2**28)})
    assert TensorSpec("T", "double", {"n": None, "x": 2**28 - 1}).strides == (2**28 - 1, 1)
    with pytest.raises(ValueError, match="TensorSpec 'T': dims span 4294967296 elements"):
        TensorSpec("T", "float", {"n": None, "a": 2**16, "b": 2**16})
    with pytest.raises(ValueError, match="IndexSpec 'I': dims span 2147483648 elements"):
        IndexSpec("I", {"n": None, "a": 2**31})


def test_runtime_extent_size_equality_and_hash():
    spec = TensorSpec("T", "float", {"n": None, "c": 3})
    assert spec.size is None and spec.num_bytes is None and spec.strides == (3, 1)
    same = TensorSpec("T", "float", {"n": Dim(None), "c": Dim(3)})
    assert spec == same and hash(spec) == hash(same)
    fixed = TensorSpec("T", "float", {"n": 4, "c": 3})
    assert fixed.size == 12 and fixed.num_bytes == 48
    assert spec != fixed and len({spec, same, fixed}) == 2
    assert IndexSpec("I", {"n": None, "c": 3}) == IndexSpec("I", {"n": Dim(None), "c": 3})
    assert IndexSpec("I", {"n": None, "c": 3}) != IndexSpec("I", {"n": 4, "c": 3})
    assert hash(IndexSpec("I", {"n": None})) == hash(IndexSpec("I", {"n": Dim(None)}))
    assert generate([spec]) == generate([same]) != generate([fixed])
