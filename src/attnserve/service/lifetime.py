"""ASGI middleware that owns a work request's life: admission before its body is read, a
deadline, cancellation when its client goes away, and a JSON answer when shutdown cuts it off.

Each POST is admitted (one of max_concurrent_requests places) from its headers alone, so a
full server answers 429 in milliseconds, before reading or validating a body. The route then
runs in a task of its own beside a watcher of the connection:
- the client disconnects: the task is cancelled, which cancels its queued inputs in the
  batcher (they never run) and frees its place at once;
- request_timeout passes: the task is cancelled the same way and the client gets 504;
- the server's graceful shutdown timeout passes (uvicorn cancels the request): 503 with
  Retry-After instead of uvicorn's plain-text 500.
Plain ASGI, like service.middleware, so that it sees the receive channel and the response start.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging

from starlette.datastructures import MutableHeaders

from attnserve.service.batching import Overloaded
from attnserve.service.errors import error_response

log = logging.getLogger("attnserve")

# After a request of at least this many tokens, freed heap pages go back to the system (glibc
# keeps them otherwise, and the process stays at the size of its largest request).
TRIM_AFTER_TOKENS = 4096

# Seconds a refused client should wait before retrying (the Retry-After header).
RETRY_AFTER_OVERLOADED = 1
RETRY_AFTER_SHUTDOWN = 5
RETRY_AFTER = {429: RETRY_AFTER_OVERLOADED, 503: RETRY_AFTER_SHUTDOWN}


class RequestLifetimeMiddleware:
    """service_getter() -> ServiceState or None (not loaded yet: requests pass through, and the
    routes answer 503)."""

    def __init__(self, app, service_getter):
        self.app = app
        self.service_getter = service_getter

    async def __call__(self, scope, receive, send):
        service = self.service_getter() if scope["type"] == "http" else None
        if service is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        try:
            permit = service.batcher.admit()
            permit.__enter__()
        except Overloaded as exc:
            response = error_response(scope, exc.status, exc.message, exc.reason, headers={"retry-after": str(RETRY_AFTER[exc.status])})
            return await response(scope, receive, send)
        service.metrics.in_flight.inc()
        try:
            await self._run(scope, receive, send, service)
        finally:
            service.metrics.in_flight.dec()
            permit.__exit__(None, None, None)
        timings = scope.get("state", {}).get("timings")
        if timings is not None and sum(timings.input_tokens) >= TRIM_AFTER_TOKENS:
            await asyncio.to_thread(give_back_memory)

    async def _run(self, scope, receive, send, service) -> None:
        body_read = asyncio.Event()
        gone = asyncio.Event()
        started = False

        async def receive_body():
            if body_read.is_set():  # the route listens past its body: it hears the disconnect
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            elif not message.get("more_body", False):
                body_read.set()
            return message

        async def send_tracked(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                retry = RETRY_AFTER.get(message["status"])
                headers = MutableHeaders(scope=message)
                if retry and "retry-after" not in headers:  # a route's own 429 (queue full) or 503
                    headers["retry-after"] = str(retry)
            await send(message)

        async def watch_connection():
            await body_read.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        route = asyncio.create_task(self.app(scope, receive_body, send_tracked))
        watcher = asyncio.create_task(watch_connection())
        timeout = service.settings.request_timeout or None
        try:
            done, _ = await asyncio.wait({route, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # uvicorn gave up on the request at shutdown
            await _cancel(route, watcher)
            if started:
                raise
            service.metrics.cancelled.labels("shutdown").inc()
            response = error_response(scope, 503, "the server shut down before this request finished; retry on another instance",
                                      "shutting_down", headers={"retry-after": str(RETRY_AFTER_SHUTDOWN)})
            await response(scope, receive, send)
            return  # answered: the cancellation ends here rather than as uvicorn's plain-text 500
        if route in done:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            return route.result()  # re-raises the route's own exception, as without this middleware
        await _cancel(route, watcher)
        if watcher in done and gone.is_set() and not started:  # the client is gone: nobody to answer
            service.metrics.cancelled.labels("disconnect").inc()
            log.info("%s: client disconnected; its work is cancelled", scope.get("path"))
            return
        if not started:  # the deadline passed
            service.metrics.cancelled.labels("deadline").inc()
            response = error_response(
                scope, 504,
                f"the request took longer than this server's request_timeout of {service.settings.request_timeout:g} s "
                "(ATTNSERVE_REQUEST_TIMEOUT) and was stopped; send fewer or shorter inputs, or raise the timeout",
                "deadline",
            )
            await response(scope, receive, send)


async def _cancel(*tasks: asyncio.Task) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def give_back_memory() -> None:
    """malloc_trim(0): hand the heap's free pages back to the system (a no-op without glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
