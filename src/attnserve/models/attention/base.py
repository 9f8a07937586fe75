"""What every attention variant shares: its config base, its call signature, its weights form.

A variant replaces only the score/softmax/mix step of self-attention. It is an nn.Module
built from its config dataclass and called as

    out, weights = attention(q, k, v, key_valid, need_weights=False)

q, k, v: (B, H, N, D) after the pretrained projections; key_valid: (B, N) bool, False on
padding. out: (B, H, N, D). weights: None unless need_weights, else a list of SlotWeights
that together give every query's attention over the tokens (see `attnserve.models.sparse`).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import torch
from torch import nn

# Added to the scores of keys a query may not see. Finite, so a query with no visible key
# (only ever a padding query) gets a finite garbage row instead of NaN that would leak.
MASKED = -1e30


class SlotWeights(NamedTuple):
    """Attention of some queries over some tokens, S slots per query.

    rows: (R,) or (B|1, H|1, R) token index of each query; cols: broadcastable to
    (B, H, R, S), the token each slot reads; probs: (B, H, R, S), its weight (0 for unused
    slots). Several blocks for one layer add up (a token reached twice gets both weights).
    """

    rows: torch.Tensor
    cols: torch.Tensor
    probs: torch.Tensor


# How tokens past the 512 learned positions get a position (LongEmbed, Zhu et al. 2024; see
# attnserve.models.positions for the definitions).
POSITION_SCHEMES = ("recurrent", "grouped", "interpolated", "learned")
DEFAULT_POSITION_PERIOD = 512


@dataclasses.dataclass
class AttentionConfig:
    """Parameters every variant has.

    positions: how a document of n real tokens maps token i to the 512-row learned position
        table. "recurrent": row i mod position_period. "grouped": row floor(i / s).
        "interpolated": position i / s, linearly interpolated between its two neighbouring
        rows. s = max(1, ceil(n / 512)) per document, so every scheme gives the pretrained
        positions to documents of up to 512 tokens. "learned": row i mod 512 plus, for tokens
        past 512 only, a learned offset per row (zero until `attnserve adapt variant --stage long`
        trains it; 512 x hidden parameters whatever max_length is).
    position_period: the recurrent scheme's period; 512 (the default) tiles the pretrained
        table, whatever its rows (all-MiniLM's 512, bge-m3's 8,192: Longformer's choice), 256 restarts it in every 256-token block (what chunked
        embedding does).
    attention_scaling: multiply every layer's queries by max(1, log n / log 512) (LongEmbed's
        inference-time scaling), which keeps the attention entropy of a long document near
        what the model saw on 512 tokens.
    """
    variant: ClassVar[str] = ""
    position_period: int = DEFAULT_POSITION_PERIOD
    positions: str = "recurrent"
    attention_scaling: bool = False

    def as_params(self) -> dict:
        """The config as the keyword parameters that make it again (what recipes and adapt.json record)."""
        return dataclasses.asdict(self)

    def per_layer(self, num_layers: int) -> list["AttentionConfig"]:
        """The config of each layer: this one in all (a schedule, src/attnserve/models/schedule.py, differs)."""
        return [self] * num_layers

    def validate(self, max_length: int) -> None:
        """Raise ValueError naming the parameter when a value cannot work."""
        check(1 <= self.position_period <= 512, "position_period", "must be in 1..512 (the pretrained table has 512 rows)")
        check(self.positions in POSITION_SCHEMES, "positions",
              f"must be one of {', '.join(POSITION_SCHEMES)} (got {self.positions!r})")
        check(self.positions == "recurrent" or self.position_period == 512, "position_period",
              f"applies to positions=recurrent only (got position_period={self.position_period} "
              f"with positions={self.positions!r}); leave it at 512")
        check(isinstance(self.attention_scaling, bool), "attention_scaling",
              f"must be true or false (got {self.attention_scaling!r})")


def check(ok: bool, name: str, why: str) -> None:
    if not ok:
        raise ValueError(f"invalid parameter {name}: {why}")


class Attention(nn.Module):
    """Base of every variant: holds its config and shape; subclasses implement forward."""

    config_class: ClassVar[type[AttentionConfig]] = AttentionConfig
    cost: ClassVar[str] = "O(N^2)"
    is_mask: ClassVar[bool] = False  # True when it equals dense softmax under a boolean mask
    # True when which tokens meet is a discontinuous function of the hidden states (LSH's
    # argmax buckets): two runtimes whose matmuls differ by ~1e-6 can then decide differently,
    # so an export of it is held to embedding cosine, not to max abs diff (src/attnserve/export/exporter.py).
    discontinuous: ClassVar[bool] = False
    # Export precisions (service.contract.export_format.PRECISIONS) the variant cannot take,
    # each with the reason `attnserve variants` and the refusal give.
    precisions_refused: ClassVar[dict[str, str]] = {}
    # True when a query reaches keys no farther than a fixed distance away (a window, blocks),
    # besides designated global tokens (and BigBird's random blocks): a deployment may take
    # rotary positions past a model's trained length only where every layer is such a
    # variant (models.api.model_config).
    bounded_span: ClassVar[bool] = False
    # Why the variant cannot carry rotary positions (RoPE: queries and keys rotated by their
    # token's position, so that each query-key product depends on the two positions' distance);
    # empty where it can: it scores each query against the keys of single tokens.
    rotary_refused: ClassVar[str] = ""
    # Adam's learning rate for `attnserve adapt` (src/attnserve/train/adapt.py); 0 for variants with no
    # parameters of their own.
    adapt_lr: ClassVar[float] = 0.0
    # Parameters with a row per token position (their second-to-last dimension, max_length
    # rows). Adapted weights hold only the rows training reached, and load into any max_length:
    # the rows both have are copied, the others keep their initial values (src/attnserve/models/weights.py).
    position_tables: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def length_multiple(cls, config: AttentionConfig) -> int:
        """The sequence granule of the variant's exported graph (its block): the runner pads
        every input to a multiple of it, since torch.export cannot prove the shapes of the
        padding forward() does for every length (src/attnserve/export/exporter.py)."""
        return 1

    @classmethod
    def dense_keys(cls, config: AttentionConfig, n: int) -> int:
        """How many keys each of the n queries scores in one dense attention call: n (or n /
        stride) for the variants whose `cost` is O(N^2 ...), 0 for those that never score every
        query against O(N) keys at once. An attention kernel that stores its scores (not ONNX
        Runtime's flash kernel on CPU) holds (batch, heads, n, this) of them while it runs, which
        is what bounds the longest input such a variant can take in a given amount of memory
        (attnserve/bench/runtime.py skips lengths past it)."""
        return 0

    @classmethod
    def exact_up_to(cls, config: AttentionConfig, max_length: int) -> int:
        """The longest input, in real (right-padded) tokens, up to which this variant with
        `config`, built for `max_length`, computes exactly what full attention computes: for
        every document of 2..L tokens each query gets the softmax over all of its document's
        tokens. 0 when not even 2 tokens (one token is exact for every variant, and graphs take
        at least 2). At most max_length. A variant claims only what its pattern guarantees."""
        return 0

    def keeps_exactness(self) -> bool:
        """Whether this module's own parameters still give what exact_up_to claims: a variant
        whose exactness rests on how its parameters start says False once they have moved
        (adapted weights)."""
        return True

    def __init__(self, config: AttentionConfig, num_heads: int, head_dim: int, max_length: int):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_length = max_length
        self.scale = head_dim**-0.5

    def allowed_mask(self, key_valid: torch.Tensor) -> torch.Tensor:
        """(B, H|1, N, N) bool: which keys each query sees. Only mask-type variants have it;
        it builds an N x N tensor and exists for tests and small inputs."""
        raise NotImplementedError(f"{type(self).__name__} is not a mask over dense attention")


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of the allowed entries; rows with none allowed become 0."""
    probs = torch.softmax(scores.masked_fill(~allowed, MASKED), dim=-1)
    return probs * allowed


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int, value: float = 0.0) -> torch.Tensor:
    """Pad dim of x at its end up to a multiple of `multiple` (no Python branch on shapes)."""
    n = x.shape[dim]
    extra = (multiple - n % multiple) % multiple
    pad = [0, 0] * (x.dim() - 1 - (dim % x.dim())) + [0, extra]
    return nn.functional.pad(x, pad, value=value)
