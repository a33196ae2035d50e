"""Where the cache lives (SPIO_CACHE_DIR, platformdirs, or ~/.cache when platformdirs is absent),
and reading an entry without building it."""

import os
import stat
import sys
from pathlib import Path

import pytest

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


def test_relative_and_home_paths_are_made_absolute(monkeypatch, tmp_path):
    """Compile workers may run in another folder than the one a relative path was meant from."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPIO_CACHE_DIR", "rel/c")
    assert cache_root() == tmp_path / "rel" / "c"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPIO_CACHE_DIR", "~/c")
    assert cache_root() == tmp_path / "home" / "c"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_entries_are_as_readable_as_the_umask_allows(tmp_path, monkeypatch, umask, mode):
    """Not mkstemp's 0o600: a cache built by one user (say, while a container image is built)
    must be readable by the users who run it, unless the umask says otherwise."""
    old = os.umask(umask)
    try:
        cache = DiskCache("things", root=tmp_path)
        cache.get_or_build("k", lambda: (b"x", {}))
    finally:
        os.umask(old)
    assert stat.S_IMODE(cache.path("k").stat().st_mode) == mode
