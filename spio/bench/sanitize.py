"""One FProp, DGrad and WGrad launch on a few small layers (and blocks of several images over a
batch they do not divide), for running under compute-sanitizer.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python -m spio.bench.sanitize

Without PyTorch's caching allocator every tensor is its own cudaMalloc, so memcheck sees an access
just past a tensor as out of bounds instead of landing in a neighbour inside a pooled block.
Results are also compared with the float64 reference (via `spio.check.run_one`), so a launch that
the sanitizer passes but that computes garbage still fails. Exit status 1 on any failure.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from ..check import EMULATOR_LAYERS
from ..kernels.conv2d_gw8_params import Conv2dGw8Params
from ..kernels.families import FAMILY_OF_PASS
from ..kernels.stats import PASSES

#: Edge cases: bias, padding > R (negative DGrad padding) in bf16, a 5x2 filter over 5 groups
#: (a partial group block). `spio check` runs the same kernels, so they are usually cached.
LAYERS = (
    EMULATOR_LAYERS[0],
    replace(EMULATOR_LAYERS[2], dtype="bf16"),
    EMULATOR_LAYERS[3],
)

#: Blocks of several images over a batch they do not divide (the "ragged" builds, which check
#: each image against the batch size): FProp and DGrad two images a block, WGrad four, so the
#: last block is partly past the batch. Named here: no default FProp/DGrad config streams
#: several images, and WGrad's picks divide the batch sizes spio benchmarks.
MULTI_IMAGE = (
    Conv2dGw8Params(n=5, c=16, h=6, w=5, padding=1, has_bias=True),
    {
        "fprop": "g2_p8_q16_w1_s4_k16_n2",
        "dgrad": "g2_p8_q16_w1_s4_k16_n2",
        "wgrad": "g1_p8_q8_n4_w1_s4_k8",
    },
)


def launches() -> list:
    """(params, pass, config) of every launch: each pass's default config on LAYERS, then the
    multi-image configs of each pass."""
    from ..check import configs_to_run

    params, names = MULTI_IMAGE
    return [
        (layer, pass_, configs_to_run(layer, pass_, extra=0, seed=0)[0])
        for layer in LAYERS
        for pass_ in PASSES
    ] + [
        (params, pass_, FAMILY_OF_PASS[pass_].config_named(params, name))
        for pass_, name in names.items()
    ]


def main() -> int:
    """Launch each of `launches()` once on cuda:0; print one line per launch."""
    import torch

    from ..check import run_one

    if not torch.cuda.is_available():
        print("spio.bench.sanitize needs a CUDA GPU; none is available", file=sys.stderr)
        return 2
    failures = 0
    for params, pass_, config in launches():
        try:
            ratio = run_one(params, pass_, config, "cuda")
            torch.cuda.synchronize()
        except Exception as error:  # keep going: report every launch
            print(f"{pass_} {params.encode()} {config.encode()}: ERROR {error}")
            failures += 1
            continue
        ok = ratio <= 1.0
        failures += not ok
        print(
            f"{pass_} {params.encode()} {config.encode()}: "
            f"{'ok' if ok else 'WRONG'} (error {ratio:.3g} of tolerance)"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
