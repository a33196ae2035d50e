"""How built emulator libraries reach the disk: `<cache>/emulator/lib/<key>.so`, checked against
the cache entry, readable by others, and a private temporary folder when the cache cannot be
written (read-only, full, or not a folder at all).

One tiny library is built once; each test points SPIO_CACHE_DIR at a fresh folder holding only its
checksummed entry, so no test runs the compiler again.
"""

import ctypes
import errno
import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from spio.compiler import cache as cache_module
from spio.compiler.cache import DiskCache
from spio.emulator import build

TINY = 'extern "C" __global__ void one(int *p) { p[0] = 1; }'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(key, (payload, meta)) of the tiny library, built once into a folder of its own by the
    default compiler (the tests build it again with CXX unset, whatever CXX the suite runs
    under)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CXX", raising=False)
        mp.setenv("SPIO_CACHE_DIR", str(tmp_path_factory.mktemp("emu-cache")))
        lib = build.build_library(TINY, name="emu_test_tiny", checked=False)
        key = lib.path.stem
        entry = build._cache.get(key)
    assert entry is not None
    return key, entry


def _use_cache(monkeypatch, tmp_path, tiny, root):
    """SPIO_CACHE_DIR=root with the tiny library's entry (on disk where it can be written), a fresh
    emulator cache and warning state, TMPDIR=tmp_path/tmp and CXX unset; returns the library
    folder."""
    key, entry = tiny
    monkeypatch.delenv("CXX", raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("SPIO_CACHE_DIR", str(root))
    fresh = DiskCache("emulator")
    monkeypatch.setattr(build, "_cache", fresh)
    monkeypatch.setattr(build, "_private", None, raising=False)
    monkeypatch.setattr(build, "_warned", False, raising=False)
    fresh.get_or_build(key, lambda: entry)
    return root / "emulator" / "lib"


def _build():
    return build.build_library(TINY, name="emu_test_tiny", checked=False)


def _loads(path):
    assert ctypes.CDLL(str(path)).spio_emu_entry_one is not None


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _private_folders(tmp_path):
    return sorted((tmp_path / "tmp").glob("spio-emu-lib-*"))


def test_an_empty_cxx_means_the_default_compiler(monkeypatch, tiny):
    for value in ("", "  "):
        monkeypatch.setenv("CXX", value)
        assert build.compiler() == "g++"
        assert _build().path.stem == tiny[0]  # the g++ library, not a failed `'' --version`
    with pytest.raises(
        build.EmulatorBuildError, match="Install g\\+\\+ or clang\\+\\+, or set CXX"
    ):
        build.compiler_version("/nonexistent/spio-test-c++")


def test_the_compilers_include_path_is_part_of_the_key(monkeypatch, tmp_path):
    """A header found through CPATH decides the binary: another CPATH builds anew, not from the
    cache (the key once held the compiler and its flags but not its environment)."""
    import torch

    from spio.emulator import load_module

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_cache", DiskCache("emulator"))
    source = (
        '#include <spio_test_value.h>\nextern "C" __global__ void one(int *p) { p[0] = VALUE; }'
    )
    for value in (1, 2):
        folder = tmp_path / f"include{value}"
        folder.mkdir()
        (folder / "spio_test_value.h").write_text(f"#define VALUE {value}\n")
        monkeypatch.setenv("CPATH", str(folder))
        out = torch.zeros(1, dtype=torch.int32)
        load_module(source, name=f"emu_test_cpath{value}").get_function("one").launch(1, 1, (out,))
        assert out.item() == value


def test_library_files_are_readable_as_the_umask_allows(monkeypatch, tmp_path, tiny):
    """A cache filled as root (spio.precompile in a Docker image build) serves other users."""
    for umask, mode in ((0o022, 0o644), (0o002, 0o644), (0o077, 0o600)):
        root = tmp_path / f"cache-{umask:03o}"
        old = os.umask(umask)
        try:
            _use_cache(monkeypatch, tmp_path / f"t-{umask:03o}", tiny, root)
            path = _build().path
        finally:
            os.umask(old)
        assert path.parent == root / "emulator" / "lib"
        assert path.stat().st_mode & 0o777 == mode, f"umask {umask:03o}"


def test_a_damaged_library_file_is_rewritten_from_the_entry(monkeypatch, tmp_path, tiny):
    key, (payload, _) = tiny
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    lib_folder.mkdir(parents=True)
    damaged = lib_folder / f"{key}.so"
    damaged.write_bytes(bytes([payload[0] ^ 0xFF]) + payload[1:])  # same size, bad ELF header
    lib = _build()
    assert lib.path == damaged and lib.path.read_bytes() == payload
    _loads(lib.path)


def _deny_writes_under(monkeypatch, folder):
    """Creating files under `folder` fails with EACCES (root ignores permission bits)."""
    real_open = os.open
    denied = []

    def guarded(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.fspath(path).startswith(str(folder) + os.sep):
            denied.append(path)
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)
    return denied


def test_a_read_only_library_folder_falls_back_to_one_private_folder(
    monkeypatch, tmp_path, tiny, caplog
):
    key, (payload, _) = tiny
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    lib_folder.mkdir(parents=True)
    root = os.geteuid() == 0
    if root:
        denied = _deny_writes_under(monkeypatch, lib_folder)
    else:
        lib_folder.chmod(0o555)
    try:
        with caplog.at_level(logging.WARNING, logger="spio"):
            paths = {_build().path for _ in range(3)}
    finally:
        lib_folder.chmod(0o755)
    assert not root or denied  # the simulation did deny the write
    (path,) = paths
    assert path.parent == _private_folders(tmp_path)[0] and len(_private_folders(tmp_path)) == 1
    assert path.read_bytes() == payload and path.name == f"{key}.so"
    assert list(lib_folder.iterdir()) == []  # no partial temporary file
    _loads(path)
    (warning,) = _warnings(caplog)
    assert str(lib_folder) in warning and "SPIO_CACHE_DIR" in warning


class _FullDisk:
    """A file whose write stores half the data, then fails as on a full disk."""

    def __init__(self, file):
        self._file = file

    def write(self, data):
        self._file.write(bytes(data)[: len(data) // 2])
        self._file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()

    def __getattr__(self, name):
        return getattr(self._file, name)


def _fill_disk_under(monkeypatch, *folders):
    real_fdopen = os.fdopen
    full = []

    def fdopen(fd, *args, **kwargs):
        file = real_fdopen(fd, *args, **kwargs)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if any(target.startswith(str(folder) + os.sep) for folder in folders):
            full.append(target)
            return _FullDisk(file)
        return file

    monkeypatch.setattr(os, "fdopen", fdopen)
    return full


def test_a_full_cache_disk_falls_back_and_leaves_no_partial_file(
    monkeypatch, tmp_path, tiny, caplog
):
    key, (payload, _) = tiny
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    full = _fill_disk_under(monkeypatch, lib_folder)
    with caplog.at_level(logging.WARNING, logger="spio"):
        first, second = _build().path, _build().path
    assert full  # the write did fail
    assert first == second and first.parent == _private_folders(tmp_path)[0]
    assert first.read_bytes() == payload
    assert list(lib_folder.iterdir()) == []
    _loads(first)
    assert len(_warnings(caplog)) == 1


def test_no_room_anywhere_is_a_clear_error_without_partial_files(monkeypatch, tmp_path, tiny):
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    full = _fill_disk_under(monkeypatch, lib_folder, tmp_path / "tmp")
    with pytest.raises(build.EmulatorBuildError, match="cannot write the emulator library.*Free"):
        _build()
    assert full
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".tmp"]
    assert leftovers == []


def test_an_unwritable_cache_root_reuses_one_private_folder(monkeypatch, tmp_path, tiny, caplog):
    """Every call used to copy the library into a new temporary folder that was never removed."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    # Root ignores permission bits, so make the cache folder impossible: it lies under a file.
    with caplog.at_level(logging.WARNING, logger="spio"):
        _use_cache(monkeypatch, tmp_path, tiny, blocker / "cache")  # the cache warns here
        paths = {_build().path for _ in range(3)}
    assert len(paths) == 1 and len(_private_folders(tmp_path)) == 1
    _loads(paths.pop())
    assert len(_warnings(caplog)) == 1  # the cache's warning; the library's adds none


def test_the_private_folder_is_removed_at_exit(tmp_path, tiny):
    """A process that cannot write the cache's library folder leaves no temporary folder."""
    key, entry = tiny
    root = tmp_path / "cache"
    DiskCache("emulator", root=root).get_or_build(key, lambda: entry)
    (root / "emulator" / "lib").write_text("a file where the library folder should be")
    tmp = tmp_path / "tmp"
    tmp.mkdir(parents=True)
    script = textwrap.dedent(
        """
        from spio.emulator.build import build_library
        source = 'extern "C" __global__ void one(int *p) { p[0] = 1; }'
        for _ in range(2):
            lib = build_library(source, name="emu_test_tiny", checked=False)
            assert lib.cached, "rebuilt: the test's cache entry was not used"
            print(lib.path)
        """
    )
    env = dict(os.environ, SPIO_CACHE_DIR=str(root), TMPDIR=str(tmp))
    env.pop("CXX", None)  # the tiny library is the default compiler's
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, encoding="utf-8", timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split()
    assert first == second and first.startswith(str(tmp))
    assert list(tmp.iterdir()) == []


class _Key(Exception):
    pass


class _KeyCatcher:
    """A cache that answers every lookup by raising the key it was asked for."""

    def get_or_build(self, key, build):
        raise _Key(key)


def _key_asked(monkeypatch, call):
    """The key `call()` asks the emulator's cache for."""
    monkeypatch.setattr(build, "_cache", _KeyCatcher())
    with pytest.raises(_Key) as caught:
        call()
    return caught.value.args[0]


def _library_key(monkeypatch, checked=False):
    return _key_asked(
        monkeypatch, lambda: build.build_library(TINY, name="emu_test_tiny", checked=checked)
    )


@pytest.mark.parametrize(
    "name",
    [
        "runtime_digest",
        "bundled_digest",
        "_cuda_identity",
        "use_ucontext",
        "compiler_version",
        "recipe_digest",
    ],
)
def test_each_input_of_a_library_is_part_of_its_key(monkeypatch, name):
    """A library built against another runtime, other bundled headers (spio/include), other CUDA
    headers, the other fiber switch or another compiler version is not taken from the cache."""
    flipped = not build.use_ucontext()
    other = {
        "runtime_digest": lambda: "another runtime",
        "bundled_digest": lambda: "spio/include edited",
        "_cuda_identity": lambda: "other CUDA headers",
        "use_ucontext": lambda: flipped,
        "compiler_version": lambda cxx: "g++ (another build) 99.0",
        "recipe_digest": lambda: "build.py or module.py edited",
    }[name]
    key = _library_key(monkeypatch)
    monkeypatch.setattr(build, name, other)
    assert _library_key(monkeypatch) != key
    assert _library_key(monkeypatch, checked=True) != _library_key(monkeypatch)


def test_a_library_file_removed_after_use_is_written_again(monkeypatch, tmp_path, tiny):
    """The file checked once per process is checked to still exist before it is handed out."""
    key, (payload, _) = tiny
    _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    first = _build().path
    first.unlink()
    lib = _build()
    assert lib.path == first and lib.path.read_bytes() == payload
    _loads(lib.path)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="other CPUs have only ucontext")
def test_the_runtime_objects_key_tells_the_fiber_switches_apart(monkeypatch, tmp_path):
    """emu_runtime.cc compiled for ucontext fibers is not taken for the assembly switch's."""
    keys = []
    for value in ("0", "1"):
        monkeypatch.setenv("SPIO_EMU_UCONTEXT", value)
        keys.append(
            _key_asked(monkeypatch, lambda: build._runtime_objects(build.compiler(), tmp_path))
        )
    assert keys[0] != keys[1]


def test_one_warning_for_all_libraries_the_cache_cannot_hold(monkeypatch, tmp_path, tiny, caplog):
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    _fill_disk_under(monkeypatch, lib_folder)
    with caplog.at_level(logging.WARNING, logger="spio"):
        files = [build._library_file(f"key{i}", b"payload %d" % i, "lib") for i in range(2)]
    assert [f.read_bytes() for f in files] == [b"payload 0", b"payload 1"]
    assert files[0].parent == files[1].parent == _private_folders(tmp_path)[0]
    assert len(_warnings(caplog)) == 1


def test_concurrent_fallbacks_share_one_private_folder(monkeypatch, tmp_path, tiny, caplog):
    """Threads loading libraries the cache cannot hold make one private folder and one warning
    between them: the folder is made under the library files' lock."""
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    _fill_disk_under(monkeypatch, lib_folder)
    real_mkdtemp = tempfile.mkdtemp

    def slow_mkdtemp(*args, **kwargs):
        time.sleep(0.2)  # room for the other threads to get here, unless the lock holds them
        return real_mkdtemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", slow_mkdtemp)
    with caplog.at_level(logging.WARNING, logger="spio"):
        threads = [
            threading.Thread(target=build._library_file, args=(f"key{i}", b"%d" % i, "lib"))
            for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    (folder,) = _private_folders(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [f"key{i}.so" for i in range(4)]
    assert len(_warnings(caplog)) == 1


def test_every_cuda_header_is_part_of_the_key(cuda_include):
    """cuda_fp16.h includes vector_functions.h, which the five headers once named in the key
    left out: a new one kept the old libraries."""
    for name in ("cuda_fp16.h", "vector_functions.h"):
        (cuda_include / name).write_text(f"// {name}\n")
    before = build._cuda_identity()
    st = (cuda_include / "vector_functions.h").stat()
    os.utime(cuda_include / "vector_functions.h", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    build._cuda_identity.cache_clear()
    assert build._cuda_identity() != before


def test_build_folders_of_dead_processes_are_swept(monkeypatch, tmp_path):
    """A build killed by SIGTERM or SIGKILL leaves its temporary folder (~230 KB); the folders
    are named for their process, and the first build in a process removes those of this user's
    dead processes untouched for an hour. Others stay: a live process's, a young one's (a process
    of another PID namespace sharing the folder may look dead), other names, files."""
    done = subprocess.Popen(["true"])
    done.wait()
    dead, alive = done.pid, os.getpid()
    hour_ago = time.time() - build.STALE_BUILD_SECONDS - 60
    names = {
        f"spio-emu-{dead}-abc": True,
        f"spio-emu-rt-{dead}-abc": True,
        f"spio-emu-{alive}-abc": False,
        f"spio-emu-{dead}-young": False,
        f"spio-emu-lib-{dead}-abc": True,  # a killed process's private library folder
        f"spio-emu-lib-{alive}-abc": False,
        "spio-emu-k2j4h_x9": False,  # the names before (no PID)
        "spio-emu-lib-k2j4h_x9": False,
        f"spio-emu-{dead}-file": False,
    }
    for name in names:
        path = tmp_path / name
        if name.endswith("file"):
            path.write_text("")
        else:
            (path / "include").mkdir(parents=True)
        if not name.endswith("young"):
            os.utime(path, (hour_ago, hour_ago))
    removed = build.sweep_build_folders(tmp_path)
    assert sorted(p.name for p in removed) == sorted(n for n, gone in names.items() if gone)
    kept = sorted(n for n, gone in names.items() if not gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == kept
    # A process's first build sweeps, and names its own folders for itself.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(build, "_swept", False)
    (tmp_path / f"spio-emu-{dead}-again").mkdir()
    os.utime(tmp_path / f"spio-emu-{dead}-again", (hour_ago, hour_ago))
    with build._build_folder("rt-") as folder:
        assert os.path.basename(folder).startswith(f"spio-emu-rt-{alive}-")
    assert not (tmp_path / f"spio-emu-{dead}-again").exists()
    # So does a process that only loads libraries, into a private folder named for it (where
    # the cache folder cannot hold them): a killed one's had been left for good.
    monkeypatch.setattr(build, "_swept", False)
    monkeypatch.setattr(build, "_private", None)
    monkeypatch.setattr(build.atexit, "register", lambda *a: None)
    (tmp_path / f"spio-emu-lib-{dead}-again").mkdir()
    os.utime(tmp_path / f"spio-emu-lib-{dead}-again", (hour_ago, hour_ago))
    private = build._private_folder()
    assert private.name.startswith(f"spio-emu-lib-{alive}-")
    assert not (tmp_path / f"spio-emu-lib-{dead}-again").exists()
    # Swept while this process lives (by one of another PID namespace, to which it looks dead):
    # made again, where the next library's write had failed for good.
    shutil.rmtree(private)
    again = build._private_folder()
    assert again.is_dir() and again != private


def test_a_library_folder_others_can_write_is_not_loaded_from(monkeypatch, tmp_path, tiny, caplog):
    """A library in a lib/ folder every user can write could be swapped between its check and
    its load (native code run in this process): the private folder's copy is loaded instead."""
    key, (payload, _) = tiny
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    lib_folder.mkdir(parents=True)
    (lib_folder / f"{key}.so").write_bytes(payload)
    lib_folder.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="spio"):
        path = _build().path
    assert path.parent == _private_folders(tmp_path)[0] and path.read_bytes() == payload
    _loads(path)
    (warning,) = _warnings(caplog)
    assert "is writable by every user" in warning and str(lib_folder) in warning


@pytest.mark.parametrize("change", ["writable", "another user's"])
def test_a_library_file_others_could_change_is_written_again(monkeypatch, tmp_path, tiny, change):
    """The right bytes in a file writable by others, or another user's, are not loaded as they
    are: written again (this user's, not writable by others), then loaded."""
    if change == "another user's" and os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    key, (payload, _) = tiny
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    lib_folder.mkdir(parents=True)
    planted = lib_folder / f"{key}.so"
    planted.write_bytes(payload)
    if change == "writable":
        planted.chmod(0o666)
    else:
        os.chown(planted, 65534, -1)
    before = planted.stat().st_ino
    path = _build().path
    status = path.stat()
    assert path == planted and status.st_ino != before  # replaced, not the planted file
    assert status.st_uid == os.getuid() and not status.st_mode & 0o002
    _loads(path)


def test_an_entry_in_a_cache_others_can_write_is_built_again_not_loaded(
    monkeypatch, tmp_path, tiny, caplog
):
    """The helper's reproduction: another user writes an entry (whole, its checksum right) into
    a cache folder every user can write; the library is built here instead, and loaded from the
    private folder."""
    key, (payload, meta) = tiny
    root = tmp_path / "cache"
    _use_cache(monkeypatch, tmp_path, tiny, root)
    root.chmod(0o777)
    forged = bytes([payload[0]]) + b"forged" + payload[7:]
    (root / "emulator" / f"{key}.bin").write_bytes(cache_module._encode(forged, meta))
    monkeypatch.setattr(build, "_cache", DiskCache("emulator"))  # a later process's
    with caplog.at_level(logging.WARNING, logger="spio"):
        lib = _build()
    assert lib.path.parent == _private_folders(tmp_path)[0]
    assert b"forged" not in lib.path.read_bytes()[:16]  # built here, not the planted bytes
    _loads(lib.path)
    assert any("spio does not use its cache folder" in w for w in _warnings(caplog))


def test_a_private_folder_made_again_by_another_is_not_used(monkeypatch, tmp_path, tiny):
    """The private folder may go while the process runs (a sweep); another user could then make
    one of its name (`ls` shows it) and have spio write and load a library there (reproduced by
    a helper): what is there must be a folder of this user's that no one else may enter."""
    _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")  # (no private folder yet)
    first = build._private_folder()
    assert build._private_folder() == first  # kept while it is this user's own
    shutil.rmtree(first)
    first.mkdir()
    first.chmod(0o777)  # made again by someone else (as another user's, an open folder)
    second = build._private_folder()
    assert second != first and stat.S_IMODE(second.stat().st_mode) == 0o700
    first.rmdir()
    first.symlink_to(second)  # a link of that name is not the folder either
    assert build._private_folder() == second  # (the current one, judged by its own path)


def test_a_library_folder_made_by_another_after_the_first_look_is_not_loaded_from(
    monkeypatch, tmp_path, tiny
):
    """lib/ missing at the first look, then made by another user before spio's own mkdir (a
    race in a sticky shared root): spio wrote into it and loaded by path, which its maker could
    swap; the folder is judged again after the write, and the private copy loaded instead."""
    key, (payload, _) = tiny
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    real_make = build.make_folder

    def made_by_another(folder):
        real_make(folder)
        folder.chmod(0o777)  # as another user's open folder would be

    monkeypatch.setattr(build, "make_folder", made_by_another)
    path = _build().path
    assert not lib_folder.exists() or path.parent != lib_folder
    assert path.parent == _private_folders(tmp_path)[0] and path.read_bytes() == payload
    _loads(path)


def test_a_library_folder_moved_away_during_the_second_look_is_not_loaded_from(
    monkeypatch, tmp_path, tiny
):
    """The fourth helper's forced race: the folder another user made is moved away during both
    looks (each then met nothing to judge) and back before the load; the look after the write
    asks for the file itself, which must be there."""
    key, (payload, _) = tiny
    lib_folder = _use_cache(monkeypatch, tmp_path, tiny, tmp_path / "cache")
    real_write = build.write_atomically

    def write_then_moved_away(path, data):
        real_write(path, data)
        if path.parent == lib_folder:
            lib_folder.rename(tmp_path / "away")  # (as another user's mv during the look)

    monkeypatch.setattr(build, "write_atomically", write_then_moved_away)
    path = _build().path
    assert path.parent == _private_folders(tmp_path)[0] and path.read_bytes() == payload
