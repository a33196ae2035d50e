"""Type stub of the Cython extension driver.pyx (mypy cannot read .pyx files): every name the
module defines at Python level, with the signatures driver.pyx gives them. Keep the two in step
(`python -m mypy.stubtest spio.cuda.driver` compares them; it also lists `__reduce_cython__` and
`__setstate_cython__`, which Cython adds to pickle the KernelArg wrappers, left out here as
Cython's internals). The cdef classes are disjoint bases: with their C fields, no class can
derive from two of them."""

import numbers
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, SupportsBytes, SupportsIndex

import torch
from _typeshed import ConvertibleToFloat, ReadableBuffer
from typing_extensions import disjoint_base

class _HasDataPtr(Protocol):
    """A torch tensor, or anything else with the address of its data."""

    def data_ptr(self) -> int: ...

class _HasCudaStream(Protocol):
    """A torch.cuda.Stream: its CUstream handle."""

    @property
    def cuda_stream(self) -> int: ...

# A grid or block: an int, or a tuple or list of 1 to 3 ints.
_Dims = int | tuple[int, ...] | list[int]
# A device: an ordinal, a torch.device (of type "cuda"), or None for the current one.
_Device = int | torch.device | None
# A stream: a CUstream handle (0 or None: the default stream), or a torch.cuda.Stream.
_Stream = int | _HasCudaStream | None

built_with_cuda_version: int
_DEFAULT_LIBRARY: str

class CudaDriverError(RuntimeError): ...

class CudaError(RuntimeError):
    code: int
    name: str
    call: str
    description: str
    detail: str
    def __init__(
        self, code: int, name: str, call: str, description: str = "", detail: str = ""
    ) -> None: ...
    def __reduce__(self) -> tuple[type[CudaError], tuple[int, str, str, str, str]]: ...

#: CUDA error codes that leave the context unusable (sticky).
STICKY_ERRORS: frozenset[int]

def _sticky_note(code: int) -> str: ...
def _probe_library(path: str) -> None: ...
def library_path() -> str: ...
def init() -> None: ...
def driver_version() -> tuple[int, int]: ...
def device_count() -> int: ...

_attributes_cache: dict[int, dict[str, Any]]

# Values are ints, but "name" and "arch" (str), "compute_capability" (a pair of ints), and the
# clocks and bus width (None where the driver does not report them).
def encode_tensor_map_tiled(
    data_type: int,
    address: int,
    dims: Sequence[int],
    strides: Sequence[int],
    box: Sequence[int],
    swizzle: int,
    l2_promotion: int = 0,
) -> bytes: ...
def device_attributes(ordinal: int = 0) -> dict[str, Any]: ...

_primary_contexts: dict[int, PrimaryContext]

@disjoint_base
class PrimaryContext:
    # Raises TypeError: retain_primary_context makes them.
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @property
    def ordinal(self) -> int: ...
    @property
    def handle(self) -> int: ...
    @property
    def retained(self) -> bool: ...
    def release(self) -> None: ...
    def synchronize(self) -> None: ...
    def __enter__(self) -> PrimaryContext: ...
    def __exit__(self, *exc: object) -> None: ...
    def __repr__(self) -> str: ...

def retain_primary_context(ordinal: int = 0) -> PrimaryContext: ...

@disjoint_base
class KernelArg:
    # Raises TypeError: the subclasses below are the wrappers.
    def __init__(self, value: object = None) -> None: ...
    @property
    def value(self) -> Any: ...  # an int, float, bool or bytes, by subclass
    @property
    def nbytes(self) -> int: ...
    def __repr__(self) -> str: ...

class Int32(KernelArg):
    def __init__(self, value: SupportsIndex) -> None: ...

class UInt32(KernelArg):
    def __init__(self, value: SupportsIndex) -> None: ...

class Int64(KernelArg):
    def __init__(self, value: SupportsIndex) -> None: ...

class UInt64(KernelArg):
    def __init__(self, value: SupportsIndex) -> None: ...

class Bool(KernelArg):
    def __init__(self, value: object) -> None: ...

class Float32(KernelArg):
    def __init__(self, value: ConvertibleToFloat) -> None: ...

class Float64(KernelArg):
    def __init__(self, value: ConvertibleToFloat) -> None: ...

class Pointer(KernelArg):
    def __init__(self, value: int | _HasDataPtr) -> None: ...

class Bytes(KernelArg):
    # What bytes() takes.
    def __init__(
        self, data: ReadableBuffer | Iterable[SupportsIndex] | SupportsIndex | SupportsBytes
    ) -> None: ...

# A launch argument: an int (C int32), a float (C float; numpy's scalars too), a wrapper, or a
# data pointer.
_Arg = int | float | KernelArg | _HasDataPtr | numbers.Real

def _pack_args_for_test(
    args: Iterable[_Arg], param_sizes: Sequence[int] | None = None
) -> list[bytes]: ...
def _check_launch_config_for_test(
    grid: _Dims, block: _Dims, shared_mem_bytes: int = 0, stream: _Stream = 0
) -> tuple[tuple[int, int, int], tuple[int, int, int], int, int]: ...

@disjoint_base
class Module:
    # Raises TypeError: Module.load makes them.
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @property
    def context(self) -> PrimaryContext: ...
    @property
    def device(self) -> int: ...
    @staticmethod
    def load(cubin: bytes | bytearray | memoryview, device: _Device = None) -> Module: ...
    @property
    def closed(self) -> bool: ...
    def get_function(self, name: str) -> Function: ...
    def close(self) -> None: ...
    def __enter__(self) -> Module: ...
    def __exit__(self, *exc: object) -> None: ...
    def __repr__(self) -> str: ...

@disjoint_base
class Function:
    # Raises TypeError: Module.get_function makes them.
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def module(self) -> Module: ...
    @property
    def param_sizes(self) -> tuple[int, ...] | None: ...
    def attributes(self) -> dict[str, int]: ...
    def set_max_dynamic_shared_memory(self, nbytes: int) -> None: ...
    def launch(
        self,
        grid: _Dims,
        block: _Dims,
        args: Iterable[_Arg] = (),
        shared_mem_bytes: int = 0,
        stream: _Stream = 0,
    ) -> None: ...
    def __repr__(self) -> str: ...

__all__ = [
    "Bool",
    "Bytes",
    "CudaDriverError",
    "CudaError",
    "Float32",
    "Float64",
    "Function",
    "Int32",
    "Int64",
    "KernelArg",
    "Module",
    "Pointer",
    "PrimaryContext",
    "STICKY_ERRORS",
    "UInt32",
    "UInt64",
    "built_with_cuda_version",
    "device_attributes",
    "device_count",
    "driver_version",
    "encode_tensor_map_tiled",
    "init",
    "library_path",
    "retain_primary_context",
]
