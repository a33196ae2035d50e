"""Process-wide memos that start over at a size limit, so that keys changing on every call (a
layer met at ever new batch or image sizes) do not each keep an entry."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

_V = TypeVar("_V")


def remember(store: dict, key: Hashable, value: _V, limit: int) -> _V:
    """store[key] = value, emptying `store` first where it lacks `key` and holds `limit`
    entries; returns value."""
    if key not in store and len(store) >= limit:
        store.clear()
    store[key] = value
    return value
