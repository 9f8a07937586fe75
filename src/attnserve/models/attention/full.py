"""Full softmax attention (Vaswani et al. 2017, "Attention Is All You Need"): the baseline.

softmax(Q K^T / sqrt(d)) V over every pair of tokens: O(N^2) time. It runs through the fused
scaled_dot_product_attention kernel, which never stores the N x N scores, so memory stays
linear and 16,384 tokens fit. No parameters of its own.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights
from attnserve.models.attention.blocks import dense_rows_attention


@dataclasses.dataclass
class FullConfig(AttentionConfig):
    variant: ClassVar[str] = "full"


class FullAttention(Attention):
    config_class = FullConfig
    cost = "O(N^2)"
    is_mask = True

    @classmethod
    def dense_keys(cls, config, n):
        return n

    @classmethod
    def exact_up_to(cls, config, max_length):
        return max_length

    def forward(self, q, k, v, key_valid, need_weights=False):
        out, probs = dense_rows_attention(q, k, v, key_valid, self.scale, need_weights)
        if not need_weights:
            return out, None
        n = q.shape[2]
        cols = torch.arange(n, device=q.device).view(1, 1, 1, n)
        return out, [SlotWeights(torch.arange(n, device=q.device), cols, probs)]

    def allowed_mask(self, key_valid):
        n = key_valid.shape[1]
        return key_valid[:, None, None, :].expand(-1, 1, n, n)
