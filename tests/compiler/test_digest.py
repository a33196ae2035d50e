"""The digests in cache keys: a tree's content, a header folder's identity, a library's identity."""

import os
import shutil

from spio.compiler import digest


def make_tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.h").write_text("#define A 1\n")
    (root / "sub" / "b.cuh").write_text("#define B 2\n")
    return root


def test_tree_digest_follows_content_not_location(tmp_path):
    first = make_tree(tmp_path / "one")
    second = tmp_path / "elsewhere" / "two"
    shutil.copytree(first, second)
    assert digest.tree_digest(first) == digest.tree_digest(second)
    (second / "sub" / "b.cuh").write_text("#define B 3\n")
    assert digest.tree_digest(first) != digest.tree_digest(second)
    (second / "sub" / "b.cuh").write_text("#define B 2\n")
    (second / "sub" / "b.cuh").rename(second / "b.cuh")  # a file moved inside the tree
    assert digest.tree_digest(first) != digest.tree_digest(second)


def test_tree_digest_keeps_file_boundaries(tmp_path):
    """Names and contents do not run together: x.h "AB" beside y.h "C" is not a lone x.h
    "ABy.hC" (hashing them back to back made the two one digest)."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "x.h").write_text("AB")
    (one / "y.h").write_text("C")
    (two / "x.h").write_text("ABy.hC")
    assert digest.tree_digest(one) != digest.tree_digest(two)


def test_tree_digest_skips_pycache_and_takes_a_missing_tree(tmp_path):
    root = make_tree(tmp_path / "tree")
    before = digest.tree_digest(root)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert digest.tree_digest(root) == before
    assert digest.tree_digest(tmp_path / "missing") == digest.tree_digest(tmp_path / "missing2")


def test_headers_identity_sees_size_mtime_and_names(tmp_path):
    root = make_tree(tmp_path / "include")
    (root / "notes.txt").write_text("not a header")
    before = digest.headers_identity(root)
    (root / "notes.txt").write_text("still not a header, longer")
    assert digest.headers_identity(root) == before
    st = (root / "a.h").stat()
    os.utime(root / "a.h", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert digest.headers_identity(root) != before


def test_library_identity_sees_a_rebuild_not_a_move(tmp_path):
    blob = bytes(range(256)) * (3 * digest.LIBRARY_HEAD_BYTES // 256)
    lib = tmp_path / "a" / "libnvrtc.so.12"
    lib.parent.mkdir()
    lib.write_bytes(blob)
    moved = tmp_path / "b" / "libnvrtc.so.12"
    moved.parent.mkdir()
    shutil.copy2(lib, moved)
    assert digest.library_identity(lib) == digest.library_identity(moved)
    moved.write_bytes(blob[:100] + b"\xff" + blob[101:])  # a byte in the head (the build-id)
    assert digest.library_identity(lib) != digest.library_identity(moved)
    moved.write_bytes(blob + b"\0")  # same head, another size
    assert digest.library_identity(lib) != digest.library_identity(moved)


def test_tree_digest_does_not_depend_on_the_order_files_are_listed_in(tmp_path, monkeypatch):
    """The listing order is the file system's (e.g. creation order on tmpfs): the digest sorts."""
    from pathlib import Path

    root = make_tree(tmp_path / "tree")
    (root / "c.h").write_text("#define C 3\n")
    before = digest.tree_digest(root)
    rglob = Path.rglob
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: reversed(list(rglob(self, pattern))))
    assert digest.tree_digest(root) == before


def _same_stat(path, like):
    """Give `path` the access and modification times of `like` (as a copy or unpack may)."""
    st = like.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_headers_identity_sees_a_new_size_at_the_same_mtime(tmp_path):
    root = make_tree(tmp_path / "include")
    saved = tmp_path / "saved.h"
    shutil.copy2(root / "a.h", saved)
    before = digest.headers_identity(root)
    (root / "a.h").write_text("#define A 100\n")
    _same_stat(root / "a.h", saved)
    assert digest.headers_identity(root) != before


def test_headers_identity_sees_a_renamed_header(tmp_path):
    root = make_tree(tmp_path / "include")
    before = digest.headers_identity(root)
    (root / "a.h").rename(root / "b.h")  # same size and mtime
    assert digest.headers_identity(root) != before


def test_headers_identity_names_its_folder(tmp_path):
    """A copy elsewhere, mtimes kept, is another identity: a new or moved environment compiles
    afresh once (compile.cubin_key)."""
    first = make_tree(tmp_path / "one")
    second = tmp_path / "two"
    shutil.copytree(first, second)  # copy2: the same sizes and mtimes
    assert digest.headers_identity(first) != digest.headers_identity(second)


def test_headers_identity_sees_hpp_headers(tmp_path):
    """The CUDA headers folder holds .hpp files beside its .h files (cuda_fp16.hpp, ...)."""
    root = make_tree(tmp_path / "include")
    (root / "c.hpp").write_text("// header\n")
    before = digest.headers_identity(root)
    st = (root / "c.hpp").stat()
    os.utime(root / "c.hpp", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert digest.headers_identity(root) != before


def _touch_later(path):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_headers_identity_sees_headers_in_subfolders(tmp_path):
    """A CUDA 13 installation's crt/ headers come from a package of their own (nvidia-cuda-crt),
    and a toolkit's libcu++ headers (cuda/std/cstdint, no suffix) live in subfolders: upgrading
    them alone must change the identity, as upgrading a top-level header does."""
    root = make_tree(tmp_path / "include")
    (root / "crt").mkdir()
    (root / "crt" / "host_defines.h").write_text("#define X 1\n")
    (root / "cuda" / "std").mkdir(parents=True)
    (root / "cuda" / "std" / "cstdint").write_text("#pragma once\n")
    (root / "sub" / "notes.txt").write_text("not a header")
    for header in ("crt/host_defines.h", "cuda/std/cstdint", "sub/b.cuh"):
        before = digest.headers_identity(root)
        _touch_later(root / header)
        assert digest.headers_identity(root) != before, header
    before = digest.headers_identity(root)
    _touch_later(root / "sub" / "notes.txt")
    assert digest.headers_identity(root) == before
    (root / "crt" / "host_defines.h").rename(root / "host_defines.h")  # same size and mtime
    assert digest.headers_identity(root) != before
