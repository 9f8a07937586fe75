"""Linformer attention (Wang et al. 2020): low-rank projection of keys and values.

Learned matrices E, F project the N keys and values down to k rows; every query attends to
those k. O(N * k) time and memory. With `sharing="kv"` one matrix serves keys and values (the
paper's key-value sharing); with "none" E and F are separate.

E is learned over the relative position in each document rather than over absolute
positions: it holds k x P logits, P = max(k, 512) columns (at most max_length), and token j of
a document of n real tokens reads column floor(j * P / n). Row s of the projection is the
softmax of its logits over the document's real tokens, so every projected key is a weighted
mean of keys (a distribution, which is what keeps distillation stable: an unconstrained E
drifts to rows of mixed sign and near-zero mass). A document of any length gets all k rows,
and what `attnserve adapt` learns on 512-token windows carries to every length without the
parameters growing with max_length.

Initialisation: block averaging, row s averaging the s-th of k equal spans of the document
(logit 0 inside, -20 outside), so the k projected keys are the mean keys of consecutive spans
and attention reads a coarse summary of the document. A row whose weight falls on positions
the document does not have (its real tokens carry less than half of the row's peak weight in
all) is masked, so short documents get no spurious mean rows, and padding is left out of
every row: a document gives the same result alone or padded.

Parameters:
    k: projected length (rows of E and F), at most max_length.
    sharing: "kv" (E = F) or "none".
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights, check
from attnserve.models.attention.blocks import dense_rows_attention


@dataclasses.dataclass
class LinformerConfig(AttentionConfig):
    variant: ClassVar[str] = "linformer"
    k: int = 256
    sharing: str = "kv"

    def validate(self, max_length):
        super().validate(max_length)
        check(1 <= self.k <= max_length, "k", f"must be in 1..max_length {max_length} (got {self.k})")
        check(self.sharing in ("kv", "none"), "sharing", f"must be 'kv' or 'none' (got {self.sharing!r})")


BASIS = 512  # columns E is learned over at least: the pretrained position table's length
OUTSIDE = -20.0  # initial logit outside a row's span: exp(-20) * 16384 tokens < 1e-4 leaks in


def basis_columns(k: int, max_length: int) -> int:
    return min(max_length, max(k, BASIS))


def block_logits(rows: int, columns: int) -> torch.Tensor:
    """(rows, columns): 0 where column c lies in the s-th of `rows` equal spans, OUTSIDE elsewhere."""
    span = (torch.arange(columns) * rows) // columns
    return torch.where(span[None, :] == torch.arange(rows)[:, None], 0.0, OUTSIDE)


def column_of_token(key_valid: torch.Tensor, columns: int) -> torch.Tensor:
    """(B, N) int64: the column token j of each document reads, floor(j * columns / n) with n
    the document's real tokens (padding clamps onto the last column; it is masked anyway)."""
    n = key_valid.sum(1, keepdim=True).clamp(min=1)
    j = torch.arange(key_valid.shape[1], device=key_valid.device)[None]
    return torch.div(j * columns, n, rounding_mode="floor").clamp(max=columns - 1)


def project(logits, columns, x, key_valid):
    """Projected rows (B, H, k, D) of x (B, H, N, D) over the real tokens, and which rows
    the document fills (B, k). Also returns the normalised projection (B, k, N). `columns`:
    the P columns of logits that are positions (an export may append a spare one)."""
    logits = logits[:, :columns]
    peak = logits - logits.amax(1, keepdim=True)  # each row's largest weight is 1
    weights = peak.exp()[:, column_of_token(key_valid, columns)].transpose(0, 1)  # (B, k, N)
    weights = weights * key_valid[:, None, :].to(x.dtype)
    mass = weights.sum(-1, keepdim=True)
    normalised = weights / mass.clamp(min=1e-12)
    # matmul, not einsum: ONNX Runtime's Einsum kernel is slower than its MatMul.
    return torch.matmul(normalised[:, None], x), mass[..., 0] >= 0.5, normalised


class LinformerAttention(Attention):
    config_class = LinformerConfig
    rotary_refused = "it projects the keys of all positions onto k rows, so no score sees a key's own position"
    cost = "O(N * k)"
    adapt_lr = 0.05

    @classmethod
    def exact_up_to(cls, config, max_length):
        # The initial E sends token j of a document of n <= k tokens to its own row,
        # floor(j * k / n), when the k rows split the P columns evenly (an adapted E need not).
        exact = config.k >= 2 and basis_columns(config.k, max_length) % config.k == 0
        return config.k if exact else 0

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        self.columns = basis_columns(config.k, max_length)
        self.E = nn.Parameter(block_logits(config.k, self.columns))
        self.F = self.E if config.sharing == "kv" else nn.Parameter(block_logits(config.k, self.columns))

    def keeps_exactness(self) -> bool:
        # Exact only with the initial E and F (an export may give them one spare zero column).
        initial = block_logits(self.config.k, self.columns)
        return all(torch.equal(p.detach()[:, : self.columns].cpu(), initial) for p in (self.E, self.F))

    def forward(self, q, k, v, key_valid, need_weights=False):
        k_proj, slot_valid, e_norm = project(self.E, self.columns, k, key_valid)
        v_proj, _, f_norm = project(self.F, self.columns, v, key_valid)
        out, probs = dense_rows_attention(q, k_proj, v_proj, slot_valid, self.scale, need_weights)
        if not need_weights:
            return out, None
        n = q.shape[2]
        # Effective token weights: attention over the k rows times F's token weights.
        effective = torch.einsum("bhqk,bkn->bhqn", probs, f_norm)
        return out, [SlotWeights(torch.arange(n, device=q.device), torch.arange(n, device=q.device).view(1, 1, 1, n), effective)]
