"""The benchmark's timed calls, run once on the CPU (spio in the emulator): spio and PyTorch
compute the same pass, and the copy moves the pass's bytes. Timing them needs a GPU."""

import pytest
import torch

from spio.bench.layers import BenchLayer
from spio.bench.run import BenchSettings, PassCase

TINY = BenchLayer("tiny_16c_7x9_3x3", 16, 7, 9)


@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_spio_and_torch_calls_compute_the_same_pass(pass_):
    torch.manual_seed(0)
    case = PassCase(TINY.params(2), pass_, l2_bytes=0, device="cpu")
    assert case.sets == 1 and case.bytes == case.stats.bytes(pass_)
    spio_out = case.spio_call()(0)
    torch_out = case.torch_call()(0)
    if pass_ == "fprop":
        got, want = spio_out, torch_out
    elif pass_ == "dgrad":
        got, want = spio_out, torch_out[0]
        assert torch_out[1] is None
    else:
        got, want = spio_out[0], torch_out[1]
        assert torch_out[0] is None
    assert got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.02)


def test_rotation_sets_hold_distinct_random_data():
    case = PassCase(TINY.params(1), "fprop", l2_bytes=10**6, device="cpu")
    assert case.sets > 1 and len(case.data) == case.sets
    first, second = case.data[0]["x"], case.data[1]["x"]
    assert first.is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(first, second) and first.abs().sum() > 0


def test_copy_moves_the_same_bytes_as_the_pass():
    case = PassCase(TINY.params(2), "wgrad", l2_bytes=0, device="cpu")
    src, dst = case.copy_data[0]
    assert abs(case.copy_bytes - case.bytes) < 4
    assert case.copy_bytes == src.numel() * src.element_size() + dst.numel() * dst.element_size()
    case.copy_call()(0)
    assert torch.equal(src, dst)


def test_settings_reject_unknown_passes_and_dtypes():
    with pytest.raises(ValueError, match="passes"):
        BenchSettings(layers=(TINY,), batch_sizes=(1,), passes=("bprop",))
    with pytest.raises(ValueError, match="dtype"):
        BenchSettings(layers=(TINY,), batch_sizes=(1,), dtype="fp32")


@pytest.mark.parametrize("pass_", ["fprop", "dgrad", "wgrad"])
def test_bench_times_the_kernel_the_custom_ops_choose(monkeypatch, pass_):
    """The benchmark's spio column is what users get: the config selection of the custom ops
    (the performance model on a GPU), not the heuristic default."""
    import torch

    from spio.bench import run
    from spio.functional import _kernels
    from spio.kernels import perf_model
    from spio.kernels.families import FAMILY_OF_PASS

    params = TINY.params(2)
    family = FAMILY_OF_PASS[pass_]
    default = family.default_config(params)
    chosen = next(c for c in reversed(family.configs(params)) if c != default)
    monkeypatch.setattr(_kernels, "_chosen", {})
    monkeypatch.setattr(perf_model, "select_config", lambda factory, p, device, **o: chosen)
    kernel = run.spio_kernel(params, pass_, torch.device("cuda", 0))
    assert dict(kernel.info)["config"] == chosen
    assert run.spio_config(params, pass_, torch.device("cuda", 0)) == chosen
