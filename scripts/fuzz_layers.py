"""Random layers through spio's PyTorch layer and function, forward and backward, against float64.

scripts/fuzz_kernels.py checks the kernels one at a time; this checks what a model sees: a
`Conv2dGw8` module or `spio.functional.conv2d_gw8` call on a random layer (its draw), in a
random setting: a half model (bias half, or fp32 beside half operands) or fp32 operands under
autocast; the passes left to spio (the others run PyTorch's convolution); input, weight and
output gradient contiguous, channels_last or a strided view; which of input, weight and bias
want gradients; a 3-D input to the module. The output and every gradient are compared with
PyTorch's float64 convolution of the operands as rounded for the call, at the tolerances the
kernel checks use (spio.reference), and their dtypes and the output's memory format with what
`F.conv2d` gives. Where PyTorch's convolution runs FProp with an fp32 bias beside half
operands, half an ulp of the convolution's magnitude more is allowed: spio rounds that
convolution before adding the bias (documented in `functional._kernels.torch_fprop`). Each case
is drawn from (--seed, its index) alone: `--seed S --case I` runs a failure again. Exit 1 on any
failure.

    python scripts/fuzz_layers.py --minutes 30          # on the CPU: the emulator
    python scripts/fuzz_layers.py --device cuda --minutes 2
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
import traceback
from pathlib import Path

from spio.args import no_gpu, run_script

#: How a case's operands are held: a half model (its bias half, or fp32 beside half operands,
#: which spio takes and nn.Conv2d refuses), or fp32 operands under autocast (bias fp32).
SETTINGS = ("half", "half, fp32 bias", "autocast")
#: Operand layouts: contiguous, channels_last, or a strided view (every other column of a wider
#: tensor; for the weight, contiguous and channels_last only).
LAYOUTS = ("contiguous", "channels_last", "view")


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn case."""

    index: int
    params: object  # Conv2dGw8Params: the layer (its dtype the half type of the call)
    setting: str  # SETTINGS
    module: bool  # a Conv2dGw8 module (else spio.functional.conv2d_gw8)
    unbatched: bool  # the module called on a 3-D input (its one image)
    passes: int  # the passes left to spio's kernels (bits: FProp 1, DGrad 2, WGrad 4)
    x_layout: str
    w_layout: str
    dy_layout: str
    grads: tuple[bool, bool, bool]  # whether input, weight and bias require gradients

    def line(self) -> str:
        wanted = "".join(n for n, g in zip(("x", "w", "b"), self.grads, strict=True) if g)
        api = "module" + (", 3-D" if self.unbatched else "") if self.module else "function"
        return (f"{self.params.encode()} [{self.setting}; {api}; passes {self.passes}; x "
                f"{self.x_layout}, w {self.w_layout}, dy {self.dy_layout}; grads "
                f"{wanted or 'none'}]")  # fmt: skip


def _kernels_fuzz():
    """scripts/fuzz_kernels.py, whose layers this draws too and whose run options it shares."""
    scripts = str(Path(__file__).resolve().parent)
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import fuzz_kernels

    return fuzz_kernels


def draw_case(seed: int, index: int) -> Case:
    """Case `index` of run `seed`: the same two numbers give the same case."""
    rng = random.Random(f"layers {seed}:{index}")
    params = _kernels_fuzz().draw_layer(rng)
    setting = rng.choice(SETTINGS)
    if setting == "half, fp32 bias" and not params.has_bias:
        setting = "half"
    module = rng.random() < 0.7
    grads = (rng.random() < 0.8, rng.random() < 0.8, params.has_bias and rng.random() < 0.8)
    return Case(
        index=index,
        params=params,
        setting=setting,
        module=module,
        unbatched=module and params.n == 1 and rng.random() < 0.3,
        passes=rng.choice((7, 7, 7, 1, 2, 3, 4, 5, 6)),
        x_layout=rng.choice(LAYOUTS),
        w_layout=rng.choice(LAYOUTS[:2]),
        dy_layout=rng.choice(LAYOUTS),
        grads=grads if any(grads) else (True, False, False),
    )


def laid_out(t, layout: str):
    """`t` (4-D) in `layout`: a strided view is every other column of a tensor twice as wide."""
    import torch

    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "view":
        wide = torch.zeros(*t.shape[:3], 2 * t.shape[3], dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t.contiguous()


def run_case(case: Case, device: str = "cpu") -> tuple[str, str]:
    """("pass" | "fail", detail) of one case."""
    try:
        problems, ratios = check_case(case, device)
    except Exception:  # an error is a failure to report, not a reason to stop the run
        return "fail", traceback.format_exc(limit=-3).rstrip()
    shown = " ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items())
    return ("fail", "; ".join(problems) + f" ({shown})") if problems else ("pass", shown)


def check_case(case: Case, device: str) -> tuple[list[str], dict[str, float]]:
    """(what is wrong, each result's worst error over its tolerance) of one case."""
    import torch
    import torch.nn.functional as F

    import spio.functional
    from spio.check import error_ratio, random_inputs
    from spio.kernels.conv2d_gw8_params import torch_dtype
    from spio.layers import Conv2dGw8
    from spio.reference import conv2d_gw8_tolerance

    p = case.params
    half = torch_dtype(p.dtype)
    # spio check's operands: x, w and dy in the layer's half type, an fp32 bias.
    given = random_inputs(p, seed=case.index)
    held = torch.float32 if case.setting == "autocast" else half  # x's and w's dtype
    bias_dtype = half if case.setting == "half" else torch.float32
    want_x, want_w, want_b = case.grads
    # The operands as held (on a half grid, so that autocast's casts are exact).
    # (Laid out where they live: a copy to the GPU would make a strided view contiguous.)
    x = laid_out(given["x"].to(held).to(device), case.x_layout).requires_grad_(want_x)
    w = laid_out(given["w"].to(held).to(device), case.w_layout).requires_grad_(want_w)
    b = given["bias"]
    b = None if b is None else b.to(bias_dtype).to(device).requires_grad_(want_b)
    groups, (pad_h, pad_w) = p.c // 8, p.padding
    if case.module:
        layer = Conv2dGw8(p.c, p.c, (p.r, p.s), padding=p.padding, groups=groups,
                          bias=b is not None)  # fmt: skip
        layer.weight = torch.nn.Parameter(w, requires_grad=want_w)
        if b is not None:
            layer.bias = torch.nn.Parameter(b, requires_grad=want_b)
        layer.spio_passes = case.passes
        w, b = layer.weight, layer.bias
        inputs = x[0] if case.unbatched else x

        def call():
            y = layer(inputs)
            return y.unsqueeze(0) if case.unbatched else y

    else:

        def call():
            return spio.functional.conv2d_gw8(x, w, b, padding_y=pad_h, padding_x=pad_w,
                                              groups=groups, passes=case.passes)  # fmt: skip

    with torch.autocast(device, dtype=half, enabled=case.setting == "autocast"):
        y = call()
    dy = laid_out(given["dy"].to(device), case.dy_layout)
    if y.requires_grad:
        y.backward(dy)
    # The float64 reference, of the operands as the call rounds them.
    xr = x.detach().to(half).double().cpu().requires_grad_()
    wr = w.detach().to(half).double().cpu().requires_grad_()
    br = None if b is None else b.detach().to(bias_dtype).double().cpu().requires_grad_()
    yr = F.conv2d(xr, wr, br, padding=p.padding, groups=groups)
    yr.backward(dy.double().cpu())
    problems, ratios = [], {}
    tol = conv2d_gw8_tolerance(p, "fprop", xr.detach(), wr.detach(), safety=4.0)
    atol = tol.atol
    if not case.passes & 1 and b is not None and bias_dtype == torch.float32:
        # PyTorch's FProp rounds the convolution before spio adds an fp32 bias to it
        conv = F.conv2d(xr.detach(), wr.detach(), None, padding=p.padding, groups=groups).abs()
        atol = atol + torch.finfo(half).eps / 2 * conv
    ratios["y"] = error_ratio(y, yr.detach(), atol, tol.rtol)
    if y.dtype != half:
        problems.append(f"y is {y.dtype}, not {half}")
    # The output's memory format, F.conv2d's for operands laid out as the call's (its rule for
    # tensors of both formats, as a 1x1 filter's, is PyTorch's own, and differs by device).
    if not case.unbatched:
        cl = torch.channels_last
        like = F.conv2d(x.detach().to(half), w.detach().to(half), None, padding=p.padding,
                        groups=groups)  # fmt: skip
        if y.is_contiguous(memory_format=cl) != like.is_contiguous(memory_format=cl):
            said = ("is", "is not") if like.is_contiguous(memory_format=cl) else ("is not", "is")
            problems.append(f"y {said[1]} channels_last where F.conv2d's {said[0]}")
    dyr = dy.double().cpu()
    expected = (
        ("dx", x, xr, conv2d_gw8_tolerance(p, "dgrad", dyr, wr.detach(), safety=4.0)),
        ("dw", w, wr, conv2d_gw8_tolerance(p, "wgrad", xr.detach(), dyr, 4.0, half)),
    )
    for name, operand, reference, tol in expected:
        if operand.requires_grad:
            ratios[name] = _grad_ratio(operand, reference, tol, problems, name)
    if b is not None and b.requires_grad:
        ones = torch.ones(1, dtype=torch.float64)
        tol = conv2d_gw8_tolerance(p, "wgrad", dyr, ones, 4.0, bias_dtype)
        ratios["db"] = _grad_ratio(b, br, tol, problems, "db")
    problems += [f"{name} {ratio:.3g} times its tolerance" for name, ratio in ratios.items()
                 if not ratio <= 1.0]  # fmt: skip
    return problems, ratios


def _grad_ratio(operand, reference, tol, problems: list[str], name: str) -> float:
    """The worst error over the tolerance of `operand`'s gradient (inf where it has none); a
    gradient not in its operand's dtype is a problem."""
    from spio.check import error_ratio

    if operand.grad is None:
        return float("inf")
    if operand.grad.dtype != operand.dtype:
        problems.append(f"{name} is {operand.grad.dtype}, not {operand.dtype}")
    return error_ratio(operand.grad, reference.grad, tol.atol, tol.rtol)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _kernels_fuzz().add_run_options(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return no_gpu("fuzz_layers")
    fuzz = _kernels_fuzz()
    deadline = time.monotonic() + 60 * args.minutes
    counts = {"pass": 0, "fail": 0}
    failed = []
    # CPU tensors (the cpu device's) run spio's kernels, emulated.
    with fuzz.environment({"SPIO_EMULATE": "1"}):
        for index in fuzz.case_indices(args):
            if args.case is None and time.monotonic() > deadline:
                break
            case = draw_case(args.seed, index)
            started = time.monotonic()
            outcome, detail = run_case(case, args.device)
            counts[outcome] += 1
            print(f"case {index}: {outcome} in {time.monotonic() - started:.1f} s: "
                  f"{case.line()}: {detail}", flush=True)  # fmt: skip
            if outcome == "fail":
                failed.append(f"--seed {args.seed} --case {index}: {case.line()}")
    print(f"{counts['pass']} passed, {counts['fail']} failed (seed {args.seed}, {args.device})")
    fuzz.print_failures("fuzz_layers.py", args, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
