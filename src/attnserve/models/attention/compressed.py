"""Memory-compressed attention (Liu et al. 2018, "Generating Wikipedia by Summarizing Long
Sequences"): a strided convolution shortens keys and values before softmax attention.

Keys and values each pass a 1-D convolution over the sequence (kernel `kernel`, stride
`stride`, one filter per channel); every query attends to the N/stride compressed rows. Time
O(N^2 / stride), memory O(N) through the fused attention kernel.

Initialisation (no training happens here): each filter averages its window, so a compressed
key is the mean key of `kernel` consecutive tokens. Padding is left out: every compressed row
is divided by the filter mass its real tokens carry, and rows with none are masked.

Parameters:
    kernel: convolution width in tokens (>= stride, so no token is skipped).
    stride: compression factor.
"""
from __future__ import annotations

import dataclasses
import math

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights, check
from attnserve.models.attention.blocks import dense_rows_attention


@dataclasses.dataclass
class CompressedConfig(AttentionConfig):
    variant: ClassVar[str] = "compressed"
    kernel: int = 3
    stride: int = 3

    def validate(self, max_length):
        super().validate(max_length)
        check(self.stride >= 1, "stride", f"must be >= 1 (got {self.stride})")
        check(self.kernel >= self.stride, "kernel", f"must be >= stride {self.stride} so no token is skipped (got {self.kernel})")
        check(self.kernel <= max_length, "kernel", f"must be <= max_length {max_length} (got {self.kernel})")


class MemoryCompressedAttention(Attention):
    config_class = CompressedConfig
    rotary_refused = "it convolves the keys of neighbouring positions into one, so no score sees a key's own position"
    cost = "O(N^2 / stride)"
    adapt_lr = 0.01

    @classmethod
    def dense_keys(cls, config, n):
        return n // config.stride

    @classmethod
    def length_multiple(cls, config):
        return math.lcm(config.stride, config.kernel)

    @classmethod
    def exact_up_to(cls, config, max_length):
        # A compressed key averages `kernel` tokens: exact only when that is one token.
        return max_length if config.kernel == 1 else 0

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        channels = num_heads * head_dim
        average = torch.full((channels, 1, config.kernel), 1.0 / config.kernel)
        self.key_conv = nn.Parameter(average.clone())
        self.value_conv = nn.Parameter(average.clone())

    def _windows(self, n):
        # Pad so that ceil(n / stride) windows fit: output row s reads tokens s*stride ... .
        c = self.config
        return (-n) % c.stride + c.kernel - c.stride

    def compress(self, x, weight, key_valid):
        batch, heads, n, dim = x.shape
        mask = key_valid[:, None, :].to(x.dtype)
        channels = (x.transpose(2, 3).reshape(batch, heads * dim, n)) * mask
        pad = self._windows(n)
        summed = F.conv1d(F.pad(channels, (0, pad)), weight, stride=self.config.stride, groups=heads * dim)
        mass = F.conv1d(F.pad(mask, (0, pad)), self._mass_filter(x), stride=self.config.stride)  # (B, 1, M)
        out = summed / mass.clamp(min=1e-12)
        # contiguous: the fused attention kernel needs unit stride on the feature dim.
        return out.view(batch, heads, dim, -1).transpose(2, 3).contiguous(), mass[:, 0] > 0

    def _mass_filter(self, x):
        return torch.full((1, 1, self.config.kernel), 1.0 / self.config.kernel, dtype=x.dtype, device=x.device)

    def forward(self, q, k, v, key_valid, need_weights=False):
        k_c, slot_valid = self.compress(k, self.key_conv, key_valid)
        v_c, _ = self.compress(v, self.value_conv, key_valid)
        out, probs = dense_rows_attention(q, k_c, v_c, slot_valid, self.scale, need_weights)
        if not need_weights:
            return out, None
        # Effective token weights: each compressed row spreads its weight evenly over the real
        # tokens of its window (what the averaging filters do).
        n = q.shape[2]
        rows = probs.shape[-1]
        token = torch.arange(n, device=q.device)
        start = torch.arange(rows, device=q.device) * self.config.stride
        covers = ((token[None] >= start[:, None]) & (token[None] < start[:, None] + self.config.kernel)).to(q.dtype)
        covers = covers[None] * key_valid[:, None, :].to(q.dtype)
        spread = covers / covers.sum(-1, keepdim=True).clamp(min=1e-12)
        effective = torch.einsum("bhqm,bmn->bhqn", probs, spread)
        return out, [SlotWeights(token, token.view(1, 1, 1, n), effective)]
