"""Rotation-set sizing (pure arithmetic; the timing itself needs a GPU, see test_run_cuda.py)."""

import pytest

from spio.bench.timing import MAX_SETS, Timing, rotation_sets

MB = 10**6


def test_rotation_sets_cover_three_l2_sizes():
    assert rotation_sets(100 * MB, 60 * MB) == 3  # ceil(180 / 100) + 1
    assert rotation_sets(20 * MB, 60 * MB) == 10
    assert rotation_sets(1 * MB, 60 * MB) == MAX_SETS  # capped
    assert rotation_sets(180 * MB, 60 * MB) == 1  # already 3x L2: no rotation
    assert rotation_sets(5 * MB, 0) == 1  # L2 size unknown


def test_rotation_sets_rejects_empty_data():
    with pytest.raises(ValueError, match="positive size"):
        rotation_sets(0, 60 * MB)


def test_timing_summary_is_median_and_percentiles():
    timing = Timing.of([float(v) for v in range(1, 12)], prefilled=True)
    assert timing.median_ms == 6.0 and timing.p10_ms == 2.0 and timing.p90_ms == 10.0
    assert timing.reps == 11 and timing.prefilled
