"""The scheduling layer: admission control and a token-budget dynamic batcher.

Routes hand tokenized inputs to `TokenBudgetBatcher`; one asyncio task packs waiting inputs
into batches (at most max_batch_requests inputs, at most max_batch_tokens tokens once padded as
the runner runs them) and hands each batch to the backend (src/attnserve/service/backend.py: the runner and
the deployment's pooling) in a single worker thread, so the event loop never blocks and the
ONNX Runtime session runs one batch at a time. Requests beyond max_concurrent_requests are
refused at once (`Overloaded`, answered 429) instead of queueing without bound.

Inputs wait in one queue per request, and batches are packed round-robin over requests (the
request that has had the fewest inputs run goes first), so a request of 64 long documents
runs one batch at a time beside the others and a short query behind it waits for at most the
batch in progress, not for all 64. So that new requests, which have had none run, cannot keep
an older one waiting without end, a request that has waited while FAIR_WAIT_BATCHES batches ran
without it goes first (the longest waiting first): under any traffic each waiting request gets
a batch at least once every FAIR_WAIT_BATCHES + 1 batches (one more for each other request as
overdue). A batch starts at the longest waiting input of the request
the round-robin picks and takes the waiting inputs below it in length up to where a cut costs
least (src/attnserve/service/packing.py), so a burst of mixed lengths runs in batches of like lengths instead
of padding every text to the longest of its neighbours in the queue. An input whose
request was cancelled (its client went away, its deadline passed) is dropped before it runs.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from attnserve.service.backend import Backend, Runner
from attnserve.service.errors import ServiceError
from attnserve.contract.pooling import Pooling
from attnserve.service.packing import fill_batch

# How many waiting inputs the packer considers for one batch.
LOOKAHEAD = 256
# Batches a waiting request may see run without it before it goes first: small enough that a
# long request under a stream of short ones still gets a batch in every few, large enough that
# a short query arriving behind a long request rarely waits for one of its batches.
FAIR_WAIT_BATCHES = 4

# Padded tokens per batch when the setting is 0. On a CPU one input of a hundred tokens already
# keeps ONNX Runtime's matrix products busy, so batching saves little, and a batch past a few
# thousand tokens runs slower per input (its activations no longer fit in cache); on a GPU
# large batches are what fills it. docs/results/service.md has the measurements.
CPU_BATCH_TOKENS = 2048
GPU_BATCH_TOKENS = 16384


def default_batch_tokens(provider: str) -> int:
    return CPU_BATCH_TOKENS if provider == "CPUExecutionProvider" else GPU_BATCH_TOKENS


class Overloaded(ServiceError):
    """No place for a request: the server is full (429) or shutting down (503)."""

    def __init__(self, message: str, shutting_down: bool = False):
        super().__init__(503 if shutting_down else 429, message, "shutting_down" if shutting_down else "overloaded")
        self.shutting_down = shutting_down


class RequestTooLarge(ServiceError):
    """A request with more tokens than the whole queue may hold (413: it can never fit)."""

    def __init__(self, message: str):
        super().__init__(413, message, "too_long")


@dataclass
class Timings:
    """What one request spent at each hop, in seconds; filled by the route and the batcher and
    written to the x-*-time headers by the timing middleware."""

    tokenization: float = 0.0
    queue: float = 0.0
    inference: float = 0.0
    input_tokens: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class _Job:
    ids: list[int]
    future: asyncio.Future
    enqueued: float
    owner: int  # the request it belongs to (inputs of one request share it)
    # Runs alone, with the backend and the one input's (ids, mask): attention maps and rank
    # collapse paths (the analysis graphs: rare, and larger than an embedding).
    alone: Callable[[Backend, np.ndarray, np.ndarray], Any] | None = None
    # From the input's last hidden states (n, hidden) to its answer, run in the inference
    # thread (late chunks, token vectors); None: the input's pooled vector.
    reduce: Callable[[np.ndarray], Any] | None = None
    normalize: bool = True  # of a pooled vector
    query: bool = False  # pooled as a query (Backend.embed)

    @property
    def kind(self) -> tuple:
        """Inputs of one kind may share a batch (jobs with `alone` run alone)."""
        return ("reduce",) if self.reduce is not None else ("embed", self.normalize, self.query)


@dataclass
class _BatchResult:
    started: float
    seconds: float
    size: int


class TokenBudgetBatcher:
    """Batches for `runner`, run through a Backend of it and `pooling` (None: the export's
    default pooling)."""

    def __init__(self, runner: Runner, max_batch_tokens: int, max_batch_requests: int, max_concurrent_requests: int, on_queue_change=None,
                 on_batch=None, max_queued_tokens: int = 0, pooling: Pooling | None = None, by_length: bool = True):
        self.backend = Backend(runner, pooling)
        self.runner = runner
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_concurrent_requests = max_concurrent_requests
        self.by_length = by_length  # batch mates by length (packing.fill_batch), else in round-robin order
        # Padded tokens the queue may hold (0: no bound), so that the work accepted can finish
        # within a graceful shutdown and a burst cannot queue without end.
        self.max_queued_tokens = max_queued_tokens
        self.in_flight = 0
        # Waiting inputs per request, in arrival order of the requests, and how many inputs of
        # each request have been put in a batch so far (the round-robin's measure).
        self._queues: dict[int, deque[_Job]] = {}
        self._served: dict[int, int] = {}
        # Batches formed so far, and the count at each waiting request's last batch (or arrival):
        # what the fairness rule measures waiting in.
        self._batches = 0
        self._last_turn: dict[int, int] = {}
        self._wakeup = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnserve-inference")
        self._on_queue_change = on_queue_change or (lambda depth: None)
        self._on_batch = on_batch or (lambda size: None)  # inputs in each batch handed to the runner

    # -- admission -------------------------------------------------------------------------
    @contextlib.contextmanager
    def admit(self):
        """Hold one of max_concurrent_requests places for the life of a request."""
        if self._closing:
            raise Overloaded("the server is shutting down; retry on another instance", shutting_down=True)
        if self.in_flight >= self.max_concurrent_requests:
            raise Overloaded(
                f"the server is at its limit of {self.max_concurrent_requests} concurrent requests; retry later"
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    # -- work ------------------------------------------------------------------------------
    async def embed(self, inputs: list[list[int]], timings: Timings, normalize: bool = True, query: bool = False) -> np.ndarray:
        """(len(inputs), hidden) float32: each input's vector, pooled as the backend's pooling
        says (for queries, if `query`), in input order."""
        self._reserve(inputs)
        jobs = [self._enqueue(ids, id(timings), normalize=normalize, query=query) for ids in inputs]
        results = await asyncio.gather(*(job.future for job in jobs))
        self._account(jobs, [r[1] for r in results], timings)
        return np.stack([r[0] for r in results]).astype(np.float32, copy=False)

    async def reduce(self, inputs: list[list[int]], reducers: list[Callable[[np.ndarray], Any]], timings: Timings) -> list:
        """reducers[i](last hidden states of input i, (n_i, hidden) float32) for every input,
        in input order; the inputs are batched like embed()'s and the reducers run in the
        inference thread."""
        self._reserve(inputs)
        jobs = [self._enqueue(ids, id(timings), reduce=reduce) for ids, reduce in zip(inputs, reducers)]
        results = await asyncio.gather(*(job.future for job in jobs))
        self._account(jobs, [r[1] for r in results], timings)
        return [r[0] for r in results]

    async def attention(self, ids: list[int], layer: int, head: int | None, timings: Timings):
        """((rows, cols, values), rank_collapse) for one input."""
        return await self._alone(ids, lambda backend, ids, mask: backend.attention(ids, mask, layer, head), timings)

    async def collapse(self, ids: list[int], paths: list[str], timings: Timings) -> dict[str, list[float]]:
        """One input's rank-collapse ratios along each of `paths` (Backend.collapse)."""
        return await self._alone(ids, lambda backend, ids, mask: backend.collapse(ids, mask, paths), timings)

    async def _alone(self, ids: list[int], work, timings: Timings):
        self._reserve([ids])
        job = self._enqueue(ids, id(timings), alone=work)
        value, batch = await job.future
        self._account([job], [batch], timings)
        return value

    def _account(self, jobs, batches: list[_BatchResult], timings: Timings) -> None:
        distinct = {id(b): b for b in batches}.values()
        timings.inference += sum(b.seconds for b in distinct)
        done = max(b.started + b.seconds for b in batches)
        timings.queue += max(0.0, done - min(j.enqueued for j in jobs) - sum(b.seconds for b in distinct))
        timings.batch_sizes.extend(b.size for b in batches)

    def _enqueue(self, ids: list[int], owner: int, alone=None, reduce=None, normalize: bool = True, query: bool = False) -> _Job:
        job = _Job(list(ids), asyncio.get_running_loop().create_future(), time.perf_counter(), owner, alone, reduce, normalize, query)
        self._queues.setdefault(owner, deque()).append(job)
        self._served.setdefault(owner, 0)
        self._last_turn.setdefault(owner, self._batches)
        self._on_queue_change(self.queued)
        self._wakeup.set()
        return job

    def _reserve(self, inputs: list[list[int]]) -> None:
        """Refuse a request the queue cannot take: RequestTooLarge if it alone is over
        max_queued_tokens, Overloaded while the queue is too full for it."""
        if not self.max_queued_tokens:
            return
        tokens = sum(self.padded(len(ids)) for ids in inputs)
        if tokens > self.max_queued_tokens:
            raise RequestTooLarge(f"this request is {tokens} tokens once padded, more than this server queues at once "
                                  f"({self.max_queued_tokens}, ATTNSERVE_MAX_QUEUED_TOKENS); split it or send shorter inputs")
        waiting = self.queued_tokens
        if waiting + tokens > self.max_queued_tokens:
            raise Overloaded(f"the queue holds {waiting} of its {self.max_queued_tokens} tokens, too many to take this request's "
                             f"{tokens}; retry later")

    @property
    def queued(self) -> int:
        """Inputs waiting for a batch."""
        return sum(len(q) for q in self._queues.values())

    @property
    def queued_tokens(self) -> int:
        """Padded tokens waiting for a batch (what max_queued_tokens bounds)."""
        return sum(self.padded(len(job.ids)) for queue in self._queues.values() for job in queue)

    @property
    def closing(self) -> bool:
        """Shutdown has begun: new requests are refused and the queue is being finished."""
        return self._closing

    # -- the loop --------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="attnserve-batcher")

    async def stop(self) -> None:
        """Finish everything already queued, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_cancelled()
            if not self._queues:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._next_batch()
            self._on_queue_change(self.queued)
            self._on_batch(len(batch))
            started = time.perf_counter()
            try:
                values = await loop.run_in_executor(self._executor, self._run, batch)
            except Exception as exc:  # the runner failed: every input of the batch gets the error
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            result = _BatchResult(started, time.perf_counter() - started, len(batch))
            for job, value in zip(batch, values):
                if not job.future.done():
                    job.future.set_result((value, result))

    def _drop_cancelled(self) -> None:
        """Forget inputs whose request no longer waits for them (cancelled), and requests with
        nothing left to run."""
        dropped = False
        for owner in list(self._queues):
            queue = self._queues[owner]
            if any(job.future.done() for job in queue):
                queue = self._queues[owner] = deque(job for job in queue if not job.future.done())
                dropped = True
            if not queue:
                del self._queues[owner], self._served[owner], self._last_turn[owner]
        if dropped:
            self._on_queue_change(self.queued)

    def _candidates(self) -> list[_Job]:
        """Waiting inputs in round-robin order: the requests that have waited FAIR_WAIT_BATCHES
        batches or more since their last (the longest waiting first), then the others by how
        many of their inputs have run (fewest first, then by arrival); their first inputs, then
        their second ones, ...; at most LOOKAHEAD of them."""

        def rank(owner: int) -> tuple[int, int]:
            waited = self._batches - self._last_turn[owner]
            return (0, -waited) if waited >= FAIR_WAIT_BATCHES else (1, self._served[owner])

        owners = sorted(self._queues, key=rank)  # stable: arrival order breaks ties
        out: list[_Job] = []
        depth = 0
        while len(out) < LOOKAHEAD:
            row = [self._queues[o][depth] for o in owners if len(self._queues[o]) > depth]
            if not row:
                break
            out.extend(row)
            depth += 1
        return out[:LOOKAHEAD]

    def _next_batch(self) -> list[_Job]:
        """The round-robin's request's longest waiting input (its first with batch_order
        "arrival") plus, while the padded token budget and the batch size allow, inputs of the
        same kind no longer than it, cut where it costs least (packing.fill_batch; in
        round-robin order with "arrival"); attention maps and collapse paths run alone."""
        candidates = self._candidates()
        first = candidates[0]
        if self.by_length:
            # The round-robin picks the request; its longest waiting input starts the batch, so
            # a request's inputs are cut into runs of like lengths from the top down, as
            # packing.length_batches cuts them (an input of a request waits for its others anyway).
            first = max(self._queues[first.owner], key=lambda job: len(job.ids))
            candidates = [first, *(job for job in candidates if job is not first)]
        batch = [first]
        if first.alone is None:
            mates = [job for job in candidates[1:] if job.alone is None and job.kind == first.kind]
            chosen = fill_batch(len(first.ids), [len(job.ids) for job in mates], self.padded, self.max_batch_tokens,
                                self.max_batch_requests, by_length=self.by_length)
            batch += [mates[i] for i in chosen]
        self._batches += 1
        for job in batch:
            self._queues[job.owner].remove(job)
            self._served[job.owner] += 1
            self._last_turn[job.owner] = self._batches
        self._drop_cancelled()
        return batch

    def padded(self, width: int) -> int:
        """The sequence length the runner runs a batch of longest input `width` at (short
        batches may run unpadded, OnnxRunner): what the token budget counts."""
        return int(self.runner.padded_length(width))

    def _run(self, batch: list[_Job]) -> list:
        """In the worker thread: one backend call for the whole batch."""
        ids, mask = pad([job.ids for job in batch])
        first = batch[0]
        if first.alone is not None:
            return [first.alone(self.backend, ids, mask)]
        if first.reduce is not None:
            return self.backend.reduce(ids, mask, [job.reduce for job in batch])
        return list(self.backend.embed(ids, mask, first.normalize, first.query))


def pad(inputs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists as int64 (input_ids, attention_mask), each right-padded to the longest;
    the runner pads the batch further to what its graph takes."""
    width = max(len(x) for x in inputs)
    ids = np.zeros((len(inputs), width), dtype=np.int64)
    mask = np.zeros((len(inputs), width), dtype=np.int64)
    for i, x in enumerate(inputs):
        ids[i, : len(x)] = x
        mask[i, : len(x)] = 1
    return ids, mask
