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


# --------------------------------------------------------------------------- rotary positions (RoPE)


def check_rotary_positions(config, model: str) -> None:
    """ValueError for the learned-table position parameters (positions, position_period,
    attention_scaling) set on a rotary model, which has no table to stretch."""
    from attnserve.models.attention.base import DEFAULT_POSITION_PERIOD

    table = {"positions": "recurrent", "position_period": DEFAULT_POSITION_PERIOD, "attention_scaling": False}
    set_ = [f"{name}={getattr(config, name)!r}" for name, default in table.items() if getattr(config, name) != default]
    if set_:
        raise ValueError(f"{', '.join(set_)}: {model}'s positions are rotary (RoPE), with no position table to stretch; "
                         f"leave positions, position_period and attention_scaling at their defaults")


class Rotary(torch.nn.Module):
    """RoPE as transformers computes it: token i's angles i * base^(-2j/d) in float32, the
    vector's halves rotated together (rotate_half), base = theta. With dynamic NTK scaling
    (transformers' rope_type "dynamic": `ntk_factor` and the `trained_length`), a document of
    L > trained_length tokens takes base = theta * (factor * L / trained_length - (factor - 1))
    ** (d / (d - 2)). attnserve takes L per document, so that a document's vector never depends
    on what else shares its batch: it is transformers' for the document alone (transformers
    takes L as the padded width of the whole batch)."""

    def __init__(self, head_dim: int, theta: float, trained_length: int | None = None, ntk_factor: float | None = None):
        super().__init__()
        self.head_dim, self.theta = head_dim, float(theta)
        self.trained_length, self.ntk_factor = trained_length, ntk_factor
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        self.register_buffer("exponents", exponents, persistent=False)
        self.register_buffer("inverse_frequencies", 1.0 / (self.theta ** exponents), persistent=False)

    def forward(self, q, k, key_valid=None):
        """q, k: (B, H, N, D), token i at position i; key_valid (B, N): the real tokens, whose
        count is each document's L for dynamic NTK scaling."""
        positions = torch.arange(q.shape[2], device=q.device, dtype=torch.float32)
        if self.ntk_factor is None:
            angles = positions[:, None] * self.inverse_frequencies[None]  # (N, D/2)
        else:
            lengths = key_valid.sum(-1).to(torch.float32).clamp(min=float(self.trained_length))  # (B,)
            growth = self.ntk_factor * lengths / self.trained_length - (self.ntk_factor - 1)
            base = self.theta * growth ** (self.head_dim / (self.head_dim - 2))
            inverse = 1.0 / (base[:, None] ** self.exponents[None])  # (B, D/2)
            angles = (positions[None, :, None] * inverse[:, None, :])[:, None]  # (B, 1, N, D/2)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
