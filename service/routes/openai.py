"""POST /v1/embeddings, as OpenAI's embeddings API has it (errors in OpenAI's form too)."""
from __future__ import annotations

import base64

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from attnserve.service.batching import Timings
from attnserve.service.errors import ServiceError
from attnserve.service.contract.pooling import l2_normalize
from attnserve.service.routes import OPENAI_ERRORS
from attnserve.service.schemas import OpenAIEmbeddingRequest, OpenAIEmbeddingResponse
from attnserve.service.state import ServiceState, get_service, get_timings, run_embed
from attnserve.service.tokenizer import InputTooLong

router = APIRouter(prefix="/v1", tags=["openai"])

# /v1/embeddings has no truncate field (OpenAI's API refuses long input too).
TOO_LONG_REMEDY = "shorten it, or send a long document to /embed_chunks (one vector per chunk) or to /embed with truncate=true"


@router.post("/embeddings", response_model=OpenAIEmbeddingResponse, responses=OPENAI_ERRORS)
async def embeddings(body: OpenAIEmbeddingRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """Embeddings of a text, texts, or token-id lists."""
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
    if body.dimensions is not None and body.dimensions > service.hidden_size:
        raise ServiceError(422, f"dimensions must be at most {service.hidden_size} for this model (got {body.dimensions})", "validation", "dimensions")
    if texts is not None:
        tokenized = await service.tokenize(texts, False, timings, "input", remedy=TOO_LONG_REMEDY)
    else:
        try:
            tokenized = service.tokenizer.from_ids(id_lists)
        except InputTooLong as exc:
            raise ServiceError(413, exc.advise(TOO_LONG_REMEDY), "too_long", "input") from None
        except ServiceError as exc:  # an id outside the vocabulary
            raise exc.at("input") from None
        timings.input_tokens = [len(t) for t in tokenized]
    vectors = await run_embed(service, [t.ids for t in tokenized], timings, "input")
    if body.dimensions is not None:
        vectors = l2_normalize(vectors[:, : body.dimensions])
    vectors = vectors.astype("<f4", copy=False)
    data = []
    for index, vector in enumerate(vectors):
        embedding = base64.b64encode(vector.tobytes()).decode() if body.encoding_format == "base64" else vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = int(sum(timings.input_tokens))
    return JSONResponse({
        "object": "list",
        "data": data,
        "model": service.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
