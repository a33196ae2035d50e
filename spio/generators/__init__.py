"""Generate C++ headers of named-tensor cursors, index decompositions, parameters, macros and
named mma fragments from Python specs: `generate([TensorSpec(...), ...]) -> str`."""

from .dtypes import ELEMENT_TYPES
from .fragment import FRAGMENT_TYPES, FragmentSpec
from .header import generate
from .params import MacroSpec, ParamsSpec
from .spec import Dependency, Dim, Spec
from .tensor import IndexSpec, TensorSpec

__all__ = [
    "ELEMENT_TYPES",
    "FRAGMENT_TYPES",
    "Dependency",
    "Dim",
    "FragmentSpec",
    "IndexSpec",
    "MacroSpec",
    "ParamsSpec",
    "Spec",
    "TensorSpec",
    "generate",
]
