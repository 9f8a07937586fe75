"""The timers the benchmarks share: torch.utils.benchmark's Timer (it synchronises CUDA around
each measurement and sets torch's thread count), driven in rounds across several callables."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils import benchmark

# Timer.timeit(1) runs the statement twice untimed before the call it times: each sample costs
# three calls, and every timed call follows two of its own (first calls pay for allocation and
# kernel selection; ONNX Runtime's threads spin for a while after a run and would slow a
# different call that came next).
CALLS_PER_SAMPLE = 3


def timer(fn) -> benchmark.Timer:
    """A Timer of fn() at torch's current thread count (Timer's own default is one thread)."""
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())


def interleaved_samples(calls: dict, repeats: int) -> dict:
    """Seconds of `repeats` timed calls of each fn in `calls` (key -> fn), one sample of each
    per round: on a shared machine a slow phase then hits every fn of a round alike, so the
    ratios between them hold where timing one fn after another would not."""
    timers = {key: timer(fn) for key, fn in calls.items()}
    samples = {key: [] for key in calls}
    for _ in range(repeats):
        for key, t in timers.items():
            samples[key].append(t.timeit(1).median)
    return samples


def interleaved_medians(calls: dict, repeats: int) -> dict:
    """Median of interleaved_samples for each key, in seconds."""
    return {key: float(np.median(values)) for key, values in interleaved_samples(calls, repeats).items()}


def median_seconds(fn, repeats: int) -> float:
    """Median seconds of `repeats` timed calls of fn()."""
    return interleaved_medians({None: fn}, repeats)[None]
