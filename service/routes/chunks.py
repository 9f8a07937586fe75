"""POST /embed_chunks: late chunking, one forward per document and a vector per chunk."""
from __future__ import annotations

import functools

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from attnserve.service.batching import Timings
from attnserve.service.errors import ServiceError
from attnserve.service.contract.pooling import BadSpans, check_spans, pool_chunks, span_chunks, token_chunks
from attnserve.service.routes import TEI_ERRORS
from attnserve.service.schemas import ChunkEmbedding, EmbedChunksRequest
from attnserve.service.state import ServiceState, get_service, get_timings, run_reduce

router = APIRouter(tags=["late chunking"])


@router.post("/embed_chunks", response_model=list[list[ChunkEmbedding]], responses=TEI_ERRORS)
async def embed_chunks(body: EmbedChunksRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """For each input, its chunks in order with their character offsets and vectors: the mean
    of each chunk's last hidden states from one pass over the whole document, so every chunk
    vector has seen all of it."""
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
    reducers = [functools.partial(pool_chunks, chunks=b, normalize=body.normalize) for b in bounds]
    vectors = await run_reduce(service, [t.ids for t in tokenized], reducers, timings, "inputs")
    return JSONResponse([
        [{"start": b.start, "end": b.end, "embedding": v.tolist()} for b, v in zip(chunks, rows)]
        for chunks, rows in zip(bounds, vectors)
    ])
