"""POST /rank_collapse: how far each layer's token vectors are from rank 1, along the paths of
"Attention is not all you need" (Dong, Cordonnier and Loukas 2021) through the deployment's
weights, from the export's collapse graph."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from attnserve.service.batching import Timings
from attnserve.service.routes import TEI_ERRORS
from attnserve.service.schemas import RankCollapseRequest, RankCollapseResponse
from attnserve.service.state import ServiceState, check_collapse_length, get_service, get_timings, run_collapse

router = APIRouter(tags=["attention"])


@router.post("/rank_collapse", response_model=RankCollapseResponse, responses=TEI_ERRORS)
async def rank_collapse(body: RankCollapseRequest, service: ServiceState = Depends(get_service),
                        timings: Timings = Depends(get_timings)) -> RankCollapseResponse:
    """Per layer, ||X - 1 x^T|| / ||X|| of the layer's output X (x the mean token) along each
    path asked for: the model itself, pure attention (skips and MLPs removed), attention with
    its skips, attention with its MLPs. Pure attention loses rank doubly exponentially with
    depth; the skips are what keep a transformer's tokens apart."""
    # truncate=true cuts to this route's own limit (a quarter of max_length), as TEI cuts to its own.
    limit = service.runner.collapse_max_length
    (tokenized,) = await service.tokenize([body.inputs], body.truncate, timings, "inputs",
                                          max_length=limit if body.truncate and limit else None)
    check_collapse_length(service, len(tokenized))
    ratios = await run_collapse(service, tokenized.ids, list(body.paths), timings)
    return RankCollapseResponse(variant=service.variant, layer_variants=service.layer_variants, n_tokens=len(tokenized),
                                embeddings=ratios[body.paths[0]][0], paths={path: r[1:] for path, r in ratios.items()})
