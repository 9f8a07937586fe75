"""Linformer attention (Wang et al. 2020): low-rank projection of keys and values.

Learned matrices E, F (k x max_length) project the N keys and values down to k rows; every
query attends to those k. O(N * k) time and memory. With `sharing="kv"` one matrix serves
keys and values (the paper's key-value sharing); with "none" E and F are separate.

Initialisation (no training happens here): block averaging, row s of E averaging the
max_length/k consecutive tokens of block s, so the k projected keys are the mean keys of
consecutive spans and attention reads a coarse summary of the document. Padding is left out:
each projected row is normalised by the projection mass of the real tokens it covers, and
rows that cover none are masked, so a document gives the same result alone or padded.

Parameters:
    k: projected length (rows of E and F), at most max_length.
    sharing: "kv" (E = F) or "none".
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from models.attention.base import Attention, AttentionConfig, SlotWeights, check
from models.attention.blocks import dense_rows_attention
from models.registry import register_attention


@dataclasses.dataclass
class LinformerConfig(AttentionConfig):
    k: int = 256
    sharing: str = "kv"

    def validate(self, max_length):
        super().validate(max_length)
        check(1 <= self.k <= max_length, "k", f"must be in 1..max_length {max_length} (got {self.k})")
        check(self.sharing in ("kv", "none"), "sharing", f"must be 'kv' or 'none' (got {self.sharing!r})")


def block_average(rows: int, length: int) -> torch.Tensor:
    """(rows, length): row s averages the tokens of the s-th of `rows` equal spans."""
    span = (torch.arange(length) * rows) // length
    matrix = (span[None, :] == torch.arange(rows)[:, None]).float()
    return matrix / matrix.sum(1, keepdim=True).clamp(min=1)


def project(projection, x, key_valid):
    """Projected rows (B, H, k, D) of x (B, H, N, D) over the real tokens, and which rows
    cover any real token (B, k). Also returns the normalised projection (B, k, N)."""
    n = x.shape[2]
    weights = projection[:, :n][None] * key_valid[:, None, :].to(x.dtype)  # (B, k, N)
    mass = weights.sum(-1, keepdim=True)
    normalised = weights / mass.clamp(min=1e-12)
    # matmul, not einsum: ONNX Runtime's Einsum kernel is slower than its MatMul.
    return torch.matmul(normalised[:, None], x), mass[..., 0] > 0, normalised


@register_attention("linformer")
class LinformerAttention(Attention):
    config_class = LinformerConfig
    cost = "O(N * k)"

    @classmethod
    def exact_up_to(cls, config, max_length):
        # Block averaging over max_length / k tokens: with k = max_length every projected row
        # is one token (E is the identity) and the k rows are the keys themselves; with fewer
        # rows, tokens 0 and 1 already share one averaged key.
        return max_length if config.k >= max_length else 0

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        self.E = nn.Parameter(block_average(config.k, max_length))
        self.F = self.E if config.sharing == "kv" else nn.Parameter(block_average(config.k, max_length))

    def forward(self, q, k, v, key_valid, need_weights=False):
        k_proj, slot_valid, e_norm = project(self.E, k, key_valid)
        v_proj, _, f_norm = project(self.F, v, key_valid)
        out, probs = dense_rows_attention(q, k_proj, v_proj, slot_valid, self.scale, need_weights)
        if not need_weights:
            return out, None
        n = q.shape[2]
        # Effective token weights: attention over the k rows times F's token weights.
        effective = torch.einsum("bhqk,bkn->bhqn", probs, f_norm)
        return out, [SlotWeights(torch.arange(n, device=q.device), torch.arange(n, device=q.device).view(1, 1, 1, n), effective)]
