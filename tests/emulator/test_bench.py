"""A conv-like benchmark kernel (1x64x32x32, 3x3, gw8, fp16): correct, and fast enough."""

import ctypes
import time

import pytest
import torch
import torch.nn.functional as F


def _run(bench, check: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, 32, 64, generator=gen).half()  # NHWC
    w = (torch.randn(64, 3, 3, 8, generator=gen) / 8).half()  # K R S C8
    y = torch.full((1, 32, 32, 64), float("nan")).half()
    start = time.perf_counter()
    bench.get_function("conv_gw8_bench").launch(32, 256, (y, x, w), check=check)
    seconds = time.perf_counter() - start
    ref = F.conv2d(
        x.permute(0, 3, 1, 2).double(), w.permute(0, 3, 1, 2).double(), padding=1, groups=8
    )
    return y.permute(0, 3, 1, 2).double(), ref, seconds


@pytest.mark.parametrize("check", [True, False])
def test_conv_bench_matches_torch_and_is_fast(bench, check):
    got, ref, seconds = _run(bench, check)
    print(f"conv_gw8_bench 1x64x32x32 3x3 fp16, check={check}: {seconds:.3f} s")
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)
    # Target: under 2 s on a 2-core machine; the bound is loose for loaded CI machines.
    assert seconds < 10.0


def test_checked_launches_keep_small_records_per_byte(bench):
    """A checked access reads and writes a record per byte it touches: 32 bytes per byte of
    shared memory and 20 per byte of a tensor. The atomics' records, which few kernels need,
    had grown them to 48 and 32, and checked launches of FProp ~12% slower than before; they live
    apart now (~6% slower than before, the rest from other checks)."""
    records = bench._load(True).handle.spio_emu_shadow_bytes
    records.restype = ctypes.c_uint32
    records.argtypes = [ctypes.c_int]
    assert (records(0), records(1)) == (32, 20)
