"""Strided (dilated) attention, the strided pattern of Sparse Transformers (Child et al. 2019)
and Longformer's dilated windows.

Token i attends to the tokens i + s * stride for |s| <= window/2: a window of `window` keys
spread `stride` tokens apart, covering window * stride tokens of text at O(N * window) cost.
Computed by regrouping the sequence by residue mod stride, where the dilated window becomes an
ordinary sliding window.

Parameters:
    stride: distance in tokens between two keys a token sees (1 is plain local attention).
    window: number of strided steps in the window; window/2 steps on each side.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights, check, pad_to_multiple
from attnserve.models.attention.blocks import band_exact_up_to, banded_attention


@dataclasses.dataclass
class StridedConfig(AttentionConfig):
    variant: ClassVar[str] = "strided"
    stride: int = 4
    window: int = 128

    def validate(self, max_length):
        super().validate(max_length)
        check(self.stride >= 1, "stride", f"must be >= 1 (got {self.stride})")
        check(self.window >= 2, "window", f"must be >= 2 steps (got {self.window})")


class StridedAttention(Attention):
    config_class = StridedConfig
    cost = "O(N * window)"
    is_mask = True

    @classmethod
    def length_multiple(cls, config):
        return config.stride * max(1, config.window // 2)

    @classmethod
    def exact_up_to(cls, config, max_length):
        # Neighbours are `stride` apart: with stride > 1 token 1 never sees token 0.
        return band_exact_up_to(config.window // 2, (), max_length) if config.stride == 1 else 0

    def forward(self, q, k, v, key_valid, need_weights=False):
        stride, half = self.config.stride, self.config.window // 2
        batch, heads, n, dim = q.shape

        def by_residue(x):  # (B, H, N, D) -> (B * stride, H, N / stride, D)
            x = pad_to_multiple(x, stride, dim=2)
            return x.view(batch, heads, -1, stride, dim).permute(0, 3, 1, 2, 4).reshape(batch * stride, heads, -1, dim)

        valid = pad_to_multiple(key_valid, stride, dim=1, value=False)
        valid = valid.view(batch, -1, stride).transpose(1, 2).reshape(batch * stride, -1)
        out, weights = banded_attention(by_residue(q), by_residue(k), by_residue(v), valid, half, None, self.scale, None, need_weights)
        steps = out.shape[2]
        out = out.view(batch, stride, heads, steps, dim).permute(0, 2, 3, 1, 4).reshape(batch, heads, steps * stride, dim)[:, :, :n]
        if need_weights:
            (_, cols, probs), = weights
            rows_per_residue = probs.shape[2]
            probs = probs.view(batch, stride, heads, rows_per_residue, -1).permute(0, 2, 3, 1, 4)
            residue = torch.arange(stride, device=q.device).view(1, stride, 1)
            cols = cols[0, 0].view(rows_per_residue, 1, -1) * stride + residue  # step -> token
            weights = [SlotWeights(torch.arange(rows_per_residue * stride, device=q.device),
                                   cols.reshape(1, 1, rows_per_residue * stride, -1),
                                   probs.reshape(batch, heads, rows_per_residue * stride, -1))]
        return out, weights

    def allowed_mask(self, key_valid):
        n = key_valid.shape[1]
        pos = torch.arange(n, device=key_valid.device)
        gap = pos[:, None] - pos[None, :]
        allowed = (gap % self.config.stride == 0) & (gap.abs() <= (self.config.window // 2) * self.config.stride)
        return (allowed[None] & key_valid[:, None, :])[:, None]
