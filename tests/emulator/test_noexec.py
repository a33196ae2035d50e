"""Emulator libraries in a folder on a file system mounted noexec (a hardened /tmp or home, often
the cache's): the kernel will not map their code, so dlopen fails ("failed to map segment from
shared object"). spio loads a memory copy (memfd) of each instead, and says so once."""

import ctypes
import errno
import logging
import shutil
import subprocess

import pytest
import torch

from spio.emulator import build, module
from spio.emulator.module import EmuModule

SOURCES = {v: f'extern "C" __global__ void put(int *p) {{ p[0] = {v}; }}' for v in (1, 2)}


@pytest.fixture(scope="module")
def libraries():
    """Two unchecked libraries whose kernel `put` writes 1 and 2."""
    return {
        v: build.build_library(source, name=f"emu_test_put{v}", checked=False)
        for v, source in SOURCES.items()
    }


@pytest.fixture
def fresh(monkeypatch):
    """No library loaded from memory yet in this test."""
    monkeypatch.setattr(module, "_from_memory", {})


def _put(value, lib):
    """What the kernel of library `lib` writes, launched through an EmuModule."""
    emu = EmuModule(f"emu_test_put{value}", SOURCES[value], {}, lib.kernels)
    emu._load(False, lib)
    out = torch.zeros(1, dtype=torch.int32)
    emu.get_function("put").launch(1, 1, (out,), check=False)
    return int(out)


def test_libraries_in_a_noexec_folder_load_from_memory(monkeypatch, libraries, fresh, caplog):
    """Each library is its own memory copy (a descriptor's number reused would make dlopen hand
    back the library first loaded under that name), a file loaded twice gives one handle, and
    one message says why."""
    monkeypatch.setattr(module, "noexec", lambda folder: True)
    with caplog.at_level(logging.INFO, logger="spio"):
        assert _put(1, libraries[1]) == 1
        assert _put(2, libraries[2]) == 2
        assert _put(1, libraries[1]) == 1
    assert set(module._from_memory) == {libraries[1].path, libraries[2].path}
    first = module._from_memory[libraries[2].path][1]
    assert module._dlopen(libraries[2].path) is first
    assert [r.message for r in caplog.records if "noexec" in r.message] == [
        f"{libraries[1].path.parent} is on a file system mounted noexec: emulator libraries are "
        "loaded from memory copies"
    ]


def test_an_ordinary_folder_loads_the_file_itself(libraries, fresh):
    if module.noexec(libraries[1].path.parent):  # the suite run with such a cache
        pytest.skip(f"the cache folder {libraries[1].path.parent} is mounted noexec")
    assert module._dlopen(libraries[1].path)._name == str(libraries[1].path)
    assert module._from_memory == {}


def test_no_memory_copy_is_a_clear_error(monkeypatch, libraries, fresh):
    def refuse(name, flags=0):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(module, "noexec", lambda folder: True)
    monkeypatch.setattr(module.os, "memfd_create", refuse)
    path = libraries[1].path
    with pytest.raises(build.EmulatorBuildError) as raised:
        module._dlopen(path)
    message = str(raised.value)
    assert str(path) in message and "mounted noexec" in message
    assert "Operation not permitted" in message and "SPIO_CACHE_DIR" in message


@pytest.fixture
def noexec_folder(tmp_path):
    """A tmpfs mounted noexec, where this machine lets the test mount one (root), else skip."""
    folder = tmp_path / "noexec"
    folder.mkdir()
    if not shutil.which("mount"):
        pytest.skip("no mount command")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "noexec,size=16m", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a noexec tmpfs here: {done.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=True)


def test_a_real_noexec_mount(libraries, fresh, noexec_folder):
    """On a real noexec mount: dlopen of the file fails, as it did for spio before; spio's load
    runs the kernel."""
    copy = noexec_folder / libraries[2].path.name
    shutil.copyfile(libraries[2].path, copy)
    assert module.noexec(noexec_folder) and module.noexec(noexec_folder / "not" / "made")
    assert not module.noexec(noexec_folder.parent / "not" / "made")
    with pytest.raises(OSError, match="failed to map segment"):
        ctypes.CDLL(str(copy))
    lib = build.Library(copy, libraries[2].kernels, checked=False, cached=True, seconds=0.0)
    assert _put(2, lib) == 2
