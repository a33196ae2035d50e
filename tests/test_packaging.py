"""Every file the package needs at run time ships in it: headers, kernel sources, the emulator's
runtime and shims (one of which, <nv/target>, has no extension), models and their metadata; and
its declared dependencies are the packages it imports."""

import ast
import importlib.metadata
import re
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import REPO

#: Notes for readers the package ships (the others are not run time): the README and the
#: perf model loader's messages point to the shipped models' README.
SHIPPED_NOTES = ("spio/perf_models/README.md",)


def _tracked_package_files() -> list[str]:
    """The package's files under git (none outside a git checkout, e.g. in an sdist)."""
    return subprocess.run(
        ["git", "ls-files", "spio"], cwd=REPO, capture_output=True, encoding="utf-8", check=True
    ).stdout.split()


def test_build_py_copies_every_tracked_package_file(tmp_path):
    tracked = _tracked_package_files()
    if not tracked:  # not a git checkout (e.g. an sdist): nothing to compare against
        tracked = [str(p.relative_to(REPO)) for p in (REPO / "spio").rglob("*") if p.is_file()]
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        encoding="utf-8",
    )
    assert build.returncode == 0, build.stderr
    needed = [f for f in tracked if not f.endswith(".md") or f in SHIPPED_NOTES]
    missing = [f for f in needed if not (tmp_path / f).is_file()]
    assert not missing, f"files left out of the package: {missing}"


# Distributions spio uses without importing them: NVIDIA's wheels, whose libnvrtc and CUDA headers
# spio finds on disk (spio.cuda.paths).
_USED_AS_FILES = {"nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"}


def _imports(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(modules imported at a module's top level, modules imported anywhere), top-level
    packages only, without the standard library and spio itself."""

    def names(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            return [node.module]
        return []

    def third_party(found) -> set[str]:
        tops = {name.split(".")[0] for name in found}
        return tops - set(sys.stdlib_module_names) - {"spio", "__future__"}

    top_level = [name for node in tree.body for name in names(node)]
    anywhere = [name for node in ast.walk(tree) for name in names(node)]
    return third_party(top_level), third_party(anywhere)


def test_the_declared_dependencies_are_what_spio_imports():
    """What pyproject.toml declares matches the code: every module spio imports at a module's
    top level is a dependency (an `import spio` must not fail for want of one), every module it
    imports anywhere is a dependency or in an extra, and every dependency is imported or used on
    disk (none left over). The declared list is the installed metadata's: after changing
    pyproject.toml's dependencies, install again (`pip install -e .`) before running this."""
    required, extras = set(), set()
    for requirement in importlib.metadata.requires("spio"):
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        (extras if "extra ==" in requirement else required).add(name)
    on_import, anywhere = set(), set()
    for path in (REPO / "spio").rglob("*.py"):
        top, every = _imports(ast.parse(path.read_text(encoding="utf-8")))
        on_import |= top
        anywhere |= every
    assert on_import <= required, f"imported when spio is, not dependencies: {on_import - required}"
    assert anywhere <= required | extras, f"imported, not declared: {anywhere - required - extras}"
    assert required - _USED_AS_FILES <= anywhere, (
        f"declared, never imported: {required - _USED_AS_FILES - anywhere}"
    )


def test_sdist_holds_the_tracked_package_files_and_nothing_else(tmp_path):
    """The sdist has every tracked file of the package, and none of what a build leaves in the
    source tree (driver.c, the extension's .so, caches): MANIFEST.in keeps those out."""
    tracked = _tracked_package_files()
    if not tracked:
        pytest.skip("not a git checkout: nothing to compare against")
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--formats=gztar", "--dist-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        encoding="utf-8",
    )
    assert build.returncode == 0, build.stderr
    (archive,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        shipped = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    needed = [f for f in tracked if not f.endswith(".md") or f in SHIPPED_NOTES]
    missing = [f for f in needed if f not in shipped]
    assert not missing, f"files left out of the sdist: {missing}"
    stray = sorted(f for f in shipped if f.startswith("spio/") and f not in tracked)
    assert not stray, f"untracked files in the sdist: {stray}"


def test_the_version_is_written_once():
    """spio.__version__ is the distribution's version: pyproject.toml reads it from there
    (dynamic), where it had its own copy that a bump could miss (the autotuning cache's key
    holds spio.__version__)."""
    import spio

    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")  # (tomllib: Python 3.11+)
    assert re.search(r'^dynamic = \["version"\]', text, re.MULTILINE)
    assert not re.search(r'^version = "', text, re.MULTILINE)  # no literal version
    assert 'version = {attr = "spio.__version__"}' in text
    assert importlib.metadata.version("spio") == spio.__version__
