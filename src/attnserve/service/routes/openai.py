"""POST /v1/embeddings, as OpenAI's embeddings API has it, with the fields Jina's adds
(late_chunking, task, truncate, embedding_type, normalized) and input_type (Voyage's, Cohere's);
POST /v1/contextualizedembeddings, as Voyage's API has it. Errors in OpenAI's form."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from attnserve.service.batching import Timings
from attnserve.service.errors import ServiceError
from attnserve.service.chunk_vectors import contextual_chunks
from attnserve.service.input_types import is_query
from attnserve.service.routes import OPENAI_ERRORS
from attnserve.service.schemas import (ContextualizedEmbeddingRequest, ContextualizedEmbeddingResponse, OpenAIEmbeddingRequest,
                                       OpenAIEmbeddingResponse)
from attnserve.service.state import ServiceState, get_service, get_timings, run_embed
from attnserve.service.tokenizer import InputTooLong
from attnserve.service.vector_formats import as_dtype, encode, fewer_dimensions

router = APIRouter(prefix="/v1", tags=["openai"])

TOO_LONG_REMEDY = "shorten it, send truncate=true (Jina's field), or send a long document to /embed_chunks (one vector per chunk)"


@router.post("/embeddings", response_model=OpenAIEmbeddingResponse, responses=OPENAI_ERRORS)
async def embeddings(body: OpenAIEmbeddingRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """Embeddings of a text, texts, or token-id lists; with Jina's late_chunking, of the
    chunks of one document embedded in one pass."""
    raw = body.input
    if isinstance(raw, str):
        texts, id_lists = [raw], None
    elif isinstance(raw[0], str):
        texts, id_lists = raw, None
    elif isinstance(raw[0], int):
        texts, id_lists = None, [raw]
    else:
        texts, id_lists = None, raw
    service.check_input_count(len(texts or id_lists), "input")
    query = is_query(body.input_type, body.task)
    service.check_dimensions(body.dimensions, "dimensions")
    if body.late_chunking:
        if query:
            raise ServiceError(422, "late_chunking embeds the chunks of a document, but input_type or task says these are queries: "
                               "send queries without late_chunking", "validation", "late_chunking")
        [vectors] = await contextual_chunks(service, [texts], body.truncate, timings, "input", body.normalized, remedy=TOO_LONG_REMEDY)
    else:
        if texts is not None:
            tokenized = await service.tokenize(texts, body.truncate, timings, "input", remedy=TOO_LONG_REMEDY)
        else:
            try:
                tokenized = service.tokenizer.from_ids(id_lists, body.truncate)
            except InputTooLong as exc:
                raise ServiceError(413, exc.advise(TOO_LONG_REMEDY), "too_long", "input") from None
            except ServiceError as exc:  # an id outside the vocabulary
                raise exc.at("input") from None
            timings.input_tokens = [len(t) for t in tokenized]
        vectors = await run_embed(service, [t.ids for t in tokenized], timings, "input", body.normalized, query)
    vectors = as_dtype(fewer_dimensions(vectors, body.dimensions, body.normalized), body.dtype)
    data = [{"object": "embedding", "index": index, "embedding": encode(vector, body.base64)} for index, vector in enumerate(vectors)]
    tokens = int(sum(timings.input_tokens))
    return JSONResponse({
        "object": "list",
        "data": data,
        "model": service.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })


@router.post("/contextualizedembeddings", response_model=ContextualizedEmbeddingResponse, responses=OPENAI_ERRORS)
async def contextualized_embeddings(body: ContextualizedEmbeddingRequest, service: ServiceState = Depends(get_service),
                                    timings: Timings = Depends(get_timings)):
    """Voyage's contextualized chunk embeddings: each document, a list of its chunks, embedded
    in one pass, a vector per chunk; a document of one chunk gets its /embed vector."""
    service.check_input_count(len(body.inputs), "inputs")
    query = is_query(body.input_type)
    if query and any(len(chunks) > 1 for chunks in body.inputs):
        index = next(i for i, chunks in enumerate(body.inputs) if len(chunks) > 1)
        raise ServiceError(422, f"input_type query takes one query per inner list, but inputs[{index}] has {len(body.inputs[index])}: "
                           "send [[query], [query], ...]", "validation", "inputs")
    service.check_dimensions(body.output_dimension, "output_dimension")
    documents = await contextual_chunks(service, body.inputs, False, timings, "inputs", query=query,
                                        remedy="split the document into two requests, or send it to /embed_chunks with truncate=true")
    data = []
    for index, vectors in enumerate(documents):
        vectors = as_dtype(fewer_dimensions(vectors, body.output_dimension), body.output_dtype or "float")
        chunks = [{"object": "embedding", "embedding": encode(v, body.encoding_format == "base64"), "index": i} for i, v in enumerate(vectors)]
        data.append({"object": "list", "data": chunks, "index": index})
    return JSONResponse({"object": "list", "data": data, "model": service.model_name,
                         "usage": {"total_tokens": int(sum(timings.input_tokens))}})
