"""generate(): assemble specs into one guarded, self-contained C++ header."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from .spec import SECTION_MACROS, Dependency, Spec

_RESERVED = frozenset({"SPIO_GEN_FN"})


#: What a macro cannot replace: comments and string literals (dropped before collecting names).
_NOT_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', re.DOTALL)
#: An #include line; its header name is no code either.
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.MULTILINE)
#: Where spio's own headers (`#include <spio/...>`) are.
_SPIO_INCLUDE = Path(__file__).resolve().parent.parent / "include"


def _code_names(text: str) -> set[str]:
    """The identifiers of C++ `text`, and of the spio headers it includes, followed through
    theirs (CUDA's own headers are not read)."""
    names = set(re.findall(r"\b[A-Za-z_]\w*\b", _NOT_CODE.sub(" ", _INCLUDE.sub(" ", text))))
    for included in _INCLUDE.findall(text):
        if included.startswith("spio/"):
            names |= _spio_header_names(included)
    return names


@functools.cache
def _spio_header_names(path: str) -> frozenset[str]:
    """_code_names of spio's header `path` (e.g. "spio/warp/fragments.h"); none where it is not
    one of the package's."""
    file = _SPIO_INCLUDE / path
    if not file.is_file():
        return frozenset()
    return frozenset(_code_names(file.read_text(encoding="utf-8")))


def _check_macro_names(macros: list[Spec], rest: list[tuple[str, str]]) -> None:
    """ValueError where a macro's name is an identifier of the code after it ((what, text)
    pairs: the dependencies' and the other specs', with the spio headers they include): the
    preprocessor would replace it there, and the header would fail to compile (a macro N
    against a tensor's extent N)."""
    names = {name: spec for spec in macros for name in spec.defined_names()}
    if not names:
        return
    for what, text in rest:
        used = _code_names(text) & names.keys()
        if used:
            name = sorted(used)[0]
            raise ValueError(
                f"generate: macro {name!r} of {names[name]!r} would replace the identifier "
                f"{name!r} in the code of {what}"
            )


def _included(dependency: Dependency) -> str:
    """A dependency as an error message names it: its #include line."""
    match = _INCLUDE.search(dependency.text)
    return repr(match.group(0).strip() if match else dependency.text)


def _guard(header_name: str | None, body: str) -> str:
    """The include guard: SPIO_GEN_ and a hash of the content, or of the header's name (its
    letters and digits kept, so that the guard reads as the name). Never the guard of one of
    spio's own headers (SPIO_<NAME>_H_), and two names that differ only in punctuation
    ("tile-params.h", "tile_params.h") get two guards."""
    if header_name is None:
        return f"SPIO_GEN_{_digest(body, 16)}_H_"
    stem = re.sub(r"[^A-Za-z0-9]+", "_", header_name).strip("_").upper()
    if not stem:
        raise ValueError(
            f"generate: header_name must contain letters or digits, got {header_name!r}"
        )
    stem = re.sub(r"_H$", "", stem)
    return f"SPIO_GEN_{stem}_{_digest(header_name, 8)}_H_"


def _digest(text: str, digits: int) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:digits].upper()


def generate(specs: Iterable[Spec], header_name: str | None = None) -> str:
    """Return one C++ header defining every spec, for host compilers, nvcc and NVRTC.

    Order: macros, dependencies (each once, in a fixed order), then definitions in the given
    order. The guard is `SPIO_GEN_<HEADER_NAME>_<hash of the name>_H_`, or derived from the
    content when no name is given.
    Raises ValueError when two specs define the same name.
    """
    specs = list(specs)
    owner: dict[str, Spec] = {}
    for spec in specs:
        if not isinstance(spec, Spec):
            raise ValueError(f"generate: not a spec (TensorSpec, IndexSpec, ...): {spec!r}")
        for name in spec.defined_names():
            if name in _RESERVED:
                raise ValueError(f"generate: {spec!r} defines {name!r}, which the header reserves")
            if name in owner:
                raise ValueError(
                    f"generate: name {name!r} is defined twice, by {owner[name]!r} and {spec!r}"
                )
            owner[name] = spec
    dependencies: set[Dependency] = set()
    for spec in specs:
        dependencies.update(spec.dependencies())
    macros = [spec for spec in specs if spec.section == SECTION_MACROS]
    rest = [(_included(dep), dep.text) for dep in sorted(dependencies)]
    rest += [(repr(spec), spec.generate()) for spec in specs if spec.section != SECTION_MACROS]
    _check_macro_names(macros, rest)
    blocks = [spec.generate() for spec in macros] + [text for _, text in rest]
    body = "\n\n".join(blocks)
    guard = _guard(header_name, body)
    return (
        "/// Generated by spio.generators; do not edit.\n"
        f"#ifndef {guard}\n#define {guard}\n\n{body}\n\n#endif  // {guard}\n"
    )
