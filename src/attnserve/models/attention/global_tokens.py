"""Global-token attention (the global part of Longformer / ETC / BigBird).

A few chosen tokens attend to every token and every token attends to them; any other token
sees only those global tokens and itself. O(N * g) for g global tokens.

Parameters:
    global_tokens: positions of the global tokens (0 is [CLS]); positions past a document's
        end are ignored for that document.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from attnserve.models.attention.base import Attention, AttentionConfig, check
from attnserve.models.attention.blocks import band_exact_up_to, banded_attention, banded_mask, global_positions


@dataclasses.dataclass
class GlobalConfig(AttentionConfig):
    variant: ClassVar[str] = "global"
    global_tokens: tuple[int, ...] = (0,)

    def validate(self, max_length):
        super().validate(max_length)
        check(len(self.global_tokens) >= 1, "global_tokens", "name at least one position")
        check(len(set(self.global_tokens)) == len(self.global_tokens), "global_tokens", "positions must be distinct")
        check(all(0 <= p < max_length for p in self.global_tokens), "global_tokens", f"positions must be in 0..{max_length - 1}")


class GlobalTokenAttention(Attention):
    config_class = GlobalConfig
    cost = "O(N * g)"
    is_mask = True
    # Query block of the band: a band of half-width 0 is "itself", and blocks of 32 keep the
    # gathered context (block + the global keys) small. Also the graph's sequence granule.
    BAND_BLOCK = 32

    @classmethod
    def length_multiple(cls, config):
        return cls.BAND_BLOCK

    @classmethod
    def exact_up_to(cls, config, max_length):
        # Exact while at most one token is not global: 2 tokens with global_tokens (0,).
        return band_exact_up_to(0, config.global_tokens, max_length)

    def forward(self, q, k, v, key_valid, need_weights=False):
        rows = global_positions(self.config.global_tokens, key_valid)
        return banded_attention(q, k, v, key_valid, 0, self.BAND_BLOCK, self.scale, rows, need_weights)

    def allowed_mask(self, key_valid):
        return banded_mask(key_valid, 0, global_positions(self.config.global_tokens, key_valid))
