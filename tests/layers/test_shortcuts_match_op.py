"""Conv2dGw8 takes shortcuts past the custom op in plain eager mode: the kernels called directly
(`conv2d_gw8_eager`) and, on devices without kernels, PyTorch's convolution called directly. A
compiled or traced model takes the op. Both ways must give the same outcome for the same call:
the same bits in the output and gradients, or the same error. Each case here runs a layer twice,
once as it runs and once with the shortcuts off, and compares the two: over a grid of operand
dtypes, autocast regions, emulated kernels or none and layouts, and over one of what requires
grad, grad modes and layer shapes. The public function spio.functional.conv2d_gw8 takes the
kernel shortcut too; its cases (below) compare it with the op the same way, arguments included,
but for arguments of the wrong type: those are the function's own TypeError."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

import spio.layers.conv2d_gw8 as layer_module
from spio.layers import Conv2dGw8
from tests.conftest import spy_on_launches

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
           "fp64": torch.float64, "int64": torch.int64}  # fmt: skip

# (input, weight, bias) dtypes: None for no bias, "=" for the input's dtype.
_OPERANDS = [
    *itertools.product(["fp16", "bf16", "fp32", "fp64"], ["="], [None, "=", "fp32"]),
    ("fp16", "fp32", None),
    ("fp32", "fp16", "fp32"),
    ("bf16", "fp64", None),
    ("fp32", "=", "fp64"),
    ("fp16", "int64", None),
    ("bf16", "=", "int64"),
    ("int64", "=", None),
]


_HALF = (torch.float16, torch.bfloat16)
_ROUNDING = {
    torch.float32: {"rtol": 1.3e-6, "atol": 1e-5},
    torch.float64: {"rtol": 1e-7, "atol": 1e-7},
}


def _ids(operands: tuple) -> str:
    return "-".join(map(str, operands))


def _outcome(layer: Conv2dGw8, x: torch.Tensor) -> tuple:
    """("raised", type, message), or ("ran", output, {name: gradient}) with the gradients of x
    and of the parameters that require grad (none if the output does not), from a backward of
    a fixed dy."""
    return _call_outcome(lambda: layer(x), x, layer.weight, layer.bias)


def _call_outcome(call, x, weight, bias) -> tuple:
    """_outcome of `call()`, a convolution of x, weight and bias."""
    try:
        y = call()
        leaves = {
            name: t
            for name, t in (("input", x), ("weight", weight), ("bias", bias))
            if isinstance(t, torch.Tensor) and t.requires_grad and y.requires_grad
        }
        dy = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape).to(y.dtype)
        grads = torch.autograd.grad(y, list(leaves.values()), dy) if leaves else ()
    except (RuntimeError, ValueError, TypeError) as error:
        return ("raised", type(error), str(error))
    return ("ran", y, dict(zip(leaves, grads, strict=True)))


def _difference(a: tuple, b: tuple, rounded: str | None = None) -> str | None:
    """How two outcomes differ, or None. Gradients' strides may differ (PyTorch's convolution
    gives a channels_last input a channels_last weight gradient, the op a contiguous one):
    autograd lays a leaf's .grad out as the leaf is laid out either way. The tensor named
    `rounded` need only agree to within its dtype's rounding (torch.testing's tolerance)."""
    if a[0] == b[0] == "raised":
        return None if a == b else f"{a[1:]} against {b[1:]}"
    if a[0] != b[0]:
        return f"{a[0]} against {b[0]}: {a[1:] if a[0] == 'raised' else b[1:]}"
    if a[2].keys() != b[2].keys():
        return f"gradients of {list(a[2])} against {list(b[2])}"
    for name in ["output", *a[2]]:
        s, t = (a[1], b[1]) if name == "output" else (a[2][name], b[2][name])
        if s.dtype != t.dtype or (name == "output" and s.stride() != t.stride()):
            return f"{name}: {s.dtype} {s.stride()} against {t.dtype} {t.stride()}"
        if name == rounded and torch.allclose(s, t, **_ROUNDING[s.dtype]):
            continue
        if not torch.equal(s, t):
            return f"{name}: values differ by up to {(s.double() - t.double()).abs().max().item()}"
    return None


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("autocast", [None, "bf16", "fp16"])
@pytest.mark.parametrize("emulate", ["0", "1"])
@pytest.mark.parametrize("operands", _OPERANDS, ids=_ids)
def test_shortcuts_and_the_custom_op_agree(monkeypatch, operands, emulate, autocast, channels_last):
    """Every dtype of input, weight and bias, with and without autocast and kernels."""
    layer, x = _operands(*operands)
    if channels_last:
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_(x.requires_grad)
    _compare(monkeypatch, layer, x, emulate, autocast)


@pytest.mark.parametrize("autocast", [None, "bf16"])
@pytest.mark.parametrize("emulate", ["0", "1"])
@pytest.mark.parametrize(
    "operands", [("fp16", "=", "fp32"), ("bf16", "=", None), ("fp32", "=", "=")], ids=_ids
)
@pytest.mark.parametrize(
    "situation",
    ["frozen-weight", "frozen-input", "no-grad", "inference-mode", "unbatched", "deterministic",
     "padding-2-0", "filter-1x5", "wrong-channels"],
)  # fmt: skip
def test_shortcuts_and_the_custom_op_agree_in_every_situation(
    monkeypatch, situation, operands, emulate, autocast
):
    """What requires grad, grad mode, unbatched inputs, deterministic algorithms, padding and
    filter shape, for a few operand dtypes; an input of the wrong channel count (the kernel
    shortcut blamed C != K, for it had not passed the layer's groups on)."""
    shape = (1, 5) if situation == "filter-1x5" else (3, 3)
    padding = (2, 0) if situation == "padding-2-0" else 1
    layer, x = _operands(*operands, shape=shape, padding=padding)
    if situation == "frozen-weight":
        layer.weight.requires_grad_(False)
    if situation == "frozen-input":
        x.requires_grad_(False)
    if situation == "unbatched":
        x = x[0].detach().requires_grad_()
    if situation == "wrong-channels":
        x = torch.cat([x, x[:, :8]], 1).detach().requires_grad_(x.requires_grad)
    if situation == "deterministic":
        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    grad_mode = {"no-grad": torch.no_grad, "inference-mode": torch.inference_mode}.get(situation)
    _compare(monkeypatch, layer, x, emulate, autocast, grad_mode)


def _operands(x_name, w_name, b_name, shape=(3, 3), padding=1):
    """A layer with weight and bias of these dtypes ("=": the input's; None: no bias) and an
    input of 2 images that requires grad if it can."""
    x_dtype = _DTYPES[x_name]
    w_dtype = x_dtype if w_name == "=" else _DTYPES[w_name]
    b_dtype = None if b_name is None else x_dtype if b_name == "=" else _DTYPES[b_name]
    torch.manual_seed(0)
    layer = Conv2dGw8(16, 16, shape, padding=padding, groups=2, bias=b_dtype is not None)
    for name, dtype in (("weight", w_dtype), ("bias", b_dtype)):
        if dtype is None:
            continue
        t = getattr(layer, name).detach()
        t = (t * 8).round() if not dtype.is_floating_point else t
        setattr(layer, name, torch.nn.Parameter(t.to(dtype), requires_grad=dtype.is_floating_point))
    torch.manual_seed(1)
    x = torch.randn(2, 16, 5, 6).to(x_dtype).requires_grad_(x_dtype.is_floating_point)
    return layer, x


def _compare(monkeypatch, layer, x, emulate: str, autocast: str | None, grad_mode=None) -> None:
    """Runs `layer` on `x` with its shortcuts and then through the op, under autocast to
    `autocast` if given and in `grad_mode` (a context manager) if given, and asserts the same
    outcome and, where it ran, the same convolution kernels, all of them ones spio.precompile
    builds; with SPIO_EMULATE=1 and a half-precision output, those of all three passes."""
    monkeypatch.setenv("SPIO_EMULATE", emulate)

    @contextlib.contextmanager
    def region():
        with (
            torch.autocast("cpu", dtype=_DTYPES[autocast or "bf16"], enabled=bool(autocast)),
            grad_mode() if grad_mode else contextlib.nullcontext(),
        ):
            yield

    def run() -> tuple:
        with region():
            return _outcome(layer, x)

    launched = spy_on_launches(monkeypatch, names=True)
    shortcut = run()
    shortcut_launched = launched[:]
    launched.clear()
    monkeypatch.setattr(layer_module, "eager_path_applies", lambda *args: False)
    through_op = run()
    # Without kernels, fp32 and float64 outside autocast: the shortcut's bias gradient is
    # PyTorch's convolution backward's, the op's a sum over dy, each in the dtype, summed in
    # their own orders.
    full = (torch.float32, torch.float64)
    reference = emulate == "0" and autocast is None and x.dtype in full
    difference = _difference(shortcut, through_op, "bias" if reference else None)
    assert difference is None, difference
    if shortcut[0] == "raised":
        return
    # The same kernels but for the sum over WGrad's partial sums, which the eager path makes
    # write the weight's dtype and the op fp32 (its gradients' dtype); spio.precompile builds
    # every kernel of both.
    assert _convolutions(shortcut_launched) == _convolutions(launched)
    with region():
        precompiled = {kernel.name for kernel in layer.spio_kernels(x)}
    assert set(shortcut_launched) | set(launched) <= precompiled
    if emulate == "1" and shortcut[1].dtype in _HALF:
        families = {name.split("__")[0] for name in _convolutions(launched)}
        expected = {"conv2d_gw8_fprop"}
        if shortcut[2].get("input") is not None:
            expected.add("conv2d_gw8_dgrad")
        if shortcut[2].get("weight") is not None:
            expected.add("conv2d_gw8_wgrad")
        assert families == expected


def _convolutions(names: list[str]) -> list[str]:
    return [name for name in names if not name.startswith("sum_slots")]


# The public function spio.functional.conv2d_gw8 against the op it stands for.


@pytest.fixture
def op_calls(monkeypatch):
    """The public function's calls of the custom op, counted (the calls still run)."""
    import spio.functional.eager as eager_module

    calls = []
    op = eager_module.conv2d_gw8_op

    def counted(*args, **kwargs):
        calls.append(args)
        return op(*args, **kwargs)

    monkeypatch.setattr(eager_module, "conv2d_gw8_op", counted)
    return calls


def _compare_function(monkeypatch, op_calls, x, weight, bias, args, autocast=None, grad_mode=None):
    """Calls spio.functional.conv2d_gw8 and then the op on the same operands (emulated kernels,
    under autocast to `autocast` if given, in `grad_mode` if given) and asserts the same outcome;
    returns it. Asserts too that the function ran without the op where its arguments are ints
    and its operands tensors, so that the comparison compares two paths (else it calls the op)."""
    from spio.functional import conv2d_gw8
    from spio.functional.conv2d_gw8_op import conv2d_gw8 as op

    monkeypatch.setenv("SPIO_EMULATE", "1")

    def run(fn) -> tuple:
        with (
            torch.autocast("cpu", dtype=_DTYPES[autocast or "bf16"], enabled=bool(autocast)),
            grad_mode() if grad_mode else contextlib.nullcontext(),
        ):
            return _call_outcome(lambda: fn(x, weight, bias, *args), x, weight, bias)

    launched = spy_on_launches(monkeypatch, names=True)
    function = run(conv2d_gw8)
    function_launched = launched[:]
    launched.clear()
    # The shortcut is for int arguments and tensor operands, the only ones here of the right
    # types. Arguments of the wrong type (not a tensor; a float, a bool or a tuple for an int)
    # are the function's TypeError, before the op, whose schema raises a RuntimeError for
    # some and takes bools as ints.
    if not all(isinstance(t, torch.Tensor) for t in (x, weight)) or any(
        type(a) is not int for a in args
    ):
        assert function[:2] == ("raised", TypeError) and not op_calls, function
        return function
    assert not op_calls, f"calls of the op: {len(op_calls)}"
    through_op = run(op)
    difference = _difference(function, through_op)
    assert difference is None, difference
    assert _convolutions(function_launched) == _convolutions(launched)
    return function


@pytest.mark.parametrize("autocast", [None, "bf16", "fp16"])
@pytest.mark.parametrize("operands", _OPERANDS, ids=_ids)
def test_the_public_function_and_the_custom_op_agree(monkeypatch, op_calls, operands, autocast):
    """Every dtype of input, weight and bias, with and without autocast (kernels emulated)."""
    layer, x = _operands(*operands)
    x = x.detach().to(memory_format=torch.channels_last).requires_grad_(x.requires_grad)
    _compare_function(monkeypatch, op_calls, x, layer.weight, layer.bias, (1, 1, 1, 1, 2), autocast)


_ARGUMENTS = {  # (stride, padding_y, padding_x, dilation, groups, passes)
    "defaults-but-padding": (1, 1, 1),
    "groups-1-implied": (1, 1, 1, 1, 1),
    "padding-2-0": (1, 2, 0, 1, 2),
    "passes-fprop-wgrad": (1, 1, 1, 1, 2, 5),
    "passes-dgrad": (1, 1, 1, 1, 2, 2),
    "passes-none": (1, 1, 1, 1, 2, 0),
    "stride-2": (2, 1, 1, 1, 2),
    "dilation-2": (1, 1, 1, 2, 2),
    "groups-3": (1, 1, 1, 1, 3),
    "padding-negative": (1, -1, 1, 1, 2),
    "passes-8": (1, 1, 1, 1, 2, 8),
    "passes-negative": (1, 1, 1, 1, 2, -1),
    "stride-float": (1.0, 1, 1, 1, 2),
    "padding-bool": (1, True, 1, 1, 2),
    "groups-tuple": (1, 1, 1, 1, (2,)),
}


@pytest.mark.parametrize("arguments", list(_ARGUMENTS), ids=str)
def test_the_public_function_and_the_custom_op_agree_on_every_argument(
    monkeypatch, op_calls, arguments
):
    """The same results for the arguments spio takes, the same errors for those it refuses
    (but for arguments of the wrong type: the function's TypeError)."""
    layer, x = _operands("fp16", "=", "fp32")
    args = _ARGUMENTS[arguments]
    outcome = _compare_function(monkeypatch, op_calls, x, layer.weight, layer.bias, args)
    refused = arguments.split("-")[0] in ("stride", "dilation") or arguments in (
        "groups-3",
        "padding-negative",
        "passes-8",
        "passes-negative",
        "groups-tuple",
        "stride-float",
        "padding-bool",
    )  # fmt: skip (a bool padding is an int to the op's schema, but not to F.conv2d)
    assert (outcome[0] == "raised") == refused, outcome[:3]


@pytest.mark.parametrize(
    "situation", ["frozen-weight", "frozen-input", "no-grad", "inference-mode", "unbatched",
                  "no-bias", "bias-wrong-length", "weight-none", "input-list"],
)  # fmt: skip
def test_the_public_function_and_the_custom_op_agree_in_every_situation(
    monkeypatch, op_calls, situation
):
    layer, x = _operands("bf16", "=", "fp32")
    weight, bias = layer.weight, layer.bias
    if situation == "frozen-weight":
        weight.requires_grad_(False)
    if situation == "frozen-input":
        x.requires_grad_(False)
    if situation == "unbatched":
        x = x[0].detach().requires_grad_()
    if situation == "wrong-channels":
        x = torch.cat([x, x[:, :8]], 1).detach().requires_grad_(x.requires_grad)
    if situation == "no-bias":
        bias = None
    if situation == "bias-wrong-length":
        bias = torch.nn.Parameter(torch.zeros(8))
    if situation == "weight-none":
        weight = None
    if situation == "input-list":
        x = x.tolist()
    grad_mode = {"no-grad": torch.no_grad, "inference-mode": torch.inference_mode}.get(situation)
    outcome = _compare_function(monkeypatch, op_calls, x, weight, bias, (1, 1, 1, 1, 2), None,
                                grad_mode)  # fmt: skip
    refused = situation in ("unbatched", "bias-wrong-length", "weight-none", "input-list")
    assert (outcome[0] == "raised") == refused, outcome[:3]


def test_the_public_function_calls_the_op_where_something_must_see_it(monkeypatch, op_calls):
    """torch.compile, jit tracing, torch.func.vmap, a dispatch mode and CPU tensors without the
    emulator get the op (whose registrations they need); forward-mode AD gets its refusal."""
    import torch.autograd.forward_ad as fwAD
    from torch.utils.flop_counter import FlopCounterMode

    from spio.functional import conv2d_gw8

    monkeypatch.setenv("SPIO_EMULATE", "1")
    layer, x = _operands("fp16", "=", None)
    w = layer.weight.detach()
    x = x.detach()
    want = conv2d_gw8(x, w, None, 1, 1, 1, 1, 2)
    assert op_calls == []

    def f(t):
        return conv2d_gw8(t, w, None, 1, 1, 1, 1, 2)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, backend=backend, fullgraph=True)(x), want)
    assert "spio.conv2d_gw8" in graphs[0], graphs
    calls = len(op_calls)  # (compiled code calls the op itself, not through the function)
    traced = torch.jit.trace(f, (x,), check_trace=False)
    assert "spio::conv2d_gw8" in str(traced.graph) and len(op_calls) == calls + 1
    assert torch.equal(torch.func.vmap(f)(x.unsqueeze(0))[0], want)
    assert len(op_calls) == calls + 2
    with FlopCounterMode(display=False) as counter:
        f(x)
    assert counter.get_total_flops() > 0 and len(op_calls) == calls + 3
    calls = len(op_calls)
    monkeypatch.setenv("SPIO_EMULATE", "0")
    x32, w32 = x.float(), w.float()
    torch.testing.assert_close(conv2d_gw8(x32, w32, None, 1, 1, 1, 1, 2), want.float(),
                               atol=0.05, rtol=0.01)  # fmt: skip
    assert len(op_calls) == calls + 1
    monkeypatch.setenv("SPIO_EMULATE", "1")
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match="forward-mode AD"):
            conv2d_gw8(dual, w, None, 1, 1, 1, 1, 2)


def test_a_scripted_call_of_the_public_function_is_the_op(tmp_path):
    """torch.jit.script compiles a call of spio.functional.conv2d_gw8 as the op (not a call back
    into Python), so the scripted module saves and loads."""
    from spio.functional import conv2d_gw8

    class Model(torch.nn.Module):
        def forward(self, x, w):
            return conv2d_gw8(x, w, None, 1, 1, 1, 1, 2) + conv2d_gw8(x, w, padding_y=1,
                                                                      padding_x=1)  # fmt: skip

    scripted = torch.jit.script(Model())
    assert "ops.spio.conv2d_gw8(" in scripted.code
    torch.jit.save(scripted, tmp_path / "model.pt")
    loaded = torch.jit.load(tmp_path / "model.pt")
    x, w = torch.randn(1, 16, 4, 5), torch.randn(16, 8, 3, 3)
    torch.testing.assert_close(loaded(x, w), Model()(x, w))
