"""Sparse Sinkhorn attention (Tay et al. 2020).

Keys are cut into blocks. A small sorting net scores every pair of blocks from their mean
keys; Sinkhorn normalisation (alternating row and column log-normalisation at a temperature)
turns the scores into a soft permutation of the blocks. Each query block then attends to its
local blocks and to the block the permutation sorts into its place. At inference the soft
permutation is rounded to its row-wise argmax, so every query block reads exactly one sorted
block and its attention map stays sparse and exact. O(N * block + (N / block)^2).

Initialisation: the sorting net starts at zero with a diagonal bonus, i.e. the identity sort,
so out of the box every block is sorted onto itself and the variant is block-local attention
over the pretrained Q, K, V. `attnserve adapt` trains the sorting net by distillation, with
the hard sort forward and the soft permutation's gradient backward (straight-through; see
_sort_gradient).

Parameters:
    block: tokens per block.
    local_blocks: neighbouring blocks read on each side besides the sorted one.
    iterations: Sinkhorn normalisation rounds.
    temperature: divides the sorting scores before normalisation (lower = harder sort).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import nn

from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights, check, pad_to_multiple
from attnserve.models.attention.blocks import context_attention, neighbour_blocks, take_rows

IDENTITY_BONUS = 10.0  # diagonal score at initialisation: the identity sort


@dataclasses.dataclass
class SinkhornConfig(AttentionConfig):
    variant: ClassVar[str] = "sinkhorn"
    block: int = 64
    local_blocks: int = 1
    iterations: int = 8
    temperature: float = 0.75

    def validate(self, max_length):
        super().validate(max_length)
        check(1 <= self.block <= max_length, "block", f"must be in 1..max_length {max_length} (got {self.block})")
        check(self.local_blocks >= 0, "local_blocks", f"must be >= 0 (got {self.local_blocks})")
        check(self.iterations >= 1, "iterations", f"must be >= 1 (got {self.iterations})")
        check(self.temperature > 0, "temperature", f"must be > 0 (got {self.temperature})")


class SinkhornAttention(Attention):
    config_class = SinkhornConfig
    cost = "O(N * block + (N / block)^2)"
    adapt_lr = 0.05

    @classmethod
    def length_multiple(cls, config):
        return config.block

    @classmethod
    def exact_up_to(cls, config, max_length):
        # A block reads its local_blocks neighbours on each side, so up to local_blocks + 1
        # blocks every block reads all of them (and its sorted block is one of those). The
        # sorted block could reach one more, but which one the learned sort picks depends on
        # the input (at initialisation the sort is the identity and adds nothing).
        end = min((config.local_blocks + 1) * config.block, max_length)
        return end if end >= 2 else 0

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        # Sorting net: score(i, j) = (W s_i) . s_j + bonus * [i == j], s = a block's mean key.
        self.sort_projection = nn.Parameter(torch.zeros(num_heads, head_dim, head_dim))
        self.identity_bonus = nn.Parameter(torch.tensor(IDENTITY_BONUS))

    def sorted_blocks(self, k, key_valid):
        """(B, H, nb) index of the key block sorted into each block's place."""
        return self.sort_log_probs(k, key_valid).argmax(dim=-1)

    def sort_log_probs(self, k, key_valid):
        """(B, H, nb, nb) log of the soft permutation: row i, the blocks that may sort into i."""
        c = self.config
        batch, heads, _, dim = k.shape
        kb = pad_to_multiple(k, c.block, dim=2)
        nb = kb.shape[2] // c.block
        valid = pad_to_multiple(key_valid, c.block, dim=1, value=False).view(batch, 1, nb, c.block, 1)
        summary = (kb.view(batch, heads, nb, c.block, dim) * valid).sum(3) / valid.sum(3).clamp(min=1)
        scores = torch.matmul(torch.matmul(summary, self.sort_projection), summary.transpose(-1, -2))  # (B, H, nb, nb)
        eye = torch.eye(nb, dtype=torch.bool, device=k.device)
        scores = scores + self.identity_bonus * eye
        # Real blocks sort among real blocks only; empty (padding) blocks stay in place.
        real = valid.view(batch, nb, c.block).any(-1)
        same_kind = real[:, :, None] == real[:, None, :]
        log_p = (scores / c.temperature).masked_fill(~same_kind[:, None] | (~real[:, None, :, None] & ~eye), -1e30)
        for _ in range(c.iterations):
            log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
            log_p = log_p - torch.logsumexp(log_p, dim=-2, keepdim=True)
        return log_p

    def forward(self, q, k, v, key_valid, need_weights=False):
        c = self.config
        batch, heads, n, dim = q.shape
        qb, kb, vb = (pad_to_multiple(x, c.block, dim=2) for x in (q, k, v))
        padded = qb.shape[2]
        nb = padded // c.block
        valid = pad_to_multiple(key_valid, c.block, dim=1, value=False).view(batch, 1, nb, c.block)
        log_p = self.sort_log_probs(k, key_valid)
        target = log_p.argmax(dim=-1)  # (B, H, nb)

        def local_and_sorted(x, fill=0):  # (B, H, nb, bs, ...) -> (B, H, nb, (2L+2) * bs, ...)
            local = neighbour_blocks(x, c.local_blocks, fill=fill)
            return torch.cat([local, take_rows(x.flatten(3), target).view(x.shape)], dim=3)

        blocks = lambda x: x.view(batch, heads, nb, c.block, dim)  # noqa: E731
        here = torch.arange(nb, device=q.device)
        # The sorted block is read only when no local slot reads it already.
        duplicate = (target - here).abs() <= c.local_blocks
        valid_h = valid.expand(batch, heads, nb, c.block)
        ctx_valid = local_and_sorted(valid_h, fill=False)
        sorted_valid = ctx_valid[..., -c.block:].clone()
        ctx_valid[..., -c.block:] &= ~duplicate[..., None]
        allowed = ctx_valid[:, :, :, None, :]  # the same for every query of a block
        out, probs = context_attention(blocks(qb), local_and_sorted(blocks(kb)), local_and_sorted(blocks(vb)), allowed, self.scale, need_weights)
        if self.training and torch.is_grad_enabled():
            out = out + self._sort_gradient(log_p, blocks(qb), blocks(kb), blocks(vb), ctx_valid, sorted_valid)
        out = out.reshape(batch, heads, padded, dim)[:, :, :n]
        if not need_weights:
            return out, None
        positions = torch.arange(padded, device=q.device).view(1, 1, nb, c.block).expand(batch, heads, -1, -1)
        cols = local_and_sorted(positions, fill=-1)[:, :, :, None, :].expand(-1, -1, -1, c.block, -1)
        return out, [SlotWeights(torch.arange(padded, device=q.device), cols.reshape(batch, heads, padded, -1), probs.reshape(batch, heads, padded, -1))]

    def _sort_gradient(self, log_p, qb, kb, vb, ctx_valid, sorted_valid):
        """Zero forward, the sorting net's gradient backward (`attnserve adapt`): attention
        that reads the soft permutation's mix of blocks in the sorted slot (never masked as a
        duplicate, or the identity sort would give no gradient at all), minus itself detached.
        The argmax the forward takes has no gradient of its own."""
        c = self.config
        soft = log_p.exp()
        mix = lambda x: torch.einsum("bhij,bhjr->bhir", soft, x.flatten(3)).view(x.shape)  # noqa: E731
        local = lambda x: neighbour_blocks(x, c.local_blocks)  # noqa: E731
        valid = torch.cat([ctx_valid[..., : -c.block], sorted_valid], dim=-1)[:, :, :, None, :]
        surrogate, _ = context_attention(qb, torch.cat([local(kb), mix(kb)], dim=3), torch.cat([local(vb), mix(vb)], dim=3),
                                         valid, self.scale, False)
        return surrogate - surrogate.detach()
