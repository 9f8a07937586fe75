"""The long-context encoder: a BERT (all-MiniLM-L6-v2 by default, or any BERT or XLM-RoBERTa
sentence-transformers folder, src/attnserve/models/pretrained.py) with a pluggable attention step.

Read top to bottom: embeddings -> N x (attention, FFN) -> pooling (the model's: mean, cls or
lasttoken) -> L2 normalisation (where the model has a Normalize module).
Every layer's attention is built by `build_attention(config, ...)` from the registry, from that
layer's config (one variant's in all layers, or a schedule's, src/attnserve/models/schedule.py), so this
file never knows which variant it runs.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.models.attention.base import DEFAULT_POSITION_PERIOD, POSITION_SCHEMES, AttentionConfig
from attnserve.models.schedule import ScheduleConfig
from attnserve.models.registry import build_attention
from attnserve.contract.export_format import COLLAPSE_PATHS, check_collapse_paths


@dataclasses.dataclass(frozen=True)
class BertShape:
    """What the encoder's modules are built from; the defaults are all-MiniLM-L6-v2's. A model
    folder's come from its config.json and modules.json (`BertShape.of(model)`).
    max_positions: the rows of the position table tokens read (XLM-RoBERTa's table less its
    offset rows); pooling: mean, cls or lasttoken; normalize: L2-normalise the pooled vector."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pooling: str = "mean"
    normalize: bool = True

    @classmethod
    def of(cls, model) -> "BertShape":
        """The shape of a model folder (attnserve.contract.model_folder.ModelFolder)."""
        return cls(**{f.name: getattr(model, f.name) for f in dataclasses.fields(cls)})


def document_lengths(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """(B,) int64: each document's number of real tokens (all of them without a mask)."""
    if attention_mask is None:
        return torch.full(input_ids.shape[:1], input_ids.shape[1], dtype=torch.long, device=input_ids.device)
    return attention_mask.to(torch.long).sum(1)


# Positions past the learned table, as LongEmbed (Zhu et al. 2024) arranges them. Each scheme
# maps token indices (1, N) of documents with `lengths` real tokens (B,) onto a table of
# `rows` rows: an integer tensor picks rows, a floating one is interpolated between them.
# Grouped and interpolated stretch the table over each document by s = ceil(n / rows), from
# the document's own length (LongEmbed's code takes the batch's padded width), so a document
# gets the same positions alone and in a padded batch. Padding tokens are clamped onto the
# last row; nothing reads them.


def recurrent_positions(index, lengths, rows: int, period: int):
    """Row i mod period: the table tiled (period 512) or restarted every period tokens."""
    return index % period


def group_size(lengths, rows: int):
    """(B, 1) int64: s = max(1, ceil(n / rows)), the tokens sharing one row."""
    return torch.div(lengths + (rows - 1), rows, rounding_mode="floor").clamp(min=1)[:, None]


def grouped_positions(index, lengths, rows: int, period: int):
    """Row floor(i / s): s neighbouring tokens share a position."""
    return torch.div(index, group_size(lengths, rows), rounding_mode="floor").clamp(max=rows - 1)


def interpolated_positions(index, lengths, rows: int, period: int):
    """Fractional position i / s, read between its two neighbouring rows."""
    return (index.to(torch.float32) / group_size(lengths, rows).to(torch.float32)).clamp(max=rows - 1)


POSITIONS = {"recurrent": recurrent_positions, "grouped": grouped_positions, "interpolated": interpolated_positions,
             # Recurrent rows; Embeddings adds the learned offsets past the table.
             "learned": recurrent_positions}
assert tuple(POSITIONS) == POSITION_SCHEMES, "every position scheme the config accepts has a definition here"


def look_up(table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rows of `table` (rows, d) at `positions` (..., N): integer positions pick rows, fractional
    ones are linear interpolation between the rows either side (exactly the row at an integer)."""
    if not positions.is_floating_point():
        return F.embedding(positions, table)
    low = positions.floor()
    below = F.embedding(low.to(torch.long), table)
    above = F.embedding((low.to(torch.long) + 1).clamp(max=table.shape[0] - 1), table)
    return below + (positions - low)[..., None] * (above - below)


class Embeddings(nn.Module):
    def __init__(self, shape: BertShape, config: AttentionConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_embeddings = nn.Embedding(shape.max_positions, shape.hidden_size)
        self.token_type_embeddings = nn.Embedding(shape.type_vocab_size, shape.hidden_size)
        self.LayerNorm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        self.scheme = POSITIONS[config.positions]
        # The default period tiles the model's whole table (all-MiniLM's 512 rows, bge-m3's
        # 8,192); a shorter one restarts within it, and a table shorter than it tiles itself.
        default = config.position_period == DEFAULT_POSITION_PERIOD
        self.position_period = shape.max_positions if default else min(config.position_period, shape.max_positions)
        # positions="learned": what tokens past the table add to their tiled row (LongEmbed's
        # "new position rows", tiled so the parameters do not grow with max_length). Only long
        # inputs read it, so up to 512 tokens the model stays the pretrained one.
        learned = config.positions == "learned"
        self.long_offsets = nn.Parameter(torch.zeros(shape.max_positions, shape.hidden_size)) if learned else None

    def position_vectors(self, input_ids, attention_mask=None):
        """(B|1, N, hidden): the learned position vector each token gets under the scheme."""
        index = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        lengths = document_lengths(attention_mask, input_ids)
        rows = self.position_embeddings.num_embeddings
        vectors = look_up(self.position_embeddings.weight, self.scheme(index, lengths, rows, self.position_period))
        if self.long_offsets is None:
            return vectors
        past = (index >= rows)[..., None].to(vectors.dtype)
        return vectors + past * F.embedding(index % rows, self.long_offsets)

    def forward(self, input_ids, attention_mask=None):
        """attention_mask: (B, N), 0 on padding; without it every token is real."""
        x = self.word_embeddings(input_ids) + self.position_vectors(input_ids, attention_mask)
        x = x + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


def query_scale(key_valid: torch.Tensor, rows: int) -> torch.Tensor:
    """(B, 1, 1, 1): max(1, log n / log rows) for documents of n real tokens, exactly 1 up to
    `rows` tokens (LongEmbed's attention scaling, with n from the mask, not the padded width)."""
    n = key_valid.sum(1).to(torch.float32)
    factor = torch.where(n > rows, torch.log(n) / math.log(rows), torch.ones_like(n))
    return factor[:, None, None, None]


class EncoderLayer(nn.Module):
    def __init__(self, shape: BertShape, attention: nn.Module, config: AttentionConfig):
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
        # Queries are scaled against the length the position table was trained on.
        self.scaled_length = shape.max_positions if config.attention_scaling else None

    def forward(self, x, key_valid, need_weights=False):
        x, weights = self.attention_block(x, key_valid, need_weights)
        return self.feed_forward(x), weights

    def attention_block(self, x, key_valid, need_weights=False):
        """The attention sub-layer: norm(x + out(attention(q, k, v))), and its weights."""
        attended, weights = self.self_attention(x, key_valid, need_weights)
        return self.attention_norm(x + attended), weights

    def self_attention(self, x, key_valid, need_weights=False):
        """out(attention(q, k, v)): the attention sub-layer before its skip and norm, and its weights."""
        batch, n, hidden = x.shape

        def heads(t):  # (B, N, hidden) -> (B, H, N, D)
            return t.view(batch, n, self.num_heads, -1).transpose(1, 2)

        q = heads(self.query(x))
        if self.scaled_length is not None:
            q = q * query_scale(key_valid, self.scaled_length)
        mixed, weights = self.attention(q, heads(self.key(x)), heads(self.value(x)), key_valid, need_weights)
        return self.attention_out(mixed.transpose(1, 2).reshape(batch, n, hidden)), weights

    def along_paths(self, x, key_valid, paths):
        """This layer along each of `paths` (COLLAPSE_PATHS) at once: x and key_valid hold the
        paths' inputs stacked along the batch (path p's rows p*B..(p+1)*B-1), so that the
        attention runs once over all of them. The paths: model (the layer itself),
        attention_only (its attention output alone: no skip, norm or MLP, the pure
        self-attention of Dong et al. 2021), attention_skip (norm(x + attention): the MLP
        removed) or attention_mlp (the MLP sub-layer on norm(attention): the skips removed)."""
        attended = self.self_attention(x, key_valid)[0]
        inputs, outputs = x.unflatten(0, (len(paths), -1)), attended.unflatten(0, (len(paths), -1))
        steps = {
            "model": lambda x, a: self.feed_forward(self.attention_norm(x + a)),
            "attention_only": lambda x, a: a,
            "attention_skip": lambda x, a: self.attention_norm(x + a),
            "attention_mlp": lambda x, a: self.output_norm(self.output(F.gelu(self.intermediate(self.attention_norm(a))))),
        }
        return torch.cat([steps[path](inputs[i], outputs[i]) for i, path in enumerate(paths)])

    def feed_forward(self, x):
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class LongContextEncoder(nn.Module):
    """BERT encoder whose attention step is a registered variant, or one per layer (a schedule).

    forward(input_ids, attention_mask) -> (sentence_embedding (B, hidden), last_hidden_state
    (B, N, hidden)). The user-facing methods (embed, attention_map, rank_collapse) live in
    `attnserve.models.api.Encoder`, which wraps this module with its tokenizer.
    """

    def __init__(self, shape: BertShape, attention_config: AttentionConfig | ScheduleConfig, max_length: int):
        super().__init__()
        self.shape = shape
        self.attention_config = attention_config
        self.max_length = max_length
        head_dim = shape.hidden_size // shape.num_heads
        self.embeddings = Embeddings(shape, attention_config)
        self.layers = nn.ModuleList(
            EncoderLayer(shape, build_attention(layer_config, shape.num_heads, head_dim, max_length), attention_config)
            for layer_config in attention_config.per_layer(shape.num_layers)
        )

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
        embedding = pool(x, key_valid, self.shape.pooling, self.shape.normalize)
        if weights_layer is None:
            return embedding, x
        return embedding, x, weights

    def collapse_paths(self, input_ids, attention_mask, paths=COLLAPSE_PATHS) -> dict[str, torch.Tensor]:
        """{path: (B, 1 + num_layers) rank-collapse ratios}: of the embeddings' output (column
        0, the same on every path) and of each layer's output along the path
        (EncoderLayer.along_paths: the paths run as one batch, len(paths) times B rows)."""
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
