"""The timers the benchmarks share (benchmarks only: tests never assert on wall time)."""
from __future__ import annotations

import statistics
import time


def interleaved_medians(calls: dict, repeats: int, warmup: bool = True) -> dict:
    """Median wall time of `repeats` calls of each fn in `calls` (key -> fn), timed in rounds
    of one call each. On a shared VM a slow phase then hits every fn of a round alike, so the
    ratios between them hold (timed one variant at a time, local's attention op took 51 and
    62 ms in two runs and 41 ms minutes later: same code, nothing else running). The warm-up
    call of each (first calls pay for allocation and kernel selection) is not counted.
    Not for ONNX Runtime beside other work: its threads spin for a while after each run and
    slow whatever runs next in the process."""
    if warmup:
        for fn in calls.values():
            fn()
    samples = {key: [] for key in calls}
    for _ in range(repeats):
        for key, fn in calls.items():
            start = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in samples.items()}


def median_seconds(fn, repeats: int, warmup: bool = True) -> float:
    """Median wall time of `repeats` calls of fn()."""
    return interleaved_medians({None: fn}, repeats, warmup)[None]
