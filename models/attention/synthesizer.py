"""Synthesizer attention (Tay et al. 2021, "Synthesizer: Rethinking Self-Attention"): the
attention weights do not come from query-key dot products.

mode "random" (factorised random synthesizer): per head, learned R1, R2 (max_length x rank)
and weights softmax(R1 R2^T): the same for every input, a function of positions only.
mode "dense" (dense synthesizer): per head, token i's row of weights is W2 relu(W1 x_i),
a function of that token alone (x_i is taken after the pretrained query projection).

Both are softmax(A B^T) V for some A, B of `rank` columns, so they run through the fused
attention kernel: O(N^2 * rank) time, O(N) memory.

Initialisation (no training happens here): "random" starts as a smooth local kernel,
R1_i . R2_j = sharpness * sum_m cos(w_m (i - j)) over log-spaced frequencies, i.e. soft
attention to nearby positions, so the pretrained FFNs see sensible mixtures. "dense" starts
with W2 = 0, i.e. uniform attention over the document (a running mean).

Parameters:
    mode: "random" or "dense".
    rank: columns of the factors (8-32 is the paper's range; at most 2 x head size for
        "random", and the dense hidden width for "dense").
    sharpness: scale of the initial local kernel ("random" only).
    width: tokens over which the initial kernel decays ("random" only).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from models.attention.base import Attention, AttentionConfig, SlotWeights, check
from models.attention.blocks import dense_rows_attention
from models.registry import register_attention


@dataclasses.dataclass
class SynthesizerConfig(AttentionConfig):
    mode: str = "random"
    rank: int = 32
    sharpness: float = 1.0
    width: int = 64

    def validate(self, max_length):
        super().validate(max_length)
        check(self.mode in ("random", "dense"), "mode", f"must be 'random' or 'dense' (got {self.mode!r})")
        check(2 <= self.rank <= 64 and self.rank % 2 == 0, "rank", f"must be even and in 2..64 (got {self.rank})")
        check(self.width >= 1, "width", f"must be >= 1 (got {self.width})")


def local_kernel_factors(length: int, rank: int, width: int, sharpness: float) -> torch.Tensor:
    """(length, rank) F with F_i . F_j = sharpness * sum_m cos(w_m (i - j)): peaked at i = j,
    decaying over about `width` tokens; log-spaced frequencies avoid periodic echoes."""
    freqs = math.pi / width * torch.logspace(0, -math.log10(length / width + 1), rank // 2)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * freqs[None].double()
    factors = torch.cat([angles.cos(), angles.sin()], dim=1) * math.sqrt(sharpness)
    return factors.float()


@register_attention("synthesizer")
class SynthesizerAttention(Attention):
    config_class = SynthesizerConfig
    cost = "O(N^2 * rank)"

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        r = config.rank
        if config.mode == "random":
            factors = local_kernel_factors(max_length, r, config.width, config.sharpness)
            self.left = nn.Parameter(factors[None].repeat(num_heads, 1, 1))  # R1
            self.right = nn.Parameter(factors[None].repeat(num_heads, 1, 1))  # R2
        else:
            generator = torch.Generator().manual_seed(0)
            self.hidden = nn.Parameter(torch.randn(num_heads, head_dim, r, generator=generator) / math.sqrt(head_dim))  # W1
            self.right = nn.Parameter(torch.zeros(num_heads, max_length, r))  # W2, one column per position

    def factors(self, q):
        """A (B|1, H, N, rank) and B (1, H, N, rank) with weights softmax(A B^T)."""
        n = q.shape[2]
        right = self.right[None, :, :n]
        if self.config.mode == "random":
            return self.left[None, :, :n], right
        return torch.relu(torch.matmul(q, self.hidden)), right  # (B, H, N, rank)

    def forward(self, q, k, v, key_valid, need_weights=False):
        a, b = self.factors(q)
        batch, heads, n, dim = q.shape
        a = a.expand(batch, -1, -1, -1)
        b = b.expand(batch, -1, -1, -1)
        # The fused kernel wants one width for queries, keys and values: pad all to the widest.
        width = max(a.shape[-1], dim)
        pad = lambda x: F.pad(x, (0, width - x.shape[-1]))  # noqa: E731
        out, probs = dense_rows_attention(pad(a), pad(b), pad(v), key_valid, 1.0, need_weights)
        out = out[..., :dim]
        if not need_weights:
            return out, None
        return out, [SlotWeights(torch.arange(n, device=q.device), torch.arange(n, device=q.device).view(1, 1, 1, n), probs)]
