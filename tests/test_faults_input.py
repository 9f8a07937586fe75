"""The bad-input matrix against a real server subprocess (uvicorn over the fake runner, on
127.0.0.1): each mistake gets the one status its kind has (400 not JSON, 413 over a limit, 422
refused by the schema or out of range; docs/api.md's error table) and a JSON body in the
route's error form whose message names what to change; no 5xx, and the server stays up.
Bounded: one request per case, 30 s each."""
from __future__ import annotations

import logging
import re
import sys

import httpx
import jsonschema_rs
import openai
import pytest
from fastapi.testclient import TestClient
from http_fakes import FakeRunner, tokenizer_json
from http_server import start_fake_server

from attnserve.service.app import create_app
from attnserve.service.schemas import TEXT_PATTERN, Text
from attnserve.service.settings import Settings

MAX_LENGTH = 512
LIMITS = ("--max-client-batch-size", "8", "--max-body-bytes", "200000", "--max-token-vectors", "1000",
          "--max-attention-entries", "2000")
LONG = "word " * 600  # 602 tokens
NESTED = b"[" * 10_000 + b"]" * 10_000


def raw(body: bytes, content_type: str = "application/json"):
    return {"content": body, "headers": {"content-type": content_type}}


def js(body):
    return {"json": body}


# case: (method, path, request, status, a phrase the message must hold)
CASES = {
    # 400: the body is not JSON
    "invalid JSON": ("POST", "/embed", raw(b'{"inputs": ["a", }'), 400, "not valid JSON"),
    "not UTF-8": ("POST", "/embed", raw(b'{"inputs": "\xc3\x28"}'), 400, "not UTF-8"),
    "10,000-level nesting": ("POST", "/embed", raw(NESTED), 400, "too deeply"),
    "10,000-level nesting in a field": ("POST", "/embed", raw(b'{"inputs": ' + NESTED + b"}"), 400, "too deeply"),
    "invalid JSON to /v1": ("POST", "/v1/embeddings", raw(b'{"input": '), 400, "not valid JSON"),
    # 422: JSON the schema refuses
    "empty body": ("POST", "/embed", raw(b""), 422, "JSON object"),
    "not an object": ("POST", "/embed", js([1, 2]), 422, "JSON object"),
    "form content type": ("POST", "/embed", raw(b"inputs=x", "application/x-www-form-urlencoded"), 422, "JSON object"),
    "missing inputs": ("POST", "/embed", js({}), 422, "inputs: Field required"),
    "empty string": ("POST", "/embed", js({"inputs": ""}), 422, "empty string"),
    "whitespace only": ("POST", "/embed", js({"inputs": " \t\n\u3000"}), 422, "only whitespace"),
    "whitespace in a list": ("POST", "/embed", js({"inputs": ["fine", "  "]}), 422, "inputs.1: only whitespace"),
    "empty list": ("POST", "/embed", js({"inputs": []}), 422, "at least 1 item"),
    "number for text": ("POST", "/embed", js({"inputs": 42}), 422, "inputs"),
    "string for bool": ("POST", "/embed", js({"inputs": "x", "truncate": "yes"}), 422, "truncate"),
    "NUL character": ("POST", "/embed", js({"inputs": "a\x00b"}), 422, "NUL"),
    "lone surrogate": ("POST", "/embed", raw(b'{"inputs": "x\\ud83dy"}'), 422, "surrogate"),
    "whitespace to /tokenize": ("POST", "/tokenize", js({"inputs": "   "}), 422, "only whitespace"),
    "whitespace to /attention": ("POST", "/attention", js({"inputs": " ", "layer": 0}), 422, "only whitespace"),
    "whitespace to /v1": ("POST", "/v1/embeddings", js({"input": "  ", "model": "m"}), 422, "only whitespace"),
    "empty string to /v1": ("POST", "/v1/embeddings", js({"input": "", "model": "m"}), 422, "empty string"),
    "no model on /v1": ("POST", "/v1/embeddings", js({"input": "x"}), 422, "model"),
    "unknown encoding_format": ("POST", "/v1/embeddings", js({"input": "x", "model": "m", "encoding_format": "hex"}), 422, "encoding_format"),
    "dimensions 0": ("POST", "/v1/embeddings", js({"input": "x", "model": "m", "dimensions": 0}), 422, "dimensions"),
    "dimensions over the hidden size": ("POST", "/v1/embeddings", js({"input": "x", "model": "m", "dimensions": 385}), 422, "at most 384"),
    "dimensions 2.5": ("POST", "/v1/embeddings", js({"input": "x", "model": "m", "dimensions": 2.5}), 422, "dimensions"),
    "token id -1": ("POST", "/v1/embeddings", js({"input": [[-1]], "model": "m"}), 422, "greater than or equal to 0"),
    "token id 999999": ("POST", "/v1/embeddings", js({"input": [[7592, 999999]], "model": "m"}), 422, "0..30521"),
    "empty token list": ("POST", "/v1/embeddings", js({"input": [[]], "model": "m"}), 422, "at least 1 item"),
    "decode id -1": ("POST", "/decode", js({"ids": [-1]}), 422, "greater than or equal to 0"),
    "decode id 999999": ("POST", "/decode", js({"ids": [101, 999999]}), 422, "0..30521"),
    "decode id 1.5": ("POST", "/decode", js({"ids": [1.5]}), 422, "ids"),
    "decode nothing": ("POST", "/decode", js({"ids": []}), 422, "at least 1 item"),
    "layer -1": ("POST", "/attention", js({"inputs": "x", "layer": -1}), 422, "layer"),
    "layer 6": ("POST", "/attention", js({"inputs": "x", "layer": 6}), 422, "layer must be in 0..5"),
    "head 12": ("POST", "/attention", js({"inputs": "x", "layer": 0, "head": 12}), 422, "head must be in 0..11"),
    "unknown format": ("POST", "/attention", js({"inputs": "x", "layer": 0, "format": "jpeg"}), 422, "format"),
    "max_cells 0": ("POST", "/attention", js({"inputs": "x", "layer": 0, "max_cells": 0}), 422, "max_cells"),
    "max_cells 5000": ("POST", "/attention", js({"inputs": "x", "layer": 0, "max_cells": 5000}), 422, "max_cells"),
    "chunk_tokens 0": ("POST", "/embed_chunks", js({"inputs": "a b c", "chunk_tokens": 0}), 422, "chunk_tokens"),
    "overlap not below chunk": ("POST", "/embed_chunks", js({"inputs": "a b c", "chunk_tokens": 2, "overlap_tokens": 2}), 422, "overlap_tokens (2)"),
    "span outside the text": ("POST", "/embed_chunks", js({"inputs": "a b c", "spans": [[0, 99]]}), 422, "outside the text"),
    "no spans": ("POST", "/embed_chunks", js({"inputs": "a b c", "spans": []}), 422, "spans"),
    "an empty span list for a text": ("POST", "/embed_chunks", js({"inputs": ["a b c"], "spans": [[]]}), 422, "spans"),
    "one span list for two texts": ("POST", "/embed_chunks", js({"inputs": ["a b", "c d"], "spans": [[0, 1]]}), 422, "2 lists"),
    # 413: over a size limit
    "body over max_body_bytes": ("POST", "/embed", js({"inputs": "x" * 300_000}), 413, "200000 bytes"),
    "inputs over max_client_batch_size": ("POST", "/embed", js({"inputs": ["x"] * 9}), 413, "limit of 8"),
    "token lists over max_client_batch_size": ("POST", "/v1/embeddings", js({"input": [[7592]] * 9, "model": "m"}), 413, "limit of 8"),
    "text over max_length": ("POST", "/embed", js({"inputs": LONG}), 413, "602 tokens"),
    "token ids over max_length": ("POST", "/v1/embeddings", js({"input": [7592] * 600, "model": "m"}), 413, "limit of 512"),
    "token vectors over max_token_vectors": ("POST", "/embed_all", js({"inputs": ["word " * 400] * 3}), 413, "1000"),
    "sparse map over max_attention_entries": ("POST", "/attention", js({"inputs": "word " * 500, "layer": 0}), 413, "top_k"),
    # 404, 405
    "unknown route": ("POST", "/embedd", js({"inputs": "x"}), 404, "Not Found"),
    "GET on a POST route": ("GET", "/embed", {}, 405, "Method Not Allowed"),
}


@pytest.fixture(scope="module")
def server():
    proc = start_fake_server(*LIMITS, max_length=MAX_LENGTH)
    yield proc
    proc.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(server, case):
    method, path, request, status, says = CASES[case]
    r = httpx.request(method, server.url + path, timeout=30, **request)
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    if path.startswith("/v1/"):
        assert set(body["error"]) == {"message", "type", "param", "code"}
        message = body["error"]["message"]
    else:
        assert set(body) == {"error", "error_type"}
        message = body["error"]
    assert says in message, message


def test_the_server_is_up_and_answered_no_5xx(server):
    assert server.alive()
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'reason="backend"' not in metrics and 'reason="unhealthy"' not in metrics
    assert httpx.post(server.url + "/embed", json={"inputs": "still here"}, timeout=30).status_code == 200


def test_openai_client_gets_the_422_as_an_api_error(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.embeddings.create(input="x", model="m", dimensions=1000)
    assert info.value.status_code == 422 and info.value.param == "dimensions" and "at most 384" in info.value.message
    with pytest.raises(openai.APIStatusError) as info:
        client.embeddings.create(input=[[7592, 999999]], model="m")
    assert info.value.status_code == 422 and info.value.param == "input" and info.value.type == "invalid_request_error"


class BrokenRunner(FakeRunner):
    """Fails past the start-up warm-up with an error naming a file, as a damaged export would."""

    def embed(self, input_ids, attention_mask):
        if input_ids.shape[1] > 2:
            raise RuntimeError("/srv/exports/longformer/model.onnx: Protobuf parsing failed")
        return super().embed(input_ids, attention_mask)


def test_a_500_names_a_request_id_and_no_path_or_exception(caplog):
    app = create_app(Settings(max_length=128), runner=BrokenRunner(max_length=128), tokenizer_path=tokenizer_json())
    with caplog.at_level(logging.ERROR, logger="attnserve"), TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/embed", json={"inputs": "a document"})
        v1 = client.post("/v1/embeddings", json={"input": "a document", "model": "m"})
    assert r.status_code == 500 and v1.status_code == 500
    message = r.json()["error"]
    assert "/srv" not in r.text and "RuntimeError" not in r.text and "Protobuf" not in r.text
    assert "/srv" not in v1.text and v1.json()["error"]["type"] == "server_error"
    request_id = r.headers["x-request-id"]
    assert request_id in message
    logged = [rec for rec in caplog.records if request_id in rec.getMessage()]
    assert logged and "model.onnx" in str(logged[0].exc_info[1])


def test_the_text_pattern_says_what_the_validator_does():
    """For every code point (lone surrogates aside: no JSON text carries one that the schema
    could speak of), Python's and jsonschema-rs's reading of the schema's pattern accept
    exactly the one-character texts the validator accepts."""
    from pydantic import TypeAdapter, ValidationError

    validate = TypeAdapter(Text).validate_python
    rust = jsonschema_rs.validator_for({"type": "string", "pattern": TEXT_PATTERN})
    disagree = []
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        text = chr(code)
        try:
            accepted = validate(text) == text
        except ValidationError:
            accepted = False
        if accepted != bool(re.search(TEXT_PATTERN, text)) or accepted != rust.is_valid(text):
            disagree.append(hex(code))
    assert not disagree, disagree[:20]
    assert validate(" a\n") and rust.is_valid(" a\n") and not rust.is_valid(" \u3000\t")


class ValueErrorRunner(FakeRunner):
    """A runner whose failure past the warm-up is a ValueError, as a bug in it would be."""

    def embed(self, input_ids, attention_mask):
        if input_ids.shape[1] > 2:
            raise ValueError("shapes (3,) and (4,) not aligned")
        return super().embed(input_ids, attention_mask)


@pytest.mark.parametrize("route,body", [("/embed", {"inputs": "a document"}), ("/v1/embeddings", {"input": "a document", "model": "m"})])
def test_an_unexpected_value_error_is_a_500_not_a_4xx(route, body):
    """The status comes from the exception's type: a ValueError from inside the runner is the
    server's fault (500), not an input over a limit (413)."""
    app = create_app(Settings(max_length=128), runner=ValueErrorRunner(max_length=128), tokenizer_path=tokenizer_json())
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.post(route, json=body)
    assert r.status_code == 500, r.text
    assert "not aligned" not in r.text and "request id" in r.text


def test_a_tokenizer_failure_is_a_500_not_a_422(monkeypatch):
    """The tokenizer failing on a text the schema accepted is the server's fault, not the client's."""
    app = create_app(Settings(max_length=128), runner=FakeRunner(max_length=128), tokenizer_path=tokenizer_json())
    with TestClient(app, raise_server_exceptions=False) as client:
        tokenizer = app.state.service.tokenizer

        def fail(*args, **kwargs):
            raise RuntimeError("tokenizer state poisoned")

        monkeypatch.setattr(tokenizer, "encode", fail)
        r = client.post("/embed", json={"inputs": "a document"})
    assert r.status_code == 500 and r.json()["error_type"] == "Backend"
    assert "poisoned" not in r.text


def test_attention_maps_past_the_exports_limit_are_refused_before_any_work():
    """A text over the export's attention-map limit is a 413 naming the limit, and an export
    without an analysis graph answers 422 for any map; neither reaches the runner."""
    runner = FakeRunner(max_length=256)
    runner.attention_max_length = 16
    app = create_app(Settings(max_length=256), runner=runner, tokenizer_path=tokenizer_json())
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.post("/attention", json={"inputs": "word " * 30, "layer": 0})
        assert r.status_code == 413 and "limited to 16 tokens" in r.json()["error"], r.text
        assert client.post("/attention", json={"inputs": "a few words", "layer": 0}).status_code == 200
        runner.attention_max_length = 0
        r = client.post("/attention", json={"inputs": "a few words", "layer": 0})
        assert r.status_code == 422 and "no analysis graph" in r.json()["error"], r.text
