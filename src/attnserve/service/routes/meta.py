"""GET /info, /health, /ready and /metrics."""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from attnserve.service.input_types import describe as describe_input_types
from attnserve.service.routes import TEI_ERRORS
from attnserve.service.schemas import BatchingLimits, HealthResponse, InfoResponse, ModelInfo, PoolingInfo
from attnserve.service.settings import VERSION
from attnserve.service.state import ServiceState, get_service

router = APIRouter(tags=["service"])


def model_sha256(manifest: dict) -> str | None:
    """sha256 of the served ONNX file, as the export's manifest records it."""
    files = manifest.get("files") or {}
    entry = files.get("model.onnx") or {}
    return entry.get("sha256") or manifest.get("sha256")


def weights_sha256(manifest: dict) -> str | None:
    """sha256 of the adapted weights the export was made with, None for the pretrained model."""
    return (manifest.get("weights") or {}).get("sha256")


@router.get("/info", response_model=InfoResponse, responses=TEI_ERRORS)
async def info(service: ServiceState = Depends(get_service)) -> InfoResponse:
    """What this deployment serves and its limits."""
    manifest, s = service.manifest, service.settings
    return InfoResponse(
        model_name=service.model_name,
        model=ModelInfo.model_validate(service.model) if service.model else None,
        variant=service.variant,
        layer_variants=service.layer_variants,
        precision=service.runner.precision,
        parameters=manifest.get("parameters", manifest.get("params", s.params)) or {},
        pooling=_pooling_info(service.pooling),
        max_length=service.max_length,
        past_trained_length=service.max_length > ((service.model or {}).get("max_positions") or 512),
        hidden_size=service.hidden_size,
        num_layers=service.num_layers,
        num_heads=service.num_heads,
        provider=service.runner.provider,
        model_sha256=model_sha256(manifest),
        weights_sha256=weights_sha256(manifest),
        batching=BatchingLimits(
            max_batch_tokens=service.batcher.max_batch_tokens,
            max_batch_requests=service.batcher.max_batch_requests,
            batch_order=s.batch_order,
            max_concurrent_requests=s.max_concurrent_requests,
            max_client_batch_size=s.max_client_batch_size,
            max_body_bytes=s.max_body_bytes,
        ),
        chunk_context=service.chunk_context,
        chunk_contexts=service.chunk_contexts,
        input_types=describe_input_types(service.pooling, service.contextual_context),
        attention_max_length=service.runner.attention_max_length,
        rank_collapse_paths=list(service.runner.collapse_paths),
        rank_collapse_max_length=service.runner.collapse_max_length,
        version=VERSION,
    )


def _pooling_info(pooling) -> PoolingInfo:
    if pooling.mode != "opening":
        return PoolingInfo(mode=pooling.mode)
    return PoolingInfo(mode=pooling.mode, opening_weight=pooling.opening_weight, opening_tokens=pooling.opening_tokens)


@router.get("/health", response_model=HealthResponse, responses={503: TEI_ERRORS[422] | {"description": "not ready"}})
async def health(service: ServiceState = Depends(get_service)) -> HealthResponse:
    """200 once the model is loaded and the batcher runs."""
    return HealthResponse()


class ReadyResponse(BaseModel):
    """Whether this instance should be sent new requests, and the figures that say why."""

    ready: bool
    reason: Literal["ok", "loading", "shutting_down", "at_concurrency_limit", "queue_full"]
    in_flight: int | None = None
    max_concurrent_requests: int | None = None
    queued_tokens: int | None = None
    max_queued_tokens: int | None = None


def readiness(service: ServiceState | None) -> ReadyResponse:
    """Ready once the model is loaded, while shutdown has not begun, a request would get an
    admission place, and the queue could still take one input of max_length tokens (the
    largest input a client may send; a queue that cannot take it refuses such requests 429)."""
    if service is None:
        return ReadyResponse(ready=False, reason="loading")
    batcher, s = service.batcher, service.settings
    figures = dict(in_flight=batcher.in_flight, max_concurrent_requests=batcher.max_concurrent_requests,
                   queued_tokens=batcher.queued_tokens, max_queued_tokens=s.max_queued_tokens)
    if batcher.closing:
        return ReadyResponse(ready=False, reason="shutting_down", **figures)
    if batcher.in_flight >= batcher.max_concurrent_requests:
        return ReadyResponse(ready=False, reason="at_concurrency_limit", **figures)
    if s.max_queued_tokens and batcher.queued_tokens + batcher.padded(service.max_length) > s.max_queued_tokens:
        return ReadyResponse(ready=False, reason="queue_full", **figures)
    return ReadyResponse(ready=True, reason="ok", **figures)


@router.get("/ready", response_model=ReadyResponse, responses={503: {"model": ReadyResponse, "description": "not ready: loading, shutting down, or full"}})
async def ready(request: Request):
    """200 while this instance takes new work; 503 (same body) while it loads, shuts down, or
    has no admission place or queue room left. Answered on the event loop, never queued behind
    inference, and without the API key, so that an orchestrator's probe can ask it."""
    state = readiness(getattr(request.app.state, "service", None))
    if not state.ready:
        return JSONResponse(state.model_dump(), status_code=503)
    return state


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request, service: ServiceState = Depends(get_service)) -> Response:
    """Prometheus metrics."""
    return Response(service.metrics.render(), media_type=service.metrics.content_type)
