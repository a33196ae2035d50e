"""where_faster: transform's `include` chosen by timing each pass of each layer in spio and in
PyTorch. The GPU timer is replaced by a fake here; the real one runs under `-m cuda`."""

import contextlib
import logging

import pytest
import torch
from torch import nn

import spio
from spio.layers import Conv2dGw8
from spio.transform import where_faster
from tests.transform import convnet


class FakeTimer:
    """spio takes 1 s per pass on 3x3 layers and 3 s elsewhere; PyTorch always 2 s."""

    def __init__(self):
        self.calls = []

    def __call__(self, params, pass_, impl):
        self.calls.append((params.encode(), pass_, impl))
        if impl == "torch":
            return 2.0
        return 1.0 if (params.r, params.s) == (3, 3) else 3.0


def test_keeps_spio_only_where_it_was_faster(caplog):
    torch.manual_seed(0)
    model = convnet.MixedConvNet().half()
    x = torch.randn(2, 3, 9, 8, dtype=torch.float16)
    timer = FakeTimer()
    with caplog.at_level(logging.INFO, logger="spio"):
        include = where_faster(model, x, timer=timer)
        spio.transform(model, include=include)
    kinds = {name: type(m) for name, m in model.named_modules()}
    assert kinds["blocks.0"] is Conv2dGw8 and kinds["shared_a"] is Conv2dGw8  # 3x3: faster
    assert kinds["blocks.3"] is nn.Conv2d and kinds["heads.row"] is nn.Conv2d  # 5x5, 1x3: slower
    assert "replaced 2 of 10 nn.Conv2d modules (2 excluded)" in caplog.text
    # Each distinct layer timed once per pass and implementation; training: all three passes.
    layers = {c[0] for c in timer.calls}
    assert len(layers) == 4 and len(timer.calls) == 4 * 3 * 2
    assert {c[1] for c in timer.calls} == {"fprop", "dgrad", "wgrad"}
    assert "fprop spio 1000000.0 us / PyTorch 2000000.0 us" in caplog.text
    assert "; spio runs fprop+dgrad+wgrad" in caplog.text
    assert "; spio runs nothing (PyTorch's layer)" in caplog.text
    assert model.blocks[0].spio_passes == ("fprop", "dgrad", "wgrad")


def test_runs_spio_for_the_passes_it_won(caplog):
    """spio faster in FProp and DGrad, slower in WGrad (as on run 5's H200 for most layers): the
    layer keeps spio for the first two and PyTorch's WGrad."""
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)).half()

    def timer(params, pass_, impl):
        return 2.0 if impl == "torch" else {"fprop": 1.0, "dgrad": 2.0, "wgrad": 3.0}[pass_]

    include = where_faster(model, torch.randn(2, 16, 8, 8).half(), timer=timer)
    assert include("0", model[0]) == ("fprop", "dgrad")  # a tie goes to spio
    with caplog.at_level(logging.INFO, logger="spio"):
        spio.transform(model, include=include)
    assert isinstance(model[0], Conv2dGw8) and model[0].spio_passes == ("fprop", "dgrad")
    assert "replaced 1 of 1 nn.Conv2d modules; spio runs fprop 1, dgrad 1, wgrad 0" in caplog.text


def test_applies_to_a_model_transformed_before(caplog):
    """The README's quick start transforms first; `transform(model, include=where_faster(...))`
    then had left every layer's three spio passes (include was never asked about a Conv2dGw8),
    while where_faster's log said PyTorch's layer would run. Now a transformed model ends with
    the passes a fresh one gets: here spio's FProp and DGrad on 3x3 layers, none elsewhere."""
    torch.manual_seed(0)
    fresh, twice = convnet.MixedConvNet().half(), convnet.MixedConvNet().half()
    x = torch.randn(2, 3, 9, 8, dtype=torch.float16)

    def timer(params, pass_, impl):
        if impl == "torch":
            return 2.0
        return 3.0 if pass_ == "wgrad" or (params.r, params.s) != (3, 3) else 1.0

    spio.transform(fresh, include=where_faster(fresh, x, timer=timer))
    spio.transform(twice)
    with caplog.at_level(logging.INFO, logger="spio"):
        spio.transform(twice, include=where_faster(twice, x, timer=timer))

    def passes(model):
        return {
            name: getattr(m, "spio_passes", ())
            for name, m in model.named_modules()
            if isinstance(m, nn.Conv2d)
        }

    assert passes(twice) == passes(fresh)
    assert passes(fresh)["blocks.0"] == ("fprop", "dgrad") and passes(fresh)["blocks.3"] == ()
    assert "set the passes of 4 Conv2dGw8 layers by include: spio runs fprop 2, dgrad 2" in (
        caplog.text
    )


def test_inference_times_fprop_only_and_unreached_convs_stay():
    class TwoPaths(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Conv2d(16, 16, 3, padding=1, groups=2)
            self.unused = nn.Conv2d(16, 16, 3, padding=1, groups=2)
            self.twice = nn.Conv2d(16, 16, 3, padding=1, groups=2)

        def forward(self, x):
            x = self.used(x)
            # The same module on two layers: spio must win on both (the fake makes 4x4 lose).
            return self.twice(x) + nn.functional.interpolate(
                self.twice(x[..., :4, :4]), x.shape[2:]
            )

    def timer(params, pass_, impl):
        assert pass_ == "fprop"
        return 2.0 if impl == "torch" else (3.0 if params.h == 4 else 1.0)

    model = TwoPaths().half()
    include = where_faster(model, torch.randn(1, 16, 8, 8).half(), training=False, timer=timer)
    assert include("used", model.used) == ("fprop", "dgrad", "wgrad")
    assert include("unused", model.unused) == () and include("twice", model.twice) == ()


def test_needs_a_gpu_unless_given_a_timer():
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)).half()
    with pytest.raises(ValueError, match="one GPU the inputs are on; got inputs on cpu"):
        where_faster(model, torch.randn(1, 16, 8, 8).half())


def test_inputs_off_the_gpu_are_refused_before_the_forward_pass(caplog):
    """A CPU input (fp32, as a user may first try) had run the whole forward first, whose
    fallback warnings came before the error and used up the once-only one."""
    calls = []
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2))
    model.register_forward_hook(lambda *args: calls.append(1))
    with caplog.at_level("WARNING", logger="spio"):
        with pytest.raises(ValueError, match="one GPU the inputs are on; got inputs on cpu"):
            where_faster(model, torch.randn(3, 16, 7, 9))
    assert calls == [] and caplog.records == []


@pytest.mark.cuda
def test_where_faster_times_on_the_gpu(caplog):
    """On a GPU: real, positive times for both implementations, and a decision that follows them."""
    import re

    model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, groups=8)).cuda().half()
    x = torch.randn(8, 64, 32, 32, device="cuda", dtype=torch.float16)
    with caplog.at_level(logging.INFO, logger="spio"):
        include = where_faster(model, x.contiguous(memory_format=torch.channels_last))
    found = re.findall(r"(fprop|dgrad|wgrad) spio ([0-9.]+) us / PyTorch ([0-9.]+) us", caplog.text)
    assert [f[0] for f in found] == ["fprop", "dgrad", "wgrad"], caplog.text
    chosen = include("0", model[0])
    for pass_, spio_us, torch_us in found:
        spio_us, torch_us = float(spio_us), float(torch_us)
        assert 0 < spio_us < 1e5 and 0 < torch_us < 1e5
        if spio_us != torch_us:  # equal as logged (to 0.1 us): the unrounded times decided
            assert (pass_ in chosen) == (spio_us < torch_us), (pass_, spio_us, torch_us, chosen)


def test_gpu_timer_makes_each_pass_inputs_once_per_layer(monkeypatch):
    """The GPU timer builds a pass's inputs (PassCase) once for both implementations, and keeps
    only one layer's at a time; the CUDA parts are stand-ins here."""
    import types

    import spio.bench.run
    import spio.bench.timing
    from spio.kernels import Conv2dGw8Params
    from spio.transform import modules

    made = []

    class FakeCase:
        def __init__(self, params, pass_, l2, device):
            made.append((params.c, pass_))

        def spio_call(self):
            return "spio"

        def torch_call(self):
            return "torch"

    monkeypatch.setattr(spio.bench.run, "PassCase", FakeCase)
    monkeypatch.setattr(spio.bench.timing, "l2_cache_bytes", lambda index: 1)
    fake = types.SimpleNamespace(median_ms=2.0)
    monkeypatch.setattr(spio.bench.timing, "time_calls", lambda call, warmup, reps: fake)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    timer = modules._gpu_layer_timer(torch.device("cuda", 0))
    a, b = (Conv2dGw8Params(n=2, c=c, h=8, w=8, padding=1) for c in (16, 24))
    for params in (a, b):
        for impl in ("spio", "torch"):
            for pass_ in ("fprop", "dgrad", "wgrad"):
                assert timer(params, pass_, impl) == 2e-3
    assert made == [(16, "fprop"), (16, "dgrad"), (16, "wgrad"),
                    (24, "fprop"), (24, "dgrad"), (24, "wgrad")]  # fmt: skip


def test_warns_when_the_model_is_not_channels_last(caplog):
    """where_faster times both implementations in channels_last. On an NCHW model spio's layers
    would also copy activations in and out, which the timing leaves out: it says so, with the
    count of calls; a channels_last model gets no warning."""
    model = nn.Sequential(
        nn.Conv2d(16, 16, 3, padding=1, groups=2), nn.Conv2d(16, 16, 3, padding=1, groups=2)
    ).half()
    x = torch.randn(2, 16, 8, 8).half()

    def timer(params, pass_, impl):
        return 1.0

    def warnings():
        return [r for r in caplog.records if r.levelno == logging.WARNING]

    with caplog.at_level(logging.INFO, logger="spio"):
        where_faster(model, x.to(memory_format=torch.channels_last), timer=timer)
        assert warnings() == []
        where_faster(model, x, timer=timer)
    assert len(warnings()) == 1
    assert "2 of the 2 convolution calls" in warnings()[0].getMessage()
    assert ".to(memory_format=torch.channels_last)" in warnings()[0].getMessage()


class OnTwoSizes(nn.Module):
    """Calls one conv on the input and on its top-left 4x4 corner (two layers of one module);
    with `again`, on the input once more (a layer met twice)."""

    def __init__(self, conv: nn.Module, again: bool = False):
        super().__init__()
        self.conv = conv
        self.again = again

    def forward(self, x):
        ys = (self.conv(x), self.conv(x[:, :, :4, :4]))
        return ys + (self.conv(x),) if self.again else ys


def test_a_conv_called_on_several_layers_keeps_the_passes_faster_on_all():
    """One module called on two image sizes meets two layers: spio keeps only the passes it won
    on both."""
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()

    def timer(params, pass_, impl):
        if impl == "torch":
            return 2.0
        won = {8: ("fprop", "dgrad"), 4: ("fprop", "wgrad")}[params.h]
        return 1.0 if pass_ in won else 3.0

    include = where_faster(OnTwoSizes(conv), torch.randn(2, 16, 8, 8).half(), timer=timer)
    assert include("conv", conv) == ("fprop",)


def test_the_gpu_is_looked_for_among_keyword_inputs_too():
    """A model called with keywords only: its inputs are looked at (here on the CPU, so the
    error names their device rather than "no tensor")."""

    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)

        def forward(self, *, x):
            return self.conv(x)

    with pytest.raises(ValueError, match="one GPU the inputs are on; got inputs on cpu$"):
        where_faster(Keyword().half(), kwargs={"x": torch.randn(1, 16, 8, 8).half()})


def test_compiles_the_kernels_of_the_timed_passes_before_timing(monkeypatch):
    """Without a timer: spio's kernels of each distinct layer and pass to time are compiled at
    once, before the first timing (FProp only with training=False). The GPU parts (the inputs'
    device, the compile and the timer) are stand-ins."""
    import spio.bench.run
    from spio.transform import modules

    events = []
    monkeypatch.setattr(modules, "_cuda_device", lambda inputs: torch.device("cuda", 0))

    def compile_cases(cases, device):
        events.append(("compile", [(params.h, pass_) for params, pass_ in cases]))
        return {}

    monkeypatch.setattr(spio.bench.run, "precompile", compile_cases)

    def gpu_timer(device):
        def timer(params, pass_, impl):
            events.append(("time", (params.h, pass_)))
            return 1.0

        return timer

    monkeypatch.setattr(modules, "_gpu_layer_timer", gpu_timer)
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()
    x = torch.randn(2, 16, 8, 8).half()
    where_faster(OnTwoSizes(conv, again=True), x, training=False)
    assert events[0] == ("compile", [(8, "fprop"), (4, "fprop")])
    assert {e[0] for e in events[1:]} == {"time"}
    events.clear()
    where_faster(OnTwoSizes(conv, again=True), x)
    passes = ["fprop", "dgrad", "wgrad"]
    assert events[0] == ("compile", [(h, p) for h in (8, 4) for p in passes])


def test_gpu_timer_times_each_implementations_call_on_its_device_and_frees_the_last_layer(
    monkeypatch,
):
    """spio's call is timed for "spio" and PyTorch's for "torch", median of 20 calls, with the
    L2 size of the timer's own device; a layer's cases are dropped when the next layer is timed
    (they hold its rotated inputs). The CUDA parts are stand-ins."""
    import gc
    import types
    import weakref

    import spio.bench.run
    import spio.bench.timing
    from spio.kernels import Conv2dGw8Params
    from spio.transform import modules

    live = weakref.WeakSet()
    l2_asked, reps_asked = [], []

    class FakeCase:
        def __init__(self, params, pass_, l2, device):
            assert l2 == 40 << 20 and device == torch.device("cuda", 1)
            live.add(self)
            self.h = params.h

        def spio_call(self):
            return ("spio", self.h)

        def torch_call(self):
            return ("torch", self.h)

    def time_calls(call, warmup, reps):
        reps_asked.append(reps)
        return types.SimpleNamespace(median_ms={"spio": 1.0, "torch": 3.0}[call[0]])

    monkeypatch.setattr(spio.bench.run, "PassCase", FakeCase)
    monkeypatch.setattr(
        spio.bench.timing, "l2_cache_bytes", lambda index: l2_asked.append(index) or 40 << 20
    )
    monkeypatch.setattr(spio.bench.timing, "time_calls", time_calls)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    timer = modules._gpu_layer_timer(torch.device("cuda", 1))
    a, b = (Conv2dGw8Params(n=2, c=16, h=h, w=8, padding=1) for h in (8, 6))
    assert timer(a, "fprop", "spio") == pytest.approx(1e-3)
    assert timer(a, "fprop", "torch") == pytest.approx(3e-3)
    assert timer(a, "dgrad", "spio") == pytest.approx(1e-3)
    gc.collect()
    assert sorted(case.h for case in live) == [8, 8]
    assert timer(b, "fprop", "torch") == pytest.approx(3e-3)
    gc.collect()
    assert [case.h for case in live] == [6]
    assert l2_asked == [1] and reps_asked == [20] * 4


def test_inputs_on_two_gpus_are_refused_naming_them():
    """Which GPU's times would decide is not for spio to pick: it had taken the first of a set,
    an arbitrary one."""
    from spio.transform.modules import _cuda_device

    def on(index):
        class OnGpu(torch.Tensor):
            @property
            def device(self):
                return torch.device("cuda", index)

        return torch.empty(1).as_subclass(OnGpu)

    assert _cuda_device((on(1), torch.empty(1))) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="are on; got inputs on cuda:0, cuda:1$"):
        _cuda_device((on(1), on(0)))


def test_inputs_nested_in_lists_tuples_and_dicts_are_looked_at():
    """A model called on a list of images or a dict of them (torchvision's detection models):
    the GPU had been looked for among the top-level inputs only ("got inputs on no tensor")."""
    from spio.transform.modules import _cuda_device

    class OnGpu(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", 0)

    x = torch.empty(1).as_subclass(OnGpu)
    for inputs in (([x],), ({"image": x},), (([1, (x,)],), {"mask": None})):
        assert _cuda_device(inputs) == torch.device("cuda", 0), inputs


def test_a_batch_too_large_for_one_launch_is_timed_on_a_chunk_and_a_too_large_image_not():
    """spio runs a batch whose activations pass what one launch takes in chunks of images, and a
    layer of which one image passes it in PyTorch's convolution: where_faster had built the
    whole batch's kernel, a ValueError out of the call. It now times both implementations on a
    chunk, and leaves the other layer to PyTorch without timing it. (The limit is lowered here
    to small layers' sizes.)"""
    from spio.functional import _kernels
    from spio.kernels.conv2d_gw8_params import image_bytes
    from spio.transform import modules

    small = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    large = nn.Conv2d(64, 64, 3, padding=1, groups=8)
    model = nn.Sequential(small, nn.Conv2d(16, 64, 1), large).half()
    x = torch.randn(5, 16, 24, 24).half()
    one_small = image_bytes(modules.Conv2dGw8Params(n=1, c=16, h=24, w=24, padding=1))
    limit = 2 * one_small + 1  # two images of the small layer; not one of the large one
    old = _kernels.MAX_TENSOR_BYTES
    try:
        _kernels.MAX_TENSOR_BYTES = limit
        timer = FakeTimer()
        include = where_faster(model, x, timer=timer)
    finally:
        _kernels.MAX_TENSOR_BYTES = old
    assert {call[0].split("_")[0] for call in timer.calls} == {"n2"}  # the small layer's chunk
    assert {call[0].split("_")[1] for call in timer.calls} == {"c16"}
    assert include("0", small) == ("fprop", "dgrad", "wgrad")  # 3x3: spio faster (FakeTimer)
    assert include("2", large) == ()


def test_timing_leaves_the_random_number_state_as_it_was():
    """The timing draws random inputs (spio.bench.run.PassCase): a run seeded before it had
    drawn other dropout masks after it than without it."""

    def drawing_timer(params, pass_, impl):
        torch.randn(100)
        return 1.0

    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)).half()
    x = torch.randn(2, 16, 8, 8).half()
    torch.manual_seed(3)
    where_faster(model, x, timer=drawing_timer)
    after = torch.rand(1)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(1), after)


def test_data_parallel_over_several_gpus_is_refused_and_one_gpu_unwrapped():
    """DataParallel's replicas are other modules than those transform replaces: over several
    GPUs every answer had been "nothing", silently; over one GPU (or DDP) the module it runs
    is timed and answered for."""
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)).half()
    x = torch.randn(2, 16, 8, 8).half()
    wrapped = nn.DataParallel(model)
    include = where_faster(wrapped, x, timer=FakeTimer())
    assert include("module.0", model[0]) == ("fprop", "dgrad", "wgrad")
    wrapped.device_ids = [0, 1]  # as on a two-GPU machine
    with pytest.raises(ValueError, match="where_faster: DataParallel splits each batch over its 2"):
        where_faster(wrapped, x, timer=FakeTimer())


def test_timing_forks_the_timing_gpus_random_number_state(monkeypatch):
    """where_faster forks the random-number state of the GPU it times on (PassCase draws its
    inputs there), not only the CPU's. The GPU parts are stand-ins."""
    from spio.transform import modules

    forked = []
    real = torch.random.fork_rng

    def spy(devices=None, **kwargs):
        forked.append(None if devices is None else list(devices))
        return real(devices=[], **kwargs)

    monkeypatch.setattr(torch.random, "fork_rng", spy)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(modules, "_cuda_device", lambda inputs: torch.device("cuda", 1))
    monkeypatch.setattr(
        modules,
        "_time_layers",
        lambda cases, timed, training, timer, device: {p: () for p in cases},
    )
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)).half()
    where_faster(model, torch.randn(2, 16, 8, 8).half())
    assert forked[-1] == [1]


def test_training_of_the_wrong_kind_is_named():
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)).half()
    x = torch.randn(2, 16, 8, 8).half()
    with pytest.raises(TypeError) as error:
        where_faster(model, x, training="yes", timer=FakeTimer())
    assert str(error.value) == "spio.transform.where_faster needs training True or False, got 'yes'"
