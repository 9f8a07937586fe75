"""POST /attention: a layer's attention map as sparse COO, a pooled grid, or a PNG heatmap."""
from __future__ import annotations

import asyncio
import json

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import Response

from attnserve.service.batching import Timings
from attnserve.service.errors import ServiceError
from attnserve.service.rendering import attention_png, pool_grid, top_k_per_row
from attnserve.service.routes import TEI_ERRORS
from attnserve.service.schemas import (
    AttentionRequest,
    GridAttentionResponse,
    SparseAttentionResponse,
)
from attnserve.service.state import (
    MapAsk,
    ServiceState,
    attention_fitting_length,
    check_attention_budget,
    get_service,
    get_timings,
    run_attention,
)

router = APIRouter(tags=["attention"])


@router.post(
    "/attention",
    response_model=SparseAttentionResponse | GridAttentionResponse,
    responses={**TEI_ERRORS, 200: {"content": {"image/png": {}}, "description": "JSON for sparse and grid, image/png for png"}},
)
async def attention(body: AttentionRequest, service: ServiceState = Depends(get_service), timings: Timings = Depends(get_timings)):
    """The attention every token of `inputs` pays to every other at `layer` (one head, or
    the mean over heads), with the tokens and each layer's rank-collapse ratio."""
    if body.layer >= service.num_layers:
        raise ServiceError(422, f"layer must be in 0..{service.num_layers - 1} (got {body.layer})", "validation", "layer")
    if body.head is not None and body.head >= service.num_heads:
        raise ServiceError(422, f"head must be in 0..{service.num_heads - 1} or null for the mean over heads (got {body.head})", "validation", "head")
    limit = service.runner.attention_max_length  # truncate=true cuts to it, the maps' own limit
    (tokenized,) = await service.tokenize([body.inputs], body.truncate, timings, "inputs",
                                          max_length=limit if body.truncate and limit else None)
    ask = MapAsk(body.head, lambda n: _per_row(body, n), frozenset(
        name for name, taken in (("top_k", body.top_k is not None), ("head", body.head is not None), ("truncate", body.truncate)) if taken))
    if body.truncate and limit:
        # ... and to the length whose map fits the server's memory and answer limits.
        fitting = await asyncio.to_thread(attention_fitting_length, service, len(tokenized), ask)
        if 2 <= fitting < len(tokenized):
            (tokenized,) = await service.tokenize([body.inputs], True, timings, "inputs", max_length=fitting)
    n = len(tokenized)
    queries, keys = _window(body.query_range, n, "query_range"), _window(body.key_range, n, "key_range")
    await check_attention_budget(service, n, ask)
    (rows, cols, values), ratios = await run_attention(service, tokenized.ids, body.layer, body.head, timings)
    # Shaping a 16K-token map (top-k, pooling, PNG, JSON) takes a while: not on the event loop.
    return await asyncio.to_thread(_render, body, service, tokenized, queries, keys, rows, cols, values, ratios)


def _per_row(body: AttentionRequest, n: int) -> int | None:
    """The weights a sparse answer keeps per query row on average over n rows (0: every one;
    None: not sparse): a window holds at most its queries x min(its keys, top_k) weights."""
    if body.format != "sparse":
        return None
    queries = (min(body.query_range[1], n) - body.query_range[0]) if body.query_range else n
    keys = (min(body.key_range[1], n) - body.key_range[0]) if body.key_range else n
    if (queries, keys) == (n, n) and body.top_k is None:
        return 0
    return -(-max(0, queries) * max(0, min(keys, body.top_k or n)) // n)


def _window(given: list[int] | None, n: int, name: str) -> tuple[int, int]:
    """A request's token range as (start, stop), all n tokens when not given; 422 past the text."""
    if given is None:
        return 0, n
    if given[1] > n:
        raise ServiceError(422, f"{name} [{given[0]}, {given[1]}] ends past the text's {n} tokens: send stop <= {n}", "validation", name)
    return given[0], given[1]


def _render(body: AttentionRequest, service: ServiceState, tokenized, queries, keys, rows, cols, values, ratios) -> Response:
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    values = np.asarray(values, dtype=np.float32)
    n = len(tokenized)
    if (queries, keys) != ((0, n), (0, n)):
        inside = (rows >= queries[0]) & (rows < queries[1]) & (cols >= keys[0]) & (cols < keys[1])
        rows, cols, values = rows[inside], cols[inside], values[inside]
    common = {
        "variant": service.variant,
        "layer": body.layer,
        "layer_variant": service.layer_variants[body.layer],
        "head": body.head,
        "n_tokens": n,
        "tokens": tokenized.tokens,
        "offsets": [[int(a), int(b)] for a, b in tokenized.offsets],
        "query_range": list(queries),
        "key_range": list(keys),
        "rank_collapse": [float(r) for r in ratios],
    }
    if body.format == "sparse":
        if body.top_k is not None:
            rows, cols, values = top_k_per_row(rows, cols, values, body.top_k)
        if len(values) > service.settings.max_attention_entries:
            raise ServiceError(
                413,
                f"this map has {len(values)} non-zero weights, more than this server sends at once "
                f"({service.settings.max_attention_entries}); send top_k <= {max(1, service.settings.max_attention_entries // n)}"
                f"{'' if body.top_k is None else ' (a smaller one)'}, or format grid or png",
                "too_long",
                "top_k",
            )
        return _json({**common, "format": "sparse", "rows": rows.tolist(), "cols": cols.tolist(), "values": values.tolist()})
    grid, cell = pool_grid(rows, cols, values, n, body.max_cells, queries, keys)
    if body.format == "png":
        head = "mean over heads" if body.head is None else f"head {body.head}"
        window = "" if (queries, keys) == ((0, n), (0, n)) else f", queries {queries[0]}-{queries[1] - 1} x keys {keys[0]}-{keys[1] - 1}"
        title = f"{service.variant}, layer {body.layer} ({service.layer_variants[body.layer]}), {head}: {n} tokens{window}"
        return Response(attention_png(grid, cell, tokenized.tokens, queries, keys, title), media_type="image/png")
    return _json({**common, "format": "grid", "cell_tokens": cell, "grid": grid.tolist()})


def _json(content: dict) -> Response:
    return Response(json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(), media_type="application/json")
