"""The shared state of a running service and the FastAPI dependency that hands it to routes."""
from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from fastapi import Request

from service.batching import Timings, TokenBudgetBatcher
from service.errors import ServiceError
from service.metrics import ServiceMetrics
from service.pooling import Pooling
from service.settings import Settings
from service.tokenizer import InputTooLong, TextTokenizer, Tokenized


@dataclass
class ServiceState:
    settings: Settings
    runner: object  # service.runtime.OnnxRunner or anything with its interface
    tokenizer: TextTokenizer
    batcher: TokenBudgetBatcher
    metrics: ServiceMetrics
    max_length: int
    tokenization_pool: ThreadPoolExecutor = field(repr=False, default=None)
    pooling: Pooling = field(default_factory=Pooling)

    @property
    def manifest(self) -> dict:
        return getattr(self.runner, "manifest", {}) or {}

    @property
    def variant(self) -> str:
        return getattr(self.runner, "variant", None) or self.manifest.get("variant") or self.settings.variant

    @property
    def model_name(self) -> str:
        return self.settings.model_name or f"attnserve-{self.variant}"

    @property
    def num_layers(self) -> int:
        return int(self.manifest.get("num_layers", 6))

    @property
    def num_heads(self) -> int:
        return int(self.manifest.get("num_heads", 12))

    @property
    def hidden_size(self) -> int:
        return int(self.manifest.get("hidden_size", 384))

    def check_input_count(self, n: int, param: str) -> None:
        limit = self.settings.max_client_batch_size
        if n > limit:
            raise ServiceError(
                413,
                f"{n} inputs in one request, more than this server's limit of {limit} (ATTNSERVE_MAX_CLIENT_BATCH_SIZE); split the request",
                "too_many_inputs",
                param,
            )

    async def tokenize(self, texts: list[str], truncate: bool, timings: Timings, param: str, add_special_tokens: bool = True) -> list[Tokenized]:
        """Tokenize in the tokenization thread pool, recording each input's length in timings;
        413 for a too-long input."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            tokenized = await loop.run_in_executor(self.tokenization_pool, self.tokenizer.encode, texts, truncate, add_special_tokens)
            timings.input_tokens = [len(t) for t in tokenized]
            return tokenized
        except InputTooLong as exc:
            raise ServiceError(413, str(exc), "too_long", param) from None
        except Exception as exc:  # the tokenizer refused the text
            raise ServiceError(422, f"the tokenizer could not read input: {exc}", "tokenizer", param) from None
        finally:
            timings.tokenization += time.perf_counter() - started


def get_service(request: Request) -> ServiceState:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise ServiceError(503, "the model is not loaded yet; retry in a moment", "unhealthy")
    return service


def get_timings(request: Request) -> Timings:
    timings = getattr(request.state, "timings", None)
    if timings is None:  # only when the app runs without its timing middleware
        timings = request.state.timings = Timings()
    return timings


async def run_embed(service: ServiceState, inputs: list[list[int]], timings: Timings, param: str, normalize: bool = True):
    """(len(inputs), hidden) float32 vectors pooled as the deployment's pooling says, from the
    batcher; its failures as ServiceErrors. Mean pooling, normalised, is the graph's own output."""
    if service.pooling.mode == "mean" and normalize:
        return await _run(service.batcher.embed(inputs, timings), param)
    reduce = functools.partial(service.pooling, normalize=normalize)
    return np.stack(await run_reduce(service, inputs, [reduce] * len(inputs), timings, param))


async def run_reduce(service: ServiceState, inputs: list[list[int]], reducers, timings: Timings, param: str) -> list:
    """reducers[i](input i's last hidden states) for every input, through the batcher."""
    return await _run(service.batcher.reduce(inputs, reducers, timings), param)


async def _run(work, param: str):
    try:
        return await work
    except ValueError as exc:  # the runner refuses what it cannot run (too long for the export)
        raise ServiceError(413, str(exc), "too_long", param) from None


async def run_attention(service: ServiceState, ids: list[int], layer: int, head: int | None, timings: Timings):
    try:
        return await service.batcher.attention(ids, layer, head, timings)
    except ValueError as exc:
        raise ServiceError(422, str(exc), "validation") from None
