"""Locks by key, for work done once per key (a kernel's first load, a cache entry's build)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Hashable

#: Every KeyedLocks of the process, for a forked child to start afresh.
_instances: weakref.WeakSet[KeyedLocks] = weakref.WeakSet()


class KeyedLocks:
    """One threading.Lock per key, made on first use: threads that need the same key wait for
    each other; threads with different keys do not. A forked child starts with none held: a
    lock another thread of the parent held at the fork (a kernel it was building) would be held
    in the child for ever, by a thread the child does not have; the work those locks keep to one
    thread at a time is kept to one process at a time by the cache's file locks."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, threading.Lock] = {}
        _instances.add(self)

    def __getitem__(self, key: Hashable) -> threading.Lock:
        lock = self._locks.get(key)
        if lock is None:  # dict.setdefault is atomic: two threads get the same lock
            lock = self._locks.setdefault(key, threading.Lock())
        return lock


def _forget_in_child() -> None:
    for locks in list(_instances):
        locks._locks = {}


os.register_at_fork(after_in_child=_forget_in_child)
