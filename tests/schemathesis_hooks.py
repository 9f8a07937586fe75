"""Schemathesis hooks for tests/test_http_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

Some routes have rules across fields, or about tokens, that JSON Schema cannot state:
/embed_chunks' overlap_tokens below chunk_tokens, and spans that fit their text (in order,
inside it, each holding a token, one list per text); /attention's query_range and key_range
must be non-empty and end inside the text's tokens; on /v1/embeddings, late_chunking takes
texts that are not queries, and input_type and Jina's task must agree; on
/v1/contextualizedembeddings, queries come one per inner list; and a chunk sent as its own
text (late_chunking, contextualized embeddings) must hold a token. A schema-valid body that
breaks them is rightly refused with 422, so positive cases that break them are not sent as
positive ones; test_http_chunks.py, test_http_rendering.py and test_http_compat.py check
each rule.
"""
from __future__ import annotations

import unicodedata

import schemathesis
from schemathesis.generation import GenerationMode

QUERY_SIDE = {"query", "search_query", "retrieval.query", "code.query"}


def _holds_a_token(text) -> bool:
    """Whether a text surely tokenizes to a token: it has a letter, digit, punctuation mark or
    symbol (what the BERT tokenizer drops is whitespace, control characters and accents)."""
    return isinstance(text, str) and any(unicodedata.category(c)[0] in "LNPS" for c in text)


def _chunks_hold_tokens(chunks) -> bool:
    return len(chunks) < 2 or all(_holds_a_token(c) for c in chunks)


def _openai(body: dict) -> bool:
    sides = {body.get("input_type") in QUERY_SIDE, body.get("task") in QUERY_SIDE}
    given = [v for v in (body.get("input_type"), body.get("task")) if isinstance(v, str)]
    if len(given) == 2 and len(sides) > 1:
        return False
    if body.get("late_chunking") is True:
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        return (isinstance(texts, list) and all(isinstance(t, str) for t in texts) and _chunks_hold_tokens(texts)
                and not any(v in QUERY_SIDE for v in given))
    return True


def _contextualized(body: dict) -> bool:
    documents = body.get("inputs")
    if not isinstance(documents, list) or not all(isinstance(d, list) for d in documents):
        return True
    if body.get("input_type") in QUERY_SIDE and any(len(d) > 1 for d in documents):
        return False
    return all(_chunks_hold_tokens(d) for d in documents)


def _chunks(body: dict) -> bool:
    chunk, overlap = body.get("chunk_tokens", 256), body.get("overlap_tokens", 0)
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (chunk, overlap))  # JSON Schema's integer: 3.0 too
    return body.get("spans") is None and not (numbers and overlap >= chunk)


def _attention(body: dict) -> bool:
    # A token window must lie inside the text's tokens, start before stop.
    return body.get("query_range") is None and body.get("key_range") is None


RULES = {"/embed_chunks": _chunks, "/attention": _attention, "/v1/embeddings": _openai, "/v1/contextualizedembeddings": _contextualized}


@schemathesis.hook
def filter_case(context, case) -> bool:
    rule = RULES.get(case.operation.path)
    if rule is None or case.meta is None or case.meta.generation.mode != GenerationMode.POSITIVE:
        return True
    return rule(case.body if isinstance(case.body, dict) else {})
