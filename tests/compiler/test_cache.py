"""Where the cache lives (SPIO_CACHE_DIR, platformdirs, or ~/.cache when platformdirs is absent),
and reading an entry without building it."""

import sys
from pathlib import Path

from spio.compiler.cache import DiskCache, cache_root


def test_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"


def test_platformdirs_user_cache(monkeypatch):
    import platformdirs

    monkeypatch.delenv("SPIO_CACHE_DIR", raising=False)
    assert cache_root() == Path(platformdirs.user_cache_dir("spio"))


def test_without_platformdirs_falls_back_to_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SPIO_CACHE_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # import raises ImportError
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "spio"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "spio"


def test_get_reads_memory_then_disk_and_misses_without_building(tmp_path):
    cache = DiskCache("things", root=tmp_path)
    assert cache.get("k") is None and not (tmp_path / "things").exists()
    assert cache.get_or_build("k", lambda: (b"payload", {"m": 1})) == (b"payload", {"m": 1}, False)
    assert cache.get("k") == (b"payload", {"m": 1})
    fresh = DiskCache("things", root=tmp_path)  # another process: from the disk
    assert fresh.get("k") == (b"payload", {"m": 1})
    cache.path("k").write_bytes(b"damaged")
    assert DiskCache("things", root=tmp_path).get("k") is None
