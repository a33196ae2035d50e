"""torch.onnx.export of models with spio's layers and calls: they export as ONNX Conv nodes
(spio's op has no ONNX translation), with both of PyTorch's exporters, and the exported model
computes what the PyTorch model does (onnxruntime)."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import spio
import spio.functional
from spio.functional.onnx_export import onnx_exporting
from spio.layers import Conv2dGw8

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

#: The dynamo-based exporter (torch 2.13's default) needs onnxscript, and torch
#: 2.7 or later: torch 2.6's does not tell the model it is exporting (is_in_onnx_export).
_DYNAMO = pytest.mark.skipif(
    torch.torch_version.TorchVersion(torch.__version__) < (2, 7),
    reason="torch 2.6's dynamo exporter does not set is_in_onnx_export",
)
EXPORTERS = [
    pytest.param(True, id="dynamo", marks=_DYNAMO),
    pytest.param(False, id="torchscript"),
]


class _Net(nn.Module):
    """Two eligible nn.Conv2d (one 1x5 without bias), a call of the function, an ineligible
    conv (stride 2) between them."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.b = nn.Conv2d(16, 16, (1, 5), padding=(0, 2), groups=2, bias=False)
        self.down = nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=2)
        self.w = nn.Parameter(torch.randn(16, 8, 3, 2) / 6)
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        y = spio.functional.conv2d_gw8(y, self.w, self.bias, padding_y=1, padding_x=0)
        return self.down(y)


def _export(model, args, path, dynamo, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation warning
        torch.onnx.export(model, args, str(path), dynamo=dynamo, **kwargs)
    return onnx.load(str(path))


def _run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_a_transformed_model_exports_as_onnx_convs(tmp_path, dynamo):
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = spio.transform(_Net()).eval()
    assert isinstance(model.a, Conv2dGw8) and isinstance(model.b, Conv2dGw8)
    x = torch.randn(2, 16, 9, 7)
    graph = _export(model, (x,), tmp_path / "net.onnx", dynamo).graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("Conv") == 4, ops
    assert all(node.domain in ("", "ai.onnx") for node in graph.node), ops
    convs = [node for node in graph.node if node.op_type == "Conv"]
    groups = [next(a.i for a in node.attribute if a.name == "group") for node in convs]
    assert groups == [2, 2, 2, 2]
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(_run(tmp_path / "net.onnx", x), expected, atol=1e-5, rtol=1e-5)


@_DYNAMO
def test_the_export_keeps_a_dynamic_batch_size(tmp_path):
    pytest.importorskip("onnxscript")
    torch.manual_seed(1)
    model = spio.transform(_Net()).eval()
    batch = torch.export.Dim("batch")
    x = torch.randn(2, 16, 9, 7)
    _export(model, (x,), tmp_path / "net.onnx", True, dynamic_shapes=({0: batch},))
    x5 = torch.randn(5, 16, 9, 7)
    with torch.no_grad():
        expected = model(x5)
    torch.testing.assert_close(_run(tmp_path / "net.onnx", x5), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_layers_that_run_kernels_export_as_onnx_convs(monkeypatch, tmp_path, dynamo):
    """fp16 layers on a device that runs spio's kernels (the emulator here, as a GPU would)."""
    if dynamo:
        pytest.importorskip("onnxscript")
    monkeypatch.setenv("SPIO_EMULATE", "1")
    model = nn.Sequential(Conv2dGw8(16, 16, 3, padding=1, groups=2), nn.ReLU()).half().eval()
    x = torch.randn(1, 16, 6, 5).half()
    graph = _export(model, (x,), tmp_path / "half.onnx", dynamo).graph
    assert [node.op_type for node in graph.node] == ["Conv", "Relu"]


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_model_exports_under_autocast(tmp_path, dynamo, dtype):
    """Under autocast the operands are cast as the op's autocast kernel casts them (a layer
    after another autocast op gets a half-precision input beside its fp32 weight), and the
    export computes what the model does there (fp16 through onnxruntime; it has no bf16 Conv
    on the CPU)."""
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.manual_seed(6)
    model = spio.transform(_Net()).eval()
    x = torch.randn(2, 16, 9, 7)
    with torch.autocast("cpu", dtype=dtype):
        graph = _export(model, (x,), tmp_path / "ac.onnx", dynamo).graph
        with torch.no_grad():
            expected = model(x)
    assert [node.op_type for node in graph.node].count("Conv") == 4
    if dtype == torch.float16:
        got = _run(tmp_path / "ac.onnx", x)
        assert got.dtype == expected.dtype == torch.float16
        torch.testing.assert_close(got, expected, atol=2e-3, rtol=2e-3)


def test_an_export_refuses_what_the_function_refuses(monkeypatch, tmp_path):
    """The exported call checks its arguments as the op does: a stride of 2 is still refused
    (F.conv2d would have taken it), and so are fp32 tensors outside autocast on a device whose
    calls run spio's kernels (the emulator's CPU here, as a GPU's)."""

    class Call(nn.Module):
        def __init__(self, stride):
            super().__init__()
            self.stride = stride

        def forward(self, x):
            return spio.functional.conv2d_gw8(x, torch.ones(16, 8, 3, 3), stride=self.stride)

    x = torch.randn(1, 16, 8, 8)
    with pytest.raises(ValueError, match="stride"):
        _export(Call(2), (x,), tmp_path / "s.onnx", False)
    _export(Call(1), (x,), tmp_path / "f.onnx", False)
    monkeypatch.setenv("SPIO_EMULATE", "1")
    with pytest.raises(ValueError, match="fp16 or bf16"):
        _export(Call(1), (x,), tmp_path / "f.onnx", False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_an_exported_program_exports_with_the_translations(tmp_path, dtype):
    """Only an ONNX export swaps in PyTorch's convolution: torch.export keeps spio's op, and
    onnx_translations() turns it into ONNX Convs (with and without a bias, the function's
    implied groups, an fp32 bias beside fp16 operands)."""
    pytest.importorskip("onnxscript")
    assert not onnx_exporting()
    torch.manual_seed(4)
    model = spio.transform(_Net()).eval()
    x = torch.randn(2, 16, 9, 7)
    program = torch.export.export(model.to(dtype), (x.to(dtype),))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.spio.conv2d_gw8.default) == 3
    with pytest.raises(Exception, match="conv2d_gw8"):  # no translation of its own
        _export(program, (x.to(dtype),), tmp_path / "bare.onnx", True)
    table = spio.functional.onnx_translations()
    graph = _export(program, (x.to(dtype),), tmp_path / "ep.onnx", True,
                    custom_translation_table=table).graph  # fmt: skip
    assert [node.op_type for node in graph.node].count("Conv") == 4
    assert all(node.domain in ("", "ai.onnx") for node in graph.node)
    if dtype == torch.float32:
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(_run(tmp_path / "ep.onnx", x), expected, atol=1e-5, rtol=1e-5)


def test_the_translation_casts_an_fp32_bias(tmp_path):
    """The function takes an fp32 bias beside fp16 operands (as under autocast); ONNX's Conv
    takes one type, so the translation casts it."""
    pytest.importorskip("onnxscript")

    class Call(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 8, 3, 3, dtype=torch.float16) / 6)
            self.b = nn.Parameter(torch.randn(16))

        def forward(self, x):
            return spio.functional.conv2d_gw8(x, self.w, self.b, padding_y=1, padding_x=1)

    torch.manual_seed(5)
    model = Call()
    x = torch.randn(1, 16, 6, 5, dtype=torch.float16)
    table = spio.functional.onnx_translations()
    program = torch.export.export(model, (x,))
    graph = _export(program, (x,), tmp_path / "b.onnx", True, custom_translation_table=table).graph
    # (the exporter's optimizer may fold the cast of a constant bias into the initializer)
    assert [node.op_type for node in graph.node if "Cast" not in node.op_type] == ["Conv"]
    expected = F.conv2d(x.float(), model.w.float(), model.b, padding=1, groups=2).half()
    torch.testing.assert_close(_run(tmp_path / "b.onnx", x), expected, atol=1e-2, rtol=1e-2)


def test_the_eager_path_does_not_ask(monkeypatch):
    """Whether an export runs costs microseconds once torch.onnx is imported: only the paths
    that call the op ask, not the eager path a GPU's layers and calls take."""
    import spio.functional.eager as eager

    def asked():
        raise AssertionError("onnx_exporting asked on the eager path")

    monkeypatch.setattr(eager, "onnx_exporting", asked)  # the one place that asks
    monkeypatch.setenv("SPIO_EMULATE", "1")
    torch.manual_seed(2)
    x = torch.randn(1, 16, 5, 4).half()
    conv = Conv2dGw8(16, 16, 3, padding=1, groups=2).half()
    torch.testing.assert_close(conv(x), conv.to_torch_module()(x), atol=2e-3, rtol=2e-3)
    y = spio.functional.conv2d_gw8(x, conv.weight, None, padding_y=1, padding_x=1)
    torch.testing.assert_close(y, F.conv2d(x, conv.weight, padding=1, groups=2), atol=2e-3,
                               rtol=2e-3)  # fmt: skip
    monkeypatch.delenv("SPIO_EMULATE")  # CPU tensors then call the op, which does ask
    with pytest.raises(AssertionError, match="eager path"):
        spio.functional.conv2d_gw8(x, conv.weight, padding_y=1, padding_x=1)


def test_torch_compile_traces_the_question_without_a_break():
    """torch.compile traces onnx_exporting where a call takes the op (here with torch.onnx
    imported, so it asks torch.onnx): fullgraph compiles, and the compiled model equals eager."""
    import torch.onnx  # noqa: F401  (as after any export in the process)

    torch.manual_seed(3)
    model = spio.transform(_Net())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 16, 9, 7, requires_grad=True)
    y = compiled(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    x_ref = x.detach().requires_grad_()
    y_ref = model(x_ref)
    (grad_ref,) = torch.autograd.grad(y_ref.sum(), x_ref)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(grad, grad_ref)
