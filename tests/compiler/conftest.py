import pytest

from spio.compiler import compile as compile_module


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty, private cache folder; forgets the in-memory cubin cache before and after."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPIO_CACHE_DIR", str(folder))
    compile_module._cubin_cache.clear_memory()
    yield folder
    compile_module._cubin_cache.clear_memory()
