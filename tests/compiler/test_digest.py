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
    only = digest.headers_identity(root, ["sub/b.cuh"])
    (root / "a.h").write_text("#define A 10\n")
    assert digest.headers_identity(root, ["sub/b.cuh"]) == only


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
