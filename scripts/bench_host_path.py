"""Host cost of spio's Python path per call, on the CPU, with the kernel launch stubbed out.

No GPU needed: CPU tensors take the kernel path (SPIO_EMULATE=1), and Kernel.launch is replaced by
a no-op, so what is timed is spio's own Python (validation, kernel lookup, allocation, argument
preparation) plus PyTorch's dispatch. Use it to see host-path changes between commits. On a GPU,
scripts/bench_op_overhead.py measures the real thing against F.conv2d. The numbers depend on this
machine's CPU: compare runs on one machine only.

    python scripts/bench_host_path.py [--calls 3000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os

from spio.args import positive_int, run_script


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=positive_int, default=3000)
    parser.add_argument("--repeats", type=positive_int, default=5)
    args = parser.parse_args(argv)

    os.environ["SPIO_EMULATE"] = "1"
    import torch

    import spio.functional  # noqa: F401  (registers torch.ops.spio)
    from spio.bench.timing import host_us_per_call
    from spio.kernels.kernel import Kernel
    from spio.layers import Conv2dGw8

    Kernel.launch = lambda self, args, device: None  # the stub: no GPU, no emulator
    torch.manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(1, 64, 8, 8, dtype=torch.float16).contiguous(memory_format=cl)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, groups=8, bias=True).half().to(memory_format=cl)
    module = Conv2dGw8.from_torch_module(conv)
    w, b = conv.weight.detach(), conv.bias.detach()
    op = torch.ops.spio.conv2d_gw8.default
    xg = x.detach().clone().requires_grad_()
    dy = torch.ones(1, 64, 8, 8, dtype=torch.float16).contiguous(memory_format=cl)

    def train_step():
        module(xg).backward(dy)

    print(f"torch {torch.__version__}, 1x64x8x8 3x3 fp16 channels_last, bias; launch stubbed")
    print(f"{'case':36s} {'µs/call':>8s}")
    with torch.no_grad():
        cases = {
            "torch.empty (a floor)": lambda: torch.empty((1, 64, 8, 8), dtype=torch.float16),
            "torch.ops.spio.conv2d_gw8": lambda: op(x, w, b, 1, 1, 1, 1, 8),
            "Conv2dGw8 module, no grad": lambda: module(x),
        }
        for name, call in cases.items():
            print(f"{name:36s} {host_us_per_call(call, args.calls, args.repeats)[0]:8.2f}")
    steps = max(1, args.calls // 4)
    print(f"{'Conv2dGw8 module, forward + backward':36s} "
          f"{host_us_per_call(train_step, steps, args.repeats)[0]:8.2f}")  # fmt: skip
    # The floor of any layer whose backward is Python: the same step through an autograd.Function
    # that only allocates its output and gradients (no spio), so that the step's line less this
    # one is spio's own host cost.
    floor = _empty_function(torch)
    wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()

    def floor_step():
        floor.apply(xg, wg, bg).backward(dy)

    print(f"{'autograd.Function floor, fwd + bwd':36s} "
          f"{host_us_per_call(floor_step, steps, args.repeats)[0]:8.2f}")  # fmt: skip
    # The parts: the forward recording the graph (no backward), and the kernel wrappers alone
    # (Layer's fprop, dgrad, wgrad as the backward calls them), to tell their cost from the
    # module's routing and checks and the autograd Function's Python around them.
    from spio.functional import _kernels

    layer = _kernels.layer(x, w, b, 1, 1)
    dtypes = (torch.float16, torch.float16)
    parts = {
        "Conv2dGw8 module, forward with grad": lambda: module(xg),
        "wrapper Layer.fprop": lambda: layer.fprop(x, w, b),
        "wrapper Layer.dgrad": lambda: layer.dgrad(dy, w),
        "wrapper Layer.wgrad (with bias)": lambda: layer.wgrad(x, dy, True, dtypes=dtypes),
    }
    for name, call in parts.items():
        print(f"{name:36s} {host_us_per_call(call, steps, args.repeats)[0]:8.2f}")
    return 0


def _empty_function(torch):
    """An autograd.Function of (x, weight, bias) that computes nothing: its forward saves x and
    weight and returns an empty output, its backward empty gradients for all three."""

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(weight), weight.new_empty(weight.shape[0])

    return Empty


if __name__ == "__main__":
    run_script(main)
