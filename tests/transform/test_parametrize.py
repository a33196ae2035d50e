"""Convolutions parametrized with torch.nn.utils.parametrize (weight_norm, spectral_norm, one of
a user's own): transform replaces them keeping their parametrizations, untransform restores them,
and a Conv2dGw8 parametrized after transform goes back to a working nn.Conv2d (it had come back
with a weight on the meta device and computed garbage)."""

import copy
import logging

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from spio.layers import Conv2dGw8
from spio.transform import transform, untransform
from tests.conftest import spy_on_launches


class _Scaled(nn.Module):
    """A user's own parametrization: the tensor times a constant."""

    def forward(self, tensor):
        return 0.5 * tensor


def _model(seed=0):
    """Three eligible convolutions, parametrized three ways (weight_norm, spectral_norm, and a
    user's parametrization of the bias), and one left plain."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(16, 16, 3, padding=1, groups=2),
        nn.ReLU(),
        nn.Conv2d(16, 16, (3, 5), padding=(1, 2), groups=2, bias=False),
        nn.ReLU(),
        nn.Conv2d(16, 16, 1, groups=2),
        nn.Conv2d(16, 16, 3, padding=1, groups=2),
    ).double()
    parametrizations.weight_norm(model[0])
    parametrizations.spectral_norm(model[2])
    parametrize.register_parametrization(model[4], "bias", _Scaled())
    return model.eval()  # spectral_norm's power iteration runs only in training


def _outputs_and_grads(model, x):
    model.zero_grad()
    y = model(x)
    y.square().sum().backward()
    return y, {name: p.grad for name, p in model.named_parameters()}


def test_transform_replaces_parametrized_convs_keeping_their_parametrizations():
    model = _model()
    reference = copy.deepcopy(model)
    params = dict(model.named_parameters())
    keys = model.state_dict().keys()
    transform(model)

    for i in (0, 2, 4, 5):
        assert isinstance(model[i], Conv2dGw8), type(model[i])
        assert parametrize.type_before_parametrizations(model[i]) is Conv2dGw8
    assert type(model[5]) is Conv2dGw8  # the plain one
    assert parametrize.is_parametrized(model[0], "weight")
    assert parametrize.is_parametrized(model[4], "bias")
    assert not parametrize.is_parametrized(model[4], "weight")
    # The same Parameters (what an optimizer holds) and the same state_dict keys.
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[name] for name, p in model.named_parameters())
    assert model.state_dict().keys() == keys
    assert not any(t.is_meta for t in model.state_dict().values())

    x = torch.randn(2, 16, 7, 6, dtype=torch.float64, requires_grad=True)
    y, grads = _outputs_and_grads(model, x)
    y_ref, grads_ref = _outputs_and_grads(reference, x)
    torch.testing.assert_close(y, y_ref)
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], msg=name)


def test_untransform_restores_parametrized_convs():
    model = _model()
    reference = copy.deepcopy(model)
    untransform(transform(model))
    for i in (0, 2, 4, 5):
        assert parametrize.type_before_parametrizations(model[i]) is nn.Conv2d
    assert type(model[0]).__name__ == "ParametrizedConv2d"
    x = torch.randn(2, 16, 7, 6, dtype=torch.float64)
    torch.testing.assert_close(model(x), reference(x))
    assert model.state_dict().keys() == reference.state_dict().keys()


def test_a_conv2dgw8_parametrized_after_transform_untransforms_to_a_working_conv():
    """weight_norm put on a Conv2dGw8: untransform's nn.Conv2d had kept the meta-device weight
    its constructor made (the real one lives in parametrizations) and computed garbage."""
    torch.manual_seed(0)
    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=2).double()))
    parametrizations.weight_norm(model[0])
    x = torch.randn(2, 16, 7, 6, dtype=torch.float64)
    y = model(x)
    untransform(model)
    assert parametrize.type_before_parametrizations(model[0]) is nn.Conv2d
    assert "weight" not in model[0]._parameters
    assert not any(t.is_meta for t in model.state_dict().values())
    torch.testing.assert_close(model(x), y)


def test_parametrizations_still_come_and_go_on_the_replacement():
    """register_parametrization and remove_parametrizations work on a transformed conv as on the
    nn.Conv2d: removing the last one leaves a plain Conv2dGw8 holding the parametrized value."""
    model = transform(_model())
    parametrize.register_parametrization(model[0], "bias", _Scaled())
    x = torch.randn(1, 16, 5, 5, dtype=torch.float64)
    y = model(x)
    weight = model[0].weight.detach().clone()
    parametrize.remove_parametrizations(model[0], "weight")
    parametrize.remove_parametrizations(model[0], "bias")
    assert type(model[0]) is Conv2dGw8
    assert isinstance(model[0]._parameters["weight"], nn.Parameter)
    torch.testing.assert_close(model[0].weight.detach(), weight)
    torch.testing.assert_close(model(x), y)


def test_the_deprecated_weight_norm_is_still_left_alone_saying_why(caplog):
    """torch.nn.utils.weight_norm (a forward pre-hook setting a plain tensor) is not replaced;
    transform warns (it had said so only in a debug line), naming the mend."""
    conv = torch.nn.utils.weight_norm(nn.Conv2d(16, 16, 3, groups=2))
    assert not Conv2dGw8.match(conv)
    with pytest.raises(ValueError, match="neither a Parameter nor parametrized"):
        Conv2dGw8.from_torch_module(conv)
    model = nn.Sequential(conv)
    with caplog.at_level(logging.WARNING, logger="spio"):
        assert transform(model)[0] is conv
    assert "kept 1 nn.Conv2d: has a weight that is neither a Parameter" in caplog.text
    assert "use torch.nn.utils.parametrizations.weight_norm" in caplog.text


def test_untransform_refuses_the_deprecated_weight_norm_put_on_a_conv2dgw8():
    """untransform's nn.Conv2d cannot share a weight that is a plain tensor: a ValueError naming
    the layer and the mend, the model as it was (it had been a TypeError from nn.Module)."""
    model = transform(nn.Sequential(nn.Conv2d(16, 16, 3, groups=2)))
    torch.nn.utils.weight_norm(model[0])
    with pytest.raises(ValueError, match=r"1 Conv2dGw8 layers .*: '0' .*weight_norm \(remove it"):
        untransform(model)
    assert isinstance(model[0], Conv2dGw8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_emulated_kernels_run_the_parametrized_weights(monkeypatch, dtype):
    """With SPIO_EMULATE=1 the kernels run all three passes of a weight-normed layer, with the
    weight computed from its parametrization, and match float64 PyTorch."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    launched = spy_on_launches(monkeypatch)
    reference = _model()[:1]
    model = transform(copy.deepcopy(reference).to(dtype))
    x = torch.randn(2, 16, 7, 6, generator=torch.Generator().manual_seed(1))
    x = x.to(dtype).to(memory_format=torch.channels_last)
    y = model(x)
    y.float().square().sum().backward()
    # FProp and WGrad (and maybe WGrad's partial-sum kernel); no DGrad: x needs no gradient.
    assert {"conv2d_gw8_fprop", "conv2d_gw8_wgrad"} <= set(launched), launched
    assert "conv2d_gw8_dgrad" not in launched, launched

    y_ref = reference(x.double())
    y_ref.square().sum().backward()
    eps = torch.finfo(dtype).eps
    scale = y_ref.abs().max().item()
    torch.testing.assert_close(y.double(), y_ref, atol=8 * eps * scale, rtol=8 * eps)
    for (name, p), (_, p_ref) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        g_scale = p_ref.grad.abs().max().item()
        torch.testing.assert_close(
            p.grad.double(), p_ref.grad, atol=16 * eps * g_scale, rtol=16 * eps, msg=name
        )


def test_a_compiled_parametrized_model_matches_eager():
    """torch.compile(fullgraph=True) traces the parametrization's property on the class transform
    built (as it traces torch's own), the weight computed inside the graph."""
    model = transform(_model())
    x = torch.randn(2, 16, 7, 6, dtype=torch.float64, requires_grad=True)
    y, grads = _outputs_and_grads(model, x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    model.zero_grad()
    y_compiled = compiled(x)
    y_compiled.square().sum().backward()
    grads_compiled = {name: p.grad for name, p in model.named_parameters()}
    torch.testing.assert_close(y_compiled, y)
    for name in grads:
        torch.testing.assert_close(grads_compiled[name], grads[name], msg=name)
