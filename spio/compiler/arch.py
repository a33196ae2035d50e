"""GPU architecture names spio compiles for."""

from __future__ import annotations

from .. import experimental_arch, supported_arch

_warned: set[str] = set()


def builds_for(arch: str) -> bool:
    """Whether spio compiles its kernels for `arch` (tested, or experimental)."""
    return arch in supported_arch or arch in experimental_arch


def check_arch(arch: str, warn: bool = True) -> str:
    """Return `arch` if spio can compile for it; raise ValueError naming it otherwise. An
    experimental arch is warned of once a process (`warn`: now, or by a later call)."""
    if arch in supported_arch:
        return arch
    if arch in experimental_arch:
        if warn and arch not in _warned:
            _warned.add(arch)
            from ..log import logger

            logger.warning("%s is experimental: spio's kernels are not tested on it", arch)
        return arch
    known = ", ".join(supported_arch + experimental_arch)
    raise ValueError(f"unknown GPU architecture {arch!r}; spio compiles for {known}")


def warn_here_only() -> None:
    """In a compile worker: the process that hands out the jobs warns of an experimental arch,
    so its workers do not repeat the warning each."""
    _warned.update(experimental_arch)


def has_bulk_copies(arch: str) -> bool:
    """Whether a GPU of `arch` ('sm_XY', maybe with a suffix such as 'a') has sm_90's bulk and
    tensor copies and mbarrier transaction counts (spio/thread/bulk_copy.h)."""
    return int(arch.removeprefix("sm_").rstrip("abf")) >= 90


def arch_of(capability: tuple[int, int]) -> str:
    """'sm_XY' for a (major, minor) compute capability."""
    return f"sm_{capability[0]}{capability[1]}"
