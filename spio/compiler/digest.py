"""Digests that go into cache keys: a file tree's content, a header folder, a shared library.

compile.py keys cubins with these; the emulator's build keys its libraries the same way.
"""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

#: How much of a shared library `library_identity` reads: its ELF headers and GNU build-id are
#: at the front, so any rebuild of the library (a patch release too) changes this first MiB.
LIBRARY_HEAD_BYTES = 1 << 20


def tree_digest(root: Path) -> str:
    """sha256 of every file under `root`: its path relative to `root` and its content, each
    preceded by its length, so that no two trees run together into the same bytes (a file
    "AB" beside "y.h" holding "C" against a lone file "ABy.hC").

    Relative paths only, so moving the tree keeps the digest; __pycache__ folders are skipped;
    a missing `root` digests as an empty tree.
    """
    digest = hashlib.sha256()
    if root.is_dir():
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.relative_to(root).parts:
                name, content = str(path.relative_to(root)).encode(), path.read_bytes()
                digest.update(b"%d:%s%d:" % (len(name), name, len(content)))
                digest.update(content)
    return digest.hexdigest()


#: Suffixes of header files: C and C++ headers, CUDA's .cuh and the .inl files headers include;
#: a file without one is a header too (libcu++'s `cuda/std/cstdint`).
HEADER_SUFFIXES = frozenset({"", ".h", ".hh", ".hpp", ".hxx", ".cuh", ".inl", ".inc"})


def headers_identity(folder: Path) -> str:
    """Cheap identity of a header folder: its path and each header's path in it, size and mtime.

    Every header file in `folder` and its subfolders counts (a CUDA 13 installation's `crt/`
    comes from a package of its own, and a toolkit's libcu++ headers live in subfolders).
    Statting instead of reading keeps this fast for the CUDA headers (a toolkit's 1,900 files in
    about 0.1 s).
    """
    digest = hashlib.sha256(str(folder).encode())
    files = sorted(path for path in folder.rglob("*") if path.suffix in HEADER_SUFFIXES)
    for path in files:
        try:
            st = path.stat()
        except OSError:  # a dangling link
            continue
        if stat.S_ISREG(st.st_mode):  # not a folder (`crt`, `cuda/std` have no suffix either)
            name = path.relative_to(folder).as_posix()
            digest.update(f"{len(name)}:{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()


def library_identity(path: Path) -> str:
    """sha256 of a shared library's size and first LIBRARY_HEAD_BYTES bytes.

    It changes with every build of the library (a patch release of NVRTC with the same
    major.minor too) but not with the folder it is installed in.
    """
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        head = f.read(LIBRARY_HEAD_BYTES)
    digest = hashlib.sha256(f"{size}:".encode())
    digest.update(head)
    return digest.hexdigest()
