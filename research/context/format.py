"""What a context-head folder holds (`python -m research.context train --out DIR`), read by the PyTorch heads
(files.py) and their ONNX Runtime runner (runtime.py) alike:

    context.json          `ContextSpec`: what the heads were trained on and how to call them
    context.safetensors   the heads' PyTorch parameters, "<kind>." + parameter name
    chunks.onnx           kind "chunks": naive (C, d), late (C, d), doc (d) -> chunks (C, d)
    pooling.onnx          kind "pooling": hidden (n, d) -> vector (d)

A head learned on one variant's states fits only that variant (its states are what it
learned); `check_export` says so by name before anything runs.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from attnserve.contract.export_format import sha256

CONTEXT_FORMAT = "attnserve-context/1"
SPEC_FILE = "context.json"
WEIGHTS_FILE = "context.safetensors"
HEAD_KINDS = ("chunks", "pooling")
GRAPH_INPUTS = {"chunks": ["naive", "late", "doc"], "pooling": ["hidden"]}
GRAPH_OUTPUTS = {"chunks": "chunks", "pooling": "vector"}
TRAIN_COMMAND = "python -m research.context cache --out CACHE && python -m research.context train --cache CACHE/longdocs-train --out DIR"


class ContextHeadError(ValueError):
    """A context-head folder that cannot be read, or does not fit the export it runs beside; the
    message names the file."""


class HeadRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    design: str
    rank: int
    graph: str
    sha256: str


class ContextSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    format: str
    variant: str
    max_length: int
    chunk_tokens: int
    hidden_size: int
    heads: dict[str, HeadRecord]


def read_spec(folder) -> ContextSpec:
    """The folder's context.json, with every graph it names present and unchanged."""
    folder = Path(folder)
    path = folder / SPEC_FILE
    if not folder.is_dir():
        raise ContextHeadError(f"{folder}: no such context-head folder; make one with `{TRAIN_COMMAND}`")
    if not path.is_file():
        raise ContextHeadError(f"{path}: missing; a context-head folder holds {SPEC_FILE} and its graphs, "
                               f"as `{TRAIN_COMMAND}` writes them")
    try:
        spec = ContextSpec.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as exc:
        raise ContextHeadError(f"{path}: not a context-head spec ({str(exc).splitlines()[0]}); rebuild it with `{TRAIN_COMMAND}`") from None
    if spec.format != CONTEXT_FORMAT:
        raise ContextHeadError(f"{path}: format {spec.format!r}, this attnserve reads {CONTEXT_FORMAT!r}; retrain with `{TRAIN_COMMAND}`")
    unknown = set(spec.heads) - set(HEAD_KINDS)
    if unknown or not spec.heads:
        raise ContextHeadError(f"{path}: heads must be some of {', '.join(HEAD_KINDS)} (got {', '.join(spec.heads) or 'none'})")
    for kind, head in spec.heads.items():
        graph = folder / head.graph
        if not graph.is_file():
            raise ContextHeadError(f"{graph}: missing ({SPEC_FILE} names it as the {kind} head's graph)")
        if sha256(graph) != head.sha256:
            raise ContextHeadError(f"{graph}: its sha256 differs from the one {SPEC_FILE} records; the file was changed or "
                                   f"belongs to another training run: retrain with `{TRAIN_COMMAND}`")
    return spec


def check_export(spec: ContextSpec, folder, variant: str, hidden_size: int) -> None:
    """ContextHeadError naming context.json unless its heads were learned on the states of this
    variant and hidden size (the export they run beside)."""
    path = Path(folder) / SPEC_FILE
    if spec.hidden_size != hidden_size:
        raise ContextHeadError(f"{path}: heads for {spec.hidden_size}-wide vectors, this export's are {hidden_size}")
    if spec.variant != variant:
        raise ContextHeadError(f"{path}: heads learned on {spec.variant}'s states, this export runs {variant}; "
                               f"run them beside a {spec.variant} export, or train heads for {variant} "
                               f"(`{TRAIN_COMMAND}`, the cache made with --variant {variant})")
