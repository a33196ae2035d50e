"""The compile pool runs jobs in worker processes and returns results and errors in order."""

import uuid

import pytest

from spio.compiler import CompileError, CompileJob, compile_many
from spio.compiler.pool import default_workers

GOOD = 'extern "C" __global__ void k(int *x) {{ x[threadIdx.x] = {value}; }}'
BAD = 'extern "C" __global__ void k(int *x) { x[0] = nope; }'


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


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_bad_worker_count_is_rejected(value, monkeypatch):
    monkeypatch.setenv("SPIO_WORKERS", value)
    with pytest.raises(ValueError, match="SPIO_WORKERS"):
        default_workers()


def test_worker_count_from_environment(monkeypatch):
    monkeypatch.setenv("SPIO_WORKERS", "3")
    assert default_workers() == 3


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
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(_UNGUARDED_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["script body ran", "compiled 2"], done.stdout
