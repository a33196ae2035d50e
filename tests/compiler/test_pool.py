"""The compile pool runs jobs in worker processes and returns results and errors in order."""

import math
import os
import signal
import time
import uuid

import pytest

from spio.compiler import CompileError, CompileJob, CompileResult, compile_many
from spio.compiler.pool import default_workers
from tests.conftest import REPO, run_spio

GOOD = 'extern "C" __global__ void k(int *x) {{ x[threadIdx.x] = {value}; }}'
BAD = 'extern "C" __global__ void k(int *x) { x[0] = nope; }'


def fresh_jobs(count: int) -> list[CompileJob]:
    """`count` sm_80 jobs of sources no earlier run compiled (a new tag in each)."""
    tag = uuid.uuid4().hex
    return [CompileJob(f"// {tag}\n" + GOOD.format(value=i), "sm_80") for i in range(count)]


def test_compile_many_keeps_order_and_returns_errors(cache_dir):
    tag = uuid.uuid4().hex
    jobs = [
        CompileJob(f"// {tag}\n" + GOOD.format(value=1), "sm_80"),
        CompileJob(BAD, "sm_80", name="bad.cu"),
        CompileJob(f"// {tag}\n" + GOOD.format(value=2), "sm_90"),
    ]
    results = compile_many(jobs, workers=2, progress=False)
    assert results[0].arch == "sm_80" and "k" in results[0].resources
    assert isinstance(results[1], CompileError) and "nope" in results[1].log
    assert results[1].arch == "sm_80" and "bad.cu for sm_80" in str(results[1])  # pickled back
    assert results[2].arch == "sm_90"
    # The workers filled the shared disk cache: the parent now gets hits.
    again = jobs[2].run()
    assert again.cached and again.cubin == results[2].cubin


def test_workers_follow_the_parents_cache_folder(cache_dir, tmp_path, monkeypatch):
    """The pool outlives a change of SPIO_CACHE_DIR in the parent (its workers were started with
    the old one): jobs still land in the parent's current folder, where the parent finds them."""
    job = CompileJob(f"// {uuid.uuid4().hex}\n" + GOOD.format(value=3), "sm_80")
    compile_many([job, job], workers=2, progress=False)  # the pool starts with cache_dir
    assert job.run().cached
    other = tmp_path / "other"
    monkeypatch.setenv("SPIO_CACHE_DIR", str(other))
    fresh = CompileJob(f"// {uuid.uuid4().hex}\n" + GOOD.format(value=4), "sm_80")
    compile_many([fresh, fresh], workers=2, progress=False)  # the same pool
    assert fresh.run().cached
    assert any((other / "cubin").iterdir())


@pytest.mark.parametrize("value", ["0", "-3", "many", "4_0", "+4", "4.0"])
def test_bad_worker_count_is_rejected(value, monkeypatch):
    monkeypatch.setenv("SPIO_WORKERS", value)
    with pytest.raises(ValueError, match="SPIO_WORKERS"):
        default_workers()


def test_worker_count_from_environment(monkeypatch):
    monkeypatch.setenv("SPIO_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("SPIO_WORKERS", " 3 ")
    assert default_workers() == 3


def test_a_blank_worker_count_is_unset(monkeypatch):
    """As for the other settings: "" and " " mean the default (" " had been a ValueError)."""
    monkeypatch.delenv("SPIO_WORKERS", raising=False)
    default = default_workers()
    for blank in ("", "  "):
        monkeypatch.setenv("SPIO_WORKERS", blank)
        assert default_workers() == default


def test_an_experimental_arch_is_warned_of_once_not_by_every_worker(tmp_path):
    """`spio compile --arch sm_100` with two workers: one warning (each worker process had
    warned again, inside the progress bar). Where NVRTC compiles for sm_100 (CUDA 12.8 on)."""
    from spio.cuda import nvrtc

    if "sm_100" not in nvrtc.supported_archs():
        pytest.skip(f"NVRTC {nvrtc.version()} does not compile for sm_100")
    env = {"SPIO_WORKERS": "2", "SPIO_CACHE_DIR": str(tmp_path)}
    out = run_spio("compile", "--arch", "sm_100", "--sample", "3", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.count("sm_100 is experimental") == 1, out.stderr


def _run_script(tmp_path, text: str):
    """`text` written to a script and run by this Python (its output decoded, 2 min at most)."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, encoding="utf-8", timeout=120
    )


_UNGUARDED_SCRIPT = """\
import uuid
from spio.compiler import CompileJob, compile_many

print("script body ran", flush=True)
source = 'extern "C" __global__ void k(int *x) {{ x[threadIdx.x] = 5; }}'
jobs = [CompileJob(f"// {{uuid.uuid4().hex}}\\n" + source, arch) for arch in ("sm_80", "sm_90")]
results = compile_many(jobs, workers=2, progress=False)
print("compiled", sum(not isinstance(r, BaseException) for r in results), flush=True)
"""


def test_a_script_without_a_main_guard_runs_once(cache_dir, tmp_path):
    """Workers are spawned processes, and spawn re-runs the parent's script in each of them unless
    that script guards its body with `if __name__ == "__main__"`; a user's training script with
    SPIO_AUTOTUNE=1 would then run once per worker (and the pool hang). The pool starts its
    workers with a stand-in __main__, so the script's body runs once, in the parent."""
    done = _run_script(tmp_path, _UNGUARDED_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["script body ran", "compiled 2"], done.stdout


_FORKING_SCRIPT = """\
import faulthandler, os
from spio.compiler import CompileJob, compile_many, pool

def sweep(value):
    source = 'extern "C" __global__ void k(int *x) { x[threadIdx.x] = %d; }' % value
    jobs = [CompileJob(source, arch) for arch in ("sm_80", "sm_90")]
    results = compile_many(jobs, workers=2, progress=False)
    return sum(not isinstance(result, BaseException) for result in results)

print("parent compiled", sweep(1), flush=True)
pid = os.fork()
if pid == 0:
    faulthandler.dump_traceback_later(60, exit=True)  # a child that hangs ends, exit 1
    print("child compiled", sweep(2), flush=True)
    pool.shutdown_pool()
    os._exit(0)
print("child exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
print("parent compiled", sweep(3), flush=True)
"""


def test_a_child_forked_after_a_sweep_makes_its_own_pool(cache_dir, tmp_path):
    """A child forked from a process whose pool is up (os.fork, multiprocessing's "fork" start
    method) inherited the pool, but not its executor's threads: its sweep waited forever for
    results. It now makes a pool of its own, and the parent's still serves the parent."""
    done = _run_script(tmp_path, _FORKING_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "parent compiled 2",
        "child compiled 2",
        "child exit 0",
        "parent compiled 2",
    ], (done.stdout, done.stderr)


_KILLED_PARENT_SCRIPT = """\
import os, signal
from spio.compiler import CompileJob, compile_many, pool

source = 'extern "C" __global__ void k(int *x) { x[threadIdx.x] = 5; }'
compile_many([CompileJob(source, arch) for arch in ("sm_80", "sm_90")], workers=2, progress=False)
print(*pool._pool._processes, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_workers_end_when_their_parent_is_killed(cache_dir, tmp_path):
    """A process killed with its pool up (SIGKILL, the OOM killer, SIGTERM) left its workers
    waiting for jobs forever, holding its stdout open: `python train.py | tee log` never ended.
    They now end with it."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "killed.py"
    script.write_text(_KILLED_PARENT_SCRIPT)
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:  # a file: a pipe would stay open while the workers live
        done = subprocess.run([sys.executable, str(script)], stdout=stdout, timeout=120)
    assert done.returncode == -signal.SIGKILL
    workers = [int(pid) for pid in out.read_text().split()]
    assert len(workers) == 2, out.read_text()
    try:
        deadline = time.monotonic() + 20
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, workers)), workers
    finally:
        for pid in filter(_running, workers):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def pool_jobs(monkeypatch):
    """The jobs of tests.compiler.pool_jobs, with a pool started afresh whose workers can import
    them (a worker finds modules on the sys.path its parent had when the pool started)."""
    from spio.compiler import pool

    monkeypatch.syspath_prepend(str(REPO))
    pool.shutdown_pool()
    from tests.compiler import pool_jobs

    return pool_jobs


def test_a_job_that_kills_its_worker_loses_only_itself(cache_dir, pool_jobs):
    """A worker killed (an NVRTC crash, the OOM killer) breaks the whole executor. The results
    that came back are kept, the jobs lost with it run again in a fresh pool, and only the job
    whose own worker dies again gets an error, saying so; the next sweep gets a working pool."""
    from spio.compiler import pool

    tag = uuid.uuid4().hex
    good = [CompileJob(f"// {tag} {i}\n" + GOOD.format(value=i), "sm_80") for i in range(4)]
    crash = pool_jobs.KillWorkerJob("", "sm_80", name="crash.cu")
    results = compile_many([good[0], crash, good[1], good[2]], workers=2, progress=False)
    assert isinstance(results[1], pool.WorkerDiedError), results
    assert "crash.cu" in str(results[1]) and "SPIO_WORKERS=1" in str(results[1])
    for result in results[:1] + results[2:]:
        assert isinstance(result, CompileResult), results
    again = compile_many([good[3], good[0]], workers=2, progress=False)
    assert all(isinstance(result, CompileResult) for result in again), again


def test_a_broken_pool_whose_other_worker_hangs_on_sigterm_still_ends(
    tmp_path, cache_dir, pool_jobs
):
    """When a worker dies, the executor ends the others with SIGTERM and waits for them. NVRTC
    handles SIGTERM while it compiles by calling exit(), which deadlocked in CI on the malloc
    lock the interrupted compile held: the sweep then waited forever. A worker that hangs on
    SIGTERM stands in for it; the sweep must end (the broken pool's workers are killed)."""
    import threading

    from spio.compiler import pool

    folder = str(tmp_path)
    hang = pool_jobs.HangOnTermJob(folder, "sm_80", name="hang.cu")
    crash = pool_jobs.KillWorkerWhenReadyJob(folder, "sm_80", name="crash.cu")
    results = []
    sweep = threading.Thread(
        target=lambda: results.extend(compile_many([hang, crash], workers=2, progress=False)),
        daemon=True,
    )
    sweep.start()
    sweep.join(timeout=90)
    assert not sweep.is_alive(), "the sweep waited for a worker that hangs on SIGTERM"
    assert isinstance(results[1], pool.WorkerDiedError), results


def test_a_pool_whose_workers_died_is_replaced(pool_jobs, tmp_path, caplog):
    """Workers killed while the pool sits idle (say by Ctrl-C in a terminal, or the OOM killer):
    the next sweep starts a new pool instead of failing, and needs no retry."""
    import signal

    from spio.compiler import pool

    jobs = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"job{i}") for i in range(2)]
    compile_many(jobs, workers=2, progress=False)
    processes = list(pool._pool._processes.values())
    for process in processes:
        os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(process.exitcode is None for process in processes):
        assert time.monotonic() < deadline, "the killed workers did not exit"
        time.sleep(0.01)
    with caplog.at_level("WARNING", logger="spio"):
        assert compile_many(jobs, workers=2, progress=False) == ["job0", "job1"]
    assert "worker died" not in caplog.text


def test_a_pool_whose_workers_cannot_start_runs_the_jobs_here(
    pool_jobs, tmp_path, monkeypatch, caplog
):
    """A worker that dies while the pool starts (the OOM killer, a spawn this system refuses)
    broke the executor inside compile_many, whose BrokenProcessPool then lost the whole sweep.
    Now the jobs run in this process, with a warning, and no half-started pool is kept."""
    from concurrent.futures.process import BrokenProcessPool

    from spio.compiler import pool

    def start_workers(executor, workers):
        raise BrokenProcessPool("a child process terminated abruptly")

    monkeypatch.setattr(pool, "_start_workers", start_workers)
    jobs = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"job{i}") for i in range(3)]
    with caplog.at_level("WARNING", logger="spio"):
        assert compile_many(jobs, workers=2, progress=False) == ["job0", "job1", "job2"]
    assert "workers could not start" in caplog.text and "3 kernel(s) left" in caplog.text
    assert pool._pool is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job0", "job1", "job2"]


def test_a_job_lost_with_a_worker_is_not_run_here_when_no_pool_starts_again(
    cache_dir, pool_jobs, tmp_path, monkeypatch
):
    """After a worker died, a pool that cannot start again leaves the jobs running then (one of
    them may be what kills a worker) without a retry, each with a WorkerDiedError saying so:
    run in this process, it would kill it. The jobs not started run here."""
    from concurrent.futures.process import BrokenProcessPool

    from spio.compiler import pool

    real_start = pool._start_workers
    starts = []

    def start_workers(executor, workers):
        starts.append(workers)
        if len(starts) > 1:
            raise BrokenProcessPool("a child process terminated abruptly")
        real_start(executor, workers)

    monkeypatch.setattr(pool, "_start_workers", start_workers)
    crash = pool_jobs.KillWorkerJob("", "sm_80", name="crash.cu")
    marks = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"job{i}") for i in range(3)]
    results = compile_many([crash, *marks], workers=2, progress=False)
    assert isinstance(results[0], pool.WorkerDiedError), results
    assert "crash.cu" in str(results[0]) and "could not be retried" in str(results[0])
    assert results[1] == "job0" or isinstance(results[1], pool.WorkerDiedError), results
    assert results[2:] == ["job1", "job2"]  # not started when the worker died
    assert len(starts) == 2


def test_a_sweep_starts_no_more_processes_than_it_has_jobs(pool_jobs, tmp_path):
    """Two jobs with SPIO_WORKERS=4 started four processes (30 with 30). Now a pool holds as
    many as the sweep needs; a larger sweep gets a larger one, a smaller one reuses it, and a
    lower worker count than the pool's size makes a smaller pool."""
    from spio.compiler import pool

    def sweep(count, workers):
        jobs = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"j{i}") for i in range(count)]
        assert compile_many(jobs, workers=workers, progress=False) == [j.name for j in jobs]
        return set(pool._pool._processes)

    pool.shutdown_pool()
    assert len(sweep(2, 4)) == 2
    four = sweep(4, 4)
    assert len(four) == 4
    assert sweep(2, 4) == four  # the same processes
    assert len(sweep(3, 2)) == 2


def test_sweeps_in_two_threads_with_different_worker_counts_both_finish(pool_jobs, tmp_path):
    """A sweep started while another runs waits for it, instead of replacing the pool under
    the other (for its own size), whose next submit then failed."""
    import threading

    first = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"a{i}") for i in range(6)]
    second = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"b{i}") for i in range(3)]
    results = {}
    thread = threading.Thread(
        target=lambda: results.update(a=compile_many(first, workers=2, progress=False))
    )
    thread.start()
    time.sleep(0.3)  # the first sweep is running
    results["b"] = compile_many(second, workers=3, progress=False)
    thread.join(timeout=60)
    assert results["a"] == [job.name for job in first], results["a"]
    assert results["b"] == [job.name for job in second], results["b"]


def test_a_worker_death_in_one_threads_sweep_is_not_blamed_on_anothers_job(
    cache_dir, pool_jobs, tmp_path
):
    """A job that kills its worker, in one thread's sweep, while another thread's sweep runs a
    good job: the good job's worker was lost with the pool, and "lost alone, twice" blamed it
    (WorkerDiedError). Sweeps now take turns on the pool."""
    import threading

    from spio.compiler import pool

    crash = pool_jobs.KillWorkerJob("", "sm_80", name="crash.cu")
    mine = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name="slow")]
    compile_many(mine * 2, workers=2, progress=False)  # the pool is up: both sweeps start at once
    results = {}
    thread = threading.Thread(
        target=lambda: results.update(
            crash=compile_many([crash, mine[0]], workers=2, progress=False)
        )
    )
    thread.start()
    time.sleep(0.05)
    results["good"] = compile_many(mine * 2, workers=2, progress=False)
    thread.join(timeout=60)
    assert results["good"] == ["slow", "slow"], results["good"]
    assert isinstance(results["crash"][0], pool.WorkerDiedError), results["crash"]
    assert results["crash"][1] == "slow"


def test_ctrl_c_cancels_the_jobs_not_started(pool_jobs, tmp_path, monkeypatch):
    """KeyboardInterrupt in a sweep (here from its progress bar as the first job comes back)
    propagates at once, and of the sweep's jobs only those already running still run: neither the
    exit nor the next sweep waits for the rest."""
    import _thread

    import tqdm

    class InterruptingBar:
        def __init__(self, *args, **kwargs):
            self.updates = 0

        def update(self, n=1):
            self.updates += n
            if self.updates == 1:
                _thread.interrupt_main()

        def close(self):
            pass

    jobs = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"job{i}") for i in range(20)]
    # interrupt_main does nothing where SIGINT is ignored, as in a process a non-interactive
    # shell started in the background (a CI run started with `&` failed here): Python's own
    # handler for the test's length.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(tqdm, "tqdm", InterruptingBar)
            with pytest.raises(KeyboardInterrupt):
                compile_many(jobs, workers=2)
    finally:
        signal.signal(signal.SIGINT, previous)
    # The next sweep's jobs queue behind whatever the interrupted one left in the pool.
    after = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"after{i}") for i in range(2)]
    assert compile_many(after, workers=2, progress=False) == ["after0", "after1"]
    ran = [path.name for path in tmp_path.iterdir() if path.name.startswith("job")]
    assert len(ran) <= 3, sorted(ran)  # the first job back, and the 2 workers' running jobs


def test_workers_are_spawned_with_sigint_blocked_and_then_ignore_it(pool_jobs, monkeypatch):
    """Ctrl-C in a terminal reaches the whole process group: a worker still importing (before
    its initializer ignored SIGINT) died with a KeyboardInterrupt traceback. The pool spawns its
    workers with SIGINT blocked (a child inherits its spawning thread's mask); each then
    ignores it, and unblocks it, a pending one discarded. The spawning thread's mask is
    restored."""
    from concurrent.futures import Future

    from spio.compiler import pool

    masks = []

    class RecordingPool:
        def submit(self, fn):
            masks.append(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
            future = Future()
            future.set_result(fn())
            return future

    pool._start_workers(RecordingPool(), 3)
    assert masks == [True] * 3
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    pool.shutdown_pool()  # a pool of its own, started here
    job = pool_jobs.SigintStateJob("", "sm_80")
    assert compile_many([job, job], workers=2, progress=False) == [(True, False)] * 2


def test_a_daemonic_process_compiles_its_jobs_itself(cache_dir, monkeypatch):
    """A daemonic process (a multiprocessing.Pool's worker, a DataLoader's) may start no
    processes: its sweep raised AssertionError ("daemonic processes are not allowed to have
    children"). Its jobs now run in it."""
    import multiprocessing

    from spio.compiler import pool

    pool.shutdown_pool()
    monkeypatch.setitem(multiprocessing.current_process()._config, "daemon", True)
    results = compile_many(fresh_jobs(2), workers=2, progress=False)
    assert all(isinstance(result, CompileResult) for result in results), results
    assert pool._pool is None


@pytest.mark.parametrize("workers", [0, 2.5, "2", True])
def test_workers_that_are_no_positive_integer_are_rejected(workers):
    """2.5 and "2" had failed deep inside the pool with a TypeError of their own."""
    with pytest.raises(ValueError, match=f"workers >= 1.*got {workers!r}"):
        compile_many([], workers=workers)


def test_the_exit_hook_is_registered_once(pool_jobs, tmp_path, monkeypatch):
    """Each new pool used to register shutdown_pool with atexit again."""
    import atexit

    from spio.compiler import pool

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    jobs = [pool_jobs.MarkJob(str(tmp_path), "sm_80", name=f"job{i}") for i in range(2)]
    compile_many(jobs, workers=2, progress=False)
    pool.shutdown_pool()
    compile_many(jobs, workers=2, progress=False)
    assert len(registered) <= 1, registered


def test_an_unwritable_cache_keeps_the_workers_results_in_the_parent(
    tmp_path, monkeypatch, capfd, caplog
):
    """Workers that cannot store their cubins hand them over: loading them afterwards compiles
    nothing, and the parent alone says once that the folder cannot be written."""
    from spio.compiler import compile as compile_module
    from spio.compiler import compile_cubin

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPIO_CACHE_DIR", str(blocker / "cache"))  # mkdir fails, even as root
    monkeypatch.setattr(compile_module._cubin_cache, "_memory", {})
    monkeypatch.setattr(compile_module._cubin_cache, "_warned", False)
    jobs = fresh_jobs(3)
    with caplog.at_level("WARNING", logger="spio"):
        results = compile_many(jobs, workers=2, progress=False)
    assert all(isinstance(r, CompileResult) for r in results), results

    def refuse(*args, **kwargs):
        raise AssertionError("compiled again in the parent")

    monkeypatch.setattr(compile_module.nvrtc, "compile_program", refuse)
    for job in jobs:
        assert compile_cubin(job.source, job.arch).cached
    assert "cannot write its cache folder" not in capfd.readouterr().err  # the workers' stderr
    warned = [r for r in caplog.records if "cannot write its cache folder" in r.getMessage()]
    assert len(warned) == 1


def test_a_writable_cache_keeps_no_worker_result_in_memory_and_warns_nothing(
    cache_dir, monkeypatch, caplog
):
    """The parent keeps a worker's result in memory only where the disk did not take it: here
    every cubin is on disk, and nothing says the folder cannot be written."""
    from spio.compiler import compile as compile_module

    monkeypatch.setattr(compile_module._cubin_cache, "_warned", False)
    jobs = fresh_jobs(2)
    with caplog.at_level("WARNING", logger="spio"):
        results = compile_many(jobs, workers=2, progress=False)
    assert all(isinstance(r, CompileResult) for r in results), results
    assert all(compile_module._cubin_cache.on_disk(r.key) for r in results)
    assert not compile_module._cubin_cache.warned
    assert "cannot write its cache folder" not in caplog.text
    assert not any(r.key in compile_module._cubin_cache._memory for r in results)


_LOGGING_SCRIPT = """\
import logging
import sys
import uuid

from spio.compiler import CompileJob, compile_many

if sys.argv[1] == "code":  # the level and handler set in code, as an application does
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
source = 'extern "C" __global__ void k(int *x) {{ x[threadIdx.x] = {}; }}'
tag = uuid.uuid4().hex
jobs = [CompileJob(f"// {tag}\\n" + source.format(i), "sm_80") for i in range(3)]
for sweep in range(2):  # the second finds every cubin in the cache
    compile_many(jobs, workers=2, progress=False)
"""


@pytest.mark.parametrize("setting", ["code", "SPIO_LOGGER"])
def test_each_job_of_a_sweep_is_one_log_line_in_the_parent(setting, tmp_path):
    """A job compiled in a worker is one "compiled ... in N s" line, and one found in the cache
    one "cached" line, logged by the parent: with logging set up in code (the workers, which
    do not share it, had logged nothing that reached it) and with SPIO_LOGGER=1 (each line
    once: the workers no longer log them too)."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(_LOGGING_SCRIPT)
    # (PYTHONPATH: the script imports this checkout's spio, wherever the installed one is)
    env = dict(os.environ, SPIO_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    env.pop("SPIO_LOGGER", None)
    if setting == "SPIO_LOGGER":
        env["SPIO_LOGGER"] = "1"
    out = subprocess.run([sys.executable, str(script), setting], capture_output=True,
                         encoding="utf-8", timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    compiled = [line for line in lines if "compiled kernel.cu for sm_80 in " in line]
    cached = [line for line in lines if "cached kernel.cu for sm_80" in line]
    assert len(compiled) == 3 and len(cached) == 3, out.stderr
    assert all(line.endswith(" s (in a compile worker)") for line in compiled + cached), out.stderr


@pytest.mark.parametrize(
    "files,quota",
    [
        ({"cpu.max": "400000 100000\n"}, 4.0),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "garbage"}, None),
        ({}, None),
    ],
)
def test_a_containers_cpu_quota_bounds_the_usable_cores(tmp_path, monkeypatch, files, quota):
    """A container limited to a few CPUs on a large host had started a compile worker per host
    core (~95 MB each): cgroup v2's cpu.max and v1's cfs quota bound the count."""
    from spio.compiler import pool

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert pool.cgroup_cpu_quota(tmp_path) == quota
    monkeypatch.setattr(pool, "_CGROUP", tmp_path)
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert pool.usable_cores() == (64 if quota is None else max(1, math.ceil(quota)))


@pytest.mark.parametrize(
    "own,files,quota",
    [
        (  # cgroup v2 without a namespace of its own (systemd's CPUQuota, a Slurm job): the
            # process's cgroup is below the root, and the least limit up the tree counts
            "0::/user.slice/job.scope\n",
            {
                "user.slice/cpu.max": "200000 100000\n",
                "user.slice/job.scope/cpu.max": "max 100000\n",
            },
            2.0,
        ),
        (
            "12:cpu,cpuacct:/slurm/job1\n0::/\n",
            {
                "cpu/slurm/job1/cpu.cfs_quota_us": "300000\n",
                "cpu/slurm/job1/cpu.cfs_period_us": "100000\n",
            },
            3.0,
        ),
        ("0::/a/b\n", {"a/cpu.max": "400000 100000\n", "a/b/cpu.max": "100000 100000\n"}, 1.0),
        ("4:memory:/x\n", {"x/cpu.max": "100000 100000\n"}, None),  # not the cpu controller's
    ],
)
def test_the_quota_of_the_processs_own_cgroup_counts(tmp_path, own, files, quota):
    """The root's cpu.max alone had been read: a process in a cgroup below it (no cgroup
    namespace of its own) had its limit missed."""
    from spio.compiler import pool

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert pool.cgroup_cpu_quota(tmp_path, own) == quota
