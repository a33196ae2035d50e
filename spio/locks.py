"""Locks by key, for work done once per key (a kernel's first load, a cache entry's build)."""

from __future__ import annotations

import threading
from collections.abc import Hashable


class KeyedLocks:
    """One threading.Lock per key, made on first use: threads that need the same key wait for
    each other; threads with different keys do not."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, threading.Lock] = {}

    def __getitem__(self, key: Hashable) -> threading.Lock:
        lock = self._locks.get(key)
        if lock is None:  # dict.setdefault is atomic: two threads get the same lock
            lock = self._locks.setdefault(key, threading.Lock())
        return lock
