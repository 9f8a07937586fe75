"""LSH attention (Kitaev et al. 2020, Reformer).

Queries and keys are hashed with random rotations (angular LSH: bucket = argmax of [xR, -xR]
over the unit-normalised vector), so vectors with a large dot product tend to share a bucket.
Queries and keys are each sorted by (bucket, position) and cut into chunks; query chunk c
attends to key chunks c-1, c, c+1 of the sorted keys. With several hash rounds each round is
one such attention and the rounds are mixed by their softmax normalisers (log-sum-exp), as in
Reformer. O(N * chunk * n_hashes) plus the sorts.

The pretrained model has separate Q and K (Reformer shares them), so both are hashed with the
same rotations. Rotations are a fixed buffer drawn once from `seed`; padding sorts after
every real token, so a document takes the same decisions alone or in a padded batch, and with
them gives the same result. Matmul rounding that differs with the batch's shape (~1e-6 on some
CPUs) can still move a token whose rotations nearly tie to another bucket (see discontinuous).

Parameters:
    chunk: tokens per sorted chunk.
    n_buckets: hash buckets per round (even).
    n_hashes: hash rounds (1-8); more rounds, better recall, proportionally slower.
    seed: seed of the rotation buffer.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
import torch.nn.functional as F

from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights, check, pad_to_multiple
from attnserve.models.attention.blocks import neighbour_blocks, take_rows


@dataclasses.dataclass
class LSHConfig(AttentionConfig):
    variant: ClassVar[str] = "lsh"
    chunk: int = 64
    n_buckets: int = 32
    n_hashes: int = 2
    seed: int = 0

    def validate(self, max_length):
        super().validate(max_length)
        check(self.chunk >= 1, "chunk", f"must be >= 1 (got {self.chunk})")
        check(self.n_buckets >= 2 and self.n_buckets % 2 == 0, "n_buckets", f"must be even and >= 2 (got {self.n_buckets})")
        check(1 <= self.n_hashes <= 8, "n_hashes", f"must be in 1..8 (got {self.n_hashes})")


def chunk_windows(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """(B, H, M, D), M a multiple of chunk -> (B * H * M / chunk, 3 * chunk, D): each chunk's
    previous, own and next chunk, as a view of one padded copy of all heads' rows, so that
    bmm reads it without copying every window (10% of a round at 4,096 tokens). The windows
    of a head's first and last chunk reach into the neighbouring head (or zeros): the caller
    masks those slots."""
    rows = F.pad(x.reshape(-1, x.shape[-1]), (0, 0, chunk, chunk))
    return rows.unfold(0, 3 * chunk, chunk).transpose(-1, -2)


class LSHAttention(Attention):
    config_class = LSHConfig
    cost = "O(N * chunk * n_hashes + N log N)"
    # Buckets are an argmax over random rotations, and two rotated values of one token can be
    # closer (down to ~1e-7) than ONNX Runtime's and PyTorch's matmuls agree (~1e-6). One token changing bucket shifts the sorted order, so the chunks of many tokens
    # change and their hidden states move by up to ~0.2 (embedding cosine down to 0.997),
    # while at most lengths nothing flips and the runtimes agree exactly.
    discontinuous = True
    # float16 rounding of the projections that feed the rotations flips buckets the same way,
    # far more often: on 40 bundled man pages its embeddings keep cosine 0.993 (mean 0.997) to
    # float32 where every other variant keeps 0.99999. int8 moves them about as much as it
    # moves global's (0.976 / 0.987 against 0.978 / 0.986), so int8 is served.
    precisions_refused = {
        "float16": "its hash buckets flip on float16 rounding (embedding cosine 0.993 to float32 on bundled documents, "
                   "below the 0.999 float16 exports are held to)",
    }

    @classmethod
    def length_multiple(cls, config):
        return config.chunk

    @classmethod
    def exact_up_to(cls, config, max_length):
        # With at most two chunks, every query chunk reads both (chunks c-1, c, c+1), whatever
        # the buckets: each round is full attention, the rounds agree, and so does their mix.
        # Then the buckets decide nothing, and the output is continuous too.
        return min(2 * config.chunk, max_length)

    def __init__(self, config, num_heads, head_dim, max_length):
        super().__init__(config, num_heads, head_dim, max_length)
        generator = torch.Generator().manual_seed(config.seed)
        rotations = torch.randn(config.n_hashes, num_heads, head_dim, config.n_buckets // 2, generator=generator)
        self.register_buffer("rotations", rotations)

    def sorted_order(self, x, valid, round_):
        """(B, H, N) permutation sorting tokens by (bucket, position); padding goes last."""
        n = x.shape[2]
        rotated = torch.matmul(F.normalize(x, dim=-1), self.rotations[round_])  # (B, H, N, n_buckets / 2)
        bucket = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)
        bucket = torch.where(valid[:, None, :], bucket, self.config.n_buckets)
        position = torch.arange(n, device=x.device)
        return torch.argsort(bucket * n + position, dim=-1)

    def orders(self, q, k, key_valid, round_):
        """The round's only discrete decisions: the (B, H, N) sort orders of queries and keys.
        Everything after them is continuous in q, k and v (tests replay recorded orders here to
        compare two runtimes that round differently)."""
        return self.sorted_order(q, key_valid, round_), self.sorted_order(k, key_valid, round_)

    def orders_from_weights(self, pieces, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The inverse of forward's attention map: each round's (q_order, k_order) over the
        first n tokens, from the compact pieces (rows, cols, probs) that need_weights returns,
        e.g. as an export's analysis graph gives them (arrays over a padded width). Query
        chunk c's middle slots hold sorted key chunk c, so k_order is read off them."""
        chunk = self.config.chunk
        orders = []
        for rows, cols, _ in pieces:
            rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
            k_order = cols[..., ::chunk, chunk : 2 * chunk].flatten(-2)
            # Padding (bucket n_buckets) sorts last by position, so the first n entries of a
            # wider run's orders are the orders of a run n tokens wide.
            orders.append((rows[..., :n].long(), k_order[..., :n].long()))
        return orders

    def hash_round(self, q, k, v, key_valid, round_, need_weights):
        """One hash round: (out, lse) in token order, and (q_order, cols, probs) if asked."""
        c = self.config
        batch, heads, n, dim = q.shape
        q_order, k_order = self.orders(q, k, key_valid, round_)

        def sort(x, order):
            return pad_to_multiple(take_rows(x, order), c.chunk, dim=2)

        qs = sort(q * self.scale, q_order)
        nc = qs.shape[2] // c.chunk
        ks, vs = chunk_windows(sort(k, k_order), c.chunk), chunk_windows(sort(v, k_order), c.chunk)
        k_valid = pad_to_multiple(key_valid.gather(1, k_order.flatten(1)).view(batch, heads, n), c.chunk, dim=2, value=False)
        allowed = neighbour_blocks(k_valid.view(batch, heads, nc, c.chunk), 1, fill=False)[:, :, :, None, :]
        # bmm rather than einsum, here and below: ONNX Runtime runs Einsum through a slow
        # generic kernel and bmm as its MatMul.
        scores = torch.bmm(qs.view(-1, c.chunk, dim), ks.transpose(-1, -2)).view(batch, heads, nc, c.chunk, -1)
        # Softmax in place: the scores are the largest tensor of a round.
        scores.masked_fill_(~allowed, -1e30)
        top = scores.amax(dim=-1, keepdim=True)
        probs = scores.sub_(top).exp_()  # masked keys underflow to exactly 0
        total = probs.sum(dim=-1, keepdim=True)
        probs.div_(total)
        lse = (top + total.log()).reshape(batch, heads, -1)
        out = torch.bmm(probs.view(-1, c.chunk, probs.shape[-1]), vs).view(batch, heads, -1, dim)
        unsort = torch.argsort(q_order, dim=-1)  # back to token order (past n: chunk padding)
        out, lse = take_rows(out, unsort), lse.gather(2, unsort)
        if not need_weights:
            return out, lse, None
        k_pos = pad_to_multiple(k_order, c.chunk, dim=2, value=-1)
        cols = neighbour_blocks(k_pos.view(batch, heads, nc, c.chunk), 1, fill=-1)[:, :, :, None, :]
        cols = cols.expand(-1, -1, -1, c.chunk, -1).reshape(batch, heads, nc * c.chunk, -1)[:, :, :n]
        return out, lse, (q_order, cols, probs.reshape(batch, heads, nc * c.chunk, -1)[:, :, :n])

    def forward(self, q, k, v, key_valid, need_weights=False):
        outs, lses, weights = [], [], []
        for round_ in range(self.config.n_hashes):
            out, lse, round_weights = self.hash_round(q, k, v, key_valid, round_, need_weights)
            outs.append(out)
            lses.append(lse)
            weights.append(round_weights)
        # Each round's normaliser weighs its output: the rounds together approximate one
        # softmax over the union of what they saw.
        mix = torch.softmax(torch.stack(lses), dim=0)  # (n_hashes, B, H, N)
        out = (torch.stack(outs) * mix[..., None]).sum(0)
        if not need_weights:
            return out, None
        slot_weights = []
        for round_, (q_order, cols, probs) in enumerate(weights):
            round_mix = mix[round_].gather(2, q_order)[..., None]  # sorted query order
            slot_weights.append(SlotWeights(q_order, cols, probs * round_mix))
        return out, slot_weights
