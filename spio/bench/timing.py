"""GPU timing with CUDA events on a pre-filled stream, rotating inputs that would sit in L2.

Launch overhead (tens of microseconds of Python per call) exceeds the run time of small kernels,
so events recorded around a call on an idle GPU would time the CPU. We therefore first queue a
spin kernel (`torch.cuda._sleep`) long enough for the CPU to enqueue a whole batch of calls with
their events behind it; the GPU then runs the batch back to back and each start/end event pair
brackets only that call's GPU work. A batch counts only if the spin was still running when the
last call was queued; otherwise it is retried with a longer spin.

Inputs are rotated over enough copies that the data of one call has left the L2 cache (the
H200 has 60 MB) by the time it is used again, so small layers are not timed from cache. Every
timing of one set of copies takes them in one round (`Rotation`): the second implementation
timed on them starts where the first stopped, not on copies the first has just read.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar, overload

from ..log import logger

#: Calls queued behind one spin kernel; keeps the launch queue far from full.
BATCH_CALLS = 50

#: Distinct data that must pass between two uses of one rotation set, in multiples of L2.
L2_FLUSH_FACTOR = 3

#: Most rotation sets. The sets' memory is about L2_FLUSH_FACTOR x L2 whatever their number;
#: this bounds the number of tensors made for tiny layers (under about 370 KB a set on the
#: H200), which get less than 3 x L2 between reuses. The cap had been 64, which left layers of
#: under about 1 MB a set partly timed from L2 (368c 7x7 at N = 8: 0.63 x L2 between reuses).
MAX_SETS = 512


@dataclass(frozen=True)
class Timing:
    """Per-call GPU times in milliseconds (median of many) and how they were taken."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    reps: int
    prefilled: bool  # every batch was queued behind the spin kernel

    @staticmethod
    def of(times_ms: list[float], prefilled: bool) -> Timing:
        ordered = sorted(times_ms)
        return Timing(
            median_ms=statistics.median(ordered),
            p10_ms=ordered[int(0.1 * (len(ordered) - 1))],
            p90_ms=ordered[math.ceil(0.9 * (len(ordered) - 1))],
            reps=len(ordered),
            prefilled=prefilled,
        )


def rotation_sets(bytes_per_set: int, l2_bytes: int) -> int:
    """Copies of a call's data to cycle through so that each is evicted from L2 before reuse."""
    if bytes_per_set <= 0:
        raise ValueError(f"rotation_sets needs a positive size, got {bytes_per_set}")
    if l2_bytes <= 0 or bytes_per_set >= L2_FLUSH_FACTOR * l2_bytes:
        return 1
    return min(MAX_SETS, math.ceil(L2_FLUSH_FACTOR * l2_bytes / bytes_per_set) + 1)


T = TypeVar("T")


class Rotation(Sequence[T]):
    """Rotation sets (`rotation_sets` of them) taken in one round by every call that shares
    them: `take()` gives the set after the one last taken, whichever timing took it. A sequence
    of the sets besides (`rotation[0]`, `len(rotation)`).

    Each timing restarting at set 0 had reused, in the second implementation timed, sets the
    first had read a few calls before: where there are more sets than calls, cuDNN's timed calls
    in `spio bench` found spio's inputs of ~1 x L2 earlier, where spio's own found none."""

    def __init__(self, sets: Iterable[T]) -> None:
        self._sets = list(sets)
        if not self._sets:
            raise ValueError("Rotation needs at least one set, got none")
        self._taken = 0

    @classmethod
    def of(cls, sets: Sequence[T]) -> Rotation[T]:
        """`sets` if a Rotation already (its round goes on), else a new one over them."""
        return sets if isinstance(sets, Rotation) else cls(sets)

    def next_index(self) -> int:
        """The index of the next set in the round (and moves past it)."""
        index = self._taken % len(self._sets)
        self._taken += 1
        return index

    def take(self) -> T:
        """The next set in the round."""
        return self._sets[self.next_index()]

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...
    def __getitem__(self, index: int | slice) -> T | list[T]:
        return self._sets[index]

    def __len__(self) -> int:
        return len(self._sets)


def l2_cache_bytes(device_index: int = 0) -> int:
    """The GPU's L2 size in bytes (torch's device properties; 0 if torch does not report it)."""
    import torch

    return int(getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", 0))


class SpinCalibration:
    """Converts seconds to `torch.cuda._sleep` cycles, measured once per process."""

    _cycles_per_second: float | None = None

    @classmethod
    def cycles(cls, seconds: float) -> int:
        import torch

        if cls._cycles_per_second is None:
            probe = 2_000_000
            torch.cuda._sleep(probe)  # warm up the spin kernel
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(probe)
            end.record()
            end.synchronize()
            cls._cycles_per_second = probe / max(start.elapsed_time(end) * 1e-3, 1e-6)
        return max(1000, int(seconds * cls._cycles_per_second))


def time_calls(
    call: Callable[[int], object], warmup: int = 5, reps: int = 100, max_retries: int = 3
) -> Timing:
    """GPU time of call(i) (i counts this timing's calls), median of reps calls. A call
    reading rotated inputs takes them from a `Rotation` shared by every timing of them.

    Runs `warmup` untimed calls first. Times are per call: everything the call enqueues on the
    current stream between its start and end events.
    """
    import torch

    if warmup < 1 or reps < 1:
        raise ValueError(f"time_calls needs warmup >= 1 and reps >= 1, got {warmup}, {reps}")
    counter = 0

    def run_once() -> None:
        nonlocal counter
        call(counter)
        counter += 1

    for _ in range(warmup):
        run_once()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(min(5, warmup)):
        run_once()
    torch.cuda.synchronize()
    cpu_per_call = (time.perf_counter() - started) / min(5, warmup)

    times: list[float] = []
    all_prefilled = True
    while len(times) < reps:
        batch = min(BATCH_CALLS, reps - len(times))
        spin_seconds = 2.0 * cpu_per_call * batch + 1e-3
        for attempt in range(max_retries + 1):
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
            spin_done = torch.cuda.Event()
            torch.cuda._sleep(SpinCalibration.cycles(spin_seconds))
            spin_done.record()
            for start, end in zip(starts, ends, strict=True):
                start.record()
                run_once()
                end.record()
            prefilled = not spin_done.query()  # still spinning: nothing ran while we queued
            torch.cuda.synchronize()
            if prefilled or attempt == max_retries:
                break
            spin_seconds *= 3
        if not prefilled:
            all_prefilled = False
            logger.warning("timing batch was not fully queued behind the spin kernel")
        times += [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing.of(times, all_prefilled)


def host_us_per_call(
    call: Callable[[], object],
    calls: int,
    repeats: int,
    synchronize: Callable[[], object] = lambda: None,
    warmup: int = 200,
) -> tuple[float, float]:
    """Median µs per call of `call` measured on the host: (issuing only, including the final
    `synchronize`). For host-overhead probes (launch cost, dispatch cost), not GPU time."""
    (blocks,) = _host_blocks({"call": call}, calls, repeats, synchronize, warmup).values()
    return statistics.median(b[0] for b in blocks), statistics.median(b[1] for b in blocks)


def host_us_interleaved(
    cases: dict[str, Callable[[], object]],
    calls: int,
    repeats: int,
    synchronize: Callable[[], object] = lambda: None,
    warmup: int = 200,
) -> dict[str, list[float]]:
    """µs per call issued on the host for each case, one value per repeat, the cases taking
    turns within every repeat (each block of `calls` ends with `synchronize`, so no case inherits
    another's queued work). A slow patch of the host then hits every case alike, and the
    per-repeat differences between cases compare like with like (see `paired_gap`)."""
    blocks = _host_blocks(cases, calls, repeats, synchronize, warmup)
    return {name: [issued for issued, _ in times] for name, times in blocks.items()}


def _host_blocks(
    cases: dict[str, Callable[[], object]],
    calls: int,
    repeats: int,
    synchronize: Callable[[], object],
    warmup: int,
) -> dict[str, list[tuple[float, float]]]:
    """For each case and repeat, µs per call of a block of `calls` calls: (issued, including
    the `synchronize` that ends the block); the cases take turns within every repeat."""
    if calls < 1 or repeats < 1:
        raise ValueError(f"host timing needs calls >= 1 and repeats >= 1, got {calls}, {repeats}")
    for call in cases.values():  # lazy loading, caches, first-call compiles
        for _ in range(warmup):
            call()
    synchronize()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, call in cases.items():
            start = time.perf_counter()
            for _ in range(calls):
                call()
            issued = time.perf_counter()
            synchronize()
            done = time.perf_counter()
            times[name].append(((issued - start) / calls * 1e6, (done - start) / calls * 1e6))
    return times


def paired_gap(times: dict[str, list[float]], case: str, baseline: str) -> float:
    """Median over repeats of case's time minus baseline's in the same repeat."""
    return statistics.median(a - b for a, b in zip(times[case], times[baseline], strict=True))
