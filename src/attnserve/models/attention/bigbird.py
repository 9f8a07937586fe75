"""BigBird block-sparse attention (Zaheer et al. 2020, ITC construction).

The sequence is cut into blocks. A query block reads `window_blocks` blocks around itself,
the global blocks (the first and the last block of the document) and `random_blocks` random
blocks; the global blocks read everything. O(N * block * (window + 2 + random)).

The random blocks are fixed: a buffer of uniform numbers drawn once from `seed` picks, for
query block b of a document of n blocks, block floor(u[b, r] * n). They depend only on the
document's own length, so a document gives the same result alone or in a padded batch, and
they survive ONNX export. A random block that repeats a window, global or earlier random block
is dropped rather than counted twice.

Parameters:
    block: tokens per block.
    window_blocks: blocks in the sliding window (odd; 3 = the block and one each side).
    random_blocks: random blocks per query block.
    seed: seed of the random-block buffer.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights, check, pad_to_multiple
from attnserve.models.attention.blocks import context_attention, dense_rows_attention, gather_rows, replace_rows


@dataclasses.dataclass
class BigBirdConfig(AttentionConfig):
    variant: ClassVar[str] = "bigbird"
    block: int = 64
    window_blocks: int = 3
    random_blocks: int = 3
    seed: int = 0

    def validate(self, max_length):
        super().validate(max_length)
        check(self.block >= 1, "block", f"must be >= 1 (got {self.block})")
        check(self.block <= max_length, "block", f"must be <= max_length {max_length} (got {self.block})")
        check(self.window_blocks >= 1 and self.window_blocks % 2 == 1, "window_blocks", f"must be odd and >= 1 (got {self.window_blocks})")
        check(self.random_blocks >= 0, "random_blocks", f"must be >= 0 (got {self.random_blocks})")


class BigBirdAttention(Attention):
    config_class = BigBirdConfig
    bounded_span = True
    cost = "O(N * block * (window_blocks + 2 + random_blocks))"
    is_mask = True

    @classmethod
    def length_multiple(cls, config):
        return config.block

    @classmethod
    def exact_up_to(cls, config, max_length):
        """The global blocks read everything; a document of nb blocks is exact when every other
        block reads all nb through its window, the global blocks and its random blocks. The
        window and globals guarantee it up to window_blocks // 2 + 3 blocks (4 blocks, 256
        tokens, by default); the random blocks depend on the seed and on nb, so each block
        count is checked with the variant's own context_blocks, up to the first that fails."""
        probe = cls(config, 1, 1, max_length)
        for nb in range(1, -(-max_length // config.block) + 1):
            ids, read, _ = probe.context_blocks(torch.ones(1, nb * config.block, dtype=torch.bool))
            seen = torch.zeros(nb, nb, dtype=torch.bool)
            seen[torch.arange(nb)[:, None].expand_as(ids[0])[read[0]], ids[0][read[0]]] = True
            seen[[0, nb - 1]] = True
            if not seen.all():
                end = min((nb - 1) * config.block, max_length)
                return end if end >= 2 else 0
        return max_length

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        max_blocks = -(-max_length // config.block)
        generator = torch.Generator().manual_seed(config.seed)
        self.register_buffer("random_uniform", torch.rand(max_blocks, config.random_blocks, generator=generator))

    def context_blocks(self, key_valid):
        """For each document and query block: the key blocks it reads (B, nb, W) and whether
        each is read (False for duplicates and blocks past the document), plus the number of
        blocks of each document (B,)."""
        c = self.config
        valid = pad_to_multiple(key_valid, c.block, dim=1, value=False)
        nb = valid.shape[1] // c.block
        doc_blocks = valid.view(valid.shape[0], nb, c.block).any(-1).sum(-1).clamp(min=1)  # (B,)
        last = doc_blocks - 1
        here = torch.arange(nb, device=key_valid.device)
        reach = c.window_blocks // 2
        window = here[:, None] + torch.arange(-reach, reach + 1, device=key_valid.device)  # (nb, w)
        window = window[None].expand(valid.shape[0], -1, -1)
        globals_ = torch.stack([torch.zeros_like(last), last], dim=-1)[:, None].expand(-1, nb, -1)  # (B, nb, 2)
        randoms = (self.random_uniform[:nb][None] * doc_blocks[:, None, None]).long()  # (B, nb, r)
        ids = torch.cat([window, globals_, randoms], dim=-1)
        is_global_block = (ids == 0) | (ids == last[:, None, None])
        in_doc = (ids >= 0) & (ids < doc_blocks[:, None, None])
        w = window.shape[-1]
        slot = torch.arange(ids.shape[-1], device=key_valid.device)
        # Globals are read through their own slots, not the window's; a block that an earlier
        # slot reads already is not read again (only slots that read count: a global block in
        # the window must not cancel its global slot).
        candidate = in_doc & ~(is_global_block & (slot < w))
        repeated = ((ids[..., :, None] == ids[..., None, :]) & (slot[:, None] > slot[None, :]) & candidate[..., None, :]).any(-1)
        read = candidate & ~repeated
        read[..., w + 1] &= (last > 0)[:, None]  # a one-block document has one global block, not two
        return ids.clamp(0, nb - 1), read, doc_blocks

    def forward(self, q, k, v, key_valid, need_weights=False):
        c = self.config
        batch, heads, n, dim = q.shape
        ids, read, doc_blocks = self.context_blocks(key_valid)
        qb, kb, vb = (pad_to_multiple(x, c.block, dim=2) for x in (q, k, v))
        padded = qb.shape[2]
        nb = padded // c.block
        valid = pad_to_multiple(key_valid, c.block, dim=1, value=False).view(batch, nb, c.block)
        b_idx = torch.arange(batch, device=q.device)[:, None]
        flat_ids = ids.reshape(batch, -1)
        h_idx = torch.arange(heads, device=q.device)[None, :, None]

        def gather_blocks(x):  # (B, H, padded, D) -> (B, H, nb, W * block, D), in one copy
            blocks = x.view(batch, heads, nb, c.block, dim)[b_idx[:, :, None], h_idx, flat_ids[:, None, :]]  # (B, H, nb*W, bs, D)
            return blocks.view(batch, heads, nb, -1, dim)

        ctx_valid = (valid[b_idx, flat_ids].view(batch, nb, -1, c.block) & read[..., None]).view(batch, 1, nb, 1, -1)
        allowed = ctx_valid  # the same for every query of a block
        out, probs = context_attention(qb.view(batch, heads, nb, c.block, dim), gather_blocks(kb), gather_blocks(vb), allowed, self.scale, need_weights)
        out = out.reshape(batch, heads, padded, dim)
        # Global blocks (first and last of each document) attend to everything.
        offsets = torch.arange(c.block, device=q.device)
        g_rows = torch.cat([offsets[None].expand(batch, -1), (doc_blocks - 1)[:, None] * c.block + offsets], dim=1)  # (B, 2*bs)
        g_valid = valid.view(batch, padded).gather(1, g_rows)
        g_out, g_probs = dense_rows_attention(gather_rows(qb, g_rows), k, v, key_valid, self.scale, need_weights)
        out = replace_rows(out, g_rows, g_out, ~g_valid)[:, :, :n]
        if not need_weights:
            return out, None
        cols = (ids[..., None] * c.block + offsets).view(batch, 1, nb, 1, -1).expand(batch, 1, nb, c.block, -1)
        is_g_row = torch.zeros(batch, padded, dtype=torch.bool, device=q.device).scatter(1, g_rows, g_valid)
        local = SlotWeights(torch.arange(padded, device=q.device), cols.reshape(batch, 1, padded, -1),
                            probs.reshape(batch, heads, padded, -1) * ~is_g_row[:, None, :, None])
        cols_all = torch.arange(n, device=q.device).view(1, 1, 1, n)
        # A one-block document lists its block twice among g_rows: count it once.
        first_time = torch.ones_like(g_valid)
        first_time[:, c.block:] = doc_blocks[:, None] > 1
        g_weights = SlotWeights(g_rows[:, None, :], cols_all, g_probs * (g_valid & first_time)[:, None, :, None])
        return out, [local, g_weights]

    def allowed_mask(self, key_valid):
        c = self.config
        batch, n = key_valid.shape
        ids, read, doc_blocks = self.context_blocks(key_valid)
        nb = ids.shape[1]
        blocks = torch.zeros(batch, nb, nb, dtype=torch.long).scatter_add(2, ids, read.long()) > 0
        allowed = blocks.repeat_interleave(c.block, 1).repeat_interleave(c.block, 2)[:, :n, :n]
        token_block = torch.arange(n) // c.block
        is_global_row = (token_block[None] == 0) | (token_block[None] == (doc_blocks - 1)[:, None])
        allowed = allowed | is_global_row[:, :, None]
        return (allowed & key_valid[:, None, :])[:, None]
