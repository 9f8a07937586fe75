"""Turn a layer's SlotWeights into one sparse token-by-token matrix."""
from __future__ import annotations

import torch

from attnserve.models.attention.base import SlotWeights


def _first(t: torch.Tensor, dims: int) -> torch.Tensor:
    """Bring t to `dims` dims by adding leading ones, then take batch row 0."""
    while t.dim() < dims:
        t = t[None]
    return t[0]


def to_sparse(weights: list[SlotWeights], n: int, head: int | None = None) -> torch.Tensor:
    """(n, n) sparse COO of batch row 0: one head, or the mean over heads when head is None.
    Weights a query gives the same token through several slots add up."""
    indices, values = [], []
    heads = weights[0].probs.shape[1]
    for rows, cols, probs in weights:
        probs = probs[0]  # (H, R, S)
        rows = _first(rows, 3)  # (H|1, R)
        cols = _first(cols, 4)  # (H|1, R|1, S)
        if head is not None:
            probs = probs[head : head + 1]
            rows = rows[head : head + 1] if rows.shape[0] > 1 else rows
            cols = cols[head : head + 1] if cols.shape[0] > 1 else cols
        rows = rows[:, :, None].expand_as(probs)
        cols = cols.expand_as(probs)
        keep = (probs != 0) & (rows < n) & (cols >= 0) & (cols < n)
        indices.append(torch.stack([rows[keep], cols[keep]]))
        values.append(probs[keep])
    divisor = 1 if head is not None else heads
    matrix = torch.sparse_coo_tensor(torch.cat(indices, dim=1), torch.cat(values) / divisor, (n, n))
    return matrix.coalesce()
