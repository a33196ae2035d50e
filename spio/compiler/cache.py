"""A crash-safe, multi-process disk cache for compiled artefacts (cubins, emulator libraries).

Entries are written to a temporary file and renamed into place, carry a checksum that is verified on
load (a bad entry is a miss and is rebuilt), and are built under a file lock so that N processes
asking for the same key build it once. When the cache folder cannot be written (read-only, full),
the cache warns once and keeps entries in memory (the last MEMORY_ENTRIES or fewer: one dropped is
built again).

The checksum says an entry is whole, not who wrote it, and an emulator library from the cache is
native code run in this process: the cache uses a folder (and its parents) only where no other
user could have put files there (`why_untrusted`: each folder and link on the way owned by this
user or root, and no folder writable by others, nor by a group but the user's own, but with the
sticky bit, as /tmp), and an entry only where its file is so too; else it warns once and keeps
entries in memory, as for a folder it cannot write. It makes its folders and files writable by
their owner alone, whatever the umask.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from .. import env
from ..locks import KeyedLocks
from ..log import logger
from ..memo import remember

#: Bump when the entry format or anything that decides cache keys changes.
SCHEMA_VERSION = 1

_MAGIC = b"SPIOCACH"
_HEADER = struct.Struct("<8s32sQ")  # magic, sha256 of (meta + payload), length of meta


#: The folders spio keeps under the cache root, one per kind of entry (`DiskCache.namespace`).
NAMESPACES = ("cubin", "emulator", "autotune")


def cache_root() -> Path:
    """The cache folder, as an absolute path: SPIO_CACHE_DIR (`~` expanded; a relative path is
    taken from the current folder, and the absolute path is what compile workers are given, so
    that workers started elsewhere agree), else platformdirs' user cache dir for spio."""
    folder = env.path("SPIO_CACHE_DIR")  # blank counts as unset (not a folder named " ")
    if folder is not None:
        return folder
    try:
        import platformdirs
    except ImportError:  # a declared dependency, but offline GPU machines may lack it
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(os.path.abspath(xdg)) / "spio"
    return Path(platformdirs.user_cache_dir("spio"))


#: What to do about a folder why_untrusted distrusts (the cache's warning, the emulator's,
#: `spio info`'s row).
TRUST_ADVICE = (
    "make the folder, and those above it, yours and not writable by others (chmod go-w), or set "
    "SPIO_CACHE_DIR to a folder of your own"
)
#: The same, as a sentence of its own (the warnings').
TRUST_ADVICE_SENTENCE = TRUST_ADVICE[0].upper() + TRUST_ADVICE[1:] + "."

#: The most links why_untrusted follows in one path (Linux's own limit is 40).
MAX_LINKS = 40


@functools.cache
def _own_group(gid: int) -> bool:
    """Whether group `gid` is this user's private group (its primary group, named as the user,
    with no other member): where it may write, only this user may (Debian's and Ubuntu's
    umask 002 makes caches group-writable, for such a group alone). Never group 0, root's,
    which container platforms give as primary group to users of any id."""
    if gid == 0:
        return False
    try:
        import grp
        import pwd

        group, user = grp.getgrgid(gid), pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return False
    return gid == os.getgid() and group.gr_name == user and set(group.gr_mem) <= {user}


def why_changeable(here: Path, status: os.stat_result) -> str | None:
    """Why another user could change what `here` (a folder or file, `status` its lstat) holds,
    or None: owned by someone but this user and root, or writable by others, or by a group but
    this user's own (a folder with the sticky bit excepted: others may add to it, as to /tmp,
    but not replace what is in it)."""
    if status.st_uid not in (os.getuid(), 0):
        return f"{here} belongs to user id {status.st_uid}"
    if stat.S_ISDIR(status.st_mode) and status.st_mode & stat.S_ISVTX:
        return None
    if status.st_mode & stat.S_IWOTH:
        return f"{here} is writable by every user"
    if status.st_mode & stat.S_IWGRP and not _own_group(status.st_gid):
        return f"{here} is writable by group id {status.st_gid}"
    return None


def why_untrusted(path: Path, must_exist: bool = False) -> str | None:
    """Why another user may have put or changed what `path` (a folder or file) holds, or None
    where no one but this user and root could have: each folder from the root to `path`, each
    link met on the way (its owner; the folders it leads through are walked too) and `path`
    itself, judged by why_changeable. What does not exist (or cannot be looked at) is not judged:
    what spio makes there is its own, and what it cannot look at it cannot read either; but with
    `must_exist` (a file spio has just written, about to be used) it is a reason."""
    current = Path("/")
    # (Not os.path.abspath: it drops `..` by the text, where the kernel takes it after a link.)
    path = Path(path)
    pending = list((path if path.is_absolute() else Path(os.getcwd(), path)).parts[1:])
    links = 0
    try:
        reason = why_changeable(current, os.lstat(current))
    except OSError:
        return None
    while pending and reason is None:
        name = pending.pop(0)
        if name == "..":
            current = current.parent
            continue
        here = current / name
        try:
            status = os.lstat(here)
        except OSError:  # not there (or not a folder, or not searchable): nothing to read
            return f"{here} is missing" if must_exist else None
        if stat.S_ISLNK(status.st_mode):
            if status.st_uid not in (os.getuid(), 0):  # (its folder was judged: `current`)
                return f"{here} is a link of user id {status.st_uid}"
            links += 1
            if links > MAX_LINKS:  # a loop: nothing can be read through it either
                return f"{here} is in a loop of links" if must_exist else None
            try:
                target = Path(os.readlink(here))
            except OSError:  # gone meanwhile: judged again at the next look
                return f"{here} is gone" if must_exist else None
            if target.is_absolute():
                current, pending = Path("/"), [*target.parts[1:], *pending]
                reason = why_changeable(current, os.lstat(current))
            else:
                pending = [*target.parts, *pending]
            continue
        reason = why_changeable(here, status)
        current = here
    return reason


def _remove_foreign_lock(lock: Path) -> None:
    """A lock file that is not this user's own (a regular 0600 file of one link, as filelock
    makes it) removed, so that filelock makes one that is: an older spio's 0644 one, or another
    user's in a sticky folder, let a reader take the lock and hold off builds for good (a mode
    changed now would not take back a descriptor opened before). OSError where it cannot be
    removed (the caller then builds in memory)."""
    try:
        status = os.lstat(lock)
    except FileNotFoundError:
        return
    own = (
        stat.S_ISREG(status.st_mode)
        and status.st_uid == os.getuid()
        and status.st_nlink == 1
        and stat.S_IMODE(status.st_mode) == 0o600
    )
    if not own:
        os.unlink(lock)  # (the name only: a hard link's file is left as it is)


def make_folder(folder: Path) -> None:
    """`folder` and the folders it is in, made where missing, each writable by its owner alone
    whatever the umask (Path.mkdir(parents=True) makes the parents 0o777 less the umask: every
    user's, under umask 0)."""
    missing = []
    here = folder
    while not here.is_dir():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for made in reversed(missing):
        try:
            os.mkdir(made, 0o755)
        except FileExistsError:  # another process made it meanwhile
            pass


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a new file next to `path`, then rename it into place: readers see the old
    file or the whole new one, and a partial temporary file never stays. The file gets 0o644
    less the umask (mkstemp's would be 0o600: a cache built by one user, e.g. while a container
    image is built, must be readable by others as the umask allows; never writable by others,
    nor by a group, whose change to an entry the cache would then not trust)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o644)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name next to {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def hash_key(*parts: object) -> str:
    """A hex digest of JSON-serialisable parts, for use as a cache key."""
    blob = json.dumps([SCHEMA_VERSION, *parts], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _encode(payload: bytes, meta: dict) -> bytes:
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    digest = hashlib.sha256(meta_bytes + payload).digest()
    return _HEADER.pack(_MAGIC, digest, len(meta_bytes)) + meta_bytes + payload


def _decode(blob: bytes) -> tuple[bytes, dict] | None:
    """Payload and meta of a cache entry, or None when the entry is damaged."""
    if len(blob) < _HEADER.size:
        return None
    magic, digest, meta_len = _HEADER.unpack_from(blob)
    body = blob[_HEADER.size :]
    if magic != _MAGIC or meta_len > len(body) or hashlib.sha256(body).digest() != digest:
        return None
    try:
        meta = json.loads(body[:meta_len])
    except ValueError:
        return None
    return body[meta_len:], meta


#: Entries a DiskCache keeps in memory (cubin, PTX and log: ~70 KiB each), before it starts
#: over: a compile worker, or `spio compile` over every kernel, had kept every entry it met
#: for the life of the process (~5 MB a worker per 120 kernels). One dropped is read from
#: disk again, or, where the folder cannot be written, built again.
MEMORY_ENTRIES = 256


#: Seconds between the lines saying that a process waits for another's build of an entry.
LOCK_NOTICE_SECONDS = 30.0


def _acquire_saying_so(lock) -> None:
    """Acquire a cache entry's file lock, saying every LOCK_NOTICE_SECONDS that this process
    still waits (another holds it: building the entry, or stopped in a debugger or by Ctrl-Z),
    where it had waited in silence, however long."""
    import filelock

    waited = 0.0
    while True:
        try:
            lock.acquire(timeout=LOCK_NOTICE_SECONDS)
            return
        except filelock.Timeout:
            waited += LOCK_NOTICE_SECONDS
            logger.warning(
                "waited %.0f s for %s: another process holds it (building that entry, or "
                "stopped); still waiting",
                waited,
                lock.lock_file,
            )


class DiskCache:
    """Entries of one kind (e.g. "cubin") under `<cache_root>/<namespace>/`."""

    def __init__(self, namespace: str, root: Path | None = None):
        self.namespace = namespace
        self._root = root
        # By the entry's path, so that an SPIO_CACHE_DIR changed meanwhile is a miss (stored there).
        self._memory: dict[Path, tuple[bytes, dict]] = {}
        self._memory_lock = threading.Lock()
        self._building = KeyedLocks()  # by key: this process's threads
        self._warned = False

    @property
    def folder(self) -> Path:
        return (self._root or cache_root()) / self.namespace

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.bin"

    def _warn_once(self, error: OSError) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "spio cannot write its cache folder %s (%s); compiled kernels are kept in memory "
                "for this process only. Set SPIO_CACHE_DIR to a writable folder.",
                self.folder,
                error,
            )

    def untrusted(self) -> bool:
        """Whether the folder may hold another user's files (why_untrusted): then
        nothing is read from it or written to it, and this says so once (a warning)."""
        reason = why_untrusted(self.folder)
        if reason is None:
            return False
        if not self._warned:
            self._warned = True
            logger.warning(
                "spio does not use its cache folder %s: %s, so another user could have put "
                "kernels there that this process would run. Compiled kernels are kept in memory "
                "for this process only. %s",
                self.folder,
                reason,
                TRUST_ADVICE_SENTENCE,
            )
        return True

    def _load(self, path: Path, rebuilding: bool = False) -> tuple[bytes, dict] | None:
        """The entry in `path`, or None (also where the folder or the file may hold another
        user's bytes: `untrusted`). `rebuilding`: the last look before a build (under the file
        lock), which alone says that a damaged entry is rebuilt (a lookup looks three times)."""
        if self.untrusted():
            return None
        try:
            with open(path, "rb") as f:
                status = os.fstat(f.fileno())  # (the file read, not one at its path later)
                blob = f.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            logger.debug("cache read failed for %s: %s", path, error)
            return None
        distrust = why_changeable(path, status)
        if distrust is not None:
            logger.info("cache entry %s is not used (%s); building it again", path.name, distrust)
            return None
        entry = _decode(blob)
        if entry is None and rebuilding:
            logger.info("cache entry %s is damaged; rebuilding it", path.name)
        return entry

    def _store(self, path: Path, payload: bytes, meta: dict) -> None:
        """Write the entry; once more where its folder was removed meanwhile (`spio clear-cache`
        while this process compiles), which is no reason to think the folder unwritable."""
        data = _encode(payload, meta)
        try:
            write_atomically(path, data)
        except FileNotFoundError:
            make_folder(path.parent)
            write_atomically(path, data)

    def _store_or_warn(self, path: Path, payload: bytes, meta: dict) -> None:
        """_store, or where the folder cannot be written, the warning (once) that entries are
        kept in memory only (the caller keeps it there)."""
        try:
            self._store(path, payload, meta)
        except OSError as error:
            self._warn_once(error)

    def get(self, key: str) -> tuple[bytes, dict] | None:
        """The entry for `key` (payload, meta), from memory or disk; None on a miss."""
        path = self.path(key)
        with self._memory_lock:
            hit = self._memory.get(path)
        if hit is not None:
            return hit
        entry = self._load(path)
        if entry is not None:
            self._remember(path, entry)
        return entry

    def get_or_build(
        self, key: str, build: Callable[[], tuple[bytes, dict]]
    ) -> tuple[bytes, dict, bool]:
        """The entry for `key`, built by `build()` on a miss: (payload, meta, was_cached). One
        thread of a process builds it while the others wait (the file lock serves processes, and
        there is none where the folder cannot be written)."""
        entry = self.get(key)
        if entry is not None:
            return entry[0], entry[1], True
        with self._building[key]:
            return self._get_or_build(key, build)

    def _get_or_build(
        self, key: str, build: Callable[[], tuple[bytes, dict]]
    ) -> tuple[bytes, dict, bool]:
        entry = self.get(key)  # another thread may have built it meanwhile
        if entry is not None:
            return entry[0], entry[1], True
        path = self.path(key)
        if self.untrusted():  # nothing written there, no lock file either
            return self._build_in_memory(path, build)
        import filelock

        lock: filelock.FileLock | None = None
        try:
            make_folder(self.folder)
            _remove_foreign_lock(Path(str(path) + ".lock"))
            lock = filelock.FileLock(str(path) + ".lock", mode=0o600)  # (a reader could block it)
            _acquire_saying_so(lock)
        except OSError as error:  # read-only or full cache folder
            self._warn_once(error)
            return self._build_in_memory(path, build)
        except NotImplementedError as error:  # filelock 3 where the file system has no flock
            # (Lustre mounted noflock, some FUSE mounts): build unlocked; the entry is still
            # written whole (write_atomically), at worst by two processes at once.
            logger.debug("cache lock unavailable for %s: %s", path, error)
            lock = None
        try:
            entry = self._load(path, rebuilding=True)  # another process may have built it
            if entry is not None:
                self._remember(path, entry)
                return entry[0], entry[1], True
            payload, meta = build()
            self._store_or_warn(path, payload, meta)
        finally:
            if lock is not None:
                lock.release()
        self._remember(path, (payload, meta))
        return payload, meta, False

    def _build_in_memory(
        self, path: Path, build: Callable[[], tuple[bytes, dict]]
    ) -> tuple[bytes, dict, bool]:
        """get_or_build's answer where the folder is not used: built, kept in memory only."""
        payload, meta = build()
        self._remember(path, (payload, meta))
        return payload, meta, False

    def on_disk(self, key: str) -> bool:
        """Whether the entry for `key` is on disk (not read, nor checked) in a folder the cache
        uses (not `untrusted`)."""
        return not self.untrusted() and self.path(key).is_file()

    def keep(self, key: str, payload: bytes, meta: dict) -> None:
        """Keep an entry built elsewhere (a compile worker) that is not on disk: stored if this
        process can (the worker's write may have met a folder removed meanwhile), else kept in
        memory, warning once, as for an entry this process could not store."""
        path = self.path(key)
        if not self.untrusted():
            self._store_or_warn(path, payload, meta)
        self._remember(path, (payload, meta))

    def discard(self, key: str) -> None:
        """Forget the entry for `key`, in memory and on disk (e.g. one its reader cannot use), so
        that the next get_or_build builds it again."""
        path = self.path(key)
        with self._memory_lock:
            self._memory.pop(path, None)
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            logger.debug("cache entry %s could not be removed: %s", key, error)

    @property
    def warned(self) -> bool:
        """Whether this process was told (or, `quiet`, not to be told) that the folder cannot
        be written."""
        return self._warned

    def quiet(self) -> None:
        """Do not warn that the folder cannot be written (compile workers: their parent does)."""
        self._warned = True

    def _remember(self, path: Path, entry: tuple[bytes, dict]) -> None:
        with self._memory_lock:
            remember(self._memory, path, entry, MEMORY_ENTRIES)

    def clear_memory(self) -> None:
        """Forget in-memory entries (the disk is untouched); used by tests."""
        with self._memory_lock:
            self._memory.clear()


#: The files spio makes in a namespace folder, and in the emulator's lib/ below it: an entry
#: (`<key>.bin`), its lock file, a library copy (`<key>.so`), and write_atomically's temporary
#: files. A cache root may be shared (SPIO_CACHE_DIR=~/.cache), and a folder of the same name
#: there may hold another program's files: those are not spio's to delete.
_OWN_FILE = re.compile(r"[0-9a-f]{64}\.(?:bin|bin\.lock|so)(?:\.[0-9a-f]+\.tmp)?")

#: The folder spio makes in a namespace folder (the emulator's library copies, spio.emulator.build).
LIBRARY_FOLDER = "lib"


def own_files(folder: Path) -> list[Path]:
    """The files spio made in namespace folder `folder` and its lib/ subfolder (see _OWN_FILE);
    [] when it does not exist. Links are not taken for files; a namespace folder may be one
    (a user's move of it to a larger disk), but not the lib/ subfolder, which spio makes
    itself: a link there, to a folder of the user's, had had its files removed."""
    found: list[Path] = []
    for where in (folder, folder / LIBRARY_FOLDER):
        if where.name == LIBRARY_FOLDER and where.is_symlink():
            continue
        try:
            entries = list(os.scandir(where))
        except OSError:  # missing, or not a folder
            continue
        found += [
            Path(entry.path)
            for entry in entries
            if _OWN_FILE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)
        ]
    return sorted(found)


def remove_own_files(folder: Path) -> tuple[int, int, list[OSError]]:
    """Delete spio's files in namespace folder `folder` (own_files), then its lib/ subfolder and
    itself where that empties them: (files removed, their bytes, the errors met)."""
    count = total = 0
    errors: list[OSError] = []
    for path in own_files(folder):
        try:
            size = path.lstat().st_size
            path.unlink()
        except FileNotFoundError:  # removed meanwhile (another clear-cache)
            continue
        except OSError as error:
            errors.append(error)
            continue
        count, total = count + 1, total + size
    for empty in (folder / LIBRARY_FOLDER, folder):
        try:
            empty.rmdir()  # only when empty; not a link to a folder either
        except OSError:
            pass
    return count, total, errors


def own_size(folder: Path) -> tuple[int, int]:
    """(number of files, total bytes) of spio's files in namespace folder `folder` (own_files:
    what clear-cache would remove, not another program's files there); (0, 0) when it does not
    exist."""
    count = total = 0
    for path in own_files(folder):
        try:
            total += path.lstat().st_size
        except OSError:  # removed meanwhile, or in a folder it may list but not search
            continue
        count += 1
    return count, total
