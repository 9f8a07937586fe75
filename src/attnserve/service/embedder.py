"""Embeddings from an export in your own process, without a server: `Embedder`.

What the server does for one request, with nothing between a program and ONNX Runtime:
the export's tokenizer, batches grouped by length under a token budget (src/attnserve/service/packing.py,
as the server's batcher groups them), the deployment's pooling (src/attnserve/service/backend.py), vectors
back in input order. numpy, tokenizers and onnxruntime only: no torch, no HTTP.

    from attnserve.service.embedder import Embedder
    embedder = Embedder("exports/longformer")            # a folder `attnserve export` wrote
    vectors = embedder.embed(["a passage", "another, longer passage ..."])   # (2, 384) float32
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from attnserve.service.backend import Backend
from attnserve.service.batching import default_batch_tokens, pad
from attnserve.contract.export_format import TOKENIZER_FILE
from attnserve.contract.pooling import Pooling
from attnserve.service.packing import length_batches
from attnserve.service.runtime import OnnxRunner
from attnserve.service.tokenizer import TextTokenizer


class Embedder:
    """One export, loaded in this process. `pooling` defaults to the server's default pooling
    (the model's own where it is cls or lasttoken);
    `threads` are ONNX Runtime's intra-op threads (0: its default); `max_batch_tokens` bounds a
    batch's padded tokens (0: the server's default for the provider that runs) and `max_batch`
    its inputs. A text over the export's max_length raises InputTooLong unless truncate=True."""

    def __init__(self, export_dir, *, pooling: Pooling | None = None, providers: list[str] | None = None, threads: int = 0,
                 max_batch_tokens: int = 0, max_batch: int = 32):
        self.runner = OnnxRunner(export_dir, providers=providers, intra_op_threads=threads)
        self.tokenizer = TextTokenizer(Path(export_dir) / TOKENIZER_FILE, self.runner.max_length)
        self.backend = Backend(self.runner, pooling)
        self.max_batch_tokens = max_batch_tokens or default_batch_tokens(self.runner.provider)
        self.max_batch = min(max_batch, self.runner.max_batch)

    def embed(self, texts: list[str], *, truncate: bool = False, query: bool = False, normalize: bool = True) -> np.ndarray:
        """(len(texts), hidden) float32, in the order given; `query` pools as the deployment
        pools queries (input_type query over HTTP)."""
        ids = [t.ids for t in self.tokenizer.encode(list(texts), truncate)]
        return self.embed_ids(ids, query=query, normalize=normalize)

    def embed_ids(self, ids: list[list[int]], *, query: bool = False, normalize: bool = True) -> np.ndarray:
        """embed() for texts already tokenized ([CLS] ... [SEP], at most max_length ids each)."""
        out = np.zeros((len(ids), self.runner.hidden_size), dtype=np.float32)
        for batch in length_batches([len(x) for x in ids], self.runner.padded_length, self.max_batch_tokens, self.max_batch):
            out[batch] = self.backend.embed(*pad([ids[i] for i in batch]), normalize, query)
        return out
