"""Rotation-set sizing (pure arithmetic; the timing itself needs a GPU, see test_run_cuda.py)."""

import pytest

from spio.bench.timing import MAX_SETS, Timing, rotation_sets

MB = 10**6


def test_rotation_sets_cover_three_l2_sizes():
    assert rotation_sets(100 * MB, 60 * MB) == 3  # ceil(180 / 100) + 1
    assert rotation_sets(20 * MB, 60 * MB) == 10
    assert rotation_sets(1 * MB, 60 * MB) == 181  # 64 sets had been only 1.07 x L2
    assert rotation_sets(100_000, 60 * MB) == MAX_SETS  # capped
    assert rotation_sets(180 * MB, 60 * MB) == 1  # already 3x L2: no rotation
    assert rotation_sets(5 * MB, 0) == 1  # L2 size unknown


def test_rotation_sets_rejects_empty_data():
    with pytest.raises(ValueError, match="positive size"):
        rotation_sets(0, 60 * MB)


def test_timing_summary_is_median_and_percentiles():
    timing = Timing.of([float(v) for v in range(1, 12)], prefilled=True)
    assert timing.median_ms == 6.0 and timing.p10_ms == 2.0 and timing.p90_ms == 10.0
    assert timing.reps == 11 and timing.prefilled


def test_interleaved_host_timing_takes_turns_and_pairs_repeats():
    """The cases take turns within each repeat (each block ends with a synchronise), and a gap is
    the median of per-repeat differences: a case made slow in one repeat moves it little."""
    from spio.bench.timing import host_us_interleaved, paired_gap

    order = []
    cases = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    syncs = []
    times = host_us_interleaved(
        cases, calls=3, repeats=4, synchronize=lambda: syncs.append(1), warmup=1
    )
    assert order == ["a", "b"] + (["a"] * 3 + ["b"] * 3) * 4
    assert len(syncs) == 1 + 2 * 4
    assert all(len(v) == 4 and min(v) > 0 for v in times.values())
    made = {"fast": [1.0, 1.0, 9.0, 1.0, 1.0], "slow": [3.0, 3.1, 11.0, 2.9, 3.0]}
    assert paired_gap(made, "slow", "fast") == pytest.approx(2.0)
    with pytest.raises(ValueError, match="calls >= 1 and repeats >= 1"):
        host_us_interleaved(cases, calls=0, repeats=1)


def test_host_per_call_counts_the_synchronise_in_the_total_only():
    """(issued, total): a synchronise that takes 2 ms per block of 10 calls adds about 200 µs
    per call to the total and nothing to the issue time."""
    import time

    from spio.bench.timing import host_us_per_call

    calls = []
    issued, total = host_us_per_call(
        lambda: calls.append(1),
        calls=10,
        repeats=3,
        synchronize=lambda: time.sleep(0.002),
        warmup=2,
    )
    assert len(calls) == 2 + 10 * 3
    assert issued < 50
    assert total - issued > 150
