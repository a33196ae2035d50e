"""spio.transform and spio.scan_modules on a ConvNet mixing eligible and ineligible convolutions."""

import copy
import functools
import logging
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import spio.transform as spio_transform
from spio.kernels import Conv2dGw8Params
from spio.layers import Conv2dGw8
from spio.transform import scan_modules, transform
from tests.conftest import spy_on_launches
from tests.transform import convnet


def _model(seed=0):
    torch.manual_seed(seed)
    return convnet.MixedConvNet().double()


def test_replaces_exactly_the_eligible_convs(caplog):
    model = _model()
    original = copy.deepcopy(model)
    before = dict(model.named_parameters())
    with caplog.at_level(logging.INFO, logger="spio"):
        out = transform(model)
    assert out is model
    assert "replaced 4 of 10 nn.Conv2d modules" in caplog.text
    kinds = {name: type(m) for name, m in model.named_modules()}
    assert kinds["blocks.0"] is Conv2dGw8
    assert kinds["blocks.3"] is Conv2dGw8
    assert kinds["heads.row"] is Conv2dGw8
    assert kinds["shared_a"] is Conv2dGw8 and model.shared_a is model.shared_b
    for name in ("stem", "blocks.4", "blocks.5", "heads.wide", "heads.reflect"):
        assert kinds[name] is nn.Conv2d, name
    assert kinds["heads.sub"] is convnet.SubclassConv
    n_spio = sum(isinstance(m, Conv2dGw8) for m in model.modules())
    assert n_spio == convnet.MixedConvNet.ELIGIBLE
    assert model.blocks[3].padding == "same" and model.blocks[3]._spio_padding == (2, 2)
    # Parameters are shared with the modules replaced (the same objects), not copied.
    after = dict(model.named_parameters())
    assert after.keys() == dict(original.named_parameters()).keys() == before.keys()
    assert all(after[name] is before[name] for name in before)


def test_include_keeps_the_convs_it_rejects(caplog):
    """include(name, conv) decides per eligible convolution; the names are model.named_modules()
    names, a shared module is decided once, and the rejected ones stay plain nn.Conv2d."""
    model = _model()
    asked = []

    def include(name, conv):
        asked.append(name)
        assert type(conv) is nn.Conv2d
        return not name.startswith("blocks.")

    with caplog.at_level(logging.INFO, logger="spio"):
        transform(model, include=include)
    assert "replaced 2 of 10 nn.Conv2d modules (2 excluded)" in caplog.text
    assert sorted(asked) == ["blocks.0", "blocks.3", "heads.row", "shared_a"]
    kinds = {name: type(m) for name, m in model.named_modules()}
    assert kinds["blocks.0"] is nn.Conv2d and kinds["blocks.3"] is nn.Conv2d
    assert kinds["heads.row"] is Conv2dGw8 and kinds["shared_a"] is Conv2dGw8
    assert model.shared_a is model.shared_b
    bare = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    assert transform(bare, include=lambda name, conv: False) is bare
    assert type(transform(bare, include=lambda name, conv: name == "")) is Conv2dGw8
    # The same through the public name, spio.transform (a callable package).
    import spio

    assert spio.transform(bare, include=lambda name, conv: False) is bare
    assert type(spio.transform(bare, include=lambda name, conv: True)) is Conv2dGw8


def test_outputs_and_gradients_preserved():
    model = _model(1)
    reference = copy.deepcopy(model)
    transform(model)
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    y, y_ref = model(x), reference(x)
    torch.testing.assert_close(y, y_ref)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)
    # The BatchNorm running statistics moved identically.
    torch.testing.assert_close(model.blocks[1].running_mean, reference.blocks[1].running_mean)


def test_state_dict_round_trip():
    model = transform(_model(2))
    plain = _model(3)
    plain.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64)
    model.eval()
    plain.eval()
    torch.testing.assert_close(plain(x), model(x))
    other = _model(4)
    model.load_state_dict(other.state_dict())
    other.eval()
    torch.testing.assert_close(model(x), other(x))


def test_transform_is_idempotent_and_handles_a_bare_conv(caplog):
    model = transform(_model())
    before = [type(m) for m in model.modules()]
    with caplog.at_level(logging.DEBUG, logger="spio"):
        assert transform(model) is model
    # The Conv2dGw8 layers are not counted again as nn.Conv2d modules it keeps.
    assert "replaced 0 of 6 nn.Conv2d modules" in caplog.text
    assert "is a Conv2dGw8" not in caplog.text
    assert [type(m) for m in model.modules()] == before
    bare = nn.Conv2d(8, 8, 3, padding=1)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spio"):
        assert type(transform(bare)) is Conv2dGw8
        assert transform(bare, include=lambda name, conv: False) is bare
    # A bare conv is counted as a model of one conv, replaced or excluded.
    assert "replaced 1 of 1 nn.Conv2d modules" in caplog.records[0].getMessage()
    assert caplog.records[1].getMessage().endswith("replaced 0 of 1 nn.Conv2d modules (1 excluded)")
    assert type(transform(nn.Conv2d(8, 8, 3, stride=2))) is nn.Conv2d


def test_untransform_restores_plain_convs_sharing_parameters(caplog):
    """untransform undoes transform: exact nn.Conv2d modules (for torch.onnx.export, or a machine
    without spio), the same Parameter objects, shared modules still shared (and counted once),
    same outputs."""
    import spio

    reference = _model(5)
    model = transform(copy.deepcopy(reference))
    weights = {name: p for name, p in model.named_parameters()}
    with caplog.at_level(logging.INFO, logger="spio"):
        model = spio.untransform(model)
    assert "spio.untransform restored 4 nn.Conv2d modules" in caplog.text
    assert not any(isinstance(m, Conv2dGw8) for m in model.modules())
    assert [type(m) for m in model.modules()] == [type(m) for m in reference.modules()]
    assert all(p is weights[name] for name, p in model.named_parameters())
    assert model.shared_a is model.shared_b
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    model.eval()
    reference.eval()
    torch.testing.assert_close(model(x), reference(x))
    bare = Conv2dGw8(8, 8, 3, padding=1, groups=1).train(False)
    plain = spio.untransform(bare)
    assert type(plain) is nn.Conv2d and plain.weight is bare.weight and not plain.training


def test_what_a_user_added_to_a_conv_survives_transform_and_untransform():
    """Extra Parameters, buffers (persistent or not) and submodules are carried over, the same
    objects: state_dict keys and the optimizer's parameters stay as they were."""
    import spio

    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    conv.scale = nn.Parameter(torch.ones(16))
    conv.register_buffer("mask", torch.ones(16))
    conv.register_buffer("scratch", torch.zeros(2), persistent=False)
    conv.aux = nn.Linear(2, 2)
    model = nn.Sequential(conv)
    keys, params = list(model.state_dict()), list(model.parameters())
    transform(model)
    assert type(model[0]) is Conv2dGw8 and model[0].mask is conv.mask
    assert model[0].scratch is conv.scratch and model[0].aux is conv.aux
    assert list(model.state_dict()) == keys
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    spio.untransform(model)
    assert type(model[0]) is nn.Conv2d and list(model.state_dict()) == keys
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]


def test_hooks_on_a_conv2dgw8_survive_untransform_and_their_handles_still_remove_them():
    """untransform gives the plain nn.Conv2d the layer's hooks (forward, forward-pre, full
    backward, state_dict, load_state_dict with the module): the same dicts, so that a handle
    taken on the Conv2dGw8 still removes its hook. They had been dropped."""
    import spio

    model = transform(nn.Sequential(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2))))
    layer = model[0][0]
    assert type(layer) is Conv2dGw8
    seen = []
    handles = [
        layer.register_forward_pre_hook(lambda m, args: seen.append(("pre", type(m)))),
        layer.register_forward_hook(lambda m, args, out: seen.append(("forward", type(m)))),
        layer.register_full_backward_hook(lambda m, gin, gout: seen.append(("backward", type(m)))),
        layer._register_state_dict_hook(lambda m, *a: seen.append(("state_dict", type(m)))),
        layer.register_load_state_dict_pre_hook(lambda m, *a: seen.append(("load", type(m)))),
    ]
    spio.untransform(model)
    del layer  # the Conv2dGw8 is gone; hooks that receive the module get its replacement
    assert type(model[0][0]) is nn.Conv2d
    x = torch.randn(1, 16, 5, 5, requires_grad=True)
    model(x).sum().backward()
    model.load_state_dict(model.state_dict())
    kinds = ["pre", "forward", "backward", "state_dict", "load"]
    assert seen == [(kind, nn.Conv2d) for kind in kinds]
    for handle in handles:
        handle.remove()
    seen.clear()
    model(x).sum().backward()
    model.load_state_dict(model.state_dict())
    assert seen == []


def _load_hooked(model: nn.Module, layer: nn.Module) -> list:
    """A load_state_dict pre-hook on `layer` that records the type of the module it receives."""
    seen: list = []
    layer.register_load_state_dict_pre_hook(lambda m, *a: seen.append(type(m).__name__))
    return seen


def test_a_converted_copy_leaves_the_layers_hooks_with_the_layer():
    """to_torch_module() (e.g. to script a copy, as the layer's own error advises) and
    from_torch_module() had pointed the hooks that receive the module at the copy: the layer in
    the model then handed them the copy, and once the copy was gone load_state_dict failed
    ("hook of a dead Module"). They receive the layer while it lives, the copy only after."""
    import gc

    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)))
    seen = _load_hooked(model, model[0])
    plain = model[0].to_torch_module()
    again = Conv2dGw8.from_torch_module(plain)
    model.load_state_dict(model.state_dict())
    assert seen == ["Conv2dGw8"]
    del plain, again
    gc.collect()
    model.load_state_dict(model.state_dict())
    assert seen == ["Conv2dGw8", "Conv2dGw8"]
    # A copy put in the layer's place, as a user may, receives them once the layer is gone.
    model[0] = model[0].to_torch_module()
    gc.collect()
    model.load_state_dict(model.state_dict())
    assert seen[-1] == "Conv2d"


_SEEN_BY_PICKLED_HOOK: list = []


def _pickled_hook(module, *args):
    _SEEN_BY_PICKLED_HOOK.append(type(module).__name__)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_of_a_layer_made_from_a_live_conv_gives_its_hooks_the_copy(how):
    """A layer made by from_torch_module while its conv lives shares the conv's hooks, which
    receive the conv while it lives; a copy of the layer (deepcopy, pickle, torch.save) had
    copied them with a copy of the conv that nothing held, and the copy's load_state_dict
    failed ("hook of a dead Module"). The copy's hooks receive the copy; the original's are
    as they were."""
    import pickle

    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    seen = _SEEN_BY_PICKLED_HOOK
    seen.clear()
    conv.register_load_state_dict_pre_hook(_pickled_hook)  # (a lambda does not pickle)
    layer = Conv2dGw8.from_torch_module(conv)
    clone = copy.deepcopy(layer) if how == "deepcopy" else pickle.loads(pickle.dumps(layer))
    clone.load_state_dict(clone.state_dict())
    assert seen == ["Conv2dGw8"]
    layer.load_state_dict(layer.state_dict())
    assert seen == ["Conv2dGw8", "Conv2d"]  # the conv, alive (as before)
    assert torch.equal(clone.weight, layer.weight) and clone.weight is not layer.weight
    # The conv copied alone keeps receiving its copy; both copied together, the conv's copy
    # (alive with the layer's) receives them, as the originals do.
    seen.clear()
    for copied in (copy.deepcopy(conv), *copy.deepcopy((layer, conv))):
        copied.load_state_dict(copied.state_dict())
    assert seen == ["Conv2d", "Conv2d", "Conv2d"]


def test_copies_of_shared_hooks_keep_what_plain_copies_keep():
    """A shallow copy shares the hook dicts, and a handle copied with the layer removes the
    hook from the layer's copy, as for an nn.Conv2d; a weight_norm layer (whose parametrized
    class has a __deepcopy__ of its own) gives its copy's hooks the copy too."""
    from torch.nn.utils.parametrizations import weight_norm

    seen = _SEEN_BY_PICKLED_HOOK
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    handle = conv.register_load_state_dict_pre_hook(_pickled_hook)
    layer = Conv2dGw8.from_torch_module(conv)
    assert copy.copy(layer)._load_state_dict_pre_hooks is layer._load_state_dict_pre_hooks
    clone, clone_handle = copy.deepcopy((layer, handle))
    clone_handle.remove()
    assert len(clone._load_state_dict_pre_hooks) == 0 and len(layer._load_state_dict_pre_hooks)
    normed = weight_norm(nn.Conv2d(16, 16, 3, padding=1, groups=2))
    normed.register_load_state_dict_pre_hook(_pickled_hook)
    layer = Conv2dGw8.from_torch_module(normed)
    seen.clear()
    clone = copy.deepcopy(layer)
    clone.load_state_dict(clone.state_dict())
    assert seen == ["ParametrizedConv2dGw8"]


def test_a_transform_refused_by_include_leaves_the_hooks_as_they_were():
    """An include answer checked after earlier convs were converted had left their hooks
    pointing at the dropped conversions: load_state_dict then failed ("hook of a dead
    Module")."""
    import gc

    model = nn.Sequential(*(nn.Conv2d(16, 16, 3, padding=1, groups=2) for _ in range(2)))
    seen = _load_hooked(model, model[0])
    with pytest.raises(ValueError, match="got 'fpropp'"):
        transform(model, include=lambda name, conv: True if name == "0" else "fpropp")
    gc.collect()
    model.load_state_dict(model.state_dict())
    assert seen == ["Conv2d"] and type(model[0]) is nn.Conv2d


@pytest.mark.parametrize("undo", [False, True], ids=["transform", "untransform"])
def test_a_conv_within_a_conv_is_replaced_too(undo):
    """A conv that is a submodule of another eligible conv (an adapter its hooks call, say) had
    been set on the outer conv's dropped original: counted as replaced, left as it was."""
    import spio

    outer = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    outer.adapter = nn.Conv2d(16, 16, 1, groups=2)
    model = transform(nn.Sequential(outer))
    assert [type(m) for m in (model[0], model[0].adapter)] == [Conv2dGw8, Conv2dGw8]
    if undo:
        spio.untransform(model)
        assert [type(m) for m in (model[0], model[0].adapter)] == [nn.Conv2d, nn.Conv2d]


class _ListedBranches(nn.Module):
    """Calls its convs through a plain list, which module walks (transform) do not see."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.branches = [self.conv1, self.conv2]

    def forward(self, x):
        return sum(branch(x) for branch in self.branches)


def test_convs_called_past_the_walk_are_named_not_a_crash(caplog):
    """The replaced convs still called through a plain list share their replacements' hooks,
    so the stand-in forward's hooks met them: a KeyError from scan_modules (an AttributeError
    from precompile). Now they are counted and the model's author told how to mend it."""
    model = transform(_ListedBranches())
    with caplog.at_level(logging.WARNING, logger="spio"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert scan_modules(model, torch.randn(1, 16, 6, 6)) == []
    assert "2 calls of an nn.Conv2d that spio.transform replaced" in caplog.text
    assert "nn.ModuleList" in caplog.text


def test_a_deprecated_spectral_norm_is_named_with_its_mend(caplog):
    """Its weight is a plain tensor set at each call, as the deprecated weight_norm's: the
    message had blamed FSDP."""
    model = nn.Sequential(nn.utils.spectral_norm(nn.Conv2d(16, 16, 3, padding=1, groups=2)))
    with caplog.at_level(logging.WARNING, logger="spio"):
        transform(model)
    assert type(model[0]) is nn.Conv2d
    assert (
        "the deprecated torch.nn.utils.spectral_norm (use torch.nn.utils.parametrizations"
        ".spectral_norm)"
        in caplog.text
        and "FSDP" not in caplog.text
    )


def test_package_is_callable():
    model = spio_transform(_model())
    assert isinstance(model.blocks[0], Conv2dGw8)


@pytest.mark.parametrize("transformed", [False, True])
def test_scan_modules(transformed):
    model = _model().float()
    if transformed:
        transform(model)
    model.train()
    stats = copy.deepcopy(model.blocks[1].state_dict())
    x = torch.randn(2, 3, 9, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        found = scan_modules(model, x)
    p = dict(n=2, c=16, h=9, w=8, dtype="fp16")
    assert found == [
        Conv2dGw8Params(**p, padding=1, r=3, s=3, has_bias=True),
        Conv2dGw8Params(**p, padding=2, r=5, s=5, has_bias=True),
        Conv2dGw8Params(**p | dict(h=5, w=4), padding=(0, 1), r=1, s=3, has_bias=False),
        Conv2dGw8Params(**p | dict(h=5, w=4), padding=1, r=3, s=3, has_bias=True),
    ]
    # No side effects: buffers restored, no hooks left, mode unchanged.
    for key, value in model.blocks[1].state_dict().items():
        torch.testing.assert_close(value, stats[key], msg=key)
    assert model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_scan_modules_reads_autocast_dtype():
    model = transform(_model()).float()
    x = torch.randn(1, 3, 6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        found = scan_modules(model, x)
    assert found and all(p.dtype == "bf16" for p in found)


def test_scan_modules_lists_bf16_inputs_outside_autocast():
    """An input already in bf16 runs bf16 kernels without autocast: listed as bf16, not
    skipped as a layer that runs no kernel."""
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)).bfloat16()
    found = scan_modules(model, torch.randn(2, 16, 5, 6, dtype=torch.bfloat16))
    assert found == [Conv2dGw8Params(2, 16, 5, 6, padding=1, has_bias=True, dtype="bf16")]


def test_scan_modules_lists_an_unbatched_input_as_a_batch_of_one():
    """nn.Conv2d takes a 3-D (C, H, W) input as one image; the layer it runs is N = 1."""
    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2))).half()
    found = scan_modules(model, torch.randn(16, 5, 6).half())
    assert found == [Conv2dGw8Params(1, 16, 5, 6, padding=1, has_bias=True)]


def test_scan_modules_sees_a_conv_called_with_a_keyword_input():
    """conv(input=x) is a call like conv(x): its layer is listed, for nn.Conv2d and Conv2dGw8."""

    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)

        def forward(self, x):
            return self.conv(input=x)

    expected = [Conv2dGw8Params(2, 16, 5, 6, padding=1, has_bias=True)]
    x = torch.randn(2, 16, 5, 6).half()
    assert scan_modules(Keyword().half(), x) == expected
    assert scan_modules(transform(Keyword()).half(), x) == expected


def test_scan_modules_lists_meta_device_layers_as_fp16():
    """On the meta device nothing runs and autocast does not apply: a model built there (e.g. to
    list a large model's layers without memory) is listed as fp16, whatever its dtype."""
    model = nn.Sequential(
        nn.Conv2d(16, 16, 5, padding="same", groups=2, device="meta", dtype=torch.float64),
        nn.Conv2d(16, 16, 3, stride=2, groups=2, device="meta", dtype=torch.float64),
    )
    found = scan_modules(model, torch.empty(2, 16, 9, 8, device="meta", dtype=torch.float64))
    assert found == [Conv2dGw8Params(2, 16, 9, 8, padding=2, r=5, s=5, has_bias=True)]


def test_scan_modules_restores_the_random_number_state():
    """Dropout draws in the scanning pass; the generator is put back, so that a seeded run that
    scans its model first draws what it would have drawn without scanning."""
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2), nn.Dropout(0.5)).half()
    model.train()
    x = torch.randn(2, 16, 5, 6).half()
    state = torch.get_rng_state()
    assert len(scan_modules(model, x)) == 1
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "dtype, region",
    [(torch.float32, None), (torch.float64, None), (torch.float64, torch.bfloat16)],
)
def test_scan_modules_lists_no_layer_that_runs_no_kernel(caplog, dtype, region):
    """Outside autocast, fp32 (or fp64) calls run PyTorch's convolution, and float64 calls do
    under autocast too (it leaves float64 as it is): they are not listed, and a warning says why
    (they had been listed as fp16 layers, and float64 ones under autocast in its dtype)."""
    model = transform(_model()).to(dtype)
    with caplog.at_level(logging.WARNING, logger="spio"):
        with torch.autocast("cpu", dtype=region or torch.bfloat16, enabled=region is not None):
            assert scan_modules(model, torch.randn(1, 3, 6, 6, dtype=dtype)) == []
    assert "4 calls of spio-eligible convolutions got inputs no kernel takes" in caplog.text


def test_scan_modules_lists_autocasts_dtype_over_the_inputs(monkeypatch):
    """Autocast casts fp16 inputs in a bf16 region to bf16 (and the layer runs bf16 kernels):
    listed as bf16, as spio_kernels names them (they had been listed as fp16)."""
    monkeypatch.setenv("SPIO_EMULATE", "1")  # CPU tensors run spio's kernels: spio_kernels lists
    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2))).half()
    x = torch.randn(2, 16, 5, 6).half()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        found = scan_modules(model, x)
        kernels = model[0].spio_kernels(x, backward=False)
    assert found == [Conv2dGw8Params(2, 16, 5, 6, padding=1, has_bias=True, dtype="bf16")]
    assert [k.name.split("__")[1] for k in kernels] == [found[0].encode_image()]


def test_scan_modules_skips_a_layer_that_falls_back_for_attributes_set_later():
    """A Conv2dGw8 whose stride was set after construction runs PyTorch's convolution (its
    forward says so): not listed (it had been, as a stride-1 layer)."""
    model = transform(nn.Sequential(*(nn.Conv2d(16, 16, 3, padding=1, groups=2) for _ in range(2))))
    model = model.half()
    model[0].stride = (2, 2)
    found = scan_modules(model, torch.randn(2, 16, 8, 8).half())
    assert found == [Conv2dGw8Params(2, 16, 4, 4, padding=1, has_bias=True)]


def test_a_forward_set_on_the_instance_keeps_a_conv_and_attributes_travel():
    """A conv with a forward set on the instance stays an nn.Conv2d, since its replacement would
    not call it; attributes set on a conv (a tag) are set on its replacement too."""
    own_forward = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    own_forward.forward = lambda x: x  # a replacement carrying it would not run spio
    tagged = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    tagged.tag = "last"
    model = transform(nn.Sequential(own_forward, tagged))
    assert [type(m) for m in model] == [nn.Conv2d, Conv2dGw8]
    assert model[1].tag == "last"
    assert type(spio_transform.untransform(model)[1]) is nn.Conv2d and model[1].tag == "last"
    assert not hasattr(model[1], "_pass_bits")


def test_hooked_convs_are_replaced_and_their_hooks_run_on_spio_kernels(monkeypatch):
    """Hooks registered on an nn.Conv2d before transform (forward-pre, forward with kwargs,
    full backward-pre and backward, state_dict, load_state_dict with the module) travel to its
    Conv2dGw8: they run, around spio's kernels (emulated), receive the Conv2dGw8 and the
    gradients autograd computes, and the handles taken on the nn.Conv2d still remove them.
    Hooked convs used to be left as nn.Conv2d."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    torch.manual_seed(0)
    first, second = (nn.Conv2d(16, 16, 3, padding=1, groups=2).half() for _ in range(2))
    seen: dict[str, list] = {}

    def record(kind):
        return lambda m, *args, **kwargs: seen.setdefault(kind, []).append((m, args))

    handles = [
        first.register_forward_pre_hook(record("pre")),
        first.register_forward_hook(record("forward"), with_kwargs=True),
        first.register_full_backward_pre_hook(record("backward_pre")),
        first.register_full_backward_hook(record("backward")),
        second._register_state_dict_hook(record("state_dict")),
        second.register_load_state_dict_pre_hook(record("load")),
    ]
    assert Conv2dGw8.match(first) and Conv2dGw8.match(second)
    model = transform(nn.Sequential(first, second))
    assert [type(m) for m in model] == [Conv2dGw8, Conv2dGw8]
    del first, second  # the nn.Conv2d are gone; hooks that receive the module get the new one

    launched = spy_on_launches(monkeypatch)
    x = torch.randn(2, 16, 5, 6).half().to(memory_format=torch.channels_last).requires_grad_()
    y = model(x)
    y.float().sum().backward()
    model.load_state_dict(model.state_dict())
    for kind in ("fprop", "dgrad", "wgrad"):
        assert f"conv2d_gw8_{kind}" in launched, launched
    kinds = ["pre", "forward", "backward_pre", "backward", "state_dict", "load"]
    assert sorted(seen) == sorted(kinds)
    assert all(len(calls) == 1 for calls in seen.values()), seen
    owners = [model[0]] * 4 + [model[1]] * 2
    for kind, owner in zip(kinds, owners, strict=True):
        assert seen[kind][0][0] is owner, kind
    (args,) = seen["pre"][0][1]
    assert args[0] is x
    (_, kwargs, out) = seen["forward"][0][1]
    assert kwargs == {} and torch.equal(out, model[0](x))
    # The backward hook sees the gradients autograd passes: the output's, and the input's that
    # lands in x.grad.
    ((grad_out,),) = seen["backward_pre"][0][1]
    (grad_in, grad_out_again) = seen["backward"][0][1]
    assert torch.equal(grad_out, grad_out_again[0]) and torch.isfinite(grad_out).all()
    assert grad_out.abs().sum() > 0
    assert torch.equal(grad_in[0], x.grad)

    for handle in handles:
        handle.remove()
    seen.clear()
    model(x).float().sum().backward()
    model.load_state_dict(model.state_dict())
    assert seen == {}


def test_include_answers_are_checked_before_the_model_changes():
    """A pass name alone is one pass; an answer that is no pass names fails naming it, and
    leaves the model as it was (the layers before it used to be replaced already)."""
    model = nn.Sequential(*(nn.Conv2d(16, 16, 3, padding=1, groups=2) for _ in range(3)))
    transform(model, include=lambda name, conv: "fprop")
    assert [m.spio_passes for m in model] == [("fprop",)] * 3
    model = nn.Sequential(*(nn.Conv2d(16, 16, 3, padding=1, groups=2) for _ in range(3)))
    for bad, error in (
        ("fprop,dgrad", ValueError),
        (None, TypeError),
        (["fprop", "bprop"], ValueError),
    ):
        answers = {"0": True, "1": True, "2": bad}
        # The answer as include gave it (a string was shown as the tuple made of it).
        said = rf"include\('2', conv\) must return True, False .*, got {re.escape(repr(bad))}$"
        with pytest.raises(error, match=said):
            transform(model, include=lambda name, conv, a=answers: a[name])
        assert [type(m) for m in model] == [nn.Conv2d] * 3


@pytest.mark.parametrize("flag", [np.True_, np.False_, torch.tensor(True), torch.tensor(False)])
def test_an_include_answer_and_spio_passes_take_numpy_and_tensor_bools(flag):
    """A predicate such as np.prod(conv.kernel_size) < 49 answers numpy's bool: it had been a
    TypeError ("must return True, False or pass names ..., got np.True_")."""
    expected = ("fprop", "dgrad", "wgrad") if flag else ()
    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)),
                      include=lambda name, conv: flag)  # fmt: skip
    assert getattr(model[0], "spio_passes", ()) == expected
    layer = Conv2dGw8(16, 16, 3, padding=1, groups=2)
    layer.spio_passes = flag
    assert layer.spio_passes == expected


@pytest.mark.parametrize(
    "bad, error",
    [(1.0, TypeError), (None, TypeError), (np.array([True]), TypeError),
     (["fprop", 1], TypeError), ("bprop", ValueError), (["fprop", "bprop"], ValueError)],
    ids=repr,
)  # fmt: skip
def test_an_include_answer_and_spio_passes_refuse_a_value_alike(bad, error):
    """The same value refused by include's answer and by Conv2dGw8.spio_passes is the same
    error type: TypeError for a value of the wrong type, ValueError for unknown pass names.
    include answering 1.0 was a ValueError where spio_passes = 1.0 was a TypeError."""
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2))
    with pytest.raises(error, match=r"include\('0', conv\) must return True, False or pass"):
        transform(model, include=lambda name, conv: bad)
    assert type(model[0]) is nn.Conv2d
    layer = Conv2dGw8(16, 16, 3, padding=1, groups=2)
    with pytest.raises(error, match="spio_passes must be True, False, pass names"):
        layer.spio_passes = bad
    assert layer.spio_passes == ("fprop", "dgrad", "wgrad")


def test_shared_parents_are_named_by_their_first_path_and_counted_once(caplog):
    block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2), nn.Conv2d(16, 16, 3))
    model = nn.Module()
    model.a = block
    model.b = block  # the same block twice: its convs count once
    asked = []
    with caplog.at_level(logging.INFO, logger="spio"):
        transform(model, include=lambda name, conv: asked.append(name) or True)
    assert asked == ["a.0"]
    assert "replaced 1 of 2 nn.Conv2d modules" in caplog.text
    assert type(model.a[0]) is Conv2dGw8 and model.a is model.b


def test_the_log_says_how_many_layers_run_each_pass_when_some_leave_passes_to_pytorch(caplog):
    """Where include gives some convolutions only some passes, the log line counts, for each
    pass, the replaced layers that run it in spio; where every layer runs all three, it says
    nothing more."""
    model = nn.Sequential(*(nn.Conv2d(16, 16, 3, padding=1, groups=2) for _ in range(3)))
    answers = {"0": ("fprop",), "1": True, "2": ("fprop", "wgrad")}
    with caplog.at_level(logging.INFO, logger="spio"):
        transform(model, include=lambda name, conv: answers[name])
    assert caplog.records[-1].getMessage() == (
        "spio.transform replaced 3 of 3 nn.Conv2d modules; "
        "spio runs fprop 3, dgrad 1, wgrad 2 of their passes"
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spio"):
        transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)))
    assert caplog.records[-1].getMessage() == "spio.transform replaced 1 of 1 nn.Conv2d modules"


def test_the_debug_log_counts_the_convs_kept_for_each_reason(caplog):
    """Each reason a convolution is kept is logged once, with how many distinct convolutions it
    keeps (a shared one counts once)."""
    strided = nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=2)
    model = nn.Sequential(
        strided, strided, nn.Conv2d(16, 16, 3, stride=2, groups=2), nn.Conv2d(16, 16, 3, groups=4)
    )
    with caplog.at_level(logging.DEBUG, logger="spio"):
        transform(model)
    kept = [r.getMessage() for r in caplog.records if "kept" in r.getMessage()]
    assert kept == [
        "spio.transform kept 2 nn.Conv2d: needs stride 1, got (2, 2)",
        "spio.transform kept 1 nn.Conv2d: needs group width 8, got in_channels=16, groups=4",
    ]


def test_convs_kept_for_a_reason_they_cannot_mend_are_no_warning_even_when_pruned(caplog):
    """Only a conv kept for something its user can mend (pruned, compiled in place, a shard) is
    a warning, and under that reason. A pruned conv that transform could never take (a strided
    one, a subclass) was warned of under its other reason ("needs stride 1" as a warning)."""
    from torch.nn.utils import prune

    class MyConv(nn.Conv2d):
        pass

    strided = nn.Conv2d(16, 16, 3, stride=2, padding=1)
    mine = MyConv(16, 16, 3, padding=1, groups=2)
    pruned = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    for conv in (strided, mine, pruned):
        prune.l1_unstructured(conv, "weight", amount=0.3)
    with caplog.at_level(logging.DEBUG, logger="spio"):
        transform(nn.Sequential(strided, mine, pruned, nn.Conv2d(16, 16, 3, padding=1, groups=2)))
    kept = {r.getMessage(): r.levelname for r in caplog.records if "kept" in r.getMessage()}
    assert kept == {
        "spio.transform kept 1 nn.Conv2d: needs group width 8, got in_channels=16, groups=1": (
            "DEBUG"
        ),
        "spio.transform kept 1 nn.Conv2d: is a MyConv, not exactly nn.Conv2d": "DEBUG",
        "spio.transform kept 1 nn.Conv2d: is pruned (torch.nn.utils.prune), its weight not a "
        "Parameter: transform before pruning": "WARNING",
    }, kept


def test_an_uninitialised_lazy_conv_is_kept_and_the_rest_transformed():
    """A LazyConv2d (a subclass) is kept as it is; transform had read its uninitialised
    weight's shape (for a shard) and raised PyTorch's error for the whole model."""
    model = nn.Sequential(
        nn.LazyConv2d(16, 3, stride=2, padding=1), nn.Conv2d(16, 16, 3, padding=1, groups=2)
    )
    transform(model)
    assert type(model[0]) is nn.LazyConv2d and type(model[1]) is Conv2dGw8
    model(torch.randn(1, 3, 8, 8))  # the lazy conv initialises, and is an nn.Conv2d now
    assert type(model[0]) is nn.Conv2d
    transform(model)  # stride 2: kept still
    assert type(model[0]) is nn.Conv2d and type(model[1]) is Conv2dGw8


def test_arguments_of_the_wrong_kind_are_type_errors_naming_the_function():
    """A string for the model, or True for include, failed inside with AttributeError or
    "'bool' object is not callable"; a kwargs of the model's call that is not a dict too."""
    calls = {
        "spio.transform needs an nn.Module, got str": lambda: transform("model"),
        "include must be a function of (name, conv) or None, got bool": lambda: transform(
            _model(), include=True
        ),
        "spio.untransform needs an nn.Module, got list": lambda: spio_transform.untransform([]),
        "spio.scan_modules needs an nn.Module, got int": lambda: scan_modules(3),
        "spio.precompile needs an nn.Module, got NoneType": lambda: spio_transform.precompile(None),
        "spio.transform.where_faster needs an nn.Module, got str": lambda: (
            spio_transform.where_faster("model", timer=lambda *a: 0.0)
        ),
        # A kwargs that is no dict failed inside with AttributeError.
        "spio.scan_modules: kwargs must be a dict of the model call's keyword arguments, got "
        "list": lambda: scan_modules(_model(), torch.randn(1, 16, 4, 4), kwargs=[1]),
        "spio.precompile: kwargs must be a dict of the model call's keyword arguments, got str": (
            lambda: spio_transform.precompile(_model(), kwargs="abc")
        ),
        "spio.transform.where_faster: kwargs must be a dict of the model call's keyword "
        "arguments, got tuple": lambda: spio_transform.where_faster(_model(), kwargs=()),
    }
    for message, call in calls.items():
        with pytest.raises(TypeError, match=re.escape(message)):
            call()


def test_scan_modules_runs_the_model_without_autograd():
    """The listing pass records no graph: a model that checks finds autograd off, and its
    output would need no backward."""
    grad_enabled = []

    class Checking(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)

        def forward(self, x):
            grad_enabled.append(torch.is_grad_enabled())
            return self.conv(x)

    assert len(scan_modules(Checking().half(), torch.randn(1, 16, 5, 6).half())) == 1
    assert len(scan_modules(transform(Checking()).half(), torch.randn(1, 16, 5, 6).half())) == 1
    assert grad_enabled == [False, False]


@pytest.mark.parametrize("called_first", [False, True])
def test_a_compiled_convolution_runs_spio_after_transform_and_pytorch_after_untransform(
    monkeypatch, called_first
):
    """transform on torch.compile(conv) replaces the conv it wraps, and the compiled module then
    calls the Conv2dGw8 (spio's kernels, emulated); untransform brings nn.Conv2d back. The
    compiled module's forward was bound to the nn.Conv2d, which it used to keep calling."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()
    x = torch.randn(2, 16, 5, 6).half()
    with torch.no_grad():
        expected = copy.deepcopy(conv).double()(x.double())
    compiled = torch.compile(conv)
    if called_first:
        compiled(x)
    launched = spy_on_launches(monkeypatch)
    assert transform(compiled) is compiled
    assert type(compiled._orig_mod) is Conv2dGw8
    with torch.no_grad():
        y = compiled(x)
    assert launched == ["conv2d_gw8_fprop"]
    torch.testing.assert_close(y.double(), expected, atol=1e-2, rtol=1e-2)
    assert spio_transform.untransform(compiled) is compiled
    assert type(compiled._orig_mod) is nn.Conv2d
    with torch.no_grad():
        compiled(x)
    assert launched == ["conv2d_gw8_fprop"]


def test_a_compiled_model_called_before_transform_recompiles_and_runs_spio(monkeypatch):
    """The README's promise for a model compiled first: its submodules are looked up at each
    call, so after transform the next call recompiles (the module-type guard fails) and runs
    spio's kernels (emulated)."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2), nn.ReLU()).half()
    x = torch.randn(2, 16, 5, 6).half()
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(x.double())
    compiled = torch.compile(model)
    with torch.no_grad():
        compiled(x)
    launched = spy_on_launches(monkeypatch)
    transform(compiled)
    with torch.no_grad():
        y = compiled(x)
    assert launched == ["conv2d_gw8_fprop"]
    torch.testing.assert_close(y.double(), expected, atol=1e-2, rtol=1e-2)


def test_a_conv_compiled_in_place_is_kept_saying_how_to_mend_it(caplog):
    """conv.compile() compiles that module's calls: a replacement would run uncompiled (its
    options unknown), so transform keeps the conv and warns; untransform warns of a Conv2dGw8
    compiled in place, whose nn.Conv2d comes back uncompiled. Both were silent."""
    compiled = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    compiled.compile()  # lazy: nothing compiles until a call
    model = nn.Sequential(compiled, nn.Conv2d(16, 16, 3, padding=1, groups=2))
    with caplog.at_level(logging.WARNING, logger="spio"):
        transform(model)
    assert [type(m) for m in model] == [nn.Conv2d, Conv2dGw8]
    assert "kept 1 nn.Conv2d: was compiled in place (Module.compile): transform before" in (
        caplog.text
    )
    assert not Conv2dGw8.match(compiled)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spio"):  # the model itself: kept, saying why
        assert transform(compiled) is compiled
    assert "kept 1 nn.Conv2d: was compiled in place" in caplog.text
    caplog.clear()
    model[1].compile()
    with caplog.at_level(logging.WARNING, logger="spio"):
        spio_transform.untransform(model)
    assert [type(m) for m in model] == [nn.Conv2d, nn.Conv2d]
    assert "1 Conv2dGw8 were compiled in place (Module.compile)" in caplog.text


def test_untransform_of_a_conv2dgw8_compiled_in_place_warns_as_for_a_nested_one(caplog):
    """The model itself a Conv2dGw8 compiled in place: its nn.Conv2d comes back uncompiled, and
    untransform says so as it does for one inside a model (it returned it silently)."""
    conv = Conv2dGw8(16, 16, 3, padding=1, groups=2)
    conv.compile()
    with caplog.at_level(logging.INFO, logger="spio"):
        restored = spio_transform.untransform(conv)
    assert type(restored) is nn.Conv2d and restored.weight is conv.weight
    assert "restored 1 nn.Conv2d modules" in caplog.text
    assert "1 Conv2dGw8 were compiled in place (Module.compile)" in caplog.text


def test_the_nn_conv2d_untransform_gives_back_runs_pytorch_not_spio(monkeypatch):
    """The nn.Conv2d given back for a Conv2dGw8 compiled in place had its compiled call, a
    compile of the Conv2dGw8's own: it still ran spio's op (torch.export recorded it). And one
    with a forward set on the instance (accelerate's hooks bind the old module) would run it too:
    untransform now refuses it, naming the layer, and changes nothing."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    model = nn.Sequential(Conv2dGw8(16, 16, 3, padding=1, groups=2))
    model[0].compile(backend="eager")
    spio_transform.untransform(model)
    seen = []
    model[0].register_forward_pre_hook(lambda module, args: seen.append(type(module)))
    x = torch.randn(1, 16, 5, 5)
    model(x)
    assert seen == [nn.Conv2d]
    exported = torch.export.export(model, (x,))
    targets = {str(node.target) for node in exported.graph.nodes}
    assert not any("spio" in t for t in targets) and any("conv" in t for t in targets), targets

    bound = transform(nn.Sequential(nn.Conv2d(16, 16, 3, groups=2), nn.Conv2d(16, 16, 1)))
    layer = bound[0]
    layer.forward = functools.partial(Conv2dGw8.forward, layer)  # as accelerate's hooks do
    with pytest.raises(ValueError, match=r"1 Conv2dGw8 layers .*: '0' has a forward of its own"):
        spio_transform.untransform(bound)
    assert bound[0] is layer
    with pytest.raises(ValueError, match="to_torch_module: the module has a forward of its own"):
        layer.to_torch_module()


def test_pruned_convs_are_named_as_such(caplog):
    """torch.nn.utils.prune leaves a conv's weight a plain tensor: transform keeps such a conv,
    and untransform refuses a pruned Conv2dGw8, each saying pruning is why and how to mend it
    (both blamed FSDP or the deprecated weight_norm). Pruning after transform runs spio."""
    from torch.nn.utils import prune

    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2)
    prune.l1_unstructured(conv, "weight", amount=0.5)
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert transform(nn.Sequential(conv))[0] is conv
    assert "kept 1 nn.Conv2d: is pruned (torch.nn.utils.prune)" in caplog.text
    assert "transform before pruning" in caplog.text
    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2)))
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    model.double()
    x = torch.randn(2, 16, 5, 5, dtype=torch.float64)
    want = F.conv2d(x, model[0].weight_orig * model[0].weight_mask, model[0].bias, 1, 1, 1, 2)
    torch.testing.assert_close(model(x), want)
    with pytest.raises(ValueError, match=r"'0' is pruned .*: prune.remove it first"):
        spio_transform.untransform(model)
    prune.remove(model[0], "weight")
    assert type(spio_transform.untransform(model)[0]) is nn.Conv2d


def test_untransform_refuses_a_subclass_of_conv2dgw8():
    """An nn.Conv2d in its place loses what the subclass adds: a forward of its own was dropped
    silently (the model then computed something else)."""

    class Twice(Conv2dGw8):
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.Sequential(Twice(16, 16, 3, padding=1, groups=2))
    with pytest.raises(ValueError, match="'0' is a Twice, a subclass of Conv2dGw8"):
        spio_transform.untransform(model)
    assert type(model[0]) is Twice


def test_a_whole_weight_of_another_filter_size_is_no_shard():
    """Conv2dGw8 runs a weight of another filter size (as nn.Conv2d does); untransform had
    refused it as an FSDP shard, and transform had kept such an nn.Conv2d with that warning."""
    x = torch.randn(1, 16, 6, 6)
    layer = Conv2dGw8(16, 16, 3, padding="same", groups=2)
    layer.weight = nn.Parameter(torch.randn(16, 8, 5, 5))
    model = nn.Sequential(layer)
    want = model(x)
    spio_transform.untransform(model)
    assert type(model[0]) is nn.Conv2d
    torch.testing.assert_close(model(x), want)
    conv = nn.Conv2d(16, 16, 3, padding="same", groups=2)
    conv.weight = nn.Parameter(torch.randn(16, 8, 5, 5))
    model = nn.Sequential(conv)
    want = model(x)
    transform(model)
    assert type(model[0]) is Conv2dGw8
    torch.testing.assert_close(model(x), want)


def test_scan_modules_lists_the_filter_size_the_weight_has():
    """The layer runs its weight's 5x5 filter, padded 2 for "same"; scan_modules had listed
    kernel_size's 3x3 padded 1, and where_faster would have timed that layer."""
    layer = Conv2dGw8(16, 16, 3, padding="same", groups=2).half()
    layer.weight = nn.Parameter(torch.randn(16, 8, 5, 5).half())
    conv = nn.Conv2d(16, 16, 3, padding="same", groups=2).half()
    conv.weight = nn.Parameter(torch.randn(16, 8, 5, 5).half())
    for module in (layer, conv):
        (params,) = scan_modules(module, torch.randn(2, 16, 8, 8).half())
        assert (params.r, params.s, params.padding) == (5, 5, (2, 2))


def test_an_uninitialised_lazy_conv_is_a_warning_saying_to_run_it_first(caplog):
    """Kept silently (at debug) before, though one forward pass first lets transform take it."""
    model = nn.Sequential(nn.LazyConv2d(16, 3, padding=1, groups=2))
    with caplog.at_level(logging.DEBUG, logger="spio"):
        transform(model)
    kept = [r for r in caplog.records if "kept" in r.getMessage()]
    assert [r.levelname for r in kept] == ["WARNING"]
    assert "uninitialised LazyConv2d" in kept[0].getMessage()
    assert "run one forward pass before transform" in kept[0].getMessage()
    model(torch.randn(1, 16, 5, 5))
    transform(model)
    assert type(model[0]) is Conv2dGw8


def test_a_lazy_conv_that_can_never_be_eligible_is_no_warning(caplog):
    """A strided or 7x7 LazyConv2d stays an nn.Conv2d that transform keeps after its first call
    too: no warning to run it first (its stride and filter size are known before)."""
    model = nn.Sequential(
        nn.LazyConv2d(64, 7, stride=2, padding=3),
        nn.LazyConv2d(64, 3, padding=1),
        nn.Conv2d(64, 64, 3, padding=1, groups=8),  # (one taken: the others' reasons are debug)
    )
    with caplog.at_level(logging.DEBUG, logger="spio"):
        transform(model)
    kept = [r for r in caplog.records if "kept" in r.getMessage()]
    assert kept and all(r.levelname == "DEBUG" for r in kept)


def test_untransform_names_a_shard_before_a_subclass():
    """FSDP2's fully_shard on the layer itself makes it a subclass (FSDPConv2dGw8) with a
    sharded weight: the shard, whose mend untransform names, is the reason given."""

    class Sharded(Conv2dGw8):
        pass

    layer = Sharded(16, 16, 3, padding=1, groups=2)
    layer.weight = nn.Parameter(layer.weight.detach().flatten().clone())
    with pytest.raises(ValueError, match="a shard .*untransform the model before wrapping it"):
        spio_transform.untransform(nn.Sequential(layer))


def test_a_second_transform_is_no_warning(caplog):
    """The model runs spio already: the kept convs' reasons stay debug lines."""
    model = transform(
        nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.Conv2d(64, 64, 3, padding=1, groups=8)
        )
    )
    with caplog.at_level(logging.WARNING, logger="spio"):
        transform(model)
    assert caplog.records == []


def test_a_model_with_no_eligible_conv_is_a_warning_saying_why(caplog):
    """Nothing replaced had been an info line ("replaced 0 of 2") and the reasons debug lines:
    a newcomer with groups of 16 channels saw nothing at the default level."""
    model = nn.Sequential(
        nn.Conv2d(64, 64, 3, padding=1, groups=4), nn.Conv2d(64, 64, 3, padding=1, groups=4)
    )
    with caplog.at_level(logging.WARNING, logger="spio"):
        transform(model)
    (record,) = caplog.records
    assert record.getMessage() == (
        "spio.transform kept 2 nn.Conv2d: needs group width 8, got in_channels=64, groups=4"
    )
