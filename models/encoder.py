"""The long-context encoder: all-MiniLM-L6-v2's BERT with a pluggable attention step.

Read top to bottom: embeddings -> N x (attention, FFN) -> mean pooling -> L2 normalisation.
Every layer's attention is built by `build_attention(config, ...)` from the registry, so this
file never knows which variant it runs.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from models.attention.base import AttentionConfig
from models.registry import build_attention


@dataclasses.dataclass(frozen=True)
class BertShape:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


class Embeddings(nn.Module):
    def __init__(self, shape: BertShape, position_period: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_embeddings = nn.Embedding(shape.max_positions, shape.hidden_size)
        self.token_type_embeddings = nn.Embedding(shape.type_vocab_size, shape.hidden_size)
        self.LayerNorm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        # Past the 512 learned positions the table is reused: token i gets position i mod period.
        self.position_period = position_period

    def forward(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device) % self.position_period
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
        x = x + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class EncoderLayer(nn.Module):
    def __init__(self, shape: BertShape, attention: nn.Module):
        super().__init__()
        h = shape.hidden_size
        self.num_heads = shape.num_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention = attention
        self.attention_out = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)
        self.intermediate = nn.Linear(h, shape.intermediate_size)
        self.output = nn.Linear(shape.intermediate_size, h)
        self.output_norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)

    def forward(self, x, key_valid, need_weights=False):
        batch, n, hidden = x.shape

        def heads(t):  # (B, N, hidden) -> (B, H, N, D)
            return t.view(batch, n, self.num_heads, -1).transpose(1, 2)

        mixed, weights = self.attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)), key_valid, need_weights)
        x = self.attention_norm(x + self.attention_out(mixed.transpose(1, 2).reshape(batch, n, hidden)))
        x = self.output_norm(x + self.output(F.gelu(self.intermediate(x))))
        return x, weights


class LongContextEncoder(nn.Module):
    """BERT encoder whose attention step is one registered variant.

    forward(input_ids, attention_mask) -> (sentence_embedding (B, hidden), last_hidden_state
    (B, N, hidden)). The user-facing methods (embed, attention_map, rank_collapse) live in
    `models.api.Encoder`, which wraps this module with its tokenizer.
    """

    def __init__(self, shape: BertShape, attention_config: AttentionConfig, max_length: int):
        super().__init__()
        self.shape = shape
        self.attention_config = attention_config
        self.max_length = max_length
        head_dim = shape.hidden_size // shape.num_heads
        self.embeddings = Embeddings(shape, attention_config.position_period)
        self.layers = nn.ModuleList(
            EncoderLayer(shape, build_attention(attention_config, shape.num_heads, head_dim, max_length))
            for _ in range(shape.num_layers)
        )

    def forward(self, input_ids, attention_mask, weights_layer: int | None = None, hidden_states: list | None = None):
        """weights_layer: layer whose attention weights to return (third output).
        hidden_states: a list to append every layer's output to (for rank collapse)."""
        key_valid = attention_mask.bool()
        x = self.embeddings(input_ids)
        weights = None
        for i, layer in enumerate(self.layers):
            x, layer_weights = layer(x, key_valid, need_weights=(i == weights_layer))
            if layer_weights is not None:
                weights = layer_weights
            if hidden_states is not None:
                hidden_states.append(x)
        embedding = mean_pool(x, key_valid)
        if weights_layer is None:
            return embedding, x
        return embedding, x, weights


def mean_pool(x, key_valid):
    """sentence-transformers' mean pooling over real tokens, then L2 normalisation."""
    mask = key_valid[:, :, None].to(x.dtype)
    summed = (x * mask).sum(1)
    pooled = summed / mask.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=1)


def rank_collapse_ratio(x: torch.Tensor, key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """||X - 1 x^T|| / ||X|| per batch row, x the mean token, with the sqrt(||.||_1 ||.||_inf)
    norm of Dong et al. 2021 ("Attention is not all you need"). x: (B, N, d) -> (B,).
    Padding rows (key_valid False) are left out, so a padded batch gives what each document
    alone gives."""
    if key_valid is None:
        key_valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    mask = key_valid[:, :, None].to(x.dtype)
    mean = (x * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)

    def norm(m):
        m = (m * mask).abs()
        l1 = m.sum(dim=1).amax(dim=1)  # max column sum
        linf = m.sum(dim=2).amax(dim=1)  # max row sum
        return (l1 * linf).sqrt()

    return norm(x - mean) / norm(x).clamp(min=1e-30)
