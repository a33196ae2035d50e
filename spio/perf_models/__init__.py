"""Shipped kernel performance models: `<arch>/<family>.ubj` (+ `.json`), loaded by
spio.kernels.perf_model. See README.md here; this package holds data only."""
