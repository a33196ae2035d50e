#!/usr/bin/env bash
# One-command validation of spio on a GPU machine without network access.
#
#   scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: ./gpu_check_out)
#   scripts/gpu_check.sh --list           (print the steps and their time limits)
#   scripts/gpu_check.sh --help           (print this text)
#
# The GPU machine has no network: first run scripts/fetch_gpu_wheels.sh on a connected machine,
# which puts the wheel it lacks (platformdirs) into .whl/, and carry .whl/ along.
#
# Steps, each time-limited, each logged to OUT_DIR/<step>.log; a failed step does not stop the
# run. The whole run keeps within GPU_CHECK_BUDGET seconds (default 470, under 8 minutes): a step
# gets the smaller of its own limit and the time left, and is SKIPPED when under 20 s are left.
# The steps run in order of value, so a short budget still gets correctness and the benchmark.
#   wheels     carried wheels in .whl/ -> a new folder under $TMPDIR (PYTHONPATH), if .whl/ exists
#   build      pip install --no-build-isolation --no-deps --no-index -e .
#   info       python -m spio info, nvidia-smi
#   check      python -m spio check --device cuda --quick
#   bench      python -m spio bench --quick --out OUT_DIR/bench
#   overhead   scripts/bench_launch.py (µs per driver launch) and scripts/bench_op_overhead.py
#              (µs per custom-op / module call over F.conv2d's)
#   ablate     scripts/ablate_kernel.py: the headline layer's kernels with loads, mma or stores
#              switched off, to show where their time goes (and FProp's input pipeline
#              alone, and each pass with its input rows staged swizzled, and brought in by
#              tensor copies), the small and 1x3 layers; last, on every bench layer, each
#              pass swizzled against group-major and
#              WGrad's atomics against its partial sums (settled in run 6). Its time limit:
#              GPU_CHECK_ABLATE_SECONDS (default 200)
#   fuzz       only when GPU_CHECK_ONLY names it (n/a otherwise): scripts/fuzz_kernels.py on the
#              GPU, random layers, configs and kernel variants (tensor copies among them, on
#              sm_90) against float64 references, then scripts/fuzz_layers.py (random layer
#              calls, forward and backward), until GPU_CHECK_FUZZ_SECONDS (default 150) runs out
#   copies     only when GPU_CHECK_ONLY names it (n/a otherwise): spio bench --quick with
#              SPIO_TMA=loads+stores (spio as it would run with tensor copies, against cuDNN in
#              the same run; OUT_DIR/bench_tma), then scripts/ablate_kernel.py on every bench
#              layer, spio's picks as they are against tensor copies (tma; FProp/DGrad also
#              tma-stores), each checked against the plain kernel's results: what making tensor
#              copies spio's default on sm_90 would do on every layer (the ablate step times them
#              on the headline layer alone)
#   probe      scripts/read_probe.py: this GPU's read rate through plain loads, cp.async and the
#              kernels' row-by-row structure, next to torch's sum and copy
#   memcheck   compute-sanitizer --tool memcheck on one launch of each pass (spio.bench.sanitize)
#   racecheck  compute-sanitizer --tool racecheck on the same launches (a few seconds: before the
#              long steps, so that it is never the step the budget leaves out)
#   tests      pytest -m "cuda and not slow", every test function first, then round-robin, until
#              its time limit (GPU_CHECK_TEST_SECONDS, default 120) or the budget runs out
#   timm       scripts/timm_benchmark.py: regnetx_002 training samples/s, PyTorch and spio, eager
#              and replayed in CUDA graphs (--cuda-graph: the host's work left out); not
#              started with under GPU_CHECK_TIMM_MIN_SECONDS (default 65) left, which it needs
#   perf       scripts/perf_sample.py into OUT_DIR/perf_samples.csv with the time left (data for
#              the performance model; a partial sweep is still useful: it takes 25 configs of each
#              layer and pass in turn, the picks first, so that every shape gets some);
#              GPU_CHECK_PERF_SEED=CSV continues from earlier samples (a CSV an older spio wrote
#              too); with SPIO_TMA set (e.g. SPIO_TMA=loads GPU_CHECK_ONLY="wheels build perf"),
#              it samples the tensor-copy kernels spio then runs, their rows named so
# GPU_CHECK_ARCHIVE=FILE.tgz also packs OUT_DIR into that one file after every step, at the end
# and when stopped by a signal (for transports that bring back only a few files). GPU_CHECK_ONLY="wheels build info perf" runs only the steps
# named (e.g. a second call that spends what device time is left on perf samples).
# When build or info fails (e.g. `spio info` finds that the driver extension does not load),
# the remaining steps are skipped. A compact summary (step, status, seconds) is printed last, and
# written to OUT_DIR/summary.txt a line at a time as each step ends (so a run cut off by an outer
# timeout still leaves one; a TERM or INT prints it, its total line "STOPPED by a signal", and
# exits 143); calls a step makes besides its main one keep within its limit. The
# exit status is 1 if any step failed, timed out or was skipped (the perf step stops itself before
# its limit, so running out of time there is not a failure; nor is timm or perf left out when the
# budget is spent before them, or leaves them too little time).

set -u -o pipefail

# A malformed setting ends the run before any step, in one line: device time is too dear to
# spend on a run whose budget arithmetic failed (a budget of "10s" had skipped every step and
# passed) or whose GPU_CHECK_ONLY names a step that does not exist (it would run the others).
usage_error() {
    echo "gpu_check: $*" >&2
    exit 2
}
for setting in GPU_CHECK_BUDGET GPU_CHECK_ABLATE_SECONDS GPU_CHECK_TEST_SECONDS \
    GPU_CHECK_PERF_SECONDS GPU_CHECK_TIMM_MIN_SECONDS; do
    value=${!setting:-}
    if [[ -n "$value" && ! "$value" =~ ^(0|[1-9][0-9]*)$ ]]; then
        usage_error "$setting must be a whole number of seconds (digits, no leading 0)," \
            "got '$value'"
    fi
done
# Python buffers output written to a log file, and a step killed by its time limit loses what it
# had printed (the probes before one that hangs, the ablate parts before the deadline).
export PYTHONUNBUFFERED=1

STEPS=(
    "wheels:60"
    "build:180"
    "info:60"
    "check:90"
    "fuzz:${GPU_CHECK_FUZZ_SECONDS:-150}"
    "bench:200"
    "overhead:90"
    "ablate:${GPU_CHECK_ABLATE_SECONDS:-200}"
    "copies:270"
    "probe:60"
    "memcheck:120"
    "racecheck:120"
    "tests:${GPU_CHECK_TEST_SECONDS:-120}"
    "timm:120"
    "perf:${GPU_CHECK_PERF_SECONDS:-300}"
)

# Steps that run only when GPU_CHECK_ONLY names them (a second call's work).
OPT_IN_STEPS="copies fuzz"

for name in ${GPU_CHECK_ONLY:-}; do
    if [[ ! " ${STEPS[*]%%:*} " == *" $name "* ]]; then
        usage_error "GPU_CHECK_ONLY names no step '$name'; the steps: ${STEPS[*]%%:*}"
    fi
done

case "${1:-}" in
--list)
    printf '%s\n' "${STEPS[@]}"
    exit 0
    ;;
-h | --help)
    sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
    ;;
-*) usage_error "unknown option '$1' (usage: scripts/gpu_check.sh [OUT_DIR] | --list | --help)" ;;
esac
if (($# > 1)); then
    usage_error "one OUT_DIR at most, got $# arguments (usage: scripts/gpu_check.sh [OUT_DIR])"
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT_DIR=${1:-./gpu_check_out}
if ! mkdir -p -- "$OUT_DIR" 2>/dev/null || [[ ! -w "$OUT_DIR" ]]; then
    usage_error "cannot write OUT_DIR '$OUT_DIR'"
fi
OUT_DIR=$(cd -- "$OUT_DIR" && pwd)
# An earlier run's summary goes first: a signal before this run's is begun must not print that
# one as this run's (nor pack it).
rm -f -- "$OUT_DIR/summary.txt"
SUMMARY_ENDED=0  # 1 once the summary has its total line
cd "$REPO" || exit 1
PYTHON=${PYTHON:-python}
# Where the wheels step installs: a folder of this run's own, removed at its end (a fixed path
# such as /tmp/site, made first by another user, would keep their packages there, which
# `pip install --target` only warns about, first on every later step's PYTHONPATH).
SITE=$(mktemp -d "${TMPDIR:-/tmp}/spio-gpu-site.XXXXXX") || exit 1
trap 'rm -rf -- "$SITE"' EXIT
BUDGET=${GPU_CHECK_BUDGET:-470}
MIN_STEP_SECONDS=20
# The timm step took 33 s in run 5, 47 s in run 6 (with where_faster), 50 s in run 7 (with its
# --profile of the three variants): 65 s leaves it room, where 80 had left it out of a 545 s
# budget whose ablate step used its whole limit.
TIMM_MIN_SECONDS=${GPU_CHECK_TIMM_MIN_SECONDS:-65}

FAILED=0
NOTE=""
BROKEN=""

log() { printf '[gpu_check %4ds] %s\n' "$SECONDS" "$*"; }

# The device run wraps this script in `timeout`, whose TERM reaches this shell's process group
# but not the running step's commands: each runs under a `timeout` of its own, in a process
# group of its own, and would go on after the script had gone (writing to its log while the
# caller packs OUT_DIR). On TERM, INT or HUP the step's processes are ended first.
STEP_PID=""
kill_tree() {  # $1 and every process below it, the lowest first
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        kill_tree "$child"
    done
    kill -TERM "$1" 2>/dev/null
}
stop_step() {
    if [[ -n "$STEP_PID" ]]; then
        kill_tree "$STEP_PID"
        rm -f "$OUT_DIR/.note"  # the step's NOTE file, which run_step did not get to read
        log "stopped by a signal; the running step's processes are ended"
    else
        log "stopped by a signal"
    fi
    if [[ -f "$OUT_DIR/summary.txt" ]] && ((!SUMMARY_ENDED)); then  # the steps that ended
        printf '%-10s %-64s %5d\n' total "STOPPED by a signal" "$SECONDS" >>"$OUT_DIR/summary.txt"
    fi
    pack
    [[ -f "$OUT_DIR/summary.txt" ]] && cat "$OUT_DIR/summary.txt"  # printed last, as ever
    exit 143
}
trap stop_step TERM INT HUP

# Seconds a call inside the running step may take: at most $1, and no more than the step has
# left (at least 1: timeout 0 would mean no limit).
STEP_DEADLINE=0
cap() {
    local left=$((STEP_DEADLINE - SECONDS))
    ((left > $1)) && left=$1
    echo $((left < 1 ? 1 : left))
}

# GPU_CHECK_ARCHIVE: OUT_DIR packed into that file after every step and when the script is
# stopped, so that a run cut off (an outer timeout, the device's time running out) still
# leaves what it measured; written beside it, then moved into place, so that a kill mid-pack
# leaves the previous step's archive whole. (tar's exit 1, a file changed while read, as a
# step's processes end, still leaves an archive.)
pack() {
    [[ -n "${GPU_CHECK_ARCHIVE:-}" ]] || return 0
    tar czf "$GPU_CHECK_ARCHIVE.part" -C "$OUT_DIR" . 2>/dev/null
    (($? <= 1)) && mv -f "$GPU_CHECK_ARCHIVE.part" "$GPU_CHECK_ARCHIVE"
}

# A step's line of the summary, appended to summary.txt at once, and OUT_DIR packed: if the
# run is cut off, summary.txt (and the archive) still have every step that finished.
add_summary() {
    printf '%s\n' "$1" >>"$OUT_DIR/summary.txt"
    pack
}

find_sanitizer() {
    local candidate site
    site=$(timeout -k 5 "$(cap 30)" "$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" 2>/dev/null)
    for candidate in "$(command -v compute-sanitizer 2>/dev/null)" \
        "$site"/nvidia/*/bin/compute-sanitizer \
        "$site"/nvidia/cuda_sanitizer_api/compute-sanitizer/compute-sanitizer \
        "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
        /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
        /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

step_wheels() {
    local limit=$1
    shopt -s nullglob
    local wheels=(.whl/*.whl)
    shopt -u nullglob
    if [[ ${#wheels[@]} -eq 0 ]]; then
        NOTE="no .whl/ wheels"
        echo "no wheels in .whl/: nothing to install"
        return 200
    fi
    timeout -k 10 "$limit" "$PYTHON" -m pip install --no-index --no-deps --target "$SITE" \
        "${wheels[@]}" || return $?
    NOTE="${#wheels[@]} wheels"  # (run_step puts $SITE on PYTHONPATH)
}

step_build() {
    timeout -k 10 "$1" "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -e .
}

step_info() {
    timeout -k 5 "$(cap 20)" nvidia-smi || echo "(nvidia-smi not available)"
    timeout -k 10 "$(cap "$1")" "$PYTHON" -m spio info || return $?
    # `spio info` passes without a GPU (spio works on the CPU too); here nothing after it would.
    timeout -k 5 "$(cap 60)" "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA GPU')" ||
        return $?
    # Without platformdirs (a dependency the machine lacks unless carried) spio caches under
    # $XDG_CACHE_HOME or ~/.cache: nothing is lost, but say so in the summary.
    if ! timeout -k 5 "$(cap 60)" "$PYTHON" -c "import platformdirs"; then
        NOTE="platformdirs missing: cache in \$XDG_CACHE_HOME or ~/.cache"
    fi
}

step_check() {
    timeout -k 10 "$1" "$PYTHON" -m spio check --device cuda --quick
}

# Cases are drawn until 45 s before the step's limit, two thirds of that time kernels (their
# kernels built 16 at a time first), then layer calls; the seed is the run's date, so runs on
# different days draw different cases.
FUZZ_MIN_SECONDS=60
step_fuzz() {
    if (($1 < FUZZ_MIN_SECONDS)); then
        NOTE="${1}s left, under the ${FUZZ_MIN_SECONDS}s it needs"
        return 200
    fi
    local seed kernels layers
    seed=$(date -u +%Y%m%d)
    kernels=$(awk -v s="$1" 'BEGIN { printf "%.2f", (s - 45) * 2 / 3 / 60 }')
    layers=$(awk -v s="$1" 'BEGIN { printf "%.2f", (s - 45) / 3 / 60 }')
    timeout -k 10 "$(cap "$1")" "$PYTHON" scripts/fuzz_kernels.py --device cuda \
        --minutes "$kernels" --seed "$seed"
    local rc=$?
    timeout -k 10 "$(cap "$1")" "$PYTHON" scripts/fuzz_layers.py --device cuda \
        --minutes "$layers" --seed "$seed"
    local rc_layers=$?
    # e.g. "kernels 0/412 failed, layers 0/80 failed" (from their summary lines; short enough
    # for the summary's status column after a FAIL)
    NOTE=$(awk '
        /^[0-9]+ passed, [0-9]+ failed, [0-9]+ did not fit/ { k = $3 + 0 "/" $1 + $3 " failed" }
        /^[0-9]+ passed, [0-9]+ failed \(/ { l = $3 + 0 "/" $1 + $3 " failed" }
        END { printf "kernels %s, layers %s", (k == "" ? "not run" : k), (l == "" ? "not run" : l) }
    ' "$OUT_DIR/fuzz.log")
    ((rc == 0)) && rc=$rc_layers
    return "$rc"
}

sanitize() {
    local tool=$1 limit=$2 sanitizer
    if ! sanitizer=$(find_sanitizer); then
        echo "compute-sanitizer not found (PATH, CUDA_HOME, /usr/local/cuda*)"
        NOTE="compute-sanitizer not found"
        return 1
    fi
    local filter=() help
    help=$(timeout -k 5 "$(cap 30)" "$sanitizer" --help 2>/dev/null)
    if grep -q -- "--kernel-name" <<<"$help"; then  # instrument only spio's kernels (spio_conv2d_gw8*, spio_sum_slots)
        filter=(--kernel-name kns=spio_)
    elif grep -q -- "--filter" <<<"$help"; then  # older releases
        filter=(--filter kns=spio_)
    fi
    # spio's driver finds a kernel's parameter count by calling cuFuncGetParamInfo until it returns
    # CUDA_ERROR_INVALID_VALUE (the documented end of the list); the sanitizer would count each
    # such probe as an error. Failed CUDA calls still fail the run: spio raises on every one.
    if grep -q -- "--report-api-errors" <<<"$help"; then
        filter+=(--report-api-errors no)
    fi
    echo "$sanitizer --tool $tool ${filter[*]}"
    limit=$(cap "$((limit - 10))")  # what finding it and --help left
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$limit" "$sanitizer" --tool "$tool" \
        --error-exitcode 1 "${filter[@]}" "$PYTHON" -m spio.bench.sanitize
}

step_memcheck() { sanitize memcheck "$1"; }

step_racecheck() { sanitize racecheck "$1"; }

step_overhead() {
    # The launch bench is short (torch's start-up and 24,000 launches); the op bench gets the rest:
    # it also compiles three kernels, times training steps and profiles (run 6 cut it at 20 s,
    # half of a 60 s step, before its training steps). Each call may take 10 s more to die.
    if (($1 < 30)); then  # (each call needs 5 s at least: timeout 0 would be no limit at all)
        NOTE="${1}s left, too few to measure"
        return 200
    fi
    local deadline=$((SECONDS + $1 - 20)) launch=$((($1 - 20) / 3))
    ((launch > 20)) && launch=20
    ((launch < 5)) && launch=5
    timeout -k 10 "$launch" "$PYTHON" scripts/bench_launch.py --launches 2000 --repeats 3
    local rc=$? left=$((deadline - SECONDS))
    ((left < 5)) && left=5
    timeout -k 10 "$left" "$PYTHON" scripts/bench_op_overhead.py --calls 2000 --repeats 7 --profile || rc=$?
    return "$rc"
}

step_ablate() {
    # Open questions first, settled ones last (each run's record in docs/perf/ says what its
    # parts settled). In order:
    #   1. the headline layer's classic ablation with spio's choice for every pass, the reference
    #      each run compares against, with FProp/DGrad's input pipeline alone (pipeline-only:
    #      run 7 and 8 read at ~1.7 TB/s where the read probe's rows of its geometry reach 2.8;
    #      the probe step's kernel-pattern probes look for the difference);
    #   2. the small layers' own ablation (512c 8x8, 368c 7x7) and the no-halo 1x3 layer;
    #   3. last, WGrad's two reductions (atomics into a zeroed dw, per-warp partial sums and
    #      sum_slots) on every bench layer with spio's config alone (`full`; partial sums were
    #      faster on 8 of 10 layers in run 6, 7 in run 7: a check on every layer's WGrad pick).
    # Dropped, settled: by run 6, WGrad's `unmasked` and `copy-branch` (the careful steps' cost is
    # known; predicated copies win), FProp's `unroll-r` (full faster or level on all 10 layers),
    # `stagger` (no DRAM camping), several images per block on the small layers; by run 7, the L2
    # prefetch hint (`l2-256`: within 2 % on FProp, 5 % slower on WGrad), streaming stores
    # (`stores-cs`: 1 % slower), and rows through registers in the full kernel (`ldg`: slower on
    # 3 of 5 configs, although `ldg-pipeline-only` read at up to 3.0 TB/s); by run 8, input
    # zeros by shared-memory stores instead of zero-filling copies (FProp/DGrad level, WGrad
    # 3-8 % slower on most configs: reverted); by run 7, the per-row barrier (`no-sync`: FProp
    # 1.00, DGrad 1.01, WGrad 0.95 of full; dropped in 2026-12-07 for the kernel budget's room).
    local deadline=$((SECONDS + $1 - 10)) rc=0 out_of_time=0 layers
    # ablate ARGS...: one ablate_kernel.py process with the step's time left; with CAP=N set,
    # at most N seconds of it.
    ablate() {
        local left=$((deadline - SECONDS)) part
        if ((left < 10)); then
            echo "ablate: ${left}s left, skipped: $*"
            out_of_time=1
            return
        fi
        if [[ -n ${CAP:-} ]] && ((CAP < left)); then
            left=$CAP
        fi
        timeout -k 10 "$left" "$PYTHON" scripts/ablate_kernel.py --n 128 "$@"
        part=$?
        case $part in
            0) ;;
            124 | 137) out_of_time=1 ;;
            *) rc=$part ;;
        esac
    }
    # 1. The classic ablation, with the input pipeline alone (FProp/DGrad), and the kernels with
    #    their input rows staged swizzled (pixel-major) instead of group-major, also without
    #    their mma and stores (loads-only: WGrad's 76.7 of its 85.1 us in run 7) and FProp/DGrad's
    #    pipeline alone: the fix to time if the probe step's grouped rows read slower than rows
    #    in order.
    ablate --layer 64c_64x64_3x3 \
        --variants full no-stores no-mma no-loads skeleton loads-only pipeline-only \
        swizzled swizzled-loads-only swizzled-pipeline-only
    # The rows by tensor copies (tma: one thread a row, into the swizzled buffers; the read
    # probe's bulk copies read 3.0-3.4 TB/s in run 6), and FProp/DGrad's output rows stored by
    # them too (tma-stores; tma-no-stores: what plain stores cost behind such loads), in a
    # process of their own: they have never run on a GPU, and a fault there would end the
    # process's other timings with it; at most 75 s, so that a copy that never lands leaves the
    # later parts their time. With them, the maps asking L2 to fetch 128 bytes at once
    # (tma-l2-128: CUTLASS's maps ask 128, spio's none; tma-l2-256 is left to a run of its own).
    CAP=75 ablate --layer 64c_64x64_3x3 --variants full tma tma-stores tma-no-stores \
        tma-loads-only tma-pipeline-only tma-l2-128
    # The swizzled stages on two more FProp tile widths of the headline layer (run 7's
    # pipeline-only configs: their group-major pipeline-only times are run 7's, 37.9 and 40.1 us).
    ablate --layer 64c_64x64_3x3 --passes fprop --config g8_p64_q64_w2_s4_k16 g8_p64_q16_w1_s4_k16 \
        --variants full swizzled swizzled-pipeline-only
    # 2. The small layers, whose WGrad loses to cuDNN at both batch sizes (their FProp and DGrad
    #    beat it since run 6): where their time goes, with spio's choice (the weights' start-up
    #    is in skeleton; no-loads, within 4 us of full in runs 6 and 7, left out).
    ablate --layer 512c_8x8_3x3 368c_7x7_3x3 --passes fprop wgrad --repeats 30 \
        --variants full skeleton loads-only
    # The 1x3 layer (4-row tiles, so no lockstep blocks): the figures run 5 recorded for it.
    ablate --layer 128c_32x32_1x3 --passes fprop --repeats 30 --config g8_p4_q16_w1_s2_k8 \
        --variants full no-stores skeleton loads-only
    # 3. On every bench layer with spio's configs, each pass's kernel swizzled against
    #    group-major, and WGrad's reductions (the wrapper times both on each config). (Tensor
    #    copies on every layer would take the step past its kernel budget: the opt-in `copies`
    #    step times them, in a call of their own.)
    if ((deadline - SECONDS >= 10)); then
        layers=$(bench_layers "$(((deadline - SECONDS) < 30 ? deadline - SECONDS : 30))")
        if [[ -z $layers ]]; then
            # The every-layer lines need the list: the step fails rather than skip them quietly.
            echo "ablate: listing the bench layers failed; skipped: the every-layer lines"
            rc=1
        else
            # shellcheck disable=SC2086  # one word per layer
            ablate --variants full swizzled --repeats 30 --layer $layers
        fi
    else
        out_of_time=1
    fi
    if ((rc == 0 && out_of_time)); then
        return 124
    fi
    return "$rc"
}

# The bench table's layer names on one line, listed in at most $1 s (empty if that fails).
bench_layers() {
    timeout -k 5 "$1" "$PYTHON" -c \
        "from spio.bench.layers import layer_table as t; print(*(l.name for l in t()))"
}

step_copies() {
    local layers bench kernels
    layers=$(bench_layers "$(cap 30)")
    if [[ -z $layers ]]; then
        NOTE="listing the bench layers failed"
        return 1
    fi
    # The product's numbers first (bench took 50 s in run 7), then each kernel's.
    SPIO_TMA=loads+stores timeout -k 10 "$(cap 100)" \
        "$PYTHON" -m spio bench --quick --out "$OUT_DIR/bench_tma"
    bench=$?
    if ((STEP_DEADLINE - SECONDS < 30)); then
        NOTE="bench exit $bench; $((STEP_DEADLINE - SECONDS))s left for the kernels"
        return 124
    fi
    # 80 kernels (FProp and DGrad three each, WGrad two, on 10 layers) and WGrad's reductions.
    # shellcheck disable=SC2086  # one word per layer
    timeout -k 10 "$(cap $((STEP_DEADLINE - SECONDS - 10)))" "$PYTHON" scripts/ablate_kernel.py \
        --n 128 --repeats 30 --variants full tma tma-stores --layer $layers
    kernels=$?
    NOTE="bench exit $bench, kernels exit $kernels"
    ((bench != 0)) && return "$bench"
    return "$kernels"
}

step_probe() {
    timeout -k 10 "$1" "$PYTHON" scripts/read_probe.py --mbytes 64 --repeats 30
}

step_timm() {
    if (($1 < TIMM_MIN_SECONDS)); then  # it could not finish: a sample not taken, not a failure
        NOTE="${1}s left, under the ${TIMM_MIN_SECONDS}s it needs"
        return 200
    fi
    if ! timeout -k 5 "$(cap 30)" "$PYTHON" -c "import timm" 2>/dev/null; then
        NOTE="timm not installed"
        return 200
    fi
    timeout -k 10 "$(cap "$1")" "$PYTHON" scripts/timm_benchmark.py --model regnetx_002 --spio \
        --spio-where-faster \
        --amp-dtype float16 --channels-last --bench train --batch-size 256 --warmup 5 --iters 20 \
        --cuda-graph --profile
    local rc=$?
    # e.g. "spio=0.835 faster=1.002 graphed: spio=1.250 faster=1.300" (eager steps' ratios, then
    # the steps replayed in CUDA graphs): short enough for the summary's status column
    NOTE=$(awk '
        /^spio(-faster)? \/ pytorch = / { n = $1; sub(/^spio-/, "", n); e = e sep n "=" $NF; sep = " " }
        /^spio(-faster)? \/ pytorch in CUDA graphs = / { n = $1; sub(/^spio-/, "", n); g = g " " n "=" $NF }
        END { printf "%s%s", e, (g == "" ? "" : (e == "" ? "" : " ") "graphed:" g) }
    ' "$OUT_DIR/timm.log")
    return "$rc"
}

step_perf() {
    # perf_sample.py stops itself before its budget runs out; keep 20 s for it to write the CSV.
    local budget=$(($1 - 20))
    if ((budget < 10)); then
        NOTE="${1}s left, too few to sample"
        return 200
    fi
    # A fresh sample of the kernels as they are now; GPU_CHECK_PERF_SEED=CSV resumes from earlier
    # samples instead (perf_sample skips what this GPU model already has), which is right only
    # while the kernels they timed are unchanged (and the CSV has the same columns). Layer by
    # layer, WGrad first in each (its samples now time the whole pass as spio runs it, and the
    # WGrad model cannot be retrained without them), N = 128 first; in rounds of 25 configs of
    # each (each layer's picks first): run 7 sampled 5 of the 12 shapes fully in its 98 s, and
    # the models' held-out scores depend most on how many shapes they have seen.
    local csv="$OUT_DIR/perf_samples.csv" before=0 after=0
    local seed_note=""
    if [[ -n "${GPU_CHECK_PERF_SEED:-}" && ! -f "$csv" ]]; then
        # Copied sample by sample: a CSV an older spio wrote has other columns, which
        # perf_sample refuses to extend. Within the step's time; a seed that cannot be read
        # leaves a sweep from nothing, said, rather than none.
        if ! timeout -k 5 "$(cap 60)" "$PYTHON" - "$GPU_CHECK_PERF_SEED" "$csv" <<'EOF'; then
import sys

from spio.kernels.perf_samples import append_samples, read_samples

print(f"seeded {append_samples(sys.argv[2], read_samples(sys.argv[1])[0])} samples")
EOF
            rm -f "$csv"
            seed_note="; seed $GPU_CHECK_PERF_SEED not read"
        fi
        budget=$(($(cap "$1") - 20))  # what the seeding left
        if ((budget < 10)); then
            NOTE="seeding left too few seconds to sample$seed_note"
            return 200
        fi
    fi
    ((budget > 450)) && budget=450  # perf_sample.py's MAX_BUDGET_S (a longer step has spare time)
    [[ -s "$csv" ]] && before=$(($(wc -l <"$csv") - 1))  # data rows, past the header
    timeout -k 10 "$(cap "$1")" "$PYTHON" scripts/perf_sample.py --csv "$csv" \
        --budget-s "$budget" --batches 128 32 --dtypes fp16 --max-configs 100 --round 25 \
        --families conv2d_gw8_wgrad conv2d_gw8_fprop conv2d_gw8_dgrad
    local rc=$?
    [[ -s "$csv" ]] && after=$(($(wc -l <"$csv") - 1))
    NOTE="$((after - before)) rows"  # what this run sampled, not the seed's
    ((before > 0)) && NOTE="$NOTE (+$before seeded)"
    NOTE="$NOTE$seed_note"
    return "$rc"
}

step_bench() {
    timeout -k 10 "$1" "$PYTHON" -m spio bench --quick --out "$OUT_DIR/bench"
}

step_tests() {
    local deadline=$((SECONDS + $1)) ids="$OUT_DIR/tests_collected.txt" order="$OUT_DIR/tests_order.txt"
    local late="$OUT_DIR/tests_tensor_copies.txt"
    timeout -k 5 "$(($1 / 3 + 1))" "$PYTHON" -m pytest -m "cuda and not slow" --collect-only -q \
        -p no:cacheprovider | grep '::' >"$ids"
    local collected=${PIPESTATUS[0]} total
    total=$(wc -l <"$ids")
    if ((collected == 124 || collected == 137)); then  # cut off: a time limit, not a failure
        NOTE="collecting the tests timed out"
        return 124
    fi
    if [[ "$total" -eq 0 ]]; then
        echo "no cuda tests collected"
        NOTE="no cuda tests collected"
        return 1
    fi
    # Every test function once (shuffled parameters), then round-robin over functions. The bulk
    # copy probes and the kernels fed by tensor copies (tma; never run on a GPU yet) go in a list
    # of their own, run first in a process capped at half the step (a copy that never
    # lands would wait forever: the cap leaves the other tests their time; run 7's sampled run
    # stopped after 78 of 798, so "last" would have been "never").
    "$PYTHON" - "$ids" "$order" "$late" <<'EOF'
import random
import sys
from collections import defaultdict

groups = defaultdict(list)
late = defaultdict(list)
for line in open(sys.argv[1]):
    if "::" in line:
        test = line.strip()
        (late if "bulk" in test or "tma" in test else groups)[test.split("[")[0]].append(test)
rng = random.Random(0)
for path, functions in zip(sys.argv[2:], (groups, late), strict=True):
    for members in functions.values():
        rng.shuffle(members)
    with open(path, "w") as out:
        while any(functions.values()):
            for members in functions.values():
                if members:
                    print(members.pop(), file=out)
EOF
    local ordered=() copies=()
    mapfile -t ordered <"$order"
    mapfile -t copies <"$late"
    local limit=$((deadline - SECONDS - 10)) late_rc=0 late_note=""
    if ((${#copies[@]} > 0 && limit / 2 >= 2)); then
        echo "running ${#copies[@]} tensor-copy cuda tests first, for at most $((limit / 2))s"
        run_tests "$late" "$((limit / 2))" "$OUT_DIR/tests_tensor_copies.log"
        late_rc=$?
        late_note="copies $SUMMARY/${#copies[@]}; "
        limit=$((deadline - SECONDS - 10))
    fi
    if ((limit < 2)); then  # (timeout 0 would mean no limit)
        NOTE="${late_note}no time left after collecting"
        return 124
    fi
    local rc=0
    SUMMARY="none"
    if ((${#ordered[@]} > 0)); then  # (no ids would make pytest run every test, uncapped)
        echo "running up to ${#ordered[@]} cuda tests for at most ${limit}s"
        run_tests "$order" "$limit" "$OUT_DIR/tests_others.log"
        rc=$?
    fi
    NOTE="$late_note$SUMMARY/${#ordered[@]}"
    if ((rc != 0 && rc != 201)); then
        return "$rc"
    fi
    if ((late_rc != 0 && late_rc != 201)); then
        return "$late_rc"
    fi
    ((rc == 201 || late_rc == 201)) && return 201
    return 0
}

# Runs the cuda tests listed in file $1 (ids, kept in their order: tests/conftest.py's
# SPIO_TEST_ORDER; pytest would otherwise group them by their parametrized fixtures' set-ups) for
# at most $2 s (pytest gets 10 s more after SIGINT to report), its output in log $3, then copied
# to the step's (not through a pipe: a process left behind by a killed pytest, e.g. a compile
# worker, would hold it open). SUMMARY: pytest's last count line. Status 201: stopped by the time
# limit without a failure (a sample, not a failure).
run_tests() {
    local list=$1 limit=$2 log=$3 rc tests=()
    mapfile -t tests <"$list"
    SPIO_TEST_ORDER="$list" timeout -s INT -k 10 "$limit" "$PYTHON" -m pytest -q \
        -p no:cacheprovider -m "cuda and not slow" "${tests[@]}" >"$log" 2>&1
    rc=$?
    cat "$log"
    # (Its counts alone, e.g. "78 passed, 1 warning": the summary table keeps 64 characters.)
    SUMMARY=$(grep -E '[0-9]+ (passed|failed|error|skipped)' "$log" | tail -1 |
        grep -oE '[0-9]+ (passed|failed|errors?|skipped|warnings?|xfailed|xpassed)' | paste -sd, |
        sed 's/,/, /g')
    SUMMARY=${SUMMARY:-no summary}
    if [[ $rc -eq 124 ]] && ! grep -qE '[0-9]+ (failed|error)' <<<"$SUMMARY"; then
        SUMMARY="time limit: $SUMMARY"
        return 201
    fi
    return "$rc"
}

run_step() {
    local name=$1 limit=$2
    local left=$((BUDGET - SECONDS))
    local status
    NOTE=""
    if [[ -n "${GPU_CHECK_ONLY:-}" && " $GPU_CHECK_ONLY " != *" $name "* ]]; then
        add_summary "$(printf '%-10s %-64s %5d' "$name" "not selected (GPU_CHECK_ONLY)" 0)"
        log "$name: not selected"
        return
    fi
    if [[ " $OPT_IN_STEPS " == *" $name "* && " ${GPU_CHECK_ONLY:-} " != *" $name "* ]]; then
        add_summary "$(printf '%-10s %-64s %5d' "$name" "n/a (opt-in: GPU_CHECK_ONLY must name it)" 0)"
        log "$name: opt-in, not named in GPU_CHECK_ONLY"
        return
    fi
    if [[ -n "$BROKEN" ]]; then
        status="SKIPPED ($BROKEN)"
        FAILED=1
        add_summary "$(printf '%-10s %-64s %5d' "$name" "$status" 0)"
        log "$name: $status"
        return
    fi
    if ((left < MIN_STEP_SECONDS)); then
        status="SKIPPED (budget spent)"
        # timm and perf gather numbers, and come last for that: a run whose budget ends before
        # them still checked everything (GPU_CHECK_ONLY="wheels build perf" runs them alone).
        [[ $name == timm || $name == perf ]] || FAILED=1
        add_summary "$(printf '%-10s %-64s %5d' "$name" "$status" 0)"
        log "$name: $status"
        return
    fi
    ((limit > left)) && limit=$left
    log "$name (limit ${limit}s) -> $OUT_DIR/$name.log"
    local started=$SECONDS
    STEP_DEADLINE=$((SECONDS + limit))
    # In the background, with this shell waiting, so that a signal to the script ends the step
    # at once (stop_step); the step's NOTE comes back through a file.
    local note_file="$OUT_DIR/.note"
    : >"$note_file"
    (
        # A signal to the script reaches this subshell too: it must outlive its commands, for
        # stop_step to find them by their parent, and exit once they have gone.
        trap 'exit 143' TERM INT HUP
        NOTE=""
        "step_$name" "$limit"
        rc=$?
        printf '%s' "$NOTE" >"$note_file"
        exit $rc
    ) >"$OUT_DIR/$name.log" 2>&1 &
    STEP_PID=$!
    wait "$STEP_PID"
    local rc=$?
    STEP_PID=""
    NOTE=$(<"$note_file")
    rm -f "$note_file"
    # The wheels step installs into $SITE; what runs after it imports from there.
    [[ $name == wheels && $rc -eq 0 ]] && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    local took=$((SECONDS - started))
    case $rc in
        0) status="PASS" ;;
        200) status="n/a" ;;
        201) status="PASS (sampled)" ;;
        124 | 137)
            status="TIMEOUT after ${limit}s"
            FAILED=1
            ;;
        *)
            status="FAIL (exit $rc)"
            FAILED=1
            ;;
    esac
    [[ -n "$NOTE" ]] && status="$status: $NOTE"
    case $status in
        PASS* | n/a*) ;;
        *)
            echo "---- last lines of $name.log ----"
            tail -n 15 "$OUT_DIR/$name.log"
            echo "----"
            ;;
    esac
    if [[ $rc -ne 0 && ($name == build || $name == info) ]]; then
        BROKEN="$name failed"  # nothing after this can work: don't spend GPU time on it
    fi
    add_summary "$(printf '%-10s %-64s %5d' "$name" "${status:0:64}" "$took")"
    log "$name: $status (${took}s)"
}

log "repository $REPO, output $OUT_DIR, budget ${BUDGET}s, python $(timeout 10 "$PYTHON" --version 2>&1)"
{
    echo
    echo "gpu_check summary ($(date -u '+%Y-%m-%d %H:%M UTC'), logs in $OUT_DIR)"
    printf '%-10s %-64s %5s\n' step status sec
} >"$OUT_DIR/summary.txt"
for step in "${STEPS[@]}"; do
    run_step "${step%%:*}" "${step##*:}"
done

printf '%-10s %-64s %5d\n' total "$([[ $FAILED -eq 0 ]] && echo PASS || echo FAIL)" "$SECONDS" \
    >>"$OUT_DIR/summary.txt"
SUMMARY_ENDED=1
if [[ -n "${GPU_CHECK_ARCHIVE:-}" ]]; then  # before the summary, which is printed last
    pack && log "packed $OUT_DIR into $GPU_CHECK_ARCHIVE"
fi
cat "$OUT_DIR/summary.txt"
exit "$FAILED"
