"""The shared state of a running service and the FastAPI dependency that hands it to routes."""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request

from attnserve.contract.model_folder import DEFAULT_MODEL_NAME
from attnserve.contract.pooling import CHUNK_CONTEXTS, Pooling
from attnserve.service.attention_maps import SPARSE_ANSWER_BYTES
from attnserve.service.backend import Runner
from attnserve.service.batching import Timings, TokenBudgetBatcher
from attnserve.service.errors import ServiceError
from attnserve.service.metrics import ServiceMetrics
from attnserve.service.settings import Settings
from attnserve.service.tokenizer import InputTooLong, TextTokenizer, Tokenized


@dataclass
class ServiceState:
    settings: Settings
    tokenizer: TextTokenizer
    batcher: TokenBudgetBatcher
    metrics: ServiceMetrics
    max_length: int
    tokenization_pool: ThreadPoolExecutor = field(repr=False, default=None)

    @property
    def chunk_context(self) -> str:
        """/embed_chunks' context when a request names none."""
        return self.settings.chunk_context

    @property
    def chunk_contexts(self) -> list[str]:
        """The contexts /embed_chunks serves."""
        return list(CHUNK_CONTEXTS)

    @property
    def contextual_context(self) -> str:
        """The context of chunks sent as one document's texts (Jina's late_chunking, Voyage's
        contextualized embeddings): late whatever the deployment's chunk context (those APIs
        promise vectors that have seen the document)."""
        return "late"

    @property
    def runner(self) -> Runner:
        return self.batcher.backend.runner

    @property
    def pooling(self) -> Pooling:
        return self.batcher.backend.pooling

    @property
    def manifest(self) -> dict:
        return self.runner.manifest

    @property
    def variant(self) -> str:
        return self.runner.variant

    @property
    def model(self) -> dict | None:
        """The model the export was made from (manifest.json's model: name, sha256, pooling,
        normalize); None for an export older than the record."""
        return self.manifest.get("model")

    @property
    def model_name(self) -> str:
        """What /info and /v1/embeddings call the model: --model-name, else attnserve-VARIANT
        for the bundled all-MiniLM-L6-v2 and attnserve-VARIANT-MODEL for another model."""
        if self.settings.model_name:
            return self.settings.model_name
        name = (self.model or {}).get("name", DEFAULT_MODEL_NAME)
        return f"attnserve-{self.variant}" if name == DEFAULT_MODEL_NAME else f"attnserve-{self.variant}-{name}"

    @property
    def num_layers(self) -> int:
        return int(self.manifest.get("num_layers", 6))

    @property
    def layer_variants(self) -> list[str]:
        """The variant each layer runs: a schedule's differ (an export that does not say: the variant's)."""
        return list(self.manifest.get("layer_variants") or [self.variant] * self.num_layers)

    @property
    def num_heads(self) -> int:
        return int(self.manifest.get("num_heads", 12))

    @property
    def hidden_size(self) -> int:
        return int(self.manifest.get("hidden_size", 384))

    def check_dimensions(self, dimensions: int | None, param: str) -> None:
        """422 for a requested vector size past the model's hidden size (None: the whole vector)."""
        if dimensions is not None and dimensions > self.hidden_size:
            raise ServiceError(422, f"{param} must be at most {self.hidden_size} for this model (got {dimensions})", "validation", param)

    def check_input_count(self, n: int, param: str) -> None:
        limit = self.settings.max_client_batch_size
        if n > limit:
            raise ServiceError(
                413,
                f"{n} inputs in one request, more than this server's limit of {limit} (ATTNSERVE_MAX_CLIENT_BATCH_SIZE); split the request",
                "too_many_inputs",
                param,
            )

    def check_vector_count(self, n: int, kind: str, remedy: str, param: str) -> None:
        """413 before any work when an answer would hold more than max_token_vectors vectors
        (`kind`: "token" or "chunk"); `remedy` says what to send instead."""
        limit = self.settings.max_token_vectors
        if n > limit:
            raise ServiceError(413, f"this request would return {n} {kind} vectors, more than this server sends at once ({limit}, "
                               f"ATTNSERVE_MAX_TOKEN_VECTORS); {remedy}", "too_long", param)

    async def tokenize(self, texts: list[str], truncate: bool, timings: Timings, param: str, add_special_tokens: bool = True,
                       keep_end: bool = False, remedy: str | None = None, names=None, max_length: int | None = None) -> list[Tokenized]:
        """Tokenize in the tokenization thread pool, recording each input's length in timings;
        413 for an input over max_length (a route's own limit; default the server's), its
        message ending in `remedy` (default: send truncate=true) and calling input i names(i)
        if `names` is given."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        encode = functools.partial(self.tokenizer.encode, texts, truncate, add_special_tokens, keep_end, max_length)
        try:
            tokenized = await loop.run_in_executor(self.tokenization_pool, encode)
            timings.input_tokens = [len(t) for t in tokenized]
            return tokenized
        except InputTooLong as exc:
            if names is not None:
                exc.name(names(exc.index))
            raise ServiceError(413, exc.advise(remedy or "shorten it or send truncate=true"), "too_long", param) from None
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


async def run_embed(service: ServiceState, inputs: list[list[int]], timings: Timings, param: str, normalize: bool = True,
                    query: bool = False):
    """(len(inputs), hidden) float32 vectors pooled as the deployment's pooling says (for
    queries, if `query`: service.schemas.InputType), from the batcher; its refusals as
    ServiceErrors naming `param`."""
    return await _run(service.batcher.embed(inputs, timings, normalize, query), param)


async def run_reduce(service: ServiceState, inputs: list[list[int]], reducers, timings: Timings, param: str) -> list:
    """reducers[i](input i's last hidden states) for every input, through the batcher."""
    return await _run(service.batcher.reduce(inputs, reducers, timings), param)


async def _run(work, param: str | None):
    """The batcher's answer; its refusals (Overloaded: 429 or 503, RequestTooLarge: 413) name
    `param`. Inputs reach the runner only once checked against its limits, so anything else
    it raises is the server's fault: a 500."""
    try:
        return await work
    except ServiceError as exc:
        raise exc.at(param) from None


@dataclass(frozen=True)
class MapAsk:
    """What an /attention request asks for, as far as its cost depends on it: one head or the
    mean over heads (None); for a sparse answer, the weights it keeps per query row on average
    for an n-token text (`per_row(n)`: 0 every weight, None for a grid or PNG); and the
    remedies the client already took (top_k or head given, truncate true), which a 413 never
    asks for again."""

    head: int | None
    per_row: Callable[[int], int | None]
    sent: frozenset[str]


def attention_need(runner: Runner, n: int, ask: MapAsk) -> tuple[int, int]:
    """(non-zeros of the answer, bytes held while computing and writing it) for an n-token map
    of `runner`'s export: upper bounds from its shapes (MapCost)."""
    cost = runner.attention_cost(n, ask.head)
    per_row = ask.per_row(n)
    answer_entries = 0
    if per_row is not None:
        answer_entries = min(cost.entries, n * per_row) if per_row else cost.entries
    return answer_entries, cost.work_bytes + answer_entries * SPARSE_ANSWER_BYTES


def _fits(service: ServiceState, n: int, ask: MapAsk) -> bool:
    entries, needed = attention_need(service.runner, n, ask)
    return entries <= service.settings.max_attention_entries and needed <= service.settings.max_request_memory_mb * 2**20


def attention_fitting_length(service: ServiceState, n: int, ask: MapAsk) -> int:
    """The longest text of at most n tokens whose map fits the server's limits (0: not even 2
    tokens), by bisection on the estimate, which grows with n: what truncate=true cuts to."""
    if _fits(service, n, ask):
        return n
    low, high = 0, n  # low fits (or is 0), high does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _fits(service, middle, ask) else (low, middle)
    return low if low >= 2 else 0


def _remedies(service: ServiceState, n: int, ask: MapAsk) -> list[tuple[str, str]]:
    """(field, what to send) for each change of a field the client did not send that makes an
    n-token map fit, by the same estimate."""
    found = []
    if ask.per_row(n) is not None:
        if "top_k" not in ask.sent:
            k = max(1, service.settings.max_attention_entries // n)
            if _fits(service, n, MapAsk(ask.head, lambda m: min(k, m), ask.sent)):
                found.append(("top_k", f"top_k <= {k}"))
        if _fits(service, n, MapAsk(ask.head, lambda m: None, ask.sent)):
            found.append(("format", "format grid or png"))
    if ask.head is None and "head" not in ask.sent and _fits(service, n, MapAsk(0, ask.per_row, ask.sent)):
        found.append(("head", "one head (head: 0 .. num_heads - 1) instead of the mean"))
    if "truncate" not in ask.sent:
        fitting = attention_fitting_length(service, n, ask)
        if fitting:
            found.append(("truncate", f"truncate=true (cuts the text to the {fitting} tokens that fit)"))
    return found


async def check_attention_budget(service: ServiceState, n: int, ask: MapAsk) -> None:
    """413 before any work for a map whose answer or memory would pass the server's limits,
    naming the fields the client did not send that would make it fit. Both checks use upper
    bounds from the export's shapes (MapCost), so a map near a limit may be refused although
    its real count would fit."""
    limit = service.runner.attention_max_length
    if not limit:
        raise ServiceError(422, "this deployment's export has no analysis graph, so no attention maps (exported with --no-analysis)",
                           "validation", "inputs")
    if n > limit:
        raise ServiceError(413, f"attention maps of {service.variant} are limited to {limit} tokens (every layer's weights are "
                           f"computed at once); this text is {n}: send a shorter text, or truncate=true to cut it to {limit}",
                           "too_long", "inputs")
    entries, needed = await asyncio.to_thread(attention_need, service.runner, n, ask)
    entry_limit, budget = service.settings.max_attention_entries, service.settings.max_request_memory_mb * 2**20
    if entries <= entry_limit and needed <= budget:
        return
    remedies = await asyncio.to_thread(_remedies, service, n, ask)
    advice = ", or ".join(text for _, text in remedies) or "a shorter text"
    field = remedies[0][0] if remedies else "inputs"
    if entries > entry_limit:
        raise ServiceError(413, f"a map of {n} tokens can hold up to {entries} non-zero weights, more than this server sends "
                           f"at once ({entry_limit}, ATTNSERVE_MAX_ATTENTION_ENTRIES); send {advice}", "too_long", field)
    raise ServiceError(413, f"a map of {n} tokens needs up to {needed / 2**20:.0f} MB, more than this server's limit of "
                       f"{service.settings.max_request_memory_mb} MB per request (ATTNSERVE_MAX_REQUEST_MEMORY_MB); send {advice}",
                       "too_long", field)


async def run_attention(service: ServiceState, ids: list[int], layer: int, head: int | None, timings: Timings):
    return await _run(service.batcher.attention(ids, layer, head, timings), None)


def check_collapse_length(service: ServiceState, n: int) -> None:
    """422 for an export without the collapse graph, 413 for a text past its limit (a quarter
    of max_length, as the four paths run as one batch, and no more than a map's)."""
    limit = service.runner.collapse_max_length
    if not limit:
        raise ServiceError(422, "this deployment's export has no collapse graph, so no rank collapse paths (exported with "
                           "--no-analysis, or by an older attnserve: export it again)", "validation", "inputs")
    if n > limit:
        raise ServiceError(413, f"rank collapse paths of {service.variant} are limited to {limit} tokens (the four paths run "
                           f"as one batch of {limit} tokens each, within the memory of one max_length input, and no longer "
                           f"than an attention map); this text is {n}: send a shorter text, or truncate=true to cut it to {limit}",
                           "too_long", "inputs")


async def run_collapse(service: ServiceState, ids: list[int], paths: list[str], timings: Timings) -> dict[str, list[float]]:
    return await _run(service.batcher.collapse(ids, paths, timings), None)
