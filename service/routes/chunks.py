"""POST /embed_chunks: a vector per chunk, with the context the request asks for: none (each
chunk embedded alone), late (late chunking: one forward per document, each chunk the mean of its
tokens) or learned (the deployment's context head over both)."""
from __future__ import annotations

import asyncio
import functools

import numpy as np

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from attnserve.service.batching import Timings
from attnserve.service.errors import ServiceError
from attnserve.service.contract.pooling import BadSpans, Pooling, check_spans, pool_chunks, span_chunks, token_chunks
from attnserve.service.routes import TEI_ERRORS
from attnserve.service.schemas import ChunkEmbedding, EmbedChunksRequest
from attnserve.service.state import ServiceState, get_service, get_timings, run_reduce

router = APIRouter(tags=["late chunking"])


@router.post("/embed_chunks", response_model=list[list[ChunkEmbedding]], responses=TEI_ERRORS)
async def embed_chunks(body: EmbedChunksRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """For each input, its chunks in order with their character offsets and vectors. With
    context late, the mean of each chunk's last hidden states from one pass over the whole
    document, so every chunk vector has seen all of it; none, each chunk embedded alone;
    learned, the context head's mix of the two and of the document's mean."""
    context = body.context or service.chunk_context
    heads = service.context_heads
    if context not in service.chunk_contexts:
        raise ServiceError(422, "context: learned needs a chunk context head, which this deployment does not serve "
                           "(/info's context_heads); send context none or late, or serve with --context-heads DIR",
                           "validation", "context")
    texts, spans = body.texts_and_spans()
    service.check_input_count(len(texts), "inputs")
    tokenized = await service.tokenize(texts, body.truncate, timings, "inputs")
    bounds = []
    for index, (text, tokens) in enumerate(zip(texts, tokenized)):
        truncated = tokens.original_length > len(tokens)
        if spans is None:
            bounds.append(token_chunks(tokens.offsets, len(text), body.chunk_tokens, body.overlap_tokens, truncated))
            continue
        try:
            bounds.append(span_chunks(tokens.offsets, check_spans(spans[index], len(text)), truncated))
        except BadSpans as exc:
            where = f"input {index}: " if len(texts) > 1 else ""
            raise ServiceError(422, f"spans: {where}{exc}", "validation", "spans") from None
    service.check_vector_count(sum(len(b) for b in bounds), "chunk", "send a larger chunk_tokens, fewer spans or fewer inputs", "chunk_tokens")
    ids = [t.ids for t in tokenized]
    if context == "late":
        reducers = [functools.partial(pool_chunks, chunks=b, normalize=body.normalize) for b in bounds]
        vectors = await run_reduce(service, ids, reducers, timings, "inputs")
    elif context == "none":
        vectors = await naive_chunks(service, ids, bounds, timings, body.normalize)
    else:
        reducers = [functools.partial(_late_and_mean, chunks=b) for b in bounds]
        late, naive = await asyncio.gather(run_reduce(service, ids, reducers, timings, "inputs"),
                                           naive_chunks(service, ids, bounds, timings, True))
        vectors = [heads.chunks(n, lm[0], lm[1]) for n, lm in zip(naive, late)]
    return JSONResponse([
        [{"start": b.start, "end": b.end, "embedding": v.tolist()} for b, v in zip(chunks, rows)]
        for chunks, rows in zip(bounds, vectors)
    ])


def _late_and_mean(hidden: np.ndarray, chunks) -> tuple[np.ndarray, np.ndarray]:
    """(each chunk's mean hidden state, the document's mean hidden state)."""
    return pool_chunks(hidden, chunks, normalize=False), hidden.mean(0)


async def naive_chunks(service: ServiceState, ids: list[list[int]], bounds, timings: Timings, normalize: bool) -> list[np.ndarray]:
    """Each document's chunks embedded alone ([CLS] chunk [SEP], mean-pooled), one array per document."""
    cls, sep = service.tokenizer.cls_id, service.tokenizer.sep_id
    pieces = [[cls] + [i for i in doc[b.first : b.stop] if i not in (cls, sep)] + [sep] for doc, chunks in zip(ids, bounds) for b in chunks]
    mean = functools.partial(Pooling("mean"), normalize=normalize)
    flat = await run_reduce(service, pieces, [mean] * len(pieces), timings, "inputs")
    out, start = [], 0
    for chunks in bounds:
        out.append(np.stack(flat[start : start + len(chunks)]))
        start += len(chunks)
    return out
