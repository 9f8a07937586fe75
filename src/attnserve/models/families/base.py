"""What a model family gives the encoder (attnserve.models.encoder.LongContextEncoder): the
modules of one architecture, around the attention step that attnserve's variants replace.

A family is one module of this package (bert.py: BERT and XLM-RoBERTa) whose `FAMILY` says:

    shape            a frozen dataclass of the sizes the modules are built from, made from a
                     model folder by `shape.of(folder)` (attnserve.contract.model_folder reads
                     the folder torch-free); it has at least vocab_size, hidden_size,
                     num_layers, num_heads, pooling and normalize
    embeddings       (shape, config) -> module: (input_ids, attention_mask=None) -> (B, N, hidden),
                     token vectors with whatever positions the family adds at its input
    layer            (shape, attention, config, index) -> module: (x, key_valid, need_weights)
                     -> (x, weights), layer `index` around `attention` (a variant's module,
                     built by the registry for that layer); it also answers
                     `self_attention(x, key_valid)` and `along_paths(x, key_valid, paths)`
                     (the rank-collapse paths through its weights)
    final_norm       (shape) -> module applied to the last layer's output (nn.Identity where the
                     family has none)
    pretrained_state (tensors, folder) -> the folder's model.safetensors tensors under the
                     encoder's state_dict names (unused ones left out)

`config` is the attention config of the whole model (a variant's or a schedule's): its shared
parameters (positions, position_period, attention_scaling) are the family's to apply.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # attnserve.contract.model_folder's names of the architectures it runs
    shape: type
    embeddings: Callable[..., Any]
    layer: Callable[..., Any]
    final_norm: Callable[..., Any]
    pretrained_state: Callable[[dict, Any], dict]
