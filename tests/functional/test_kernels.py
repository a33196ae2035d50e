"""The kernel seam's Layer (spio.functional._kernels): what it hands the kernel wrappers on the
hot path of every call."""

import dataclasses

import pytest
import torch

from spio.functional import _kernels
from spio.kernels import conv2d_gw8_wgrad_factory as wf


@pytest.mark.parametrize(("has_bias", "with_bias"), [(True, True), (True, False), (False, False)])
def test_wgrad_launches_with_its_kernels_own_layer(monkeypatch, has_bias, with_bias):
    """Layer.wgrad gives wf.wgrad the layer its kernel was made for (this one, with has_bias as
    the call asks), the very object: the wrapper's check that kernel and layer match is then an
    identity test, not a comparison of every field on each backward pass (and no params are
    made per call)."""
    x = torch.randn(2, 16, 6, 5, dtype=torch.float16)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float16)
    b = torch.randn(16, dtype=torch.float16) if has_bias else None
    layer = _kernels.layer(x, w, b, 1, 1)
    seen = []

    def spy(x, dy, params, kernel, dtypes=None, validated=False):
        seen.append((params, kernel))
        return None, None

    monkeypatch.setattr(wf, "wgrad", spy)
    dy = torch.randn(2, 16, 6, 5, dtype=torch.float16)
    for _ in range(2):
        layer.wgrad(x, dy, with_bias)
    for params, kernel in seen:
        assert params is kernel.info_value("params")
        assert params.has_bias == with_bias
        assert params == dataclasses.replace(layer.params, has_bias=with_bias)
    assert seen[0][0] is seen[1][0]
