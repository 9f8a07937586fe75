"""Attention maps from the analysis graph's slot form: COO conversion, and what a map will
cost before it is computed (so a request over the memory budget is refused in milliseconds).

A layer's weights come as pieces (rows (B|1,H|1,R), cols (B|1,H|1,R|1,S), probs (B,H,R,S)):
query rows[r] pays probs[h, r, s] to key cols[r, s] (see models.attention.base.SlotWeights).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# ONNX Runtime's peak while the analysis graph computes one layer's map, beyond the process's
# size before it: ANALYSIS_RUN_BYTES + ANALYSIS_RUN_FACTOR x the layer's probs (4 bytes each):
# the other layers' activations, the slot scores, masks and softmax of the layer asked for.
# Measured with the map's conversion to COO on the bundled MiniLM's longformer (window 512), in a
# fresh process (tests/test_export_runtime.py): 550-760 MiB at 1,024 tokens (it varies from run
# to run there), 620-650 at 2,048, 1,285-1,322 at 4,096, 2,505-2,552 at 8,192; in a process that
# has served other maps and embeddings (`attnserve bench maps`, docs/results/maps.md) up to 1,073
# at 2,048 (bigbird) and 2,565 at 8,192. The estimate says 846, 1,132, 1,704 and 2,847.
ANALYSIS_RUN_BYTES = 560 * 2**20
ANALYSIS_RUN_FACTOR = 8
# Bytes per non-zero while slot form becomes COO: kept rows and columns (int64), values
# (float64), the (row, col) keys and np.unique's sort and inverse.
COO_WORK_BYTES = 64
# Bytes per non-zero of a sparse JSON answer while it is written (Python numbers of three
# lists, then the JSON text).
SPARSE_ANSWER_BYTES = 130


@dataclass(frozen=True)
class MapCost:
    """Upper bounds for one layer's map over n tokens: its non-zeros (one head, or the union
    over heads for the mean) and the bytes held while it is computed (ONNX Runtime's run of the
    analysis graph, the layer's outputs and their conversion to COO), before any answer is
    written."""

    entries: int
    work_bytes: int


def compact_to_coo(pieces, n: int, head: int | None, num_heads: int):
    """Slot-form attention pieces of batch row 0 -> COO (rows, cols, values) over n tokens, one
    head or the head mean, duplicates summed, sorted by (row, col). numpy twin of
    models.sparse.to_sparse. Pieces whose rows and columns all heads share are summed over
    heads in slot form first, so the mean costs one head's memory, not twelve."""
    all_rows, all_cols, all_vals = [], [], []
    for rows, cols, probs in pieces:
        probs = probs[0]  # (H, R, S)
        rows, cols = rows[0], cols[0]  # (H|1, R), (H|1, R|1, S)
        if head is not None:
            probs = probs[head : head + 1]
            rows = rows[head : head + 1] if rows.shape[0] > 1 else rows
            cols = cols[head : head + 1] if cols.shape[0] > 1 else cols
        elif rows.shape[0] == 1 and cols.shape[0] == 1:
            probs = probs.sum(0, keepdims=True)
        rows = np.broadcast_to(rows[:, :, None], probs.shape)
        cols = np.broadcast_to(cols, probs.shape)
        keep = (probs != 0) & (rows < n) & (cols >= 0) & (cols < n)
        all_rows.append(rows[keep])
        all_cols.append(cols[keep])
        all_vals.append(probs[keep].astype(np.float64))
    rows = np.concatenate(all_rows).astype(np.int64)
    cols = np.concatenate(all_cols).astype(np.int64)
    vals = np.concatenate(all_vals)
    keys, inverse = np.unique(rows * n + cols, return_inverse=True)
    summed = np.bincount(inverse.ravel(), weights=vals, minlength=len(keys))
    divisor = 1 if head is not None else num_heads
    return keys // n, keys % n, (summed / divisor).astype(np.float32)


_EXPRESSION = re.compile(r"^[\w\s+\-*/()]+$")


def dimension(value, symbols: dict[str, int], fallback: int) -> int:
    """One ONNX output dimension: an int, a symbol or an expression of the input's symbols
    ('256*s79') evaluated with their values; anything else counts as `fallback`."""
    if isinstance(value, int):
        return value
    text = str(value)
    if _EXPRESSION.match(text):
        try:
            return int(eval(text, {"__builtins__": {}}, dict(symbols)))  # noqa: S307 - only names, digits, + - * / ( )
        except Exception:  # a symbol of its own (no input dimension names it)
            pass
    return fallback


def map_cost(piece_shapes: list[tuple[tuple, tuple, tuple]], sequence_dim, padded: int, n: int, head: int | None) -> MapCost:
    """MapCost of one layer from its pieces' symbolic output shapes ((rows, cols, probs) of each
    piece), the input's symbolic sequence dimension and the padded length it will run at."""
    symbols = _solve(sequence_dim, padded)
    entries, work = 0, ANALYSIS_RUN_BYTES
    for rows_shape, cols_shape, probs_shape in piece_shapes:
        rows_d, cols_d, probs_d = ([dimension(d, symbols, padded) for d in s[1:]] for s in (rows_shape, cols_shape, probs_shape))
        heads, r, s = probs_d
        shared = rows_d[0] == 1 and cols_d[0] == 1
        # Padding rows and key slots never hold a weight: a map has at most n of either.
        per_map = min(r, n) * min(s, n) * (1 if head is not None or shared else heads)
        entries += per_map
        work += ANALYSIS_RUN_FACTOR * 4 * heads * r * s + 8 * int(np.prod(cols_d)) + 8 * int(np.prod(rows_d)) + COO_WORK_BYTES * per_map
    return MapCost(min(entries, n * n), work)


def _solve(sequence_dim, padded: int) -> dict[str, int]:
    """The value of the symbol in the input's sequence dimension ('256*s79' -> s79 = padded/256)."""
    text = str(sequence_dim)
    match = re.fullmatch(r"\s*(?:(\d+)\s*\*\s*)?([A-Za-z_]\w*)\s*", text)
    if not match:
        return {}
    factor = int(match.group(1) or 1)
    return {match.group(2): padded // factor}
