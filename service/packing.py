"""Which inputs share a batch: grouped by length, so that little of a batch is padding.

A batch runs at the length of its longest input (padded as the runner pads it), so a 20-token
text beside a 250-token one costs 250 tokens of work. Both the server's batcher
(service/batching.py, which keeps its round-robin choice of the first input) and the in-process
embedder (service/embedder.py, which starts each batch at the longest input left) fill a batch
with the inputs nearest in length to the one it starts from. Hand-written rather than taken
from a library: it is one sort and one greedy pass, under the budget the runner's padding sets.
"""
from __future__ import annotations

from typing import Callable, Sequence


def fill_batch(first: int, lengths: Sequence[int], padded: Callable[[int], int], max_tokens: int, max_inputs: int,
               by_length: bool = True) -> list[int]:
    """Indices into `lengths` of the inputs that join an input of `first` tokens in one batch:
    nearest in length first (ties, or every input with by_length=False: in the order given),
    each taken while the batch stays within `max_inputs` inputs and its size x padded(longest)
    within `max_tokens`. An input that does not fit is passed over for the next one."""
    order = sorted(range(len(lengths)), key=lambda i: abs(lengths[i] - first)) if by_length else range(len(lengths))
    chosen: list[int] = []
    width = first
    for i in order:
        if len(chosen) + 1 >= max_inputs:
            break
        new_width = max(width, lengths[i])
        if (len(chosen) + 2) * padded(new_width) <= max_tokens:
            chosen.append(i)
            width = new_width
    return chosen


def length_batches(lengths: Sequence[int], padded: Callable[[int], int], max_tokens: int, max_inputs: int) -> list[list[int]]:
    """All inputs in batches (lists of indices into `lengths`), each started from the longest
    input left and filled by fill_batch: the longest first, so a batch that runs out of memory
    does so at once."""
    left = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = []
    while left:
        first, rest = left[0], left[1:]
        mates = [rest[j] for j in fill_batch(lengths[first], [lengths[i] for i in rest], padded, max_tokens, max_inputs)]
        batches.append([first] + mates)
        taken = set(mates)
        left = [i for i in rest if i not in taken]
    return batches
