"""The command line and the import contract: no GPU or NVRTC work at import time."""

import json
import os
import platform
import re
import subprocess
import sys
import types

import pytest

from tests.conftest import REPO, gpu_available, run_spio


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (so that nothing imported here counts)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, encoding="utf-8", env=env
    )


def test_import_does_no_gpu_or_nvrtc_work():
    code = (
        "import sys, spio\n"
        "assert 'torch' not in sys.modules, 'import spio imported torch'\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libnvrtc' not in maps and 'libcuda' not in maps, 'loaded CUDA libraries'\n"
        "assert not [t for t in __import__('threading').enumerate() if t.name != 'MainThread']\n"
        "print(spio.__version__, spio.supported_arch)\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert "('sm_80', 'sm_86', 'sm_89', 'sm_90')" in out.stdout


def test_public_subpackages_load_on_first_access():
    """`import spio` then spio.layers.Conv2dGw8 works (as torch.nn after `import torch`), still
    without importing torch at import time; an unknown name is an AttributeError naming it."""
    code = (
        "import sys, spio\n"
        "assert 'torch' not in sys.modules\n"
        "assert spio.layers.Conv2dGw8.__name__ == 'Conv2dGw8'\n"
        "assert spio.kernels.Conv2dGw8Params(1, 8, 4, 4).p == 4\n"
        "assert callable(spio.functional.conv2d_gw8) and spio.generators.TensorSpec\n"
        "try:\n"
        "    spio.nonexistent\n"
        "except AttributeError as error:\n"
        "    assert 'nonexistent' in str(error)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr


def test_info_reports_versions_paths_gpu_and_cache(tmp_path):
    out = run_spio("info", env={"SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())
    assert lines["spio"].strip()
    assert lines["python"].startswith(f"{platform.python_version()} at ")
    assert "xgboost" not in lines  # spio reads its models without it: no dependency to report
    from spio.emulator import build

    assert (
        lines["emulator"].strip()
        == f"{build.compiler()}: {build.compiler_version(build.compiler())}"
    )
    assert "libnvrtc" in out.stdout
    assert str(tmp_path) in out.stdout
    assert "sm_90: fprop, dgrad, wgrad (measured on NVIDIA H200" in lines["perf"]
    gpu_line = next(line for line in out.stdout.splitlines() if line.startswith("GPU"))
    if gpu_available():
        assert "sm_" in gpu_line
    else:
        assert "no GPU" in gpu_line
        assert gpu_line.count("SPIO_EMULATE=1") == 1, gpu_line  # the hint once (it was twice)


def _refuse_import(monkeypatch, refused, error: Exception) -> None:
    """From now on (until monkeypatch undoes it) an import for which
    `refused(name, fromlist, level)` is true raises `error`."""
    import builtins

    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if refused(name, fromlist, level):
            raise error
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def _driver_import(name, fromlist, level) -> bool:
    """Whether an import is spio's `from .cuda import driver` (for _refuse_import)."""
    return level == 1 and name == "cuda" and "driver" in (fromlist or ())


@pytest.mark.parametrize("broken", ["driver", "nvrtc"])
def test_info_fails_on_a_broken_install(broken, tmp_path, monkeypatch, capsys):
    """A driver extension that does not load (e.g. a Cython bug) or a missing NVRTC is a broken
    install: `info` still prints every line, then exits 1. No GPU alone is not broken (above)."""
    from spio import __main__ as cli
    from spio.cuda import nvrtc

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    if broken == "driver":
        _refuse_import(
            monkeypatch,
            _driver_import,
            ImportError("undefined symbol: __pyx_tp_new_vectorcall_x"),
        )
    else:

        def no_nvrtc():
            raise FileNotFoundError("libnvrtc not found")

        monkeypatch.setattr(nvrtc, "version", no_nvrtc)
    assert cli.cmd_info(None) == 1
    out = capsys.readouterr().out
    assert "BROKEN INSTALL" in out
    assert "supported arch" in out and str(tmp_path) in out


def test_info_names_a_source_tree_that_shadows_the_installed_spio(tmp_path, monkeypatch, capsys):
    """Run from a checkout's root, `python -m spio` imports the checkout's spio, whose driver
    extension is not built, rather than the installed wheel: info called the install broken.
    It now names the folder spio came from and what to do."""
    import importlib.machinery
    import importlib.metadata

    from spio import __main__ as cli

    source = tmp_path / "checkout" / "spio"
    (source / "cuda").mkdir(parents=True)
    installed = tmp_path / "site-packages" / "spio"
    (installed / "cuda").mkdir(parents=True)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (installed / "cuda" / f"driver{suffix}").write_bytes(b"")
    wheel = types.SimpleNamespace(locate_file=lambda name: tmp_path / "site-packages" / name)
    # Found first: the checkout's own spio.egg-info (`pip install .` leaves one there), which
    # locates the checkout; and a distribution that cannot locate its files.
    checkout = types.SimpleNamespace(locate_file=lambda name: source.parent / name)
    unlocatable = types.SimpleNamespace(locate_file=lambda name: 1 / 0)
    monkeypatch.setattr(
        importlib.metadata, "distributions", lambda name: iter([checkout, unlocatable, wheel])
    )
    monkeypatch.setattr(cli, "__file__", str(source / "__main__.py"))
    _refuse_import(
        monkeypatch, _driver_import, ImportError("cannot import name 'driver' from 'spio.cuda'")
    )
    gpus, why = cli._gpus()
    assert not gpus and f"spio was imported from {source}, a source tree" in why
    assert "run from another folder" in why
    (source / "cuda" / f"driver{suffix}").write_bytes(b"")  # built there: another problem
    assert "cannot import name 'driver'" in cli._gpus()[1]


def test_info_and_the_models_need_no_xgboost(tmp_path, monkeypatch, capsys):
    """spio reads and evaluates its performance models itself (spio.kernels.trees): where
    xgboost does not import (here: raising its own error, as where its library is missing),
    `info` passes and reports every shipped model usable, and each model loads and ranks."""
    from spio import __main__ as cli
    from spio.kernels import perf_model as pm
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPIO_PERF_MODELS", raising=False)
    monkeypatch.delitem(sys.modules, "xgboost", raising=False)
    _refuse_import(
        monkeypatch,
        lambda name, fromlist, level: level == 0 and name.split(".")[0] == "xgboost",
        RuntimeError("Cannot find XGBoost Library in the candidate path.\n- a/b"),
    )
    assert cli.cmd_info(None) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("perf models"))
    assert "sm_90" in row and "xgboost" not in out.lower()
    params = Conv2dGw8Params(32, 64, 28, 28)
    for name, family in pm.FAMILIES.items():
        model = pm.PerfModel.load(pm.model_path(pm.PACKAGED_MODELS_DIR, name, "sm_90"))
        configs = family.configs(params)
        assert sorted(map(repr, model.rank(params, configs))) == sorted(map(repr, configs))
    assert "xgboost" not in sys.modules


def test_info_gives_the_headers_cuda_version(tmp_path):
    from spio.cuda import nvrtc

    out = run_spio("info", env={"SPIO_CACHE_DIR": str(tmp_path)})
    row = next(line for line in out.stdout.splitlines() if line.startswith("CUDA headers"))
    assert f" {nvrtc.version()[0]}." in row and " at " in row and "TOO OLD" not in row


def test_info_reports_headers_too_old_for_the_emulator(tmp_path):
    """CUDA 12.1's headers beside a CUDA 12 NVRTC: GPU kernels build, the emulator's do not.
    (Beside a CUDA 13 NVRTC they are another major's: a broken install, tested on its own.)"""
    from spio.cuda import nvrtc

    if nvrtc.version()[0] != 12:
        pytest.skip(f"NVRTC {nvrtc.version()}: CUDA 12.1's headers are another major's")
    old = tmp_path / "include"
    old.mkdir()
    (old / "cuda_fp16.h").write_text("")
    (old / "cuda_bf16.h").write_text("")
    (old / "cuda.h").write_text("#define CUDA_VERSION 12010\n")
    out = run_spio("info", env={"SPIO_CACHE_DIR": str(tmp_path), "SPIO_CUDA_INCLUDE": str(old)})
    assert out.returncode == 0, out.stdout + out.stderr  # NVRTC still builds GPU kernels
    row = next(line for line in out.stdout.splitlines() if line.startswith("CUDA headers"))
    assert row.endswith(f"12.1 at {old}; TOO OLD for the CPU emulator, which needs 12.2+")


def test_info_reports_a_missing_or_too_old_emulator_compiler_and_passes(
    tmp_path, monkeypatch, capsys
):
    """Only the CPU emulator needs a host C++ compiler: a GPU machine without one is not broken."""
    from spio import __main__ as cli
    from spio.emulator import build

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert cli.cmd_info(None) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("emulator"))
    assert "NOT FOUND (the emulator needs a host C++ compiler (CXX='/nonexistent/c++')" in row
    monkeypatch.setenv("CXX", "clang++")
    monkeypatch.setattr(build, "compiler_version", lambda cxx: "Ubuntu clang version 14.0.0")
    assert cli.cmd_info(None) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("emulator"))
    assert row.endswith(
        "clang++: Ubuntu clang version 14.0.0; TOO OLD: the emulator needs clang 16+ or g++"
    )
    # A compiler without the unset-locals pattern (GCC 11) builds checked kernels that miss a
    # local never set: said, still exit 0.
    monkeypatch.setenv("CXX", "g++")
    monkeypatch.setattr(build, "compiler_version", lambda cxx: "g++ (Ubuntu 11.4.0) 11.4.0")
    monkeypatch.setattr(build, "_takes_flag", lambda cxx, flag: False)
    assert cli.cmd_info(None) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("emulator"))
    assert row.endswith(
        "g++: g++ (Ubuntu 11.4.0) 11.4.0; checked kernels' locals start as zeros, not a pattern "
        "(-ftrivial-auto-var-init=pattern needs GCC 12 or clang 16): a local never set goes unseen"
    )


def test_info_tries_writing_the_cache_folder_instead_of_asking_permission(
    tmp_path, monkeypatch, capsys
):
    """info reports a cache folder spio cannot create or write a file in, as the cache finds at
    run time, even where a permission check passes (as os.access does for root everywhere, e.g.
    in /proc): it had said "(0 files, 0 B)". Still exit 0. A folder it can make is fine, and
    what it made to find out is gone afterwards."""
    from spio import __main__ as cli

    (tmp_path / "file").write_bytes(b"")
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)  # as for root
    for bad in ("/proc/spio-nope", tmp_path / "file" / "sub"):
        monkeypatch.setenv("SPIO_CACHE_DIR", str(bad))
        assert cli.cmd_info(None) == 0
        row = next(
            line for line in capsys.readouterr().out.splitlines() if line.startswith("cache")
        )
        assert f"{bad}: NOT A WRITABLE FOLDER" in row and "SPIO_CACHE_DIR" in row, row
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert cli.cmd_info(None) == 0
    assert f"{tmp_path / 'new' / 'cache'} (0 files, 0 B)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_info_says_the_cache_is_on_a_noexec_file_system(tmp_path, monkeypatch, capsys):
    """The emulator then loads its libraries from memory copies (tests/emulator/test_noexec.py);
    info says so on the cache row, exit 0, and says nothing of it elsewhere."""
    from spio import __main__ as cli
    from spio.emulator import module

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "cache"))
    for mounted in (False, True):
        monkeypatch.setattr(module, "noexec", lambda folder, mounted=mounted: mounted)
        assert cli.cmd_info(None) == 0
        rows = capsys.readouterr().out.splitlines()
        (row,) = [line for line in rows if line.startswith("cache")]
        assert row.endswith(
            f"{tmp_path / 'cache'} (0 files, 0 B); mounted noexec: the emulator loads its "
            "libraries from memory copies"
            if mounted
            else f"{tmp_path / 'cache'} (0 files, 0 B)"
        ), row


def _entry(name: str = "x") -> str:
    """The file name of a cache entry, as spio names them (its key, a sha256)."""
    from spio.compiler.cache import hash_key

    return f"{hash_key(name)}.bin"


def test_clear_cache_removes_entries(tmp_path):
    (tmp_path / "cubin").mkdir()
    (tmp_path / "cubin" / _entry()).write_bytes(b"12345")
    (tmp_path / "cubin" / (_entry() + ".lock")).write_bytes(b"")
    (tmp_path / "cubin" / (_entry() + ".0123456789ab.tmp")).write_bytes(b"1")
    out = run_spio("clear-cache", env={"SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"removed 3 files (6 B) from {tmp_path}\n"
    assert not tmp_path.exists()


def test_clear_cache_says_when_there_is_no_cache_folder(tmp_path, monkeypatch, capsys):
    """A cache root that does not exist (cleared already, or a mistyped SPIO_CACHE_DIR) or is a
    file: said so, not "removed 0 files (0 B) from" it."""
    from spio.__main__ import main

    (tmp_path / "a-file").write_bytes(b"")
    for root, said in (("missing", "no cache folder at"), ("a-file", "not a folder, no cache:")):
        monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / root))
        assert main(["clear-cache"]) == 0
        assert capsys.readouterr().out == f"{said} {tmp_path / root}; nothing removed\n"
    assert (tmp_path / "a-file").is_file()


def test_clear_cache_removes_only_spios_folders(tmp_path):
    """SPIO_CACHE_DIR may name a folder that holds other things too (e.g. ~/.cache)."""
    for namespace in ("cubin", "emulator", "autotune"):
        (tmp_path / namespace).mkdir(parents=True)
        (tmp_path / namespace / _entry()).write_bytes(b"12")
    (tmp_path / "emulator" / "lib").mkdir()
    (tmp_path / "emulator" / "lib" / _entry().replace(".bin", ".so")).write_bytes(b"12")
    (tmp_path / "pip").mkdir()
    (tmp_path / "pip" / "wheel.whl").write_bytes(b"keep me")
    (tmp_path / "notes.txt").write_text("keep me")
    out = run_spio("clear-cache", env={"SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "removed 4 files (8 B)" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "pip"]
    assert (tmp_path / "pip" / "wheel.whl").read_bytes() == b"keep me"


def test_clear_cache_keeps_other_programs_files_in_folders_of_spios_names(tmp_path):
    """In a shared root (SPIO_CACHE_DIR=~/.cache) another program may keep an `autotune` or
    `emulator` folder of its own: its files stay, and so do the folders and the root."""
    theirs = {
        "autotune/results.json": b"keep",
        "emulator/avd/disk.img": b"keep",
        "emulator/lib/libother.so": b"keep",
        "cubin/notes.bin": b"keep",
    }
    for name, data in theirs.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    (tmp_path / "autotune" / _entry()).write_bytes(b"123")
    # info counts what clear-cache would remove (it had counted the other program's files too)
    info = run_spio("info", env={"SPIO_CACHE_DIR": str(tmp_path)})
    assert f"{tmp_path} (1 file, 3 B)" in info.stdout, info.stdout
    out = run_spio("clear-cache", env={"SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "removed 1 file (3 B)" in out.stdout
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(theirs)


def test_clear_cache_empties_a_namespace_folder_that_is_a_link(tmp_path):
    """A user may move a namespace folder to a larger disk and link it: its entries go, the
    link and the folder it names stay, and nothing is a traceback."""
    elsewhere = tmp_path / "big disk"
    elsewhere.mkdir()
    (elsewhere / _entry()).write_bytes(b"12")
    root = tmp_path / "root"
    root.mkdir()
    (root / "cubin").symlink_to(elsewhere)
    out = run_spio("clear-cache", env={"SPIO_CACHE_DIR": str(root)})
    assert out.returncode == 0, out.stderr
    assert "removed 1 file (2 B)" in out.stdout
    assert (root / "cubin").is_symlink() and list(elsewhere.iterdir()) == []


def test_clear_cache_does_not_follow_a_lib_folder_that_is_a_link(tmp_path):
    """spio makes each namespace's lib/ folder itself: one that is a link names a folder of
    someone else's, whose files of spio's names clear-cache had removed."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / _entry()).write_bytes(b"keep")
    root = tmp_path / "root"
    (root / "emulator").mkdir(parents=True)
    (root / "emulator" / "lib").symlink_to(theirs)
    out = run_spio("clear-cache", env={"SPIO_CACHE_DIR": str(root)})
    assert out.returncode == 0, out.stderr
    assert [p.read_bytes() for p in theirs.iterdir()] == [b"keep"]


def test_clear_cache_says_in_one_line_what_it_could_not_remove(tmp_path, monkeypatch, capsys):
    """Another user's cache (one built as root in a container image): exit 1 and one line on
    stderr, not a traceback."""
    from pathlib import Path

    from spio.__main__ import main

    (tmp_path / "cubin").mkdir()
    for name in ("a", "b"):
        (tmp_path / "cubin" / _entry(name)).write_bytes(b"12")
    (tmp_path / "autotune").mkdir()
    (tmp_path / "autotune" / _entry("c")).write_bytes(b"123")

    def unlink(self, missing_ok=False):
        if self.parent.name == "cubin":
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, missing_ok)

    real_unlink = Path.unlink
    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    assert main(["clear-cache"]) == 1
    out, err = capsys.readouterr()
    assert out == f"removed 1 file (3 B) from {tmp_path}\n"
    assert err.count("\n") == 1 and "2 files could not be removed" in err
    assert "Permission denied" in err and "Traceback" not in err
    assert len(list((tmp_path / "cubin").iterdir())) == 2


def test_unknown_command_fails_with_usage():
    out = run_spio("frobnicate")
    assert out.returncode == 2
    assert "invalid choice" in out.stderr


def test_compile_names_the_known_archs_for_an_unknown_one():
    out = run_spio("compile", "--arch", "sm_75")
    assert out.returncode == 2
    assert "unknown GPU architecture 'sm_75'; spio compiles for sm_80" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("value", ["-1", "0", "two"])
def test_compile_sample_needs_a_positive_count(value):
    out = run_spio("compile", "--sample", value)
    assert out.returncode == 2
    assert f"argument --sample: needs a positive integer, got {value!r}" in out.stderr


@pytest.mark.parametrize("level,shown", [("1", True), ("", False)])
def test_spio_logger_env_shows_info_messages(level, shown, tmp_path):
    """One line a kernel module, compiled or cached, with its time (the second call finds the
    first's cubin on disk)."""
    code = (
        "from spio.compiler import compile_cubin\n"
        "for _ in range(2):\n"
        "    compile_cubin('extern \"C\" __global__ void k() {}', 'sm_80')\n"
    )
    env = dict(os.environ, SPIO_LOGGER=level, SPIO_CACHE_DIR=str(tmp_path))
    out = run_python(code, env)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    compiled = [line for line in lines if "compiled kernel.cu for sm_80 in" in line]
    cached = [line for line in lines if "cached kernel.cu for sm_80 in" in line]
    assert (len(compiled), len(cached)) == ((1, 1) if shown else (0, 0)), out.stderr
    assert all(line.endswith(" s") for line in compiled + cached)


def test_info_says_which_gpus_no_perf_model_covers(tmp_path, monkeypatch):
    """A GPU of an arch without a model gets a line saying the heuristic picks its configs; an
    arch with one does not; an empty model folder says so."""
    import shutil as sh

    from spio import __main__ as cli
    from spio.kernels import perf_model

    models = tmp_path / "models"
    sh.copytree(perf_model.PACKAGED_MODELS_DIR / "sm_90", models / "sm_90")
    monkeypatch.setenv("SPIO_PERF_MODELS", str(models))
    rows = cli._perf_model_rows(["sm_90", "sm_86"])
    assert rows[0][0] == "perf models" and rows[0][1].startswith("sm_90: fprop, dgrad, wgrad")
    assert [value for _, value in rows[1:]] == [
        "cuda:1 (sm_86): no model applies; the analytic heuristic picks tile configs "
        "(SPIO_AUTOTUNE=1 times its top candidates on first use)"
    ]
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path / "empty"))
    assert cli._perf_model_rows([])[0] == ("perf models", f"none in {tmp_path / 'empty'}")


def test_info_names_a_damaged_model_file(tmp_path, monkeypatch):
    """info still runs and lists the models it can read, but a model whose metadata does not
    parse is no longer left out quietly (exit 0): its layers get the heuristic's configs."""
    import shutil as sh

    from spio import __main__ as cli
    from spio.kernels import perf_model

    models = tmp_path / "models"
    sh.copytree(perf_model.PACKAGED_MODELS_DIR / "sm_90", models / "sm_90")
    (models / "sm_90" / "conv2d_gw8_wgrad.json").write_text("{bad", encoding="utf-8")
    monkeypatch.setenv("SPIO_PERF_MODELS", str(models))
    rows = [value for _, value in cli._perf_model_rows([])]
    assert rows[0].startswith("sm_90: fprop, dgrad (measured on"), rows
    assert rows[1].startswith(
        f"BAD SETTING: SPIO_PERF_MODELS={models}: perf model metadata "
        f"{models / 'sm_90' / 'conv2d_gw8_wgrad.json'} is unreadable: "
    ), rows
    out = run_spio("info", env={"SPIO_PERF_MODELS": str(models), "SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 1 and "is unreadable" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("damage", ["missing", "flipped byte", "no metadata"])
def test_info_names_a_missing_or_changed_model_file(damage, tmp_path, monkeypatch):
    """A model file gone from beside its metadata, or whose bytes are not the SHA-256 its
    metadata records, is named by info (which loads no model) and not counted as covering its
    pass: at first use spio would ignore it and pick configs by the heuristic. A model file
    without its metadata had gone unmentioned (info reads the metadata files)."""
    import shutil as sh

    from spio import __main__ as cli
    from spio.kernels import perf_model

    models = tmp_path / "models"
    sh.copytree(perf_model.PACKAGED_MODELS_DIR / "sm_90", models / "sm_90")
    model = models / "sm_90" / "conv2d_gw8_dgrad.ubj"
    if damage == "missing":
        model.unlink()
    elif damage == "no metadata":
        model.with_suffix(".json").unlink()
    else:
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0x01
        model.write_bytes(bytes(data))
    monkeypatch.setenv("SPIO_PERF_MODELS", str(models))
    rows = [value for _, value in cli._perf_model_rows([])]
    assert rows[0].startswith("sm_90: fprop, wgrad (measured on"), rows
    problem = {
        "missing": "is missing",
        "flipped byte": "is corrupted or replaced",
        "no metadata": "has no metadata (conv2d_gw8_dgrad.json)",
    }[damage]
    assert rows[1].startswith(f"BAD SETTING: SPIO_PERF_MODELS={models}: perf model {model} "), rows
    assert problem in rows[1] and len(rows) == 2, rows


@pytest.mark.parametrize(
    "field,value,said",
    [
        ("arch", "sm_80", "was trained for 'sm_80', not for the sm_90 of its folder"),
        ("feature_version", -1, "feature set version -1"),
        ("family", "conv2d_gw8_fprop", "is a model of conv2d_gw8_fprop, not of conv2d_gw8_dgrad"),
        ("target", "seconds", "predicts 'seconds'"),
        ("device_slug", "nvidia-a100", "was measured on"),
    ],
)
def test_info_names_a_model_spio_would_not_use_from_its_place(
    field, value, said, tmp_path, monkeypatch
):
    """A model whose metadata names another arch, feature set, family or target than its place
    and this spio (or, one folder down, another device): spio ignores it at first use, so info
    must not count it as covering the pass (it had, by its file alone)."""
    import json
    import shutil as sh

    from spio import __main__ as cli
    from spio.kernels import perf_model

    models = tmp_path / "models"
    folder = models / "sm_90" / ("nvidia-h200" if field == "device_slug" else "")
    sh.copytree(perf_model.PACKAGED_MODELS_DIR / "sm_90", folder)
    meta_path = folder / "conv2d_gw8_dgrad.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta[field] = value
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
    monkeypatch.setenv("SPIO_PERF_MODELS", str(models))
    rows = [value for _, value in cli._perf_model_rows([])]
    assert rows[0].startswith("sm_90: fprop, wgrad (measured on"), rows
    model = meta_path.with_suffix(".ubj")
    assert rows[1].startswith(f"BAD SETTING: SPIO_PERF_MODELS={models}: perf model {model} "), rows
    assert said in rows[1] and len(rows) == 2, rows


def test_info_does_not_count_a_model_two_folders_down(tmp_path, monkeypatch):
    """spio looks for models in arch/ and arch/device/ (model_candidates), never deeper: a
    model two folders down covers nothing, and info names it out of place."""
    import shutil as sh

    from spio import __main__ as cli
    from spio.kernels import perf_model

    models = tmp_path / "models"
    sh.copytree(perf_model.PACKAGED_MODELS_DIR / "sm_90", models / "sm_90" / "nvidia-h200" / "old")
    monkeypatch.setenv("SPIO_PERF_MODELS", str(models))
    rows = [value for _, value in cli._perf_model_rows([])]
    assert any("is not where spio looks for one" in row for row in rows), rows
    assert not any(row.startswith("sm_90:") for row in rows), rows


@pytest.mark.parametrize(
    "command,setting,value",
    [
        (["check", "--quick"], "SPIO_WORKERS", "abc"),
        (["compile", "--arch", "sm_90", "--sample", "1"], "SPIO_WORKERS", "0"),
        (["check", "--quick"], "SPIO_EMULATOR_ORDER_SEED", "x"),
        (["compile", "--arch", "sm_90", "--sample", "1"], "SPIO_AUTOTUNE_TOPK", "0"),
        (["check", "--quick"], "SPIO_EMULATE", "maybe"),
        (["check", "--quick"], "SPIO_AUTOTUNE", "maybe"),
        (["check", "--quick"], "SPIO_EMU_UCONTEXT", "maybe"),
        (["check", "--quick"], "SPIO_TMA", "stores"),
        (["compile", "--arch", "sm_90", "--sample", "1"], "SPIO_PERF_MODELS", "/nonexistent"),
    ],
)
def test_a_bad_setting_is_a_one_line_error_before_any_work(command, setting, value, tmp_path):
    out = run_spio(*command, env={setting: value, "SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"spio: error: {setting} "), out.stderr
    assert repr(value) in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""  # nothing compiled or checked first


def test_every_bad_setting_is_named_once(monkeypatch, capsys):
    """Two bad settings are two lines, not the first alone; SPIO_AUTOTUNE's parser checks
    SPIO_AUTOTUNE_TOPK too, which is still named once."""
    from spio import __main__ as cli

    monkeypatch.setenv("SPIO_WORKERS", "0")
    monkeypatch.setenv("SPIO_AUTOTUNE", "1")
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "many")
    monkeypatch.setitem(cli.COMMANDS, "compile", (lambda args: pytest.fail("ran"), ""))
    assert cli.main(["compile"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "spio: error: SPIO_WORKERS must be a positive integer, got '0'",
        "spio: error: SPIO_AUTOTUNE_TOPK must be a positive integer, got 'many'",
    ]


@pytest.mark.parametrize(
    "name, value, need",
    [
        ("SPIO_EMULATOR_SHARED_OFFSET", "7", "a multiple of 16 in 0..1008"),
        ("SPIO_EMULATOR_SHARED_OFFSET", "1024", "a multiple of 16 in 0..1008"),
        ("SPIO_EMULATOR_SHARED_OFFSET", "abc", "a multiple of 16 in 0..1008"),
        ("SPIO_EMULATOR_ORDER_SEED", "1_0", "an integer"),
        ("SPIO_AUTOTUNE_TOPK", "1_0", "a positive integer"),
        ("SPIO_WORKERS", "4_0", "a positive integer"),
    ],
)
def test_every_integer_setting_is_checked_before_any_work(monkeypatch, capsys, name, value, need):
    """SPIO_EMULATOR_SHARED_OFFSET had no parser among the settings checked first: a bad one
    failed each emulated launch of `spio check` (six FAILs, some not naming it), and `info`
    passed. The integer settings take decimal digits alone, as SPIO_WORKERS did (int() also
    takes "1_0")."""
    from spio import __main__ as cli

    monkeypatch.setenv("SPIO_AUTOTUNE", "1")  # (SPIO_AUTOTUNE_TOPK is read where it is on)
    monkeypatch.setenv(name, value)
    monkeypatch.setitem(cli.COMMANDS, "check", (lambda args: pytest.fail("ran"), ""))
    assert cli.main(["check"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"spio: error: {name} must be {need}, got {value!r}"
    ]
    assert cli.main(["info"]) == 1
    assert f"{name} must be {need}, got {value!r}" in capsys.readouterr().out


def test_integer_settings_take_a_minus_sign_and_spaces(monkeypatch):
    from spio.kernels.kernel import _emulator_order_seed, _emulator_shared_offset

    for text, seed in ((" -3 ", -3), ("5", 5), ("", None), ("  ", None)):
        monkeypatch.setenv("SPIO_EMULATOR_ORDER_SEED", text)
        assert _emulator_order_seed() == seed
    for text, offset in (("16", 16), ("1008", 1008), ("", 0), ("0", 0)):
        monkeypatch.setenv("SPIO_EMULATOR_SHARED_OFFSET", text)
        assert _emulator_shared_offset() == offset


def _info_settings(monkeypatch, capsys, **settings: str) -> tuple[int, list[str]]:
    """`spio info` with exactly these SPIO_* variables set: its exit status and settings rows."""
    from spio import __main__ as cli

    for name in [n for n in os.environ if n.startswith("SPIO_")]:
        monkeypatch.delenv(name)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    status = cli.main(["info"])
    out = capsys.readouterr().out
    return status, [line for line in out.splitlines() if line.startswith("settings")]


def test_info_reports_the_settings_and_a_bad_one_among_its_rows(monkeypatch, capsys):
    """info is what users run to see what is wrong: a bad SPIO_* setting is one of its rows
    (exit 1, as for its other problems), not an error that hides the rest; the settings row
    lists every SPIO_* variable set, for bug reports."""
    status, rows = _info_settings(monkeypatch, capsys)
    assert status == 0 and "no SPIO_* variable set" in "".join(rows)
    status, rows = _info_settings(monkeypatch, capsys, SPIO_EMULATE="maybe", SPIO_LOGGER="0")
    assert status == 1
    assert rows == [
        "settings        SPIO_EMULATE=maybe, SPIO_LOGGER=0; BAD SETTING: SPIO_EMULATE must be "
        "1/true/yes/on or 0/false/no/off, got 'maybe'"
    ]


def test_info_names_a_spio_variable_spio_does_not_read(monkeypatch, capsys):
    """A misspelt setting (SPIO_EMULTE=1) had read as nothing set, with nothing said; info now
    names it, as a note (exit 0). The test suite's own SPIO_TEST_* are not named."""
    status, rows = _info_settings(
        monkeypatch, capsys, SPIO_EMULTE="1", SPIO_TEST_ORDER="ids.txt", SPIO_WORKERS="2"
    )
    assert status == 0
    assert rows == [
        "settings        SPIO_EMULTE=1, SPIO_TEST_ORDER=ids.txt, SPIO_WORKERS=2; not spio "
        "settings (a typo?): SPIO_EMULTE"
    ]


def test_the_readme_lists_every_setting_spio_reads():
    """spio.env.SETTINGS (what info knows) is the README's table of variables, and each is
    read somewhere in the package."""
    from spio.env import SETTINGS

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    assert tuple(re.findall(r"^\| `(SPIO_[A-Z0-9_]+)` \|", table, re.MULTILINE)) == SETTINGS
    source = "".join(p.read_text(encoding="utf-8") for p in (REPO / "spio").rglob("*.py"))
    source += (REPO / "spio" / "cuda" / "driver.pyx").read_text(encoding="utf-8")
    assert [name for name in SETTINGS if f'"{name}"' not in source] == []


def test_clear_cache_runs_whatever_the_settings_it_does_not_read(tmp_path, monkeypatch, capsys):
    """A bad SPIO_AUTOTUNE_TOPK must not stop the cache from being cleared (it reads only
    SPIO_CACHE_DIR)."""
    from spio import __main__ as cli

    (tmp_path / "cubin").mkdir()
    (tmp_path / "cubin" / f"{'a' * 64}.bin").write_bytes(b"x")
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "0")
    assert cli.main(["clear-cache"]) == 0
    assert not (tmp_path / "cubin").exists()


def test_a_settings_error_raised_by_a_command_is_a_one_line_error(monkeypatch, capsys):
    """A SPIO_* ValueError raised while a command runs (settings parsed later than main's check)
    is reported as one line, exit 2; any other ValueError still propagates."""
    from spio import __main__ as cli

    def bad_setting(args):
        raise ValueError("SPIO_SOMETHING must be a thing, got 'x'")

    def a_bug(args):
        raise ValueError("not a setting")

    monkeypatch.setitem(cli.COMMANDS, "info", (bad_setting, ""))
    assert cli.main(["info"]) == 2
    assert capsys.readouterr().err == "spio: error: SPIO_SOMETHING must be a thing, got 'x'\n"
    monkeypatch.setitem(cli.COMMANDS, "info", (a_bug, ""))
    with pytest.raises(ValueError, match="not a setting"):
        cli.main(["info"])


@pytest.mark.parametrize("command", ["info", "compile"])
def test_an_interrupted_command_says_so_in_one_line_and_exits_130(command, monkeypatch, capsys):
    """Ctrl-C during a command (a long compile, check or bench): one line naming the command,
    no traceback, exit 130 (128 + SIGINT, what a shell reports)."""
    from spio import __main__ as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, command, (interrupted, ""))
    assert cli.main([command]) == 130
    captured = capsys.readouterr()
    assert captured.err == f"\nspio {command}: interrupted\n" and captured.out == ""


def test_compile_help_names_every_arch_it_accepts():
    from spio import experimental_arch, supported_arch

    out = " ".join(run_spio("compile", "--help").stdout.split())
    assert all(arch in out for arch in supported_arch + experimental_arch), out


@pytest.fixture
def compiled_jobs(monkeypatch):
    """cmd_compile over two small layers, with compile_many recording its jobs (compiling none),
    so for every arch spio knows whichever NVRTC is found (12.4 stops at sm_90)."""
    import spio.compiler
    import spio.kernels.layer_sets
    from spio import experimental_arch, supported_arch
    from spio.cuda import nvrtc
    from spio.kernels.conv2d_gw8_params import Conv2dGw8Params

    monkeypatch.setattr(nvrtc, "supported_archs", lambda: supported_arch + experimental_arch)
    monkeypatch.setenv("SPIO_TMA", "off")

    layers = [
        Conv2dGw8Params(n=1, c=16, h=5, w=6, padding=1, r=3, s=3, has_bias=True),
        Conv2dGw8Params(n=2, c=8, h=4, w=3, padding=0, r=1, s=2, dtype="bf16"),
    ]
    monkeypatch.setattr(spio.kernels.layer_sets, "compile_layer_set", lambda: layers)
    jobs = []

    def record(batch, **kwargs):
        jobs.extend((job.name.removesuffix(".cu"), job.arch) for job in batch)
        return [RuntimeError("not compiled in this test") for _ in batch]

    monkeypatch.setattr(spio.compiler, "compile_many", record)
    return jobs


def test_compile_keeps_its_columns_with_a_wider_arch(compiled_jobs, capsys):
    """sm_100 and sm_120 are a character wider than sm_90: the columns after them stay put."""
    from spio.__main__ import main

    main(["compile", "--arch", "sm_90", "--arch", "sm_100", "--sample", "1"])
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("kernel"))
    rows = [line for line in lines if "FAILED" in line]
    assert len(rows) == len(compiled_jobs) >= 2
    assert {row.index("FAILED") for row in rows} == {header.index("regs")}


def test_compile_for_an_arch_nvrtc_lacks_is_one_error(
    compiled_jobs, monkeypatch, capsys, caplog, forget_toolchain
):
    """NVRTC 12.4 (torch 2.6's) stops at sm_90: `spio compile --arch sm_100` had made every
    kernel a FAILED line with NVRTC's "invalid value for --gpu-architecture"; now one line
    naming the NVRTC and the arch, exit 2, nothing compiled, and no warning first that sm_100
    is experimental (it is not compiled for); where NVRTC has it, the warning comes."""
    import spio.compiler
    from spio.__main__ import main
    from spio.compiler import arch
    from spio.cuda import nvrtc

    monkeypatch.setattr(arch, "_warned", set())
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: ("sm_50", "sm_80", "sm_86", "sm_90"))
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 4))
    with caplog.at_level("WARNING", logger="spio"):
        assert main(["compile", "--arch", "sm_90", "--arch", "sm_100", "--sample", "1"]) == 2
    err = capsys.readouterr().err
    assert "spio compile: nothing was compiled: NVRTC 12.4 cannot compile for sm_100 (it " in err
    assert "sm_50 to sm_90" in err and compiled_jobs == []
    assert not [r for r in caplog.records if "experimental" in r.getMessage()]

    monkeypatch.setattr(nvrtc, "supported_archs", lambda: ("sm_90", "sm_100"))
    monkeypatch.setattr(spio.compiler, "compile_many", spio.compiler.pool.compile_many)
    with caplog.at_level("WARNING", logger="spio"):
        main(["compile", "--arch", "sm_100", "--sample", "1"])
    assert [r for r in caplog.records if "sm_100 is experimental" in r.getMessage()]


def test_compile_refuses_a_seed_without_a_sample_and_an_empty_kernel_name(compiled_jobs, capsys):
    """`--seed 3` alone was ignored (every config compiled); `--kernel ''` matched every family."""
    from spio.__main__ import main

    assert main(["compile", "--seed", "3"]) == 2 and compiled_jobs == []
    assert capsys.readouterr().err == (
        "spio compile: --seed picks --sample's configs; give --sample too\n"
    )
    with pytest.raises(SystemExit) as exited:
        main(["compile", "--kernel", " "])
    assert exited.value.code == 2
    assert "argument --kernel: needs a non-empty text, got ' '" in capsys.readouterr().err


def test_compile_merges_a_repeated_arch(compiled_jobs, capsys):
    from spio.__main__ import main

    main(["compile", "--arch", "sm_90", "--arch", "sm_86", "--arch", "sm_90", "--sample", "2"])
    kernels = len(compiled_jobs) // 2
    assert [arch for _, arch in compiled_jobs] == ["sm_90", "sm_86"] * kernels
    out = capsys.readouterr().out
    assert "for 2 configs (" in out and out.splitlines()[0].endswith(" for sm_90, sm_86")
    assert f"{2 * kernels} compiles: " in out


def test_compile_builds_every_kernel_spio_runs_with_progress(compiled_jobs, capsys):
    """Every config's kernels as spio may run them: FProp and DGrad in each operand layout
    (contiguous or channels_last weights: `__wcl`; FProp's bias fp32 or the input's dtype:
    `__belem`), DGrad of the bias-free layer (a biased layer's DGrad is that kernel), WGrad as
    spio runs the config, and each layer's sum_slots kernels, into every gradient dtype pair,
    after its partials WGrad kernels.
    The sweep had built only the contiguous-weights FProp/DGrad kernels (a channels_last
    model's run the `__wcl` ones: 101 registers where the other had 103, so a spill there went
    unseen) and DGrad kernels of biased layers that never run. A bar counts the configs."""
    from spio.__main__ import main
    from spio.kernels.conv2d_gw8_wgrad_factory import sum_kernel
    from spio.kernels.families import FAMILIES
    from spio.kernels.layer_sets import compile_layer_set

    total = sum(len(f.configs(p)) for p in compile_layer_set() for f in FAMILIES.values())
    main(["compile", "--arch", "sm_90"])
    out, err = capsys.readouterr()
    assert "compiling kernels:" in err and f"| 0/{total} [" in err
    names = [name for name, _ in compiled_jobs]
    assert len(names) == len(set(names))
    wanted = set()
    for params in compile_layer_set():
        for family in FAMILIES.values():
            for config in family.configs(params):
                wanted.update(k.name for k in family.runnable_kernels(params, config))
        wanted.add(sum_kernel(params).name)
    assert set(names) == wanted
    assert any(name.endswith("__wcl") for name in names if "_fprop__" in name)
    assert any(name.endswith("__wcl") for name in names if "_dgrad__" in name)
    # (runnable_kernels is spio compile's own list: the variants named here are checked apart)
    biased_fprop = [n for n in names if "_fprop__" in n and "_bias1_" in n]
    plain_weights = [n for n in biased_fprop if not n.endswith("__wcl__belem")]
    assert biased_fprop and any(n.endswith("__belem") for n in plain_weights)
    assert any(n.endswith("__wcl__belem") for n in biased_fprop)
    assert not any("bias1" in name for name in names if "_dgrad__" in name)
    # The sums into a half model's gradients too, as the op runs them (only fp32's had been built).
    for params in compile_layer_set():
        assert sum_kernel(params, params.dtype, "fp32").name in names
        assert (
            sum_kernel(params, params.dtype, params.dtype if params.has_bias else "fp32").name
            in names
        )
    sums = sum(1 for name in names if name.startswith("sum_slots"))
    assert f"{len(names)} kernels, {sums} of them sum_slots (run after partials" in out


@pytest.mark.parametrize("setting", ["loads", "loads+stores"])
def test_compile_builds_for_sm_90_the_tensor_copy_kernels_spio_would_run(
    setting, compiled_jobs, capsys, monkeypatch
):
    """With SPIO_TMA set, each kernel is built for an arch as spio runs it there: on sm_90 with
    its rows moved by tensor copies (WGrad's in only; sum_slots moves no rows), on sm_80 not."""
    from spio.__main__ import main

    monkeypatch.setenv("SPIO_TMA", setting)
    main(["compile", "--arch", "sm_80", "--arch", "sm_90"])
    out = capsys.readouterr().out
    by_arch = {arch: [n for n, a in compiled_jobs if a == arch] for arch in ("sm_80", "sm_90")}
    assert len(by_arch["sm_80"]) == len(by_arch["sm_90"]) > 0
    assert not any("__tma" in name for name in by_arch["sm_80"])
    stores = "__tmaio" if setting == "loads+stores" else "__tma"
    for name in by_arch["sm_90"]:
        if name.startswith("sum_slots"):
            assert "__tma" not in name
        elif name.startswith("conv2d_gw8_wgrad"):
            assert name.endswith("__tma"), name
        else:  # every config of these small layers fits with tensor copies
            assert name.endswith(stores), name
        assert name in out  # its row in the table
    assert {n.replace("__tmaio", "").replace("__tma", "") for n in by_arch["sm_90"]} == set(
        by_arch["sm_80"]
    )


def test_compile_makes_compiles_and_reports_a_chunk_of_configs_at_a_time(
    compiled_jobs, monkeypatch, capsys
):
    """The whole layer set's kernels were made first and every compile's cubin and PTX held to
    the end (~15 GB over the full sweep): now COMPILE_CHUNK configs are made, compiled and
    reported before the next are made."""
    import spio.__main__
    import spio.compiler
    from spio.kernels.families import Family

    events = []
    real_make = Family.runnable_kernels
    monkeypatch.setattr(
        Family, "runnable_kernels", lambda *a: events.append("make") or real_make(*a)
    )
    record = spio.compiler.compile_many
    monkeypatch.setattr(
        spio.compiler, "compile_many", lambda batch, **k: events.append("compile") or record(batch)
    )
    monkeypatch.setattr(spio.__main__, "COMPILE_CHUNK", 2)
    spio.__main__.main(["compile", "--arch", "sm_90", "--sample", "5"])
    assert events == ["make", "make", "compile"] * 2 + ["make", "compile"]
    rows = [line for line in capsys.readouterr().out.splitlines() if "FAILED" in line]
    assert len(rows) == len(compiled_jobs)


@pytest.mark.parametrize("seed", [0, 7])
def test_compile_sample_generates_only_the_kernels_it_picks(compiled_jobs, monkeypatch, seed):
    """--sample N picks as it always has (N of all the kernels, sorted by name, by the seed)
    but makes only those N kernels, not every kernel of the layer set first."""
    import dataclasses
    import random

    from spio.__main__ import main
    from spio.kernels import families
    from spio.kernels.conv2d_gw8_wgrad_factory import with_sums
    from spio.kernels.layer_sets import compile_layer_set

    everything = {
        f"{name}__{params.encode()}__{config.encode()}": (family, params, config)
        for params in compile_layer_set()
        for name, family in families.FAMILIES.items()
        for config in family.configs(params)
    }
    chosen = random.Random(seed).sample(sorted(everything), 5)
    # Each pick's kernels as spio runs them, with the sum_slots kernel of a partials WGrad.
    runnable = [
        k for key in chosen for k in everything[key][0].runnable_kernels(*everything[key][1:])
    ]
    picked = sorted(k.name for k in with_sums(runnable))
    made = []

    def counted(make):
        def make_kernel(params, config):
            made.append(config)
            return make(params, config)

        return make_kernel

    for name, family in families.FAMILIES.items():
        counting = dataclasses.replace(family, make_kernel=counted(family.make_kernel))
        monkeypatch.setitem(families.FAMILIES, name, counting)
    main(["compile", "--arch", "sm_90", "--sample", "5", "--seed", str(seed)])
    assert [name for name, _ in compiled_jobs] == picked
    assert len(made) == 5


@pytest.mark.parametrize(
    "setting,row,said",
    [
        ("SPIO_CUDA_INCLUDE", "CUDA headers", "BAD SETTING, not found: SPIO_CUDA_INCLUDE="),
        ("SPIO_NVRTC", "NVRTC", "BAD SETTING, "),
        ("SPIO_PERF_MODELS", "perf models", "must name a folder of models"),
        ("SPIO_CACHE_DIR", "cache", "NOT A WRITABLE FOLDER"),
        ("SPIO_LIBCUDA", "settings", "must name the CUDA driver library, got '/nonexistent'"),
        ("SPIO_NVDISASM", "settings", "must name nvdisasm, got '/nonexistent', no program"),
    ],
)
def test_info_names_a_setting_that_points_at_something_unusable(setting, row, said, tmp_path):
    """A missing folder, or an empty file for a folder or libnvrtc: the row it concerns says so
    (and names the setting to change), and info exits 1; but 0 for a cache it cannot write,
    which spio runs without (a GPU check script stops at a failed info)."""
    value = tmp_path / "empty.so" if setting in ("SPIO_NVRTC", "SPIO_CACHE_DIR") else "/nonexistent"
    (tmp_path / "empty.so").write_bytes(b"")
    env = {"SPIO_CACHE_DIR": str(tmp_path / "cache"), setting: str(value)}
    out = run_spio("info", env=env)
    assert out.returncode == (0 if setting == "SPIO_CACHE_DIR" else 1), out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith(row)]
    assert len(rows) == 1 and said in rows[0] and setting in rows[0], out.stdout
    assert len([line for line in out.stdout.splitlines() if line.startswith("NVRTC")]) == 1


@pytest.mark.parametrize("setting", ["SPIO_NVRTC", "SPIO_CUDA_INCLUDE"])
def test_compile_without_its_toolchain_is_one_setup_error(setting, tmp_path):
    """An NVRTC that does not load, or headers not found, had made every kernel a FAILED line
    (about 39,000 x 4 of them for a whole sweep), exit 1: now one line, exit 2, nothing built."""
    (tmp_path / "empty.so").write_bytes(b"")
    value = tmp_path / ("empty.so" if setting == "SPIO_NVRTC" else "no-headers")
    env = {"SPIO_CACHE_DIR": str(tmp_path / "cache"), setting: str(value)}
    out = run_spio("compile", "--arch", "sm_90", "--sample", "2", env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("spio compile: setup error: nothing was compiled: ")
    assert setting in out.stderr and "FAILED" not in out.stdout + out.stderr
    assert not (tmp_path / "cache").exists()


def test_info_says_when_the_driver_cannot_load_what_nvrtc_builds():
    """A driver of CUDA 12 loads cubins of any CUDA 12 NVRTC (minor version compatibility) but
    not those of a CUDA 13 one: info then marks the install broken and says how to mend it."""
    from spio import __main__ as cli

    assert cli._driver_summary((12, 4), (12, 9)) == "CUDA 12.4"
    assert cli._driver_summary((13, 0), (12, 9)) == "CUDA 13.0"
    assert cli._driver_summary((12, 8), (None, None)) == "CUDA 12.8"  # NVRTC not found: own row
    broken = cli._driver_summary((12, 8), (13, 0))
    assert broken.startswith(f"CUDA 12.8 ({cli._BROKEN}: spio's NVRTC is of CUDA 13"), broken
    assert "set SPIO_NVRTC to an NVRTC of CUDA 12" in broken


def test_info_says_which_gpus_the_kernels_do_not_run_on():
    from spio import __main__ as cli

    gpus = [
        {"name": "NVIDIA H200", "arch": "sm_90", "sm_count": 132},
        {"name": "Tesla T4", "arch": "sm_75", "sm_count": 40},
    ]
    assert cli._gpu_summary(gpus, None) == (
        "cuda:0 NVIDIA H200 (sm_90, 132 SMs); cuda:1 Tesla T4 (sm_75, 40 SMs): not an arch "
        "spio's kernels run on (PyTorch's convolution runs instead)"
    )


def test_human_bytes_changes_unit_at_1024():
    from spio.__main__ import _human_bytes

    sizes = (0, 1023, 1024, 1536, 1024**2 - 1, 1024**2, 3 * 1024**3, 5 * 1024**4)
    assert [_human_bytes(n) for n in sizes] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "1024.0 KiB", "1.0 MiB", "3.0 GiB", "5120.0 GiB"
    ]  # fmt: skip


def test_info_says_why_the_cache_folder_is_not_writable(tmp_path, monkeypatch):
    """The row names the file that stands in the way, or the OS's reason without its errno
    clutter; what info made to find out is removed."""
    from spio import __main__ as cli

    advice = "set SPIO_CACHE_DIR to a writable folder, else every process builds its kernels again"
    (tmp_path / "file").write_bytes(b"")
    root = tmp_path / "file" / "a" / "b"
    assert cli._cache_problem(root) == (
        f"{root}: NOT A WRITABLE FOLDER ({tmp_path / 'file'} is a file); {advice}"
    )

    def refuse(dir, prefix):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(cli.tempfile, "NamedTemporaryFile", refuse)
    root = tmp_path / "new" / "cache"
    assert cli._cache_problem(root) == (
        f"{root}: NOT A WRITABLE FOLDER (creating it, or a file in it, fails: Permission denied); "
        f"{advice}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_info_says_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch, capsys):
    """A cache folder every user can write (no sticky bit) is not used (another user could put
    kernels there that spio would run): info's cache row says so, and why; exit 0, as for an
    unwritable one (kernels are then kept in memory)."""
    from spio import __main__ as cli

    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    monkeypatch.setenv("SPIO_CACHE_DIR", str(root))
    assert cli.cmd_info(None) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cache ")]
    assert f"{root}: NOT USED ({root} is writable by every user: another user" in row, row
    assert "chmod go-w" in row and "SPIO_CACHE_DIR" in row
    root.chmod(0o1777)  # as /tmp: used
    assert cli._cache_problem(root) is None


def test_info_leaves_a_cache_folder_another_process_filled_meanwhile(tmp_path, monkeypatch):
    """info removes the folders it made, but not one that another process's cache has written
    to since: it stops there, and the cache is fine."""
    import contextlib

    from spio import __main__ as cli

    root = tmp_path / "new" / "cache"

    def another_process_writes(dir, prefix):
        (root / "cubin").mkdir()
        return contextlib.nullcontext()

    monkeypatch.setattr(cli.tempfile, "NamedTemporaryFile", another_process_writes)
    assert cli._cache_problem(root) is None
    assert [p.name for p in root.iterdir()] == ["cubin"]


def test_info_says_how_to_mend_an_nvrtc_that_is_missing_or_does_not_load(monkeypatch):
    """Found but not loading: reinstall it, or, where SPIO_NVRTC chose it, choose another."""
    from spio import __main__ as cli

    error = OSError("invalid ELF header")
    monkeypatch.delenv("SPIO_NVRTC", raising=False)
    missing = cli._nvrtc_problem(None, FileNotFoundError("libnvrtc.so.12 not found"))
    assert missing == "BROKEN INSTALL, not found: libnvrtc.so.12 not found"
    assert cli._nvrtc_problem("/x/libnvrtc.so.12", error) == (
        "BROKEN INSTALL, /x/libnvrtc.so.12 was found but cannot be loaded (invalid ELF header); "
        "reinstall it (`pip install nvidia-cuda-nvrtc-cu12`), or set SPIO_NVRTC to another"
    )
    monkeypatch.setenv("SPIO_NVRTC", "/x/libnvrtc.so.12")
    assert cli._nvrtc_problem("/x/libnvrtc.so.12", error).endswith(
        "(invalid ELF header); set SPIO_NVRTC to a working libnvrtc.so.12 or .13, or unset it"
    )


def test_info_suggests_the_emulator_only_where_there_is_no_gpu(monkeypatch):
    """Not where the driver extension itself does not load: the install is broken."""
    from spio import __main__ as cli

    monkeypatch.delenv("SPIO_EMULATE", raising=False)

    hint = "SPIO_EMULATE=1 runs the real kernels on CPU tensors in the CPU emulator"
    assert cli._gpu_summary([], None) == f"no GPU; {hint}"
    assert cli._gpu_summary([], "no GPU (the driver reports 0 devices)") == (
        f"no GPU (the driver reports 0 devices); {hint}"
    )
    broken = "unknown: BROKEN INSTALL, the spio.cuda.driver extension does not load (x)"
    assert cli._gpu_summary([], broken) == broken
    # The driver's own message names the setting already: not said twice.
    said = "no GPU (No NVIDIA driver found: ... (its CPU emulator with SPIO_EMULATE=1).)"
    assert cli._gpu_summary([], said) == said


def test_info_says_cpu_tensors_run_the_emulator_where_spio_emulate_is_on(monkeypatch):
    """With SPIO_EMULATE=1, info had still said CPU tensors run the PyTorch reference and
    suggested setting what was set."""
    from spio import __main__ as cli

    monkeypatch.setenv("SPIO_EMULATE", "1")
    assert cli._gpu_summary([], "no GPU (x)") == (
        "no GPU (x); SPIO_EMULATE is on: spio ops on CPU tensors run the real kernels in the "
        "emulator"
    )


def test_info_names_a_spio_libcuda_that_is_no_driver_library(tmp_path):
    """A file that does not load, or a library without the driver's entry points, had read as
    "no GPU" with exit 0: only a path to no file was a bad setting."""
    from spio import __main__ as cli

    empty = tmp_path / "libcuda.so"
    empty.write_bytes(b"")
    assert cli._libcuda_problem(str(tmp_path / "none.so")) == "no file"
    assert cli._libcuda_problem(str(empty)).startswith("which does not load (")
    assert cli._libcuda_problem("libc.so.6") == "which has no entry point cuInit"
    # A bare name the loader does not find is a bad setting (it had passed as "no GPU"), but
    # the default's name, set explicitly on a machine without a GPU, must not fail info.
    assert cli._libcuda_problem("libnotthere.so.7") == "which the dynamic loader does not find"
    if not gpu_available():
        default = run_spio("info", env={"SPIO_LIBCUDA": "libcuda.so.1"})
        assert default.returncode == 0 and "SPIO_LIBCUDA must" not in default.stdout
    out = run_spio("info", env={"SPIO_LIBCUDA": str(empty), "SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 1, out.stdout + out.stderr
    (settings,) = [line for line in out.stdout.splitlines() if line.startswith("settings")]
    assert (
        f"BAD SETTING: SPIO_LIBCUDA must name the CUDA driver library, got '{empty}', which "
        "does not load" in settings
    )


def test_info_names_a_malformed_spio_logger_and_exits_1(tmp_path):
    """The other commands only warn of it (at import); info, the bug-report command, had listed
    SPIO_LOGGER=3 among the settings without a word, exit 0."""
    out = run_spio("info", env={"SPIO_LOGGER": "3", "SPIO_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BAD SETTING: SPIO_LOGGER must be 0 or empty (off), 1 (info) or 2 (debug), got '3'" in (
        out.stdout
    )
    listed = run_spio("clear-cache", env={"SPIO_LOGGER": "3", "SPIO_CACHE_DIR": str(tmp_path)})
    assert listed.returncode == 0 and "SPIO_LOGGER must be" in listed.stderr


def test_ctrl_c_while_the_program_exits_says_so_and_exits_130():
    """Ctrl-C in the second or so Python takes to exit after a command (torch's and the pool's
    atexit callbacks) had printed "Exception ignored ... KeyboardInterrupt" and exited with the
    command's own status, 0."""
    code = (
        "import atexit, os, signal, sys, time\n"
        "import spio.__main__ as cli\n"
        "def command(args):\n"
        "    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(5)))\n"
        "    return 0\n"
        "cli._run_command = command\n"
        "sys.argv = ['spio', 'info']\n"
        "cli.run()\n"
    )
    out = run_python(code, dict(os.environ))
    assert out.returncode == 130, out.stderr
    assert out.stderr == "\nspio info: interrupted\n"


def test_compile_kernel_picks_the_families_whose_name_contains_it(compiled_jobs, capsys):
    """A part of a family's name, as its help says; one that matches none is exit 2 listing
    them on stderr (it had gone to stdout, into a table redirected to a file), before any
    compile."""
    from spio.__main__ import main
    from spio.kernels.families import FAMILIES

    main(["compile", "--arch", "sm_90", "--kernel", "grad"])
    assert {name.split("__")[0] for name, _ in compiled_jobs} == {
        "conv2d_gw8_dgrad",
        "conv2d_gw8_wgrad",
        "sum_slots",  # after the partials WGrad kernels
    }
    compiled_jobs.clear()
    capsys.readouterr()
    assert main(["compile", "--kernel", "bprop"]) == 2
    out = capsys.readouterr()
    said = f"spio compile: no kernel family matches 'bprop'; families: {', '.join(FAMILIES)}\n"
    assert out.err == said and out.out == ""
    assert compiled_jobs == []
    # Repeated, the families of any (the last alone had been kept); each must match one.
    main(["compile", "--arch", "sm_90", "--kernel", "fprop", "--kernel", "wgrad"])
    assert {name.split("__")[0] for name, _ in compiled_jobs} == {
        "conv2d_gw8_fprop",
        "conv2d_gw8_wgrad",
        "sum_slots",
    }
    compiled_jobs.clear()
    capsys.readouterr()
    assert main(["compile", "--kernel", "fprop", "--kernel", "bprop"]) == 2
    assert capsys.readouterr().err.startswith("spio compile: no kernel family matches 'bprop';")
    assert compiled_jobs == []


def test_compile_says_when_its_sample_is_every_kernel(compiled_jobs, capsys, monkeypatch):
    """--sample N of at least the kernels there are compiles them all, and says so (a user who
    meant a sample was left waiting on a full compile)."""
    from spio.__main__ import main
    from spio.kernels import layer_sets

    one = layer_sets.compile_layer_set()[:1]
    monkeypatch.setattr(layer_sets, "compile_layer_set", lambda: one)
    main(["compile", "--arch", "sm_90", "--kernel", "wgrad", "--sample", "100000"])
    # (The layer's sum_slots kernel comes with its partials WGrad kernels, beside the sample.)
    total = len([name for name, _ in compiled_jobs if not name.startswith("sum_slots")])
    assert total < len(compiled_jobs)
    assert f"--sample 100000 is at least the {total} configs there are: all of them" in (
        capsys.readouterr().out
    )


@pytest.fixture
def compile_outcomes(compiled_jobs, monkeypatch):
    """cmd_compile's compiles answered from a list the test fills, in job order: an exception
    (a failed compile), None (compiled, but no entry function in the report), or a
    ResourceUsage for the kernel's entry, or a (ResourceUsage, NVRTC log) pair; and the
    kernels by name, to read the table with."""
    import spio.compiler
    from spio.compiler import CompileResult
    from spio.kernels import families
    from spio.kernels.layer_sets import compile_layer_set

    outcomes = []
    made_kernels = (
        kernel
        for params in compile_layer_set()
        for family in families.FAMILIES.values()
        for config in family.configs(params)
        for kernel in family.runnable_kernels(params, config)
    )
    kernels = {kernel.name: kernel for kernel in made_kernels}

    def compile_many(batch, **kwargs):
        results = []
        for job, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, Exception):
                results.append(outcome)
                continue
            entry = kernels[job.name.removesuffix(".cu")].entry
            usage, log = outcome if isinstance(outcome, tuple) else (outcome, "")
            resources = {} if usage is None else {entry: usage}
            results.append(CompileResult(cubin=b"", arch=job.arch, resources=resources, log=log))
        return results

    monkeypatch.setattr(spio.compiler, "compile_many", compile_many)
    return outcomes, kernels


def test_compile_table_shows_each_compiles_resources_and_exits_1_on_a_failure_or_spill(
    compile_outcomes, capsys
):
    from spio.__main__ import main
    from spio.compiler.compile import ResourceUsage

    outcomes, kernels = compile_outcomes
    # One DGrad config: its kernel reading contiguous weights, then channels_last ones.
    argv = ["compile", "--arch", "sm_90", "--arch", "sm_80", "--kernel", "dgrad", "--sample", "1"]
    clean = ResourceUsage(registers=40, shared_bytes=16)
    spilling = ResourceUsage(registers=255, spill_stores=8, spill_loads=4, shared_bytes=16)
    outcomes[:] = [RuntimeError("ptxas says no"), None, spilling, clean]
    assert main(argv) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "4 compiles: 2 failed, 1 spilled, 0 with warnings"
    table = [line.split() for line in lines[2:-1]]
    first, second = table[0][0], table[2][0]
    assert table[0] == [first, "sm_90", "FAILED:", "ptxas", "says", "no"]
    assert table[1] == [first, "sm_80", "FAILED:", "no", "entry", kernels[first].entry]
    smem = [str(16 + kernels[second].shared_mem_bytes)]
    assert table[2] == [second, "sm_90", "255", "12", *smem, "SPILLS"]
    assert table[3] == [second, "sm_80", "40", "0", *smem]
    assert kernels[second].shared_mem_bytes > 0  # so the column adds the kernel's own
    for one_bad, summary in [
        (RuntimeError("ptxas says no"), "1 failed, 0 spilled, 0 with warnings"),
        (None, "1 failed, 0 spilled, 0 with warnings"),
        (spilling, "0 failed, 1 spilled, 0 with warnings"),
        (clean, "0 failed, 0 spilled, 0 with warnings"),
    ]:
        outcomes[:] = [clean, clean, one_bad, clean]
        assert main(argv) == (0 if one_bad is clean else 1)
        assert capsys.readouterr().out.endswith(f"4 compiles: {summary}\n")


def test_compile_lists_a_kernels_compiler_warnings_under_it_without_failing(
    compile_outcomes, capsys
):
    """A warning in NVRTC's log (front end or ptxas) flags the kernel's row, is printed under
    it and counted; the exit status stays that of failures and spills (another NVRTC version
    may warn where the tests' does not)."""
    from spio.__main__ import main
    from spio.compiler.compile import ResourceUsage

    outcomes, _ = compile_outcomes
    front = 'k.cu(81): warning #177-D: variable "x" was declared but never referenced'
    ptxas = "ptxas warning : Value of threads per SM for entry k is out of range"
    log = f"{front}\nptxas info    : Used 40 registers\n{ptxas}\n"
    outcomes[:] = [ResourceUsage(registers=40), (ResourceUsage(registers=40), log)]
    assert main(["compile", "--arch", "sm_90", "--kernel", "dgrad", "--sample", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not lines[2].endswith("WARNINGS")
    assert lines[3].split()[-1] == "WARNINGS"
    assert lines[4:6] == [f"    {front}", f"    {ptxas}"]
    assert lines[-1] == "2 compiles: 0 failed, 0 spilled, 1 with warnings"


def test_info_gives_the_driver_row_only_with_a_gpu(tmp_path, monkeypatch, capsys):
    """With a GPU (faked), the CUDA version its driver supports, broken where the NVRTC is of a
    later major version, or why it is unknown (not a failure); without a GPU, no driver row."""
    from spio import __main__ as cli
    from spio.cuda import driver, nvrtc, paths

    def driver_rows(expected_status):
        assert cli.cmd_info(None) == expected_status
        rows = capsys.readouterr().out.splitlines()
        return [row.split(None, 1)[1] for row in rows if row.startswith("driver ")]

    def unknown():
        raise RuntimeError("cuDriverGetVersion failed")

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    # (Headers of a version unknown: the faked NVRTC versions would not match this machine's.)
    monkeypatch.setattr(paths, "cuda_headers_version", lambda folder: None)
    h200 = {"name": "NVIDIA H200", "arch": "sm_90", "sm_count": 132}
    monkeypatch.setattr(cli, "_gpus", lambda: ([h200], None))
    monkeypatch.setattr(driver, "driver_version", lambda: (12, 8))
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 9))
    assert driver_rows(0) == ["CUDA 12.8"]
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    (row,) = driver_rows(1)
    assert row.startswith("CUDA 12.8 (BROKEN INSTALL: spio's NVRTC is of CUDA 13"), row
    monkeypatch.setattr(driver, "driver_version", unknown)
    assert driver_rows(0) == ["version unknown (cuDriverGetVersion failed)"]
    monkeypatch.setattr(cli, "_gpus", lambda: ([], "no GPU (faked)"))
    assert driver_rows(0) == []


@pytest.mark.parametrize(
    "fields",
    [
        {"batch_sizes": None, "measured_on": None},  # as the loader reads a model without them
        {"batch_sizes": 64, "measured_on": "NVIDIA H200"},
        {"batch_sizes": [64, "x", [1]], "measured_on": [["H200"], 3], "family": ["fprop"]},
    ],
    ids=["null", "not lists", "odd items"],
)
def test_info_reports_perf_model_metadata_of_other_types_without_crashing(
    tmp_path, monkeypatch, fields
):
    """A model JSON with null (or other non-list) batch_sizes or measured_on: `info` had raised
    TypeError iterating them (PerfModel.load takes a null batch_sizes as "not recorded")."""
    from spio import __main__ as cli
    from spio.kernels import perf_model

    (tmp_path / "sm_90").mkdir()
    shipped = perf_model.PACKAGED_MODELS_DIR / "sm_90" / "conv2d_gw8_fprop.json"
    meta = json.loads(shipped.read_text(encoding="utf-8")) | fields  # a model of its place
    del meta["model_sha256"]
    (tmp_path / "sm_90" / "conv2d_gw8_fprop.json").write_text(json.dumps(meta))
    (tmp_path / "sm_90" / "conv2d_gw8_fprop.ubj").write_bytes(b"model")  # no digest to match
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))
    rows = cli._perf_model_rows(["sm_90"])
    if "family" in fields:  # a family of another type: not a model spio would use, named
        assert rows[0] == ("perf models", f"none in {tmp_path}"), rows
        assert "is for family ['fprop']" in rows[1][1], rows
        return
    ((key, row),) = rows
    assert key == "perf models" and row.startswith("sm_90: "), row
    assert "(measured on " in row and "; N " in row, row


@pytest.mark.parametrize(
    "script",
    [
        # `spio info | head -1`: the output waits in stdout's buffer until the command ends
        "from spio.__main__ import main; sys.exit(main(['info']))",
        # `spio compile | head -1`: more output than the buffer holds, written while it runs
        "from spio import __main__ as cli; "
        "cli.COMMANDS['info'] = (lambda args: print('row\\n' * 50_000) or 0, ''); "
        "sys.exit(cli.main(['info']))",
    ],
)
def test_output_to_a_reader_that_went_away_ends_quietly_with_141(script):
    """A reader that closes the pipe early (`| head`) had the command end in a BrokenPipeError
    traceback (or, at exit, "Exception ignored ... BrokenPipeError" and status 120): now it
    ends quietly with 141, as a shell reports a command ended by SIGPIPE."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        proc = subprocess.run(
            [sys.executable, "-c", f"import sys; {script}"],
            stdout=write,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            cwd=REPO,
            timeout=120,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_version_prints_spios_version():
    import spio

    out = run_spio("--version")
    assert out.returncode == 0 and out.stdout == f"spio {spio.__version__}\n", out


def test_settings_are_checked_without_importing_torch():
    """`spio compile` needs no torch, yet checking the settings before it imported torch (two to
    three seconds) for SPIO_TMA's parser alone."""
    code = (
        "import sys; from spio.__main__ import _setting_problems; "
        "print(_setting_problems()); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, encoding="utf-8", timeout=120,
        cwd=REPO, env={**os.environ, "SPIO_TMA": "stores"},
    )  # fmt: skip
    problems, torch_imported = out.stdout.splitlines()
    assert "SPIO_TMA" in problems and "'stores'" in problems, out.stdout + out.stderr
    assert torch_imported == "False"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_to_a_full_disk_is_one_line(tmp_path):
    """`spio info > /dev/full` had ended in an OSError's traceback."""
    with open("/dev/full", "w") as full:
        out = subprocess.run(
            [sys.executable, "-m", "spio", "info"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SPIO_CACHE_DIR": str(tmp_path)},
            cwd=REPO,
            timeout=120,
        )
    assert out.returncode == 1
    assert out.stderr == "spio info: cannot write its output: [Errno 28] No space left on device\n"


def test_another_files_error_is_not_taken_for_the_output_s(monkeypatch, capsys):
    """The full-disk catch had written a line end to stdout before any OSError's traceback, and
    named an error of another file as the output's where stdout failed too."""
    import argparse

    from spio import __main__ as cli

    def fails(args):
        print("partial output")
        raise PermissionError(13, "Permission denied", "/some/other/file")

    monkeypatch.setitem(cli.COMMANDS, "info", (fails, "info"))
    with pytest.raises(PermissionError):
        cli._run_command(argparse.Namespace(command="info"))
    assert capsys.readouterr().out == "partial output\n"
