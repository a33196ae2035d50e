"""spio.precompile builds the kernels a model's step will launch, before the step, in parallel.

The emulated tests compare precompile's kernels with the kernels a real step then launches, and
make the step fail if it has to build anything. Their layers have shapes no other test uses, so
without precompile the step would build (the last test shows that it does).
"""

import logging
from collections import Counter

import pytest
import torch
from torch import nn

import spio
import spio.emulator.build as emulator_build
from spio.functional import _kernels
from spio.kernels import autotune
from spio.kernels import kernel as kernel_module
from spio.kernels import perf_model as pm
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.transform import modules, precompile, transform
from tests.conftest import spy_on_launches


class _Net(nn.Module):
    """Layers that ask for different kernels: a first layer (its input needs no gradient: no
    DGrad), one with a frozen bias (WGrad without the bias gradient), one whose DGrad and WGrad
    PyTorch runs, and a shared layer called on two image sizes (two layers' kernels)."""

    def __init__(self, c: int = 24):
        super().__init__()
        self.first = nn.Conv2d(c, c, 3, padding=1, groups=c // 8)
        self.frozen_bias = nn.Conv2d(c, c, (1, 3), padding=(0, 1), groups=c // 8)
        self.frozen_bias.bias.requires_grad_(False)
        self.fprop_only = nn.Conv2d(c, c, (3, 1), padding=(1, 0), groups=c // 8, bias=False)
        self.shared = nn.Conv2d(c, c, 1, groups=c // 8, bias=False)
        self.norm = nn.BatchNorm2d(c)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = self.frozen_bias(torch.relu(self.first(x)))
        x = self.drop(self.norm(self.fprop_only(x)))
        return self.shared(x).sum() + self.shared(x[:, :, 1:, 1:]).sum()


def _model(dtype=torch.float16):
    torch.manual_seed(0)
    model = _Net().to(dtype)
    include = lambda name, conv: ("fprop",) if name == "fprop_only" else True  # noqa: E731
    return transform(model, include=include)


def _input(dtype=torch.float16, n=2, h=11, w=5):
    x = torch.randn(n, 24, h, w, generator=torch.Generator().manual_seed(1)).to(dtype)
    return x.to(memory_format=torch.channels_last)


#: The kernel families of a training step's passes.
CONV_FAMILIES = {"conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad"}


def _launched(monkeypatch) -> list[str]:
    """Records the name of every kernel launched from now on."""
    return spy_on_launches(monkeypatch, names=True)


def _no_builds(monkeypatch) -> None:
    """From now on, building an emulator library fails (the host compiler is never run), and
    the libraries this process loaded are forgotten: launching must find them on disk."""

    def refuse(command, what):
        raise AssertionError(f"built at run time: {what}")

    monkeypatch.setattr(emulator_build, "_run", refuse)
    monkeypatch.setattr(kernel_module, "_emulated", {})
    monkeypatch.setattr(emulator_build._cache, "_memory", {})


@pytest.fixture
def emulated(monkeypatch, tmp_path):
    """The emulator on, with empty caches: what a step builds is not left over from earlier
    tests or runs of these tests."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(emulator_build._cache, "_memory", {})  # libraries earlier tests built


def test_builds_what_a_training_step_launches(emulated, monkeypatch, caplog):
    model, x = _model(), _input()
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    with caplog.at_level(logging.INFO, logger="spio"):
        kernels = spio.precompile(model, x, progress=False)
    assert f"spio.precompile: {len(kernels)} kernels for 5 spio layer calls" in caplog.text
    # The model is as it was: buffers, random-number state, the passes spio runs.
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert torch.equal(rng, torch.get_rng_state())
    assert model.fprop_only.spio_passes == ("fprop",)
    assert model.first.spio_passes == spio.functional._kernels.PASSES

    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    model(x).float().backward()
    built = {k.name for k in kernels}
    assert set(launched) <= built
    # The op's gradient dtypes (fp32) are built too, in case the model runs under torch.compile.
    extra = built - set(launched)
    assert all(n.startswith("sum_slots__") and n.endswith("__fp32_fp32") for n in extra), extra
    passes = {name.split("__")[0] for name in built}
    assert passes == {"conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad", "sum_slots"}
    # Per layer: the first layer has no DGrad; the shared layer has two image sizes.
    by_layer = {}
    for name in built - {n for n in built if n.startswith("sum_slots")}:
        family, layer, _ = name.split("__", 2)
        by_layer.setdefault(layer, set()).add(family.removeprefix("conv2d_gw8_"))
    first = Conv2dGw8Params(2, 24, 11, 5, padding=1, has_bias=True).encode_image()
    frozen = Conv2dGw8Params(2, 24, 11, 5, padding=(0, 1), r=1, has_bias=True).encode_image()
    only = Conv2dGw8Params(2, 24, 11, 5, padding=(1, 0), s=1).encode_image()
    shared = [
        Conv2dGw8Params(2, 24, h, w, padding=0, r=1, s=1).encode_image()
        for h, w in ((11, 5), (10, 4))
    ]
    assert by_layer[first] == {"fprop", "wgrad"}
    assert by_layer[only] == {"fprop"}
    assert by_layer[shared[0]] == by_layer[shared[1]] == {"fprop", "dgrad", "wgrad"}
    # The frozen bias: its WGrad computes no bias gradient (a has_bias=False WGrad kernel), and
    # DGrad, which reads no bias, is always the kernel of the layer without one.
    assert by_layer[frozen] == {"fprop"}
    without_bias = Conv2dGw8Params(2, 24, 11, 5, padding=(0, 1), r=1, has_bias=False).encode_image()
    assert by_layer[without_bias] == {"dgrad", "wgrad"}


def test_inference_builds_fprop_only(emulated, monkeypatch):
    model, x = _model(), _input(h=9)
    kernels = precompile(model, x, training=False, progress=False)
    assert {k.name.split("__")[0] for k in kernels} == {"conv2d_gw8_fprop"}
    assert len(kernels) == 5
    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    with torch.no_grad():
        model(x)
    assert set(launched) == {k.name for k in kernels}


def test_autocast_builds_the_region_dtype(emulated, monkeypatch):
    """Under autocast the kernels are the region's dtype, the gradients the fp32 parameters'."""
    model, x = _model(torch.float32), _input(torch.float32, h=7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kernels = precompile(model, x, progress=False)
    names = {k.name for k in kernels}
    convs = {n for n in names if not n.startswith("sum_slots")}
    # Kernels of every pass: a region that falls back to F.conv2d builds and launches none.
    families = {f"conv2d_gw8_{pass_}" for pass_ in ("fprop", "dgrad", "wgrad")}
    assert {n.split("__")[0] for n in convs} == families, names
    assert all("_bf16__" in n for n in convs)
    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x)
    loss.float().backward()
    assert launched and set(launched) <= names


def test_torch_compile_launches_what_eager_mode_would(emulated, monkeypatch):
    """A compiled model calls the custom op, not the eager path; under autocast, with
    channels_last weights, both cast the weight the same way, so they launch the same kernels
    and precompile's serve both."""
    model, x = _model(torch.float32), _input(torch.float32, h=6, w=7)
    model = model.to(memory_format=torch.channels_last)
    assert not model.first.weight.is_contiguous()  # channels_last, as the model holds it
    with torch.autocast("cpu", dtype=torch.float16):
        kernels = precompile(model, x, progress=False)
    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    compiled = torch.compile(model, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = compiled(x)
    loss.float().backward()
    assert launched and set(launched) <= {k.name for k in kernels}


def test_chunked_layers_build_their_chunks_kernels(emulated, monkeypatch):
    """A batch past the kernels' tensor limit runs in chunks, which are layers of their own."""
    model, x = _model(), _input(n=3, h=6, w=6)
    monkeypatch.setattr(_kernels, "MAX_TENSOR_BYTES", 24 * 6 * 6 * 2 * 2)  # two images a chunk
    monkeypatch.setattr(_kernels, "_layers", {})
    kernels = precompile(model, x, progress=False)
    # Kernels chosen for the chunks' batch sizes and no other (PyTorch running the batch builds
    # none). Kernels take the batch size at launch, so one build may serve both chunk sizes.
    sizes = {k.info_value("params").n for k in kernels if "sum_slots" not in k.name}
    assert sizes and sizes <= {1, 2}, sizes
    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    model(x).float().backward()
    assert launched and set(launched) <= {k.name for k in kernels}


def test_wrapped_and_compiled_models_run_eagerly(emulated, monkeypatch, tmp_path):
    """torch.compile'd models and modules compiled in place run eagerly (nothing is compiled
    by torch.compile, whose frames would otherwise trace precompile's hooks); DDP's and
    one-GPU DataParallel's wrappers are looked through: the same kernels each time."""
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    model, x = _model(), _input(h=4, w=4)
    plain = {k.name for k in precompile(model, x, progress=False)}
    frames = counters["frames"]["total"]
    assert {k.name for k in precompile(torch.compile(model), x, progress=False)} == plain
    model.shared.compile()
    assert {k.name for k in precompile(model, x, progress=False)} == plain
    assert counters["frames"]["total"] == frames
    assert {k.name for k in precompile(nn.DataParallel(model), x, progress=False)} == plain

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        monkeypatch.setattr(type(ddp), "forward", lambda *a, **k: pytest.fail("DDP forward"))
        assert {k.name for k in precompile(ddp, x, progress=False)} == plain
    finally:
        dist.destroy_process_group()


def test_data_parallel_over_several_gpus_is_refused(emulated):
    wrapped = nn.DataParallel(_model())
    wrapped.device_ids = [0, 1]  # as on a two-GPU machine
    with pytest.raises(ValueError, match="splits each batch over its 2 GPUs.*model.module"):
        precompile(wrapped, _input(), progress=False)


def test_nothing_to_build_where_no_kernels_run(monkeypatch):
    monkeypatch.delenv("SPIO_EMULATE", raising=False)
    model, x = _model(torch.float64), _input(torch.float64)
    assert precompile(model, x, progress=False) == []


def test_restores_the_model_when_the_forward_fails(emulated, monkeypatch):
    """A failure inside a layer's stand-in call, after precompile turned its passes off."""

    def failing(*args, **kwargs):
        raise RuntimeError("stand-in convolution failed")

    monkeypatch.setattr(_kernels, "torch_fprop", failing)
    model = _model()
    with pytest.raises(RuntimeError, match="stand-in convolution failed"):
        precompile(model, _input(h=3, w=3), progress=False)
    assert model.first.spio_passes == spio.functional._kernels.PASSES
    assert model.fprop_only.spio_passes == ("fprop",)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    with pytest.raises(ValueError, match="channels"):  # 16 channels into 24-channel layers
        precompile(model, torch.randn(2, 16, 5, 5).half(), progress=False)
    assert model.first.spio_passes == spio.functional._kernels.PASSES


def test_reentrant_checkpoint_gets_its_backward_kernels(emulated, monkeypatch):
    """A reentrant checkpoint runs its forward without autograd and again, with it, in the
    backward; precompile sees only the first, and builds the backward's kernels anyway."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _model()

        def forward(self, x):
            x = x.requires_grad_() if not x.requires_grad else x
            return checkpoint(self.net, x, use_reentrant=True)

    model, x = Checkpointed(), _input(h=5, w=6)
    kernels = precompile(model, x, progress=False)
    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    model(x).float().backward()
    assert {n.split("__")[0] for n in launched} >= {"conv2d_gw8_dgrad", "conv2d_gw8_wgrad"}
    assert set(launched) <= {k.name for k in kernels}


def test_training_follows_the_model_and_keyword_calls_count(emulated, caplog):
    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()

        def forward(self, x):
            return self.conv(input=x)

    model = transform(Keyword()).eval()
    kernels = precompile(model, _input(h=4, w=9)[:, :16], progress=False)
    assert [k.name.split("__")[0] for k in kernels] == ["conv2d_gw8_fprop"]
    model.train()
    kernels = precompile(model, _input(h=4, w=9)[:, :16], progress=False)
    assert {k.name.split("__")[0] for k in kernels} == {
        "conv2d_gw8_fprop",
        "conv2d_gw8_wgrad",
        "sum_slots",
    }
    with caplog.at_level(logging.WARNING, logger="spio"):
        plain = nn.Sequential(nn.Conv2d(16, 16, 1))
        assert precompile(plain, _input(torch.float32)[:, :16], progress=False) == []
    assert "has no Conv2dGw8 layers" in caplog.text


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("bias", [False, True])
def test_double_backward_kernels_are_built_when_asked(emulated, monkeypatch, bias, layout):
    """A gradient penalty (a backward through the backward) runs the passes again on gradients:
    with double_backward=True their kernels are built too, and the penalty's step builds none.
    (A channels_last model's penalty had launched contiguous-weight kernels precompile did not
    build: FProp and DGrad on the zeros autograd made of dw's unused gradient.)"""

    class Penalised(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2, bias=bias).half()

        def forward(self, x):
            return self.conv(x)

    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    model = transform(Penalised()).to(memory_format=fmt)
    x = _input(h=5, w=6)[:, :16].requires_grad_()
    single = {k.name for k in precompile(model, x, progress=False)}
    kernels = precompile(model, x, double_backward=True, progress=False)
    # Without a bias, the backward's kernels already serve it; with one, bias-less ones join.
    assert single <= {k.name for k in kernels} and (single != {k.name for k in kernels}) == bias
    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    (grad,) = torch.autograd.grad(model(x).float().square().sum(), x, create_graph=True)
    penalty = grad.float().square().sum()
    penalty.backward()
    assert launched and set(launched) <= {k.name for k in kernels}
    assert model.conv.weight.grad is not None


def test_keyword_inputs_of_the_model_are_passed(emulated):
    """precompile, scan_modules and where_faster take the model's keyword arguments as `kwargs`
    (as torch.export.export does), so that models called with keywords can be prepared."""

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()

        def forward(self, x, *, gate):
            return self.conv(x * gate)

    model = transform(Gated()).eval()
    x, gate = _input(h=5, w=4)[:, :16], torch.tensor(0.5, dtype=torch.float16)
    kernels = precompile(model, x, kwargs={"gate": gate}, progress=False)
    assert [k.name.split("__")[0] for k in kernels] == ["conv2d_gw8_fprop"]
    assert spio.scan_modules(model, x, kwargs={"gate": gate}) == [
        Conv2dGw8Params(2, 16, 5, 4, padding=1, has_bias=True)
    ]
    include = spio.transform.where_faster(
        model, x, kwargs={"gate": gate}, training=False, timer=lambda params, p, impl: 1.0
    )
    assert include("conv", model.conv) == spio.functional._kernels.PASSES


def test_build_failures_name_the_kernels(emulated, monkeypatch):
    asked = set()

    def broken(source, headers, name):
        asked.add(name)
        if name.startswith("conv2d_gw8_dgrad"):
            raise RuntimeError("no compiler today")
        return None

    monkeypatch.setattr(emulator_build, "build_library", broken)
    model, x = _model(), _input(h=5, w=3)
    with pytest.raises(
        RuntimeError, match=r"3 of \d+ kernels failed to build:\n.*dgrad.*no compiler"
    ) as raised:
        precompile(model, x, progress=False)
    # Out of every kernel precompile built, not only the failed ones.
    assert raised.match(rf"3 of {len(asked)} kernels") and len(asked) > 3


def test_layout_warning_survives_a_call_without_spio_passes(caplog, monkeypatch):
    """precompile runs each layer once with spio's passes off; the layer must still warn about
    a non-channels_last input at its first call that runs spio's kernels."""
    monkeypatch.setattr(_kernels, "_layout_logged", False)
    params = Conv2dGw8Params(1, 16, 4, 4)
    layer = _kernels.Layer(params, torch.device("cuda"))
    nchw = torch.randn(1, 16, 4, 4)
    with caplog.at_level(logging.WARNING, logger="spio"):
        layer.forward(nchw, torch.randn(params.weight_shape), None, 0)  # PyTorch's, on the CPU
        assert "channels_last" not in caplog.text
        layer._check_layout(nchw)  # as the first pass on spio's kernels asks
    assert "not a contiguous channels_last tensor" in caplog.text


def test_without_precompile_the_step_builds(emulated, monkeypatch):
    """The control for the tests above: the same kind of model, not precompiled, builds at its
    step (so "the step builds nothing" is a statement about precompile)."""
    model, x = _model(), _input(h=13, w=3)
    _no_builds(monkeypatch)
    with pytest.raises(AssertionError, match="built at run time"):
        model(x)


def test_builds_at_first_launch_are_pointed_at_precompile_once(emulated, monkeypatch, caplog):
    """A process that waits on builds at first launches says once that precompile exists; a
    precompiled model's step waits on none."""
    monkeypatch.setattr(kernel_module, "FIRST_LAUNCH_BUILD_NOTICE_S", 0.0)
    monkeypatch.setattr(kernel_module, "_first_launch_build_s", 0.0)
    monkeypatch.setattr(kernel_module, "_first_launch_notice_given", False)
    model, x = _model(), _input(h=3, w=5)
    precompile(model, x, progress=False)
    with caplog.at_level(logging.WARNING, logger="spio"):
        model(x).float().backward()
        assert "first launch" not in caplog.text
        model(_input(h=3, w=4)).float().backward()  # new layers, not precompiled
        model(_input(h=3, w=3)).float().backward()
    assert caplog.text.count("building kernels at their first launch") == 1
    assert "spio.precompile(model, x)" in caplog.text


class _FakeCpuH200:
    """Autotuning on CPU tensors (emulated): the fake identity of an H200 for every device, a
    timer that records what it times (the last of a layer's candidates is fastest) and what it
    is asked to prepare, and no kernel built or launched for real."""

    def __init__(self, monkeypatch, tmp_path):
        monkeypatch.setenv("SPIO_AUTOTUNE", "1")
        monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "3")
        (tmp_path / "no-models").mkdir()
        monkeypatch.setenv("SPIO_PERF_MODELS", str(tmp_path / "no-models"))  # heuristic ranks
        identity = pm.DeviceIdentity(arch="sm_90", name="NVIDIA H200", driver="13.0")
        monkeypatch.setattr(pm, "device_identity", lambda d: identity if d is not None else None)
        monkeypatch.setattr(autotune, "_default_cache", None)
        monkeypatch.setattr(autotune, "default_timer", self)
        monkeypatch.setattr(_kernels, "_chosen", {})
        monkeypatch.setattr(_kernels, "_layers", {})
        pm.clear_caches()
        self.events: list[tuple[str, list[str]]] = []  # ("build" | "time", kernel names)
        self.timed_per_layer: dict[tuple, int] = {}

        def build(kernels, device, progress=True):
            self.events.append(("build", [k.name for k in kernels]))
            return {}

        monkeypatch.setattr(modules, "build_kernels", build)
        monkeypatch.setattr(
            kernel_module.Kernel, "launch", lambda k, a, d: self.launched.append(k.name)
        )
        self.launched: list[str] = []

    def __call__(self, family, params, kernel, device):
        self.events.append(("time", [kernel.name]))
        key = (family, params)
        self.timed_per_layer[key] = self.timed_per_layer.get(key, 0) + 1
        return 1.0 / self.timed_per_layer[key]

    def prepare(self, kernels, arch):
        pass

    def timed(self) -> list[str]:
        return [names[0] for what, names in self.events if what == "time"]

    def builds(self) -> list[list[str]]:
        return [names for what, names in self.events if what == "build"]


def test_autotune_builds_every_layers_candidates_at_once_then_times_them(
    emulated, monkeypatch, tmp_path
):
    """With SPIO_AUTOTUNE=1, precompile builds the candidate configs of all the layers to tune in
    one batch before anything is timed, times each layer's once, and returns the winners; the
    step then times nothing, and a second precompile neither times nor builds candidates."""
    fake = _FakeCpuH200(monkeypatch, tmp_path)
    model, x = _model(), _input(h=6, w=7)
    kernels = precompile(model, x, progress=False)

    timed = fake.timed()
    candidates, chosen = fake.builds()
    assert [what for what, _ in fake.events] == ["build"] + ["time"] * len(timed) + ["build"]
    assert sorted(timed) == sorted(candidates)  # each candidate built, and timed once
    # Every layer pass the step runs was tuned, over the top 3 and the pick's unjudged variants:
    # FProp in 5 layers (4 modules, one on two image sizes), DGrad in 3, WGrad in 4 (the frozen
    # bias's without a bias gradient).
    per_pass = Counter(tuple(name.split("__")[:2]) for name in timed)
    assert Counter(family for family, _ in per_pass) == {
        "conv2d_gw8_fprop": 5,
        "conv2d_gw8_dgrad": 3,
        "conv2d_gw8_wgrad": 4,
    }
    assert min(per_pass.values()) >= 3
    assert sorted(chosen) == sorted(k.name for k in kernels)
    # The winners: the last candidate timed of each layer pass (the fake's fastest).
    last = {}
    for name in timed:
        family, layer, _ = name.split("__", 2)
        last[(family, layer)] = name
    picked = {
        (k.name.split("__")[0], k.name.split("__")[1]): k.info_value("config").encode()
        for k in kernels
        if not k.name.startswith("sum_slots")
    }
    assert picked == {key: name.split("__", 2)[2].split("__")[0] for key, name in last.items()}

    fake.events.clear()
    model(x).float().backward()
    assert fake.events == [] and set(fake.launched) <= set(chosen)
    pm.clear_caches()  # a new process: the tuned configs come from the disk cache
    monkeypatch.setattr(_kernels, "_chosen", {})
    monkeypatch.setattr(_kernels, "_layers", {})
    monkeypatch.setattr(autotune, "_default_cache", None)
    assert {k.name for k in precompile(model, x, progress=False)} == set(chosen)
    assert fake.builds() == [chosen] and fake.timed() == []


@pytest.mark.cuda
def test_gpu_step_compiles_nothing_after_precompile(monkeypatch, tmp_path):
    """On a GPU: cubins for its arch, in a fresh cache; the step then compiles nothing."""
    import spio.compiler.compile as compile_module

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_module, "_loaded", {})
    model, x = _model().cuda(), _input(h=12, w=10).cuda()
    kernels = precompile(model, x, progress=False)
    assert kernels

    def refuse(*args, **kwargs):
        raise AssertionError("compiled at run time")

    monkeypatch.setattr(compile_module.nvrtc, "compile_program", refuse)
    launched = _launched(monkeypatch)
    model(x).float().backward()
    torch.cuda.synchronize()
    assert set(launched) <= {k.name for k in kernels}
    assert {n.split("__")[0] for n in launched} >= CONV_FAMILIES  # (none launched passes too)


@pytest.mark.cuda
def test_gpu_autotuned_step_compiles_and_times_nothing_after_precompile(monkeypatch, tmp_path):
    """On a GPU with SPIO_AUTOTUNE=1: precompile tunes every layer pass (entries in a fresh
    autotune cache) and builds the winners; the step then neither compiles nor times."""
    import spio.compiler.compile as compile_module

    monkeypatch.setenv("SPIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPIO_AUTOTUNE", "1")
    monkeypatch.setenv("SPIO_AUTOTUNE_TOPK", "2")
    monkeypatch.setattr(kernel_module, "_loaded", {})
    monkeypatch.setattr(autotune, "_default_cache", None)
    monkeypatch.setattr(_kernels, "_chosen", {})
    monkeypatch.setattr(_kernels, "_layers", {})
    pm.clear_caches()
    model, x = _model().cuda(), _input(h=9, w=10).cuda()
    kernels = precompile(model, x, progress=False)
    assert len(list((tmp_path / "autotune").glob("*.bin"))) == 12  # layer passes, as on the CPU

    def refuse(*args, **kwargs):
        raise AssertionError("compiled or timed at run time")

    monkeypatch.setattr(compile_module.nvrtc, "compile_program", refuse)
    monkeypatch.setattr(autotune, "time_kernel", refuse)
    launched = _launched(monkeypatch)
    model(x).float().backward()
    torch.cuda.synchronize()
    assert set(launched) <= {k.name for k in kernels}
    assert {n.split("__")[0] for n in launched} >= CONV_FAMILIES  # (none launched passes too)
    pm.clear_caches()


def test_listing_a_transformed_models_layers_builds_and_launches_nothing(emulated, monkeypatch):
    """scan_modules and where_faster list the layers with PyTorch's convolution standing in, as
    precompile does: they had run the spio layers' kernels, building each in turn (on a GPU,
    serial compiles only to list the layers)."""
    model = _model()
    _no_builds(monkeypatch)
    launched = _launched(monkeypatch)
    found = spio.scan_modules(model, _input())
    assert [(p.h, p.w, p.r, p.s) for p in found] == [
        (11, 5, 3, 3), (11, 5, 1, 3), (11, 5, 3, 1), (11, 5, 1, 1), (10, 4, 1, 1)
    ]  # fmt: skip
    include = modules.where_faster(model, _input(), timer=lambda params, p, impl: 1.0)
    assert include("first", model.first) == ("fprop", "dgrad", "wgrad")
    assert launched == []


def test_one_gpu_data_parallel_is_looked_through_at_any_depth():
    """A DataParallel over one GPU runs its module on the whole batch, so it is looked through,
    as are wrappers of wrappers; only one over several GPUs is refused."""
    model = _Net()
    inner = nn.DataParallel(model)
    outer = nn.DataParallel(inner)
    inner.device_ids = outer.device_ids = [0]  # as on a one-GPU machine
    assert modules._unwrapped(outer) is model
    inner.device_ids = [0, 1]
    with pytest.raises(ValueError, match="splits each batch over its 2 GPUs"):
        modules._unwrapped(outer)


def test_a_model_that_calls_none_of_its_layers_is_reported(caplog):
    class Bypass(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()

        def forward(self, x):
            return x * 2

    model = transform(Bypass())
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert precompile(model, _input()[:, :16], progress=False) == []
    assert "the model called none of its 1 Conv2dGw8 layers" in caplog.text


@pytest.mark.parametrize("bias", [False, True])
def test_autotune_collects_the_double_backwards_layers_with_the_rest(
    emulated, monkeypatch, tmp_path, bias
):
    """With double_backward=True the first pass collects the double backward's layer passes
    too (with a bias, some are the bias-less layer's): their candidates join the one batch
    build, and nothing is tuned that was not built in it."""
    fake = _FakeCpuH200(monkeypatch, tmp_path)
    conv = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2, bias=bias)).half())
    x = _input(h=5, w=6)[:, :16]
    kernels = precompile(conv, x, double_backward=True, progress=False)
    candidates, chosen = fake.builds()
    assert sorted(fake.timed()) == sorted(candidates)
    assert sorted(chosen) == sorted(k.name for k in kernels)
    # The double backward's FProp of a layer with a bias is the bias-less layer's.
    fprops = {name.split("__")[1] for name in candidates if name.startswith("conv2d_gw8_fprop")}
    assert len(fprops) == 1 + bias


def test_a_model_whose_calls_run_no_kernel_is_warned_of(emulated, caplog):
    """fp32 outside autocast: the calls run PyTorch's convolution and nothing is built; it had
    returned [] in silence, where scan_modules warns."""
    model, x = _model(torch.float32), _input(torch.float32)
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert spio.precompile(model, x, progress=False) == []
    assert "none of the 5 Conv2dGw8 calls runs spio's kernels" in caplog.text


def test_the_nothing_to_build_warning_says_why_each_call_runs_none(monkeypatch, caplog):
    """It had listed every possible cause and sent the reader to "the layers' own warnings",
    which CPU tensors without the emulator and passes left to PyTorch never give (and a
    fallback's, once per process, may have gone before)."""
    monkeypatch.delenv("SPIO_EMULATE", raising=False)
    model, x = _model(), _input()
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert spio.precompile(model, x, progress=False) == []
    assert (
        "none of the 5 Conv2dGw8 calls runs spio's kernels (calls by why: 5 of CPU tensors "
        "without SPIO_EMULATE=1 (PyTorch's convolution runs them)); nothing to build"
    ) in caplog.text
    caplog.clear()
    monkeypatch.setenv("SPIO_EMULATE", "1")
    for layer in model.modules():
        if isinstance(layer, spio.layers.Conv2dGw8):
            layer.spio_passes = False
    model.first.spio_passes = True
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert spio.precompile(model.float(), x.float(), progress=False) == []
    said = caplog.text
    assert "calls by why: 4 of every pass left to PyTorch (spio_passes is empty); 1 of a " in said
    assert "fallback to F.conv2d: torch.float32 cpu tensors outside autocast" in said
    caplog.clear()
    model.half().first.spio_passes = ("dgrad",)  # in inference: nothing for spio to run
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert spio.precompile(model, x, training=False, progress=False) == []
    assert "1 of no pass the call runs left to spio (spio_passes;" in caplog.text
    caplog.clear()
    for layer in model.modules():
        if isinstance(layer, spio.layers.Conv2dGw8):
            layer.spio_passes = True
    with caplog.at_level(logging.WARNING, logger="spio"):  # N = 0: PyTorch's convolution
        assert spio.precompile(model, x[:0], progress=False) == []
    assert (
        "calls by why: 5 of an empty batch, or one image's tensors past the kernels' limit "
        "(PyTorch's convolution runs the layer)); nothing to build"
    ) in caplog.text


def test_calls_of_the_replaced_conv_are_not_blamed_on_tracing(caplog):
    """A conv reached through a plain list runs the nn.Conv2d transform replaced: the warning
    said so, and then that the model called no layer "(a model traced by torch.fx or scripted
    calls spio's op without them)", a cause that was not this one."""

    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()
            self.convs = [self.conv]  # not registered: transform cannot replace this entry

        def forward(self, x):
            return self.convs[0](x)

    model = transform(Listed())
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert precompile(model, _input()[:, :16], progress=False) == []
    assert "1 calls of an nn.Conv2d that spio.transform replaced" in caplog.text
    assert (
        "the model called none of its 1 Conv2dGw8 layers, but 1 times the nn.Conv2d they "
        "replaced (above); nothing was built"
    ) in caplog.text
    assert "traced by torch.fx" not in caplog.text


def test_other_threads_calls_during_precompile_run_spio_and_are_not_its_own(monkeypatch):
    """precompile (and scan_modules) had run the model with each layer's passes set to none and
    set back after, state every thread shares: an inference thread's calls meanwhile ran
    PyTorch's convolution, and were counted and built for; two precompiles at once could leave
    a layer's passes at none for good. Now only precompile's own thread's calls stand in."""
    import threading

    monkeypatch.setenv("SPIO_EMULATE", "1")
    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2))).half()
    x = torch.randn(1, 16, 5, 5).half().to(memory_format=torch.channels_last)
    served_x = torch.randn(1, 16, 6, 6).half().to(memory_format=torch.channels_last)
    with torch.no_grad():
        model(served_x)  # its kernel built before: the served call only launches
    launched = []
    real = kernel_module.Kernel.launch

    def spy(self, args, device):
        launched.append((threading.get_ident(), self.name))
        return real(self, args, device)

    monkeypatch.setattr(kernel_module.Kernel, "launch", spy)
    served, go, done = [], threading.Event(), threading.Event()

    def server():  # a thread of the process before the run, serving the model
        go.wait()
        served.append(model(served_x))
        done.set()

    thread = threading.Thread(target=server)
    thread.start()

    def serve(module, args):  # during precompile's run, the server calls the layer
        if threading.current_thread() is threading.main_thread():
            go.set()
            done.wait()

    handle = model[0].register_forward_pre_hook(serve)
    kernels = precompile(model, x, training=False, progress=False)
    handle.remove()
    thread.join()
    assert model[0].spio_passes == ("fprop", "dgrad", "wgrad")
    here = threading.get_ident()
    assert [n.split("__")[0] for t, n in launched if t != here] == ["conv2d_gw8_fprop"]
    assert not [n for t, n in launched if t == here]  # precompile's run: PyTorch's convolution
    assert [k.info_value("params").h for k in kernels] == [5]  # its own input's kernel alone
    assert served[0].shape == (1, 16, 6, 6)


def test_a_model_that_calls_its_layers_on_threads_of_its_own_is_scanned_whole(monkeypatch):
    """A model running branches on threads it starts (as nn.DataParallel's parallel_apply does):
    their calls are the run's, found and standing in (the first thread-local form had found
    none of them, and launched spio's kernels from them during precompile)."""
    from concurrent.futures import ThreadPoolExecutor

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(16, 16, 3, padding=1, groups=2)
            self.b = nn.Conv2d(16, 16, 1, groups=2)

        def forward(self, x):
            with ThreadPoolExecutor(2) as pool:
                a, b = pool.submit(self.a, x), pool.submit(self.b, x)
                return a.result() + b.result()

    monkeypatch.setenv("SPIO_EMULATE", "1")
    model = transform(Branchy()).half()
    x = torch.randn(1, 16, 5, 5).half().to(memory_format=torch.channels_last)
    launched = spy_on_launches(monkeypatch)
    assert sorted((p.r, p.s) for p in spio.scan_modules(model, x)) == [(1, 1), (3, 3)]
    kernels = precompile(model, x, training=False, progress=False)
    assert len(kernels) == 2 and launched == []


@pytest.mark.parametrize("where", ["top", "list", "dict_kwarg"])
def test_the_forward_run_forks_the_rng_of_gpus_in_nested_inputs(monkeypatch, where):
    """precompile's forward run puts back the random state of every GPU its inputs are on
    (dropout draws there): inputs in lists, tuples and dicts, too, as where_faster finds them.
    A GPU reached only through a nested input had been left out (a tensor that says it is on
    cuda:1 stands in for one, the fork recorded)."""
    import contextlib

    forked = []

    @contextlib.contextmanager
    def fork_rng(devices=None, **kwargs):
        forked.append(list(devices))
        yield

    monkeypatch.setattr(torch.random, "fork_rng", fork_rng)

    class OnGpu1(torch.Tensor):
        is_cuda = property(lambda self: True)
        device = property(lambda self: torch.device("cuda", 1))

    t = torch.zeros(1).as_subclass(OnGpu1)
    inputs, kwargs = {
        "top": ((t,), None),
        "list": (([t],), None),
        "dict_kwarg": ((), {"d": {"a": t}}),
    }[where]

    class Takes(nn.Module):
        def forward(self, *args, **kwargs):
            return None

    modules._forward_once(Takes(), inputs, kwargs, grad=False)
    assert forked == [[1]]


def test_flags_of_the_wrong_kind_are_named(monkeypatch):
    """training=1 reached torch.set_grad_enabled, whose TypeError named neither precompile nor
    the argument; double_backward and progress took any value as true or false. numpy's bools
    count, as elsewhere in spio's API."""
    import numpy as np

    monkeypatch.delenv("SPIO_EMULATE", raising=False)  # (nothing is built either way)
    model, x = _model(torch.float64), _input(torch.float64)
    for name, allowed in (
        ("training", "True, False or None"),
        ("double_backward", "True or False"),
        ("progress", "True or False"),
    ):
        for bad in (1, "no"):
            with pytest.raises(TypeError) as error:
                precompile(model, x, **({"progress": False} | {name: bad}))
            assert str(error.value) == f"spio.precompile needs {name} {allowed}, got {bad!r}"
    assert precompile(model, x, training=np.True_, progress=np.False_) == []
