"""POST /embed, /embed_all, /similarity, /decode and /tokenize, as text-embeddings-inference has them."""
from __future__ import annotations

import json

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from attnserve.service.batching import Timings
from attnserve.service.errors import ServiceError
from attnserve.service.routes import TEI_ERRORS
from attnserve.service.input_types import is_query
from attnserve.service.schemas import (DecodeRequest, EmbedAllRequest, EmbedRequest, SimilarityParameters, SimilarityRequest, SimpleToken,
                                       TokenizeRequest)
from attnserve.service.state import ServiceState, get_service, get_timings, run_embed, run_reduce

router = APIRouter(tags=["text-embeddings-inference"])


@router.post("/embed", response_model=list[list[float]], responses=TEI_ERRORS)
async def embed(body: EmbedRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """Mean-pooled sentence embeddings of one text or a list of texts."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    service.check_input_count(len(texts), "inputs")
    tokenized = await service.tokenize(texts, body.truncate, timings, "inputs", keep_end=body.keeps_end)
    vectors = await run_embed(service, [t.ids for t in tokenized], timings, "inputs", body.normalize, is_query(body.input_type))
    return JSONResponse(vectors.tolist())


@router.post("/similarity", response_model=list[float], responses=TEI_ERRORS)
async def similarity(body: SimilarityRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """Cosine similarity of source_sentence to each of sentences, all embedded as /embed
    embeds them."""
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    service.check_input_count(len(texts), "inputs.sentences")
    parameters = body.parameters or SimilarityParameters()
    tokenized = await service.tokenize(texts, bool(parameters.truncate), timings, "inputs", keep_end=parameters.keeps_end)
    vectors = await run_embed(service, [t.ids for t in tokenized], timings, "inputs")
    return JSONResponse((vectors[1:] @ vectors[0]).astype(float).tolist())


@router.post("/embed_all", response_model=list[list[list[float]]], responses=TEI_ERRORS)
async def embed_all(body: EmbedAllRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """Every token's last hidden state ([CLS] and [SEP] included), not normalised, per input."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    service.check_input_count(len(texts), "inputs")
    tokenized = await service.tokenize(texts, body.truncate, timings, "inputs", keep_end=body.keeps_end)
    service.check_vector_count(sum(timings.input_tokens), "token", "send fewer or shorter inputs, or use /embed_chunks", "inputs")
    states = await run_reduce(service, [t.ids for t in tokenized], [_json_array] * len(tokenized), timings, "inputs")
    return Response(b"[" + b",".join(states) + b"]", media_type="application/json")


def _json_array(hidden: np.ndarray) -> bytes:
    """One input's token vectors as JSON, written in the inference thread (a 16K-token answer
    takes seconds to serialise, which the event loop must not spend)."""
    return json.dumps(hidden.tolist(), separators=(",", ":")).encode()


@router.post("/decode", response_model=list[str], responses=TEI_ERRORS)
async def decode(body: DecodeRequest, service: ServiceState = Depends(get_service)):
    """Token ids back to text, one string per id list."""
    batches = [body.ids] if isinstance(body.ids[0], int) else body.ids
    service.check_input_count(len(batches), "ids")
    vocab = service.tokenizer.vocab_size
    for index, ids in enumerate(batches):
        bad = next((i for i in ids if i >= vocab), None)
        if bad is not None:
            where = f"list {index} " if len(batches) > 1 else ""
            raise ServiceError(422, f"ids: {where}has token id {bad}, outside the vocabulary 0..{vocab - 1}", "validation", "ids")
    return JSONResponse(service.tokenizer.decode(batches, body.skip_special_tokens))


@router.post("/tokenize", response_model=list[list[SimpleToken]], responses=TEI_ERRORS)
async def tokenize(body: TokenizeRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """The tokens the model would see for each input."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    service.check_input_count(len(texts), "inputs")
    tokenized = await service.tokenize(texts, body.truncate, timings, "inputs", body.add_special_tokens)
    return JSONResponse([
        [
            {"id": i, "text": tok, "special": sp, "start": None if sp else a, "stop": None if sp else b}
            for i, tok, sp, (a, b) in zip(t.ids, t.tokens, t.special, t.offsets)
        ]
        for t in tokenized
    ])
