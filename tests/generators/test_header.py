"""generate(): guard, fixed section order, dependencies once each, headers side by side."""

from __future__ import annotations

import random
import re
from pathlib import Path

import spio
from spio.generators import (
    Dim,
    FragmentSpec,
    IndexSpec,
    MacroSpec,
    ParamsSpec,
    Spec,
    TensorSpec,
    generate,
)


def sample_specs() -> list:
    return [
        TensorSpec("In", "const uint4", {"n": 2, "c8": 4}),
        FragmentSpec("Acc", "FragC_m16n8_f32", row="q", col="k"),
        ParamsSpec("Block", {"p": 8}),
        TensorSpec("Out", "__nv_bfloat16", {"n": 2, "k8": (8, 9)}),
        MacroSpec({"SPIO_X": 3}),
        TensorSpec("Tmp", "__half", {"n": 2}),
        IndexSpec("Idx", {"warp": 4, "lane": 32}),
    ]


def test_every_spec_implements_the_protocol():
    for spec in sample_specs():
        assert isinstance(spec, Spec)
        names = spec.defined_names()
        assert spec.class_name is None or names == (spec.class_name,)


def test_specs_compare_and_hash_by_what_they_generate():
    """Dim order matters, spellings of one layout do not; True and 1 differ; later dict edits
    do not leak into a spec."""
    a = TensorSpec("T", "float", {"n": 2, "c": 3})
    assert (
        a
        == TensorSpec("T", "float", {"n": 2, "c": (3, 3)})
        == TensorSpec("T", "float", {"n": 2, "c": Dim(3)})
    )
    assert a != TensorSpec("T", "float", {"c": 3, "n": 2})
    assert len({a, TensorSpec("T", "float", {"n": 2, "c": (3, 4)}), IndexSpec("T", {"n": 2})}) == 3
    assert ParamsSpec("P", {"p": 1}) != ParamsSpec("P", {"p": True})
    assert hash(MacroSpec({"X": 1})) == hash(MacroSpec({"X": 1}))
    dims = {"n": 2}
    spec = TensorSpec("T", "float", dims)
    dims["n"] = 5
    assert spec.size == 2 and "static constexpr int N = 2;" in spec.generate()


def test_sections_in_fixed_order_whatever_the_spec_order():
    specs = sample_specs()
    for seed in range(5):
        random.Random(seed).shuffle(specs)
        header = generate(specs, "conv.h")
        lines = header.splitlines()
        assert lines[1:3] == [
            "#ifndef SPIO_GEN_CONV_C819E8E7_H_",
            "#define SPIO_GEN_CONV_C819E8E7_H_",
        ]
        assert lines[-1] == "#endif  // SPIO_GEN_CONV_C819E8E7_H_"
        pos = [
            header.index(text)
            for text in (
                "#define SPIO_X 3",
                "#include <vector_types.h>",
                "#include <cuda_fp16.h>",
                "#include <cuda_bf16.h>",
                "#include <spio/warp/fragments.h>",
                "#define SPIO_GEN_FN",
            )
        ]
        assert pos == sorted(pos)
        for text in ("#include <cuda_fp16.h>", "#define SPIO_GEN_FN __host", "<vector_types.h>"):
            assert header.count(text) == 1
        # Definitions keep the caller's order, after every dependency.
        classes = [header.index(f" {s.class_name} ") for s in specs if s.class_name]
        assert classes == sorted(classes) and classes[0] > pos[-1]


def test_only_needed_dependencies():
    header = generate([ParamsSpec("P", {"a": 1})])
    assert "#include" not in header and "SPIO_GEN_FN" not in header
    header = generate([TensorSpec("T", "float", {"n": 2})])
    assert "#include" not in header and "#define SPIO_GEN_FN" in header


def test_guard_is_deterministic_and_content_based():
    a = generate([ParamsSpec("P", {"a": 1})])
    assert a == generate([ParamsSpec("P", {"a": 1})])
    guard = a.splitlines()[1].split()[1]
    other = generate([ParamsSpec("P", {"a": 2})]).splitlines()[1].split()[1]
    assert guard.startswith("SPIO_GEN_") and guard.endswith("_H_") and guard != other
    assert re.fullmatch(
        r"#ifndef SPIO_GEN_MY_PARAMS_[0-9A-F]{8}_H_",
        generate([ParamsSpec("P", {"a": 1})], "my-params.h").splitlines()[1],
    )


def _guard_of(header: str) -> str:
    return header.splitlines()[1].split()[1]


def test_named_guards_are_never_spios_own_nor_each_others():
    """A header named macros.h had spio/macros.h's guard (SPIO_MACROS_H_) and was skipped,
    silently, after spio's headers; tile-params.h and tile_params.h shared one guard."""
    include = Path(spio.__file__).parent / "include"
    runtime = Path(spio.__file__).parent / "emulator" / "runtime"  # force-included there
    own = set()
    for path in [*include.rglob("*.h"), *runtime.rglob("*.h")]:
        own.update(re.findall(r"^#ifndef (SPIO_\w+_H_)", path.read_text(), re.M))
    assert {"SPIO_MACROS_H_", "SPIO_SPIO_EMU_H_"} <= own
    names = [str(p.relative_to(include)) for p in include.rglob("*.h")]
    names += [p.name for p in include.rglob("*.h")]
    names += [p.name for p in runtime.rglob("*.h")]
    names += ["tile-params.h", "tile_params.h", "tile_params"]
    guards = {name: _guard_of(generate([ParamsSpec("P", {"a": 1})], name)) for name in names}
    assert not set(guards.values()) & own
    distinct = {"tile-params.h", "tile_params.h", "tile_params"}
    assert len({guards[name] for name in distinct}) == 3


def test_the_named_guard_does_not_hide_the_header_behind_spios_own(cxx):
    macros = generate([MacroSpec({"SPIO_TEST_ON": 1})], "macros.h")
    program = """
#include <spio/macros.h>
#include "macros.h"
#include <cstdio>
int main() { std::printf("on %d\\n", SPIO_TEST_ON); }
"""
    own = (Path(spio.__file__).parent / "include/spio/macros.h").read_text()
    assert cxx.values(program, {"spio/macros.h": own, "macros.h": macros}) == {"on": 1}


def test_two_headers_included_twice_in_one_program(cxx):
    """Guards and the shared SPIO_GEN_FN prelude let several generated headers coexist."""
    one = generate([TensorSpec("A", "float", {"n": 3, "c": 2}), MacroSpec({"SPIO_ONE": 1})])
    two = generate([TensorSpec("B", "int", {"n": 4}), IndexSpec("BIdx", {"n": 4})], "two.h")
    program = """
#include "one.h"
#include "two.h"
#include "one.h"
#include "two.h"
#include <cstdio>
int main() {
    float a[6] = {};
    int b[4] = {};
    std::printf("a %d\\n", (int)(A(a).n(2).c(1).get() - a));
    std::printf("b %d\\n", (int)(B(b).n(BIdx(3).n()).get() - b) + SPIO_ONE);
}
"""
    assert cxx.values(program, {"one.h": one, "two.h": two}) == {"a": 5, "b": 4}
