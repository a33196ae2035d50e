"""A lazily created process pool that compiles many kernels in parallel, with a progress bar.

SPIO_WORKERS sets the most processes (default: usable_cores(), the CPUs its affinity allows, fewer
under a cgroup CPU quota);
a sweep of fewer jobs starts no more processes than it has jobs. Workers share the disk
cache, so the parent and later processes find every cubin a sweep compiled; each job is compiled
into the parent's cache folder as it was when the job was submitted.

Workers are spawned (they inherit no torch threads or CUDA state), all of them when the pool is
made, with a stand-in `__main__`: spawn would otherwise re-run the parent's script in every worker,
and a user's script without an `if __name__ == "__main__"` guard (say, training with
SPIO_AUTOTUNE=1) would run once per worker. The workers need nothing from it.

The executor is never handed more jobs than there are workers. A worker that dies (NVRTC crashing,
the OOM killer) breaks the whole executor, losing the jobs running then: the results that came back
are kept, the pool is replaced, and the lost jobs run once more; a job lost again gets a
WorkerDiedError as its result once it is clear that it was its own worker that died (it died alone).
Where no pool will start (a worker dies starting), the jobs left run in this process, with a
warning, but for those running when a worker died, which get a WorkerDiedError.
Workers ignore SIGINT: on Ctrl-C (any BaseException) the parent cancels the jobs not started, so
that only the running ones finish, and the pool survives for the next sweep. Workers end when
the parent does, however it ends. A child forked from the parent makes a pool of its own.

One sweep uses the pool at a time; a sweep from another thread waits for it. A large sweep's pool
is as large as the machine, so sweeps side by side would finish no sooner, and a worker's death
would lose both sweeps' jobs and blame a job of one for the other's (a job "lost alone" would
not be).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import cast

from ..env import integer
from ..log import WORKER_MARK, logger
from .arch import builds_for, check_arch
from .cache import cache_root
from .compile import (
    CompileResult,
    as_compile_worker,
    compile_cubin,
    keep_in_memory,
    log_build,
)


@dataclass(frozen=True)
class CompileJob:
    """One compile_cubin call, described by value so it can travel to a worker process."""

    source: str
    arch: str
    headers: dict[str, str] = field(default_factory=dict)
    name: str = "kernel.cu"
    options: tuple[str, ...] = ()

    def run(self) -> CompileResult:
        return compile_cubin(
            self.source, self.arch, self.headers, name=self.name, options=self.options
        )


def usable_cores() -> int:
    """The number of CPU cores this process may use: those it may run on, or fewer where its
    cgroup's CPU quota allows fewer (a container limited to 4 CPUs on a 128-core host had
    started 128 compile workers of ~95 MB each)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


#: Where cgroup v2 (cpu.max: "<quota> <period>" or "max <period>") and v1 (cpu.cfs_quota_us,
#: -1 for none, and cpu.cfs_period_us) put CPU limits; /proc/self/cgroup names this process's.
_CGROUP = Path("/sys/fs/cgroup")
_OWN_CGROUP = Path("/proc/self/cgroup")


def cgroup_cpu_quota(root: Path | None = None, own: str | None = None) -> float | None:
    """The CPUs this process's cgroup may use (quota / period: the least of its cgroup's and
    every parent's), None where none sets a limit or none can be read (not Linux, another
    layout). `own`: /proc/self/cgroup's text (read when None)."""
    root = _CGROUP if root is None else root
    if own is None:
        try:
            own = _OWN_CGROUP.read_text()
        except OSError:
            own = ""
    quotas = [_cpu_quota_in(folder) for folder in _cgroup_folders(root, own)]
    return min((quota for quota in quotas if quota is not None), default=None)


def _cgroup_folders(root: Path, own: str) -> list[Path]:
    """The folders that may limit this process's CPUs: its cgroup's (v2's `0::` line; v1's
    `cpu` controller's, below root/cpu) and each parent's, and the roots (a container's own
    cgroup namespace shows its cgroup as the root)."""
    folders = [root, root / "cpu"]
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        if parts[1] == "":  # cgroup v2's one hierarchy
            base = root
        elif "cpu" in parts[1].split(","):
            base = root / "cpu"
        else:
            continue
        here = base / parts[2].lstrip("/")
        while here != base:
            folders.append(here)
            here = here.parent
    return folders


def _cpu_quota_in(folder: Path) -> float | None:
    """The CPU quota one cgroup folder sets (v2's cpu.max, else v1's cfs files), or None."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" or int(period) <= 0 else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((folder / "cpu.cfs_quota_us").read_text())
        period_us = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def default_workers() -> int:
    """SPIO_WORKERS (digits; blank counts as unset), else usable_cores()."""
    workers = integer("SPIO_WORKERS", "a positive integer", lambda value: value >= 1)
    return usable_cores() if workers is None else workers


class WorkerDiedError(RuntimeError):
    """The worker process compiling a job died (killed by a signal), and died again when the job
    was retried: a job's slot in compile_many's results holds this instead of a CompileResult."""


_pool: ProcessPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()  # guards _pool and _pool_workers
_sweep_lock = threading.Lock()  # one sweep on the pool at a time (see above)
_shutdown_registered = False


def _forget_the_pool() -> None:
    """Runs in a child made by fork (os.fork, multiprocessing's "fork" start method): the
    parent's pool is not the child's (its executor's threads did not come along, so a sweep
    waited forever for its jobs), nor are its locks, which a thread of the parent may have held
    at the fork. The child makes its own pool when it first needs one."""
    global _pool, _pool_workers, _pool_lock, _sweep_lock
    _pool, _pool_workers = None, 0
    _pool_lock, _sweep_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_the_pool)


@contextlib.contextmanager
def _stand_in_main():
    """sys.modules["__main__"] is a stand-in meanwhile, which names no file or module: processes
    spawned then do not import the parent's script (spawn imports whatever __main__ names by file
    or module name). It holds the script's names, so that other threads still pickle the script's
    objects meanwhile (pickle finds a class of __main__ by its name there)."""
    main = sys.modules.get("__main__")
    stand_in = types.ModuleType("__main__")
    if main is not None:
        names = {k: v for k, v in vars(main).items() if k not in ("__file__", "__spec__")}
        stand_in.__dict__.update(names)
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        if main is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = main


def _start_workers(pool: ProcessPoolExecutor, workers: int) -> None:
    """Start all of the pool's processes now: the executor spawns one per submit while no worker
    is idle, and a process takes far longer to start than these submits take. They are spawned
    with SIGINT blocked (_sigint_blocked), which _start_worker ignores and unblocks."""
    with _marked_as_workers(), _sigint_blocked():  # (a submit spawns: the mark is copied then)
        futures = [pool.submit(os.getpid) for _ in range(workers)]
    for future in futures:
        future.result()


@contextlib.contextmanager
def _marked_as_workers():
    """WORKER_MARK in this process's environment while its workers start (they copy it)."""
    os.environ[WORKER_MARK] = "1"
    try:
        yield
    finally:
        os.environ.pop(WORKER_MARK, None)


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread, so that the processes it spawns start with it blocked (a
    child inherits its spawning thread's signal mask) and a Ctrl-C in a terminal, which reaches
    the whole process group, stays pending in a worker still starting, until _start_worker
    discards it, instead of a KeyboardInterrupt and a traceback from its imports. This process
    still receives it: in another thread, or here once the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _start_worker() -> None:
    """Runs first in each worker. It ignores SIGINT (then unblocks it: a pending one is
    discarded): Ctrl-C in a terminal reaches the whole process group, and would kill idle
    workers (breaking the pool) and print a traceback per worker; the parent handles it,
    cancelling the jobs not started. And it ends the worker when the parent ends without
    stopping the pool (SIGKILL, the OOM killer, SIGTERM): the worker would otherwise wait for
    jobs forever, and keep the parent's stdout open (`| tee` never ended)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    as_compile_worker()  # its parent says what compile_cubin would: see report, compile_many
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: multiprocessing.process.BaseProcess) -> None:
    """A worker's watch on its parent (a thread of its own): ends the worker when it ends."""
    parent.join()  # returns when the parent has ended
    os._exit(1)


def _is_broken(pool: ProcessPoolExecutor) -> bool:
    """Whether the executor knows it is broken or one of its workers has exited (killed while the
    pool sat idle, say by Ctrl-C in a terminal, before the executor noticed)."""
    if getattr(pool, "_broken", False):
        return True
    processes = getattr(pool, "_processes", None) or {}
    return any(process.exitcode is not None for process in list(processes.values()))


def _shared_pool(workers: int, most: int) -> ProcessPoolExecutor:
    """The shared pool, for one round of a sweep (which holds _sweep_lock), with at least
    `workers` and at most `most` processes: a new pool of `workers` when there is none, it lost
    a worker, or its size is outside those bounds. A sweep of few jobs starts no more processes
    than it has jobs, and a later, larger sweep gets a larger pool."""
    global _pool, _pool_workers, _shutdown_registered
    with _pool_lock:
        if _pool is not None and (not workers <= _pool_workers <= most or _is_broken(_pool)):
            _pool.shutdown(wait=True, cancel_futures=True)
            _pool = None
        if _pool is None:
            ctx = multiprocessing.get_context("spawn")
            pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=ctx, initializer=_start_worker
            )
            if not _shutdown_registered:
                atexit.register(shutdown_pool)
                _shutdown_registered = True
            try:
                with _stand_in_main():
                    _start_workers(pool, workers)
            except BaseException:  # a worker died starting (BrokenProcessPool), or Ctrl-C
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            _pool, _pool_workers = pool, workers
        return _pool


def report(
    job: CompileJob, result: CompileResult | BaseException, waited: float
) -> CompileResult | BaseException:
    """Logs a worker's result here, as compile_cubin logs one in this process: the worker does
    not (as_compile_worker), where it could reach only the logging SPIO_LOGGER sets up, not a
    level or handler set in code. A compiled cubin's time is NVRTC's; a cached one's, `waited`,
    from the job's hand-over to its result (no job waits in the pool's queue: see _round).
    Returns `result`."""
    if isinstance(result, CompileResult):
        seconds = waited if result.cached else result.seconds
        log_build(job.name, job.arch, result.cached, seconds, " (in a compile worker)")
    return result


def _discard_pool(pool: ProcessPoolExecutor, kill: bool = False) -> None:
    """Stop `pool`'s workers, and forget it if it is the shared one, so that the next round
    makes a new one (_shared_pool). `kill` (a broken pool) first ends every worker still alive
    with SIGKILL: the executor ends them with SIGTERM and waits, and NVRTC, while it compiles,
    handles SIGTERM by calling exit(), which can deadlock on the malloc lock the interrupted
    compile holds; the executor, and with it this sweep, then waited forever (seen in CI: a
    worker's stack, in gdb, went malloc -> signal handler -> nvrtc -> exit -> free)."""
    global _pool
    with _pool_lock:
        if _pool is pool:
            _pool = None
    if kill:
        processes = getattr(pool, "_processes", None) or {}
        for process in list(processes.values()):
            if process.is_alive():
                process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def shutdown_pool() -> None:
    """Stop the worker processes, if any were started."""
    pool = _pool
    if pool is not None:
        _discard_pool(pool)


def _run(job: CompileJob, cache_dir: str | None = None) -> CompileResult | BaseException:
    """Runs a job; in a worker, `cache_dir` is the parent's cache folder at submit time (the pool
    outlives changes to SPIO_CACHE_DIR in the parent, which its workers would not see)."""
    if cache_dir is not None:
        os.environ["SPIO_CACHE_DIR"] = cache_dir
    try:
        return job.run()
    except Exception as error:  # returned, not raised: one bad kernel must not stop a sweep
        return error


class _Sweep:
    """One compile_many call on the pool: `results[i]` is filled as job i comes back."""

    def __init__(self, jobs: list[CompileJob], workers: int, bar) -> None:
        self.jobs = jobs
        self.workers = min(workers, len(jobs))  # jobs at once; the pool may hold up to `most`
        self.most = workers
        self.bar = bar
        self.root = str(cache_root())
        self.results: list[CompileResult | BaseException | None] = [None] * len(jobs)
        self.breakage: BrokenProcessPool | None = None  # the executor's error at the last break
        self.lost_before: set[int] = set()  # jobs running when a worker died

    def run(self) -> list[CompileResult | BaseException]:
        todo = deque(range(len(self.jobs)))
        lost_before = self.lost_before
        suspects: list[int] = []
        while todo:
            lost = self._round(todo, limit=self.workers)
            if not lost:
                continue  # done, or the pool was broken before a job reached it: a new pool
            first = [index for index in lost if index not in lost_before]
            again = [index for index in lost if index in lost_before]
            logger.warning(
                "a compile worker died (an NVRTC crash, or the OOM killer), losing the %d "
                "job(s) running then; they run again in a fresh pool (a job lost twice, alone)",
                len(lost),
            )
            lost_before.update(first)
            todo.extendleft(reversed(first))
            if len(lost) == 1 and again:
                self._died(again[0])  # it was alone: its own worker died, twice
            else:
                suspects += again
        # A job lost beside others a second time runs alone: one whose worker dies then is the
        # one that kills it.
        todo = deque(suspects)
        while todo:
            for index in self._round(todo, limit=1):
                self._died(index)
        # Every job has its result or error by now: None only marked those not yet back.
        return cast("list[CompileResult | BaseException]", self.results)

    def _round(self, todo: deque[int], limit: int) -> list[int]:
        """Runs the jobs numbered in `todo`, taken from its front, at most `limit` at a time, until
        `todo` is empty or the pool breaks; then discards the pool and returns the jobs that were
        running when it broke. No more jobs than `limit` are ever handed to the executor: a
        worker's death loses only the jobs running beside it, and on Ctrl-C no job waits in the
        executor's queue, where it could no longer be cancelled."""
        try:
            pool = _shared_pool(self.workers, self.most)
        except BrokenProcessPool as error:
            self._run_here(todo, error)
            return []
        finished: SimpleQueue[Future] = SimpleQueue()
        running: dict[Future, int] = {}
        submitted: dict[int, float] = {}  # job index: when it was handed to the pool
        lost: list[int] = []
        broken = False
        try:
            while True:
                while todo and not broken and len(running) < limit:
                    index = todo.popleft()
                    submitted[index] = time.perf_counter()
                    try:
                        future = pool.submit(_run, self.jobs[index], self.root)
                    except (BrokenProcessPool, RuntimeError):  # broken, or shut down (e.g. at
                        todo.appendleft(index)  # exit, by shutdown_pool): not lost
                        broken = True
                        break
                    running[future] = index
                    future.add_done_callback(finished.put)
                if not running:
                    break
                future = finished.get()
                index = running.pop(future)
                try:
                    waited = time.perf_counter() - submitted[index]
                    self.results[index] = report(self.jobs[index], future.result(), waited)
                except BrokenProcessPool as error:
                    lost.append(index)
                    self.breakage = error
                    broken = True
                    continue
                except CancelledError:  # the pool was shut down before the job started
                    todo.appendleft(index)
                    broken = True
                    continue
                except Exception as error:  # e.g. a result that could not be sent back
                    self.results[index] = error
                self.bar.update()
        except BaseException:
            # Ctrl-C: the jobs not started are dropped (there are few, see above), so that
            # neither the exit nor the next sweep waits for more than the running ones.
            for future in running:
                future.cancel()
            raise
        if broken:
            _discard_pool(pool, kill=True)
        return lost

    def _run_here(self, todo: deque[int], error: BrokenProcessPool) -> None:
        """The pool's workers could not start (one died starting: the OOM killer, or a spawn
        that fails on this system): the jobs left run in this process, one at a time, so the
        sweep still ends with every result, those the pool returned kept. Not a job that was
        running when a worker died: it may be what kills one, so it is not run here, where it
        would kill this process; it gets a WorkerDiedError."""
        logger.warning(
            "the compile pool's workers could not start (%s); compiling the %d kernel(s) left in "
            "this process, one at a time",
            error,
            len(todo),
        )
        self.breakage = error
        while todo:
            index = todo.popleft()
            if index in self.lost_before:
                self._died(index, retried="could not be retried: no worker would start")
                continue
            self.results[index] = _run(self.jobs[index])
            self.bar.update()

    def _died(
        self,
        index: int,
        retried: str = "died again when the job was retried in a fresh pool, running alone",
    ) -> None:
        job = self.jobs[index]
        error = WorkerDiedError(
            f"the compile worker running {job.name} for {job.arch} died (killed by a signal: an "
            f"NVRTC crash, or the OOM killer when memory ran out), and {retried}. If memory is "
            "short, use fewer workers: SPIO_WORKERS=1, or compile_many(..., workers=1)"
        )
        error.__cause__ = self.breakage
        self.results[index] = error
        self.bar.update()


def compile_many(
    jobs: Sequence[CompileJob],
    *,
    workers: int | None = None,
    progress: bool = True,
    desc: str = "compiling kernels",
) -> list[CompileResult | BaseException]:
    """Run every job; returns, in job order, each CompileResult or the exception it raised (a
    WorkerDiedError for a job whose worker process died twice). `workers` defaults to
    default_workers(); with 1, or a single job, or in a daemonic process (which may start
    none), the jobs run in this process."""
    from ..log import progress_bar

    if workers is None:
        workers = default_workers()
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(
            f"compile_many needs workers >= 1 (None for SPIO_WORKERS or the CPU count), "
            f"got {workers!r}"
        )
    jobs = list(jobs)
    bar = progress_bar(total=len(jobs), desc=desc, unit="kernel", disable=not progress or not jobs)
    try:
        # A daemonic process (a multiprocessing.Pool's worker, a DataLoader's) may start none.
        if workers == 1 or len(jobs) <= 1 or multiprocessing.current_process().daemon:
            results = []
            for job in jobs:
                results.append(_run(job))
                bar.update()
            return results
        for arch in sorted({job.arch for job in jobs if builds_for(job.arch)}):
            check_arch(arch)  # warns here of an experimental one; the workers do not
        with _sweep_lock:
            results = _Sweep(jobs, workers, bar).run()
        for result in results:
            if isinstance(result, CompileResult):
                keep_in_memory(result)
        return results
    finally:
        bar.close()
