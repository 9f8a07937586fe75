"""Errors a client can cause, and the two JSON error bodies the service answers with.

Routes under /v1/ answer in OpenAI's form {"error": {"message", "type", "param", "code"}}
(Voyage's route adds Voyage's {"detail": message}); every other route in
text-embeddings-inference's form {"error": str, "error_type": str}.
Each error records a short `reason` that the failure counter in /metrics is labelled by.

One status per kind of mistake (docs/api.md's error table lists every one): 400 for a
body that is not JSON (or cannot be parsed as such), 422 for a JSON body whose values the
schema refuses or that are out of this deployment's range, 413 for what is over a size limit.
The status always follows from the exception's type, never from its text.
"""
from __future__ import annotations

import json
import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

log = logging.getLogger("attnserve")

# text-embeddings-inference's error_type for each reason.
_TEI_TYPES = {
    "validation": "Validation",
    "invalid_json": "Validation",
    "empty": "Empty",
    "too_long": "Validation",
    "too_many_inputs": "Validation",
    "body_too_large": "Validation",
    "overloaded": "Overloaded",
    "unauthorized": "Unauthorized",
    "not_found": "NotFound",
    "method_not_allowed": "NotFound",
    "unhealthy": "Unhealthy",
    "shutting_down": "Unhealthy",
    "deadline": "Backend",
    "backend": "Backend",
}
# OpenAI's error type for each reason.
_OPENAI_TYPES = {
    "overloaded": "rate_limit_error",
    "unauthorized": "authentication_error",
    "backend": "server_error",
    "unhealthy": "server_error",
    "shutting_down": "server_error",
    "deadline": "server_error",
    "not_found": "not_found_error",
}
_OPENAI_CODES = {
    "too_long": "context_length_exceeded",
    "unauthorized": "invalid_api_key",
    "overloaded": "rate_limit_exceeded",
    "body_too_large": "request_too_large",
}


class ServiceError(Exception):
    """A failure with an HTTP status and a message telling the client what to change.

    Raised, or subclassed (batching's Overloaded, the tokenizer's InputTooLong ...), where the
    condition is known; the handler below answers exactly these with their status, and any
    other exception is a 500."""

    def __init__(self, status: int, message: str, reason: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.reason, self.param = status, message, reason, param

    def at(self, param: str | None) -> ServiceError:
        """This error naming the request field it is about, where it names none yet."""
        self.param = self.param or param
        return self


# Voyage's route: Voyage's clients read the message from "detail".
VOYAGE_PATHS = ("/v1/contextualizedembeddings",)


def error_body(path: str, message: str, reason: str, param: str | None = None) -> dict:
    if path.startswith("/v1/"):
        body = {
            "error": {
                "message": message,
                "type": _OPENAI_TYPES.get(reason, "invalid_request_error"),
                "param": param,
                "code": _OPENAI_CODES.get(reason),
            }
        }
        return body | {"detail": message} if path in VOYAGE_PATHS else body
    return {"error": message, "error_type": _TEI_TYPES.get(reason, "Validation")}


def error_response(scope: dict, status: int, message: str, reason: str, param: str | None = None, headers=None) -> JSONResponse:
    scope.setdefault("state", {})["failure_reason"] = reason
    return JSONResponse(error_body(scope.get("path", ""), message, reason, param), status_code=status, headers=headers)


_TYPE_ERRORS = ("string_type", "list_type", "int_type", "bool_type", "dict_type", "model_attributes_type",
                "literal_error", "int_from_float", "float_type", "none_required", "is_instance_of")


def _field_path(err) -> str:
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    # The branches of a union (str | list[str]) add their type names to loc; keep the field path.
    loc = [x for x in loc if not (x.startswith(("str", "list[", "function-", "constrained-", "json-or-python")) or x in ("int", "bool"))]
    return ".".join(loc)


def _describe_validation(errors) -> tuple[str, str | None, str]:
    """One readable sentence from pydantic's error list, the offending parameter, and the reason.
    A union field (a text or a list of texts) fails once per branch; when one branch got
    further than a type mismatch, only its complaint is kept."""
    if any(err.get("type") == "json_invalid" for err in errors):
        err = next(e for e in errors if e.get("type") == "json_invalid")
        ctx = err.get("ctx", {})
        return f"the body is not valid JSON ({ctx.get('error', 'parse error')} at position {err.get('loc', ['', '?'])[-1]})", None, "invalid_json"
    groups: dict[str, list] = {}
    for err in errors:
        groups.setdefault(_field_path(err), []).append(err)
    parts, param = [], None
    for where, errs in groups.items():
        specific = [e for e in errs if e.get("type") not in _TYPE_ERRORS]
        if where == "" and errs[0].get("type") in ("missing", "model_attributes_type", "dict_type"):
            parts.append("the body must be a JSON object, sent with Content-Type: application/json")
            continue
        param = param or (where.split(".")[0] or None)
        chosen = specific or errs
        msgs = []
        for e in chosen:
            msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
            if msg not in msgs:
                msgs.append(msg)
        parts.append(f"{where or 'body'}: {' or '.join(msgs) if not specific else '; '.join(msgs)}")
    if len(parts) > 5:
        parts = parts[:5] + [f"and {len(parts) - 5} more"]
    return "; ".join(parts), param, "validation"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return error_response(request.scope, exc.status, exc.message, exc.reason, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        message, param, reason = _describe_validation(exc.errors())
        status = 400 if reason == "invalid_json" else 422
        return error_response(request.scope, status, message, reason, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        state = request.scope.get("state", {})
        if state.get("body_too_large"):
            return error_response(request.scope, 413, state["body_too_large"], "body_too_large")
        reason = {404: "not_found", 405: "method_not_allowed", 400: "invalid_json"}.get(exc.status_code, "validation")
        detail = _unparsable_body(exc.__cause__) if exc.status_code == 400 else None
        if detail is None:
            detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return error_response(request.scope, exc.status_code, detail, reason, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        # The details (exception text, file names) stay in the log, under an id the client can quote.
        request_id = uuid.uuid4().hex[:16]
        log.error("request %s: unexpected error on %s", request_id, request.url.path, exc_info=exc)
        return error_response(request.scope, 500, f"internal server error (request id {request_id}); "
                              "the server's log has the details under that id", "backend", headers={"x-request-id": request_id})


def _unparsable_body(cause: BaseException | None) -> str | None:
    """What to change about a body FastAPI could not parse, from the parser's exception (FastAPI
    raises its 400 from it); None when the 400 has another cause."""
    if isinstance(cause, RecursionError):
        return ("the body nests arrays or objects too deeply to parse; no route takes more than 4 levels "
                "(/embed_chunks spans for a list of texts): send the body as its schema in /openapi.json has it")
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 (byte {cause.start} cannot be decoded): send UTF-8 JSON with Content-Type: application/json"
    if cause is not None:
        return "the body could not be parsed: send UTF-8 JSON with Content-Type: application/json"
    return None
