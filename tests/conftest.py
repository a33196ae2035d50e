"""Shared test setup: the `cuda` marker skips cleanly on machines without a GPU, emulated
kernels run their blocks and threads in a shuffled order (a GPU promises none), and
`pytest -n auto` (pytest-xdist) shares the cores among its workers."""

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: The repository root, for tests that run its scripts or fresh interpreters in it.
REPO = Path(__file__).resolve().parent.parent


def load_script(name: str):
    """scripts/<name>.py (not a package) loaded afresh as the module spio_scripts_<name>,
    registered in sys.modules (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(
        f"spio_scripts_{name}", REPO / "scripts" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_spio(*args: str, env: dict | None = None, timeout: float = 120):
    """`python -m spio ARGS` in a fresh interpreter, in the repository, with `env` added to
    this process's environment; its output decoded as UTF-8."""
    return subprocess.run(
        [sys.executable, "-m", "spio", *args],
        capture_output=True,
        encoding="utf-8",
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


# Emulated launches in shuffled block and thread order (spio.kernels.kernel reads it at each
# launch); a run may set its own seed, and a test may set another for itself.
os.environ.setdefault("SPIO_EMULATOR_ORDER_SEED", "1")

#: Settings that choose which kernels, configs or paths spio runs: the tests set each where they
#: test it, and assume spio's defaults elsewhere, so a value from the shell that runs pytest
#: (say SPIO_TMA=loads, kept from a GPU session) is left out of the run (pytest's header names
#: it) rather than failing tests that assume the default.
CHOICE_SETTINGS = ("SPIO_TMA", "SPIO_AUTOTUNE", "SPIO_AUTOTUNE_TOPK", "SPIO_PERF_MODELS",
                   "SPIO_EMULATE")  # fmt: skip
LEFT_OUT = {name: os.environ.pop(name) for name in CHOICE_SETTINGS if name in os.environ}


def without_tensor_copies(name: str) -> str:
    """A kernel's name less the suffix of a tensor-copy build (`__tma`, `__tmaio`, and any after
    it), so that a check of its other suffixes holds whatever SPIO_TMA's default."""
    return name.split("__tma")[0]


def pytest_report_header(config):
    if LEFT_OUT:
        settings = ", ".join(f"{name}={value!r}" for name, value in LEFT_OUT.items())
        return f"spio settings left out of the tests (they assume the defaults): {settings}"
    return None


#: The most workers `pytest -n auto` (pytest-xdist) starts: each imports torch and builds and
#: runs emulated kernels, so one per core of a many-core machine would ask for more memory than
#: the time it saves is worth.
MAX_TEST_WORKERS = 8


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, at most MAX_TEST_WORKERS."""
    from spio.compiler.pool import usable_cores

    return min(usable_cores(), MAX_TEST_WORKERS)


def pytest_configure(config):
    """In a pytest-xdist worker, torch's CPU ops get the worker's share of the cores: with every
    worker's thread pool sized for all of them, gradgradcheck took 3.5x as long (two workers on
    two cores)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return
    try:
        import torch
    except ImportError:
        return
    from spio.compiler.pool import usable_cores

    torch.set_num_threads(max(1, usable_cores() // int(workers)))


@functools.cache
def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Marks `cuda` tests skipped where there is no GPU. With SPIO_TEST_ORDER=FILE (a test id a
    line; scripts/gpu_check.sh's tests step), the tests run in the file's order, ids not in it
    after them: pytest reorders tests to share the set-up of higher-scoped parametrized
    fixtures (before this hook, which runs last), and in H200 run 7 it moved
    tests/emulator/test_primitives.py's 41 `gpu` cases (a session fixture's parameter) ahead of
    the step's round-robin order, so that its 120 s sampled 78 tests, not one of each function
    (docs/perf/2026-12-04-h200.md)."""
    path = os.environ.get("SPIO_TEST_ORDER")
    if path:
        with open(path, encoding="utf-8") as lines:
            rank = {line.strip(): i for i, line in enumerate(lines) if line.strip()}
        items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is available on this machine")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def spy_on_launches(monkeypatch, names: bool = False) -> list[str]:
    """From now on (until monkeypatch undoes it), record the family of every kernel spio
    launches (e.g. "conv2d_gw8_fprop"; with `names`, the kernel's whole name), in order, in the
    list returned; launches still run."""
    from spio.kernels.kernel import Kernel

    launched: list[str] = []
    launch = Kernel.launch

    def spy(self, args, device):
        launched.append(self.name if names else self.name.split("__")[0])
        return launch(self, args, device)

    monkeypatch.setattr(Kernel, "launch", spy)
    return launched


#: The toolchain memos (module, function): what a process found once (NVRTC's identity, the CUDA
#: headers' folder and identity), computed at first use and kept. A test that fakes NVRTC's
#: version or library, or the headers' folder, and then compiles or keys a compile, fills them
#: with what it faked unless it forgets them after (`forget_toolchain`); every later test of the
#: process then keys its compiles apart from the compile pool's workers (spawned, so computing
#: their own), and a cubin a worker cached was not found by its parent (two tests of
#: tests/compiler/test_pool.py failed so, after tests/test_main.py's faked NVRTC 12.4 in the
#: same pytest worker).
TOOLCHAIN_MEMOS = (
    ("spio.compiler.compile", "_nvrtc_identity"),
    ("spio.compiler.compile", "_cuda_include_dir"),
    ("spio.compiler.compile", "_cuda_headers_identity"),
    ("spio.emulator.build", "_cuda_include"),
    ("spio.emulator.build", "_cuda_identity"),
)


def _toolchain_memos() -> list:
    """The memo functions of TOOLCHAIN_MEMOS whose modules are imported (none is imported for
    a test that did not), but one a test has replaced meanwhile (its monkeypatch is undone
    after `forget_toolchain` runs)."""
    memos = [getattr(sys.modules[m], name) for m, name in TOOLCHAIN_MEMOS if m in sys.modules]
    return [memo for memo in memos if hasattr(memo, "cache_clear")]


def forget_toolchain_memos() -> None:
    for memo in _toolchain_memos():
        memo.cache_clear()


@pytest.fixture
def forget_toolchain():
    """The toolchain memos (TOOLCHAIN_MEMOS) forgotten after the test: for a test that fakes
    NVRTC or the CUDA headers, so that it leaves none of its fakes to later tests (every test
    starts without them: _toolchain_memos_left_true)."""
    yield
    forget_toolchain_memos()


@functools.cache
def _true_toolchain_value(memo):
    """A memo's value computed afresh (its wrapped function), once a process; None where it
    cannot be computed here (no NVRTC, no headers)."""
    try:
        return memo.__wrapped__()
    except Exception:
        return None


@pytest.fixture(autouse=True)
def _toolchain_memos_left_true():
    """Each test computes the toolchain memos afresh (~6 ms where it compiles), and after it
    they hold what this machine has: one that holds a test's fake is forgotten, and the test
    fails naming it (it should ask for `forget_toolchain`). Forgotten before every test, so
    that a test that fakes them fails whichever tests ran before it in its process."""
    forget_toolchain_memos()
    yield
    faked = []
    for memo in _toolchain_memos():
        if memo.cache_info().currsize and memo() != _true_toolchain_value(memo):
            faked.append(f"{memo.__module__}.{memo.__name__}")
            memo.cache_clear()
    assert not faked, (
        f"this test left {', '.join(faked)} holding a faked toolchain: later tests would key "
        "their compiles apart from the compile pool's workers; ask for `forget_toolchain`"
    )
