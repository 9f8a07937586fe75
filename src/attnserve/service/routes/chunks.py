"""POST /embed_chunks: a vector per chunk, with the context the request asks for: none (each
chunk embedded alone) or late (late chunking: one forward per document, each chunk the mean of
its tokens)."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from attnserve.service.batching import Timings
from attnserve.service.errors import ServiceError
from attnserve.service.chunk_vectors import chunk_vectors
from attnserve.contract.pooling import BadSpans, check_spans, span_chunks, token_chunks
from attnserve.service.routes import TEI_ERRORS
from attnserve.service.schemas import ChunkEmbedding, EmbedChunksRequest
from attnserve.service.state import ServiceState, get_service, get_timings

router = APIRouter(tags=["late chunking"])


@router.post("/embed_chunks", response_model=list[list[ChunkEmbedding]], responses=TEI_ERRORS)
async def embed_chunks(body: EmbedChunksRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """For each input, its chunks in order with their character offsets and vectors. With
    context late, the mean of each chunk's last hidden states from one pass over the whole
    document, so every chunk vector has seen all of it; none, each chunk embedded alone."""
    context = body.context or service.chunk_context
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
    vectors = await chunk_vectors(service, [t.ids for t in tokenized], bounds, context, timings, body.normalize)
    return JSONResponse([
        [{"start": b.start, "end": b.end, "embedding": v.tolist()} for b, v in zip(chunks, rows)]
        for chunks, rows in zip(bounds, vectors)
    ])

