"""In-situ stacks on the CPU: spio's autograd wiring (emulator) matches PyTorch's, and the stacks
build and train at the table layer's shape. Profiling itself needs a GPU (test_run_cuda.py)."""

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
        InSituRow(impl="spio", us_per_call=10.0, kernels="k:10.0", **common),
        InSituRow(impl="torch", us_per_call=30.0, kernels="c:30.0", **common),
    ]
    assert "3.00x" in format_insitu_table(rows)
    rows[0] = InSituRow(impl="spio", us_per_call=math.nan, kernels="not attributed", **common)
    fields = format_insitu_table(rows).splitlines()[-1].split()
    assert fields[4:7] == ["-", "30.0", "-"]  # spio us, torch us, speedup
