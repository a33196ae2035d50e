"""Where the cache lives (SPIO_CACHE_DIR, platformdirs, or ~/.cache when platformdirs is absent),
and reading an entry without building it."""

import logging
import os
import stat
import sys
from pathlib import Path

import pytest

from spio.compiler import cache
from spio.compiler.cache import DiskCache, cache_root


def test_environment_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"


def test_a_blank_cache_dir_is_unset(monkeypatch, tmp_path):
    """SPIO_CACHE_DIR=" " had made a folder named " " wherever the process ran."""
    import platformdirs

    monkeypatch.chdir(tmp_path)
    for blank in ("", " ", "\t"):
        monkeypatch.setenv("SPIO_CACHE_DIR", blank)
        assert cache_root() == Path(platformdirs.user_cache_dir("spio"))


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


def test_a_damaged_entry_is_rebuilt_and_said_once(tmp_path, caplog):
    """A lookup looks at the file three times (before, and after taking each lock): one line."""
    cache = DiskCache("things", root=tmp_path)
    cache.folder.mkdir()
    cache.path("k").write_bytes(b"damaged")
    with caplog.at_level(logging.INFO, logger="spio"):
        got = DiskCache("things", root=tmp_path).get_or_build("k", lambda: (b"new", {}))
    assert got == (b"new", {}, False)
    assert caplog.text.count("is damaged; rebuilding it") == 1
    assert DiskCache("things", root=tmp_path).get("k") == (b"new", {})


def test_relative_and_home_paths_are_made_absolute(monkeypatch, tmp_path):
    """Compile workers may run in another folder than the one a relative path was meant from."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPIO_CACHE_DIR", "rel/c")
    assert cache_root() == tmp_path / "rel" / "c"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPIO_CACHE_DIR", "~/c")
    assert cache_root() == tmp_path / "home" / "c"


@pytest.mark.parametrize(
    "umask, mode", [(0o022, 0o644), (0o002, 0o644), (0o077, 0o600), (0, 0o644)]
)
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


def test_a_schema_bump_changes_every_key(monkeypatch):
    """SCHEMA_VERSION is what a change of the entry format or of the keys bumps, so that entries
    written before are not read as the new kind."""
    from spio.compiler import cache

    before = cache.hash_key("cubin", ["a", 1])
    assert cache.hash_key("cubin", ["a", 1]) == before
    monkeypatch.setattr(cache, "SCHEMA_VERSION", cache.SCHEMA_VERSION + 1)
    assert cache.hash_key("cubin", ["a", 1]) != before


def test_hash_key_does_not_depend_on_the_order_of_a_dicts_keys():
    from spio.compiler.cache import hash_key

    assert hash_key({"a": 1, "b": [2, 3]}) == hash_key({"b": [2, 3], "a": 1})
    assert hash_key({"a": 1, "b": [2, 3]}) != hash_key({"a": 1, "b": [3, 2]})


def test_an_entry_of_another_format_is_a_miss(tmp_path):
    """Its checksum may be right (it covers meta and payload, not the magic): the magic says
    whose entry it is."""
    from spio.compiler import cache

    store = DiskCache("things", root=tmp_path)
    store.get_or_build("k", lambda: (b"payload", {"m": 1}))
    blob = store.path("k").read_bytes()
    assert blob.startswith(cache._MAGIC)
    store.path("k").write_bytes(b"OTHERFMT" + blob[len(cache._MAGIC) :])
    assert cache._decode(store.path("k").read_bytes()) is None
    assert DiskCache("things", root=tmp_path).get("k") is None


def test_an_entry_read_from_disk_is_then_served_from_memory(tmp_path):
    """Later lookups of an entry another process wrote neither read nor check the file again."""
    DiskCache("things", root=tmp_path).get_or_build("k", lambda: (b"payload", {"m": 1}))
    reader = DiskCache("things", root=tmp_path)
    assert reader.get("k") == (b"payload", {"m": 1})
    reader.path("k").unlink()
    assert reader.get("k") == (b"payload", {"m": 1})
    assert reader.get_or_build("k", lambda: pytest.fail("built again")) == (
        b"payload",
        {"m": 1},
        True,
    )


def test_memory_keeps_a_bounded_number_of_entries(tmp_path, monkeypatch):
    """Every entry met had stayed in memory for the life of the process (a compile worker's,
    `spio compile` over every kernel's); past the bound it starts over, and an entry dropped is
    read from disk again."""
    monkeypatch.setattr(cache, "MEMORY_ENTRIES", 4)
    store = DiskCache("things", root=tmp_path)
    for i in range(10):
        store.get_or_build(f"k{i}", lambda i=i: (b"%d" % i, {}))
        assert len(store._memory) <= 4
    assert store.get("k0") == (b"0", {})


def test_a_wait_for_another_process_is_said(tmp_path, monkeypatch, caplog):
    """A process waiting for another's lock on an entry (building it, or stopped in a debugger)
    had waited in silence, however long."""
    import subprocess
    import textwrap

    monkeypatch.setattr(cache, "LOCK_NOTICE_SECONDS", 0.3)
    store = DiskCache("things", root=tmp_path)
    store.folder.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time, filelock
                with filelock.FileLock({str(store.path("k")) + ".lock"!r}, mode=0o600):
                    print("held", flush=True)
                    time.sleep(1.5)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with caplog.at_level(logging.WARNING, logger="spio"):
            assert store.get_or_build("k", lambda: (b"x", {}))[:2] == (b"x", {})
    finally:
        holder.wait(timeout=30)
    waits = [r.getMessage() for r in caplog.records if "another process holds it" in r.getMessage()]
    assert waits and waits[0].startswith("waited 0 s for ") and "k.bin.lock" in waits[0]


def test_a_file_system_without_locks_still_builds_and_stores(tmp_path, monkeypatch):
    """filelock 3 raises NotImplementedError where the file system has no flock (Lustre
    mounted noflock, some FUSE mounts): every compile had ended in it."""
    import filelock

    class NoFlock(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            raise NotImplementedError("FileSystem does not appear to support flock")

    monkeypatch.setattr(filelock, "FileLock", NoFlock)
    store = DiskCache("things", root=tmp_path)
    assert store.get_or_build("k", lambda: (b"built", {"m": 1})) == (b"built", {"m": 1}, False)
    assert DiskCache("things", root=tmp_path).get("k") == (b"built", {"m": 1})  # on disk


def test_an_entry_built_before_spio_cache_dir_changed_is_stored_in_the_new_folder(
    monkeypatch, tmp_path
):
    """Entries in memory had answered for any folder: a process that set SPIO_CACHE_DIR anew (to
    fill a cache to ship) left out of it every kernel it had already built."""
    cache = DiskCache("things")
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "a"))
    assert cache.get_or_build("k", lambda: (b"payload", {"m": 1}))[2] is False
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "b"))
    assert cache.get("k") is None
    assert cache.get_or_build("k", lambda: (b"payload", {"m": 1}))[2] is False
    assert cache.path("k") == tmp_path / "b" / "things" / "k.bin" and cache.path("k").is_file()
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "a"))
    (tmp_path / "a" / "things" / "k.bin").unlink()
    assert cache.get("k") == (b"payload", {"m": 1})  # still served from memory in its folder


def test_a_failed_write_leaves_the_old_entry_and_no_temporary_file(tmp_path, monkeypatch):
    from spio.compiler import cache

    path = tmp_path / "entry.bin"
    cache.write_atomically(path, b"old")

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache.os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        cache.write_atomically(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.bin"]


def test_an_entry_stored_by_another_process_while_waiting_for_the_lock_is_used(
    tmp_path, monkeypatch
):
    """Two processes miss at once: the one that waited for the file lock finds the other's entry
    under it, reports a hit and builds nothing."""
    import filelock

    other = DiskCache("things", root=tmp_path)  # another process, holding the lock first
    mine = DiskCache("things", root=tmp_path)
    real = filelock.FileLock.acquire
    waited = []

    def acquire(self, *args, **kwargs):
        if not waited:  # the first acquire is mine: the other process builds meanwhile
            waited.append(self.lock_file)
            other.get_or_build("k", lambda: (b"theirs", {"by": "other"}))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(filelock.FileLock, "acquire", acquire)
    built = mine.get_or_build("k", lambda: pytest.fail("built although the other process had"))
    assert waited == [str(mine.path("k")) + ".lock"]
    assert built == (b"theirs", {"by": "other"}, True)


def test_a_folder_removed_while_building_is_made_again_without_a_warning(tmp_path, caplog):
    """`spio clear-cache` beside a compiling process removes the namespace folder (its lock file
    is spio's, so the folder empties): the entry is stored all the same, with no warning that
    the folder cannot be written."""
    cache = DiskCache("things", root=tmp_path)

    def build():
        for path in cache.folder.iterdir():
            path.unlink()
        cache.folder.rmdir()
        return b"payload", {}

    with caplog.at_level(logging.WARNING, logger="spio"):
        assert cache.get_or_build("k", build) == (b"payload", {}, False)
    assert "cannot write" not in caplog.text and not cache.warned
    assert DiskCache("things", root=tmp_path).get("k") == (b"payload", {})


def test_keep_stores_an_entry_where_it_can_and_warns_only_where_it_cannot(tmp_path, caplog):
    """A compile worker's result missing from the disk (its write met a removed folder, or an
    unwritable one): the parent stores it, else keeps it in memory and warns once."""
    cache = DiskCache("things", root=tmp_path / "root")
    with caplog.at_level(logging.WARNING, logger="spio"):
        cache.keep("k", b"payload", {"m": 1})
    assert cache.on_disk("k") and not cache.warned and "cannot write" not in caplog.text
    (tmp_path / "file").write_text("not a folder")
    blocked = DiskCache("things", root=tmp_path / "file")
    with caplog.at_level(logging.WARNING, logger="spio"):
        blocked.keep("a", b"A", {})
        blocked.keep("b", b"B", {})
    assert caplog.text.count("cannot write its cache folder") == 1
    assert blocked.get("a") == (b"A", {}) and blocked.get("b") == (b"B", {})


def test_under_umask_0_nothing_spio_makes_is_writable_by_others(tmp_path):
    """Folders and files had been 0o777 and 0o666 under umask 0 (some containers and CI jobs):
    another user could then replace an entry, and with it code the process runs. Now only
    their owner may write them (and the cache trusts what it made); its lock files are the
    owner's alone (a reader's lock on one had blocked every build of that entry)."""
    old = os.umask(0)
    try:
        cache = DiskCache("things", root=tmp_path / "a" / "b")
        cache.get_or_build("k", lambda: (b"x", {}))
    finally:
        os.umask(old)
    for made in (tmp_path / "a", tmp_path / "a" / "b", cache.folder, cache.path("k")):
        assert not made.stat().st_mode & (stat.S_IWOTH | stat.S_IWGRP), made
    assert stat.S_IMODE(Path(str(cache.path("k")) + ".lock").stat().st_mode) == 0o600
    assert DiskCache("things", root=tmp_path / "a" / "b").get("k") == (b"x", {})


def _entry_made_then(tmp_path, change):
    """A cache's entry "k" made as spio makes it, then `change(folder)` done to it; returns a
    fresh cache (another process) on the same folder."""
    DiskCache("things", root=tmp_path / "root").get_or_build("k", lambda: (b"real", {}))
    change(tmp_path / "root")
    return DiskCache("things", root=tmp_path / "root")


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda root: root.chmod(0o777), "is writable by every user"),
        (lambda root: (root / "things").chmod(0o777), "is writable by every user"),
        (lambda root: root.parent.chmod(0o777), "is writable by every user"),  # above it
    ],
    ids=["root", "namespace", "parent"],
)
def test_a_folder_others_can_write_is_neither_read_nor_written(tmp_path, caplog, change, reason):
    """Its entries' checksums say only that they are whole: another user could have written
    one (an emulator library is native code run in this process; reproduced by a helper's
    audit). The cache then builds, keeps in memory, writes nothing there (no lock file either),
    and says why once."""
    fresh = _entry_made_then(tmp_path, change)
    before = sorted(p.name for p in (tmp_path / "root" / "things").iterdir())
    built = []
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert fresh.get("k") is None and not fresh.on_disk("k")
        assert fresh.get_or_build("k", lambda: built.append(1) or (b"new", {})) == (
            b"new",
            {},
            False,
        )
        fresh.keep("j", b"other", {})
        assert fresh.get("k") == (b"new", {})  # from memory
    assert built == [1] and sorted(p.name for p in fresh.folder.iterdir()) == before
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "spio does not use its cache folder" in warning and reason in warning
    assert "chmod go-w" in warning and "SPIO_CACHE_DIR" in warning


def test_a_sticky_folder_others_can_write_is_used(tmp_path, caplog):
    """As /tmp: others may add files to it, not replace those in it."""
    fresh = _entry_made_then(tmp_path, lambda root: root.chmod(0o1777))
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert fresh.get("k") == (b"real", {})
    assert not caplog.records


def test_an_entry_others_can_write_or_anothers_is_built_again(tmp_path, caplog):
    """In a folder the cache uses, an entry file writable by others, or another user's (a
    sticky folder's), is not read: built again, and the new file replaces it."""
    changes = [lambda root: (root / "things" / "k.bin").chmod(0o666)]
    if os.getuid() == 0:  # (only root can give a file away)
        changes.append(lambda root: os.chown(root / "things" / "k.bin", 65534, -1))
    for change in changes:
        for old in (tmp_path / "root").rglob("*"):
            old.unlink() if old.is_file() else None
        fresh = _entry_made_then(tmp_path, change)
        with caplog.at_level(logging.INFO, logger="spio"):
            assert fresh.get("k") is None
            assert fresh.get_or_build("k", lambda: (b"again", {}))[:2] == (b"again", {})
        status = fresh.path("k").stat()
        assert status.st_uid == os.getuid() and not status.st_mode & stat.S_IWOTH
        assert DiskCache("things", root=tmp_path / "root").get("k") == (b"again", {})
        assert "cache entry k.bin is not used" in caplog.text


def _as_root():
    if os.getuid() != 0:
        pytest.skip("only root can give a file or link to another user or group")


def test_a_folder_a_group_can_write_is_used_only_where_the_group_is_the_users_own(tmp_path):
    """A group-writable folder let any member of a shared group (HPC projects' gid 100) replace
    entries (reproduced by a helper as a member of root's group); the user's private group
    (Debian's and Ubuntu's umask 002) is the user alone."""
    _as_root()
    root = tmp_path / "root"
    DiskCache("things", root=root).get_or_build("k", lambda: (b"real", {}))
    root.chmod(0o775)
    os.chown(root, -1, 65534)  # nogroup: not root's own
    assert cache.why_untrusted(root) == f"{root} is writable by group id 65534"
    assert DiskCache("things", root=root).get("k") is None
    os.chown(root, -1, os.getgid())
    own = cache._own_group(os.getgid())
    assert (cache.why_untrusted(root) is None) == own
    if own:
        assert DiskCache("things", root=root).get("k") == (b"real", {})


def test_a_link_on_the_way_is_judged_with_the_folders_it_leads_through(tmp_path):
    """A link another user owns, or one in a folder every user can write, could be pointed
    elsewhere between spio's check and its use (a helper flipped one until the victim loaded
    its library); the folders a link leads through are judged as any on the way."""
    safe = tmp_path / "safe"
    safe.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "link").symlink_to(safe)
    assert cache.why_untrusted(shared / "link") == f"{shared} is writable by every user"
    (tmp_path / "own").symlink_to(safe)  # this user's link in a folder of this user's
    assert cache.why_untrusted(tmp_path / "own" / "sub") is None
    (tmp_path / "through").symlink_to(shared / "link")  # through the shared folder
    assert cache.why_untrusted(tmp_path / "through") == f"{shared} is writable by every user"
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    (tmp_path / "to-open").symlink_to(open_folder)
    assert cache.why_untrusted(tmp_path / "to-open") == f"{open_folder} is writable by every user"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert cache.why_untrusted(tmp_path / "loop") is None  # nothing can be read through it
    if os.getuid() == 0:
        os.lchown(tmp_path / "own", 65534, -1)
        assert cache.why_untrusted(tmp_path / "own") == (
            f"{tmp_path / 'own'} is a link of user id 65534"
        )


def test_root_s_group_is_never_a_private_one():
    """Container platforms run users of any id with primary group 0 (a third helper rewrote a
    group-writable root cache so): group 0 may not write where spio reads."""
    assert cache._own_group(0) is False


def test_a_dotdot_after_a_link_is_taken_where_the_kernel_takes_it(tmp_path):
    """`abs/../x` is x beside the link's target, not beside the link (os.path.abspath had
    dropped the `..` by the text, judging a folder the kernel never opens)."""
    open_folder = tmp_path / "open"
    (open_folder / "inner").mkdir(parents=True)
    open_folder.chmod(0o777)
    (tmp_path / "abs").symlink_to(open_folder / "inner")
    assert cache.why_untrusted(tmp_path / "abs" / ".." / "x") == (
        f"{open_folder} is writable by every user"
    )


def test_a_lock_file_an_older_spio_left_readable_is_made_anew_the_owners_alone(tmp_path):
    """filelock keeps an existing lock file's mode: one left 0644 let any reader take the lock
    and hold off every build of that entry, for good (a mode changed after the reader opened it
    takes nothing back: a fourth helper held one so). It is removed, and filelock makes a 0600
    one: the build goes on while the old file is still locked."""
    import fcntl
    import threading

    cache_ = DiskCache("things", root=tmp_path)
    cache_.folder.mkdir(parents=True)
    lock = Path(str(cache_.path("k")) + ".lock")
    lock.write_bytes(b"")
    lock.chmod(0o644)
    held = os.open(lock, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # (a reader's lock on the old file)
    try:
        done = threading.Thread(target=cache_.get_or_build, args=("k", lambda: (b"x", {})))
        done.start()
        done.join(timeout=20)
        assert not done.is_alive(), "the build waited for the old lock file's holder"
    finally:
        os.close(held)
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600 and cache_.get("k") == (b"x", {})


def test_a_path_that_must_exist_is_untrusted_where_a_part_is_missing(tmp_path):
    """A file spio has just written and is about to use: a folder on the way gone meanwhile
    (moved away by another user during the look) is a reason, not nothing to read."""
    assert cache.why_untrusted(tmp_path / "gone" / "f") is None
    assert cache.why_untrusted(tmp_path / "gone" / "f", must_exist=True) == (
        f"{tmp_path / 'gone'} is missing"
    )
