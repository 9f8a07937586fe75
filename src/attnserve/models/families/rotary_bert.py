"""NomicBERT and GTE (transformers' NomicBertModel and GteModel): nomic-embed-text, gte-base-en-v1.5,
gte-large-en-v1.5 and gte-multilingual-base. transformers builds both from the same modules
(JinaEmbeddingsV3's), so one family runs them; where they differ is read from the folder.

    embeddings  LayerNorm(word + token type 0): no position table (GTE without token types
                where type_vocab_size is 0)
    positions   rotary (RoPE) on every layer's queries and keys, theta rope_theta (NomicBERT
                1,000, GTE 160,000); with rope_type dynamic, NTK scaling for a batch whose
                longest document passes max_position_embeddings (attnserve.models.positions.Rotary)
    layer       post-norm: x = norm(x + out(attention(rope(q), rope(k), v))), then
                x = norm(x + down(act(gate(x)) * up(x))), act silu (NomicBERT) or erf gelu (GTE);
                NomicBERT has no biases in either, GTE has them on q, k, v, out and down
    final norm  none

The model's own attention is full in every layer: a deployment may put any variant that carries
rotary positions on any layer (its `native` is full).
"""
from __future__ import annotations

import dataclasses
import re

import torch.nn.functional as F
from torch import nn

from attnserve.contract.model_folder import (
    ROTARY_BERT_BIASES,
    ROTARY_BERT_TENSORS,
    ModelShape,
)
from attnserve.models.attention.base import AttentionConfig
from attnserve.models.families.base import Family
from attnserve.models.families.bert import BertLayer
from attnserve.models.positions import Rotary, check_rotary_positions

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RotaryBertShape(ModelShape):
    """ModelShape and these families' own: max_positions is max_position_embeddings (the
    length RoPE was trained at); the MLP's activation, where biases are, RoPE's theta and
    scaling."""

    architecture: str
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    activation: str = "silu"
    rope_theta: float = 1000.0
    rope_type: str = "default"
    rope_factor: float = 1.0

    @property
    def biases(self) -> tuple[str, ...]:
        return ROTARY_BERT_BIASES[self.architecture]


class Embeddings(nn.Module):
    def __init__(self, shape: RotaryBertShape, config: AttentionConfig):
        super().__init__()
        check_rotary_positions(config, {"nomic_bert": "NomicBERT", "gte": "GTE"}[shape.architecture])
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.token_type_embeddings = nn.Embedding(shape.type_vocab_size, shape.hidden_size) if shape.type_vocab_size else None
        self.norm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)

    def forward(self, input_ids, attention_mask=None):
        x = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings.weight[0]
        return self.norm(x)


class RotaryBertLayer(nn.Module):
    def __init__(self, shape: RotaryBertShape, attention: nn.Module, config: AttentionConfig, index: int):
        super().__init__()
        h, inter, bias = shape.hidden_size, shape.intermediate_size, shape.biases
        self.num_heads = shape.num_heads
        self.qkv = nn.Linear(h, 3 * h, bias="qkv" in bias)
        self.out = nn.Linear(h, h, bias="out" in bias)
        self.attention = attention
        self.attention_norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)
        self.up = nn.Linear(h, inter, bias=False)
        self.gate = nn.Linear(h, inter, bias=False)
        self.down = nn.Linear(inter, h, bias="down" in bias)
        self.output_norm = nn.LayerNorm(h, eps=shape.layer_norm_eps)
        self.activation = ACTIVATIONS[shape.activation]
        dynamic = shape.rope_type == "dynamic"
        self.rotary = Rotary(h // shape.num_heads, shape.rope_theta, shape.max_positions if dynamic else None,
                             shape.rope_factor if dynamic else None)

    def forward(self, x, key_valid, need_weights=False):
        attended, weights = self.self_attention(x, key_valid, need_weights)
        return self.feed_forward(self.attention_norm(x + attended)), weights

    def self_attention(self, x, key_valid, need_weights=False):
        """out(attention(rope(q), rope(k), v)) of x, and its weights."""
        batch, n, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.rotary(q, k, key_valid)
        mixed, weights = self.attention(q, k, v, key_valid, need_weights)
        return self.out(mixed.transpose(1, 2).reshape(batch, n, hidden)), weights

    def feed_forward(self, x):
        """The MLP sub-layer: norm(x + mlp(x))."""
        return self.output_norm(x + self.mlp(x))

    def mlp(self, x):
        """The MLP's branch, before its skip and norm: down(act(gate(x)) * up(x))."""
        return self.down(self.activation(self.gate(x)) * self.up(x))

    # The paths through a post-norm layer are BERT's (its attention and MLP sub-layers under
    # the same names).
    along_paths = BertLayer.along_paths


def pretrained_state(tensors: dict, folder) -> dict:
    """The folder's tensors (ROTARY_BERT_TENSORS: as transformers saves NomicBertModel and
    GteModel) under this family's names; GTE's fused up_gate_proj splits into up (its first
    half) and gate, as transformers loads it."""
    names = ROTARY_BERT_TENSORS[folder.architecture]
    renames = [(re.escape(name).replace(r"\{i\}", r"(\d+)") + r"\.", role) for role, name in names.items()]
    state = {}
    for name, tensor in tensors.items():
        name = re.sub(r"^new\.", "", name)
        if name.startswith(("embeddings.word_embeddings.", "embeddings.token_type_embeddings.")):
            state[name] = tensor
            continue
        for pattern, role in renames:
            match = re.match(pattern, name)
            if not match:
                continue
            suffix = name[match.end():]
            if role == "norm":
                state[f"embeddings.norm.{suffix}"] = tensor
            elif role == "up_gate":
                up, gate = tensor.chunk(2, dim=0)
                state[f"layers.{match[1]}.up.{suffix}"], state[f"layers.{match[1]}.gate.{suffix}"] = up, gate
            else:
                state[f"layers.{match[1]}.{role}.{suffix}"] = tensor
            break
    return state


FAMILY = Family(name="NomicBERT and GTE", architectures=("nomic_bert", "gte"), shape=RotaryBertShape, embeddings=Embeddings,
                layer=RotaryBertLayer, final_norm=lambda shape: nn.Identity(), pretrained_state=pretrained_state)
