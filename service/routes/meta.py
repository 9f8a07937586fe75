"""GET /info, /health and /metrics."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from service.routes import TEI_ERRORS
from service.schemas import BatchingLimits, HealthResponse, InfoResponse, PoolingInfo
from service.settings import VERSION
from service.state import ServiceState, get_service

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
        variant=service.variant,
        parameters=manifest.get("parameters", manifest.get("params", s.params)) or {},
        pooling=_pooling_info(service.pooling),
        max_length=service.max_length,
        hidden_size=service.hidden_size,
        num_layers=service.num_layers,
        num_heads=service.num_heads,
        provider=str(getattr(service.runner, "provider", "unknown")),
        model_sha256=model_sha256(manifest),
        weights_sha256=weights_sha256(manifest),
        batching=BatchingLimits(
            max_batch_tokens=service.batcher.max_batch_tokens,
            max_batch_requests=service.batcher.max_batch_requests,
            max_concurrent_requests=s.max_concurrent_requests,
            max_client_batch_size=s.max_client_batch_size,
            max_body_bytes=s.max_body_bytes,
        ),
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


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request, service: ServiceState = Depends(get_service)) -> Response:
    """Prometheus metrics."""
    return Response(service.metrics.render(), media_type=service.metrics.content_type)
