"""The HTTP layer in process (FastAPI TestClient) over a fake runner: every route, both error
bodies, timing headers, auth, metrics. The real server and export: test_http_server.py."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from http_checks import check_attention_formats
from http_fakes import fake_client

TIMING_HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def make_client(**settings):
    return fake_client(**{"max_length": 256, **settings})


@pytest.fixture(scope="module")
def client():
    with make_client(max_client_batch_size=4) as c:
        yield c


def test_embed_single_and_list(client):
    one = client.post("/embed", json={"inputs": "a long document"})
    many = client.post("/embed", json={"inputs": ["a long document", "another"]})
    assert one.status_code == 200 and many.status_code == 200
    a, b = np.array(one.json()), np.array(many.json())
    assert a.shape == (1, 384) and b.shape == (2, 384)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1, rtol=1e-5)
    for name in TIMING_HEADERS:
        assert float(one.headers[name]) >= 0
    assert float(one.headers["x-inference-time"]) > 0


def test_normalize_false_returns_pooled_hidden_states(client):
    unit = np.array(client.post("/embed", json={"inputs": ["some text", "more"]}).json())
    raw = np.array(client.post("/embed", json={"inputs": ["some text", "more"], "normalize": False}).json())
    np.testing.assert_allclose(raw, 3 * unit, rtol=1e-5)


def test_too_long_is_413_unless_truncate(client):
    text = "word " * 400
    r = client.post("/embed", json={"inputs": text})
    assert r.status_code == 413
    assert r.json()["error_type"] == "Validation"
    assert "402 tokens" in r.json()["error"] and "256" in r.json()["error"]
    r = client.post("/embed", json={"inputs": text, "truncate": True})
    assert r.status_code == 200 and len(r.json()[0]) == 384


@pytest.mark.parametrize("path, body, field", [
    ("/embed", {"inputs": "x", "truncation": True}, "truncation"),
    ("/embed_chunks", {"inputs": "x", "chunk_size": 128}, "chunk_size"),
    ("/embed_all", {"inputs": "x", "normalise": True}, "normalise"),
    ("/tokenize", {"inputs": "x", "add_special": False}, "add_special"),
    ("/decode", {"ids": [101], "skip_special": True}, "skip_special"),
    ("/attention", {"inputs": "x", "layer": 0, "heads": 1}, "heads"),
    ("/v1/embeddings", {"input": "x", "model": "m", "encoding": "float"}, "encoding"),
])
def test_unknown_field_is_422_naming_it(client, path, body, field):
    r = client.post(path, json=body)
    assert r.status_code == 422
    message = r.json()["error"]["message"] if path.startswith("/v1") else r.json()["error"]
    assert field in message and "extra" in message.lower()


def test_fields_tei_and_openai_clients_send_are_accepted(client):
    # huggingface_hub's feature_extraction: inputs, normalize, prompt_name, truncate, truncation_direction
    r = client.post("/embed", json={"inputs": "x", "normalize": True, "prompt_name": None, "truncate": True, "truncation_direction": "Right"})
    assert r.status_code == 200
    # the openai client: input, model, encoding_format, dimensions, user
    r = client.post("/v1/embeddings", json={"input": ["x"], "model": "m", "encoding_format": "base64", "dimensions": 8, "user": "u"})
    assert r.status_code == 200
    r = client.post("/embed", json={"inputs": "x", "prompt_name": "query"})
    assert r.status_code == 422 and "no prompts" in r.json()["error"]


def test_truncation_direction_left_keeps_the_end(client):
    cycle = ["apple", "river", "stone", "cloud", "green", "music", "table"]  # one token each
    words = ["first"] + [cycle[i % 7] for i in range(400)] + ["last"]
    embed = lambda body: np.array(client.post("/embed", json=body).json()[0])  # noqa: E731
    right = embed({"inputs": " ".join(words), "truncate": True})
    left = embed({"inputs": " ".join(words), "truncate": True, "truncation_direction": "left"})
    # 256 tokens: [CLS], 254 words, [SEP]
    np.testing.assert_allclose(right, embed({"inputs": " ".join(words[:254])}), atol=1e-6)
    np.testing.assert_allclose(left, embed({"inputs": " ".join(words[-254:])}), atol=1e-6)
    assert not np.allclose(left, right)


def test_v1_too_long_advises_what_v1_offers(client):
    r = client.post("/v1/embeddings", json={"input": "word " * 400, "model": "m"})
    assert r.status_code == 413
    message = r.json()["error"]["message"]
    assert "/embed_chunks" in message and "truncate=true (Jina's field)" in message
    r = client.post("/v1/embeddings", json={"input": "word " * 400, "model": "m", "truncate": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 256


def test_too_many_inputs(client):
    r = client.post("/embed", json={"inputs": ["x"] * 5})
    assert r.status_code == 413 and "limit of 4" in r.json()["error"]


@pytest.mark.parametrize(
    "body, status",
    [
        ({"inputs": ""}, 422),
        ({"inputs": []}, 422),
        ({"inputs": ["ok", ""]}, 422),
        ({"inputs": 5}, 422),
        ({"inputs": [1, 2]}, 422),
        ({"inputs": "x", "truncate": "yes please"}, 422),
        ({}, 422),
        ([1, 2], 422),
        ({"inputs": "a\x00b"}, 422),
    ],
)
def test_bad_embed_bodies(client, body, status):
    r = client.post("/embed", json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "error_type"}


def test_invalid_json_and_lone_surrogate(client):
    r = client.post("/embed", content=b'{"inputs": "abc', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = client.post("/embed", content=b'{"inputs": "a\\udc00b"}', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "surrogate" in r.json()["error"]
    r = client.post("/embed", content=b'{"inputs": "\xff\xfe"}', headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500


def test_openai_embeddings_float_base64_dimensions_tokens(client):
    r = client.post("/v1/embeddings", json={"input": ["first", "second"], "model": "anything"})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == "attnserve-fake"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 6
    floats = np.array(body["data"][0]["embedding"], dtype=np.float32)
    r = client.post("/v1/embeddings", json={"input": "first", "model": "m", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, floats)
    r = client.post("/v1/embeddings", json={"input": "first", "model": "m", "dimensions": 16})
    short = np.array(r.json()["data"][0]["embedding"])
    assert short.shape == (16,) and abs(np.linalg.norm(short) - 1) < 1e-5
    ids = client.post("/tokenize", json={"inputs": "first"}).json()[0]
    r = client.post("/v1/embeddings", json={"input": [t["id"] for t in ids[1:-1]], "model": "m"})
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], floats, rtol=1e-6)
    # Token ids over max_length (256 here): 413 without truncate, cut to max_length with it.
    long = [ids[1]["id"]] * 300
    assert client.post("/v1/embeddings", json={"input": long, "model": "m"}).status_code == 413
    cut = client.post("/v1/embeddings", json={"input": long, "model": "m", "truncate": True})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 256


def test_openai_errors_have_openai_shape(client):
    for body, status, param in [
        ({"input": "x" * 10 + " word" * 300, "model": "m"}, 413, "input"),
        ({"input": [], "model": "m"}, 422, "input"),
        ({"input": "x"}, 422, "model"),
        ({"input": "x", "model": "m", "dimensions": 1000}, 422, "dimensions"),
        ({"input": [[999999999]], "model": "m"}, 422, "input"),
    ]:
        r = client.post("/v1/embeddings", json=body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    r = client.post("/v1/embeddings", json={"input": "x" * 10 + " word" * 300, "model": "m"})
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_attention_sparse_grid_png(client):
    check_attention_formats(client, "the quick brown fox jumps over the lazy dog " * 5, layer=2, atol=1e-4)


@pytest.mark.parametrize("body", [{"layer": 6}, {"layer": -1}, {"layer": 0, "head": 12}, {"layer": "0"}, {"layer": 0, "format": "svg"}])
def test_attention_bad_layer_head_format(client, body):
    r = client.post("/attention", json={"inputs": "hello", **body})
    assert r.status_code == 422, r.text
    assert "error" in r.json()


def test_tokenize_info_health_metrics(client):
    toks = client.post("/tokenize", json={"inputs": ["hello world"]}).json()
    assert [t["text"] for t in toks[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert toks[0][1]["start"] == 0 and toks[0][1]["stop"] == 5
    info = client.get("/info").json()
    assert info["variant"] == "fake" and info["max_length"] == 256 and info["provider"] == "FakeExecutionProvider"
    assert info["batching"]["max_client_batch_size"] == 4 and info["model_sha256"] == "0" * 64
    assert client.get("/health").json() == {"status": "ok"}
    text = client.get("/metrics").text
    for name in ("attnserve_request_duration_seconds_bucket", "attnserve_tokenization_duration_seconds", "attnserve_queue_duration_seconds",
                 "attnserve_inference_duration_seconds", "attnserve_input_tokens", "attnserve_batch_size", "attnserve_requests_success_total",
                 "attnserve_requests_failure_total"):
        assert name in text, name
    assert 'precision="float32",route="/embed",variant="fake"' in text
    client.post("/rank_collapse", json={"inputs": "hello world"})
    assert 'route="/rank_collapse"' in client.get("/metrics").text  # every route is counted under its own name
    assert 'reason="too_long"' in text


def test_body_limit_from_content_length():
    with make_client(max_body_bytes=4096) as c:
        r = c.post("/embed", content=b"x" * 5000, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "4096" in r.json()["error"]
        r = c.post("/v1/embeddings", content=b"x" * 5000, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        # A chunked body (no Content-Length) is cut off as it arrives.
        r = c.post("/embed", content=iter([b'{"inputs": "', b"x" * 5000, b'"}']), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/embed", json={"inputs": "fine"}).status_code == 200


def test_bearer_auth():
    with make_client(api_key="s3cret") as c:
        assert c.get("/health").status_code == 200
        for method, path in [("post", "/embed"), ("get", "/info"), ("get", "/metrics"), ("post", "/v1/embeddings"), ("get", "/openapi.json")]:
            r = getattr(c, method)(path)
            assert r.status_code == 401, path
            assert "x-total-time" in r.headers
        assert c.post("/v1/embeddings", json={"input": "x", "model": "m"}).json()["error"]["type"] == "authentication_error"
        ok = {"authorization": "Bearer s3cret"}
        assert c.post("/embed", json={"inputs": "x"}, headers=ok).status_code == 200
        assert c.post("/embed", json={"inputs": "x"}, headers={"authorization": "Bearer nope"}).status_code == 401


def test_queue_full_is_429():
    with make_client(max_concurrent_requests=1) as c:
        service = c.app.state.service
        with service.batcher.admit():  # one request in flight
            r = c.post("/embed", json={"inputs": "x"})
            assert r.status_code == 429 and r.json()["error_type"] == "Overloaded"
            r = c.post("/v1/embeddings", json={"input": "x", "model": "m"})
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert c.post("/embed", json={"inputs": "x"}).status_code == 200
        assert 'reason="overloaded"' in c.get("/metrics").text


def test_openapi_documents_every_route(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/embed", "/v1/embeddings", "/attention", "/tokenize", "/info", "/health", "/metrics"):
        assert path in paths


def test_sparse_map_over_the_entry_limit_asks_for_top_k_or_grid():
    with make_client(max_attention_entries=50) as c:
        text = "one two three four five six seven eight nine ten " * 3
        r = c.post("/attention", json={"inputs": text, "layer": 0})
        assert r.status_code == 413 and "top_k" in r.json()["error"]
        assert c.post("/attention", json={"inputs": text, "layer": 0, "top_k": 1}).status_code == 200
        assert c.post("/attention", json={"inputs": text, "layer": 0, "format": "grid"}).status_code == 200
