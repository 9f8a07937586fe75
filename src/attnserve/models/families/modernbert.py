"""ModernBERT (transformers' ModernBertModel): gte-modernbert, modernbert-embed and the other
fine-tunes of ModernBERT-base and -large, trained at 8,192 tokens.

    embeddings  LayerNorm(word embeddings): no position table and no token types
    positions   rotary (RoPE), applied to each layer's queries and keys before its attention:
                theta global_rope_theta (160,000) on the model's global layers, local_rope_theta
                (10,000) on its local ones, whatever variant a deployment runs there
    layer       pre-norm: x = x + Wo(attention(rope(Wqkv(norm(x))))), then
                x = x + Wo(gelu(input) * gate) with [input, gate] = Wi(norm(x)); layer 0's
                attention norm is the identity; biases only where config.json says so
    final norm  LayerNorm after the last layer

The model's own attention (its "native" schedule, ModelFolder.layer_attention) is full on every
global_attn_every_n_layers-th layer from layer 0 and a window of local_attention tokens
(|i - j| <= local_attention / 2) on the others: attnserve's full and local variants, so the local
layers cost O(N x window) and a deployment may put another variant on any layer.
"""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.contract.model_folder import ModelShape
from attnserve.models.attention.base import AttentionConfig
from attnserve.models.families.base import Family
from attnserve.models.positions import Rotary, check_rotary_positions


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModernBertShape(ModelShape):
    """ModelShape and ModernBERT's own: max_positions is the length the model was trained at
    (max_position_embeddings); layer_attention full or local per layer (the layer's RoPE theta
    follows it); the norms' epsilon, where biases are, the two RoPE thetas."""

    layer_attention: tuple[str, ...]
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0


class Embeddings(nn.Module):
    def __init__(self, shape: ModernBertShape, config: AttentionConfig):
        super().__init__()
        check_rotary_positions(config, "ModernBERT")
        self.tok_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.norm = nn.LayerNorm(shape.hidden_size, eps=shape.norm_eps, bias=shape.norm_bias)

    def forward(self, input_ids, attention_mask=None):
        return self.norm(self.tok_embeddings(input_ids))


class Projections(nn.Module):
    """The attention's input and output projections (transformers' ModernBertAttention's)."""

    def __init__(self, shape: ModernBertShape):
        super().__init__()
        self.Wqkv = nn.Linear(shape.hidden_size, 3 * shape.hidden_size, bias=shape.attention_bias)
        self.Wo = nn.Linear(shape.hidden_size, shape.hidden_size, bias=shape.attention_bias)


class GatedMLP(nn.Module):
    """Wo(gelu(input) * gate), [input, gate] = Wi(x) split in two (erf GELU)."""

    def __init__(self, shape: ModernBertShape):
        super().__init__()
        self.Wi = nn.Linear(shape.hidden_size, 2 * shape.intermediate_size, bias=shape.mlp_bias)
        self.Wo = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=shape.mlp_bias)

    def forward(self, x):
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(F.gelu(value) * gate)


class ModernBertLayer(nn.Module):
    def __init__(self, shape: ModernBertShape, attention: nn.Module, config: AttentionConfig, index: int):
        super().__init__()
        self.num_heads = shape.num_heads
        norm = dict(eps=shape.norm_eps, bias=shape.norm_bias)
        self.attn_norm = nn.Identity() if index == 0 else nn.LayerNorm(shape.hidden_size, **norm)
        self.attn = Projections(shape)
        self.attention = attention
        theta = shape.global_rope_theta if shape.layer_attention[index] == "full" else shape.local_rope_theta
        self.rotary = Rotary(shape.hidden_size // shape.num_heads, theta)
        self.mlp_norm = nn.LayerNorm(shape.hidden_size, **norm)
        self.mlp = GatedMLP(shape)

    def forward(self, x, key_valid, need_weights=False):
        attended, weights = self.self_attention(self.attn_norm(x), key_valid, need_weights)
        x = x + attended
        return x + self.mlp(self.mlp_norm(x)), weights

    def self_attention(self, x, key_valid, need_weights=False):
        """Wo(attention(rope(q), rope(k), v)) of x (already normalised), and its weights."""
        batch, n, hidden = x.shape
        q, k, v = self.attn.Wqkv(x).view(batch, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.rotary(q, k)
        mixed, weights = self.attention(q, k, v, key_valid, need_weights)
        return self.attn.Wo(mixed.transpose(1, 2).reshape(batch, n, hidden)), weights

    def along_paths(self, x, key_valid, paths):
        """This layer along each of `paths` (COLLAPSE_PATHS) at once, the paths' inputs stacked
        along the batch (see bert.BertLayer.along_paths). Pre-norm: model (the layer itself),
        attention_only (the attention branch alone, a = attention(norm(x))), attention_skip
        (x + a: the MLP removed), attention_mlp (the MLP branch on a: the skips removed)."""
        attended = self.self_attention(self.attn_norm(x), key_valid)[0]
        inputs, outputs = x.unflatten(0, (len(paths), -1)), attended.unflatten(0, (len(paths), -1))
        steps = {
            "model": lambda x, a: (x + a) + self.mlp(self.mlp_norm(x + a)),
            "attention_only": lambda x, a: a,
            "attention_skip": lambda x, a: x + a,
            "attention_mlp": lambda x, a: self.mlp(self.mlp_norm(a)),
        }
        return torch.cat([steps[path](inputs[i], outputs[i]) for i, path in enumerate(paths)])


def final_norm(shape: ModernBertShape) -> nn.Module:
    return nn.LayerNorm(shape.hidden_size, eps=shape.norm_eps, bias=shape.norm_bias)


def pretrained_state(tensors: dict, folder) -> dict:
    """ModernBertModel's tensors under this family's names: its own, less a ModernBertFor*'s
    `model.` prefix (attnserve.contract.model_folder refuses heads before this runs)."""
    return {re.sub(r"^model\.", "", name): tensor for name, tensor in tensors.items()}


FAMILY = Family(name="ModernBERT", architectures=("modernbert",), shape=ModernBertShape, embeddings=Embeddings,
                layer=ModernBertLayer, final_norm=final_norm, pretrained_state=pretrained_state)
