"""One APIRouter per resource; each handler validates, tokenizes, hands work to the batcher
and shapes the answer, never touching the runner directly."""
from service.schemas import OpenAIError, TEIError

# Documented error answers (the bodies are written by service.errors).
TEI_ERRORS = {
    400: {"model": TEIError, "description": "invalid JSON"},
    401: {"model": TEIError, "description": "missing or wrong API key"},
    413: {"model": TEIError, "description": "body, input count or input length over the limit"},
    422: {"model": TEIError, "description": "invalid input"},
    429: {"model": TEIError, "description": "too many concurrent requests"},
}
OPENAI_ERRORS = {code: {"model": OpenAIError, "description": spec["description"]} for code, spec in TEI_ERRORS.items()}
