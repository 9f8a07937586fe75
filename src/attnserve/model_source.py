"""Where `--model` points: a local folder, or a Hugging Face Hub id resolved offline first.

    resolve_model("path/to/folder")             -> that folder (never sent to the Hub)
    resolve_model("org/name", revision=None)    -> the Hugging Face cache's snapshot of it

A value that names an existing path is that folder, whatever it looks like. Any other value of
the form `org/name` is a Hub id: it is looked up in the Hugging Face cache (HF_HUB_CACHE, or
HF_HOME/hub, in the standard models--org--name/snapshots/<commit> layout) before anything is
fetched. With HF_HUB_OFFLINE=1 nothing goes to the network, and a miss says which id and
revision and where it looked. Otherwise huggingface_hub downloads only the files attnserve reads
(the JSON configs and model.safetensors, never pickled .bin weights), with a progress bar, into
that cache. huggingface_hub is imported only for a Hub id.
"""
from __future__ import annotations

import re
from pathlib import Path

from attnserve.contract.model_folder import WEIGHTS_FILE, ModelError

# What attnserve reads from a model folder (attnserve.contract.model_folder): config.json,
# tokenizer.json, modules.json, sentence_bert_config.json, the Pooling module's config.json,
# and the weights in safetensors.
HUB_FILES = ["*.json", WEIGHTS_FILE]
# Hugging Face's repo id rule: one namespace and one name of letters, digits, '-', '_', '.'.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


class ModelSourceError(ModelError):
    """A --model that is neither a folder nor a Hub id attnserve can find; the message says
    where it looked and what to change."""


def resolve_model(value: str | Path | None, revision: str | None = None, log=print) -> Path | None:
    """The model folder `value` names: an existing path as it is, a Hub id as the Hugging Face
    cache's snapshot of it (downloaded first when it is missing and HF_HUB_OFFLINE is not set).
    None stays None (the bundled model). ModelSourceError for anything else."""
    if value is None:
        if revision:
            raise ModelSourceError(f"revision {revision!r} given without a model: --revision applies to a Hub id given as --model org/name")
        return None
    path = Path(value).expanduser()
    if path.exists():
        if revision:
            raise ModelSourceError(f"revision {revision!r} given for the folder {path}: --revision applies to a Hub id "
                                   f"(org/name), not to a local folder; drop it")
        return path
    text = str(value)
    if not HUB_ID.fullmatch(text):
        raise ModelSourceError(f"no model folder {path}: give an existing folder (config.json, model.safetensors, tokenizer.json) "
                               f"or a Hugging Face Hub id as org/name")
    return _from_hub(text, revision, log)


def _from_hub(repo_id: str, revision: str | None, log) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise ModelSourceError(f"{repo_id} is not a folder here, and resolving it as a Hugging Face Hub id needs huggingface_hub: "
                               f"pip install 'attnserve[export]' (or pip install huggingface_hub), or give a folder") from None
    asked = f"{repo_id} (revision {revision or 'main'})"
    cache = Path(constants.HF_HUB_CACHE)
    try:
        found = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES, local_files_only=True)
        return _checked(Path(found), asked)
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:  # huggingface_hub's own reading of HF_HUB_OFFLINE
        raise ModelSourceError(f"{asked} is not in the Hugging Face cache {cache} (models--{repo_id.replace('/', '--')}) and "
                               f"HF_HUB_OFFLINE is set, so nothing was fetched: download it where the Hub is reachable "
                               f"(hf download {repo_id}{f' --revision {revision}' if revision else ''}), point "
                               f"HF_HUB_CACHE or HF_HOME at a cache that holds it, or give its folder")
    log(f"attnserve: {asked} is not in the Hugging Face cache {cache}: downloading {', '.join(HUB_FILES)}")
    try:
        found = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES)
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's repository, revision, auth and network errors all say why
        raise ModelSourceError(f"{asked} could not be fetched from the Hugging Face Hub ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else 'no message'}); check the id and revision, "
                               f"HF_TOKEN for a gated or private model, or give a folder") from None
    return _checked(Path(found), asked)


def _checked(folder: Path, asked: str) -> Path:
    """The snapshot, refused when it has no safetensors weights (a repository with only
    pickled .bin weights, which attnserve never loads)."""
    if not (folder / WEIGHTS_FILE).is_file():
        raise ModelSourceError(f"{asked} has no {WEIGHTS_FILE} in {folder}: attnserve reads safetensors weights only, never "
                               f"pickled .bin files; convert them (e.g. transformers' save_pretrained with safe_serialization) "
                               f"into a folder and give that")
    return folder
