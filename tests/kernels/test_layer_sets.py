"""spio.kernels.layer_sets: the built-in layer set covers what its docstring promises, since
`python -m spio compile` sweeps it and the kernel tests sample from it."""

from spio.kernels.conv2d_gw8_wgrad_factory import uses_partial_sums
from spio.kernels.families import FAMILY_OF_PASS
from spio.kernels.layer_sets import compile_layer_set


def test_every_filter_size_with_its_size_keeping_padding():
    """All 25 filter shapes R, S in 1..5, each with padding (R//2, S//2)."""
    layers = compile_layer_set()
    for r in range(1, 6):
        for s in range(1, 6):
            assert any(
                (p.r, p.s, p.padding_h, p.padding_w) == (r, s, r // 2, s // 2) for p in layers
            ), (r, s)


def test_paddings_dtypes_bias_and_channel_counts():
    """No padding on a filter wider than 1, padding larger than the filter, fp16 and bf16 each
    with and without bias, and channel counts from one group (8) to 128 groups (1024)."""
    layers = compile_layer_set()
    assert any(p.r > 1 and p.s > 1 and (p.padding_h, p.padding_w) == (0, 0) for p in layers)
    assert any(p.padding_h > p.r and p.padding_w > p.s for p in layers)
    for dtype in ("fp16", "bf16"):
        assert {p.has_bias for p in layers if p.dtype == dtype} == {False, True}, dtype
    channels = {p.c for p in layers}
    assert min(channels) == 8 and max(channels) >= 1024


def test_wgrad_builds_both_its_reductions():
    """Some WGrad configs of the set sum partials and some, past the partial-sum buffer limit,
    run atomics, so a compile sweep builds both kinds of WGrad kernel."""
    wgrad = FAMILY_OF_PASS["wgrad"]
    kinds = {
        uses_partial_sums(params, config)
        for params in compile_layer_set()
        for config in wgrad.configs(params)
    }
    assert kinds == {False, True}
