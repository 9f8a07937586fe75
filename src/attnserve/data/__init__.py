"""The long documents that ship with attnserve (package data, so an installed wheel has them),
a reader for JSONL document files, and (retrieval.py) how retrieval over them is scored.
Torch-free; shared by the benchmarks (attnserve.bench) and training (attnserve.train).

longdocs-dev.jsonl.gz: 344 Debian man pages (sections 3, 5, 7 and 8, about 4,400 words each),
one JSON object a line: id, text, query (the page's one-line description, taken out of the
text), needle (30 words copied from the text past word 600), needle_word_offset. The quality
benchmark, the load tests and the test suite read it.

longdocs-train.jsonl.gz: 520 Linux kernel documentation pages, the same fields, query being
the page's title. `attnserve adapt` trains on it (and picks checkpoints on documents held out
of it); nothing is ever trained on the dev set that quality is reported on.

Both live in this folder, src/attnserve/data/; a checkout links it at its root as data/, so
data/longdocs-dev.jsonl.gz names the same file.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

DEV_DOCUMENTS = Path(__file__).resolve().with_name("longdocs-dev.jsonl.gz")
TRAIN_DOCUMENTS = DEV_DOCUMENTS.with_name("longdocs-train.jsonl.gz")


def read_jsonl(path: str | Path, limit: int = 0) -> list[dict]:
    """The objects of a .jsonl or .jsonl.gz file, the first `limit` of them when limit > 0."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
                if limit and len(rows) >= limit:
                    break
    return rows
