"""Learned position tables stretched past the length they were trained on (LongEmbed, Zhu et
al. 2024), for the families whose positions are a learned table (BERT, XLM-RoBERTa), and
LongEmbed's attention scaling.

Each scheme maps token indices (1, N) of documents with `lengths` real tokens (B,) onto a
table of `rows` rows: an integer tensor picks rows, a floating one is interpolated between
them. Grouped and interpolated stretch the table over each document by s = ceil(n / rows),
from the document's own length (LongEmbed's code takes the batch's padded width), so a
document gets the same positions alone and in a padded batch. Padding tokens are clamped onto
the last row; nothing reads them. The parameters that choose a scheme are every variant's
(attnserve.models.attention.base.AttentionConfig: positions, position_period,
attention_scaling).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnserve.models.attention.base import POSITION_SCHEMES


def document_lengths(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """(B,) int64: each document's number of real tokens (all of them without a mask)."""
    if attention_mask is None:
        return torch.full(input_ids.shape[:1], input_ids.shape[1], dtype=torch.long, device=input_ids.device)
    return attention_mask.to(torch.long).sum(1)


def recurrent_positions(index, lengths, rows: int, period: int):
    """Row i mod period: the table tiled (period 512) or restarted every period tokens."""
    return index % period


def group_size(lengths, rows: int):
    """(B, 1) int64: s = max(1, ceil(n / rows)), the tokens sharing one row."""
    return torch.div(lengths + (rows - 1), rows, rounding_mode="floor").clamp(min=1)[:, None]


def grouped_positions(index, lengths, rows: int, period: int):
    """Row floor(i / s): s neighbouring tokens share a position."""
    return torch.div(index, group_size(lengths, rows), rounding_mode="floor").clamp(max=rows - 1)


def interpolated_positions(index, lengths, rows: int, period: int):
    """Fractional position i / s, read between its two neighbouring rows."""
    return (index.to(torch.float32) / group_size(lengths, rows).to(torch.float32)).clamp(max=rows - 1)


POSITIONS = {"recurrent": recurrent_positions, "grouped": grouped_positions, "interpolated": interpolated_positions,
             # Recurrent rows; the embeddings add the learned offsets past the table.
             "learned": recurrent_positions}
assert tuple(POSITIONS) == POSITION_SCHEMES, "every position scheme the config accepts has a definition here"


def look_up(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rows of `table` (rows, d) at `positions` (..., N): integer positions pick rows, fractional
    ones are linear interpolation between the rows either side (exactly the row at an integer)."""
    if not positions.is_floating_point():
        return F.embedding(positions, table)
    low = positions.floor()
    below = F.embedding(low.to(torch.long), table)
    above = F.embedding((low.to(torch.long) + 1).clamp(max=table.shape[0] - 1), table)
    return below + (positions - low)[..., None] * (above - below)


def query_scale(key_valid: torch.Tensor, rows: int) -> torch.Tensor:
    """(B, 1, 1, 1): max(1, log n / log rows) for documents of n real tokens, exactly 1 up to
    `rows` tokens (LongEmbed's attention scaling, with n from the mask, not the padded width)."""
    n = key_valid.sum(1).to(torch.float32)
    factor = torch.where(n > rows, torch.log(n) / math.log(rows), torch.ones_like(n))
    return factor[:, None, None, None]
