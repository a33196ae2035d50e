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
    assert list(times) == ["a", "b"]  # every case timed, in order
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


def test_timing_summary_sorts_first_and_takes_the_median_not_the_mean():
    """Five unsorted times: sorted 1, 2, 3, 9, 100. The median is 3 (the mean would be 23); p10
    and p90 are nearest ranks rounded outwards: index int(0.1 * 4) = 0 and ceil(0.9 * 4) = 4."""
    timing = Timing.of([9.0, 100.0, 3.0, 1.0, 2.0], prefilled=False)
    assert timing.median_ms == 3.0
    assert timing.p10_ms == 1.0 and timing.p90_ms == 100.0
    assert timing.reps == 5 and not timing.prefilled


class _FakeCuda:
    """Stand-ins for the torch.cuda calls of time_calls, on a clock that only the timed calls
    advance: call i takes i + 1 ms. `spinning` is what the spin kernel's event reports."""

    def __init__(self, spinning):
        self.clock = 0.0
        self.spinning = spinning
        self.calls = []
        self.spin_seconds = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = fake.clock

            def elapsed_time(self, end):
                return end.at - self.at

            def query(self):
                return not fake.spinning

        self.Event = Event

    def call(self, i):
        self.calls.append(i)
        self.clock += i + 1.0


@pytest.fixture
def fake_cuda(monkeypatch):
    import torch

    from spio.bench import timing

    def install(spinning):
        fake = _FakeCuda(spinning)
        monkeypatch.setattr(torch.cuda, "Event", fake.Event)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(
            timing.SpinCalibration, "cycles", lambda s: fake.spin_seconds.append(s) or 1000
        )
        return fake

    return install


def test_time_calls_times_reps_calls_after_the_warm_up_one_event_pair_each(fake_cuda):
    """warmup=2 untimed calls, then min(5, warmup) = 2 more to gauge the host's pace: calls 0-3
    are not timed. 60 reps run as a batch of 50 and one of 10 (not 100 calls): calls 4..63,
    timed at 5..64 ms. Median (34 + 35) / 2; p10 sorted[int(5.9)] = 10; p90 sorted[54] = 59."""
    from spio.bench.timing import time_calls

    fake = fake_cuda(spinning=True)
    timing = time_calls(fake.call, warmup=2, reps=60)
    assert fake.calls == list(range(64))
    assert timing.reps == 60 and timing.prefilled
    assert timing.median_ms == 34.5
    assert timing.p10_ms == 10.0 and timing.p90_ms == 59.0


def test_time_calls_retries_a_batch_with_a_longer_spin_and_reports_it_not_pre_filled(fake_cuda):
    """The spin kernel has always finished before the batch was queued: the batch is run
    1 + max_retries times, the spin three times longer each time, and the times kept are the
    last attempt's (calls 7..11, 8..12 ms) with prefilled False."""
    from spio.bench.timing import time_calls

    fake = fake_cuda(spinning=False)
    timing = time_calls(fake.call, warmup=1, reps=5, max_retries=1)
    assert fake.calls == list(range(12))  # 1 warm-up, 1 pace, 2 attempts of 5
    assert len(fake.spin_seconds) == 2
    assert fake.spin_seconds[1] == pytest.approx(3 * fake.spin_seconds[0])
    assert not timing.prefilled
    assert timing.reps == 5 and timing.median_ms == 10.0
