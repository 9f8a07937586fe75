"""Schemathesis hooks for tests/test_http_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

/embed_chunks has rules across fields that JSON Schema cannot state: overlap_tokens below
chunk_tokens, and spans that fit their text (in order, inside it, each holding a token, one
list per text). A schema-valid body that breaks them is rightly refused with 422, so positive
cases that break them are not sent as positive ones; test_http_chunks.py checks each rule.
"""
from __future__ import annotations

import schemathesis
from schemathesis.generation import GenerationMode


@schemathesis.hook
def filter_case(context, case) -> bool:
    if case.operation.path != "/embed_chunks" or case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return True
    body = case.body if isinstance(case.body, dict) else {}
    chunk, overlap = body.get("chunk_tokens", 256), body.get("overlap_tokens", 0)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (chunk, overlap))  # JSON Schema's integer: 3.0 too
    return body.get("spans") is None and not (numbers and overlap >= chunk)
