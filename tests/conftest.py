"""Shared test setup: the `cuda` marker skips cleanly on machines without a GPU."""

import functools

import pytest


@functools.cache
def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is available on this machine")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
