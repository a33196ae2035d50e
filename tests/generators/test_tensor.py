"""TensorSpec and IndexSpec headers compiled with g++: offsets, strides, sizes and index
decomposition checked against Python arithmetic for random dims."""

from __future__ import annotations

import math

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from spio.generators import ELEMENT_TYPES, Dim, IndexSpec, TensorSpec, generate

# Each example compiles a C++ program; shrinking a failure would take minutes, and the
# failing program's expected-vs-actual diff already says what is wrong.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)

DIM_NAMES = ["n", "p", "q", "c8", "k8", "h", "w", "x", "y", "lane", "warp", "r", "s", "g"]
HOST_DTYPES = ["float", "int", "double", "long long", "unsigned"]


@st.composite
def dims_dicts(draw, allow_padding: bool = True) -> dict:
    """Random dims: 1-4 distinct names, extents 1-9, sometimes padded (tuple or Dim form)."""
    names = draw(st.lists(st.sampled_from(DIM_NAMES), min_size=1, max_size=4, unique=True))
    dims: dict = {}
    for name in names:
        extent = draw(st.integers(1, 9))
        pad = draw(st.integers(0, 3)) if allow_padding else 0
        form = draw(st.sampled_from(["int", "tuple", "dim"]))
        if form == "tuple":
            dims[name] = (extent, extent + pad)
        elif form == "dim":
            dims[name] = Dim(extent, extent + pad if pad or draw(st.booleans()) else None)
        else:
            dims[name] = extent if not pad else (extent, extent + pad)
    return dims


def stored_extents(dims: dict) -> list[tuple[str, int, int]]:
    """[(name, extent, stored length)] from a dims dict, outermost first."""
    out = []
    for name, value in dims.items():
        if isinstance(value, Dim):
            out.append((name, value.extent, value.padded or value.extent))
        elif isinstance(value, tuple):
            out.append((name, value[0], value[1]))
        else:
            out.append((name, value, value))
    return out


def reference_strides(dims: dict) -> dict[str, int]:
    """Row-major strides over the stored (padded) lengths."""
    layout = stored_extents(dims)
    return {
        name: math.prod(s for _, _, s in layout[i + 1 :]) for i, (name, _, _) in enumerate(layout)
    }


def reference_decompose(dims: list[tuple[str, int]], flat: int) -> dict[str, int]:
    """Mixed-radix digits of `flat`, innermost fastest; the outermost digit does not wrap."""
    out = {}
    for name, extent in reversed(dims[1:]):
        flat, out[name] = divmod(flat, extent)
    out[dims[0][0]] = flat
    return out


@settings(max_examples=6, deadline=None, phases=NO_SHRINK)
@given(data=st.data())
def test_tensor_cursor_offsets_strides_and_index(cxx, data):
    """One program checks constants, random cursor moves (negative too), *cursor, and Index."""
    specs, body, expected = [], [], {}
    for t in range(data.draw(st.integers(3, 8), label="tensors")):
        dims = data.draw(dims_dicts(), label=f"dims{t}")
        dtype = data.draw(st.sampled_from(HOST_DTYPES), label=f"dtype{t}")
        cls = f"T{t}"
        specs.append(TensorSpec(cls, dtype, dims))
        layout = stored_extents(dims)
        strides = reference_strides(dims)
        size = math.prod(s for _, _, s in layout)
        sizeof = {"float": 4, "int": 4, "double": 8, "long long": 8, "unsigned": 4}[dtype]
        expected |= {f"{cls}.size": size, f"{cls}.num_bytes": size * sizeof}
        expected[f"{cls}.sizeof"] = sizeof
        body += [
            "{",
            # Moves reach +-(extent x stride) in each of up to 4 dims: up to 4 sizes either way
            # (dims of extent 1 each add a whole size), so the cursor starts 5 sizes in.
            f"  std::vector<{cls}::data_type> buf(11 * {cls}::size);",
            "  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;",
            f"  {cls}::data_type *base = buf.data() + 5 * {cls}::size;",
            f'  P("{cls}.size", {cls}::size);',
            f'  P("{cls}.num_bytes", {cls}::num_bytes);',
            f'  P("{cls}.sizeof", sizeof({cls}::data_type));',
        ]
        for name, extent, _ in layout:
            body.append(f'  P("{cls}.{name.upper()}", {cls}::{name.upper()});')
            body.append(f'  P("{cls}.stride_{name}", {cls}::stride_{name});')
            expected[f"{cls}.{name.upper()}"] = extent
            expected[f"{cls}.stride_{name}"] = strides[name]
        for m in range(data.draw(st.integers(1, 6), label="moves")):
            order = data.draw(st.permutations(layout), label="order")
            count = data.draw(st.integers(1, len(layout)), label="count")
            chain, offset = "", 0
            for name, extent, _ in order[:count]:
                i = data.draw(st.integers(-extent, extent), label=f"{name}")
                chain += f".{name}({i})"
                offset += i * strides[name]
            body.append(f"  {{ auto c = {cls}(base){chain};")
            body.append(f'    P("{cls}.move{m}", c.get() - base);')
            body.append(f'    P("{cls}.deref{m}", *c); }}')
            expected[f"{cls}.move{m}"] = offset
            assert abs(offset) <= 5 * size  # inside buf
            expected[f"{cls}.deref{m}"] = 5 * size + offset
        logical = [(name, extent) for name, extent, _ in layout]
        logical_size = math.prod(e for _, e in logical)
        expected[f"{cls}.Index.size"] = logical_size
        body.append(f'  P("{cls}.Index.size", {cls}::Index::size);')
        flats = data.draw(st.lists(st.integers(0, 2 * logical_size), min_size=1, max_size=6))
        for j, flat in enumerate(flats):
            digits = reference_decompose(logical, flat)
            body.append(f"  {{ {cls}::Index idx({flat});")
            for name, _ in logical:
                body.append(f'    P("{cls}.idx{j}.{name}", idx.{name}());')
                expected[f"{cls}.idx{j}.{name}"] = digits[name]
            body.append(f'    P("{cls}.idx{j}.offset", idx.offset());')
            body.append(f'    P("{cls}.idx{j}.flat", idx.flat()); }}')
            expected[f"{cls}.idx{j}.offset"] = sum(digits[n] * strides[n] for n, _ in logical)
            expected[f"{cls}.idx{j}.flat"] = flat
            # The decomposition is constexpr.
            first = logical[-1][0]
            body.append(
                f'  static_assert({cls}::Index({flat}).{first}() == {digits[first]}, "constexpr");'
            )
        body.append("}")
    header = generate(specs, "tensors.h")
    assert cxx.printed({"tensors.h": header}, body, ("#include <vector>",)) == expected


@settings(max_examples=5, deadline=None, phases=NO_SHRINK)
@given(st.lists(dims_dicts(allow_padding=False), min_size=2, max_size=8), st.data())
def test_index_decomposition(cxx, all_dims, data):
    """IndexSpec digits match mixed-radix arithmetic; the outermost digit does not wrap; of()
    composes the flat index again."""
    specs, body, expected = [], [], {}
    for t, dims in enumerate(all_dims):
        cls = f"I{t}"
        specs.append(IndexSpec(cls, {n: e for n, e, _ in stored_extents(dims)}))
        logical = [(n, e) for n, e, _ in stored_extents(dims)]
        size = math.prod(e for _, e in logical)
        expected[f"{cls}.size"] = size
        body.append(f'  P("{cls}.size", {cls}::size);')
        for name, extent in logical:
            expected[f"{cls}.{name.upper()}"] = extent
            body.append(f'  P("{cls}.{name.upper()}", {cls}::{name.upper()});')
        flats = data.draw(st.lists(st.integers(0, 3 * size), min_size=1, max_size=8))
        for j, flat in enumerate(flats):
            digits = reference_decompose(logical, flat)
            for name, _ in logical:
                body.append(f'  P("{cls}.{j}.{name}", {cls}({flat}).{name}());')
                expected[f"{cls}.{j}.{name}"] = digits[name]
            # of() composes the flat index from the digits (the outermost past its extent too).
            args = ", ".join(str(digits[name]) for name, _ in logical)
            body.append(f'  P("{cls}.{j}.of", {cls}::of({args}).flat());')
            expected[f"{cls}.{j}.of"] = flat
            body.append(f'  static_assert({cls}::of({args}).flat() == {flat}, "constexpr");')
    assert cxx.printed({"idx.h": generate(specs)}, body) == expected


def test_padding_example_from_docs(cxx):
    """{"q": 16, "n": 4, "k8": (8, 9)}: k8 stored in 9 slots, so stride_n = 9, stride_q = 36."""
    spec = TensorSpec("Output", "float", {"q": 16, "n": 4, "k8": (8, 9)})
    assert spec.strides == (36, 9, 1)
    assert spec.size == 576 and spec.num_bytes == 2304
    program = """
#include "out.h"
#include <cstdio>
int main() {
    static float buf[1000];
    Output out(buf + 100);
    static_assert(Output::stride_q == 36 && Output::stride_n == 9 && Output::stride_k8 == 1, "");
    static_assert(Output::size == 576 && Output::num_bytes == 2304, "");
    static_assert(Output::Q == 16 && Output::N == 4 && Output::K8 == 8, "");
    std::printf("halo %d\\n", (int)(out.q(-1).k8(3).get() - buf));
    std::printf("accumulate %d\\n", (int)(out.n(1).n(2).n(-1).get() - buf));
    std::printf("same %d\\n", (int)(out.n(2).q(1).get() == out.q(1).n(2).get()));
    *out.q(2).n(3).k8(7) = 5.0f;
    std::printf("write %d\\n", (int)buf[100 + 2 * 36 + 3 * 9 + 7]);
    return 0;
}
"""
    assert cxx.values(program, {"out.h": generate([spec])}) == {
        "halo": 100 - 36 + 3,
        "accumulate": 100 + 2 * 9,
        "same": 1,
        "write": 5,
    }


def test_const_dtype_cursor_reads(cxx):
    """A "const float" tensor wraps a const pointer and reads through it."""
    spec = TensorSpec("In", "const float", {"h": 3, "w": 5})
    program = """
#include "in.h"
#include <cstdio>
#include <type_traits>
int main() {
    static_assert(std::is_same<In::data_type, const float>::value, "");
    const float data[15] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    In in(data);
    std::printf("v %d\\n", (int)*in.h(2).w(1));
    return 0;
}
"""
    assert cxx.values(program, {"in.h": generate([spec])}) == {"v": 11}


def test_every_element_type_has_its_declared_size(cxx):
    """sizeof of every allowed dtype (CUDA types too) matches the table and num_bytes."""
    dtypes = sorted(ELEMENT_TYPES)
    specs = [TensorSpec(f"T{i}", dtype, {"x": 3}) for i, dtype in enumerate(dtypes)]
    lines = []
    for i in range(len(specs)):
        lines.append(f'  P("T{i}.sizeof", sizeof(T{i}::data_type));')
        lines.append(f'  P("T{i}.num_bytes", T{i}::num_bytes);')
    expected = {}
    for i, dtype in enumerate(dtypes):
        expected[f"T{i}.sizeof"] = ELEMENT_TYPES[dtype][0]
        expected[f"T{i}.num_bytes"] = 3 * ELEMENT_TYPES[dtype][0]
    assert cxx.printed({"all.h": generate(specs)}, lines, cuda=True) == expected
