"""Per-pass choice (`passes`): each pass runs spio's kernels or PyTorch's convolution as asked, in
the custom ops, the eager path and Conv2dGw8, with the same values either way."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import spio.functional
from spio.functional import _kernels
from spio.functional._kernels import ALL_PASSES, DGRAD, FPROP, WGRAD, pass_mask, pass_names
from spio.functional.conv2d_gw8_op import conv2d_gw8, conv2d_gw8_backward
from spio.kernels import Conv2dGw8Params
from spio.layers import Conv2dGw8
from spio.reference import (
    Tolerance,
    conv2d_gw8_bias_grad_ref,
    conv2d_gw8_dgrad_ref,
    conv2d_gw8_fprop_ref,
    conv2d_gw8_tolerance,
    conv2d_gw8_wgrad_ref,
)


def test_pass_names_and_bits():
    assert pass_mask(("fprop", "wgrad")) == FPROP | WGRAD
    assert pass_mask("dgrad") == DGRAD
    assert pass_names(ALL_PASSES) == ("fprop", "dgrad", "wgrad")
    assert pass_names(0) == ()
    with pytest.raises(ValueError, match=r"passes must be among .* got \['bgrad'\]"):
        pass_mask(("fprop", "bgrad"))
    assert pass_mask(FPROP | DGRAD) == FPROP | DGRAD  # the op's form, e.g. spio_passes = 3
    with pytest.raises(ValueError, match=r"passes in 0\.\.7"):
        pass_mask(8)
    module = Conv2dGw8(16, 16, 3, groups=2)
    module.spio_passes = 5
    assert module.spio_passes == ("fprop", "wgrad")


@pytest.fixture
def spied(monkeypatch):
    """SPIO_EMULATE=1, and a record of which spio kernels (Layer methods) each call ran."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    ran = []
    for name in ("fprop", "dgrad", "wgrad"):
        original = getattr(_kernels.Layer, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            ran.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(_kernels.Layer, name, spy)
    return ran


def _layer_tensors(dtype=torch.float16):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 16, 6, 7, generator=gen).to(dtype).to(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3, generator=gen).to(dtype)
    b = torch.randn(16, generator=gen)
    dy = torch.randn(2, 16, 6, 7, generator=gen).to(dtype).to(memory_format=torch.channels_last)
    return x, w, b, dy


def _check(passes, x, w, b, dy, y, dx, dw, db):
    """spio's passes against the float64 reference, at the kernels' tolerance; PyTorch's against
    PyTorch's own autograd of F.conv2d on the same tensors (PyTorch's CPU fp16 convolution rounds
    more than spio's fp32 accumulation, so the reference's tolerance does not apply to it)."""
    params = Conv2dGw8Params.from_tensors(x, w, b, padding=(1, 1))
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b.to(x.dtype))]
    torch_y = F.conv2d(*leaves, padding=1, groups=2)
    torch_y.backward(dy)
    torch_dx, torch_dw, torch_db = (t.grad for t in leaves)
    if passes & FPROP:
        want = conv2d_gw8_fprop_ref(x, w, b, (1, 1))
        conv2d_gw8_tolerance(params, "fprop", x, w).assert_close(y, want)
    elif b.dtype == torch.float32:  # PyTorch's convolution, the fp32 bias added in fp32
        unbiased = F.conv2d(x, w, None, padding=1, groups=2)
        torch.testing.assert_close(y, (unbiased.float() + b.view(-1, 1, 1)).to(x.dtype))
    else:
        torch.testing.assert_close(y, torch_y)
    if passes & DGRAD:
        want_dx = conv2d_gw8_dgrad_ref(dy, w, (1, 1), tuple(x.shape[-2:]))
        conv2d_gw8_tolerance(params, "dgrad", dy, w).assert_close(dx, want_dx)
    else:
        torch.testing.assert_close(dx, torch_dx)
    if passes & WGRAD:
        tol = conv2d_gw8_tolerance(params, "wgrad", x, dy)  # plus dw's rounding to fp16
        Tolerance(tol.atol, tol.rtol + torch.finfo(w.dtype).eps).assert_close(
            dw, conv2d_gw8_wgrad_ref(x, dy, (1, 1), 3, 3)
        )
    else:
        torch.testing.assert_close(dw, torch_dw)
    # The bias gradient: from spio's WGrad pass, or a sum over dy; in the bias's dtype.
    tol = conv2d_gw8_tolerance(params, "wgrad", dy, torch.ones(1))
    Tolerance(tol.atol, tol.rtol + torch.finfo(db.dtype).eps).assert_close(
        db.float(), conv2d_gw8_bias_grad_ref(dy)
    )


@pytest.mark.parametrize("passes", [FPROP | DGRAD, WGRAD, 0])
def test_op_runs_spio_for_the_passes_asked_and_pytorch_for_the_others(spied, passes):
    x, w, b, dy = _layer_tensors()
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = conv2d_gw8(*leaves, 1, 1, 1, 1, 1, passes)
    y.backward(dy)
    assert sorted(spied) == sorted(pass_names(passes))
    _check(passes, x, w, b, dy, y, *(t.grad for t in leaves))
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert leaves[0].grad.is_contiguous(memory_format=torch.channels_last)
    assert leaves[1].grad.dtype == torch.float16 and leaves[2].grad.dtype == torch.float32


@pytest.mark.parametrize("passes", [("fprop", "wgrad"), ("dgrad",)])
def test_module_eager_path_follows_spio_passes(spied, passes):
    x, w, b, dy = _layer_tensors()
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).half()
    with torch.no_grad():
        conv.weight.copy_(w)
        conv.bias.copy_(b.half())
    module = Conv2dGw8.from_torch_module(conv, passes)
    assert module.spio_passes == passes and f"spio_passes={passes}" in repr(module)
    xg = x.clone().requires_grad_()
    y = module(xg)
    y.backward(dy)
    assert sorted(spied) == sorted(passes)
    grads = (xg.grad, module.weight.grad, module.bias.grad)
    _check(pass_mask(passes), x, w, b.half(), dy, y, *grads)  # the module holds a half bias


def test_input_gradient_alone_from_pytorch(spied):
    """Without a weight gradient the eager path keeps no input; PyTorch's DGrad still gets one."""
    x, w, _, dy = _layer_tensors()
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2, bias=False).half().requires_grad_(False)
    with torch.no_grad():
        conv.weight.copy_(w)
    module = Conv2dGw8.from_torch_module(conv, ("fprop",))
    xg = x.clone().requires_grad_()
    module(xg).backward(dy)
    assert spied == ["fprop"]
    _, torch_dx = torch.autograd.functional.vjp(
        lambda t: F.conv2d(t, w, padding=1, groups=2), x, dy
    )
    torch.testing.assert_close(xg.grad, torch_dx)
    assert xg.grad.is_contiguous(memory_format=torch.channels_last)


def test_backward_op_honours_passes(spied):
    x, w, _, dy = _layer_tensors()
    dx, dw, db = conv2d_gw8_backward(dy, x, w, 1, 1, [True, True, True], DGRAD)
    assert spied == ["dgrad"]
    assert dx.dtype == torch.float16 and dw.dtype == torch.float32 and db.dtype == torch.float32
    spio_dx, _, spio_db = conv2d_gw8_backward(dy, x, w, 1, 1, [True, True, True])
    torch.testing.assert_close(dx, spio_dx)  # both spio's DGrad
    _, torch_dw, _ = torch.ops.aten.convolution_backward(
        dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 2, [False, True, False]
    )
    torch.testing.assert_close(dw, torch_dw.float())  # PyTorch's, widened to fp32
    params = Conv2dGw8Params.from_tensors(x, w, None, padding=(1, 1))
    bias_tol = conv2d_gw8_tolerance(params, "wgrad", dy, torch.ones(1))
    bias_tol.assert_close(db, spio_db)  # a sum over dy against spio's WGrad pass


@pytest.mark.parametrize(
    "mask", [[True, False, False], [False, True, False], [False, False, True], [False, True, True]]
)
def test_backward_op_runs_the_kernels_of_the_gradients_asked_for_only(spied, mask):
    """DGrad for the input's gradient, WGrad for the weight's (and the bias's with it); a bias
    gradient alone is a sum over dy."""
    x, w, _, dy = _layer_tensors()
    grads = conv2d_gw8_backward(dy, x, w, 1, 1, mask)
    assert spied == [name for name, need in zip(("dgrad", "wgrad"), mask, strict=False) if need]
    assert [g.numel() > 0 for g in grads] == mask


def test_double_backward_runs_the_kernels_of_the_gradients_asked_for_only(spied):
    """The gradient of dx for the weight is one WGrad; that of dw for the input one DGrad."""
    x, w, _, dy = _layer_tensors()
    wg = w.clone().requires_grad_()
    dx = conv2d_gw8_backward(dy, x, wg, 1, 1, [True, False, False])[0]
    g = torch.randn_like(dx)
    (g_w,) = torch.autograd.grad(dx, wg, g)
    assert spied == ["dgrad", "wgrad"]
    spied.clear()
    xg = x.clone().requires_grad_()
    dw = conv2d_gw8_backward(dy, xg, w, 1, 1, [False, True, False])[1]
    (g_x,) = torch.autograd.grad(dw, xg, torch.ones_like(dw))
    assert spied == ["wgrad", "dgrad"]
    # <g, dx> = <w, WGrad(g, dy)> and <1, dw> = <x, DGrad(dy, 1)>.
    params = Conv2dGw8Params.from_tensors(x, w, None, padding=(1, 1))
    tol = conv2d_gw8_tolerance(params, "wgrad", g, dy)
    Tolerance(tol.atol, tol.rtol + torch.finfo(w.dtype).eps).assert_close(
        g_w, conv2d_gw8_wgrad_ref(g, dy, (1, 1), 3, 3)
    )
    ones = torch.ones_like(w)
    conv2d_gw8_tolerance(params, "dgrad", dy, ones).assert_close(
        g_x, conv2d_gw8_dgrad_ref(dy, ones, (1, 1), tuple(x.shape[-2:]))
    )


def test_opcheck_with_passes():
    x = torch.randn(2, 16, 6, 7)
    w = torch.randn(16, 8, 3, 3, requires_grad=True)
    torch.library.opcheck(conv2d_gw8, (x, w, None, 1, 1, 1, 1, 1, FPROP | WGRAD))
    dy = torch.randn(2, 16, 6, 7)
    torch.library.opcheck(conv2d_gw8_backward, (dy, x, w.detach(), 1, 1, [True, True, False], 0))


@pytest.mark.parametrize("passes", [8, -1])
def test_bad_passes_raise_value_error(passes, monkeypatch):
    x, w = torch.randn(1, 8, 4, 4), torch.randn(8, 8, 3, 3)
    with pytest.raises(ValueError, match=r"passes in 0\.\.7 \(bits fprop=1, dgrad=2, wgrad=4\)"):
        conv2d_gw8(x, w, None, 1, 1, 1, 1, 1, passes)
    # spio.functional's eager path (kernels in the emulator, or on a GPU) checks them too.
    monkeypatch.setenv("SPIO_EMULATE", "1")
    with pytest.raises(ValueError, match=r"passes in 0\.\.7 \(bits fprop=1, dgrad=2, wgrad=4\)"):
        spio.functional.conv2d_gw8(x.half(), w.half(), None, 1, 1, 1, 1, 1, passes)
    with pytest.raises(ValueError, match=r"passes in 0\.\.7"):
        conv2d_gw8_backward(x, x, w, 1, 1, [True, True, True], passes)


def test_compiled_module_with_spio_passes_matches_eager():
    """torch.compile(fullgraph=True) takes the op with the module's passes, without a break."""
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2).double()
    module = Conv2dGw8.from_torch_module(conv, ("fprop", "dgrad"))
    x = torch.randn(2, 16, 6, 7, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    y = compiled(x)
    y.sum().backward()
    got = (y.detach(), x.grad.clone(), conv.weight.grad.clone())
    x.grad = None
    conv.weight.grad = None
    want_y = module(x)
    want_y.sum().backward()
    for a, b in zip(got, (want_y.detach(), x.grad, conv.weight.grad), strict=True):
        torch.testing.assert_close(a, b)


def test_compiled_module_passes_its_spio_passes_to_the_op(spied):
    """Under torch.compile the module calls the custom op with its passes: with the kernels
    emulated, only the passes asked run spio's kernels (the CPU test above cannot tell)."""
    x, w, _, dy = _layer_tensors()
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=2, bias=False).half()
    with torch.no_grad():
        conv.weight.copy_(w)
    module = Conv2dGw8.from_torch_module(conv, ("fprop", "dgrad"))
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    xg = x.clone().requires_grad_()
    compiled(xg).backward(dy)
    assert sorted(spied) == ["dgrad", "fprop"]
    assert module.weight.grad is not None and xg.grad is not None


def test_the_public_backward_op_shows_its_own_docstring_and_signature():
    """help() and IDEs read spio.functional.conv2d_gw8_backward's docstring and parameters, not
    torch's generic CustomOpDef text and (*args, **kwargs)."""
    import inspect
    import pydoc

    import spio.functional

    op = spio.functional.conv2d_gw8_backward
    assert list(inspect.signature(op).parameters)[:6] == [
        "grad_output",
        "input",
        "weight",
        "padding_y",
        "padding_x",
        "output_mask",
    ]
    text = pydoc.render_doc(op, renderer=pydoc.plaintext)
    assert "computing only where output_mask is True" in text
    assert "CustomOpDef is a wrapper" not in text


def test_the_dtype_errors_hint_fits_the_dtype_and_the_region(monkeypatch):
    """float64 outside autocast was told to try torch.autocast (which leaves it as it is), and
    fp32 reaching the backward op (which autocast does not cast) was told of float64."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    x, w, dy = torch.randn(2, 16, 5, 6), torch.randn(16, 8, 3, 3), torch.randn(2, 16, 5, 6)
    with pytest.raises(ValueError, match="autocast leaves float64 tensors as they are"):
        conv2d_gw8(x.double(), w.double(), None, 1, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ValueError, match="autocast does not cast this op's operands.*float32"):
            conv2d_gw8_backward(dy, x, w, 1, 1, [True, True, False])
    with pytest.raises(ValueError, match=r"\(or torch.autocast\), got torch.float32"):
        conv2d_gw8(x, w, None, 1, 1)
