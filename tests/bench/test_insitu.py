"""In-situ stacks on the CPU: spio's autograd wiring (emulator) matches PyTorch's, and the stacks
build and train at the table layer's shape. Profiling itself needs a GPU (test_run_cuda.py)."""

import itertools
import math

import pytest
import torch

from spio.bench.insitu import (
    GwConv,
    InSituRow,
    format_insitu_table,
    make_stack,
    stack_input_channels,
    training_step,
)
from spio.bench.layers import BenchLayer

TINY = BenchLayer("tiny_16c_6x5_3x3", 16, 6, 5)
TINY_1X3 = BenchLayer("tiny_16c_4x9_1x3", 16, 4, 9, 1, 3, (0, 1))


@pytest.mark.parametrize("layer", [TINY, TINY_1X3], ids=lambda layer: layer.name)
def test_spio_conv_gradients_match_pytorch_in_the_emulator(layer):
    torch.manual_seed(0)
    spio_conv, torch_conv = GwConv(layer, "spio"), GwConv(layer, "torch")
    torch_conv.load_state_dict(spio_conv.state_dict())
    spio_conv.half(), torch_conv.half()
    x = torch.randn(2, layer.c, layer.h, layer.w, dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last)
    outputs = {}
    for name, conv in (("spio", spio_conv), ("torch", torch_conv)):
        xi = x.clone().requires_grad_()
        y = conv(xi)
        y.float().square().sum().backward()
        outputs[name] = (y.float(), xi.grad.float(), conv.weight.grad.float())
    for got, want in zip(outputs["spio"], outputs["torch"], strict=True):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("style", ["convfirst", "mbconv"])
def test_stacks_train_at_the_layer_shape(style):
    torch.manual_seed(0)
    stack = make_stack(style, TINY, "torch", depth=2).to(memory_format=torch.channels_last)
    x = torch.randn(2, stack_input_channels(style, TINY), TINY.h, TINY.w)
    assert stack(x).shape == x.shape
    training_step(stack, x)
    assert all(p.grad is None for p in stack.parameters())
    convs = [m for m in stack.modules() if isinstance(m, GwConv)]
    assert len(convs) == 2 and all(c.weight.shape == (16, 8, 3, 3) for c in convs)


def test_make_stack_rejects_unknown_style_and_impl():
    with pytest.raises(ValueError, match="stack style"):
        make_stack("resnet", TINY, "torch")
    with pytest.raises(ValueError, match="impl"):
        GwConv(TINY, "cudnn")


#: The fields of an InSituRow that the table tests do not vary.
_ROW_FIELDS = dict(layer="L", style="mbconv", n=8, dtype="fp16", pass_="fprop", calls=4,
                   step_ms=1.0, gpu="FIXTURE", driver="-", torch="-", spio="-", date="-",
                   command="-")  # fmt: skip


def test_insitu_table_shows_speedup_and_unattributed_times():
    rows = [
        InSituRow(
            impl="spio", us_per_call=10.0, kernels="k:10.0", event_us_per_call=12.0, **_ROW_FIELDS
        ),  # fmt: skip
        InSituRow(
            impl="torch", us_per_call=30.0, kernels="c:30.0", event_us_per_call=33.0, **_ROW_FIELDS
        ),  # fmt: skip
    ]
    table = format_insitu_table(rows)
    assert "3.00x" in table and "(e)" not in table  # profiler times win where they exist
    # The profiler attributed nothing to spio's pass (pytorch#144778): the event time stands in.
    rows[0] = InSituRow(impl="spio", us_per_call=math.nan, kernels="not attributed",
                        event_us_per_call=15.0, **_ROW_FIELDS)  # fmt: skip
    lines = format_insitu_table(rows).splitlines()
    # spio us, torch us, and a speedup marked as comparing a profiler and an event time
    assert lines[2].split()[4:7] == ["(e)15.0", "30.0", "2.00x*"]
    assert lines[-2].startswith("(e): CUDA-event time")
    assert lines[-1].startswith("*: a profiler time against an event time")
    # Neither measure: no number, no speedup.
    rows[0] = InSituRow(impl="spio", us_per_call=math.nan, kernels="not attributed",
                        event_us_per_call=math.nan, **_ROW_FIELDS)  # fmt: skip
    fields = format_insitu_table(rows).splitlines()[2].split()
    assert fields[4:7] == ["-", "30.0", "-"]


def _fake_events(monkeypatch, times) -> None:
    """torch.cuda.Event replaced by stand-ins whose elapsed times are the next of `times` (ms)."""

    class FakeEvent:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return next(times)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_profile_passes_counts_ranges_and_event_times_on_cpu(monkeypatch):
    """profile_passes' bookkeeping without a GPU: CUDA events are stand-ins that report 0.25 ms
    per pass, so every pass of both impls gets calls = depth x steps and 250 µs of event time."""
    from spio.bench import insitu

    monkeypatch.setenv("SPIO_EMULATE", "1")
    _fake_events(monkeypatch, itertools.repeat(0.25))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    for impl in ("torch", "spio"):
        torch.manual_seed(0)
        stack = make_stack("convfirst", TINY, impl, depth=2).half()
        stack = stack.to(memory_format=torch.channels_last)
        x = (
            torch.randn(2, TINY.c, TINY.h, TINY.w)
            .half()
            .contiguous(memory_format=torch.channels_last)
        )
        found = insitu.profile_passes(stack, x, steps=3)
        for pass_ in ("fprop", "dgrad", "wgrad"):
            entry = found[(impl, pass_)]
            assert entry["calls"] == 2 * 3, (impl, pass_, entry)
            assert entry["event_us"] == pytest.approx(250.0)
        assert insitu._events is None  # switched off after profiling


def test_tally_counts_each_range_once_though_the_profiler_reports_it_on_both_sides():
    """PyTorch 2.11 on an H200 reported every bench:: range twice, as the CPU range and as a GPU
    user annotation: calls came out 12 where 6 were made. Only the CPU event counts."""
    from spio.bench.insitu import tally_events

    found, spio_kernels = tally_events(_profiled_fprops(3))
    assert found[("spio", "fprop")]["calls"] == 3
    assert found[("spio", "fprop")]["kernels"] == {"spio_conv2d_gw8": 21.0}
    assert spio_kernels == {"spio_conv2d_gw8": 21.0, "spio_sum_slots": 3.0}


def _event(name, device, kernels=(), children=(), device_us=0.0):
    """A stand-in for a torch.profiler event."""
    from types import SimpleNamespace

    return SimpleNamespace(
        name=name,
        device_type=device,
        kernels=list(kernels),
        cpu_children=list(children),
        device_time_total=device_us,
    )


def _profiled_fprops(calls: int) -> list:
    """Profiler events of `calls` spio FProp passes of one 7 µs kernel each (and WGrad's 1 µs
    second kernel, and a PyTorch kernel), each range reported on both sides."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    kernel = SimpleNamespace(name="spio_conv2d_gw8", duration=7.0)
    launch = _event("cuLaunchKernel", DeviceType.CPU, kernels=[kernel])
    events = []
    for _ in range(calls):
        events += [
            _event("bench::spio::fprop", DeviceType.CPU, children=[launch]),
            _event("bench::spio::fprop", DeviceType.CUDA),  # the GPU-side annotation
            _event("spio_conv2d_gw8", DeviceType.CUDA, device_us=7.0),
            _event("spio_sum_slots", DeviceType.CUDA, device_us=1.0),  # WGrad's second pass
            _event("void at::native::reduce_kernel", DeviceType.CUDA, device_us=5.0),
        ]
    return events


def test_tally_sums_kernels_of_a_range_its_children_and_theirs_once_each():
    """Kernels hang off the range's own event and off CPU events at any depth below it; a CPU
    event named like a spio kernel (its device time is its kernels') adds nothing to them."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from spio.bench.insitu import tally_events

    def kernel(name, us):
        return SimpleNamespace(name=name, duration=us)

    grandchild = _event("cuLaunchKernel", DeviceType.CPU, kernels=[kernel("spio_b", 2.0)])
    children = [
        _event("cuLaunchKernel", DeviceType.CPU, kernels=[kernel("spio_a", 1.0)]),
        _event("spio::op", DeviceType.CPU, children=[grandchild]),
    ]
    range_ = _event(
        "bench::spio::dgrad", DeviceType.CPU, kernels=[kernel("spio_a", 4.0)], children=children
    )
    cpu_side = _event("spio_a", DeviceType.CPU, device_us=5.0)
    found, spio_kernels = tally_events([range_, cpu_side])
    assert found == {("spio", "dgrad"): {"calls": 1, "kernels": {"spio_a": 5.0, "spio_b": 2.0}}}
    assert spio_kernels == {}


def test_insitu_table_puts_each_impls_step_time_in_its_own_column():
    common = dict(layer="L", style="convfirst", n=8, dtype="fp16", pass_="dgrad", calls=4,
                  kernels="k:1.0", event_us_per_call=1.0, gpu="FIXTURE", driver="-", torch="-",
                  spio="-", date="-", command="-")  # fmt: skip
    rows = [
        InSituRow(impl="spio", us_per_call=20.0, step_ms=1.5, **common),
        InSituRow(impl="torch", us_per_call=10.0, step_ms=2.25, **common),
    ]
    fields = format_insitu_table(rows).splitlines()[2].split()
    # spio us, torch us, speedup (torch / spio), spio step ms, torch step ms
    assert fields[4:] == ["20.0", "10.0", "0.50x", "1.500", "2.250"]


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_step_time_is_the_median_of_the_steps_not_the_mean(monkeypatch):
    """Stand-in CUDA events time the three steps at 1, 7 and 1 ms: the median is 1 (the mean
    would be 3)."""
    from spio.bench.insitu import step_time_ms

    _fake_events(monkeypatch, iter([1.0, 7.0, 1.0]))
    stack = make_stack("convfirst", TINY, "torch", depth=1)
    x = torch.randn(1, TINY.c, TINY.h, TINY.w)
    assert step_time_ms(stack, x, steps=3) == 1.0


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_profile_passes_keeps_every_spio_kernel_seen_for_unattributed_launches(monkeypatch):
    """("spio", "all") holds the profiler's spio kernels, linked to a range or not, and the steps
    profiled; each range gets its event time. A stand-in profiler reports three FProp passes."""
    from contextlib import contextmanager

    from spio.bench import insitu

    _fake_events(monkeypatch, itertools.repeat(0.5))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def training_step(stack, x):
        with insitu._pass("spio", "fprop"):
            pass

    @contextmanager
    def profile(activities):
        yield FakeProfile()

    class FakeProfile:
        def events(self):
            return _profiled_fprops(3)

    monkeypatch.setattr(insitu, "training_step", training_step)
    monkeypatch.setattr(torch.profiler, "profile", profile)
    found = insitu.profile_passes(None, None, steps=3)
    assert found[("spio", "all")] == {
        "calls": 3,
        "kernels": {"spio_conv2d_gw8": 21.0, "spio_sum_slots": 3.0},
    }
    assert found[("spio", "fprop")]["calls"] == 3
    assert found[("spio", "fprop")]["event_us"] == pytest.approx(500.0)


class _Stack:
    """A stand-in stack of one implementation: `.to()` keeps it as it is."""

    def __init__(self, impl):
        self.impl = impl

    def to(self, **kwargs):
        return self


def _stand_in_stacks(monkeypatch, measured):
    """run_insitu's GPU work stood in for: zeros for its inputs, _Stack stacks, 2.5 ms steps,
    and measured(stack) for what the profiler saw."""
    from spio.bench import insitu

    zeros = torch.zeros
    monkeypatch.setattr(torch, "randn", lambda shape, device, dtype: zeros(shape, dtype=dtype))
    monkeypatch.setattr(insitu, "make_stack", lambda style, layer, impl, depth: _Stack(impl))
    monkeypatch.setattr(insitu, "training_step", lambda stack, x: None)
    monkeypatch.setattr(insitu, "step_time_ms", lambda stack, x, steps: 2.5)
    monkeypatch.setattr(insitu, "profile_passes", lambda stack, x, steps: measured(stack))


def test_run_insitu_rows_give_per_call_times_and_name_unattributed_kernels(monkeypatch):
    """run_insitu's rows from stand-in measurements (no GPU): kernel time per call, the kernels
    behind it, spio's kernels per step where the profiler linked none to the range, and a pass
    it saw no call of; one row per stack, implementation and requested pass, in that order."""
    from spio.bench import insitu, run
    from spio.bench.results import RunInfo

    precompiled = []
    monkeypatch.setattr(run, "precompile", lambda cases, device: precompiled.extend(cases))
    for flag in ("benchmark", "benchmark_limit"):  # set by run_insitu: undone after
        monkeypatch.setattr(torch.backends.cudnn, flag, getattr(torch.backends.cudnn, flag))
    measured = {
        "spio": {
            ("spio", "fprop"): {"calls": 4, "kernels": {"b": 8.0, "a": 4.0}, "event_us": 3.5},
            ("spio", "dgrad"): {"calls": 4, "kernels": {}, "event_us": 5.0},
            ("spio", "all"): {"calls": 10, "kernels": {"spio_y": 30.0, "spio_x": 50.0}},
        },
        "torch": {("torch", "fprop"): {"calls": 2, "kernels": {"c": 20.0}, "event_us": 11.0}},
    }
    _stand_in_stacks(monkeypatch, lambda stack: measured[stack.impl])
    info = RunInfo("GPU", "drv", "t", "c", "s", "today", "cmd", "timing")
    rows = insitu.run_insitu([TINY], 2, "bf16", info, passes=("wgrad", "fprop", "dgrad"), steps=10)
    assert precompiled == [(TINY.params(2, "bf16"), p) for p in ("fprop", "dgrad", "wgrad")]
    # cuDNN's baseline at its best, as in the isolated bench: every algorithm tried.
    assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.benchmark_limit == 0
    assert [(r.style, r.impl, r.pass_) for r in rows] == [
        (style, impl, pass_)
        for style in ("convfirst", "mbconv")
        for impl in ("spio", "torch")
        for pass_ in ("wgrad", "fprop", "dgrad")
    ]
    got = {(r.impl, r.pass_): (r.calls, r.us_per_call, r.kernels, r.event_us_per_call)
           for r in rows if r.style == "mbconv"}  # fmt: skip
    assert got[("spio", "fprop")] == (4, 3.0, "a:1.0;b:2.0", 3.5)
    calls, us, kernels, event_us = got[("spio", "dgrad")]
    assert (calls, kernels, event_us) == (4, "not attributed; per step: spio_x:5.0;spio_y:3.0", 5.0)
    assert math.isnan(us)
    calls, us, kernels, event_us = got[("spio", "wgrad")]  # no call seen
    assert (calls, us, kernels) == (0, 0, "") and math.isnan(event_us)
    assert got[("torch", "fprop")] == (2, 10.0, "c:10.0", 11.0)
    assert {(r.n, r.dtype, r.step_ms, r.gpu, r.command) for r in rows} == {
        (2, "bf16", 2.5, "GPU", "cmd")
    }


def test_a_stack_that_fails_is_left_out_and_the_rows_so_far_are_written(monkeypatch, tmp_path):
    """One stack out of memory had ended the run with a traceback and no CSV (the earlier run's
    moved aside already): the others are profiled, the rows written after every stack."""
    import csv

    from spio.bench import insitu, run
    from spio.bench.results import RunInfo

    monkeypatch.setattr(run, "precompile", lambda cases, device: None)
    monkeypatch.setattr(run, "cudnn_at_its_best", lambda: "")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # the context still works
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    seen = {"calls": 2, "kernels": {"k": 4.0}, "event_us": 3.0}
    _stand_in_stacks(monkeypatch, lambda stack: {(stack.impl, "fprop"): seen})
    made = []

    def make_stack(style, layer, impl, depth):
        made.append((style, impl))
        if len(made) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 GiB")
        return _Stack(impl)

    monkeypatch.setattr(insitu, "make_stack", make_stack)
    info = RunInfo("GPU", "drv", "t", "c", "s", "today", "cmd", "timing")
    sizes = []
    write = insitu.write_insitu_csv

    def counted(rows, path):
        sizes.append(len(rows))
        return write(rows, path)

    monkeypatch.setattr(insitu, "write_insitu_csv", counted)
    path = tmp_path / "insitu_bf16.csv"
    rows = insitu.run_insitu([TINY], 2, "bf16", info, passes=("fprop",), csv_path=path)
    assert len(made) == 4  # every stack tried
    assert [(r.style, r.impl) for r in rows] == [
        ("convfirst", "spio"), ("convfirst", "torch"), ("mbconv", "torch")
    ]  # fmt: skip
    assert sizes == [1, 2, 2, 3]  # after every stack, once there are rows
    with open(path, newline="") as f:
        written = [(r["style"], r["impl"], float(r["us_per_call"])) for r in csv.DictReader(f)]
    assert written == [(r.style, r.impl, 2.0) for r in rows]
    # A broken CUDA context stops the run at the stack that met it.
    made.clear()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: (_ for _ in ()).throw(RuntimeError()))
    rows = insitu.run_insitu([TINY], 2, "bf16", info, passes=("fprop",))
    assert len(made) == 3 and len(rows) == 2


def test_insitu_table_takes_a_zero_event_time_for_no_measurement():
    """Events recorded back to back measure 0 µs: that is no time to show or divide by."""
    rows = [
        InSituRow(
            impl="spio",
            us_per_call=math.nan,
            kernels="not attributed",
            event_us_per_call=0.0,
            **_ROW_FIELDS,
        ),  # fmt: skip
        InSituRow(
            impl="torch", us_per_call=30.0, kernels="c:30.0", event_us_per_call=33.0, **_ROW_FIELDS
        ),  # fmt: skip
    ]
    lines = format_insitu_table(rows).splitlines()
    assert lines[2].split()[4:7] == ["-", "30.0", "-"] and len(lines) == 3
