"""ASGI middleware: timing headers and request metrics, a body-size limit, bearer auth.

They are plain ASGI (not BaseHTTPMiddleware) so that a refused request is answered from the
headers alone, before its body is read, and streaming stays untouched.
"""
from __future__ import annotations

import hmac
import logging
import time

from starlette.datastructures import MutableHeaders

from attnserve.service.batching import Timings
from attnserve.service.errors import error_response

log = logging.getLogger("attnserve")

UNAUTHENTICATED_PATHS = ("/health", "/ready")
# The explorer's page and files: the page itself asks for the key and sends it with its calls.
UNAUTHENTICATED_PREFIXES = ("/explorer",)


class TimingMiddleware:
    """Gives every request a Timings in request.state, writes x-total-time,
    x-tokenization-time, x-queue-time and x-inference-time (ms) on every response, and
    records the request in the metrics."""

    def __init__(self, app, service_getter):
        self.app = app
        self.service_getter = service_getter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        state = scope.setdefault("state", {})
        timings = state["timings"] = Timings()
        status_holder = {}

        async def send_with_timing(message):
            if message["type"] == "http.response.start":
                total = time.perf_counter() - start
                status_holder["status"] = message["status"]
                headers = MutableHeaders(scope=message)
                headers["x-total-time"] = f"{total * 1000:.3f}"
                headers["x-tokenization-time"] = f"{timings.tokenization * 1000:.3f}"
                headers["x-queue-time"] = f"{timings.queue * 1000:.3f}"
                headers["x-inference-time"] = f"{timings.inference * 1000:.3f}"
                service = self.service_getter()
                if service is not None:
                    service.metrics.observe_request(scope.get("path", ""), message["status"], total, state.get("failure_reason"))
                    if message["status"] < 400 and (timings.tokenization or timings.batch_sizes):
                        service.metrics.observe_work(scope.get("path", ""), timings)
            await send(message)

        await self.app(scope, receive, send_with_timing)


class BodyLimitMiddleware:
    """413 for bodies over max_bytes: at once from Content-Length, or as soon as a body sent
    without one (chunked) passes the limit."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _message(self, size: str) -> str:
        return f"the request body is {size}, over this server's limit of {self.max_bytes} bytes (ATTNSERVE_MAX_BODY_BYTES); send fewer or shorter inputs"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    response = error_response(scope, 400, "Content-Length is not a number", "validation")
                    return await response(scope, receive, send)
                if length > self.max_bytes:
                    response = error_response(scope, 413, self._message(f"{length} bytes"), "body_too_large", headers={"connection": "close"})
                    return await response(scope, receive, send)
        seen = 0
        state = scope.setdefault("state", {})

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    state["body_too_large"] = self._message(f"more than {self.max_bytes} bytes")
                    raise ValueError("request body too large")
            return message

        await self.app(scope, limited_receive, send)


class BearerAuthMiddleware:
    """When an API key is set, 401 for every route but /health and /ready without
    'Authorization: Bearer <key>'. The scheme is matched case-insensitively and may be
    followed by any number of spaces (RFC 7235); the key is compared in constant time."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        if api_key is not None and not api_key.strip():
            # Settings refuse a blank key; a caller passing one must not get auth turned off.
            raise ValueError("api_key is empty or blank; pass None to serve without auth")
        self.expected = api_key.encode() if api_key is not None else None
        if self.expected is not None:
            log.info("API key auth is on: every route but %s needs 'Authorization: Bearer <key>'", ", ".join(UNAUTHENTICATED_PATHS))

    def _key(self, scope) -> bytes | None:
        """The key of the request's Bearer credentials, None without any."""
        given = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
        if given is None:
            return None
        scheme, _, key = given.partition(b" ")
        return key.lstrip(b" ") if scheme.lower() == b"bearer" else b""

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or self.expected is None or path in UNAUTHENTICATED_PATHS or path.startswith(UNAUTHENTICATED_PREFIXES):
            return await self.app(scope, receive, send)
        key = self._key(scope)
        if key is None or not hmac.compare_digest(key, self.expected):
            message = "missing or wrong API key: send 'Authorization: Bearer <key>'" if key is not None else "missing API key: send 'Authorization: Bearer <key>'"
            response = error_response(scope, 401, message, "unauthorized", headers={"www-authenticate": "Bearer"})
            return await response(scope, receive, send)
        await self.app(scope, receive, send)
