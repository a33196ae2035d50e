"""The benchmark's timed calls, run once on the CPU (spio in the emulator): spio and PyTorch
compute the same pass, and the copy moves the pass's bytes. Timing them needs a GPU."""

import pytest
import torch

from spio.bench.layers import BenchLayer
from spio.bench.run import BenchSettings, PassCase
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params as P
from tests.conftest import without_tensor_copies

TINY = BenchLayer("tiny_16c_7x9_3x3", 16, 7, 9)


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_spio_and_torch_calls_compute_the_same_pass(pass_, has_bias):
    """Also for a biased layer (the kernels for it take a bias; where_faster times such layers)."""
    torch.manual_seed(0)
    case = PassCase(TINY.params(2, has_bias=has_bias), pass_, l2_bytes=0, device="cpu")
    assert case.sets == 1 and case.bytes == case.stats.bytes(pass_)
    spio_out = case.spio_call()(0)
    torch_out = case.torch_call()(0)
    if pass_ == "fprop":
        got, want = spio_out, torch_out
    elif pass_ == "dgrad":
        got, want = spio_out, torch_out[0]
        assert torch_out[1] is None
    else:
        got, want = spio_out[0], torch_out[1]
        assert torch_out[0] is None
        # dw as the op gives a half, channels_last weight's, and as PyTorch writes it (the
        # bench had timed an fp32, contiguous dw).
        assert got.dtype == want.dtype == case.data[0]["w"].dtype
        assert got.stride() == want.stride() == case.data[0]["w_cl"].stride()
        assert (spio_out[1] is None) == (torch_out[2] is None) == (not has_bias)
        if has_bias:
            torch.testing.assert_close(
                spio_out[1].float(), torch_out[2].float(), atol=0.1, rtol=0.02
            )
    if pass_ == "fprop" and has_bias:  # the bias made a difference
        assert not torch.allclose(
            got.float(), (want - case.data[0]["bias_torch"].view(-1, 1, 1)).float()
        )
    assert got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.02)


def test_rotation_sets_hold_distinct_random_data():
    case = PassCase(TINY.params(1), "fprop", l2_bytes=10**6, device="cpu")
    assert case.sets > 1 and len(case.data) == case.sets
    first, second = case.data[0]["x"], case.data[1]["x"]
    assert first.is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(first, second) and first.abs().sum() > 0


def test_copy_moves_the_same_bytes_as_the_pass():
    case = PassCase(TINY.params(2), "wgrad", l2_bytes=0, device="cpu")
    src, dst = case.copy_data[0]
    assert abs(case.copy_bytes - case.bytes) < 4
    assert case.copy_bytes == src.numel() * src.element_size() + dst.numel() * dst.element_size()
    case.copy_call()(0)
    assert torch.equal(src, dst)


def test_settings_reject_unknown_passes_and_dtypes():
    with pytest.raises(ValueError, match="passes"):
        BenchSettings(layers=(TINY,), batch_sizes=(1,), passes=("bprop",))
    with pytest.raises(ValueError, match="dtype"):
        BenchSettings(layers=(TINY,), batch_sizes=(1,), dtype="fp32")


@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_bench_times_the_kernel_the_custom_ops_choose(monkeypatch, pass_):
    """The benchmark's spio column is what users get: the config selection of the custom ops
    (the performance model on a GPU), not the heuristic default."""
    import torch

    from spio.bench import run
    from spio.functional import _kernels
    from spio.kernels import perf_model
    from spio.kernels.families import FAMILY_OF_PASS

    params = TINY.params(2)
    family = FAMILY_OF_PASS[pass_]
    default = family.default_config(params)
    chosen = next(c for c in reversed(family.configs(params)) if c != default)
    monkeypatch.setenv("SPIO_TMA", "off")
    monkeypatch.setattr(_kernels, "_chosen", {})
    monkeypatch.setattr(perf_model, "select_config", lambda factory, p, device, **o: chosen)
    kernel = run.spio_kernel(params, pass_, torch.device("cuda", 0))
    assert dict(kernel.info)["config"] == chosen


@pytest.mark.parametrize("pass_", ["fprop", "dgrad"])
def test_spio_reads_channels_last_weights_as_a_channels_last_model_holds_them(monkeypatch, pass_):
    """model.to(memory_format=torch.channels_last) makes conv weights channels_last, and spio
    then runs the kernel variant reading them as held (`__wcl`): that is what is timed, with
    the same weight tensor cuDNN gets (the bench had timed the contiguous-weights kernel)."""
    from spio.bench import run
    from spio.kernels import conv2d_gw8_factory as fd

    case = PassCase(TINY.params(1), pass_, l2_bytes=0, device="cpu")
    assert case.kernel.info_value("weights_cl") is True
    assert run.spio_kernel(TINY.params(1), pass_, torch.device("cpu")).name == case.kernel.name
    assert without_tensor_copies(case.kernel.name).endswith("__wcl")
    given = []  # the weight tensor each call hands the kernel: cuDNN's, as held
    real = getattr(fd, pass_)
    monkeypatch.setattr(fd, pass_, lambda a, w, *r, **k: given.append(w) or real(a, w, *r, **k))
    case.spio_call()(0)
    assert len(given) == 1 and given[0] is case.data[0]["w_cl"]


@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_pytorchs_outputs_rotate_like_spios(pass_):
    """Each rotation set keeps PyTorch's last output until the set's next call, so that its
    outputs are spread over as many buffers as spio's; the allocator had handed every call the
    block the previous call freed, whose lines could still be in L2."""
    case = PassCase(TINY.params(1), pass_, l2_bytes=10**6, device="cpu")
    call = case.torch_call()
    for i in range(case.sets):
        call(i)
    outs = [item["torch_out"] for item in case.data]
    first = [o if pass_ == "fprop" else next(t for t in o if t is not None) for o in outs]
    assert len({t.data_ptr() for t in first}) == case.sets > 1


class _StandInCase:
    """PassCase for sweeps without a GPU: the pass's bytes and config, one rotation set, and
    calls that are their impl's name (for the stand-in timers to tell apart)."""

    def __init__(self, params, pass_, l2):
        from spio.bench import run

        self.stats = run.Conv2dStats(params)
        self.bytes = self.copy_bytes = self.stats.bytes(pass_)
        self.kernel = run.spio_kernel(params, pass_)
        self.sets, self.config = 1, self.kernel.info_value("config")
        self.copy_data, self.selected_by = [()], "heuristic"

    def spio_call(self):
        return "spio"

    def torch_call(self):
        return "torch"

    def copy_call(self):
        return "copy"


def _sweep_without_gpu(monkeypatch, case, timer=None, timing="t"):
    """run_bench set up to run here: `case` stands for PassCase, `timer` (default: 1 ms each)
    for time_calls; nothing to precompile, no L2, a RunInfo whose timing label is `timing`."""
    from spio.bench import run
    from spio.bench.results import RunInfo
    from spio.bench.timing import Timing

    info = RunInfo(
        gpu="GPU", driver="d", torch="t", cuda="c", spio="s", date="now", command="x", timing=timing
    )
    monkeypatch.setattr(run, "PassCase", case)
    monkeypatch.setattr(
        run, "time_calls", timer or (lambda c, warmup, reps: Timing(1, 1, 1, reps, True))
    )
    monkeypatch.setattr(run, "precompile", lambda cases, device: {})
    monkeypatch.setattr(run, "l2_cache_bytes", lambda: 0)
    monkeypatch.setattr(run, "run_info", lambda command: info)
    for flag in ("benchmark", "benchmark_limit"):  # run_bench sets them: undone after
        monkeypatch.setattr(torch.backends.cudnn, flag, getattr(torch.backends.cudnn, flag))


def test_cudnn_tries_every_algorithm_and_the_rows_say_so(monkeypatch):
    """cudnn.benchmark's default limit tries only 10 algorithms (its v8 API): the baseline was
    then not cuDNN's fastest, as the bench says it is."""
    from spio.bench import run

    commands = []
    _sweep_without_gpu(monkeypatch, _StandInCase)
    real_info = run.run_info
    monkeypatch.setattr(
        run, "run_info", lambda command: commands.append(command) or real_info(command)
    )
    monkeypatch.setattr(run, "_bench_case", lambda *a: ([], True))
    run.run_bench(BenchSettings(layers=(TINY,), batch_sizes=(1,), passes=("fprop",)), "spio bench")
    assert torch.backends.cudnn.benchmark is True
    assert torch.backends.cudnn.benchmark_limit == 0
    assert commands == ["spio bench (cudnn.benchmark=True, benchmark_limit=0)"]


def test_the_sweep_writes_its_csv_after_every_case(monkeypatch, tmp_path):
    """A sweep cut short by a time limit keeps the rows it measured: the CSV is rewritten after
    each case (it had been written once, after the whole sweep)."""
    from spio.bench import run
    from spio.bench.results import read_csv
    from spio.bench.timing import Timing

    path = tmp_path / "bench.csv"
    seen = []

    def timer(call, warmup, reps):
        seen.append(len(read_csv(path)) if path.exists() else 0)
        if len(seen) == 7:
            raise KeyboardInterrupt  # e.g. the step's time limit
        return Timing(1.0, 0.9, 1.1, reps, True)

    _sweep_without_gpu(monkeypatch, _StandInCase, timer)
    settings = BenchSettings(layers=(TINY,), batch_sizes=(1, 2, 3), passes=("fprop",))
    with pytest.raises(KeyboardInterrupt):
        run.run_bench(settings, "x", csv_path=path)
    assert seen == [0, 0, 0, 3, 3, 3, 6]
    assert len(read_csv(path)) == 6


def test_a_case_that_cannot_be_set_up_is_reported_and_the_sweep_goes_on(monkeypatch, caplog):
    """A case whose tensors do not fit (torch.OutOfMemoryError at a large batch) had ended the
    sweep with a traceback; it is now reported like a failed timing, and the other cases run."""
    from spio.bench import run

    class Case(_StandInCase):
        def __init__(self, params, pass_, l2):
            if params.n == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
            super().__init__(params, pass_, l2)

    _sweep_without_gpu(monkeypatch, Case)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # the context still works
    settings = BenchSettings(layers=(TINY,), batch_sizes=(1, 2, 3), passes=("fprop",))
    with caplog.at_level("ERROR", logger="spio"):
        rows = run.run_bench(settings, "x")
    assert sorted({row.n for row in rows}) == [1, 3] and len(rows) == 6
    assert "setting up fprop" in caplog.text and "out of memory" in caplog.text


def test_each_case_is_freed_before_the_next_is_set_up(monkeypatch):
    """A case's tensors, and the calls holding them, were alive while the next (often larger)
    case allocated its own, and a case that failed to set up held what it had allocated through
    its exception's traceback: a sweep could run out of memory where each case fits alone."""
    import weakref

    from spio.bench import run

    made: list[weakref.ref] = []
    alive_at_setup = []

    class Tensors:  # stands for a case's GPU tensors
        pass

    class Case(_StandInCase):
        def __init__(self, params, pass_, l2):
            alive_at_setup.append(sum(ref() is not None for ref in made))
            tensors = Tensors()
            made.append(weakref.ref(tensors))
            if params.n == 2:
                raise torch.OutOfMemoryError("CUDA out of memory")
            self.tensors = tensors
            super().__init__(params, pass_, l2)

        def spio_call(self):
            return lambda: self.tensors  # as a real case's calls hold its tensors

        torch_call = copy_call = spio_call

    _sweep_without_gpu(monkeypatch, Case)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    settings = BenchSettings(layers=(TINY,), batch_sizes=(1, 2, 3, 4), passes=("fprop",))
    rows = run.run_bench(settings, "x")
    assert sorted({row.n for row in rows}) == [1, 3, 4]
    assert alive_at_setup == [0, 0, 0, 0]


def test_a_broken_cuda_context_stops_the_sweep_keeping_the_rows_measured(monkeypatch, tmp_path):
    """A failure after which torch.cuda.synchronize raises (an illegal address makes the context
    unusable) ends the sweep; the rows timed before it, in that case too, are kept and written."""
    from spio.bench import run
    from spio.bench.results import read_csv
    from spio.bench.timing import Timing

    def timer(call, warmup, reps):
        if call == "torch":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return Timing(1, 1, 1, reps, True)

    def synchronize():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    _sweep_without_gpu(monkeypatch, _StandInCase, timer)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    settings = BenchSettings(layers=(TINY,), batch_sizes=(1, 2), passes=("fprop",))
    path = tmp_path / "rows.csv"
    rows = run.run_bench(settings, "x", csv_path=path)
    assert [(row.n, row.impl) for row in rows] == [(1, "spio")]
    assert [(row.n, row.impl) for row in read_csv(path)] == [(1, "spio")]


def test_each_spio_row_says_how_its_config_was_chosen(monkeypatch, tmp_path):
    """ "model sm_90/<family>.ubj", "heuristic" or "autotune", recorded with the row; a run
    without xgboost had timed the heuristic's picks with nothing in the CSV to say so."""
    from spio.bench import run
    from spio.functional import _kernels
    from spio.kernels import autotune
    from spio.kernels import perf_model as pm

    case = PassCase(TINY.params(2), "fprop", l2_bytes=0, device="cpu")
    assert case.selected_by == "heuristic"  # no GPU: the analytic heuristic
    h200 = pm.DeviceIdentity("sm_90", "NVIDIA H200", "13.0")
    monkeypatch.setattr(
        pm, "device_identity", lambda d: h200 if getattr(d, "type", "") == "cuda" else None
    )
    monkeypatch.delenv("SPIO_AUTOTUNE", raising=False)
    monkeypatch.delenv("SPIO_PERF_MODELS", raising=False)
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_default_cache", None)
    monkeypatch.setattr(autotune, "default_timer", lambda family, p, kernel, device: 1e-3)
    params = P(32, 64, 28, 28, padding=1)  # a batch size the shipped sm_90 models cover
    cuda = torch.device("cuda", 0)

    def chosen_how(pass_):  # a layer first met now: chosen under the current settings
        monkeypatch.setattr(_kernels, "_chosen", {})
        return run.selected_by(run.spio_kernel(params, pass_, cuda), pass_, cuda)

    pm.clear_caches()
    for pass_ in ("fprop", "dgrad", "wgrad"):
        how = chosen_how(pass_)
        assert how == f"model sm_90/conv2d_gw8_{pass_}.ubj"  # the shipped models
    monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path))  # no models there
    pm.clear_caches()
    assert chosen_how("fprop") == "heuristic"
    monkeypatch.setenv("SPIO_AUTOTUNE", "1")
    assert chosen_how("fprop") == "autotune"
    pm.clear_caches()


def test_sweep_rows_carry_each_impls_bytes_flops_sets_percentiles_and_pre_fill(monkeypatch):
    """run_bench's rows from stand-in timings, for FProp of a 1x3 layer with padding (0, 1) at
    N=1 (output 4x9): x and y are 1*16*4*9*2 = 1152 bytes each, w 16*8*1*3*2 = 768, so 3072
    bytes; 2*1*4*9*16*8*1*3 = 27648 FLOPs. The copy moves its own bytes (here 3070) over its
    own rotation sets and does no FLOPs; a timing not fully pre-filled is labelled so."""
    from spio.bench import run
    from spio.bench.timing import Timing

    layer = BenchLayer("tiny_16c_4x9_1x3", 16, 4, 9, 1, 3, (0, 1))

    class Case(_StandInCase):
        def __init__(self, params, pass_, l2):
            super().__init__(params, pass_, l2)
            self.sets, self.copy_data, self.copy_bytes = 3, [()] * 5, 3070

    timings = {
        "spio": Timing(1.0, 0.5, 2.0, 7, True),
        "torch": Timing(3.0, 2.5, 4.0, 7, False),
        "copy": Timing(0.5, 0.25, 0.75, 7, True),
    }
    _sweep_without_gpu(monkeypatch, Case, lambda call, warmup, reps: timings[call], timing="T")
    settings = BenchSettings(layers=(layer,), batch_sizes=(1,), passes=("fprop",))
    rows = {row.impl: row for row in run.run_bench(settings, "x")}
    assert list(rows) == ["spio", "torch", "copy"]
    got = {
        impl: (r.bytes, r.flops, r.rotation_sets, r.median_ms, r.p10_ms, r.p90_ms, r.timing)
        for impl, r in rows.items()
    }
    assert got == {
        "spio": (3072, 27648, 3, 1.0, 0.5, 2.0, "T"),
        "torch": (3072, 27648, 3, 3.0, 2.5, 4.0, "T (NOT fully pre-filled)"),
        "copy": (3070, 0, 5, 0.5, 0.25, 0.75, "T"),
    }
    assert all((r.r, r.s, r.pad_h, r.pad_w) == (1, 3, 0, 1) for r in rows.values())
    assert [r.selected_by for r in rows.values()] == ["heuristic", "", ""]
    # The kernel's name, with its variant (the config column has the config alone).
    kernel = run.spio_kernel(layer.params(1), "fprop").name
    assert kernel.endswith("__wcl") and [r.kernel for r in rows.values()] == [kernel, "", ""]
    assert [r.config for r in rows.values()] == [
        run.spio_kernel(layer.params(1), "fprop").info_value("config").encode(),
        "cudnn",
        "",
    ]


def test_copy_rotates_over_as_many_pairs_as_its_bytes_need():
    """A copy of 3072 bytes (768 fp16 elements read, 768 written) with a 100 kB L2: 3 x L2 is
    300,000 bytes, ceil(300000 / 3072) = 98 copies, plus one, 99 pairs."""
    from spio.bench.run import copy_pairs

    pairs = copy_pairs(3072, torch.float16, "cpu", l2_bytes=100_000)
    assert len(pairs) == 99
    assert all(src.numel() == dst.numel() == 768 for src, dst in pairs)


def test_precompile_builds_the_sum_a_partials_wgrad_runs(monkeypatch):
    """The bench's precompile builds each case's kernel and, after a partials WGrad kernel, the
    sum_slots kernel its wgrad call runs (gradients in the layer's dtype, as the op sums a
    half weight's), so that no build waits for the first timed call."""
    import spio.kernels.kernel
    from spio.bench import run
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    layer = P(n=2, c=16, h=8, w=8, has_bias=True)
    partials = wg.make_kernel(layer, wg.configs(layer)[0], partials=True)
    built = []
    monkeypatch.setattr(run, "spio_kernel", lambda params, pass_, device: partials)
    monkeypatch.setattr(
        spio.kernels.kernel, "build_kernels", lambda kernels, device: built.append(kernels) or {}
    )
    assert run.precompile([(layer, "wgrad")], "cuda") == {}
    assert built == [[partials, wg.sum_kernel(layer, "fp16", "fp16")]]
    bf16 = P(n=2, c=16, h=8, w=8, has_bias=True, dtype="bf16")
    run.precompile([(layer, "wgrad"), (bf16, "wgrad")], "cuda")
    assert built[1] == [
        partials,
        wg.sum_kernel(layer, "fp16", "fp16"),
        wg.sum_kernel(bf16, "bf16", "bf16"),
    ]


@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_spio_and_pytorch_take_the_sets_in_one_round(monkeypatch, pass_):
    """PyTorch's calls start on the set after spio's last (the copy has its own round): each
    timing had restarted at set 0, so where there are more sets than calls, cuDNN's timed calls
    read sets spio had read ~1 x L2 before (368c 7x7 at N = 32), and spio's read none twice."""
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    case = PassCase(TINY.params(1), pass_, l2_bytes=10**6, device="cpu")
    assert case.sets > 7
    given = []
    module, name = (wg, "wgrad") if pass_ == "wgrad" else (fd, pass_)
    monkeypatch.setattr(module, name, lambda first, *a, **k: given.append(first))
    read = "dy" if pass_ == "dgrad" else "x"
    set_of = {id(item[read]): i for i, item in enumerate(case.data)}
    spio_call, torch_call = case.spio_call(), case.torch_call()
    for i in range(3):  # each timing numbers its calls from 0
        spio_call(i)
    for i in range(4):
        torch_call(i)
    assert [set_of[id(t)] for t in given] == [0, 1, 2]
    kept = [i for i, item in enumerate(case.data) if item.get("torch_out") is not None]
    assert kept == [3, 4, 5, 6]
    copy = case.copy_call()
    copy(0)
    copy(1)
    assert case.copy_data.next_index() == 2


def test_a_rotation_takes_its_sets_in_turn_across_its_users():
    from spio.bench.timing import Rotation

    turn = Rotation("abc")
    assert [turn.take() for _ in range(4)] == ["a", "b", "c", "a"]
    assert (
        turn.next_index() == 1
        and len(turn) == 3
        and turn[2] == "c"
        and list(turn) == ["a", "b", "c"]
    )
    with pytest.raises(ValueError, match="at least one set"):
        Rotation([])
