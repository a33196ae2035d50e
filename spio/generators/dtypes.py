"""C++ element types a TensorSpec may use: their sizes and the header that declares them."""

from __future__ import annotations

from .spec import CUDA_BF16, CUDA_FP16, VECTOR_TYPES, Dependency

_SCALARS = {
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "short": 2,
    "unsigned short": 2,
    "int": 4,
    "unsigned": 4,
    "unsigned int": 4,
    "long long": 8,
    "unsigned long long": 8,
    "float": 4,
    "double": 8,
}
_VECTORS = {
    "char4": 4,
    "uchar4": 4,
    "short2": 4,
    "ushort2": 4,
    "short4": 8,
    "ushort4": 8,
    "int2": 8,
    "uint2": 8,
    "int4": 16,
    "uint4": 16,
    "float2": 8,
    "float4": 16,
    "double2": 16,
}
_HALVES = {"__half": 2, "__half2": 4}
_BFLOATS = {"__nv_bfloat16": 2, "__nv_bfloat162": 4}

#: Allowed element types (without const) -> (size in bytes, dependency or None).
ELEMENT_TYPES: dict[str, tuple[int, Dependency | None]] = {
    **{name: (size, None) for name, size in _SCALARS.items()},
    **{name: (size, VECTOR_TYPES) for name, size in _VECTORS.items()},
    **{name: (size, CUDA_FP16) for name, size in _HALVES.items()},
    **{name: (size, CUDA_BF16) for name, size in _BFLOATS.items()},
}


def parse_dtype(spec: str, dtype: object) -> tuple[str, int, Dependency | None]:
    """Return (normalized C++ type, size in bytes, dependency) or raise ValueError.

    A dtype is one of ELEMENT_TYPES, optionally prefixed by "const ".
    """
    if not isinstance(dtype, str):
        raise ValueError(f"{spec}: dtype must be a C++ type name string, got {dtype!r}")
    words = dtype.split()
    base = " ".join(words[1:] if words[:1] == ["const"] else words)
    if base not in ELEMENT_TYPES:
        raise ValueError(
            f"{spec}: unknown dtype {dtype!r}; allowed (optionally with 'const '): "
            + ", ".join(ELEMENT_TYPES)
        )
    size, dependency = ELEMENT_TYPES[base]
    return " ".join(words), size, dependency
