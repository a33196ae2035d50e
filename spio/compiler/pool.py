"""A lazily created process pool that compiles many kernels in parallel, with a progress bar.

SPIO_WORKERS sets the number of processes (default: the number of CPU cores). Workers share the disk
cache, so the parent and later processes find every cubin a sweep compiled; each job is compiled
into the parent's cache folder as it was when the job was submitted.

Workers are spawned (they inherit no torch threads or CUDA state), all of them when the pool is
made, with a stand-in `__main__`: spawn would otherwise re-run the parent's script in every worker,
and a user's script without an `if __name__ == "__main__"` guard (say, training with
SPIO_AUTOTUNE=1) would run once per worker. The workers need nothing from it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import sys
import threading
import types
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

from .cache import cache_root
from .compile import CompileResult, compile_cubin


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


def default_workers() -> int:
    """SPIO_WORKERS, else the number of CPU cores this process may use."""
    env = os.environ.get("SPIO_WORKERS")
    if env:
        try:
            workers = int(env)
        except ValueError:
            raise ValueError(f"SPIO_WORKERS must be a positive integer, got {env!r}") from None
        if workers < 1:
            raise ValueError(f"SPIO_WORKERS must be a positive integer, got {env!r}")
        return workers
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


_pool: ProcessPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


@contextlib.contextmanager
def _stand_in_main():
    """sys.modules["__main__"] is an empty module meanwhile: processes spawned then do not import
    the parent's script (spawn imports whatever __main__ names by file or module name)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = main


def _start_workers(pool: ProcessPoolExecutor, workers: int) -> None:
    """Start all of the pool's processes now: the executor spawns one per submit while no worker
    is idle, and a process takes far longer to start than these submits take."""
    for future in [pool.submit(os.getpid) for _ in range(workers)]:
        future.result()


def _get_pool(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers != workers:
            if _pool is not None:
                _pool.shutdown(wait=True)
            ctx = multiprocessing.get_context("spawn")
            _pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
            _pool_workers = workers
            atexit.register(shutdown_pool)
            with _stand_in_main():
                _start_workers(_pool, workers)
        return _pool


def shutdown_pool() -> None:
    """Stop the worker processes, if any were started."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
            _pool = None


def _run(job: CompileJob, cache_dir: str | None = None) -> CompileResult | BaseException:
    """Runs a job; in a worker, `cache_dir` is the parent's cache folder at submit time (the pool
    outlives changes to SPIO_CACHE_DIR in the parent, which its workers would not see)."""
    if cache_dir is not None:
        os.environ["SPIO_CACHE_DIR"] = cache_dir
    try:
        return job.run()
    except Exception as error:  # returned, not raised: one bad kernel must not stop a sweep
        return error


def compile_many(
    jobs: Sequence[CompileJob],
    *,
    workers: int | None = None,
    progress: bool = True,
    desc: str = "compiling kernels",
) -> list[CompileResult | BaseException]:
    """Run every job; returns, in job order, each CompileResult or the exception it raised."""
    from tqdm import tqdm

    workers = workers or default_workers()
    jobs = list(jobs)
    bar = tqdm(total=len(jobs), desc=desc, unit="kernel", disable=not progress or not jobs)
    try:
        if workers == 1 or len(jobs) <= 1:
            results = []
            for job in jobs:
                results.append(_run(job))
                bar.update()
            return results
        pool = _get_pool(workers)
        root = str(cache_root())
        futures: list[Future] = [pool.submit(_run, job, root) for job in jobs]
        for future in futures:
            future.add_done_callback(lambda _: bar.update())
        return [future.result() for future in futures]
    finally:
        bar.close()
