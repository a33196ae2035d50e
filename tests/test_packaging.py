"""Every file the package needs at run time ships in it: headers, kernel sources, the emulator's
runtime and shims (one of which, <nv/target>, has no extension), models and their metadata."""

import subprocess
import sys

from tests.conftest import REPO


def test_build_py_copies_every_tracked_package_file(tmp_path):
    tracked = subprocess.run(
        ["git", "ls-files", "spio"], cwd=REPO, capture_output=True, encoding="utf-8", check=True
    ).stdout.split()
    if not tracked:  # not a git checkout (e.g. an sdist): nothing to compare against
        tracked = [str(p.relative_to(REPO)) for p in (REPO / "spio").rglob("*") if p.is_file()]
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        encoding="utf-8",
    )
    assert build.returncode == 0, build.stderr
    needed = [f for f in tracked if not f.endswith(".md")]  # notes for readers, not run time
    missing = [f for f in needed if not (tmp_path / f).is_file()]
    assert not missing, f"files left out of the package: {missing}"
