"""Built-in layer sets: what `python -m spio compile` sweeps and what tests sample from."""

from __future__ import annotations

import itertools

from .conv2d_gw8_params import Conv2dGw8Params


def compile_layer_set() -> list[Conv2dGw8Params]:
    """Layers covering every filter size, paddings 0, R//2 and > R, odd, tiny and wide images,
    small and large channel counts, with and without bias, fp16 and bf16."""
    layers: list[Conv2dGw8Params] = []
    for r, s in itertools.product(range(1, 6), repeat=2):  # all 25 filter shapes
        layers.append(Conv2dGw8Params(n=2, c=64, h=20, w=19, padding=(r // 2, s // 2), r=r, s=s))
    for pad in (0, 4):  # no padding, and padding larger than the filter
        layers.append(Conv2dGw8Params(n=2, c=32, h=17, w=23, padding=pad, r=3, s=3))
    layers += [
        Conv2dGw8Params(n=3, c=8, h=6, w=5, padding=1, r=3, s=3, has_bias=True),
        Conv2dGw8Params(n=1, c=1024, h=7, w=7, padding=2, r=5, s=5),
        Conv2dGw8Params(n=1, c=96, h=49, w=33, padding=(2, 1), r=5, s=3, has_bias=True),
        Conv2dGw8Params(n=4, c=128, h=32, w=32, padding=1, r=3, s=3, has_bias=True),
        # 56 columns: 64-column tiles; WGrad's partial sums pass 64 MiB for 568 of its 1,400
        # configs, so spio builds their atomic kernels.
        Conv2dGw8Params(n=64, c=96, h=56, w=56, padding=2, r=5, s=5),
    ]
    bf16 = [
        Conv2dGw8Params(n=2, c=64, h=20, w=19, padding=1, r=3, s=3, dtype="bf16", has_bias=True),
        Conv2dGw8Params(n=1, c=48, h=9, w=31, padding=(0, 2), r=1, s=5, dtype="bf16"),
        Conv2dGw8Params(n=2, c=16, h=13, w=11, padding=3, r=2, s=4, dtype="bf16"),
    ]
    return layers + bf16
