"""Chunk vectors with their document's context, for every route that answers them:
/embed_chunks (chunks by token count or character spans), /v1/embeddings with Jina's
late_chunking and /v1/contextualizedembeddings (Voyage's shape), whose chunks are the caller's
own texts, joined into one document.

Contexts: none (each chunk embedded alone, [CLS] chunk [SEP], mean-pooled: what a 512-token
server gives) and late (one pass over the whole document, each chunk the mean of its tokens).
"""
from __future__ import annotations

import asyncio
import functools

import numpy as np

from attnserve.service.batching import Timings
from attnserve.contract.pooling import BadSpans, ChunkBounds, Pooling, naive_chunk_ids, pool_chunks, span_chunks
from attnserve.service.errors import ServiceError
from attnserve.service.state import ServiceState, run_embed, run_reduce

# Chunks sent as separate texts are joined with this into one document. Whitespace splits
# tokens, so no token spans two chunks and each chunk's tokens are exactly its own.
CHUNK_SEPARATOR = " "


async def chunk_vectors(service: ServiceState, ids: list[list[int]], bounds: list[list[ChunkBounds]], context: str,
                        timings: Timings, normalize: bool, param: str = "inputs") -> list[np.ndarray]:
    """(len(bounds[i]), hidden) float32 per document: its chunks' vectors with `context`."""
    if context == "late":
        reducers = [functools.partial(pool_chunks, chunks=b, normalize=normalize) for b in bounds]
        return await run_reduce(service, ids, reducers, timings, param)
    if context == "none":
        return await naive_chunks(service, ids, bounds, timings, normalize, param)
    raise ValueError(f"unknown chunk context {context!r}")  # the schemas allow none and late only


async def naive_chunks(service: ServiceState, ids: list[list[int]], bounds, timings: Timings, normalize: bool,
                       param: str = "inputs") -> list[np.ndarray]:
    """Each document's chunks embedded alone ([CLS] chunk [SEP], mean-pooled), one array per document."""
    cls, sep = service.tokenizer.cls_id, service.tokenizer.sep_id
    pieces = [piece for doc, chunks in zip(ids, bounds) for piece in naive_chunk_ids(doc, chunks, cls, sep)]
    mean = functools.partial(Pooling("mean"), normalize=normalize)
    flat = await run_reduce(service, pieces, [mean] * len(pieces), timings, param)
    out, start = [], 0
    for chunks in bounds:
        out.append(np.stack(flat[start : start + len(chunks)]))
        start += len(chunks)
    return out


def join_chunks(chunks: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """One document of consecutive chunks, joined with CHUNK_SEPARATOR, and each chunk's
    [start, end) character span in it."""
    spans, start = [], 0
    for chunk in chunks:
        spans.append((start, start + len(chunk)))
        start += len(chunk) + len(CHUNK_SEPARATOR)
    return CHUNK_SEPARATOR.join(chunks), spans


async def contextual_chunks(service: ServiceState, documents: list[list[str]], truncate: bool, timings: Timings, param: str,
                            normalize: bool = True, query: bool = False, remedy: str | None = None) -> list[np.ndarray]:
    """One (len(chunks), hidden) array per document (a list of consecutive chunk texts), each
    document embedded in one pass. A document of one chunk gets that text's /embed vector
    (as a query if `query`); longer ones get service.contextual_context's chunk vectors, which
    /embed_chunks gives for the same spans of the joined text. `truncate` cuts a joined
    document at max_length (a chunk cut in two keeps its first part); a chunk wholly past the
    cut is a 413, as is a document too long without truncate."""
    texts, spans = zip(*(join_chunks(chunks) for chunks in documents))

    def document(index: int) -> str:
        return f"{param}[{index}]" if len(documents) > 1 else param

    tokenized = await service.tokenize(list(texts), truncate, timings, param, remedy=remedy,
                                       names=lambda index: f"the document joined from {document(index)}")
    bounds = []
    for index, (chunks, text_spans, tokens) in enumerate(zip(documents, spans, tokenized)):
        where = document(index)
        try:
            found = span_chunks(tokens.offsets, text_spans, tokens.original_length > len(tokens))
        except BadSpans as exc:
            raise ServiceError(422, f"{where}[{exc.index}] holds no token (only whitespace or control characters?): merge it "
                               "with a neighbour or leave it out", "validation", param) from None
        if len(found) < len(chunks):
            past = f"chunk {len(found)} lies" if len(found) == len(chunks) - 1 else f"chunks {len(found)}..{len(chunks) - 1} lie"
            raise ServiceError(413, f"{where}: {past} wholly past the {service.max_length} "
                               f"tokens this deployment embeds in one pass (the document has {tokens.original_length} tokens); "
                               f"send them in another request", "too_long", param)
        bounds.append(found)
    service.check_vector_count(sum(len(b) for b in bounds), "chunk", "send fewer chunks or fewer documents", param)
    ids = [t.ids for t in tokenized]
    single = [i for i, b in enumerate(bounds) if len(b) == 1]
    multi = [i for i, b in enumerate(bounds) if len(b) > 1]
    alone, together = await asyncio.gather(
        run_embed(service, [ids[i] for i in single], timings, param, normalize, query) if single else _nothing(),
        chunk_vectors(service, [ids[i] for i in multi], [bounds[i] for i in multi], service.contextual_context, timings,
                      normalize, param) if multi else _nothing())
    out: list[np.ndarray] = [None] * len(documents)
    for i, vector in zip(single, alone):
        out[i] = vector[None, :]
    for i, vectors in zip(multi, together):
        out[i] = vectors
    return out


async def _nothing() -> list:
    return []
