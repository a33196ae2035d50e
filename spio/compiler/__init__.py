"""NVRTC compilation to cubin with resource reports, a disk cache, and a parallel compile pool."""

from .arch import arch_of, builds_for, check_arch
from .cache import DiskCache, cache_root, hash_key
from .compile import (
    CompileError,
    CompileResult,
    ResourceUsage,
    compile_cubin,
    parse_resource_report,
)
from .pool import CompileJob, WorkerDiedError, compile_many

__all__ = [
    "CompileError",
    "CompileJob",
    "CompileResult",
    "DiskCache",
    "ResourceUsage",
    "WorkerDiedError",
    "arch_of",
    "builds_for",
    "cache_root",
    "check_arch",
    "compile_cubin",
    "compile_many",
    "hash_key",
    "parse_resource_report",
]
