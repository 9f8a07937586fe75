"""How long the inputs of each graph of an export may be, read from the variant's class.

A graph's sequence axis is a multiple of the variant's `length_multiple` (its block); the short
graph covers what the variant computes exactly as full attention (`exact_up_to`); the analysis
graph is bounded by the memory its attention maps take.

Why a short graph: up to `Attention.exact_up_to` tokens a variant computes exactly what full
attention computes (a window or the blocks cover every token), yet its graph pads every input
to its granule (a 128-token text runs as 256 on longformer, at about 3x full's latency). Where
that range holds more than one granule, the export adds the same encoder with full attention
(same weights, positions and config) over a sequence axis of multiple 1, checked against the
variant's own PyTorch encoder, and the runner sends batches that fit in it there.
"""
from __future__ import annotations

from attnserve.export.graphs import layer_weights
from attnserve.models import registry
from attnserve.models.api import Encoder


def short_graph_length(config, max_length: int, encoder=None) -> int:
    """Capacity in tokens of an export's short graph, 0 for none: the longest input the variant
    computes exactly as full attention does (`Attention.exact_up_to`, and with `encoder` only
    while every layer's own parameters keep it: `Attention.keeps_exactness`), when that is more
    than one granule of its graph (inputs within one granule pad to it anyway) and the variant
    is not full attention at every length (then its own graph is the full path)."""
    multiple = registry.length_multiple(config)
    exact = min(registry.exact_up_to(config, max_length), max_length)
    if encoder is not None and not all(layer.attention.keeps_exactness() for layer in encoder.layers):
        return 0
    return exact if exact > multiple and (multiple > 1 or exact < max_length) else 0


# The analysis graph returns every layer's weights at once; its probs outputs may take at most
# this much memory, which bounds the tokens an attention-map request may have (dense variants:
# full, linformer, compressed, synthesizer give N x N effective weights).
ANALYSIS_BUDGET_BYTES = 2 << 30


def analysis_max_length(encoder: Encoder, multiple: int, capacity: int, max_length: int) -> int:
    """The longest input whose attention maps (all layers, float32) fit ANALYSIS_BUDGET_BYTES,
    from each layer's weights at two lengths (each layer grows linearly or quadratically: a
    schedule mixes both), at least two granules' worth."""
    n1 = min(capacity, multiple * -(-256 // multiple))
    n2 = min(capacity, 2 * n1)

    def elements(n) -> list[int]:
        return [sum(w.probs.numel() for w in weights) for weights in layer_weights(encoder, n)]

    if n2 <= n1:
        return max_length
    growth = [(e2, 2 if e2 / e1 > 3 else 1) for e1, e2 in zip(elements(n1), elements(n2))]

    def fits(n: int) -> bool:
        return 4 * sum(e2 * (n / n2) ** power for e2, power in growth) <= ANALYSIS_BUDGET_BYTES

    # The largest multiple of the granule from n2 to max_length that fits (fits is monotone).
    low, high = n2 // multiple, max_length // multiple
    if fits(max_length):
        return max_length
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle * multiple) else (low, middle - 1)
    return max(n2, low * multiple)
