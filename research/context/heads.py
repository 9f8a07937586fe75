"""Context heads: small modules that give chunk vectors and document vectors what the long pass
knows, trained on a cache of the frozen encoder's outputs (research/context/cache.py).

Each design is a torch module with one `forward` over one document, the signature of its
kind, and `identity()` true at initialisation (it then gives what serving gives without it):

    kind "chunks":  forward(naive (C, d), late (C, d), doc (d,)) -> (C, d) unit chunk vectors
        naive: each chunk embedded alone (unit); late: each chunk's mean hidden state from the
        long pass; doc: the long pass's mean hidden state. Identity: the naive vectors.
    kind "pooling": forward(hidden (n, d)) -> (d,) unit document vector
        hidden: the long pass's last hidden states. Identity: mean pooling.

Designs (DESIGNS): "mix" (chunks) adds gated, low-rank projections of the chunk's late vector
and the document vector to the naive one; "attend" (chunks) lets each naive chunk vector attend
over the document's late chunk vectors (one low-rank head, output projection zero at first);
"attention-pooling" (pooling) weighs tokens by a tiny scorer on their hidden states (zero
scorer: the mean). A document of one chunk is left as it is by every design: training, `python -m
research.context bench` and the ONNX runner (runtime.py) skip the head there, so a short text keeps
the pretrained vector exactly.
"""
from __future__ import annotations

import torch
from torch import nn


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


class Mix(nn.Module):
    """naive + g_l * late + g_d * doc + U V [naive, late, doc], each term per chunk, then unit
    length; the gates g are scalars (start 0) and U starts at zero. Rank 0: the gates alone
    (two parameters: the best fixed mix the data supports)."""

    kind = "chunks"

    def __init__(self, dim: int = 384, rank: int = 64):
        super().__init__()
        self.gates = nn.Parameter(torch.zeros(2))
        self.down = nn.Linear(3 * dim, rank, bias=False) if rank else None
        self.up = nn.Linear(rank, dim, bias=False) if rank else None
        if rank:
            nn.init.normal_(self.down.weight, std=(3 * dim) ** -0.5)
            nn.init.zeros_(self.up.weight)

    def forward(self, naive: torch.Tensor, late: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
        late, doc = unit(late), unit(doc).expand_as(late)
        mixed = naive + self.gates[0] * late + self.gates[1] * doc
        if self.up is not None:
            mixed = mixed + self.up(self.down(torch.cat([naive, late, doc], dim=-1)))
        return unit(mixed)


class Attend(nn.Module):
    """naive + W_o softmax((naive W_q)(late W_k)^T / sqrt(r)) (late W_v): each chunk reads the
    document's late chunk vectors (itself included); W_o starts at zero."""

    kind = "chunks"

    def __init__(self, dim: int = 384, rank: int = 64):
        super().__init__()
        self.query = nn.Linear(dim, rank, bias=False)
        self.key = nn.Linear(dim, rank, bias=False)
        self.value = nn.Linear(dim, rank, bias=False)
        self.out = nn.Linear(rank, dim, bias=False)
        nn.init.zeros_(self.out.weight)
        self.scale = rank ** -0.5

    def forward(self, naive: torch.Tensor, late: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
        late = unit(late)
        weights = torch.softmax(self.query(naive) @ self.key(late).transpose(-1, -2) * self.scale, dim=-1)
        return unit(naive + self.out(weights @ self.value(late)))


class AttentionPooling(nn.Module):
    """sum_t softmax(v . tanh(W h_t))_t h_t, unit length; v starts at zero (the mean)."""

    kind = "pooling"

    def __init__(self, dim: int = 384, rank: int = 64):
        super().__init__()
        self.project = nn.Linear(dim, rank)
        self.score = nn.Linear(rank, 1, bias=False)
        nn.init.zeros_(self.score.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.score(torch.tanh(self.project(hidden))).squeeze(-1), dim=-1)
        return unit(weights @ hidden)


DESIGNS: dict[str, type[nn.Module]] = {"mix": Mix, "attend": Attend, "attention-pooling": AttentionPooling}
KINDS = ("chunks", "pooling")


def make_head(design: str, dim: int = 384, rank: int = 64) -> nn.Module:
    if design not in DESIGNS:
        raise ValueError(f"unknown context head design {design!r}; one of {', '.join(DESIGNS)}")
    return DESIGNS[design](dim, rank)
