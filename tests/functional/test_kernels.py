"""The kernel seam's Layer (spio.functional._kernels): what it hands the kernel wrappers on the
hot path of every call."""

import dataclasses

import pytest
import torch

from spio.functional import _kernels
from spio.kernels import conv2d_gw8_wgrad_factory as wf
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.kernels.kernel import Kernel
from tests.conftest import without_tensor_copies


@pytest.mark.parametrize(("has_bias", "with_bias"), [(True, True), (True, False), (False, False)])
def test_wgrad_launches_with_its_kernels_own_layer(monkeypatch, has_bias, with_bias):
    """Layer.wgrad gives wf.wgrad the layer its kernel was made for (this one, with has_bias as
    the call asks), the very object: the wrapper's check that kernel and layer match is then an
    identity test, not a comparison of every field on each backward pass (and no params are
    made per call)."""
    x = torch.randn(2, 16, 6, 5, dtype=torch.float16)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float16)
    b = torch.randn(16, dtype=torch.float16) if has_bias else None
    layer = _kernels.layer(x, w, b, 1, 1)
    seen = []

    def spy(x, dy, params, kernel, dtypes=None, validated=False, channels_last=False):
        seen.append((params, kernel))
        return None, None

    monkeypatch.setattr(wf, "wgrad", spy)
    dy = torch.randn(2, 16, 6, 5, dtype=torch.float16)
    for _ in range(2):
        layer.wgrad(x, dy, with_bias)
    for params, kernel in seen:
        assert params is kernel.info_value("params")
        assert params.has_bias == with_bias
        assert params == dataclasses.replace(layer.params, has_bias=with_bias)
    assert seen[0][0] is seen[1][0]


@pytest.mark.parametrize("path", ["partials", "atomics"])
def test_weight_gradient_comes_in_the_weights_layout(monkeypatch, path):
    """In a channels_last model the weight is channels_last, and autograd lays a gradient out as
    its parameter is: spio's WGrad hands dw over channels_last (sum_slots writes it so; the
    atomics path casts and lays out in one copy), so that the step makes no copy of it, which
    the H200 profile of regnetx_002 showed as an fp16 copy kernel a layer a step (run 7). The
    values are those of a contiguous weight's gradient, and autograd keeps the very tensor as
    .grad (emulated, both WGrad reductions)."""
    from spio.functional.eager import conv2d_gw8_eager

    monkeypatch.setenv("SPIO_EMULATE", "1")
    monkeypatch.setattr(_kernels, "_layers", {})
    monkeypatch.setattr(_kernels, "_chosen", {})
    if path == "atomics":
        monkeypatch.setattr(wf, "PARTIAL_BYTES", 16)
    handed = []
    real = wf.wgrad

    def spy(*args, **kwargs):
        dw, db = real(*args, **kwargs)
        handed.append((kwargs["kernel"].name, dw.data_ptr()))  # (a reference would keep
        return dw, db  # autograd from taking dw as .grad: it takes a gradient nothing else holds)

    monkeypatch.setattr(wf, "wgrad", spy)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 6, 7, generator=gen).half().to(memory_format=torch.channels_last)
    dy = torch.randn(2, 16, 6, 7, generator=gen).half().to(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3, generator=gen).half()
    grads = {}
    for layout in (torch.contiguous_format, torch.channels_last):
        leaf = w.clone(memory_format=layout).requires_grad_()
        conv2d_gw8_eager(x, leaf, None, 1, 1).backward(dy)
        assert leaf.grad.stride() == leaf.stride(), layout
        grads[layout] = leaf.grad
    (name, _), (_, handed_cl) = handed
    assert without_tensor_copies(name).endswith("__partials") == (path == "partials")
    assert grads[torch.channels_last].data_ptr() == handed_cl  # kept, not copied
    assert not grads[torch.contiguous_format].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(grads[torch.channels_last], grads[torch.contiguous_format])
    assert grads[torch.channels_last].abs().sum() > 0


def test_a_channels_last_model_under_autocast_keeps_its_weights_layout(monkeypatch):
    """Under autocast the weight is cast in its own layout (checks.cast_for_autocast), as autocast
    casts it for aten's convolution: a channels_last model's stays channels_last, the kernels
    read it as held, and its gradient comes back channels_last, so that autograd keeps it as
    .grad with no copy. The cast had made it contiguous: a layout-changing cast each forward,
    and a copy into the parameter's layout in AccumulateGrad each backward (H200 runs 7 and 8
    profiled a strided copy kernel new with spio). Emulated, bf16 autocast on the CPU; the
    gradient equals a contiguous model's."""
    from torch.profiler import profile

    from spio.layers import Conv2dGw8

    monkeypatch.setenv("SPIO_EMULATE", "1")
    x = torch.randn(2, 16, 6, 7, generator=torch.Generator().manual_seed(0))
    grads = {}
    for layout in (torch.contiguous_format, torch.channels_last):
        torch.manual_seed(0)
        layer = Conv2dGw8(16, 16, 3, padding=1, groups=2, bias=False).to(memory_format=layout)
        x_in = x.contiguous(memory_format=layout)
        with profile() as prof, torch.autocast("cpu", dtype=torch.bfloat16):
            layer(x_in).float().sum().backward()
        accumulating = [
            e for e in prof.events()
            if e.name == "aten::copy_" and e.cpu_parent is not None
            and e.cpu_parent.name == "torch::autograd::AccumulateGrad"
        ]  # fmt: skip
        assert not accumulating, layout
        assert layer.weight.grad.stride() == layer.weight.stride(), layout
        grads[layout] = layer.weight.grad
    assert torch.equal(grads[torch.channels_last], grads[torch.contiguous_format])
    assert grads[torch.channels_last].abs().sum() > 0


def test_a_1x1_channels_last_weights_gradient_has_its_strides_on_both_paths(monkeypatch):
    """A 1x1 filter's weight laid out channels_last, (K, 8, 1, 1) with strides (8, 1, 8, 8), is
    contiguous too: the eager path had given its dw the contiguous strides, the op (a compiled
    model) the weight's, copying it. Both give the weight's strides now (emulated)."""
    from spio.functional.conv2d_gw8_op import conv2d_gw8_backward
    from spio.functional.eager import conv2d_gw8_eager

    monkeypatch.setenv("SPIO_EMULATE", "1")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 5, 6, generator=gen).half().to(memory_format=torch.channels_last)
    dy = torch.randn(2, 16, 5, 6, generator=gen).half().to(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 1, 1, generator=gen).half().to(memory_format=torch.channels_last)
    assert w.is_contiguous() and w.stride() == (8, 1, 8, 8)
    leaf = w.clone(memory_format=torch.preserve_format).requires_grad_()
    (eager_dw,) = torch.autograd.grad(conv2d_gw8_eager(x, leaf, None, 0, 0), leaf, dy)
    _, op_dw, _ = conv2d_gw8_backward(dy, x, w, 0, 0, [False, True, False])
    assert eager_dw.stride() == op_dw.stride() == w.stride()
    assert torch.equal(eager_dw, op_dw.to(eager_dw.dtype))


@pytest.mark.parametrize("setting", ["loads", "loads+stores"])
def test_spio_tma_runs_every_pass_with_tensor_copies(monkeypatch, setting):
    """SPIO_TMA=loads (and loads+stores) picks the tensor-copy kernels for a layer's three passes
    (emulated: the emulator has sm_90's copies), whose forward and gradients are the plain
    kernels' (FProp and DGrad bit for bit; WGrad's partial sums too, summed in one order)."""
    from spio.functional.eager import conv2d_gw8_eager

    monkeypatch.setenv("SPIO_EMULATE", "1")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, 7, 9, generator=gen).half().to(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3, generator=gen).half()
    b = torch.randn(16, generator=gen)
    dy = torch.randn(3, 16, 7, 9, generator=gen).half().to(memory_format=torch.channels_last)
    launched = []
    real_launch = Kernel.launch

    def spy(kernel, args, device):
        launched.append(kernel.name)
        return real_launch(kernel, args, device)

    monkeypatch.setattr(Kernel, "launch", spy)
    results = {}
    for value in ("off", setting):
        monkeypatch.setenv("SPIO_TMA", value)
        monkeypatch.setattr(_kernels, "_layers", {})
        monkeypatch.setattr(_kernels, "_chosen", {})
        launched.clear()
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        y = conv2d_gw8_eager(*leaves, 1, 1)
        y.backward(dy)
        results[value] = (y, *(leaf.grad for leaf in leaves))
        names = [n for n in launched if not n.startswith("sum_slots")]
        assert {n.split("__")[0] for n in names} == {
            "conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad"}, launched  # fmt: skip
        if value == "off":
            assert not any("__tma" in n for n in names), names
        else:
            stores = setting == "loads+stores"
            for name in names:
                suffix = "__tmaio" if stores and "wgrad" not in name else "__tma"
                assert name.endswith(suffix), name
    for plain, copied in zip(results["off"], results[setting], strict=True):
        assert torch.equal(plain, copied)


def test_spio_tma_is_one_of_its_values_and_needs_sm_90(monkeypatch):
    """A value SPIO_TMA does not have is an error naming it; on a GPU without tensor copies (or
    where a config's stages, aligned for them, would pass a block's shared memory) the kernel
    stays as it is."""
    from spio.kernels import conv2d_gw8_factory as fd
    from spio.kernels import perf_model

    monkeypatch.setenv("SPIO_TMA", "yes")
    with pytest.raises(
        ValueError,
        match=r"SPIO_TMA must be ({0}), ({0}) or ({0}), got 'yes'".format(
            r"off|loads|loads\+stores"
        ),
    ):
        _kernels.tensor_copies()
    monkeypatch.setenv("SPIO_TMA", " Loads ")
    assert _kernels.tensor_copies() == (True, False)
    params = fd.Conv2dGw8Params(n=1, c=64, h=64, w=64, padding=1)
    plain = fd.make_kernel(params, fd.Conv2dGw8Config(8, 8, 32, 1, stages=4, mma_k=16))
    cuda = torch.device("cuda", 0)
    for arch, tma in (("sm_86", False), ("sm_90", True), ("sm_90a", True)):
        identity = perf_model.DeviceIdentity(arch, "GPU", "580")
        monkeypatch.setattr(perf_model, "device_identity", lambda device, i=identity: i)
        assert bool(_kernels.with_tensor_copies(plain, cuda).info_value("tma")) == tma, arch
    wide = fd.make_kernel(params, fd.Conv2dGw8Config(8, 8, 64, 2, stages=8, mma_k=8))
    assert _kernels.with_tensor_copies(wide, cuda) is wide  # 102,448 bytes with tensor copies


def test_spio_tma_is_read_at_each_layers_first_call(monkeypatch):
    """Kernels chosen under one SPIO_TMA value are not handed to a layer whose first call has
    another (the choice cache keys on it): the same params get the plain kernels, then the
    tensor-copy ones, every pass; deterministic WGrad too, where the pick's partial sums do not
    fit and another config's do. With no device known (bench's spio_kernel default) or a GPU
    without tensor copies, the plain kernels."""
    from spio.bench.run import spio_kernel
    from spio.kernels import perf_model as pm

    monkeypatch.setattr(_kernels, "_chosen", {})
    cpu = torch.device("cpu")
    params = Conv2dGw8Params(n=2, c=16, h=6, w=7, padding=1)
    passes = (
        lambda: _kernels.fprop_kernel(params, cpu),
        lambda: _kernels.dgrad_kernel(params, cpu),
        lambda: _kernels.wgrad_kernel(params, cpu, with_bias=False),
    )
    for value, tma in (("off", False), ("loads", True), ("off", False)):
        monkeypatch.setenv("SPIO_TMA", value)
        assert [bool(kernel().info_value("tma")) for kernel in passes] == [tma] * 3, value
    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    ranked = pm.heuristic_ranking(family, params, family.configs(params))
    pick = passes[2]().info_value("config")
    sizes = {c: wf.partial_bytes(params, c) for c in ranked}
    monkeypatch.setattr(wf, "MAX_PARTIAL_BYTES", sizes[pick] - 1)
    for value in ("off", "loads"):
        monkeypatch.setenv("SPIO_TMA", value)
        kernel = _kernels.wgrad_kernel(params, cpu, with_bias=False, deterministic=True)
        assert kernel.info_value("config") != pick and kernel.info_value("partials")
        assert bool(kernel.info_value("tma")) == (value == "loads")
    assert not spio_kernel(params, "fprop").info_value("tma")  # device None
    monkeypatch.setattr(pm, "device_identity", lambda device: pm.DeviceIdentity("sm_89", "", ""))
    assert not _kernels.fprop_kernel(params, torch.device("cuda", 0)).info_value("tma")


def test_a_layer_met_at_many_batch_sizes_keeps_bounded_choices_sharing_headers(monkeypatch):
    """A layer met at a new batch size is a new choice (the config may differ, the grid does):
    detection or a short last batch meet many. Each choice of one kernel name shares a live
    kernel's generated headers (about 22 KB of FProp's had been copied per batch size), and the
    choices, WGrad's partial-sums plans and (on a GPU) the perf model's selections start over at
    their limits, as the layer cache does, rather than grow with every batch size."""
    monkeypatch.setattr(_kernels, "_chosen", {})
    monkeypatch.setattr(_kernels, "MAX_CHOICES", 7)
    monkeypatch.setattr(wf, "_partials_plans", {})
    monkeypatch.setattr(wf, "MAX_PLANS", 3)
    cpu = torch.device("cpu")
    by_name = {}
    for n in range(1, 13):
        params = Conv2dGw8Params(n, 16, 6, 6, has_bias=True)
        kernels = [_kernels.fprop_kernel(params, cpu), _kernels.dgrad_kernel(params, cpu)]
        kernels.append(_kernels.wgrad_kernel(params, cpu, with_bias=True))
        for kernel in kernels:
            # (the first kernel of each name kept alive, as the layers keep theirs)
            assert by_name.setdefault(kernel.name, kernel).headers is kernel.headers
        assert len(_kernels._chosen) <= 7
        if kernels[2].info_value("partials"):
            wf._partials_plan(kernels[2], params, torch.float32, torch.float32)
            assert 1 <= len(wf._partials_plans) <= 3
    assert len(by_name) < 12 * 3  # kernels of one name met at several batch sizes
    assert wf._partials_plans, "no partial-sums WGrad chosen: the plans went unchecked"
    # On a GPU the perf model's selections are remembered too (the CPU takes the heuristic's
    # default without them): bounded as well.
    from spio.kernels import perf_model as pm

    monkeypatch.setattr(pm, "_selected", {})
    monkeypatch.setattr(pm, "MAX_SELECTED", 5)
    monkeypatch.setattr(pm, "device_identity", lambda device: pm.DeviceIdentity("sm_90", "", ""))
    for n in range(1, 9):
        _kernels.fprop_kernel(Conv2dGw8Params(n, 16, 6, 6), torch.device("cuda", 0))
        assert 1 <= len(pm._selected) <= 5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias_dtype", ["half", torch.float32, None])
def test_every_kernel_a_call_launches_is_one_spio_compile_builds(dtype, bias_dtype):
    """`spio compile` builds each family's runnable_kernels; the kernels a layer's calls
    launch (Layer.kernels, both gradient-dtype pairs of a partials WGrad) must be among them,
    or a half model's first backward compiles at run time (runnable_kernels had been the
    oracle of the compile test itself, and lost the half-bias sums unseen)."""
    from spio.kernels.families import FAMILIES, with_tensor_copies

    x = torch.randn(2, 16, 6, 5, dtype=dtype)
    w = torch.randn(16, 8, 3, 3, dtype=dtype)
    b = (
        None
        if bias_dtype is None
        else torch.randn(16, dtype=dtype if bias_dtype == "half" else bias_dtype)
    )
    layer = _kernels.layer(x, w, b, 1, 1)
    launched = layer.kernels(w, b, _kernels.ALL_PASSES, (True, True, b is not None), False)
    assert any(k.name.startswith("sum_slots__") for k in launched)  # a partials WGrad
    buildable = set()
    for family in FAMILIES.values():
        for kernel in launched:
            if kernel.name.split("__")[0] == family.name:
                config = kernel.info_value("config")
                buildable |= {
                    with_tensor_copies(k, None).name
                    for k in family.runnable_kernels(layer.params, config)
                }
    assert {k.name for k in launched} <= buildable
