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


def test_insitu_table_shows_speedup_and_unattributed_times():
    common = dict(layer="L", style="mbconv", n=8, dtype="fp16", pass_="fprop", calls=4,
                  step_ms=1.0, gpu="FIXTURE", driver="-", torch="-", spio="-", date="-",
                  command="-")  # fmt: skip
    rows = [
        InSituRow(
            impl="spio", us_per_call=10.0, kernels="k:10.0", event_us_per_call=12.0, **common
        ),  # fmt: skip
        InSituRow(
            impl="torch", us_per_call=30.0, kernels="c:30.0", event_us_per_call=33.0, **common
        ),  # fmt: skip
    ]
    table = format_insitu_table(rows)
    assert "3.00x" in table and "(e)" not in table  # profiler times win where they exist
    # The profiler attributed nothing to spio's pass (pytorch#144778): the event time stands in.
    rows[0] = InSituRow(impl="spio", us_per_call=math.nan, kernels="not attributed",
                        event_us_per_call=15.0, **common)  # fmt: skip
    lines = format_insitu_table(rows).splitlines()
    # spio us, torch us, and a speedup marked as comparing a profiler and an event time
    assert lines[2].split()[4:7] == ["(e)15.0", "30.0", "2.00x*"]
    assert lines[-2].startswith("(e): CUDA-event time")
    assert lines[-1].startswith("*: a profiler time against an event time")
    # Neither measure: no number, no speedup.
    rows[0] = InSituRow(impl="spio", us_per_call=math.nan, kernels="not attributed",
                        event_us_per_call=math.nan, **common)  # fmt: skip
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
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from spio.bench.insitu import tally_events

    def event(name, device, kernels=(), children=(), device_us=0.0):
        return SimpleNamespace(
            name=name,
            device_type=device,
            kernels=list(kernels),
            cpu_children=list(children),
            device_time_total=device_us,
        )

    kernel = SimpleNamespace(name="spio_conv2d_gw8", duration=7.0)
    launch = event("cuLaunchKernel", DeviceType.CPU, kernels=[kernel])
    events = []
    for _ in range(3):
        events += [
            event("bench::spio::fprop", DeviceType.CPU, children=[launch]),
            event("bench::spio::fprop", DeviceType.CUDA),  # the GPU-side annotation
            event("spio_conv2d_gw8", DeviceType.CUDA, device_us=7.0),
            event("spio_sum_slots", DeviceType.CUDA, device_us=1.0),  # WGrad's second pass
            event("void at::native::reduce_kernel", DeviceType.CUDA, device_us=5.0),
        ]
    found, spio_kernels = tally_events(events)
    assert found[("spio", "fprop")]["calls"] == 3
    assert found[("spio", "fprop")]["kernels"] == {"spio_conv2d_gw8": 21.0}
    assert spio_kernels == {"spio_conv2d_gw8": 21.0, "spio_sum_slots": 3.0}


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
