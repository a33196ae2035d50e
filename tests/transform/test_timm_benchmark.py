"""scripts/timm_benchmark.py: argument parsing, and a clear non-zero exit without a GPU or timm."""

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_script

SCRIPT = REPO / "scripts" / "timm_benchmark.py"


@pytest.fixture(scope="module")
def bench():
    return load_script("timm_benchmark")


def test_parse_args(bench):
    args = bench.parse_args(
        "--model regnetx_002 --spio --amp-dtype float16 --channels-last --bench train "
        "--batch-size 32 --img-size 160".split()
    )
    assert args.model == "regnetx_002" and args.spio and args.channels_last
    assert not args.spio_where_faster
    assert bench.parse_args(["--model", "m", "--spio-where-faster"]).spio_where_faster
    assert (args.amp_dtype, args.bench, args.batch_size, args.img_size) == (
        "float16",
        "train",
        32,
        160,
    )
    defaults = bench.parse_args(["--model", "resnet18"])
    assert not defaults.spio and not defaults.channels_last
    assert (defaults.amp_dtype, defaults.bench) == ("bfloat16", "inference")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--model", "m", "--amp-dtype", "float32"],
        ["--model", "m", "--bench", "eval"],
        ["--model", "m", "--batch-size", "0"],
    ],
)
def test_bad_arguments_exit_2(bench, argv, capsys):
    with pytest.raises(SystemExit) as info:
        bench.parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_steps_run_the_model_in_its_mode_and_drop_the_gradients(bench):
    """Inference steps run an eval-mode model; training steps a train-mode one, and each leaves
    no gradients behind (the next step would add to them). On the CPU, autocast("cuda") is off."""
    import warnings

    import torch

    model, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast("cuda") without CUDA warns and does nothing
        bench._step_fn(model, bench.parse_args(["--model", "m"]), x)()
        assert not model.training
        bench._step_fn(model, bench.parse_args(["--model", "m", "--bench", "train"]), x)()
    assert model.training and all(p.grad is None for p in model.parameters())


def test_missing_gpu_or_timm_exits_non_zero_with_message(bench, capsys):
    missing = bench.missing_requirements()
    if not missing:
        pytest.skip("this machine has a GPU and timm: the benchmark would run")
    assert bench.main(["--model", "resnet18", "--spio"]) == 2
    err = capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in err
    if importlib.util.find_spec("timm") is None:
        assert "needs timm" in err


def test_script_exit_status():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "resnet18"], capture_output=True, encoding="utf-8"
    )
    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("timm") is not None:
        pytest.skip("this machine has a GPU and timm: the benchmark would run")
    assert proc.returncode == 2
    assert "timm_benchmark needs" in proc.stderr


def test_profile_is_an_option(bench):
    args = bench.parse_args(["--model", "m", "--profile", "--profile-steps", "5"])
    assert args.profile and args.profile_steps == 5
    defaults = bench.parse_args(["--model", "m"])
    assert not defaults.profile and defaults.profile_steps == 3


def test_profile_steps_must_be_positive(bench, capsys):
    with pytest.raises(SystemExit) as info:
        bench.parse_args(["--model", "m", "--profile", "--profile-steps", "0"])
    assert info.value.code == 2
    assert "--profile-steps" in capsys.readouterr().err


# Three profiled steps: 900 µs of cudnn_fprop in 6 calls (two rows of the same name, which add
# up) is 300 µs and 2 calls a step; the memset with no device time is left out.
ROWS = [
    ("cudnn_fprop", 600.0, 3),
    ("void at::native::elementwise_kernel<128, 4>(int)", 300.0, 6),
    ("Memcpy DtoD (Device -> Device)", 30.0, 3),
    ("Memset (Device)", 0.0, 3),
    ("cudnn_fprop", 300.0, 3),
    ("tiny", 15.0, 3),
]


def test_summarize_kernels_per_step_most_time_first(bench):
    summary = bench.summarize_kernels(ROWS, steps=3)
    assert summary.rows == [
        ("cudnn_fprop", 300.0, 2.0),
        ("void at::native::elementwise_kernel<128, 4>(int)", 100.0, 2.0),
        ("Memcpy DtoD (Device -> Device)", 10.0, 1.0),
        ("tiny", 5.0, 1.0),
    ]
    assert summary.total_us == 415.0
    assert summary.launches == 5.0  # 2 + 2 + 1 kernel launches; the memcpy is not one
    assert summary.memops == 1.0  # the memset had no device time
    with pytest.raises(ValueError):
        bench.summarize_kernels(ROWS, steps=0)


def test_summarize_kernels_breaks_ties_by_name(bench):
    summary = bench.summarize_kernels([("b", 6.0, 1), ("a", 6.0, 1), ("c", 9.0, 1)], steps=2)
    assert [row[0] for row in summary.rows] == ["c", "a", "b"]
    assert summary.total_us == 10.5 and summary.launches == 1.5 and summary.memops == 0


def test_kernel_table_cuts_at_top_and_sums_the_rest(bench):
    summary = bench.summarize_kernels(ROWS, steps=3)
    lines = bench.format_kernel_table("pytorch", summary, steps=3, top=2, step_us=830.0)
    assert lines[0] == (
        "pytorch: GPU time per step (3 steps profiled), top 2 of 4 kernels and memcpy/memset"
    )
    assert lines[1].split() == ["calls", "µs/step", "share", "kernel"]
    # 300 / 415 = 72.3 %, 100 / 415 = 24.1 %; the two cut rows are 10 + 5 = 15 µs, 3.6 %
    assert lines[2].split() == ["2.0", "300.0", "72.3%", "cudnn_fprop"]
    assert lines[3].split() == ["2.0", "100.0", "24.1%", "elementwise_kernel<128,", "4>(int)"]
    assert lines[4].split() == ["15.0", "3.6%", "(2", "more)"]
    assert lines[5] == (
        "  GPU time 415.0 µs/step (50% of the 830 µs timed step); 5.0 kernel launches, "
        "1.0 memcpy/memset per step"
    )
    assert len(lines) == 6
    whole = bench.format_kernel_table("pytorch", summary, steps=3)
    assert len(whole) == 2 + 4 + 1 and "timed step" not in whole[-1]
    empty = bench.summarize_kernels([], steps=3)
    assert bench.format_kernel_table("spio", empty, steps=3)[-1] == "  no GPU activity recorded"


def test_short_name_drops_namespaces_and_cuts_long_names(bench):
    assert bench.short_name("void at::native::(anonymous namespace)::foo<float>(int)") == (
        "foo<float>(int)"
    )
    long = "k" * 100
    assert bench.short_name(long) == "k" * 67 + "..." and len(bench.short_name(long)) == 70
    assert bench.short_name("k" * 70) == "k" * 70


# Per step, pytorch: cudnn_fprop 300, cudnn_dgrad 50, elem 100, memcpy 10 (460 µs, 5 launches);
# spio: spio_fprop 150, elem 200, transpose 40, cudnn_fprop 20, memcpy 10 (420 µs, 8 launches).
BASE = [("cudnn_fprop", 900.0, 6), ("cudnn_dgrad", 150.0, 3), ("elem", 300.0, 6)]
BASE += [("Memcpy DtoD", 30.0, 3)]
OTHER = [("spio_fprop", 450.0, 3), ("elem", 600.0, 12), ("Memcpy DtoD", 30.0, 3)]
OTHER += [("transpose", 120.0, 6), ("cudnn_fprop", 60.0, 3)]


def test_kernel_deltas_growth_first_and_unchanged_left_out(bench):
    base, other = bench.summarize_kernels(BASE, 3), bench.summarize_kernels(OTHER, 3)
    assert bench.kernel_deltas(base, other) == [
        ("spio_fprop", 150.0),
        ("elem", 100.0),
        ("transpose", 40.0),
        ("cudnn_dgrad", -50.0),
        ("cudnn_fprop", -280.0),
    ]


def test_comparison_lists_the_top_growth_and_shrinkage(bench):
    base, other = bench.summarize_kernels(BASE, 3), bench.summarize_kernels(OTHER, 3)
    lines = bench.format_comparison("pytorch", base, "spio", other, top=2)
    assert lines[0] == (
        "spio vs pytorch: GPU time -40.0 µs/step (460.0 -> 420.0), kernel launches +3.0, "
        "memcpy/memset +0.0 per step"
    )
    assert [line.split() for line in lines[1:]] == [
        ["grew", "most", "(µs/step):"],
        ["+150.0", "new", "spio_fprop"],
        ["+100.0", "elem"],  # transpose's +40 is past the top 2
        ["shrank", "most", "(µs/step):"],
        ["-280.0", "cudnn_fprop"],
        ["-50.0", "gone", "cudnn_dgrad"],
    ]
    assert len(bench.format_comparison("pytorch", base, "spio", other)) == 1 + 1 + 3 + 1 + 2


def test_kernel_rows_keeps_device_activity_and_reads_either_time_attribute(bench):
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    events = [
        SimpleNamespace(
            key="aten::conv", device_type=DeviceType.CPU, device_time_total=90, count=1
        ),
        SimpleNamespace(key="k1", device_type=DeviceType.CUDA, device_time_total=12.5, count=2),
        SimpleNamespace(key="idle", device_type=DeviceType.CUDA, device_time_total=0, count=4),
        SimpleNamespace(key="k2", device_type=DeviceType.CUDA, cuda_time_total=7, count=1),
        SimpleNamespace(key="cudaStreamSynchronize", device_type=DeviceType.CPU, count=4),
        SimpleNamespace(key="cudaLaunchKernel", device_type=DeviceType.CPU, count=9),
    ]
    assert bench.kernel_rows(events) == [("k1", 12.5, 2), ("k2", 7.0, 1)]
    syncs = bench.host_syncs(events)
    assert syncs == {"cudaStreamSynchronize": 4}
    assert bench.format_syncs(syncs, 3).startswith("  host syncs in 3 steps: cudaStreamSync")
    assert "steps: none" in bench.format_syncs({}, 3)


def test_kernel_rows_of_a_real_cpu_profile_is_empty(bench):
    """The profiler's own events go through kernel_rows and host_syncs without error; on the CPU
    there is no GPU activity and no sync."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    events = prof.key_averages()
    assert bench.kernel_rows(events) == [] and bench.host_syncs(events) == {}


def test_print_profiles_compares_each_spio_variant_and_survives_a_failure(
    bench, monkeypatch, capsys
):
    summaries = {
        "P": bench.summarize_kernels(BASE, 3),
        "S": bench.summarize_kernels(OTHER, 3),
    }

    def profile_model(model, args):
        if model == "F":
            raise RuntimeError("CUPTI unavailable")
        copies = {("aten::copy_", "[[4, 8], [4, 8], []]"): 2.0 if model == "S" else 1.0}
        return summaries[model], {"cudaStreamSynchronize": 3}, copies

    monkeypatch.setattr(bench, "profile_model", profile_model)
    args = bench.parse_args(["--model", "m", "--profile", "--batch-size", "10"])
    variants = {"pytorch": "P", "spio": "S", "spio-faster": "F"}
    bench.print_profiles(variants, {"pytorch": 10_000.0, "spio": 20_000.0}, args)
    out = capsys.readouterr().out
    # 10 samples at 10,000/s: a 1000 µs step, of which pytorch's GPU time is 460 µs
    assert "GPU time 460.0 µs/step (46% of the 1000 µs timed step)" in out
    assert "GPU time 420.0 µs/step (84% of the 500 µs timed step)" in out
    assert out.count("host syncs in 3 steps: cudaStreamSynchronize 3") == 2
    assert "profile of spio-faster failed: RuntimeError: CUPTI unavailable" in out
    assert "spio vs pytorch: GPU time -40.0 µs/step" in out
    assert "spio vs pytorch: copying ops per step by input shapes" in out
    assert "+1.0  aten::copy_ [[4, 8], [4, 8], []]" in out
    assert "spio-faster vs pytorch" not in out


def test_copy_calls_count_copying_ops_by_input_shapes_per_step(bench):
    """A real CPU profile with shapes recorded: each copying op is counted per step by its input
    shapes (a clone of a 4x8 and a copy into an 8x2, twice each over 2 steps), other ops left
    out; the comparison lists what one side copies more, then less, and says when they match."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.ones(4, 8), torch.empty(8, 2)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            a.clone()
            b.copy_(torch.ones(8, 2))
            torch.mm(a, a.t())
    calls = bench.copy_calls(prof.key_averages(group_by_input_shape=True), 2)
    assert calls[("aten::copy_", "[[8, 2], [8, 2], []]")] == 1.0
    assert any(op == "aten::clone" and "[4, 8]" in shapes for op, shapes in calls)
    assert all(op in bench.COPY_OPS for op, _ in calls)
    other = {key: n for key, n in calls.items() if key[0] != "aten::clone"}  # one fewer op
    other[("aten::contiguous", "[[3, 3], []]")] = 2.0  # and one more
    lines = bench.format_copy_comparison("pytorch", calls, "spio", other)
    assert lines[0] == "spio vs pytorch: copying ops per step by input shapes"
    assert lines[1].split()[:2] == ["+2.0", "aten::contiguous"]
    assert lines[2].split()[1] == "aten::clone" and lines[2].split()[0].startswith("-")
    assert bench.format_copy_comparison("pytorch", calls, "spio", dict(calls)) == [
        "spio vs pytorch: the same copying ops per step"
    ]


def test_cuda_graph_is_an_option(bench):
    assert not bench.parse_args(["--model", "m"]).cuda_graph
    assert bench.parse_args(["--model", "m", "--cuda-graph"]).cuda_graph


def test_print_graphed_compares_each_spio_variant_and_survives_a_failure(
    bench, monkeypatch, capsys
):
    def time_graphed(model, args):
        if model == "F":
            raise RuntimeError("operation not permitted when stream is capturing")
        return {"P": 1000.0, "S": 1250.0}[model]

    monkeypatch.setattr(bench, "time_graphed", time_graphed)
    args = bench.parse_args(["--model", "m", "--cuda-graph"])
    graphed = bench.print_graphed({"pytorch": "P", "spio": "S", "spio-faster": "F"}, args)
    out = capsys.readouterr().out
    assert graphed == {"pytorch": 1000.0, "spio": 1250.0}
    assert "spio         1250.0 samples/s in a CUDA graph" in out
    assert "spio-faster in a CUDA graph failed: RuntimeError: operation not permitted" in out
    assert "spio / pytorch in CUDA graphs = 1.250" in out
    assert "spio-faster / pytorch in CUDA graphs" not in out


def test_captured_steps_go_without_autocast_cast_cache(bench, monkeypatch):
    """The step captured in a graph enters autocast with cache_enabled=False (PyTorch's notes on
    autocast and CUDA graphs); the eager step with autocast's default."""
    import torch

    seen = []
    real = torch.autocast

    def autocast(*args, **kwargs):
        seen.append(kwargs.get("cache_enabled", True))
        kwargs["enabled"] = False  # (no CUDA here)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", autocast)
    model, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    for bench_kind in ("inference", "train"):
        args = bench.parse_args(["--model", "m", "--bench", bench_kind])
        bench._step_fn(model, args, x)()
        bench._step_fn(model, args, x, cache_casts=False)()
    assert seen == [True, False, True, False]


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["train", "inference"])
def test_time_graphed_replays_a_spio_model(bench, kind, monkeypatch):
    """A small model with spio layers (and a BatchNorm, as timm's have) is captured and replayed
    in a CUDA graph, eager-timed first as main() does; its steps there run spio's kernels, every
    pass of them in training."""
    import torch

    import spio.transform
    from tests.conftest import spy_on_launches

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1),
        torch.nn.Conv2d(64, 64, 3, padding=1, groups=8),
        torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1, groups=8, bias=False),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    )
    model = spio.transform.transform(model).cuda().to(memory_format=torch.channels_last)
    argv = ["--model", "m", "--bench", kind, "--batch-size", "8", "--img-size", "16"]
    args = bench.parse_args(argv + ["--channels-last", "--warmup", "2", "--iters", "3"])
    assert bench.time_model(model, args) > 0
    launched = spy_on_launches(monkeypatch)
    assert bench.time_graphed(model, args) > 0
    passes = {"conv2d_gw8_fprop"} | (
        {"conv2d_gw8_dgrad", "conv2d_gw8_wgrad"} if kind == "train" else set()
    )
    assert passes <= set(launched), launched
