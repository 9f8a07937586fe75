"""Longformer attention (Beltagy et al. 2020): a sliding window plus global tokens.

Every token sees its window (window/2 tokens each side) and the global tokens; global tokens
see everything. O(N * (window + g)).

Parameters:
    window: span of the sliding window in tokens (512 = 256 each side).
    global_tokens: positions with global attention (0 is [CLS], Longformer's choice for
        classification and embedding).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from attnserve.models.attention.blocks import band_exact_up_to, banded_attention, banded_mask, global_positions
from attnserve.models.attention.global_tokens import GlobalConfig
from attnserve.models.attention.local import LocalConfig, SlidingWindowAttention


@dataclasses.dataclass
class LongformerConfig(LocalConfig, GlobalConfig):
    variant: ClassVar[str] = "longformer"
    def validate(self, max_length):
        LocalConfig.validate(self, max_length)
        GlobalConfig.validate(self, max_length)


class LongformerAttention(SlidingWindowAttention):
    """local's window and granule, plus the global tokens."""

    config_class = LongformerConfig
    cost = "O(N * (window + g))"

    @classmethod
    def exact_up_to(cls, config, max_length):
        # The global tokens see everything, so only the others must lie within one window:
        # with window 512 and [CLS] global, tokens 1..257 are, i.e. 258 tokens.
        return band_exact_up_to(config.window // 2, config.global_tokens, max_length)

    def forward(self, q, k, v, key_valid, need_weights=False):
        half = self.config.window // 2
        rows = global_positions(self.config.global_tokens, key_valid)
        return banded_attention(q, k, v, key_valid, half, None, self.scale, rows, need_weights)

    def allowed_mask(self, key_valid):
        rows = global_positions(self.config.global_tokens, key_valid)
        return banded_mask(key_valid, self.config.window // 2, rows)
