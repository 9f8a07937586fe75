"""BERT and XLM-RoBERTa (transformers' BertModel and XLMRobertaModel): all-MiniLM-L6-v2 by
default, bge, e5, gte (the BERT ones), multilingual-e5 and bge-m3.

    embeddings  LayerNorm(word + position + token type 0); the position table is learned, and
                tokens past it get a row by one of LongEmbed's schemes (attnserve.models.positions)
    layer       post-norm: x = norm(x + out(attention(q, k, v))), then
                x = norm(x + W2 gelu(W1 x)) (erf GELU, biases everywhere)
    final norm  none

XLM-RoBERTa is BERT with its position table starting padding_idx + 1 rows in: the rows before
are cut off when its weights load, so every position scheme reads row i for token i.
"""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.models.attention.base import DEFAULT_POSITION_PERIOD, AttentionConfig
from attnserve.contract.model_folder import ModelShape
from attnserve.models.families.base import Family
from attnserve.models.positions import POSITIONS, document_lengths, look_up, query_scale


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertShape(ModelShape):
    """ModelShape and BERT's own: max_positions are the rows of the position table tokens read
    (XLM-RoBERTa's table less its offset rows)."""

    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


# The bundled all-MiniLM-L6-v2's shape.
MINILM = BertShape(vocab_size=30522, hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536, max_positions=512,
                   normalize=True)


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


class BertLayer(nn.Module):
    def __init__(self, shape: BertShape, attention: nn.Module, config: AttentionConfig, index: int):
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

    def mlp(self, x):
        """The MLP sub-layer's branch, before its skip and norm: W2 gelu(W1 x)."""
        return self.output(F.gelu(self.intermediate(x)))

    def feed_forward(self, x):
        """The MLP sub-layer: norm(x + mlp(x))."""
        return self.output_norm(x + self.mlp(x))

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
            "attention_mlp": lambda x, a: self.output_norm(self.mlp(self.attention_norm(a))),
        }
        return torch.cat([steps[path](inputs[i], outputs[i]) for i, path in enumerate(paths)])


# Hugging Face BertModel / XLMRobertaModel names -> this family's module names.
_RENAMES = [
    (r"^(bert|roberta)\.", ""),  # a *ForMaskedLM-style prefix, where a folder has one
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"layers.\1.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attention_out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attention_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.intermediate."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.output."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.output_norm."),
]
_UNUSED = ("pooler.", "embeddings.position_ids", "embeddings.token_type_ids", "lm_head.", "cls.")
POSITION_TABLE = "embeddings.position_embeddings.weight"


def pretrained_state(tensors: dict, folder) -> dict:
    """The folder's tensors under this family's names; XLM-RoBERTa's position table from its
    offset on (folder.position_offset)."""
    state = {}
    for name, tensor in tensors.items():
        for pattern, replacement in _RENAMES:
            name = re.sub(pattern, replacement, name)
        if name.startswith(_UNUSED):
            continue
        state[name] = tensor[folder.position_offset:] if name == POSITION_TABLE else tensor
    return state


FAMILY = Family(name="bert", architectures=("bert", "xlm-roberta"), shape=BertShape, embeddings=Embeddings,
                layer=BertLayer, final_norm=lambda shape: nn.Identity(), pretrained_state=pretrained_state)
