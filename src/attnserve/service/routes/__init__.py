"""One APIRouter per resource; each handler validates, tokenizes, hands work to the batcher
and shapes the answer, never touching the runner directly."""
from attnserve.service.schemas import OpenAIError, TEIError, fill_deployment_bounds

# Documented error answers (the bodies are written by service.errors; docs/api.md's
# error table gives every cause of each).
_ERRORS = {
    400: "the body is not JSON: not UTF-8, invalid JSON, nested too deeply to parse",
    401: "missing or wrong API key",
    413: "over a size limit: body bytes, inputs per request, tokens per input, the answer's size or memory",
    422: "a JSON body the schema refuses: wrong types, empty or whitespace-only text, values out of range",
    429: "max_concurrent_requests are in flight (Retry-After)",
    500: "an unexpected server error; the body gives a request id, the log has the details",
    503: "shutting down, or the model is not loaded yet (Retry-After)",
    504: "the request passed request_timeout and was stopped",
}
TEI_ERRORS = {code: {"model": TEIError, "description": text} for code, text in _ERRORS.items()}
OPENAI_ERRORS = {code: {"model": OpenAIError, "description": text} for code, text in _ERRORS.items()}


def deployment_bounds(service) -> dict:
    """The values of the schema's deployment markers (service.schemas) for a loaded service."""
    return {
        "vocab_max": service.tokenizer.vocab_size - 1,
        "hidden_size": service.hidden_size,
        "layer_max": service.num_layers - 1,
        "head_max": service.num_heads - 1,
        "max_inputs": service.settings.max_client_batch_size,
        "max_sentences": service.settings.max_client_batch_size - 1,  # /similarity's, beside its source_sentence
    }


def install_deployment_schema(app) -> None:
    """Make app.openapi() state this deployment's bounds once the service has loaded (before
    that, the schema carries the markers)."""
    generate = app.openapi

    def openapi() -> dict:
        schema = generate()
        service = getattr(app.state, "service", None)
        if service is not None:
            fill_deployment_bounds(schema, deployment_bounds(service))
        return schema

    app.openapi = openapi
