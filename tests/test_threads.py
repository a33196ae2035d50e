"""spio's in-memory state under threads: torch.nn.DataParallel runs one thread per GPU, all
calling the same layers at once on first use; inference servers call a model from many threads;
autograd runs each device's backward on a thread of its own."""

import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import torch

from spio.compiler import CompileJob, pool
from spio.compiler.cache import DiskCache
from spio.kernels import autotune
from spio.kernels import perf_model as pm
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.locks import KeyedLocks

GPU = torch.device("cuda", 0)  # a name only: the timers here launch nothing
H200 = pm.DeviceIdentity(arch="sm_90", name="NVIDIA H200", driver="13.0")


def _at_once(work, items) -> None:
    """work(item) for each item, each in a thread of its own, all released together; re-raises
    the first error a thread raised."""
    start = threading.Barrier(len(items))
    errors = []

    def run(item):
        start.wait()
        try:
            work(item)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class _Overlap:
    """`with overlap: ...` in several threads: `peaks` records, at each entry, how many threads
    were inside then (its length is the number of entries)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self.peaks: list[int] = []

    def __enter__(self) -> None:
        with self._lock:
            self._inside += 1
            self.peaks.append(self._inside)

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._inside -= 1


_SAME_LIBRARY_TWICE = textwrap.dedent(
    """\
    import threading

    import torch

    from spio import emulator

    SOURCE = '''
    extern "C" __global__ void add_one(float *out, const float *in, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = in[i] + 1.0f;
    }
    '''
    modules = [emulator.load_module(SOURCE, name="add_one") for _ in range(2)]
    assert modules[0].library().path == modules[1].library().path
    functions = [m.get_function("add_one") for m in modules]
    n = 64 * 256
    start = threading.Barrier(4)
    wrong = []

    def run(k):
        x = torch.full((n,), float(k))
        start.wait()
        for _ in range(20):
            out = torch.zeros(n)
            functions[k % 2].launch((n // 256,), (256,), [out, x, n])
            if not torch.equal(out, x + 1):
                wrong.append(k)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("wrong", wrong)
    """
)


def test_two_modules_of_one_emulator_library_launch_from_threads(tmp_path):
    """Two EmuModules built from one source load one library file, and dlopen gives both the same
    library, whose runtime keeps a launch's state in globals: their launches from several threads
    take turns (they crashed the process when each module had a lock of its own). In a process of
    its own, as the failure is a crash."""
    env = dict(os.environ, SPIO_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", _SAME_LIBRARY_TWICE],
        env=env,
        capture_output=True,
        encoding="utf-8",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrong []" in proc.stdout


def test_autotune_times_one_layer_at_a_time(tmp_path):
    """Two threads tuning two layers at once (two models served from threads, or DataParallel's
    threads on GPUs of two kinds) would each time its candidates while the other's launch:
    timing brackets a call with events on the device's current stream, which the threads share,
    so each time would count the other's kernels too, and the winner stays on disk for good.
    The default timer also keeps one layer's inputs for its candidates, which the other thread
    would replace. The threads time in turn (the timer records how many time at once)."""
    family = pm.FAMILIES["conv2d_gw8_fprop"]
    cache = DiskCache("autotune", root=tmp_path)
    timing = _Overlap()

    def timer(name, params, kernel, device):
        with timing:
            time.sleep(0.02)
        return 1e-3

    def tune(params):
        candidates = family.configs(params)[:4]
        autotune.autotune(family, params, GPU, H200, candidates, timer=timer, cache=cache)

    _at_once(tune, [Conv2dGw8Params(2, 16, 8, 8), Conv2dGw8Params(4, 16, 8, 8)])
    assert len(timing.peaks) == 8 and max(timing.peaks) == 1


class Scripted:
    """A class of the user's script: pickled by reference, as __main__.Scripted."""


Scripted.__module__ = "__main__"


def test_the_scripts_objects_pickle_while_the_compile_pool_starts(monkeypatch, tmp_path):
    """The pool starts its workers with a stand-in __main__, so that spawn does not re-run the
    user's script in each of them. Meanwhile other threads (a data loader starting its workers,
    a checkpoint being saved) pickle the script's objects by reference to __main__: the stand-in
    must have the script's names (it had none, and pickling failed for a second)."""
    monkeypatch.setattr(sys.modules["__main__"], "Scripted", Scripted, raising=False)
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    pool.shutdown_pool()  # compile_many starts a pool
    failures = []
    done = threading.Event()

    def pickling():
        while not done.is_set():
            try:
                pickle.dumps(Scripted())
            except pickle.PicklingError as error:
                failures.append(error)
                return

    thread = threading.Thread(target=pickling)
    thread.start()
    try:
        jobs = [CompileJob("not C++", "sm_80", name=f"bad{i}.cu") for i in range(2)]
        results = pool.compile_many(jobs, workers=2, progress=False)
    finally:
        done.set()
        thread.join()
    assert all(isinstance(result, Exception) for result in results)
    assert failures == []


def test_threads_build_an_entry_once_where_the_cache_cannot_be_written(tmp_path, caplog):
    """Where the cache folder cannot be written (a read-only image), the file lock that makes one
    process build an entry once cannot be taken; threads asking at once for an entry (autotune of
    one layer from DataParallel's threads: compiling and timing its candidates) built it once
    each. One builds, the others wait for it."""
    (tmp_path / "file").write_text("a file where the cache folder should be")
    cache = DiskCache("autotune", root=tmp_path / "file")
    built = []

    def build():
        built.append(1)
        time.sleep(0.1)
        return b"entry", {}

    answers = []
    with caplog.at_level("WARNING", logger="spio"):
        _at_once(lambda _: answers.append(cache.get_or_build("key", build)), range(4))
    assert len(built) == 1
    assert (
        sorted(answers, key=lambda a: a[2]) == [(b"entry", {}, False)] + [(b"entry", {}, True)] * 3
    )
    assert caplog.text.count("cannot write its cache folder") == 1


def test_threads_build_different_kernels_at_once_and_each_kernel_once(monkeypatch):
    """A kernel's first load is locked per kernel: threads needing different kernels build them
    at once (one lock for every kernel had made them take turns, e.g. two models served from
    threads, each waiting for the other's compiles), and threads needing the same kernel build
    it once."""
    from types import SimpleNamespace

    from spio import emulator
    from spio.kernels import kernel as K

    monkeypatch.setattr(K, "_emulated", {})
    monkeypatch.setattr(K, "_first_load", KeyedLocks())
    building, built = _Overlap(), []

    class Built:
        def library(self):
            return SimpleNamespace(cached=True, seconds=0.0)

        def get_function(self, entry):
            return entry

    def slow_load(source, headers, name):
        built.append(name)
        with building:
            time.sleep(0.3)
        return Built()

    monkeypatch.setattr(emulator, "load_module", slow_load)

    def kernel(name):
        return K.Kernel(name=name, source_file="conv2d_gw8.cu", entry=name, headers=(),
                        grid=(1, 1, 1), block=(32, 1, 1), shared_mem_bytes=0)  # fmt: skip

    got = []
    _at_once(lambda k: got.append(K._emulator_function(k)), [kernel(n) for n in "abab"])
    assert sorted(got) == ["a", "a", "b", "b"]
    assert sorted(built) == ["a", "b"]  # each kernel once
    assert max(building.peaks) == 2  # both at once


def test_keyed_locks_give_one_lock_per_key_to_every_thread():
    locks = KeyedLocks()
    got: dict[int, set[int]] = {0: set(), 1: set()}
    start = threading.Barrier(8)

    def take(i):
        start.wait()
        got[i % 2].add(id(locks[i % 2]))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got[0]) == len(got[1]) == 1
    assert got[0] != got[1]


def test_keyed_locks_threads_racing_for_a_new_key_get_the_same_lock():
    """Both threads look the key up and find no lock before either makes one: they must still
    get the same lock."""
    looked = threading.Barrier(2)

    class Racing(dict):
        def get(self, key, default=None):
            value = super().get(key, default)
            looked.wait(timeout=10)
            return value

    locks = KeyedLocks()
    locks._locks = Racing()
    got = []
    threads = [threading.Thread(target=lambda: got.append(locks["k"])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] is got[1]


def _run_script(source: str, timeout: float = 60) -> str:
    """`source` run by a fresh interpreter in the repository (where it can fork freely); its
    stdout, after checking that it exited 0."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        encoding="utf-8",
        timeout=timeout,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_child_forked_while_a_thread_holds_a_keyed_lock_can_take_it():
    """A thread of the parent building a kernel holds its key's lock; a child forked meanwhile
    had found it held for ever (no thread of the child would release it)."""
    out = _run_script(
        """
        import os, threading, time
        from spio.locks import KeyedLocks
        locks = KeyedLocks()
        held, done = threading.Event(), threading.Event()
        def build():
            with locks["kernel"]:
                held.set()
                done.wait()
        threading.Thread(target=build).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if locks["kernel"].acquire(timeout=5) else 1)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        done.set()
        print("child took the lock" if code == 0 else "child waited in vain")
        """
    )
    assert out.strip() == "child took the lock"


def test_a_fork_during_an_emulated_launch_waits_for_it():
    """The emulator's launch lock, held by another thread's launch, had been held for ever in a
    child forked meanwhile (7 of 10 children hung in the audit's repro)."""
    out = _run_script(
        """
        import os, threading, time
        from spio.emulator import module
        held = threading.Event()
        def launch():  # a launch in progress: the lock held for a while
            with module._launch_lock:
                held.set()
                time.sleep(0.5)
        thread = threading.Thread(target=launch)
        thread.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if module._launch_lock.acquire(timeout=5) else 1)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        thread.join()
        print("child launched" if code == 0 else "child hung")
        """
    )
    assert out.strip() == "child launched"


def test_a_forked_childs_exit_leaves_the_parents_build_folder():
    """tempfile.TemporaryDirectory's finalizer ran at a forked child's exit and removed the
    folder its parent's compiler was writing into (the build then failed with "can't create
    ... .o")."""
    out = _run_script(
        """
        import os, sys
        from pathlib import Path
        from spio.emulator import build
        with build._build_folder() as folder:
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            os.waitpid(pid, 0)
            print("kept" if Path(folder).is_dir() else "removed")
        print("removed after" if not Path(folder).exists() else "left after")
        """
    )
    assert out.split() == ["kept", "removed", "after"]


def test_a_fork_by_the_launching_thread_itself_does_not_wait_for_itself():
    """A signal handler runs in the launching thread between its launch's statements, with the
    launch lock held; one that forks had waited for ever on the fork hook's acquire of it."""
    out = _run_script(
        """
        import os
        from spio.emulator import module
        with module._launch_lock:  # as a launch holds it
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        print("forked")
        """,
        timeout=20,
    )
    assert out.strip() == "forked"
