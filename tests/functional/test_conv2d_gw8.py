"""spio::conv2d_gw8 custom ops on CPU: values, gradients, opcheck, compile, autocast, bad inputs."""

import random
import re

import pytest
import torch
import torch.nn.functional as F

from spio.functional import conv2d_gw8 as public_conv2d_gw8
from spio.functional.conv2d_gw8_op import conv2d_gw8, conv2d_gw8_backward
from spio.kernels import Conv2dGw8Params
from spio.reference import (
    Tolerance,
    conv2d_gw8_bias_grad_ref,
    conv2d_gw8_dgrad_ref,
    conv2d_gw8_fprop_ref,
    conv2d_gw8_tolerance,
    conv2d_gw8_wgrad_ref,
)
from tests.conftest import spy_on_launches, without_tensor_copies

# (n, c, h, w, r, s, pad_y, pad_x)
SHAPES = [
    (2, 16, 6, 7, 3, 3, 1, 1),
    (1, 8, 5, 9, 1, 5, 0, 2),
    (3, 24, 4, 4, 5, 1, 2, 0),
    (2, 8, 3, 3, 3, 3, 0, 0),
]


def _tensors(shape, dtype=torch.float64, bias=True, seed=0, channels_last=False):
    n, c, h, w, r, s, _, _ = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64).to(dtype)
    wt = torch.randn(c, 8, r, s, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(c, generator=gen, dtype=torch.float64).to(dtype) if bias else None
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x, wt, b


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_forward_and_backward_match_reference(shape, channels_last):
    x, w, b = _tensors(shape, channels_last=channels_last)
    pad = shape[6:]
    x.requires_grad_(True)
    w.requires_grad_(True)
    b.requires_grad_(True)
    y = conv2d_gw8(x, w, b, padding_y=pad[0], padding_x=pad[1])
    assert y.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    torch.testing.assert_close(y, conv2d_gw8_fprop_ref(x.detach(), w.detach(), b.detach(), pad))
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(x.grad, conv2d_gw8_dgrad_ref(dy, w.detach(), pad, shape[2:4]))
    torch.testing.assert_close(
        w.grad, conv2d_gw8_wgrad_ref(x.detach(), dy, pad, shape[4], shape[5])
    )
    torch.testing.assert_close(b.grad, conv2d_gw8_bias_grad_ref(dy))
    if channels_last:
        assert x.grad.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_cpu_path_matches_conv2d(dtype):
    x, w, b = _tensors(SHAPES[0], dtype=dtype)
    y = conv2d_gw8(x, w, b, padding_y=1, padding_x=1)
    assert y.dtype == dtype
    expected = F.conv2d(x, w, b, padding=1, groups=2)
    torch.testing.assert_close(y, expected)


def test_fp32_bias_with_half_input():
    x, w, _ = _tensors(SHAPES[0], dtype=torch.bfloat16, bias=False)
    b = torch.randn(16)
    y = conv2d_gw8(x, w, b, padding_y=1, padding_x=1)
    assert y.dtype == torch.bfloat16
    conv = F.conv2d(x.double(), w.double(), None, padding=1, groups=2)
    expected = conv + b.double().view(-1, 1, 1)
    # Rounded twice (the convolution, then the sum), each by half a bf16 ulp at most.
    half_ulp = 2.0**-8
    atol = half_ulp * conv.abs().max().item()
    torch.testing.assert_close(y.double(), expected, rtol=half_ulp, atol=atol)


@pytest.mark.parametrize("op", [conv2d_gw8, public_conv2d_gw8])
def test_an_fp32_bias_beside_half_operands_is_added_in_fp32_without_the_kernels(op, monkeypatch):
    """Where PyTorch's convolution runs the op (CPU tensors without SPIO_EMULATE; passes
    without FPROP), an fp32 bias had been rounded to half before it was added: 1000.2 became
    1000.0, and 1000.2 + 0.1 gave 1000.0 where the kernels (and float64) give 1000.5."""
    monkeypatch.delenv("SPIO_EMULATE", raising=False)
    x = torch.ones(1, 8, 3, 3, dtype=torch.float16)
    w = torch.zeros(8, 8, 3, 3, dtype=torch.float16)
    w[:, 0, 1, 1] = 0.1  # each output: 0.1 (as a half) from the centre tap
    b = torch.full((8,), 1000.2)
    y = op(x, w, b, padding_y=1, padding_x=1)
    expected = F.conv2d(x.double(), w.double(), b.double(), padding=1).half()
    assert y.dtype == torch.float16 and torch.equal(y, expected), (y.unique(), expected.unique())
    assert expected.unique().tolist() == [1000.5]


def test_fx_symbolic_trace_records_the_function_as_one_call():
    """FX tools (feature extraction, quantize_fx) on a model calling conv2d_gw8: its Proxy had
    reached the type checks ("needs input to be a tensor, got Proxy"); now one call_function
    node, as F.conv2d gets, and the traced module computes what the model does."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 8, 3, 3, dtype=torch.float64))

        def forward(self, x):
            return public_conv2d_gw8(x, self.w, None, padding_y=1, padding_x=1)

    model = Model()
    traced = torch.fx.symbolic_trace(model)
    calls = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert calls == [public_conv2d_gw8]
    x = torch.randn(2, 16, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("groups", [1, 3])
def test_groups_argument_is_implied_or_checked(groups):
    x, w, _ = _tensors(SHAPES[2], bias=False)
    y = conv2d_gw8(x, w, None, 1, 2, 0, 1, groups)
    torch.testing.assert_close(y, F.conv2d(x, w, padding=(2, 0), groups=3))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "requires_grad", [(True, True, True), (False, True, True), (True, False, False)]
)
@pytest.mark.parametrize(
    "check, shape, seed",
    [
        (torch.autograd.gradcheck, (1, 8, 3, 4, 2, 3, 1, 0), 0),
        # Double backward (e.g. a gradient penalty), through the backward op's autograd formula.
        (torch.autograd.gradgradcheck, (2, 16, 4, 5, 3, 2, 1, 0), 4),
    ],
    ids=["gradcheck", "gradgradcheck"],
)
def test_gradcheck(check, shape, seed, bias, requires_grad):
    x, w, b = _tensors(shape, bias=bias, seed=seed)
    x.requires_grad_(requires_grad[0])
    w.requires_grad_(requires_grad[1])
    if b is not None:
        b.requires_grad_(requires_grad[2])
    assert check(lambda x, w, b: conv2d_gw8(x, w, b, padding_y=1, padding_x=0), (x, w, b))


def _count_op_calls(monkeypatch) -> list:
    """A list that gets an entry for each call of either op's implementation (each checks its
    passes first)."""
    from spio.functional import conv2d_gw8_op

    calls = []
    check_passes = conv2d_gw8_op.check_passes

    def counting(passes):
        calls.append(passes)
        return check_passes(passes)

    monkeypatch.setattr(conv2d_gw8_op, "check_passes", counting)
    return calls


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_vmap_has_a_batching_rule(monkeypatch, emulate):
    """torch.vmap over inputs is one call, the vmapped dim folded into the images; over weights (a
    vmapped ensemble) or both, one call per slice. PyTorch's fallback would make one call per
    slice in every case (and warn)."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    calls = _count_op_calls(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 16, 5, 4, generator=gen).half()
    ws = torch.randn(3, 16, 8, 3, 3, generator=gen).half()
    b = torch.randn(16, generator=gen)
    bs = torch.randn(3, 16, generator=gen)

    def f(x, w, b):
        return conv2d_gw8(x, w, b, padding_y=1, padding_x=1)

    cases = [((0, None, None), (x, ws[0], b), 1), ((None, 0, None), (x[0], ws, b), 3),
             ((0, 0, None), (x, ws, b), 3), ((0, None, 0), (x, ws[0], bs), 3)]  # fmt: skip
    for in_dims, args, expected_calls in cases:
        calls.clear()
        y = torch.vmap(f, in_dims=in_dims)(*args)
        assert len(calls) == expected_calls, in_dims
        pick = [(lambda t, i: t) if d is None else (lambda t, i: t[i]) for d in in_dims]
        want = torch.stack([f(*(p(t, i) for p, t in zip(pick, args, strict=True)))
                            for i in range(3)])  # fmt: skip
        torch.testing.assert_close(y, want)
        # Over a dimension of size 0: no slice, with one slice's shape and layout.
        none, one = (torch.vmap(f, in_dims=in_dims)(*(t if d is None else t.narrow(d, 0, size)
                                                      for t, d in zip(args, in_dims, strict=True)))
                     for size in (0, 1))  # fmt: skip
        assert (none.shape[1:], none.stride()[1:]) == (one.shape[1:], one.stride()[1:])
    with pytest.raises(ValueError, match="as many output as input channels"):
        torch.vmap(f, in_dims=(None, 0, None))(x[0], torch.randn(0, 24, 8, 3, 3).half(), b)


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_vmap_over_the_backward_has_a_batching_rule(monkeypatch, emulate, capfd):
    """torch.vmap over conv2d_gw8_backward (autograd.grad(is_grads_batched=True), a vectorized
    jacobian): grad_input alone of batched grad_outputs is one call; weight and bias gradients,
    or a batched weight, one call per slice. Without a rule PyTorch's fallback made one call per
    slice and warned of "a performance drop because we have not yet implemented the batching
    rule for spio::conv2d_gw8_backward", asking the user to file an issue with PyTorch."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    calls = _count_op_calls(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    dys = torch.randn(3, 2, 16, 5, 4, generator=gen).half()
    xs = torch.randn(3, 2, 16, 5, 4, generator=gen).half()
    ws = torch.randn(3, 16, 8, 3, 3, generator=gen).half()
    dx_only, all_three = [True, False, False], [True, True, True]
    cases = [  # in_dims of (dy, x, w), the operands, the mask, the calls expected
        ((0, None, None), (dys, xs[0], ws[0]), dx_only, 1),
        ((1, 0, None), (dys.transpose(0, 1), xs, ws[0]), dx_only, 1),
        ((None, 0, None), (dys[0], xs, ws[0]), dx_only, 1),
        ((0, None, None), (dys, xs[0], ws[0]), all_three, 3),
        ((0, 0, None), (dys, xs, ws[0]), [False, True, False], 3),
        ((0, None, 0), (dys, xs[0], ws), dx_only, 3),
    ]
    for in_dims, args, mask, expected_calls in cases:
        calls.clear()
        got = torch.vmap(
            lambda dy, x, w, mask=mask: conv2d_gw8_backward(dy, x, w, 1, 1, mask), in_dims=in_dims
        )(*args)
        assert len(calls) == expected_calls, in_dims
        for i in range(3):
            one = [t if d is None else t.select(d, i) for t, d in zip(args, in_dims, strict=True)]
            want = conv2d_gw8_backward(*one, 1, 1, mask)
            for g, w, wanted in zip(got, want, mask, strict=True):
                if wanted:
                    torch.testing.assert_close(g[i], w)
                else:
                    assert g.numel() == 0
    assert "batching rule" not in capfd.readouterr().err  # (PyTorch's C++ warning: stderr)
    # A vmapped dimension of size 0: the gradients of no slice, in the shapes, dtypes and
    # layouts of one (channels_last slices too), and one slice's argument checks.
    dys_cl, xs_cl = (
        t.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3) for t in (dys, xs)
    )
    cases += [((0, 0, None), (dys_cl, xs_cl, ws[0]), m, 0) for m in (dx_only, all_three)]
    for in_dims, args, mask, _ in cases:

        def f(dy, x, w, mask=mask):
            return conv2d_gw8_backward(dy, x, w, 1, 1, mask)

        def first(size, args=args, in_dims=in_dims):
            pairs = zip(args, in_dims, strict=True)
            return [t if d is None else t.narrow(d, 0, size) for t, d in pairs]

        none, one = (torch.vmap(f, in_dims=in_dims)(*first(size)) for size in (0, 1))
        for g, w in zip(none, one, strict=True):
            assert g.shape[0] == 0 and g.dtype == w.dtype
            assert (g.shape[1:], g.stride()[1:]) == (w.shape[1:], w.stride()[1:])
    with pytest.raises(ValueError, match="needs grad_output of shape"):
        torch.vmap(lambda dy: conv2d_gw8_backward(dy, xs[0], ws[0], 2, 2, dx_only))(dys[:0])


@pytest.mark.parametrize(
    "shape, bias, requires_grad, channels_last",
    [
        (SHAPES[0], True, (True, True, True), False),
        (SHAPES[1], False, (True, False, False), True),
        (SHAPES[2], True, (False, True, False), False),
        (SHAPES[3], False, (False, False, False), True),
    ],
)
def test_opcheck_forward(shape, bias, requires_grad, channels_last):
    x, w, b = _tensors(shape, dtype=torch.float32, bias=bias, channels_last=channels_last)
    for t, flag in zip((x, w, b), requires_grad, strict=True):
        if t is not None:
            t.requires_grad_(flag)
    torch.library.opcheck(conv2d_gw8, (x, w, b), dict(padding_y=shape[6], padding_x=shape[7]))


@pytest.mark.parametrize(
    "mask", [[True, True, True], [True, False, False], [False, True, False], [False, False, True]]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # unrequested dx: bf16
def test_opcheck_backward(mask, dtype):
    shape = SHAPES[1]
    x, w, _ = _tensors(shape, dtype=dtype, bias=False, channels_last=True)
    y = conv2d_gw8(x, w, None, padding_y=shape[6], padding_x=shape[7])
    dy = torch.randn_like(y)
    # The backward op has an autograd formula of its own (double backward): opcheck checks its
    # registration with inputs that require grad.
    for t in (dy, x, w):
        t.requires_grad_(True)
    torch.library.opcheck(conv2d_gw8_backward, (dy, x, w, shape[6], shape[7], mask))


@pytest.mark.parametrize("weights_cl", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_opcheck_on_the_kernels(monkeypatch, dtype, weights_cl):
    """opcheck of both ops where they run spio's kernels (the emulator, as on a GPU), not
    PyTorch's reference: NHWC input, bias, every input requiring grad; with a contiguous and a
    channels_last weight (opcheck compares the fake functions' strides with the real ones; the
    op gives dw the weight's strides, which it would by a copy if the kernels did not: whether
    they do is tests/functional/test_kernels.py's), and the forward op once more under autocast
    (which casts the fp32 operands in their layouts)."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    launched = spy_on_launches(monkeypatch)
    shape = SHAPES[1]
    x, w, b = _tensors(shape, dtype=dtype, bias=True, channels_last=True)
    if weights_cl:
        w = w.to(memory_format=torch.channels_last)
        assert not w.is_contiguous()
    for t in (x, w, b):
        t.requires_grad_(True)
    pads = dict(padding_y=shape[6], padding_x=shape[7])
    torch.library.opcheck(conv2d_gw8, (x, w, b), pads)
    dy = torch.randn(conv2d_gw8(x, w, b, **pads).shape).to(dtype).requires_grad_(True)
    mask = [True, True, True]
    torch.library.opcheck(conv2d_gw8_backward, (dy, x, w, shape[6], shape[7], mask))
    _, dw, _ = conv2d_gw8_backward(dy.detach(), x.detach(), w.detach(), *pads.values(), mask)
    assert dw.stride() == w.stride()
    assert {"conv2d_gw8_fprop", "conv2d_gw8_dgrad", "conv2d_gw8_wgrad"} <= set(launched)
    if dtype == torch.bfloat16:  # (CPU autocast's dtype)
        x32, w32, b32 = (t.detach().float().requires_grad_(True) for t in (x, w, b))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.library.opcheck(conv2d_gw8, (x32, w32, b32), pads)


def test_backward_op_computes_only_masked_gradients():
    x, w, _ = _tensors(SHAPES[0], bias=False)
    dy = torch.randn(2, 16, 6, 7, dtype=torch.float64)
    dx, dw, db = conv2d_gw8_backward(dy, x, w, 1, 1, [False, True, False])
    assert dx.numel() == 0 and db.numel() == 0
    torch.testing.assert_close(dw, conv2d_gw8_wgrad_ref(x, dy, 1, 3, 3))
    dx, dw, db = conv2d_gw8_backward(dy, x, w, 1, 1, [True, False, True])
    assert dw.numel() == 0
    torch.testing.assert_close(dx, conv2d_gw8_dgrad_ref(dy, w, 1, (6, 7)))
    torch.testing.assert_close(db, conv2d_gw8_bias_grad_ref(dy))


def test_weight_and_bias_grads_are_fp32_from_half_backward_op():
    x, w, _ = _tensors(SHAPES[0], dtype=torch.bfloat16, bias=False)
    dy = torch.randn(2, 16, 6, 7).to(torch.bfloat16)
    dx, dw, db = conv2d_gw8_backward(dy, x, w, 1, 1, [True, True, True])
    assert (dx.dtype, dw.dtype, db.dtype) == (torch.bfloat16, torch.float32, torch.float32)


def test_only_input_grad_needed_keeps_input_memory_format():
    leaf, w, _ = _tensors(SHAPES[0], bias=False, channels_last=True)
    leaf.requires_grad_(True)
    x = leaf.clone()  # not a leaf: AccumulateGrad cannot fix the gradient's layout
    seen = []
    x.register_hook(seen.append)
    y = conv2d_gw8(x, w, None, padding_y=1, padding_x=1)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert w.grad is None
    torch.testing.assert_close(seen[0], conv2d_gw8_dgrad_ref(dy, w, 1, (6, 7)))
    assert seen[0].is_contiguous(memory_format=torch.channels_last)


def test_weight_grad_keeps_a_channels_last_weights_layout():
    """As the fake impl promises: opcheck compares the two."""
    x, w, _ = _tensors(SHAPES[0], bias=False)
    w = w.to(memory_format=torch.channels_last)
    dy = torch.randn(2, 16, 6, 7, dtype=torch.float64)
    _, dw, _ = conv2d_gw8_backward(dy, x, w, 1, 1, [False, True, False])
    assert dw.is_contiguous(memory_format=torch.channels_last) and not dw.is_contiguous()
    torch.testing.assert_close(dw, conv2d_gw8_wgrad_ref(x, dy, 1, 3, 3))
    torch.library.opcheck(conv2d_gw8_backward, (dy, x, w, 1, 1, [False, True, False]))


@pytest.mark.parametrize("passes", [7, 3, 0])
@pytest.mark.parametrize("weight_cl", [False, True], ids=["w_nchw", "w_nhwc"])
def test_the_plain_call_and_the_op_give_the_weight_grad_one_layout(monkeypatch, passes, weight_cl):
    """The plain call's backward (its eager path) and the op's give dw in the weight's layout,
    also where PyTorch computes it (passes without WGrad), whose dw had followed the input's
    layout in the plain call alone (a fuzzer's find; the values were equal)."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    torch.manual_seed(0)
    fmt = torch.contiguous_format if weight_cl else torch.channels_last  # x the other way
    x = torch.randn(2, 16, 5, 6, dtype=torch.half).contiguous(memory_format=fmt)
    w = torch.randn(16, 8, 3, 3, dtype=torch.half)
    if weight_cl:
        w = w.contiguous(memory_format=torch.channels_last)
    w.requires_grad_()
    dy = torch.randn(2, 16, 5, 6, dtype=torch.half)
    (plain,) = torch.autograd.grad(public_conv2d_gw8(x, w, None, 1, 1, 1, passes=passes), w, dy)
    (op,) = torch.autograd.grad(conv2d_gw8(x, w, None, 1, 1, 1, 1, 1, passes), w, dy)
    assert plain.stride() == op.stride() == w.stride()
    assert torch.equal(plain, op)


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_without_a_weight_grad_the_input_is_not_kept_for_backward(monkeypatch, emulate):
    """Only the weight gradient reads the input: with a frozen weight its memory is freed after
    the forward, and the input gradient is still right."""
    import weakref

    monkeypatch.setenv("SPIO_EMULATE", emulate)
    dtype = torch.float16 if emulate == "1" else torch.float64
    x, w, _ = _tensors(SHAPES[0], dtype=dtype, bias=False, channels_last=True)
    leaf = x.requires_grad_()
    xi = leaf.clone()
    kept = weakref.ref(xi)
    y = conv2d_gw8(xi, w, None, padding_y=1, padding_x=1)
    del xi
    assert kept() is None
    dy = torch.ones_like(y)
    y.backward(dy)
    params = Conv2dGw8Params.from_tensors(x.half(), w.half(), None, padding=(1, 1))
    want = conv2d_gw8_dgrad_ref(dy, w, 1, (6, 7))
    conv2d_gw8_tolerance(params, "dgrad", dy, w).assert_close(leaf.grad, want)


def test_autocast_cpu_bf16_keeps_fp32_params_and_bias():
    x, w, b = _tensors(SHAPES[0], dtype=torch.float32)
    w.requires_grad_(True)
    b.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv2d_gw8(x, w, b, padding_y=1, padding_x=1)
    assert y.dtype == torch.bfloat16
    xh, wh = x.to(torch.bfloat16), w.detach().to(torch.bfloat16)
    # The bias stays fp32, added in fp32: against float64 on the bf16 operands, within the
    # convolution's rounding and the sum's.
    unbiased = F.conv2d(xh.double(), wh.double(), None, padding=1, groups=2)
    half_ulp = 2.0**-8
    torch.testing.assert_close(
        y.double(),
        unbiased + b.detach().double().view(-1, 1, 1),
        rtol=half_ulp,
        atol=half_ulp * unbiased.abs().max().item(),
    )
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
    ones = torch.ones(y.shape, dtype=torch.float64)
    dw = conv2d_gw8_wgrad_ref(xh, ones, 1, 3, 3)
    torch.testing.assert_close(w.grad.double(), dw, rtol=2e-2, atol=0.5)
    torch.testing.assert_close(b.grad.double(), conv2d_gw8_bias_grad_ref(ones))


def test_autocast_fp16_leaves_float64_alone():
    x, w, _ = _tensors(SHAPES[0], bias=False)
    with torch.autocast("cpu", dtype=torch.float16):
        y = conv2d_gw8(x, w, None, padding_y=1, padding_x=1)
    assert y.dtype == torch.float64


def test_compile_matches_eager_without_recompiling_per_batch_size():
    from torch._dynamo.backends.registry import lookup_backend

    compiles = []
    aot_eager = lookup_backend("aot_eager")

    def counting_backend(gm, example_inputs):
        compiles.append(gm)
        return aot_eager(gm, example_inputs)

    def fn(x, w, b):
        return torch.tanh(conv2d_gw8(x, w, b, padding_y=1, padding_x=2))

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=counting_backend, fullgraph=True, dynamic=True)
    for n in (2, 3, 5):
        x, w, b = _tensors((n, 16, 6, 7, 3, 5, 1, 2), dtype=torch.float32, seed=n)
        grads = []
        for f in (compiled, fn):
            args = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
            y = f(*args)
            y.backward(torch.ones_like(y))
            grads.append((y.detach(), *(a.grad for a in args)))
        for got, want in zip(*grads, strict=True):
            torch.testing.assert_close(got, want)
    assert len(compiles) == 1


@pytest.mark.parametrize(
    "n, limit, chunks",
    [
        (5, 2, [(0, 2), (2, 4), (4, 5)]),
        (300, 256, [(0, 150), (150, 300)]),
        (256, 256, [(0, 256)]),
        (7, 1, [(i, i + 1) for i in range(7)]),
        (10, 3, [(0, 3), (3, 6), (6, 8), (8, 10)]),  # had been 3, 3, 3 and 1
    ],
)
def test_batch_chunks_are_few_and_even(n, limit, chunks):
    from spio.functional._kernels import batch_chunks

    assert batch_chunks(n, limit) == chunks


def test_activations_of_exactly_2_gib_run_in_chunks(monkeypatch):
    """The kernels count bytes in a C++ int: 2**31 bytes of activations is one byte past what
    they take, so 1024 images of 2 MiB run in two chunks, and 1023 in one batch."""
    from spio.functional import _kernels

    monkeypatch.setattr(_kernels, "_layers", {})
    x = torch.empty(1024, 16, 256, 256, dtype=torch.float16, device="meta")
    w = torch.empty(16, 8, 3, 3, dtype=torch.float16, device="meta")
    assert x.numel() * 2 == 2**31
    chunked = _kernels.layer(x, w, None, 1, 1)
    assert isinstance(chunked, _kernels._ChunkedLayer)
    assert [(start, stop) for start, stop, _ in chunked._chunks] == [(0, 512), (512, 1024)]
    assert type(_kernels.layer(x[:1023], w, None, 1, 1)) is _kernels.Layer


def test_the_layer_cache_holds_at_most_max_signatures(monkeypatch):
    from spio.functional import _kernels

    monkeypatch.setattr(_kernels, "MAX_SIGNATURES", 2)
    monkeypatch.setattr(_kernels, "_layers", {})
    w = torch.empty(8, 8, 3, 3, dtype=torch.float16, device="meta")
    for h in range(3, 8):
        _kernels.layer(torch.empty(1, 8, h, h, dtype=torch.float16, device="meta"), w, None, 1, 1)
        assert 1 <= len(_kernels._layers) <= 2


def _train_step_matches_reference(x, w, b) -> None:
    """conv2d_gw8 forward and backward (padding 1) on x, w and an fp32 bias, all requiring
    grad: y, dx, dw and db each match the float64 reference at its tolerance."""
    dtype = x.dtype
    x.requires_grad_(True)
    w.requires_grad_(True)
    b = b.float().requires_grad_(True)
    y = conv2d_gw8(x, w, b, padding_y=1, padding_x=1)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    y.backward(dy)
    params = Conv2dGw8Params.from_tensors(x, w, b, padding=(1, 1))
    want_y = conv2d_gw8_fprop_ref(x.detach(), w.detach(), b.detach(), (1, 1))
    conv2d_gw8_tolerance(params, "fprop", x.detach(), w.detach()).assert_close(y, want_y)
    want_dx = conv2d_gw8_dgrad_ref(dy, w.detach(), (1, 1), tuple(x.shape[-2:]))
    conv2d_gw8_tolerance(params, "dgrad", dy, w.detach()).assert_close(x.grad, want_dx)
    # dw is accumulated in fp32, then stored in the weight's dtype: one more rounding.
    want_dw = conv2d_gw8_wgrad_ref(x.detach(), dy, (1, 1), w.shape[2], w.shape[3])
    tol = conv2d_gw8_tolerance(params, "wgrad", x.detach(), dy)
    Tolerance(tol.atol, tol.rtol + torch.finfo(dtype).eps).assert_close(w.grad, want_dw)
    want_db = conv2d_gw8_bias_grad_ref(dy)
    conv2d_gw8_tolerance(params, "wgrad", dy, torch.ones(1)).assert_close(b.grad, want_db)


class TestEmulateSeam:
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
    def test_emulated_kernels_forward_and_backward_match_reference(self, monkeypatch, dtype):
        monkeypatch.setenv("SPIO_EMULATE", "1")
        x, w, b = _tensors(SHAPES[0], dtype=dtype, channels_last=True)
        _train_step_matches_reference(x, w, b)

    def test_one_layer_at_several_batch_sizes(self, monkeypatch):
        """The kernels take the batch size at launch, so a layer's batch sizes share builds
        where their configs agree; the choices that depend on the batch size (the grid, the
        partial-sum slots) must not be shared with them. Batches of 2, 3, then 2 images again
        through one layer: every step matches the float64 reference."""
        from spio.functional import _kernels

        monkeypatch.setenv("SPIO_EMULATE", "1")
        monkeypatch.setattr(_kernels, "_layers", {})
        x3, w, b = _tensors((3, 16, 6, 5, 3, 3, 1, 1), dtype=torch.float16, channels_last=True)
        for n in (2, 3, 2):
            x = x3[:n].clone(memory_format=torch.channels_last)
            _train_step_matches_reference(x, w.detach().clone(), b.detach().clone())

    def test_ragged_builds_through_the_layer_path(self, monkeypatch):
        """A batch that its tile configs' images per block do not divide runs the "ragged"
        builds, which check each image against the batch size: with every pass's config forced
        to several images a block (2 for FProp and DGrad, 4 for WGrad) at N = 5, a training step
        launches them and matches the float64 reference."""
        from spio.functional import _kernels
        from spio.kernels import perf_model
        from tests.conftest import spy_on_launches

        real = perf_model.select_config

        def several_images(factory, params, device=None, **options):
            want = 4 if factory.name == "conv2d_gw8_wgrad" else 2
            found = [c for c in factory.configs(params, **options) if c.block_n == want]
            return found[0] if found else real(factory, params, device, **options)

        monkeypatch.setenv("SPIO_EMULATE", "1")
        monkeypatch.setattr(perf_model, "select_config", several_images)
        monkeypatch.setattr(_kernels, "_layers", {})
        monkeypatch.setattr(_kernels, "_chosen", {})
        launched = spy_on_launches(monkeypatch, names=True)
        x, w, b = _tensors((5, 16, 6, 5, 3, 3, 1, 1), dtype=torch.float16, channels_last=True)
        _train_step_matches_reference(x, w, b)
        ragged = {name.split("__")[0] for name in launched if "__ragged" in name}
        assert ragged == {f"conv2d_gw8_{p}" for p in ("fprop", "dgrad", "wgrad")}, launched

    @pytest.mark.parametrize("bias", [True, False])
    def test_empty_batch_runs_like_nn_conv2d(self, monkeypatch, bias):
        """N = 0 is legal in nn.Conv2d: an empty output, an empty dx, zero dw and dbias. The kernels
        have nothing to do and are not called (they would reject N = 0); the op and the module's
        eager path give PyTorch's results, and the op passes opcheck."""
        from spio.kernels.kernel import Kernel
        from spio.layers import make_conv2d

        monkeypatch.setenv("SPIO_EMULATE", "1")

        def no_launch(self, args, device):
            raise AssertionError(f"launched {self.name} for an empty batch")

        monkeypatch.setattr(Kernel, "launch", no_launch)
        module = make_conv2d(16, 16, 3, padding=1, groups=2, bias=bias).half()
        x = torch.randn(0, 16, 6, 5).half().to(memory_format=torch.channels_last)
        for run in (module, lambda t: conv2d_gw8(t, module.weight, module.bias, 1, 1, 1)):
            module.zero_grad()
            xg = x.clone().requires_grad_()
            y = run(xg)
            assert y.shape == (0, 16, 6, 5) and y.dtype == torch.float16
            y.float().sum().backward()
            assert xg.grad.shape == x.shape
            assert torch.equal(module.weight.grad, torch.zeros_like(module.weight))
            if bias:
                assert torch.equal(module.bias.grad, torch.zeros_like(module.bias))
        args = (x.requires_grad_(), module.weight.detach().requires_grad_(), None, 1, 1, 1)
        torch.library.opcheck(conv2d_gw8, args)
        with pytest.raises(ValueError, match="filter R in 1..5, got 7"):
            conv2d_gw8(x, torch.randn(16, 8, 7, 3).half())

    def test_an_empty_batch_takes_the_layout_f_conv2d_gives(self, monkeypatch):
        """An empty NCHW batch with a channels_last weight: F.conv2d gives a contiguous output
        (strides (576, 36, 6, 1)); so must spio, though a batch of images takes the weight's
        layout then."""
        monkeypatch.setenv("SPIO_EMULATE", "1")
        x = torch.randn(0, 16, 6, 6).half()
        w = torch.randn(16, 8, 3, 3).half().to(memory_format=torch.channels_last)
        want = F.conv2d(x, w, None, 1, 1, 1, 2).stride()
        assert conv2d_gw8(x, w, None, 1, 1, 1).stride() == want
        assert torch.ops.spio.conv2d_gw8(x, w, None, 1, 1, 1).stride() == want
        assert public_conv2d_gw8(x, w, None, 1, 1, 1).stride() == want  # (the eager path)

    @pytest.mark.parametrize(
        "dtype, images, sizes",
        [
            (torch.float16, 2, [2, 2, 1]),
            (torch.bfloat16, 2, [2, 2, 1]),
            (torch.float16, 1, [1, 1, 1, 1, 1]),  # one image fits exactly: still the kernels
        ],
    )
    def test_batches_past_the_kernels_tensor_limit_run_in_chunks(
        self, monkeypatch, dtype, images, sizes
    ):
        """Activations larger than a kernel takes (2 GiB; here lowered to two images, or one)
        run in chunks of images: each pass matches the float64 reference, the weight and bias
        gradients sum over every chunk, and each chunk size gets its own kernels."""
        from spio.functional import _kernels
        from spio.kernels.kernel import Kernel

        monkeypatch.setenv("SPIO_EMULATE", "1")
        shape = (5, 16, 6, 7, 3, 3, 1, 1)
        x, w, b = _tensors(shape, dtype=dtype, channels_last=True)
        params = Conv2dGw8Params.from_tensors(x, w, b, padding=(1, 1))
        monkeypatch.setattr(_kernels, "MAX_TENSOR_BYTES", images * _kernels.image_bytes(params))
        monkeypatch.setattr(_kernels, "_layers", {})
        launched = []
        launch = Kernel.launch

        def spy(self, args, device):
            params = self.info_value("params")  # None for WGrad's sum_slots
            launched.append((self.name.split("__")[0], params and params.n))
            return launch(self, args, device)

        monkeypatch.setattr(Kernel, "launch", spy)
        _train_step_matches_reference(x, w, b)
        # One launch of each pass per chunk (WGrad's sum_slots aside).
        for kind in ("fprop", "dgrad", "wgrad"):
            ran = [n for name, n in launched if name == f"conv2d_gw8_{kind}"]
            assert ran == sizes, (kind, launched)

    def test_chunked_eager_path_gives_the_ops_bits(self, monkeypatch):
        """In chunks, the eager path (which has the kernels write the parameters' dtypes) and
        the op (fp32 gradients, cast after) give the same output and gradients, an fp32 bias's
        gradient unrounded in both."""
        from spio.functional import _kernels
        from spio.functional.eager import conv2d_gw8_eager

        monkeypatch.setenv("SPIO_EMULATE", "1")
        x, w, b = _tensors((5, 16, 6, 7, 3, 3, 1, 1), dtype=torch.float16, channels_last=True)
        b = b.float()
        params = Conv2dGw8Params.from_tensors(x, w, b, padding=(1, 1))
        monkeypatch.setattr(_kernels, "MAX_TENSOR_BYTES", 2 * _kernels.image_bytes(params))
        monkeypatch.setattr(_kernels, "_layers", {})
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).half()
        results = []
        for run in (conv2d_gw8, conv2d_gw8_eager):
            leaves = [t.clone().requires_grad_() for t in (x, w, b)]
            y = run(*leaves, padding_y=1, padding_x=1)
            y.backward(dy)
            results.append((y, *(t.grad for t in leaves)))
        assert isinstance(_kernels.layer(x, w, b, 1, 1), _kernels._ChunkedLayer)
        assert results[1][3].dtype == torch.float32
        for got, want in zip(*results, strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want)

    @pytest.mark.parametrize("past", ["image", "weight gradient"])
    def test_an_image_past_the_kernels_tensor_limit_runs_in_pytorch(self, monkeypatch, caplog,
                                                                    past):  # fmt: skip
        """As does a layer whose fp32 weight gradient passes it (millions of channels), which
        had got kernels and failed in WGrad's header."""
        from spio.functional import _kernels
        from spio.kernels.kernel import Kernel

        monkeypatch.setenv("SPIO_EMULATE", "1")
        x, w, b = _tensors(SHAPES[0], dtype=torch.float16)
        params = Conv2dGw8Params.from_tensors(x, w, b, padding=(1, 1))
        image, dw = _kernels.image_bytes(params), _kernels.weight_grad_bytes(params)
        assert image < dw
        if past == "image":
            monkeypatch.setattr(_kernels, "MAX_TENSOR_BYTES", image - 1)
        else:
            monkeypatch.setattr(_kernels.conv2d_gw8_params, "MAX_TENSOR_BYTES", dw - 1)
        monkeypatch.setattr(_kernels, "_layers", {})

        def no_launch(self, args, device):
            raise AssertionError(f"launched {self.name}")

        monkeypatch.setattr(Kernel, "launch", no_launch)
        with caplog.at_level("INFO", logger="spio"):
            y = conv2d_gw8(x, w, b, padding_y=1, padding_x=1)
        torch.testing.assert_close(y, F.conv2d(x, w, b, padding=1, groups=2))
        assert any(past in r.message and "PyTorch runs this layer" in r.message
                   for r in caplog.records)  # fmt: skip

    def test_seam_receives_params(self, monkeypatch):
        from spio.kernels import conv2d_gw8_factory

        seen = []

        def fake_fprop(input, weight, bias, params, config=None, out=None, kernel=None, **kw):
            seen.append(params)
            ref = conv2d_gw8_fprop_ref(input, weight, bias, params.padding)
            return ref.to(input.dtype)  # contiguous, although the input is channels_last

        monkeypatch.setenv("SPIO_EMULATE", "1")
        monkeypatch.setattr(conv2d_gw8_factory, "fprop", fake_fprop)
        x, w, _ = _tensors(SHAPES[1], dtype=torch.bfloat16, bias=False, channels_last=True)
        b = torch.randn(8)
        y = conv2d_gw8(x, w, b, padding_y=0, padding_x=2)
        assert seen == [Conv2dGw8Params(1, 8, 5, 9, (0, 2), 1, 5, True, "bf16")]
        assert y.is_contiguous(memory_format=torch.channels_last)

    def test_fp32_is_rejected_when_emulating(self, monkeypatch):
        monkeypatch.setenv("SPIO_EMULATE", "1")
        x, w, _ = _tensors(SHAPES[0], dtype=torch.float32, bias=False)
        with pytest.raises(
            ValueError, match=r"bf16 tensors \(or torch.autocast\), got torch.float32"
        ):
            conv2d_gw8(x, w, None, padding_y=1, padding_x=1)

    def test_float64_under_autocast_is_rejected_saying_autocast_leaves_it(self, monkeypatch):
        """Autocast is on already, and leaves float64 as it is: the error had suggested
        torch.autocast."""
        monkeypatch.setenv("SPIO_EMULATE", "1")
        x, w, _ = _tensors(SHAPES[0], dtype=torch.float64, bias=False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for call in (conv2d_gw8, public_conv2d_gw8):  # the op, and the eager path
                with pytest.raises(ValueError, match="autocast leaves float64 tensors as they are"):
                    call(x, w, None, padding_y=1, padding_x=1)


def _bad_calls():
    x = torch.randn(2, 16, 6, 6)
    w = torch.randn(16, 8, 3, 3)
    return [
        ("stride", lambda: conv2d_gw8(x, w, None, 2, 1, 1), "stride 1, got 2"),
        ("stride 0", lambda: conv2d_gw8(x, w, None, 0, 1, 1), "stride 1, got 0"),
        ("dilation", lambda: conv2d_gw8(x, w, None, 1, 1, 1, 2), "dilation 1, got 2"),
        ("group width", lambda: conv2d_gw8(x, torch.randn(16, 4, 3, 3)), "group width 8, got 4"),
        (
            "C != K",
            lambda: conv2d_gw8(x, torch.randn(32, 8, 3, 3)),
            "C=16 (input.shape[1]) and K=32 (weight",
        ),
        (
            "C != K of one group",  # groups=1: implied by the weight, so not the layer's message
            lambda: conv2d_gw8(x, torch.randn(8, 8, 3, 3)),
            "C=16 (input.shape[1]) and K=8 (weight.shape[0])",
        ),
        (
            "input channels for the layer",
            lambda: conv2d_gw8(torch.randn(2, 32, 6, 6), w, None, 1, 1, 1, 1, 2),
            "weight of shape (16, 8, 3, 3) and groups=2 needs an input of 16 channels, got input "
            "of shape (2, 32, 6, 6)",
        ),
        ("channels", lambda: conv2d_gw8(torch.randn(1, 12, 4, 4), w), "multiple of 8, got 12"),
        (
            "no channels",
            lambda: conv2d_gw8(torch.randn(1, 0, 4, 4), torch.randn(0, 8, 3, 3)),
            "positive multiple of 8, got 0",
        ),
        (
            "no rows",
            lambda: conv2d_gw8(torch.randn(1, 16, 0, 4), w, None, 1, 1, 1),
            "input image of at least 1x1, got 0x4",
        ),
        (
            "no columns",  # padding 2 would give a 3-wide output
            lambda: conv2d_gw8(torch.randn(1, 16, 4, 0), w, None, 1, 1, 2),
            "input image of at least 1x1, got 4x0",
        ),
        (
            "groups",
            lambda: conv2d_gw8(x, w, None, 1, 1, 1, 1, 4),
            "groups = C / 8 = 2 (or 1, implied by the weight), got 4",
        ),
        (
            "groups 0",
            lambda: conv2d_gw8(x, w, None, 1, 1, 1, 1, 0),
            "groups = C / 8 = 2 (or 1, implied by the weight), got 0",
        ),
        ("R", lambda: conv2d_gw8(x, torch.randn(16, 8, 7, 3)), "filter R in 1..5, got 7"),
        ("S", lambda: conv2d_gw8(x, torch.randn(16, 8, 3, 6)), "filter S in 1..5, got 6"),
        ("R 0", lambda: conv2d_gw8(x, torch.randn(16, 8, 0, 3), None, 1, 1, 1), "R in 1..5, got 0"),
        ("padding", lambda: conv2d_gw8(x, w, None, 1, -1, 0), "non-negative padding, got (-1, 0)"),
        (
            "padding x",
            lambda: conv2d_gw8(x, w, None, 1, 0, -1),
            "non-negative padding, got (0, -1)",
        ),
        (
            "empty",
            lambda: conv2d_gw8(torch.randn(1, 8, 2, 9), torch.randn(8, 8, 3, 3)),
            "non-empty output, got output size 0x7",
        ),
        (
            "empty width",
            lambda: conv2d_gw8(torch.randn(1, 8, 9, 2), torch.randn(8, 8, 3, 3)),
            "non-empty output, got output size 7x0",
        ),
        ("3-D input", lambda: conv2d_gw8(x[0], w), "4-D NCHW input, got 3-D"),
        ("5-D input", lambda: conv2d_gw8(x[None], w), "4-D NCHW input, got 5-D"),
        ("3-D weight", lambda: conv2d_gw8(x, w[0]), "4-D weight (K, 8, R, S), got 3-D"),
        ("bias length", lambda: conv2d_gw8(x, w, torch.randn(8)), "bias of shape (16,), got (8,)"),
        ("bias 2-D", lambda: conv2d_gw8(x, w, torch.randn(16, 1)), "got (16, 1)"),
        (
            "bias dtype",
            lambda: conv2d_gw8(x.double(), w.double(), torch.randn(16).half()),
            "bias in fp32 or the input dtype torch.float64, got torch.float16",
        ),
        (
            "float64 bias",
            lambda: conv2d_gw8(x.half(), w.half(), torch.randn(16, dtype=torch.float64)),
            "bias in fp32 or the input dtype",
        ),
        ("devices", lambda: conv2d_gw8(x, w.to("meta")), "input on cpu and weight on meta"),
        ("bias device", lambda: conv2d_gw8(x, w, torch.randn(16, device="meta")), "bias on meta"),
        ("int input", lambda: conv2d_gw8(x.long(), w), "floating-point tensors, got input"),
        ("int weight", lambda: conv2d_gw8(x, w.int()), "got weight of torch.int32"),
        (
            "mixed dtype",
            lambda: conv2d_gw8(x, w.double()),
            "weight dtype equal to input dtype torch.float32, got torch.float64",
        ),
        (
            "backward mask",
            lambda: conv2d_gw8_backward(x, x, w, 1, 1, [True]),
            "output mask of 3 bools",
        ),
        (
            "backward grad shape",
            lambda: conv2d_gw8_backward(x[:, :, 1:], x, w, 1, 1, [True, True, True]),
            "grad_output of shape (2, 16, 6, 6)",
        ),
        (
            "backward grad dtype",
            lambda: conv2d_gw8_backward(x.double(), x, w, 1, 1, [True, True, True]),
            "grad_output of torch.float32 on cpu, got torch.float64 on cpu",
        ),
    ]


@pytest.mark.parametrize("name, call, message", _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_bad_arguments_raise_value_error(name, call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def test_bad_argument_type_is_a_clean_error():
    x = torch.randn(1, 8, 4, 4)
    with pytest.raises((TypeError, RuntimeError), match="stride"):
        conv2d_gw8(x, torch.randn(8, 8, 3, 3), None, (1, 1))
    with pytest.raises(TypeError, match=r"needs an integer stride, got \(1, 1\)"):
        public_conv2d_gw8(x, torch.randn(8, 8, 3, 3), None, (1, 1))


_WRONG_TYPES = [
    (dict(stride=1.0), "an integer stride, got 1.0"),
    (dict(stride=True), "an integer stride, got True"),
    (dict(padding_y=-0.0), "an integer padding_y, got -0.0"),
    (dict(padding_x=False), "an integer padding_x, got False"),
    (dict(padding_x="1"), "an integer padding_x, got '1'"),
    (dict(dilation=None), "an integer dilation, got None"),
    (dict(groups=2.0), "an integer groups, got 2.0"),
    (dict(groups=torch.tensor(2.0)), r"an integer groups, got tensor\(2\.\)"),
    (dict(passes=True), "an integer passes, got True"),
    (dict(passes="fprop"), "an integer passes, got 'fprop'"),
    (dict(input=[[1.0]]), "input to be a tensor, got list"),
    (dict(bias=[0.0] * 16), "bias to be a tensor or None, got list"),
]


@pytest.mark.parametrize("emulate", ["0", "1"])
@pytest.mark.parametrize("kwargs, message", _WRONG_TYPES, ids=repr)
def test_an_argument_of_the_wrong_type_is_a_type_error_naming_it(
    monkeypatch, emulate, kwargs, message
):
    """As F.conv2d, Conv2dGw8 and Conv2dGw8Params refuse them: a float (even a whole one or
    -0.0) or a string where an int belongs, a list for a tensor, was the op schema's
    RuntimeError; a bool was taken as an int, F.conv2d's refusal aside (and passes=True ran
    FProp alone, where Conv2dGw8.spio_passes = True is every pass)."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    dtype = torch.float16 if emulate == "1" else torch.float32
    call = dict(input=torch.randn(1, 16, 4, 4, dtype=dtype), weight=torch.randn(16, 8, 3, 3,
                dtype=dtype), padding_y=1, padding_x=1) | kwargs  # fmt: skip
    with pytest.raises(TypeError, match=f"^conv2d_gw8 needs {message}$"):
        public_conv2d_gw8(**call)


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_integers_of_other_types_are_ints(monkeypatch, emulate):
    """numpy integers and 0-d integer tensors are ints, as the op's schema takes them."""
    import numpy as np

    monkeypatch.setenv("SPIO_EMULATE", emulate)
    dtype = torch.float16 if emulate == "1" else torch.float32
    x, w = torch.randn(1, 16, 4, 4, dtype=dtype), torch.randn(16, 8, 3, 3, dtype=dtype)
    want = public_conv2d_gw8(x, w, None, 1, 1, 2, 1, 2, 7)
    got = public_conv2d_gw8(
        x, w, None, np.int64(1), torch.tensor(1), np.int32(2), 1, np.int64(2), 7
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_same_wrong_type_is_a_type_error_at_every_entry_point():
    """A whole float for an int, or a bool, is a TypeError from the function, the module, the
    params class and transform's include alike (they had been RuntimeError, taken, ValueError)."""
    from torch import nn

    import spio
    from spio.kernels import Conv2dGw8Params
    from spio.layers import Conv2dGw8

    x, w = torch.randn(1, 16, 4, 4), torch.randn(16, 8, 3, 3)
    for bad in (1.0, True):
        with pytest.raises(TypeError, match=f"integer padding_y, got {bad}"):
            public_conv2d_gw8(x, w, None, 1, bad, 1)
        with pytest.raises(TypeError, match=f"padding of one or two ints.*, got {bad}"):
            Conv2dGw8(16, 16, 3, padding=bad, groups=2)
        with pytest.raises(TypeError, match=f"integer padding, got {bad}"):
            Conv2dGw8Params(1, 16, 4, 4, padding=bad)
    with pytest.raises(TypeError, match="include.*must return True, False or pass names"):
        spio.transform(nn.Conv2d(16, 16, 3, groups=2), include=lambda name, conv: 1.0)


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_a_missing_tensor_is_a_type_error_naming_it(monkeypatch, emulate):
    """None for the weight reached `.dim()` (or, emulated, `.shape`): an AttributeError."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    x, w = torch.randn(1, 8, 4, 4).half(), torch.randn(8, 8, 3, 3).half()
    with pytest.raises(TypeError, match="needs weight to be a tensor, got NoneType"):
        conv2d_gw8(x, None, None, 1, 1, 1, 1, 1)
    with pytest.raises(TypeError, match="needs input to be a tensor, got NoneType"):
        conv2d_gw8(None, w, None, 1, 1, 1, 1, 1)


@pytest.mark.parametrize("emulate", ["0", "1"])
@pytest.mark.parametrize("shape", [(0, 16, 5, 5), (2, 16, 1, 1)])
def test_tensors_both_contiguous_and_channels_last_keep_their_strides(monkeypatch, emulate, shape):
    """An empty batch or 1x1 images are contiguous in both formats; the output takes the
    format the input's strides say, as F.conv2d's does (it had always come back NCHW)."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    w = torch.randn(16, 8, 3, 3).half()
    for fmt in (torch.channels_last, torch.contiguous_format):
        x = torch.randn(shape).half().to(memory_format=fmt)
        y = conv2d_gw8(x, w, None, 1, 1, 1, 1, 2)
        assert y.stride() == F.conv2d(x.float(), w.float(), None, 1, 1, 1, 2).stride()


@pytest.mark.parametrize("emulate", ["0", "1"])
@pytest.mark.parametrize("image", [1, 3], ids=["1x1_pad1", "3x3_pad0"])
def test_one_pixel_outputs_of_nchw_inputs_have_nchw_strides_on_every_path(monkeypatch, emulate,
                                                                          image):  # fmt: skip
    """A 1x1 output is contiguous in both formats: the eager shortcut (the public function, the
    layers) had kept the kernels' NHWC strides for an NCHW input, where the op and F.conv2d give
    NCHW's, in the output and in x.grad."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    pad = 1 if image == 1 else 0
    w = torch.randn(16, 8, 3, 3).half()
    x = torch.randn(2, 16, image, image).half().requires_grad_()
    expected = F.conv2d(x.detach().float(), w.float(), None, 1, pad, 1, 2).stride()
    assert expected == (16, 1, 1, 1)
    for call in (public_conv2d_gw8, torch.ops.spio.conv2d_gw8):
        x.grad = None
        y = call(x, w, None, 1, pad, pad, 1, 2)
        y.sum().backward()
        assert y.stride() == expected and x.grad.stride() == x.stride(), call


@pytest.mark.parametrize("emulate", ["0", "1"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_call_with_every_trailing_argument_at_its_default_has_gradients(monkeypatch, emulate,
                                                                          bias):  # fmt: skip
    """The dispatcher leaves out trailing arguments equal to their defaults: without a bias and
    with no padding the op saw (input, weight) only, and its backward (raw op, torch.compile,
    the CPU path) raised "needs an output mask of 3 bools", its vmap rule a ValueError."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    dtype = torch.float16 if emulate == "1" else torch.float32
    x, w = torch.randn(2, 16, 5, 5), torch.randn(16, 8, 1, 1)
    b = torch.randn(16) if bias else None
    for call in (
        lambda x, w: torch.ops.spio.conv2d_gw8(x, w, b),
        lambda x, w: public_conv2d_gw8(x, w, b),
        torch.compile(lambda x, w: public_conv2d_gw8(x, w, b), backend="aot_eager"),
    ):
        xs, ws = (t.to(dtype).clone().requires_grad_() for t in (x, w))
        call(xs, ws).float().sum().backward()
        reference = [t.double().requires_grad_() for t in (xs.detach(), ws.detach())]
        F.conv2d(*reference, None if b is None else b.double(), groups=2).sum().backward()
        for got, want in zip((xs.grad, ws.grad), (t.grad for t in reference), strict=True):
            torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    batched = torch.randn(3, 2, 16, 5, 5).to(dtype)
    y = torch.vmap(lambda t: public_conv2d_gw8(t, w.to(dtype), b))(batched)
    want = F.conv2d(batched.double().flatten(0, 1), w.double(), None if b is None else b.double(),
                    groups=2).unflatten(0, (3, 2))  # fmt: skip
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
def test_fp32_cuda_outside_autocast_is_rejected():
    x = torch.randn(1, 8, 4, 4, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    with pytest.raises(ValueError, match="on cuda needs fp16 or bf16"):
        conv2d_gw8(x, w, None, padding_y=1, padding_x=1)


def test_a_gpu_of_another_architecture_is_named(monkeypatch):
    """device_problem: a Turing GPU (sm_75, no cp.async) is named with its arch and the archs
    spio runs on; an sm_90 or an experimental sm_100 one is fine; answers are kept per device.
    (torch.cuda's queries faked: no GPU here.)"""
    from spio.cuda import nvrtc
    from spio.functional import checks

    capability = {0: (7, 5), 1: (9, 0), 2: (10, 0)}
    asked = []
    monkeypatch.setattr(checks, "_gpu_problems", {})
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: ("sm_80", "sm_90", "sm_100"))
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda i: asked.append(i) or capability[i]
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU {i}")
    cuda = [torch.device("cuda", i) for i in range(3)]
    assert checks.device_problem(cuda[0]) == (
        "cuda:0 (GPU 0) is sm_75, not one of sm_80, sm_86, sm_89, sm_90 (or the untested "
        "sm_100, sm_120)"
    )
    assert checks.device_problem(cuda[1]) is None and checks.device_problem(cuda[2]) is None
    assert checks.device_problem(cuda[0]).startswith("cuda:0 (GPU 0) is sm_75")
    assert asked == [0, 1, 2]  # asked once per device
    assert checks.device_problem(torch.device("cpu")) is None


def test_a_gpu_the_nvrtc_found_cannot_compile_for_is_named(monkeypatch):
    """An sm_100 GPU with an NVRTC before 12.8 (torch 2.6's is 12.4): named with the NVRTC and
    what to do, where it had failed at the first launch with NVRTC's "invalid value for
    --gpu-architecture". An NVRTC that does not load is left to the compile to report."""
    from spio.cuda import nvrtc
    from spio.functional import checks

    monkeypatch.setattr(checks, "_gpu_problems", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (10, 0) if i else (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU {i}")
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: ("sm_50", "sm_80", "sm_90"))
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 4))
    assert checks.device_problem(torch.device("cuda", 0)) is None
    assert checks.device_problem(torch.device("cuda", 1)) == (
        "cuda:1 (GPU 1): NVRTC 12.4 cannot compile for sm_100 (it compiles for sm_50 to sm_90); "
        "a newer NVRTC can (`python -m spio info` shows which one spio found)"
    )

    def missing():
        raise nvrtc.NvrtcError("libnvrtc not found")

    monkeypatch.setattr(checks, "_gpu_problems", {})
    monkeypatch.setattr(nvrtc, "supported_archs", missing)
    assert checks.device_problem(torch.device("cuda", 1)) is None


def test_the_op_refuses_a_gpu_its_kernels_do_not_run_on(monkeypatch):
    """Where spio's kernels would run (here the emulator, standing in for a GPU) on a device
    device_problem names, the op raises a ValueError saying so, before any kernel is built."""
    from spio.functional import _kernels

    monkeypatch.setenv("SPIO_EMULATE", "1")
    monkeypatch.setattr(_kernels, "device_problem", lambda device: "cuda:0 (T4) is sm_75")
    x = torch.randn(1, 8, 4, 4, dtype=torch.float16)
    w = torch.randn(8, 8, 3, 3, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"needs a GPU spio's kernels run on: cuda:0 \(T4\)"):
        conv2d_gw8(x, w, None, padding_y=1, padding_x=1)


@pytest.mark.cuda
def test_this_gpu_is_one_the_kernels_run_on():
    from spio.compiler.arch import arch_of, builds_for
    from spio.functional.checks import device_problem

    expected = builds_for(arch_of(torch.cuda.get_device_capability(0)))
    assert (device_problem(torch.device("cuda", 0)) is None) == expected


#: fp16 results of 72-term sums, spio against cuDNN: each rounds differently.
_LOOSE = dict(atol=2e-2, rtol=1e-2)


@pytest.mark.cuda
def test_activations_past_2_gib_run_in_chunks_on_the_gpu():
    """A real batch past the kernels' tensor limit (2.06 GiB input: two chunks of 515 images)
    against PyTorch's convolution in the same dtype."""
    from spio.functional import _kernels

    torch.manual_seed(0)
    n, c, h, w = 1030, 64, 128, 128
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16)
    x = x.to(memory_format=torch.channels_last).requires_grad_()
    weight = torch.randn(c, 8, 3, 3, device="cuda", dtype=torch.float16, requires_grad=True)
    assert x.numel() * 2 > _kernels.MAX_TENSOR_BYTES
    y = conv2d_gw8(x, weight, None, padding_y=1, padding_x=1)
    assert isinstance(_kernels.layer(x, weight, None, 1, 1), _kernels._ChunkedLayer)
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, weight), dy)
    with torch.no_grad():
        torch.testing.assert_close(y, F.conv2d(x, weight, padding=1, groups=c // 8), **_LOOSE)
    y_ref = F.conv2d(x, weight, padding=1, groups=c // 8)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, weight), dy)
    torch.testing.assert_close(dx, dx_ref, **_LOOSE)
    # dw sums 1030 * 128 * 128 products: compare relative to its scale.
    torch.testing.assert_close(dw.float(), dw_ref.float(), atol=1e-3 * dw_ref.abs().max().item(),
                               rtol=1e-2)  # fmt: skip


def test_import_spio_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, spio; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("limit", ["default", "tiny"])
def test_deterministic_mode_uses_the_partial_sums_wgrad(monkeypatch, limit):
    """Under use_deterministic_algorithms spio's WGrad runs the partial-sums variant (per-warp
    sums, then one sum over them), or, where that buffer would pass MAX_PARTIAL_BYTES, takes the
    gradients from PyTorch. Outside it, partial sums up to PARTIAL_BYTES, then fp32 atomics."""
    from spio.functional import _kernels
    from spio.kernels import conv2d_gw8_wgrad_factory as wg

    monkeypatch.setenv("SPIO_EMULATE", "1")
    monkeypatch.setattr(_kernels, "_layers", {})
    monkeypatch.setattr(_kernels, "_chosen", {})  # kernel choices depend on the limit
    if limit == "tiny":
        monkeypatch.setattr(wg, "MAX_PARTIAL_BYTES", 16)
    launched = []
    real = wg.wgrad
    monkeypatch.setattr(
        wg,
        "wgrad",
        lambda *a, **k: launched.append(k["kernel"].name) or real(*a, **k),
    )
    x, w, b = _tensors(SHAPES[0], dtype=torch.float16)
    dy = torch.randn(2, 16, 6, 7, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _, dw, db = conv2d_gw8_backward(dy, x, w, 1, 1, [False, True, True])
        _, dw2, db2 = conv2d_gw8_backward(dy, x, w, 1, 1, [False, True, True])
    finally:
        torch.use_deterministic_algorithms(previous)
    if limit == "tiny":
        assert not launched  # PyTorch's gradients
    else:
        assert len(launched) == 2 and all(
            without_tensor_copies(name).endswith("__partials") for name in launched
        )
    assert torch.equal(dw, dw2) and torch.equal(db, db2)
    params = Conv2dGw8Params.from_tensors(x, w, None, padding=(1, 1))
    tol = conv2d_gw8_tolerance(params, "wgrad", x, dy)
    tol.assert_close(dw, conv2d_gw8_wgrad_ref(x, dy, (1, 1), 3, 3))
    tol = conv2d_gw8_tolerance(params, "wgrad", dy, torch.ones(1))
    tol.assert_close(db, conv2d_gw8_bias_grad_ref(dy))
    # The eager path, here for a layer without a bias, takes the same weight gradient.
    from spio.functional.eager import conv2d_gw8_eager

    leaf = w.clone().requires_grad_()
    torch.use_deterministic_algorithms(True)
    try:
        conv2d_gw8_eager(x, leaf, None, 1, 1).backward(dy)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.equal(leaf.grad, dw.to(w.dtype))
    # Deterministic mode off again: partial sums by default while their buffer is small, atomics
    # into a zeroed dw past PARTIAL_BYTES.
    launched.clear()
    conv2d_gw8_backward(dy, x, w, 1, 1, [False, True, True])
    assert launched and without_tensor_copies(launched[0]).endswith("__partials")
    monkeypatch.setattr(wg, "PARTIAL_BYTES", 16)
    monkeypatch.setattr(_kernels, "_layers", {})
    monkeypatch.setattr(_kernels, "_chosen", {})
    launched.clear()
    _, dw3, _ = conv2d_gw8_backward(dy, x, w, 1, 1, [False, True, True])
    assert launched and not without_tensor_copies(launched[0]).endswith("__partials")
    tol = conv2d_gw8_tolerance(params, "wgrad", x, dy)
    tol.assert_close(dw3, conv2d_gw8_wgrad_ref(x, dy, (1, 1), 3, 3))


def test_deterministic_wgrad_takes_the_best_ranked_config_whose_partial_sums_fit(monkeypatch):
    """Where the chosen config's partial sums would pass MAX_PARTIAL_BYTES, deterministic mode
    runs the best-ranked config whose buffer fits, not PyTorch (it had fallen back to PyTorch
    although other configs fit)."""
    from spio.functional import _kernels
    from spio.kernels import conv2d_gw8_wgrad_factory as wg
    from spio.kernels import perf_model as pm

    monkeypatch.setenv("SPIO_EMULATE", "1")
    monkeypatch.setattr(_kernels, "_layers", {})
    monkeypatch.setattr(_kernels, "_chosen", {})
    x, w, _ = _tensors(SHAPES[0], dtype=torch.float16)
    params = Conv2dGw8Params.from_tensors(x, w, None, padding=(1, 1))
    family = pm.FAMILIES["conv2d_gw8_wgrad"]
    ranked = pm.heuristic_ranking(family, params, family.configs(params))
    pick = _kernels.wgrad_kernel(params, torch.device("cpu"), False).info_value("config")
    sizes = {c: wg.partial_bytes(params, c) for c in ranked}
    assert sizes[pick] > min(sizes.values())
    monkeypatch.setattr(wg, "MAX_PARTIAL_BYTES", sizes[pick] - 1)
    expected = next(c for c in ranked if sizes[c] < sizes[pick])
    kernel = _kernels.wgrad_kernel(params, torch.device("cpu"), False, deterministic=True)
    assert without_tensor_copies(kernel.name).endswith("__partials")
    assert kernel.info_value("config") == expected != pick
    dy = torch.randn(2, 16, 6, 7, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    launched = []
    real = wg.wgrad
    monkeypatch.setattr(wg, "wgrad", lambda *a, **k: launched.append(k["kernel"]) or real(*a, **k))
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _, dw, _ = conv2d_gw8_backward(dy, x, w, 1, 1, [False, True, False])
    finally:
        torch.use_deterministic_algorithms(previous)
    assert [k.name for k in launched] == [kernel.name]
    tol = conv2d_gw8_tolerance(params, "wgrad", x, dy)
    tol.assert_close(dw, conv2d_gw8_wgrad_ref(x, dy, (1, 1), 3, 3))


def test_fresh_strides_are_torch_empty_strides():
    """The custom op checks its output's strides arithmetically, not with a meta tensor per call."""
    import itertools

    from spio.functional.conv2d_gw8_op import fresh_strides

    for shape in itertools.product([1, 3], [8, 24], [1, 4], [1, 7]):
        for fmt in (torch.contiguous_format, torch.channels_last):
            assert fresh_strides(shape, fmt) == torch.empty(shape, memory_format=fmt).stride()


def test_kernel_path_validates_once_per_signature_and_bad_calls_still_raise(monkeypatch):
    """The ops' kernel path checks a call signature once (then reuses its params and kernels); a
    bad call is never cached, and the backward op still checks grad_output on every call."""
    from spio.functional import _kernels

    monkeypatch.setenv("SPIO_EMULATE", "1")
    monkeypatch.setattr(_kernels, "_layers", {})
    checks = []
    real = _kernels.check_args
    monkeypatch.setattr(_kernels, "check_args", lambda *a: checks.append(a) or real(*a))
    x, w, b = _tensors(SHAPES[0], dtype=torch.float16, channels_last=True)
    b = b.float()
    first = conv2d_gw8(x, w, b, 1, 1, 1, 1, 2)
    assert torch.equal(conv2d_gw8(x, w, b, 1, 1, 1, 1, 2), first)
    assert len(checks) == 1
    for _ in range(2):
        with pytest.raises(ValueError, match="needs stride 1, got 2"):
            conv2d_gw8(x, w, b, 2, 1, 1, 1, 2)
        with pytest.raises(
            ValueError, match=r"needs groups = C / 8 = 2 \(or 1, implied by the weight\), got 3"
        ):
            conv2d_gw8(x, w, b, 1, 1, 1, 1, 3)
    dy = torch.randn(first.shape).half()
    dx, dw, db = conv2d_gw8_backward(dy, x, w, 1, 1, [True, True, True])
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (16,)
    for _ in range(2):
        with pytest.raises(ValueError, match="needs grad_output of shape"):
            conv2d_gw8_backward(dy[:, :, :-1], x, w, 1, 1, [True, False, False])


def test_activations_not_in_channels_last_are_logged_once_on_the_gpu(monkeypatch, caplog):
    """spio's kernels read NHWC: an NCHW model pays a copy in and out per pass, which the user
    can avoid. The first pass on spio's kernels that copies says so (FProp at the forward,
    DGrad or WGrad at the backward), once per process; channels_last inputs, passes PyTorch
    runs (FProp left to it had warned at the forward, in evaluation too, where nothing is
    copied) and the CPU say nothing. (The passes are stubbed out: this machine may have no GPU;
    the check runs before them.)"""
    from spio.functional import _kernels

    monkeypatch.setattr(_kernels, "_layout_logged", False)
    monkeypatch.setattr(_kernels.Layer, "fprop", lambda self, x, w, b: x)
    monkeypatch.setattr(_kernels.Layer, "dgrad", lambda self, dy, w: dy)
    monkeypatch.setattr(_kernels.Layer, "wgrad", lambda self, x, dy, bias, dtypes, **kw: (x, None))
    params = Conv2dGw8Params(n=2, c=16, h=8, w=8)
    x = torch.randn(params.input_shape, dtype=torch.float16)
    w = torch.randn(params.weight_shape, dtype=torch.float16)
    cuda = torch.device("cuda")
    warnings = lambda: [r for r in caplog.records if "not a contiguous channels_last" in r.message]  # noqa: E731
    with caplog.at_level("WARNING", logger="spio"):
        _kernels.Layer(params, cuda).forward(x.to(memory_format=torch.channels_last), w, None, 7)
        _kernels.Layer(params, cuda).forward(x, w, None, 0)
        _kernels.Layer(params, torch.device("cpu")).forward(x, w, None, 7)
        layer = _kernels.Layer(params, cuda)
        layer.forward(x, w, None, _kernels.DGRAD)  # FProp by PyTorch: no copy
        assert warnings() == []
        layer.backward(x, x, w, (True, False, False), _kernels.DGRAD)  # spio's DGrad copies dy
        assert len(warnings()) == 1
        layer.forward(x, w, None, 7)
        _kernels.Layer(params, cuda).forward(x, w, None, 7)
    assert len(warnings()) == 1
    message = warnings()[0].getMessage()
    assert params.encode() in message and ".to(memory_format=torch.channels_last)" in message


def test_the_layout_warning_of_a_backward_and_of_a_chunked_layer(monkeypatch, caplog):
    """Asked in the passes themselves it had missed two copies: DGrad and WGrad both on spio
    (the backward lays dy out NHWC once for both, so DGrad's dy looked channels_last and WGrad's
    x went unasked), and a batch run in chunks (whose passes are its own)."""
    from spio.functional import _kernels

    monkeypatch.setattr(_kernels.Layer, "dgrad", lambda self, dy, w: dy)
    monkeypatch.setattr(_kernels.Layer, "wgrad", lambda self, x, dy, bias, dtypes, **kw: (x, None))
    monkeypatch.setattr(_kernels._ChunkedLayer, "fprop", lambda self, x, w, b: x)
    params = Conv2dGw8Params(n=4, c=16, h=8, w=8)
    x = torch.randn(params.input_shape, dtype=torch.float16)
    w = torch.randn(params.weight_shape, dtype=torch.float16)
    cuda = torch.device("cuda")
    said = lambda: [r for r in caplog.records if "not a contiguous channels_last" in r.message]  # noqa: E731
    both = _kernels.DGRAD | _kernels.WGRAD
    with caplog.at_level("WARNING", logger="spio"):
        monkeypatch.setattr(_kernels, "_layout_logged", False)
        layer = _kernels.Layer(params, cuda)
        layer.forward(x, w, None, both)  # FProp by PyTorch
        assert said() == []
        layer.backward(x, x, w, (True, True, False), both)
        assert len(said()) == 1
        monkeypatch.setattr(_kernels, "_layout_logged", False)
        nhwc_dy = x.to(memory_format=torch.channels_last)  # WGrad copies x alone
        _kernels.Layer(params, cuda).backward(nhwc_dy, x, w, (False, True, False), _kernels.WGRAD)
        assert len(said()) == 2
        monkeypatch.setattr(_kernels, "_layout_logged", False)
        _kernels._ChunkedLayer(params, cuda, 2).forward(x, w, None, 7)
        assert len(said()) == 3


def test_flop_counter_counts_the_ops(monkeypatch):
    """torch.utils.flop_counter.FlopCounterMode counts spio's ops: the forward as it counts
    nn.Conv2d's (2 * N * K * P * Q * 8 * R * S), the backward op one pass per gradient asked
    for (DGrad, WGrad; the bias gradient is a sum). On the kernels (emulated here), where the
    layer would otherwise take its eager path, which the mode cannot see."""
    from torch.utils.flop_counter import FlopCounterMode

    from spio.layers import make_conv2d

    monkeypatch.setenv("SPIO_EMULATE", "1")
    layer = make_conv2d(16, 16, (3, 5), padding=(1, 2), groups=2).half()
    x = torch.randn(2, 16, 6, 7).half()
    forward = 2 * 2 * 16 * 6 * 7 * 8 * 3 * 5
    for needs_input, expected_passes in ((True, 2), (False, 1)):
        with FlopCounterMode(display=False) as counter:
            layer(x.clone().requires_grad_(needs_input)).float().sum().backward()
        counts = counter.get_flop_counts()["Global"]
        assert counts[torch.ops.spio.conv2d_gw8] == forward
        assert counts[torch.ops.spio.conv2d_gw8_backward] == expected_passes * forward
    layer.weight.requires_grad_(False)  # the bias alone: a sum, no pass
    with FlopCounterMode(display=False) as counter:
        layer(x).float().sum().backward()
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.spio.conv2d_gw8_backward] == 0 and layer.bias.grad is not None
    conv = torch.nn.Conv2d(16, 16, (3, 5), padding=(1, 2), groups=2).double()
    with FlopCounterMode(display=False) as counter:
        conv(x.double())
    assert counter.get_total_flops() == forward


def test_the_op_refuses_forward_mode_tangents_instead_of_dropping_them():
    """PyTorch runs no forward-mode formula for a custom op: a dual operand's tangent would be
    lost silently. Operands without a tangent inside a dual level still run."""
    import torch.autograd.forward_ad as fwAD

    x, w = torch.randn(2, 16, 6, 6), torch.randn(16, 8, 3, 3)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match="forward-mode AD .a tensor has a tangent"):
            conv2d_gw8(dual, w, None, 1, 1, 1)
        with pytest.raises(RuntimeError, match="cannot run forward-mode AD"):
            conv2d_gw8(x, fwAD.make_dual(w, torch.randn_like(w)), None, 1, 1, 1)
        y = conv2d_gw8(x, w, None, 1, 1, 1)
    torch.testing.assert_close(y, F.conv2d(x, w, None, 1, 1, 1, 2))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("transform", ["jvp", "grad", "vjp", "jacrev"])
def test_the_op_refuses_torch_func_derivatives_instead_of_a_zero_tangent(transform, compiled):
    """Under torch.func.jvp the generated autograd kernel ran the op below autograd and the
    tangent came back as zeros; under grad, vjp and jacrev PyTorch failed with an error about
    setup_context. Both now raise spio's error, pointing to the module and F.conv2d. Under
    torch.compile too, where the jvp's tangent had still come back as zeros (the check was
    skipped while compiling, also where the op's autograd kernel runs in AOTAutograd's trace)."""
    x, w = torch.randn(2, 16, 6, 6), torch.randn(16, 8, 3, 3)

    def f(x):
        return conv2d_gw8(x, w, None, 1, 1, 1)

    call = {
        "jvp": lambda: torch.func.jvp(f, (x,), (torch.ones_like(x),)),
        "grad": lambda: torch.func.grad(lambda x: f(x).sum())(x),
        "vjp": lambda: torch.func.vjp(f, x),
        "jacrev": lambda: torch.func.jacrev(lambda x: f(x).sum())(x),
    }[transform]
    kind = "jvp" if transform == "jvp" else "grad"
    if compiled:
        torch._dynamo.reset()
        call = torch.compile(call, backend="aot_eager")
    with pytest.raises(RuntimeError, match=f"cannot run inside torch.func's {kind} transform"):
        call()
    if compiled:
        return
    # The backward op too (a jvp through a gradient: a Hessian-vector product).
    y = torch.randn(2, 16, 6, 6)
    with pytest.raises(RuntimeError, match="spio::conv2d_gw8_backward cannot run inside"):
        torch.func.jvp(
            lambda w: conv2d_gw8_backward(y, x, w, 1, 1, [True, False, False])[0],
            (w,),
            (torch.ones_like(w),),
        )


def test_emulated_autocast_hands_the_kernels_an_fp32_bias(monkeypatch):
    """Under autocast the op casts input and weight to the region's dtype but the bias to fp32,
    which the kernels add unrounded: the same bits as calling it with those operands."""
    monkeypatch.setenv("SPIO_EMULATE", "1")
    x, w, b = _tensors(SHAPES[0], dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv2d_gw8(x, w, b, padding_y=1, padding_x=1)
    expected = conv2d_gw8(x.bfloat16(), w.bfloat16(), b, padding_y=1, padding_x=1)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, expected)


def test_image_bytes_counts_the_larger_of_input_and_output():
    from spio.functional import _kernels

    # Padding 2 around a 1x1 filter: the 6x6 output is larger than the 2x2 input.
    grows = Conv2dGw8Params(1, 8, 2, 2, padding=(2, 2), r=1, s=1)
    assert _kernels.image_bytes(grows) == 8 * 6 * 6 * 2
    shrinks = Conv2dGw8Params(1, 8, 6, 6, padding=(0, 0), r=5, s=5)
    assert _kernels.image_bytes(shrinks) == 8 * 6 * 6 * 2


def test_custom_op_parameters_are_annotated_in_forms_torch_2_6_reads():
    """pyproject asks for torch>=2.6, whose torch.library.infer_schema takes typing.List[bool]
    but refuses list[bool]: with that annotation spio did not import there. The suite ran on
    torch 2.6 once (docs/verification.md); this keeps the ops' parameters to the forms it read:
    no builtin generic anywhere in an annotation (`list[int] | None` included)."""
    import inspect
    import re

    from spio.functional import conv2d_gw8_op

    builtin_generic = re.compile(r"\b(?:list|dict|tuple|set)\[")
    for op in (conv2d_gw8_op.conv2d_gw8, conv2d_gw8_op.conv2d_gw8_backward):
        for name, parameter in inspect.signature(op._init_fn).parameters.items():
            annotation = str(parameter.annotation)
            assert not builtin_generic.search(annotation), (op, name, annotation)


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_outputs_are_laid_out_as_pytorch_lays_them_out(monkeypatch, emulate):
    """Views of NHWC tensors (crops, channel slices, strided rows or images) are not NHWC-
    contiguous, yet PyTorch's convolution gives them channels_last outputs by their stride
    order; spio gave them NCHW ones (a channels_last model turned NCHW after a crop)."""
    import spio.functional
    from spio.layers import Conv2dGw8

    monkeypatch.setenv("SPIO_EMULATE", emulate)
    gen = torch.Generator().manual_seed(0)
    nhwc = torch.randn(2, 16, 8, 8, generator=gen).half().to(memory_format=torch.channels_last)
    nchw = torch.randn(2, 16, 8, 8, generator=gen).half()
    views = {
        "crop": nhwc[:, :, 1:7, 1:7], "channels": nhwc[:, :8], "rows": nhwc[:, :, ::2],
        "images": nhwc[::2], "nchw-crop": nchw[:, :, 1:7, 1:7], "transposed": nchw.mT,
    }  # fmt: skip
    w = torch.randn(16, 8, 3, 3, generator=gen)
    for name, view in views.items():
        c = view.shape[1]
        want = F.conv2d(view.double(), w[:c].double(), None, 1, 1, 1, c // 8)
        layer = Conv2dGw8(c, c, 3, padding=1, groups=c // 8, bias=False).half()
        layer.weight.data.copy_(w[:c])
        x = view  # of half tensors: .half() would copy a view, laid out NHWC
        for how, y in [
            ("op", conv2d_gw8(x, w[:c].half(), None, 1, 1, 1, 1, c // 8)),
            ("function", spio.functional.conv2d_gw8(x, w[:c].half(), None, 1, 1, 1, 1, c // 8)),
            ("layer", layer(x)),
        ]:
            assert y.stride() == want.stride(), (name, how)
            torch.testing.assert_close(y.double(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_outputs_and_input_grads_take_the_layout_pytorch_reads_from_input_and_weight(
    monkeypatch, emulate
):
    """PyTorch's convolution gives channels_last outputs and input gradients when the input or
    the weight is laid out NHWC, reading a layout from strides in suggest_memory_format's order:
    spio had looked at the input alone (an NCHW input under a channels_last weight got NCHW),
    and counted an NHWC-contiguous input whose size-1 dims break NHWC's stride order as NHWC."""
    from spio.layers import Conv2dGw8

    monkeypatch.setenv("SPIO_EMULATE", emulate)
    gen = torch.Generator().manual_seed(0)
    cl = torch.channels_last
    nchw = torch.randn(2, 8, 1, 5, generator=gen).half()
    weight = torch.randn(8, 8, 3, 3, generator=gen).half()
    # NHWC-contiguous, but the size-1 H dim's stride (1) is below W's span: NCHW by stride order.
    size_one = torch.randn(2, 5, 8, 1, generator=gen).half().permute(0, 2, 3, 1)
    assert size_one.is_contiguous(memory_format=cl)
    cases = {
        "nchw input, nhwc weight": (nchw, weight.to(memory_format=cl)),
        "nhwc input, nchw weight": (nchw.to(memory_format=cl), weight),
        "nchw input, nchw weight": (nchw, weight),
        "size-1 dims out of nhwc order": (size_one, weight),
    }
    for name, (x, w) in cases.items():
        xr = x.double().requires_grad_()
        want = F.conv2d(xr, w.double(), None, 1, 1, 1, 1)
        dy = torch.randn(want.shape, generator=gen)
        (want_dx,) = torch.autograd.grad(want, xr, dy)
        layer = Conv2dGw8(8, 8, 3, padding=1, bias=False).half()
        layer.weight.data = w
        calls = {
            "op": lambda t, w=w: conv2d_gw8(t, w, None, 1, 1, 1, 1, 1),
            "function": lambda t, w=w: public_conv2d_gw8(t, w, None, 1, 1, 1, 1, 1),
            "layer": layer,
        }
        for how, call in calls.items():
            xs = x.detach().requires_grad_()
            y = call(xs)
            (dx,) = torch.autograd.grad(y, xs, dy.half())
            assert (y.stride(), dx.stride()) == (want.stride(), want_dx.stride()), (name, how)
            torch.testing.assert_close(y.double(), want, atol=1e-2, rtol=1e-2)
        if emulate == "0":  # the fake impls promise the real strides
            torch.library.opcheck(conv2d_gw8, (x, w, None, 1, 1, 1, 1, 1))


def test_memory_format_reads_strides_as_pytorch_does():
    """spio reads a layout from strides on every call, by hand (PyTorch's C++ rule has no cheap
    Python entry): on random strided views with elements it agrees with PyTorch's Python copy
    of the rule."""
    from spio.functional.checks import conv_format, memory_format

    suggest = pytest.importorskip("torch._prims_common").suggest_memory_format
    rng = random.Random(0)
    storage = torch.empty(40000)
    # torch 2.6's Python copy weighed a dimension's size only where its stride passed 1, unlike
    # the C++ rule (F.conv2d's output is contiguous for this view there too) and later copies.
    if suggest(storage.as_strided([1, 3, 2, 1], [16, 1, 8, 1])) != torch.contiguous_format:
        pytest.skip(f"torch {torch.__version__}'s Python copy of the rule differs from its C++")
    weight = torch.empty(8, 8, 3, 3)
    for _ in range(20000):
        shape = [rng.choice([1, 1, 2, 3, 8]) for _ in range(4)]
        stride = [rng.choice([0, 1, 2, 3, 6, 8, 16, 24, 48, 64, 96, 200, 1000]) for _ in range(4)]
        t = storage.as_strided(shape, stride)
        assert memory_format(t) == suggest(t), (shape, stride)
        assert conv_format(t, weight) == suggest(t), (shape, stride)  # an NCHW weight
        assert conv_format(weight, t) == suggest(t), (shape, stride)  # an NCHW input


def test_dgrad_of_a_layer_with_bias_is_given_the_layer_its_kernel_was_made_for(monkeypatch):
    """DGrad runs the bias-free layer's kernel: given the layer with its bias, the kernel's check
    of its layer fell to comparing every field but the bias, 2 us a call on this CPU against
    0.2 for the identical layer and 0.5 for an equal one."""
    from spio.kernels import conv2d_gw8_factory

    monkeypatch.setenv("SPIO_EMULATE", "1")
    real, given = conv2d_gw8_factory.check_layer, []

    def recording(kernel, params, pass_):
        if kernel.info_value("igrad"):
            given.append((kernel.info_value("params"), params))
        return real(kernel, params, pass_)

    monkeypatch.setattr(conv2d_gw8_factory, "check_layer", recording)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 5, 4, generator=gen).half().requires_grad_()
    w = torch.randn(8, 8, 3, 3, generator=gen).half().requires_grad_()
    b = torch.randn(8, generator=gen).half().requires_grad_()
    for call in (public_conv2d_gw8, conv2d_gw8):
        y = call(x, w, b, 1, 1, 1, 1, 1)
        (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
        xr = x.detach().double().requires_grad_()
        want = F.conv2d(xr, w.double(), b.double(), 1, 1)
        (want_dx,) = torch.autograd.grad(want, xr, torch.ones_like(want))
        torch.testing.assert_close(dx.double(), want_dx, atol=1e-2, rtol=1e-2)
    assert len(given) == 2
    assert all(made_for == params and not params.has_bias for made_for, params in given)


def test_errors_under_dynamic_shapes_name_values_not_symbols():
    """Compiled with dynamic shapes, sizes are symbols while the op's checks run: an error said
    "needs filter R in 1..5, got s6", or an output size of "0xs0 - s49 + 3". It names the values
    this call has."""
    import spio.functional

    def f(x, w):
        return spio.functional.conv2d_gw8(x, w, None, 1, 1, 1, 1, 2)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)
    cases = [
        ((1, 16, 8, 8), (16, 8, 6, 3), "needs filter R in 1..5, got 6"),
        ((1, 16, 2, 3), (16, 8, 5, 5), "got output size 0x1 for input 2x3, filter 5x5, padding"),
        ((1, 16, 8, 8), (24, 8, 3, 3), "got C=16 (input.shape[1]) and K=24 (weight.shape[0])"),
    ]
    for x_shape, w_shape, said in cases:
        with pytest.raises(Exception, match=re.escape(said)):
            compiled(torch.randn(x_shape), torch.randn(w_shape))
    torch._dynamo.reset()


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_the_backward_op_names_an_operand_that_is_not_a_tensor(monkeypatch, emulate):
    """Its schema lets None through: None for grad_output or input ended in an AttributeError
    (".shape", ".device"), and None for the weight in one where the kernels run."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    x = torch.randn(1, 16, 6, 6, dtype=torch.float16)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float16)
    dy = torch.randn(1, 16, 6, 6, dtype=torch.float16)
    for i, name in enumerate(("grad_output", "input", "weight")):
        args = [dy, x, w]
        args[i] = None
        for backward in (conv2d_gw8_backward, torch.ops.spio.conv2d_gw8_backward):
            with pytest.raises(TypeError) as error:
                backward(*args, 1, 1, [True, True, True])
            assert (
                str(error.value) == f"conv2d_gw8_backward needs {name} to be a tensor, got NoneType"
            )


def test_the_backward_ops_fake_names_an_operand_that_is_not_a_tensor():
    """Under a FakeTensorMode (torch.compile's tracing) the op runs its fake implementation,
    which had ended in an AttributeError for None too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(1, 16, 6, 6, dtype=torch.float16)
        w = torch.randn(16, 8, 3, 3, dtype=torch.float16)
        with pytest.raises(TypeError) as error:
            torch.ops.spio.conv2d_gw8_backward(None, x, w, 1, 1, [True, True, True])
    assert str(error.value) == "conv2d_gw8_backward needs grad_output to be a tensor, got NoneType"


@pytest.mark.parametrize("emulate", ["0", "1"])
def test_paddings_past_pytorchs_limit_are_named(monkeypatch, emulate):
    """Past int64 the op's schema failed unnamed ("Expected a value of type 'int' ... found type
    'int'"), and where the kernels run PyTorch's fallback convolution with a C++ overflow."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)
    x = torch.randn(1, 16, 6, 6, dtype=torch.float16)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float16)
    limit = r"^conv2d_gw8 needs padding at most 4611686018427387903, "
    with pytest.raises(ValueError, match=limit + r"got \(4611686018427387904, 0\)$"):
        public_conv2d_gw8(x, w, None, 1, 2**62, 0)
    with pytest.raises(ValueError, match=r"^conv2d_gw8 needs padding(_y within int64| at most)"):
        public_conv2d_gw8(x, w, None, 1, 2**70, 0)
