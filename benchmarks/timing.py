"""The timers the benchmarks share: torch.utils.benchmark's Timer (it synchronises CUDA around
each measurement and keeps torch's thread count), driven in rounds across several callables."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils import benchmark


def timer(fn) -> benchmark.Timer:
    """A Timer of fn() at torch's current thread count (Timer's own default is one thread)."""
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())


def interleaved_samples(calls: dict, repeats: int, warmup: bool = True) -> dict:
    """Wall times of `repeats` calls of each fn in `calls` (key -> fn), timed in rounds of one
    call each: on a shared machine a slow phase then hits every fn of a round alike, so the
    ratios between them hold where timing one fn after another would not. The warm-up call of
    each (first calls pay for allocation and kernel selection) is not counted. Not for ONNX
    Runtime beside other work: its threads spin for a while after each run and slow whatever
    runs next in the process."""
    if warmup:
        for fn in calls.values():
            fn()
    timers = {key: timer(fn) for key, fn in calls.items()}
    samples = {key: [] for key in calls}
    for _ in range(repeats):
        for key, t in timers.items():
            samples[key].append(t.timeit(1).median)
    return samples


def interleaved_medians(calls: dict, repeats: int, warmup: bool = True) -> dict:
    """Median of interleaved_samples for each key, in seconds."""
    return {key: float(np.median(values)) for key, values in interleaved_samples(calls, repeats, warmup).items()}


def median_seconds(fn, repeats: int, warmup: bool = True) -> float:
    """Median wall time of `repeats` calls of fn()."""
    return interleaved_medians({None: fn}, repeats, warmup)[None]
