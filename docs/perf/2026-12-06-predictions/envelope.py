"""Run 7's WGrad perf samples (H200, 2026-12-04) of the partial-sums configs, grouped by their
number of slots: the fastest sampled config for each count, per bench layer at N = 128. Written
for docs/perf/2026-12-06-predictions.md; reads only the committed samples (no GPU):

    cd docs/perf/2026-12-06-predictions && python envelope.py > envelope.txt
"""

from collections import defaultdict
from pathlib import Path

from spio.kernels import conv2d_gw8_wgrad_factory as wg
from spio.kernels import perf_samples as ps

SAMPLES = Path(__file__).parents[1] / "2026-12-04-h200" / "run7" / "perf_samples.csv"

samples, _ = ps.read_samples(SAMPLES)
by_layer: dict = defaultdict(lambda: defaultdict(list))
for s in samples:
    config = wg.Conv2dGw8WgradConfig.decode(s.config) if isinstance(s.config, str) else s.config
    if s.family != "conv2d_gw8_wgrad" or s.params.n != 128:
        continue
    if not wg.uses_partial_sums(s.params, config):
        continue
    slots = wg.partial_slots(s.params, config)
    by_layer[s.params.encode()][slots].append((s.seconds * 1e6, config.encode()))
for layer in sorted(by_layer):
    print(layer)
    print(f"  {'slots':>6} {'configs':>7} {'best us':>8}  best config")
    for slots in sorted(by_layer[layer]):
        times = sorted(by_layer[layer][slots])
        print(f"  {slots:6d} {len(times):7d} {times[0][0]:8.1f}  {times[0][1]}")
