"""scripts/gpu_check.sh: syntax, its step list, and a full run with stand-in tools (no GPU).

The stand-ins replace python (except for the script's own inline Python), compute-sanitizer and
pytest's results, so the test checks the driver logic: every step runs, logs land in OUT_DIR, a
failed step does not stop the run but makes the exit status non-zero, and the summary is last.
"""

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, load_script

SCRIPT = REPO / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$1" == "-" ]]; then exec {real} "$@"; fi
if [[ -n "${{FAKE_HANG:-}}" && "$*" == *"${{FAKE_HANG}}"* ]]; then sleep 60; fi
if [[ "$1 $2" == "--version " ]]; then echo "Python (stand-in)"; exit 0; fi
if [[ "$1 $2" == "-m pytest" ]]; then
    if [[ " $* " == *" --collect-only "* ]]; then
        if [[ -n "${{FAKE_COLLECT_HANG:-}}" ]]; then sleep 60; fi
        [[ -n "${{FAKE_NO_BULK:-}}" ]] || printf 'tests/a.py::test_bulk_copy[1]\\n'
        [[ -n "${{FAKE_NO_BULK:-}}" ]] || printf 'tests/c.py::test_tma_rows[1]\\n'
        printf 'tests/a.py::test_x[1]\\ntests/a.py::test_x[2]\\n'
        printf 'tests/b.py::test_y\\n\\n4 tests\\n'
        exit 0
    fi
    if [[ -n "${{FAKE_COPIES_HANG:-}}" && " $* " == *"test_tma_rows"* ]]; then
        trap 'echo "KeyboardInterrupt"; echo "1 passed in 2.00s"; exit 2' INT
        sleep 60 &
        wait
    fi
    if [[ -n "${{FAKE_PYTEST_HANG:-}}" ]]; then  # like pytest on SIGINT: summary, exit 2
        trap 'echo "KeyboardInterrupt"; echo "${{FAKE_PYTEST_HANG}} in 2.00s"; exit 2' INT
        sleep 60 &
        wait
    fi
    echo "ran: $*"
    echo "3 passed in 0.01s"
    exit 0
fi
if [[ "$*" == *"spio bench"* ]]; then
    echo "bench stand-in (SPIO_TMA=${{SPIO_TMA:-unset}}): $*"; exit ${{FAKE_BENCH_RC:-0}}
fi
if [[ "$*" == *"torch.cuda.is_available"* ]]; then exit ${{FAKE_NO_CUDA:-0}}; fi
if [[ "$*" == *"ablate_kernel.py"* && -n "${{FAKE_ABLATE_HANG:-}}" ]]; then sleep 60; fi
if [[ "$*" == *"layer_table"* && -n "${{FAKE_NO_LAYERS:-}}" ]]; then exit 1; fi
if [[ "$*" == *"spio info"* ]]; then
    echo "info stand-in (PYTHONUNBUFFERED=${{PYTHONUNBUFFERED:-unset}}," \
        "PYTHONPATH=${{PYTHONPATH:-unset}})"
    exit ${{FAKE_INFO_RC:-0}}
fi
if [[ "$*" == *"perf_sample.py"* && -n "${{FAKE_PERF_ROWS:-}}" ]]; then  # appends rows to --csv
    while [[ "$1" != "--csv" ]]; do shift; done
    [[ -s "$2" ]] || echo "layer,n" >"$2"
    for ((i = 0; i < FAKE_PERF_ROWS; i++)); do echo "L$i,128" >>"$2"; done
    exit 0
fi
if [[ "$*" == *"fuzz_kernels.py"* ]]; then
    echo "python stand-in: $*"
    echo "7 passed, 0 failed, 2 did not fit (seed 1, sm_90)"; exit 0
fi
if [[ "$*" == *"fuzz_layers.py"* ]]; then
    echo "python stand-in: $*"
    echo "3 passed, ${{FAKE_LAYER_FAILURES:-0}} failed (seed 1, cuda)"
    exit $((${{FAKE_LAYER_FAILURES:-0}} > 0))
fi
if [[ "$*" == *"timm_benchmark.py"* ]]; then
    printf 'spio / pytorch = 0.835\nspio-faster / pytorch = 1.002\n'
    printf 'spio / pytorch in CUDA graphs = 1.250\nspio-faster / pytorch in CUDA graphs = 1.300\n'
    exit 0
fi
echo "python stand-in: $*"
exit 0
"""

FAKE_SANITIZER = """#!/usr/bin/env bash
if [[ "${FAKE_HANG:-}" == "--help" && "$1" == "--help" ]]; then sleep 60; fi
if [[ "$1" == "--help" ]]; then echo "  --kernel-name arg"; exit 0; fi
echo "sanitizer stand-in: $*"
exit 0
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def stand_ins(tmp_path):
    fake_python = _executable(tmp_path / "python", FAKE_PYTHON.format(real=sys.executable))
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    _executable(cuda_home / "bin" / "compute-sanitizer", FAKE_SANITIZER)
    path = ":".join(p for p in os.environ["PATH"].split(":") if "cuda" not in p)
    return dict(os.environ, PYTHON=str(fake_python), CUDA_HOME=str(cuda_home), PATH=path)


def _run(env, out_dir, **extra):
    return subprocess.run(
        ["bash", str(SCRIPT), str(out_dir)],
        capture_output=True,
        encoding="utf-8",
        timeout=120,
        env=dict(env, **extra),
        cwd=REPO,
    )


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_step_list_is_sane():
    out = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, encoding="utf-8")
    assert out.returncode == 0
    steps = [line.split(":") for line in out.stdout.split()]
    names = [name for name, _ in steps]
    limits = {name: int(limit) for name, limit in steps}
    # Correctness and the benchmark first: a short budget still gets them.
    assert names == [
        "wheels", "build", "info", "check", "fuzz", "bench", "overhead", "ablate", "copies",
        "probe", "memcheck", "racecheck", "tests", "timm", "perf",
    ]  # fmt: skip
    assert len(set(names)) == len(names)
    assert names.index("build") < min(names.index(n) for n in names if n not in ("wheels", "build"))
    assert all(0 < limit <= 300 for limit in limits.values())
    assert limits["tests"] == 120
    text = SCRIPT.read_text()
    assert "GPU_CHECK_BUDGET:-470" in text  # the whole run stays under 8 minutes
    assert "pip install --no-build-isolation --no-deps --no-index -e ." in text
    for needle in ("memcheck", "racecheck", "spio bench --quick", "spio info", "-m cuda"):
        assert needle in text.replace('"cuda and not slow"', "-m cuda"), needle


def test_full_run_with_stand_ins_passes_and_prints_summary_last(stand_ins, tmp_path):
    out_dir = tmp_path / "out"
    out = _run(stand_ins, out_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    tail = out.stdout.strip().splitlines()
    assert tail[-1].startswith("total") and "PASS" in tail[-1]
    listed = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True)
    steps_run = len(listed.stdout.split())
    summary = {line.split()[0]: line for line in tail[-1 - steps_run : -1]}  # a line a step
    assert set(summary) == {step.split(":")[0] for step in listed.stdout.split()}
    wheels = list(REPO.glob(".whl/*.whl"))  # git-ignored: present after fetch_gpu_wheels.sh
    assert (f"PASS: {len(wheels)} wheels" if wheels else "n/a") in summary["wheels"]
    steps = ("build", "info", "check", "bench", "overhead", "ablate", "probe", "memcheck", "tests",
             "timm", "racecheck", "perf")  # fmt: skip
    for step in steps:
        assert " PASS" in summary[step], summary[step]
        assert (out_dir / f"{step}.log").is_file()
    assert "3 passed" in summary["tests"]
    # whole, in the summary: the eager ratios, then those of the steps in CUDA graphs
    assert "PASS: spio=0.835 faster=1.002 graphed: spio=1.250 faster=1.300" in summary["timm"]
    memcheck_log = (out_dir / "memcheck.log").read_text()
    assert "--tool memcheck" in memcheck_log and "kns=spio_ " in memcheck_log
    # The perf step samples afresh (the stand-in sampler writes nothing).
    assert "perf       PASS: 0 rows" in summary["perf"]
    order = (out_dir / "tests_order.txt").read_text().split()
    assert sorted(order) == sorted(["tests/a.py::test_x[1]", "tests/a.py::test_x[2]",
                                    "tests/b.py::test_y"])  # fmt: skip
    assert {order[0].split("[")[0], order[1].split("[")[0]} == {"tests/a.py::test_x",
                                                                "tests/b.py::test_y"}  # fmt: skip
    # Never run on a GPU (bulk and tensor copies): they may hang, so they run first, in a
    # process of their own with a time cap (tests_tensor_copies.txt), then the others.
    copies = (out_dir / "tests_tensor_copies.txt").read_text().split()
    assert copies == ["tests/a.py::test_bulk_copy[1]", "tests/c.py::test_tma_rows[1]"]
    runs = [line for line in (out_dir / "tests.log").read_text().splitlines() if "ran:" in line]
    assert len(runs) == 2 and "test_tma_rows" in runs[0] and "test_x" in runs[1], runs
    assert "PASS: copies 3 passed/2; 3 passed/3 " in summary["tests"]  # (stand-in counts)
    assert (out_dir / "summary.txt").read_text().strip().splitlines()[-1] == tail[-1]


def test_a_failed_step_is_reported_and_later_steps_still_run(stand_ins, tmp_path):
    out = _run(stand_ins, tmp_path / "out", FAKE_BENCH_RC="3")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if "gpu_check summary" in line) :]
    bench = next(line for line in lines if line.startswith("bench "))
    assert "FAIL (exit 3)" in bench
    tests = next(line for line in lines if line.startswith("tests "))
    assert "PASS" in tests
    assert lines[-1].startswith("total") and "FAIL" in lines[-1]


def test_steps_are_skipped_when_the_budget_is_spent(stand_ins, tmp_path):
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_BUDGET="0")
    assert out.returncode == 1
    assert out.stdout.count("SKIPPED (budget spent)") >= 9
    # timm and perf gather numbers: a budget spent before them alone does not fail the run.
    out = _run(stand_ins, tmp_path / "late", GPU_CHECK_BUDGET="0", GPU_CHECK_ONLY="timm perf")
    assert out.returncode == 0, out.stdout
    summary = (tmp_path / "late" / "summary.txt").read_text()
    assert summary.count("SKIPPED (budget spent)") == 2 and "total      PASS" in summary


def test_timm_is_not_started_with_less_time_than_it_needs(stand_ins, tmp_path):
    """With 20 s or more left (the budget check's floor), timm had started, been cut off, and
    failed the run as a TIMEOUT, where a budget spent before it does not."""
    out = _run(stand_ins, tmp_path / "out", FAKE_HANG="timm_benchmark.py", GPU_CHECK_ONLY="timm",
               GPU_CHECK_BUDGET="30")  # fmt: skip
    assert out.returncode == 0, out.stdout
    timm = [line for line in out.stdout.splitlines() if line.startswith("timm ")][-1]
    assert re.search(r"n/a: \d+s left, under the 65s it needs", timm), timm
    assert int(timm.split()[-1]) <= 2, timm  # not started
    assert "total      PASS" in out.stdout


def test_overhead_keeps_within_its_limit_when_its_scripts_ignore_term(stand_ins, tmp_path):
    """Two scripts, the launch bench given at most 20 s and the op bench the rest, each with
    10 s to die: the step had once split its limit less 10 s in halves and run 10 s past it."""
    stubborn = 'if [[ "$*" == *bench_* ]]; then trap "" TERM; sleep 60; fi\n'
    text = FAKE_PYTHON.format(real=sys.executable)
    version = 'if [[ "$1 $2" == "--version " ]]'
    slow = _executable(tmp_path / "python-slow", text.replace(version, stubborn + version))
    out = _run(dict(stand_ins, PYTHON=str(slow)), tmp_path / "out", GPU_CHECK_ONLY="overhead",
               GPU_CHECK_BUDGET="34")  # fmt: skip
    line = [line for line in out.stdout.splitlines() if line.startswith("overhead ")][-1]
    limit = int(re.search(r"overhead \(limit (\d+)s\)", out.stdout).group(1))
    assert "TIMEOUT" in line and int(line.split()[-1]) <= limit + 1, line


def test_overhead_is_not_started_with_too_little_time(stand_ins, tmp_path):
    """At a limit of 20 or 21 s each script's half had been 0 s, and `timeout 0` is no limit."""
    out = _run(stand_ins, tmp_path / "out", FAKE_HANG="bench_launch.py", GPU_CHECK_ONLY="overhead",
               GPU_CHECK_BUDGET="21")  # fmt: skip
    assert out.returncode == 0, out.stdout
    line = [line for line in out.stdout.splitlines() if line.startswith("overhead ")][-1]
    assert re.search(r"n/a: \d+s left, too few to measure", line), line
    assert int(line.split()[-1]) <= 2, line  # not started


def test_python_output_is_unbuffered_so_a_killed_step_keeps_its_lines(stand_ins, tmp_path):
    """Python buffers what it writes to a log file: a step killed at its time limit lost every
    line it had printed, unless the environment happened to set PYTHONUNBUFFERED."""
    env = {k: v for k, v in stand_ins.items() if k != "PYTHONUNBUFFERED"}
    _run(env, tmp_path / "out", GPU_CHECK_ONLY="info")
    assert "PYTHONUNBUFFERED=1" in (tmp_path / "out" / "info.log").read_text()


def test_collecting_the_tests_cut_off_is_a_timeout_and_no_bulk_test_no_empty_argument(
    stand_ins, tmp_path
):
    """Collection cut off by its time limit was reported as "FAIL: no cuda tests collected";
    without a bulk test, the ordering passed pytest an empty argument (all tests)."""
    out = _run(stand_ins, tmp_path / "hang", GPU_CHECK_ONLY="tests", GPU_CHECK_TEST_SECONDS="6",
               FAKE_COLLECT_HANG="1")  # fmt: skip
    tests = next(line for line in out.stdout.splitlines() if line.startswith("tests "))
    assert "TIMEOUT" in tests and "collecting the tests timed out" in tests, tests
    _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="tests", FAKE_NO_BULK="1")
    order = (tmp_path / "out" / "tests_order.txt").read_text()
    assert "" not in order.splitlines() and len(order.splitlines()) == 3, repr(order)
    assert (tmp_path / "out" / "tests_tensor_copies.txt").read_text() == ""
    log = (tmp_path / "out" / "tests.log").read_text()
    assert log.count("ran:") == 1 and "tensor-copy" not in log


@pytest.mark.parametrize(
    "summary,status",
    [
        ("2 passed", "PASS (sampled): copies time limit: 2 passed/2; time limit: 2 passed/3"),
        ("1 failed, 1 passed", "TIMEOUT"),
    ],
)
def test_tests_step_stops_at_its_time_limit(stand_ins, tmp_path, summary, status):
    # 30 s: 10 s for pytest to report after SIGINT, half of the other 20 for the tensor-copy
    # tests (they hang too, and are stopped first), the rest for the others.
    out = _run(stand_ins, tmp_path / "out", FAKE_PYTEST_HANG=summary, GPU_CHECK_TEST_SECONDS="30")
    tests = [line for line in out.stdout.splitlines() if line.startswith("tests ")][-1]
    assert status[:64] in tests  # the summary table's width; the log line has it whole
    assert f"tests: {status}" in out.stdout
    assert out.returncode == (0 if status.startswith("PASS") else 1)


def test_tensor_copy_tests_that_hang_are_cut_off_and_the_others_still_run(stand_ins, tmp_path):
    """The tensor-copy tests run first, capped at half the step: hung there, they are
    stopped (a sample, not a failure) and the other tests get the rest of the step."""
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="tests", GPU_CHECK_TEST_SECONDS="30",
               FAKE_COPIES_HANG="1")  # fmt: skip
    tests = next(line for line in out.stdout.splitlines() if line.startswith("tests "))
    assert "PASS (sampled): copies time limit: 1 passed/2; 3 passed/3 " in tests
    log = (tmp_path / "out" / "tests.log").read_text()
    # Half of what the step has left once its tests are listed (30 s less its 10 s reserve):
    # 10 s, or a second or so less where listing them was slow (CI ran it at 9).
    capped = re.search(r"tensor-copy cuda tests first, for at most (\d+)s", log)
    assert capped and 5 <= int(capped.group(1)) <= 10, log
    assert "ran: " in log and "test_x" in log.split("KeyboardInterrupt")[1]
    assert out.returncode == 0


def test_the_copies_step_runs_only_when_named(stand_ins, tmp_path):
    """The tensor copies on every bench layer are a second call's work: n/a in a full run (whose
    bench runs without them), and with GPU_CHECK_ONLY naming it, the bench with SPIO_TMA into a
    folder of its own, then one ablate call over every layer of the table with the plain
    kernels and both tensor-copy variants."""
    from spio.bench.layers import layer_table

    out = _run(stand_ins, tmp_path / "full")
    copies = next(line for line in out.stdout.splitlines() if line.startswith("copies "))
    assert "n/a (opt-in: GPU_CHECK_ONLY must name it)" in copies
    assert not (tmp_path / "full" / "copies.log").exists()
    assert "bench stand-in (SPIO_TMA=unset)" in (tmp_path / "full" / "bench.log").read_text()
    out = _run(stand_ins, tmp_path / "named", GPU_CHECK_ONLY="copies")
    copies = next(line for line in out.stdout.splitlines() if line.startswith("copies "))
    assert " PASS" in copies, copies
    log = (tmp_path / "named" / "copies.log").read_text()
    bench = f"bench stand-in (SPIO_TMA=loads+stores): -m spio bench --quick --out {tmp_path}"
    assert f"{bench}/named/bench_tma" in log
    assert log.index("bench stand-in") < log.index("ablate_kernel.py")
    call = next(line for line in log.splitlines() if "ablate_kernel.py" in line)
    argv = call.split("ablate_kernel.py ")[1].split()
    assert argv[:6] == ["--n", "128", "--repeats", "30", "--variants", "full"]
    assert argv[6:9] == ["tma", "tma-stores", "--layer"] and argv[9:]  # (the stand-in's list)
    text = (REPO / "scripts" / "gpu_check.sh").read_text()
    body = text[text.index("step_copies() {") :]
    assert "layers=$(bench_layers " in body[: body.index("\n}\n")]
    helper = text[text.index("bench_layers() {") :]
    listing = re.search(r'"(from spio\.bench\.layers import layer_table[^"]*)"', helper)
    assert listing, "bench_layers lists the bench layers"
    names = subprocess.run([sys.executable, "-c", listing[1]], capture_output=True, text=True)
    assert names.stdout.split() == [layer.name for layer in layer_table()]
    args = load_script("ablate_kernel").parse_args([*argv[:9], *names.stdout.split()])
    assert args.variants == ["full", "tma", "tma-stores"] and len(args.layer) == len(layer_table())


def test_the_fuzz_step_runs_only_when_named(stand_ins, tmp_path):
    """Random kernels on the GPU are a second call's work: n/a in a full run; named, the fuzz
    on the GPU until 45 s before the step's limit, seeded by the date, its summary line the
    step's status."""
    out = _run(stand_ins, tmp_path / "full")
    fuzz = next(line for line in out.stdout.splitlines() if line.startswith("fuzz "))
    assert "n/a (opt-in: GPU_CHECK_ONLY must name it)" in fuzz
    out = _run(stand_ins, tmp_path / "named", GPU_CHECK_ONLY="fuzz", GPU_CHECK_FUZZ_SECONDS="105")
    fuzz = next(line for line in out.stdout.splitlines() if line.startswith("fuzz "))
    assert "PASS: kernels 0/7 failed, layers 0/3 failed" in fuzz, fuzz
    log = (tmp_path / "named" / "fuzz.log").read_text()
    # 60 s of the 105 to draw cases in: two thirds of it kernels, then layer calls
    for script, minutes in (("fuzz_kernels", "0.67"), ("fuzz_layers", "0.33")):
        call = next(line for line in log.splitlines() if f"{script}.py" in line)
        argv = call.split(f"{script}.py ")[1].split()
        assert argv[:4] == ["--device", "cuda", "--minutes", minutes]
        assert argv[4] == "--seed" and re.fullmatch(r"20\d{6}", argv[5]), argv
        args = load_script(script).parse_args(argv)
        assert (args.device, args.minutes) == ("cuda", float(minutes))
    out = _run(stand_ins, tmp_path / "failed", GPU_CHECK_ONLY="fuzz", FAKE_LAYER_FAILURES="2")
    fuzz = next(line for line in out.stdout.splitlines() if line.startswith("fuzz "))
    assert "FAIL (exit 1): kernels 0/7 failed, layers 2/5 failed" in fuzz, fuzz
    out = _run(stand_ins, tmp_path / "short", GPU_CHECK_ONLY="fuzz", GPU_CHECK_FUZZ_SECONDS="50")
    fuzz = next(line for line in out.stdout.splitlines() if line.startswith("fuzz "))
    assert "50s left, under the 60s it needs" in fuzz, fuzz


def test_a_broken_install_skips_the_steps_after_it(stand_ins, tmp_path):
    """When `spio info` fails (e.g. the driver extension does not import), nothing after it can
    work: those steps are skipped instead of spending GPU time."""
    out = _run(stand_ins, tmp_path / "out", FAKE_INFO_RC="1")
    assert out.returncode == 1
    summary = out.stdout[out.stdout.index("gpu_check summary") :]
    assert summary.count("SKIPPED (info failed)") == 10  # check .. perf
    assert not (tmp_path / "out" / "bench.log").exists()


def test_no_cuda_gpu_skips_the_steps_after_info(stand_ins, tmp_path):
    """`spio info` passes without a GPU (spio works on the CPU); the GPU check must not."""
    out = _run(stand_ins, tmp_path / "out", FAKE_NO_CUDA="1")
    assert out.returncode == 1
    summary = out.stdout[out.stdout.index("gpu_check summary") :]
    assert "info       FAIL (exit 1)" in summary
    assert summary.count("SKIPPED (info failed)") == 10


def test_an_ablate_part_out_of_time_is_a_timeout(stand_ins, tmp_path):
    """Not "FAIL (exit 1)" from the parts skipped after it; and within the step's limit."""
    out = _run(
        stand_ins, tmp_path / "out", FAKE_ABLATE_HANG="1", GPU_CHECK_ONLY="ablate",
        GPU_CHECK_BUDGET="25",
    )  # fmt: skip
    ablate = [line for line in out.stdout.splitlines() if line.startswith("ablate ")][-1]
    # The step's limit is the budget left when it starts: 25 s less the script's start-up, which
    # takes a second or more on a loaded machine (it had read 20 s where the test expected 21).
    match = re.search(r"TIMEOUT after (\d+)s", ablate)
    assert match, ablate
    limit = int(match.group(1))
    assert 20 <= limit <= 25
    assert int(ablate.split()[-1]) <= limit


def test_ablate_fails_when_the_bench_layers_cannot_be_listed(stand_ins, tmp_path):
    """The every-layer line (the step's last) needs the list of bench layers: without it the
    step says so and fails, instead of skipping the line without a word."""
    out_dir = tmp_path / "out"
    out = _run(stand_ins, out_dir, FAKE_NO_LAYERS="1", GPU_CHECK_ONLY="ablate")
    ablate = [line for line in out.stdout.splitlines() if line.startswith("ablate ")][-1]
    assert "FAIL" in ablate, ablate
    assert out.returncode != 0
    log = (out_dir / "ablate.log").read_text()
    assert "listing the bench layers failed" in log
    # The other lines, before it, still ran.
    assert log.count("ablate_kernel.py") >= 3, log


@pytest.mark.parametrize("seed", sorted(REPO.glob("docs/perf/**/perf_samples.csv")),
                         ids=lambda p: p.parent.name)  # fmt: skip
def test_perf_step_continues_from_a_seed_csv(stand_ins, tmp_path, seed):
    """Sample by sample, in today's columns: the CSVs of earlier runs lack the variant column,
    and perf_sample, which refuses to extend a CSV of other columns, had failed on a copy."""
    from spio.kernels import perf_samples as ps

    rows = len(seed.read_text().splitlines()) - 1
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_PERF_SEED=str(seed), GPU_CHECK_ONLY="perf")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"perf       PASS: 0 rows (+{rows} seeded)" in out.stdout
    copy = tmp_path / "out" / "perf_samples.csv"
    ps.check_sample_columns(copy)  # perf_sample can extend it
    assert ps.read_samples(copy)[0] == ps.read_samples(seed)[0]


@pytest.mark.parametrize("seeded", [False, True])
def test_perf_note_counts_the_rows_this_run_sampled(stand_ins, tmp_path, seeded):
    """Not the seed's rows as well (it had said "2731 rows" for 3 new ones)."""
    seed = next(REPO.glob("docs/perf/*/perf_samples.csv"))
    extra = {"GPU_CHECK_PERF_SEED": str(seed)} if seeded else {}
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="perf", FAKE_PERF_ROWS="3", **extra)
    perf = [line for line in out.stdout.splitlines() if line.startswith("perf ")][-1]
    assert re.search(r"PASS: 3 rows( \(\+\d+ seeded\))? +\d+$", perf), perf


def test_a_seed_that_cannot_be_read_still_leaves_a_sweep(stand_ins, tmp_path):
    """A mistyped GPU_CHECK_PERF_SEED had ended the step without sampling anything: the sweep
    now starts from nothing, and the summary says the seed was not read."""
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="perf", FAKE_PERF_ROWS="3",
               GPU_CHECK_PERF_SEED=str(tmp_path / "no_such.csv"))  # fmt: skip
    perf = [line for line in out.stdout.splitlines() if line.startswith("perf ")][-1]
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"PASS: 3 rows; seed {tmp_path / 'no_such.csv'} not read"[:60] in perf, perf


@pytest.mark.parametrize(
    "limits", [{}, {"GPU_CHECK_PERF_SECONDS": "500", "GPU_CHECK_BUDGET": "600"}]
)
def test_the_perf_steps_arguments_are_perf_samples(
    stand_ins, tmp_path, monkeypatch, capsys, limits
):
    """The arguments the step gives perf_sample.py (printed by the stand-in) parse: run with them
    on a machine without a GPU, perf_sample gets past its argument checks to its no-GPU exit.
    With a perf step longer than perf_sample's longest budget too (it had failed at once)."""
    import shlex

    import torch

    from tests.conftest import load_script

    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="perf", **limits)
    log = (tmp_path / "out" / "perf.log").read_text()
    line = next(line for line in log.splitlines() if "perf_sample.py" in line)
    argv = shlex.split(line.split("perf_sample.py", 1)[1])
    assert "--round" in argv and out.returncode == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_script("perf_sample").main(argv) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_a_signal_before_the_summary_prints_no_earlier_runs(stand_ins, tmp_path):
    """A TERM while the run starts (before its summary is begun) in an OUT_DIR used before: the
    earlier run's summary had been printed, as this run's, with PASS lines and a second total."""
    import signal
    import time

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "summary.txt").write_text("gpu_check summary (OLD RUN)\ntotal      PASS  100\n")
    slow = _executable(tmp_path / "slow_python", "#!/usr/bin/env bash\nsleep 3\necho Python 3\n")
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), str(out_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        encoding="utf-8",
        env=dict(stand_ins, PYTHON=str(slow)),
        cwd=REPO,
        start_new_session=True,
    )
    try:
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)  # the script alone: its --version call runs on
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out
    assert "stopped by a signal" in out
    assert "OLD RUN" not in out and "PASS" not in out, out
    assert not (out_dir / "summary.txt").exists()


def test_archive_packs_the_output_folder(stand_ins, tmp_path):
    import tarfile

    archive = tmp_path / "g.tgz"
    seed = next(REPO.glob("docs/perf/*/perf_samples.csv"))
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ARCHIVE=str(archive),
               GPU_CHECK_PERF_SEED=str(seed))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    with tarfile.open(archive) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"summary.txt", "bench.log", "tests.log", "perf_samples.csv"} <= names
    assert out.stdout.strip().splitlines()[-1].startswith("total")  # the summary still last


def test_only_the_selected_steps_run(stand_ins, tmp_path):
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="build info perf")
    assert out.returncode == 0, out.stdout + out.stderr
    summary = out.stdout[out.stdout.index("gpu_check summary") :]
    status = {line.split()[0]: line.split()[1] for line in summary.splitlines()[2:] if line}
    assert all(status[step].startswith("PASS") for step in ("build", "info", "perf")), summary
    assert summary.count("not selected (GPU_CHECK_ONLY)") == 12  # the opt-in steps among them
    assert not (tmp_path / "out" / "bench.log").exists()


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("GPU_CHECK_BUDGET", "10s", "GPU_CHECK_BUDGET must be a whole number of seconds"),
        ("GPU_CHECK_BUDGET", "-5", "got '-5'"),
        ("GPU_CHECK_BUDGET", "abc", "got 'abc'"),
        ("GPU_CHECK_TEST_SECONDS", "2m", "GPU_CHECK_TEST_SECONDS must be"),
        ("GPU_CHECK_ABLATE_SECONDS", "08", "(digits, no leading 0), got '08'"),
        ("GPU_CHECK_PERF_SECONDS", " 9", "GPU_CHECK_PERF_SECONDS must be"),
        ("GPU_CHECK_TIMM_MIN_SECONDS", "1.5", "GPU_CHECK_TIMM_MIN_SECONDS must be"),
        ("GPU_CHECK_ONLY", "wheels build pref", "GPU_CHECK_ONLY names no step 'pref'; the steps"),
    ],
)
def test_a_malformed_setting_ends_the_run_before_any_step(
    stand_ins, tmp_path, setting, value, message
):
    """A budget of "10s" had failed bash's arithmetic, skipped every step and passed (exit 0);
    a step misspelt in GPU_CHECK_ONLY had left the run to the other steps named."""
    out = _run(stand_ins, tmp_path / "out", **{setting: value})
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.startswith("gpu_check: ") and message in out.stderr
    assert out.stderr.count("\n") == 1


def test_help_and_bad_arguments(tmp_path):
    """--help had been taken for OUT_DIR (a folder named "--help", then every step's errors);
    an OUT_DIR that cannot be written, likewise."""

    def run(*args):
        return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)

    for flag in ("--help", "-h"):
        out = run(flag)
        assert out.returncode == 0 and "scripts/gpu_check.sh [OUT_DIR]" in out.stdout
        assert "GPU_CHECK_BUDGET" in out.stdout and not out.stdout.startswith("#")
    assert not (REPO / "--help").exists()
    for args, message in (
        (["--nope"], "unknown option '--nope'"),
        ([str(tmp_path / "a"), str(tmp_path / "b")], "one OUT_DIR at most, got 2 arguments"),
        (["/proc/spio-gpu-check"], "cannot write OUT_DIR '/proc/spio-gpu-check'"),
    ):
        out = run(*args)
        assert out.returncode == 2 and out.stderr.startswith("gpu_check: ")
        assert message in out.stderr and out.stdout == ""


def test_a_run_cut_off_still_leaves_the_summary_of_the_steps_it_finished(stand_ins, tmp_path):
    """The device run wraps the script in `timeout`: summary.txt gets each step's line as the
    step ends, not only at the end."""
    import signal
    import tarfile
    import time

    out_dir = tmp_path / "out"
    archive = tmp_path / "g.tgz"
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), str(out_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(stand_ins, FAKE_HANG="timm_benchmark.py", GPU_CHECK_ARCHIVE=str(archive)),
        cwd=REPO,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (out_dir / "timm.log").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (out_dir / "timm.log").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` does
        proc.wait(timeout=30)
    lines = (out_dir / "summary.txt").read_text().splitlines()
    assert lines[1].startswith("gpu_check summary")
    assert lines[2].split() == ["step", "status", "sec"]
    steps = {line.split()[0]: line for line in lines[3:]}
    assert list(steps)[:2] == ["wheels", "build"] and "timm" not in steps
    assert list(steps)[-1] == "total" and "STOPPED by a signal" in steps["total"]
    for step in ("build", "info", "check", "bench", "ablate", "memcheck", "racecheck", "tests"):
        assert " PASS" in steps[step], steps[step]
    # The archive too (GPU_CHECK_ARCHIVE): packed after every step and when stopped; it had
    # been packed only at the end, so a run cut off brought back no log.
    with tarfile.open(archive) as tar:
        names = {Path(n).name for n in tar.getnames()}
        packed = tar.extractfile("./summary.txt").read().decode()
    assert {"summary.txt", "bench.log", "tests.log", "timm.log"} <= names
    assert packed == (out_dir / "summary.txt").read_text()
    assert not Path(str(archive) + ".part").exists()


@pytest.mark.parametrize(
    "hang,step",
    [("import platformdirs", "info"), ("import timm", "timm"), ("--help", "memcheck")],
)
def test_a_steps_extra_calls_keep_within_its_limit(stand_ins, tmp_path, hang, step):
    """info's import checks, timm's `import timm` and the sanitizer's --help had their own 30-60 s
    timeouts on top of the step's limit."""
    out = _run(stand_ins, tmp_path / "out", FAKE_HANG=hang, GPU_CHECK_ONLY=step,
               GPU_CHECK_BUDGET="22", GPU_CHECK_TIMM_MIN_SECONDS="0")  # fmt: skip
    line = [line for line in out.stdout.splitlines() if line.startswith(f"{step} ")][-1]
    limit = int(re.search(rf"{step} \(limit (\d+)s\)", out.stdout).group(1))
    # timeout's kill grace (-k 5) and a loaded machine's start-up may add seconds (a fresh-clone
    # CI run of 2026-12-04 took 34 s for a limit of 22, on a machine where it takes 22-25); the
    # calls' own timeouts had added 30-60
    assert limit <= 22 and int(line.split()[-1]) <= limit + 15, line


def test_a_signal_to_the_script_ends_the_running_step(stand_ins, tmp_path):
    """`timeout` around the script signals its process group, which the step's own `timeout`
    (a process group of its own) is not in: the step went on after the script had gone."""
    import signal
    import time

    out_dir = tmp_path / "out"
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), str(out_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        encoding="utf-8",
        env=dict(stand_ins, FAKE_HANG="timm_benchmark.py"),
        cwd=REPO,
        start_new_session=True,
    )
    fake_python = stand_ins["PYTHON"]

    def step_running() -> bool:
        ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, encoding="utf-8")
        return any(fake_python in line and "timm_benchmark.py" in line
                   for line in ps.stdout.splitlines())  # fmt: skip

    try:
        deadline = time.monotonic() + 90
        while not step_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert step_running(), "the timm step never started"
        os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` does
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while step_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not step_running(), "the timm step outlived the script"
    assert proc.returncode == 143, out
    assert "stopped by a signal; the running step's processes are ended" in out
    summary = (out_dir / "summary.txt").read_text()
    assert "tests " in summary and "timm " not in summary
    # The summary is still printed last (the run tool shows the output's tail), with its end.
    assert out.rstrip().endswith(summary.rstrip()), out
    assert summary.rstrip().splitlines()[-1].startswith("total      STOPPED by a signal")


def test_the_steps_after_wheels_import_from_where_it_installed(stand_ins, tmp_path):
    """The wheels step installs into a folder of the run's own (a fixed /tmp/site, made first by
    another user, would keep their packages: a helper's security audit); every later step's
    Python must find them there (PYTHONPATH), now that steps run in a subshell whose exports do
    not come back; the folder is removed at the end."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    shutil.copy(SCRIPT, repo / "scripts" / "gpu_check.sh")
    (repo / ".whl").mkdir()
    (repo / ".whl" / "platformdirs-0-py3-none-any.whl").write_text("")
    out = subprocess.run(
        ["bash", str(repo / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        encoding="utf-8",
        timeout=120,
        env=dict(
            stand_ins, GPU_CHECK_ONLY="wheels info", PYTHONPATH="", TMPDIR=str(tmp_path / "tmp")
        ),
        cwd=repo,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "wheels     PASS: 1 wheels" in out.stdout
    info = (tmp_path / "out" / "info.log").read_text()
    (site,) = re.findall(r"PYTHONPATH=(\S*/spio-gpu-site\.\w+)\)", info)
    assert Path(site).parent == tmp_path / "tmp" and not Path(site).exists()


def test_the_tests_step_order_is_kept_where_pytest_would_group_fixture_set_ups(tmp_path):
    """The tests step runs its round-robin order with SPIO_TEST_ORDER (tests/conftest.py):
    without it pytest moves the emulator primitives' `gpu` cases (a session fixture's parameter)
    next to each other, as H200 run 7 found; with it the file's order stands."""
    ids = [
        "tests/bench/test_run_cuda.py::test_small_sweep_times_every_pass_and_impl",
        "tests/emulator/test_primitives.py::test_ldmatrix_feeds_mma_k16[gpu]",
        "tests/bench/test_run_cuda.py::test_event_timing_measures_gpu_time_not_launch_overhead",
        "tests/emulator/test_primitives.py::test_cp_async_partial_zero_fill[gpu]",
    ]
    order = tmp_path / "order.txt"
    order.write_text("\n".join(ids) + "\n")

    def collected(**env) -> list[str]:
        command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        inherited = {k: v for k, v in os.environ.items() if k != "SPIO_TEST_ORDER"}
        out = subprocess.run(
            [*command, *ids], cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**inherited, **env},
        )  # fmt: skip
        return [line for line in out.stdout.splitlines() if "::" in line]

    assert collected() == [ids[0], ids[1], ids[3], ids[2]]  # grouped by the fixture's parameter
    assert collected(SPIO_TEST_ORDER=str(order)) == ids
    assert 'SPIO_TEST_ORDER="$list"' in (REPO / "scripts" / "gpu_check.sh").read_text()


def test_fetching_wheels_keeps_the_earlier_ones_unless_it_gets_new(tmp_path):
    """`fetch_gpu_wheels.sh --help` had deleted .whl/'s wheels, then failed in pip; so had any
    download that failed. Now a bad argument stops first, and .whl/ changes only on success."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "fetch_gpu_wheels.sh"
    shutil.copy(REPO / "scripts" / "fetch_gpu_wheels.sh", script)
    (tmp_path / ".whl").mkdir()
    earlier = tmp_path / ".whl" / "earlier-1.0-py3-none-any.whl"
    earlier.write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in pip: `download ... --dest D` writes one wheel into D, or fails (FAKE_PIP_FAIL).
    _executable(
        bin_dir / "python3",
        '#!/usr/bin/env bash\n[[ -n "${FAKE_PIP_FAIL:-}" ]] && exit 1\n'
        'while (($#)); do [[ $1 == --dest ]] && touch "$2/new-2.0-py3-none-any.whl"; shift; done\n',
    )
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")

    def run(*args, **extra):
        return subprocess.run(
            ["bash", str(script), *args], capture_output=True, text=True, env=dict(env, **extra)
        )

    out = run("--help")
    assert out.returncode == 0 and "fetch_gpu_wheels.sh [PYTHON_VERSION]" in out.stdout
    for args in (["3.x"], ["3.12", "3.11"], ["--nope"]):
        out = run(*args)
        assert (
            out.returncode == 2 and "PYTHON_VERSION must be one version such as 3.12" in out.stderr
        )
    assert run("3.12", FAKE_PIP_FAIL="1").returncode != 0
    assert [p.name for p in (tmp_path / ".whl").iterdir()] == [earlier.name]
    out = run()
    assert out.returncode == 0, out.stderr
    assert [p.name for p in (tmp_path / ".whl").iterdir()] == ["new-2.0-py3-none-any.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".whl", "bin", "scripts"]


# ---- steps' budgets and the exit statuses of their secondary calls (mutation testing) ----


def _line(out, step):
    return [line for line in out.stdout.splitlines() if line.startswith(f"{step} ")][-1]


def test_a_step_gets_only_what_the_steps_before_it_left(stand_ins, tmp_path):
    """`left` is the budget less the time spent: check spends the whole budget, bench gets none."""
    out = _run(
        stand_ins,
        tmp_path / "out",
        GPU_CHECK_ONLY="check bench",
        GPU_CHECK_BUDGET="25",
        FAKE_HANG="spio check",
    )
    assert "TIMEOUT" in _line(out, "check"), out.stdout
    assert "SKIPPED (budget spent)" in _line(out, "bench"), out.stdout
    assert not (tmp_path / "out" / "bench.log").exists()


def test_a_step_is_skipped_with_under_20_seconds_left(stand_ins, tmp_path):
    """The documented floor is 20 s."""
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="check", GPU_CHECK_BUDGET="15")
    assert "SKIPPED (budget spent)" in _line(out, "check"), out.stdout
    assert out.returncode == 1


def test_the_archive_is_kept_when_tar_reports_a_file_changed(stand_ins, tmp_path):
    """tar's exit 1 (a file changed as it read it) still leaves an archive."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    import shutil

    real = shutil.which("tar")
    _executable(bin_dir / "tar", f'#!/usr/bin/env bash\n"{real}" "$@"\nexit 1\n')
    env = dict(stand_ins, PATH=f"{bin_dir}:{stand_ins['PATH']}")
    archive = tmp_path / "g.tgz"
    out = _run(env, tmp_path / "out", GPU_CHECK_ONLY="info", GPU_CHECK_ARCHIVE=str(archive))
    assert out.returncode == 0, out.stdout + out.stderr
    with tarfile.open(archive) as tar:
        assert "./info.log" in tar.getnames()
    assert not Path(str(archive) + ".part").exists()


def _python_with(tmp_path, snippet):
    """The stand-in python with `snippet` (bash) run first for every call but the inline ones."""
    text = FAKE_PYTHON.format(real=sys.executable)
    version = 'if [[ "$1 $2" == "--version " ]]'
    return str(_executable(tmp_path / "python-x", text.replace(version, snippet + version, 1)))


def test_a_failing_tensor_copy_test_fails_the_tests_step(stand_ins, tmp_path):
    """The tensor-copy tests' own pytest run failing fails the step (and the run)."""
    fail = (
        'if [[ "$1 $2" == "-m pytest" && " $* " != *" --collect-only "* '
        '&& "$*" == *test_tma_rows* ]]; then echo "1 failed, 1 passed in 0.1s"; exit 1; fi\n'
    )
    env = dict(stand_ins, PYTHON=_python_with(tmp_path, fail))
    out = _run(env, tmp_path / "out", GPU_CHECK_ONLY="tests")
    want = "FAIL (exit 1): copies 1 failed, 1 passed/2; 3 passed/3"
    assert want in _line(out, "tests"), out.stdout
    assert out.returncode == 1


def test_a_failing_launch_bench_fails_the_overhead_step(stand_ins, tmp_path):
    """bench_launch.py's exit status counts, not only bench_op_overhead.py's."""
    failing = 'if [[ "$*" == *bench_launch.py* ]]; then exit 3; fi\n'
    env = dict(stand_ins, PYTHON=_python_with(tmp_path, failing))
    out = _run(env, tmp_path / "out", GPU_CHECK_ONLY="overhead")
    assert "FAIL (exit 3)" in _line(out, "overhead"), out.stdout
    assert out.returncode == 1


def test_a_failing_ablate_part_fails_the_ablate_step(stand_ins, tmp_path):
    """An ablate_kernel.py call that fails (not out of time) fails the step."""
    failing = 'if [[ "$*" == *"--layer 128c_32x32_1x3"* ]]; then exit 4; fi\n'
    env = dict(stand_ins, PYTHON=_python_with(tmp_path, failing))
    out = _run(env, tmp_path / "out", GPU_CHECK_ONLY="ablate")
    assert "FAIL (exit 4)" in _line(out, "ablate"), out.stdout
    log = (tmp_path / "out" / "ablate.log").read_text()
    assert log.count("ablate_kernel.py") >= 4  # the rest ran


def test_a_failing_bench_fails_the_copies_step(stand_ins, tmp_path):
    """The copies step's bench with tensor copies failing fails the step, kernels passing or not."""
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="copies", FAKE_BENCH_RC="3")
    assert "FAIL (exit 3): bench exit 3, kernels exit 0" in _line(out, "copies"), out.stdout
    assert out.returncode == 1


def test_perf_sample_gets_the_step_limit_less_20_seconds(stand_ins, tmp_path):
    """perf_sample.py's --budget-s keeps 20 s of the step's limit for writing the CSV."""
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="perf")
    limit = int(re.search(r"perf \(limit (\d+)s\)", out.stdout).group(1))
    log = (tmp_path / "out" / "perf.log").read_text()
    line = next(line for line in log.splitlines() if "perf_sample.py" in line)
    argv = shlex.split(line.split("perf_sample.py", 1)[1])
    assert int(argv[argv.index("--budget-s") + 1]) == limit - 20


def test_a_sanitizer_that_hangs_is_cut_off_within_the_steps_limit(stand_ins, tmp_path):
    """After --help used up the step's time, the sanitizer run still gets `timeout 1`, never
    `timeout 0` (no limit)."""
    sanitizer = Path(stand_ins["CUDA_HOME"]) / "bin" / "compute-sanitizer"
    _executable(sanitizer, "#!/usr/bin/env bash\nsleep 60\n")
    out = _run(stand_ins, tmp_path / "out", GPU_CHECK_ONLY="memcheck", GPU_CHECK_BUDGET="22")
    line = _line(out, "memcheck")
    limit = int(re.search(r"memcheck \(limit (\d+)s\)", out.stdout).group(1))
    assert int(line.split()[-1]) <= limit + 15, line
