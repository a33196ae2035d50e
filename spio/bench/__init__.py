"""Benchmarks of spio's kernels against PyTorch (cuDNN), with plots and the in-situ block stacks.

`python -m spio bench` is the entry point (see `spio.bench.cli`). Importing this package does no
work and does not import torch; each module imports torch and matplotlib only where it needs them.
"""
