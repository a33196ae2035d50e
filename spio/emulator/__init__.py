"""The CPU emulator: runs spio's real CUDA kernel sources on CPU tensors.

Each CUDA thread is a user-level fiber; warp collectives (mma.sync, ldmatrix, shuffles) meet at a
warp barrier; cp.async copies are deferred to the wait that covers them; and, with check=True,
out-of-bounds accesses, shared-memory races and stale cp.async reads raise EmulatorError.
Nothing is compiled at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..env import flag

if TYPE_CHECKING:
    from .module import EmuFunction, EmulatorError, EmuModule, load_module

__all__ = ["EmuFunction", "EmuModule", "EmulatorError", "is_enabled", "load_module"]


def is_enabled() -> bool:
    """True when SPIO_EMULATE=1 (or true, yes, on): CPU tensors then run through the emulated
    kernels. The one reading of the variable; a value not on or off raises ValueError."""
    return flag("SPIO_EMULATE")


def __getattr__(name: str):
    if name in ("EmuFunction", "EmuModule", "EmulatorError", "load_module"):
        from . import module

        return getattr(module, name)
    raise AttributeError(f"module 'spio.emulator' has no attribute {name!r}")
