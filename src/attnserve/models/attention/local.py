"""Local (sliding-window) attention, as in Image Transformer / Longformer's local part.

Each token attends to the tokens at most window/2 positions away on either side, computed
block by block (blocks of window/2 tokens, each reading itself and its two neighbours), so
time and memory are O(N * window).

Parameters:
    window: span of the window in tokens; a token sees window/2 tokens on each side (512
        means 256 each side).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from attnserve.models.attention.base import Attention, AttentionConfig, check
from attnserve.models.attention.blocks import band_exact_up_to, banded_attention, banded_mask


@dataclasses.dataclass
class LocalConfig(AttentionConfig):
    variant: ClassVar[str] = "local"
    window: int = 512

    def validate(self, max_length):
        super().validate(max_length)
        check(self.window >= 2, "window", f"must be >= 2 tokens (got {self.window})")


class SlidingWindowAttention(Attention):
    config_class = LocalConfig
    bounded_span = True
    cost = "O(N * window)"
    is_mask = True

    @classmethod
    def length_multiple(cls, config):
        return max(1, config.window // 2)

    @classmethod
    def exact_up_to(cls, config, max_length):
        # Every token within window/2 of every other: window/2 + 1 tokens (257 at 512).
        return band_exact_up_to(config.window // 2, (), max_length)

    def forward(self, q, k, v, key_valid, need_weights=False):
        half = self.config.window // 2
        return banded_attention(q, k, v, key_valid, half, None, self.scale, None, need_weights)

    def allowed_mask(self, key_valid):
        return banded_mask(key_valid, self.config.window // 2)
