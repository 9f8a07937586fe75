"""Synthesizer attention (Tay et al. 2021, "Synthesizer: Rethinking Self-Attention"): the
attention weights do not come from query-key dot products.

mode "random" (factorised random synthesizer): learned R1, R2 (max_length x rank) and weights
softmax(R1 R2^T): the same for every input, a function of positions only. One pair per layer,
shared by all heads. The paper learns a pair per head; untrained, every head would hold the
same initial pair, so sharing it keeps the outputs and cuts the parameters 12x (75M to 6M at
16,384 tokens, where the encoder itself has 22M). The fused kernel then computes each softmax
once for two heads (see SHARED_VALUE_WIDTH). R1 and R2 are position tables: `attnserve adapt`
trains their first 512 rows, and those load into any max_length.
mode "dense" (dense synthesizer): per head, token i's row of weights is W2 relu(W1 x_i),
a function of that token alone (x_i is taken after the pretrained query projection).

Both are softmax(A B^T) V for some A, B of `rank` columns, so they run through the fused
attention kernel: O(N^2 * rank) time, O(N) memory.

Initialisation (what serves without adapted weights): "random" starts as a smooth local kernel,
R1_i . R2_j = sharpness * sum_m cos(w_m (i - j)) over log-spaced frequencies, i.e. soft
attention to nearby positions, so the pretrained FFNs see sensible mixtures. "dense" starts
with W2 = 0, i.e. uniform attention over the document (a running mean).

Parameters:
    mode: "random" or "dense".
    rank: columns of the factors (8-32 is the paper's range; the dense hidden width for
        "dense").
    sharpness: scale of the initial local kernel ("random" only).
    width: tokens over which the initial kernel decays ("random" only).
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


# Values per fused-kernel call when heads share their weights (mode "random"). Two heads
# (64) rather than all twelve (384): one wide call would suit eager PyTorch, but ONNX
# Runtime's CPU attention has its fast path only up to 64-wide heads (DEVELOPERS.md) and
# CUDA's flash kernels stop at 256; 64 still beats per-head calls in both runtimes.
SHARED_VALUE_WIDTH = 64


@dataclasses.dataclass
class SynthesizerConfig(AttentionConfig):
    variant: ClassVar[str] = "synthesizer"
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


class SynthesizerAttention(Attention):
    config_class = SynthesizerConfig
    rotary_refused = "its scores are synthesised without query-key products, so rotations never reach them"
    cost = "O(N^2 * rank)"
    adapt_lr = 0.01
    position_tables = ("left", "right")  # R1, R2 (random) and W2 (dense): a row per position
    # exact_up_to stays 0: its weights never come from query-key products.

    @classmethod
    def dense_keys(cls, config, n):
        return n

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        r = config.rank
        if config.mode == "random":
            factors = local_kernel_factors(max_length, r, config.width, config.sharpness)
            self.left = nn.Parameter(factors[None].clone())  # R1, shared by the heads
            self.right = nn.Parameter(factors[None].clone())  # R2
        else:
            generator = torch.Generator().manual_seed(0)
            self.hidden = nn.Parameter(torch.randn(num_heads, head_dim, r, generator=generator) / math.sqrt(head_dim))  # W1
            self.right = nn.Parameter(torch.zeros(num_heads, max_length, r))  # W2, one column per position

    def factors(self, q):
        """A (B|1, G, N, rank) and B (1, G, N, rank) with weights softmax(A B^T): G = 1 (one
        set of weights for all heads) or G = H."""
        n = q.shape[2]
        right = self.right[None, :, :n]
        if self.config.mode == "random":
            return self.left[None, :, :n], right
        return torch.relu(torch.matmul(q, self.hidden)), right  # (B, H, N, rank)

    def forward(self, q, k, v, key_valid, need_weights=False):
        a, b = self.factors(q)
        batch, heads, n, dim = q.shape
        # Heads that share weights are run in groups, each group's values side by side:
        # (B, G, N, H / G * D). One call per group computes the softmax once for its heads.
        groups = max(a.shape[1], heads * dim // SHARED_VALUE_WIDTH)
        values = v.transpose(1, 2).reshape(batch, n, groups, heads // groups * dim).transpose(1, 2)
        # The fused kernel wants one width for queries, keys and values: pad all to the widest.
        width = max(a.shape[-1], values.shape[-1])
        pad = lambda x: F.pad(x, (0, width - x.shape[-1]))  # noqa: E731
        a = a.expand(batch, groups, -1, -1)
        b = b.expand(batch, groups, -1, -1)
        out, probs = dense_rows_attention(pad(a), pad(b), pad(values), key_valid, 1.0, need_weights)
        out = out[..., : values.shape[-1]].transpose(1, 2).reshape(batch, n, heads, dim).transpose(1, 2)
        if not need_weights:
            return out, None
        probs = probs[:, :, None].expand(batch, groups, heads // groups, n, n).reshape(batch, heads, n, n)
        return out, [SlotWeights(torch.arange(n, device=q.device), torch.arange(n, device=q.device).view(1, 1, 1, n), probs)]
