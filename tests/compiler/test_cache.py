"""Where the cache lives: SPIO_CACHE_DIR, platformdirs, or ~/.cache when platformdirs is absent."""

import sys
from pathlib import Path

from spio.compiler.cache import cache_root


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
