"""Schemathesis hooks for tests/test_http_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

/embed_chunks has rules across fields that JSON Schema cannot state: overlap_tokens below
chunk_tokens, and spans that fit their text (in order, inside it, each holding a token, one
list per text); /attention's query_range and key_range must be non-empty and end inside the
text's tokens. A schema-valid body that breaks them is rightly refused with 422, so positive
cases that break them are not sent as positive ones; test_http_chunks.py and
test_http_rendering.py check each rule.
"""
from __future__ import annotations

import schemathesis
from schemathesis.generation import GenerationMode


@schemathesis.hook
def filter_case(context, case) -> bool:
    if case.operation.path not in ("/embed_chunks", "/attention") or case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return True
    body = case.body if isinstance(case.body, dict) else {}
    if case.operation.path == "/attention":
        # A token window must lie inside the text's tokens, start before stop.
        return body.get("query_range") is None and body.get("key_range") is None
    chunk, overlap = body.get("chunk_tokens", 256), body.get("overlap_tokens", 0)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (chunk, overlap))  # JSON Schema's integer: 3.0 too
    return body.get("spans") is None and not (numbers and overlap >= chunk)
