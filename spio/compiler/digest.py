"""Digests that go into cache keys: a file tree's content, a header folder, a shared library.

compile.py keys cubins with these; the emulator's build keys its libraries the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
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


def headers_identity(folder: Path, names: Iterable[str] | None = None) -> str:
    """Cheap identity of a header folder: its path and each header's name, size and mtime.

    `names` picks the headers; by default, every `*.h*` file directly in `folder`. Statting
    instead of reading keeps this fast for the CUDA headers (hundreds of files, megabytes).
    """
    digest = hashlib.sha256(str(folder).encode())
    paths = sorted(folder.glob("*.h*")) if names is None else [folder / n for n in names]
    for path in paths:
        if path.is_file():
            st = path.stat()
            digest.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
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
