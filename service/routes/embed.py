"""POST /embed and POST /tokenize, as text-embeddings-inference has them."""
from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from service.batching import Timings
from service.routes import TEI_ERRORS
from service.schemas import EmbedRequest, SimpleToken, TokenizeRequest
from service.state import ServiceState, admitted, get_service, get_timings, run_embed

router = APIRouter(tags=["text-embeddings-inference"])


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


@router.post("/embed", response_model=list[list[float]], responses=TEI_ERRORS)
async def embed(body: EmbedRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """Mean-pooled sentence embeddings of one text or a list of texts."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    service.check_input_count(len(texts), "inputs")
    with admitted(service):
        tokenized = await service.tokenize(texts, body.truncate, timings, "inputs")
        timings.input_tokens = [len(t) for t in tokenized]
        vectors = await run_embed(service, [t.ids for t in tokenized], timings, "inputs", normalized=body.normalize)
    return JSONResponse(vectors.tolist())


@router.post("/tokenize", response_model=list[list[SimpleToken]], responses=TEI_ERRORS)
async def tokenize(body: TokenizeRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """The tokens the model would see for each input."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    service.check_input_count(len(texts), "inputs")
    with admitted(service):
        tokenized = await service.tokenize(texts, body.truncate, timings, "inputs", body.add_special_tokens)
    timings.input_tokens = [len(t) for t in tokenized]
    return JSONResponse([
        [
            {"id": i, "text": tok, "special": sp, "start": None if sp else a, "stop": None if sp else b}
            for i, tok, sp, (a, b) in zip(t.ids, t.tokens, t.special, t.offsets)
        ]
        for t in tokenized
    ])
