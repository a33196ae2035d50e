"""One FProp, DGrad and WGrad launch on a few small layers, for running under compute-sanitizer.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python -m spio.bench.sanitize

Without PyTorch's caching allocator every tensor is its own cudaMalloc, so memcheck sees an access
just past a tensor as out of bounds instead of landing in a neighbour inside a pooled block.
Results are also compared with the float64 reference (via `spio.check.run_one`), so a launch that
the sanitizer passes but that computes garbage still fails. Exit status 1 on any failure.
"""

from __future__ import annotations

import sys

from ..kernels.conv2d_gw8_params import Conv2dGw8Params as P
from ..kernels.stats import PASSES

#: Edge cases with several blocks: partial tiles, bias, padding > R, a partial group block, bf16.
LAYERS = (
    P(n=2, c=16, h=9, w=21, padding=1, r=3, s=3, has_bias=True),
    P(n=1, c=40, h=7, w=19, padding=4, r=3, s=3, dtype="bf16"),
    P(n=2, c=24, h=11, w=10, padding=(2, 1), r=5, s=2, has_bias=True),
)


def main() -> int:
    """Launch each pass once per layer on cuda:0; print one line per launch."""
    import torch

    from ..check import configs_to_run, run_one

    if not torch.cuda.is_available():
        print("spio.bench.sanitize needs a CUDA GPU; none is available", file=sys.stderr)
        return 2
    failures = 0
    for params in LAYERS:
        for pass_ in PASSES:
            config = configs_to_run(params, pass_, extra=0, seed=0)[0]
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
