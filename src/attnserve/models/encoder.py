"""The long-context encoder: a model family's modules (attnserve.models.families: BERT and
XLM-RoBERTa today) around a pluggable attention step.

Read top to bottom: embeddings -> N x layer (attention, MLP) -> final norm -> pooling (the
model's: mean, cls or lasttoken) -> L2 normalisation (where the model has a Normalize module).
Every layer's attention is built by `build_attention(config, ...)` from the registry, from that
layer's config (one variant's in all layers, or a schedule's, src/attnserve/models/schedule.py),
so this file never knows which variant it runs, and the family's modules never know either.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.models.attention.base import AttentionConfig
from attnserve.models.families.base import Family
from attnserve.models.registry import build_attention
from attnserve.models.schedule import ScheduleConfig
from attnserve.contract.export_format import COLLAPSE_PATHS, check_collapse_paths


class LongContextEncoder(nn.Module):
    """A model family's encoder whose attention step is a registered variant, or one per layer
    (a schedule).

    forward(input_ids, attention_mask) -> (sentence_embedding (B, hidden), last_hidden_state
    (B, N, hidden)). The user-facing methods (embed, attention_map, rank_collapse) live in
    `attnserve.models.api.Encoder`, which wraps this module with its tokenizer.
    """

    def __init__(self, family: Family, shape, attention_config: AttentionConfig | ScheduleConfig, max_length: int):
        super().__init__()
        self.family = family
        self.shape = shape
        self.attention_config = attention_config
        self.max_length = max_length
        head_dim = shape.hidden_size // shape.num_heads
        self.embeddings = family.embeddings(shape, attention_config)
        layer_configs = attention_config.per_layer(shape.num_layers)
        self.layers = nn.ModuleList(
            family.layer(shape, build_attention(layer_config, shape.num_heads, head_dim, max_length), attention_config, index)
            for index, layer_config in enumerate(layer_configs)
        )
        self.final_norm = family.final_norm(shape)

    def forward(self, input_ids, attention_mask, weights_layer: int | None = None, hidden_states: list | None = None):
        """weights_layer: layer whose attention weights to return (third output).
        hidden_states: a list to append every layer's output to (for rank collapse)."""
        key_valid = attention_mask.bool()
        x = self.embeddings(input_ids, attention_mask)
        weights = None
        for i, layer in enumerate(self.layers):
            x, layer_weights = layer(x, key_valid, need_weights=(i == weights_layer))
            if layer_weights is not None:
                weights = layer_weights
            if hidden_states is not None:
                hidden_states.append(x)
        x = self.final_norm(x)
        embedding = pool(x, key_valid, self.shape.pooling, self.shape.normalize)
        if weights_layer is None:
            return embedding, x
        return embedding, x, weights

    def collapse_paths(self, input_ids, attention_mask, paths=COLLAPSE_PATHS) -> dict[str, torch.Tensor]:
        """{path: (B, 1 + num_layers) rank-collapse ratios}: of the embeddings' output (column
        0, the same on every path) and of each layer's output along the path
        (the family layer's along_paths: the paths run as one batch, len(paths) times B rows)."""
        check_collapse_paths(paths)
        key_valid = attention_mask.bool()
        start = self.embeddings(input_ids, attention_mask)
        x, valid = start.repeat(len(paths), 1, 1), key_valid.repeat(len(paths), 1)
        ratios = [rank_collapse_ratio(x, valid)]
        for layer in self.layers:
            x = layer.along_paths(x, valid, paths)
            ratios.append(rank_collapse_ratio(x, valid))
        stacked = torch.stack(ratios, dim=1).unflatten(0, (len(paths), -1))
        return {path: stacked[i] for i, path in enumerate(paths)}


def pool(x, key_valid, mode: str = "mean", normalize: bool = True):
    """sentence-transformers' pooling of a model (its Pooling module's mode: mean over real
    tokens, the first token's vector, or the last real token's), L2-normalised if it has a
    Normalize module."""
    if mode == "mean":
        mask = key_valid[:, :, None].to(x.dtype)
        pooled = (x * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    elif mode == "cls":
        pooled = x[:, 0]
    elif mode == "lasttoken":
        last = (key_valid.to(torch.long).sum(1) - 1).clamp(min=0)
        pooled = torch.gather(x, 1, last[:, None, None].expand(-1, 1, x.shape[2]))[:, 0]
    else:
        raise ValueError(f"pooling must be mean, cls or lasttoken (got {mode!r})")
    return F.normalize(pooled, p=2, dim=1) if normalize else pooled


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
