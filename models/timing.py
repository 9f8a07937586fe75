"""The one timer the benchmarks share (benchmarks only: tests never assert on wall time)."""
from __future__ import annotations

import statistics
import time


def median_seconds(fn, repeats: int, warmup: bool = True) -> float:
    """Median wall time of `repeats` calls of fn(); the warm-up call (first calls pay for
    allocation and kernel selection) is not counted."""
    if warmup:
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
