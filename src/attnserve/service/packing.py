"""Which inputs share a batch: runs of like lengths, cut where they cost the least.

A batch runs at the length of its longest input (padded as the runner pads it), so a 20-token
text beside a 250-token one costs 250 tokens of work. Inputs sorted longest first are cut
into consecutive runs by dynamic programming: each run costs its size x its padded width, plus
a fixed cost per run (RUN_TOKENS), within the batch's token budget and size. The server's
batcher (src/attnserve/service/batching.py) takes the first run of what is waiting, from the input its
round-robin picked; the in-process Embedder (src/attnserve/service/embedder.py) runs every run of a call.
Hand-written rather than taken from a library: one sort and a short dynamic programme, under
the budget the runner's padding sets.
"""
from __future__ import annotations

from typing import Callable, Sequence

# What one more run costs beside the tokens it computes, in padded tokens' time. On 2 CPU
# cores a run's fixed cost is about a millisecond, some 10 tokens' work; batches of a few
# inputs already fill ONNX Runtime's matrix products, so padding is what a cut should avoid.
RUN_TOKENS = 32


def cut_sorted(widths: Sequence[int], padded: Callable[[int], int], max_tokens: int, max_inputs: int,
               run_tokens: int = RUN_TOKENS) -> list[int]:
    """Sizes of the runs that cut `widths` (sorted longest first) with the least work: a run
    of k inputs from width w costs k x padded(w) + run_tokens, and holds at most max_inputs
    inputs and max_tokens padded tokens (an input over max_tokens runs alone)."""
    n = len(widths)
    cost = [padded(w) for w in widths]
    best = [0.0] + [float("inf")] * n
    size = [0] * (n + 1)
    for stop in range(1, n + 1):
        for start in range(max(0, stop - max_inputs), stop):
            k = stop - start
            tokens = k * cost[start]
            if k > 1 and tokens > max_tokens:
                continue
            total = best[start] + tokens + run_tokens
            if total < best[stop]:
                best[stop], size[stop] = total, k
    sizes, stop = [], n
    while stop:
        sizes.append(size[stop])
        stop -= size[stop]
    return sizes[::-1]


def fill_batch(first: int, lengths: Sequence[int], padded: Callable[[int], int], max_tokens: int, max_inputs: int,
               by_length: bool = True) -> list[int]:
    """Indices into `lengths` of the inputs that join an input of `first` tokens in one batch.
    By length: the first run of cut_sorted over it and the inputs no longer than it, longest
    first (ties in the order given). Else every input in the order given, each taken while
    the batch stays within max_inputs and its size x padded(longest) within max_tokens."""
    if by_length:
        shorter = sorted((i for i in range(len(lengths)) if lengths[i] <= first), key=lambda i: -lengths[i])
        run = cut_sorted([first, *(lengths[i] for i in shorter)], padded, max_tokens, max_inputs)[0]
        return shorter[: run - 1]
    chosen: list[int] = []
    width = first
    for i in range(len(lengths)):
        if len(chosen) + 1 >= max_inputs:
            break
        new_width = max(width, lengths[i])
        if (len(chosen) + 2) * padded(new_width) <= max_tokens:
            chosen.append(i)
            width = new_width
    return chosen


def length_batches(lengths: Sequence[int], padded: Callable[[int], int], max_tokens: int, max_inputs: int) -> list[list[int]]:
    """All inputs in batches (lists of indices into `lengths`): cut_sorted's runs, longest
    first, so a batch that runs out of memory does so at once."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, at = [], 0
    for k in cut_sorted([lengths[i] for i in order], padded, max_tokens, max_inputs):
        batches.append(order[at : at + k])
        at += k
    return batches
