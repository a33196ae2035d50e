"""docs/generators.md stays true: the example makes the header shown, and the kernel compiles."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

DOC = REPO / "docs" / "generators.md"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{re.escape(language)}\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_example_output_is_the_real_output():
    (python,) = code_blocks("python")
    scope: dict = {}
    exec(python, scope)
    shown = code_blocks("c++")[0]
    assert scope["header"] == shown


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_example_kernel_compiles(arch):
    from spio.compiler import compile_cubin

    header, kernel = code_blocks("c++")
    result = compile_cubin(kernel, arch, {"tile.h": header}, use_cache=False)
    usage = result.resources["load_row"]
    assert usage.shared_bytes == 16 * 9 * 16 and not usage.spills


def test_the_protocol_lists_every_member_of_spec():
    """A spec written from the doc's list is one generate() takes: `section` was left out, and a
    spec without it is refused as "not a spec"."""
    from spio.generators import Spec

    text = " ".join(DOC.read_text().split())
    listed = re.search(r"one protocol \(`spio\.generators\.Spec`:(.*?)\)\. Bad input", text)
    assert listed is not None
    members = [*Spec.__annotations__, *(name for name in vars(Spec) if not name.startswith("_"))]
    assert sorted(members) == ["class_name", "defined_names", "dependencies", "generate", "section"]
    for member in members:
        assert f"`{member}" in listed.group(1), member
