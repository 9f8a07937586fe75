"""create_app(settings) -> FastAPI: routers, middleware, error handlers, and a lifespan that
loads the export, starts the batcher, and on shutdown finishes what was accepted."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from attnserve.service.backend import Runner
from attnserve.service.batching import TokenBudgetBatcher, default_batch_tokens
from attnserve.service.errors import install_error_handlers
from attnserve.service.lifetime import RequestLifetimeMiddleware
from attnserve.service.metrics import ServiceMetrics
from attnserve.contract.pooling import Pooling, default_opening_tokens, default_pooling
from attnserve.service.middleware import BearerAuthMiddleware, BodyLimitMiddleware, TimingMiddleware
from attnserve.service.routes import attention, chunks, collapse, embed, explorer, install_deployment_schema, meta, openai
from attnserve.service.settings import VERSION, Settings
from attnserve.service.state import ServiceState
from attnserve.service.tokenizer import TextTokenizer

log = logging.getLogger("attnserve")


def load_runner(settings: Settings) -> tuple[Runner, Path]:
    """The ONNX Runtime runner over this deployment's export (exported first if missing), and
    the export's tokenizer.json."""
    from attnserve.contract.export_format import TOKENIZER_FILE
    from attnserve.service.exports import ensure_export
    from attnserve.service.runtime import OnnxRunner

    export_dir = ensure_export(settings)
    runner = OnnxRunner(
        export_dir,
        providers=settings.providers,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
        graph_optimization=settings.graph_optimization,
        arena_shrink_tokens=settings.arena_shrink_tokens,
    )
    return runner, export_dir / TOKENIZER_FILE


def deployment_pooling(settings: Settings, runner: Runner) -> str:
    """The pooling mode served: --pooling where it is set, else the export's default (the
    model's own where it is cls or lasttoken: contract.pooling.default_pooling)."""
    return settings.pooling or default_pooling(getattr(runner, "manifest", None))


def create_app(settings: Settings | None = None, runner: Runner | None = None, tokenizer_path=None) -> FastAPI:
    """The service. `runner` (a service.backend.Runner) and `tokenizer_path` are for tests and
    `attnserve serve`; by default both come from the export `settings` names."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        nonlocal runner
        path = tokenizer_path
        if runner is None:
            runner, exported_tokenizer = await asyncio.to_thread(load_runner, settings)
            path = path or exported_tokenizer
        max_length = min(settings.max_length, runner.max_length)
        metrics = ServiceMetrics(runner.variant, runner.precision)
        batcher = TokenBudgetBatcher(
            runner,
            max_batch_tokens=settings.max_batch_tokens or default_batch_tokens(runner.provider),
            max_batch_requests=min(settings.max_batch_requests, runner.max_batch),
            max_concurrent_requests=settings.max_concurrent_requests,
            on_queue_change=metrics.queue_depth.set,
            on_batch=metrics.inputs_run.inc,
            max_queued_tokens=settings.max_queued_tokens,
            by_length=settings.batch_order == "length",
            pooling=Pooling(deployment_pooling(settings, runner), settings.opening_weight,
                            settings.opening_tokens or default_opening_tokens(getattr(runner, "manifest", None))),
        )
        pool = ThreadPoolExecutor(max_workers=settings.tokenization_workers, thread_name_prefix="attnserve-tokenize")
        app.state.service = ServiceState(
            settings=settings,
            tokenizer=TextTokenizer(path, max_length),
            batcher=batcher,
            metrics=metrics,
            max_length=max_length,
            tokenization_pool=pool,
        )
        # One tiny batch before the first request, so it does not pay ONNX Runtime's first-run setup.
        tokenizer = app.state.service.tokenizer
        warm_ids = np.array([[tokenizer.cls_id, tokenizer.sep_id]], dtype=np.int64)
        await asyncio.to_thread(runner.embed, warm_ids, np.ones_like(warm_ids))
        await batcher.start()
        log.info("serving %s (max_length %d, %s pooling) on %s", runner.variant, max_length,
                 app.state.service.pooling.mode, runner.provider)
        try:
            yield
        finally:
            # uvicorn has stopped accepting and waited for open requests; finish the queue.
            await batcher.stop()
            pool.shutdown(wait=True)

    # /docs and /redoc load Swagger UI and ReDoc from files the fastapi-offline package ships,
    # not from a CDN, so they work on a machine without internet.
    app = FastAPIOffline(
        title="attnserve",
        version=VERSION,
        description="Long-document embeddings and attention maps from efficient-attention variants of all-MiniLM-L6-v2, on ONNX Runtime.",
        lifespan=lifespan,
    )
    app.state.service = None
    app.state.settings = settings
    for module in (embed, chunks, openai, attention, collapse, meta, explorer):
        app.include_router(module.router)
    install_deployment_schema(app)
    install_error_handlers(app)
    # Added innermost first: timing wraps everything, so refused requests get headers too; a
    # request is authenticated before it takes an admission place.
    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    app.add_middleware(RequestLifetimeMiddleware, service_getter=lambda: app.state.service)
    app.add_middleware(BearerAuthMiddleware, api_key=api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(TimingMiddleware, service_getter=lambda: app.state.service)
    if settings.explorer_peers:
        # Outermost, so a browser's preflight is answered before auth asks for the key.
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=explorer.peer_origins(settings.explorer_peers),
                           allow_methods=["GET", "POST"], allow_headers=["authorization", "content-type"])
    return app
