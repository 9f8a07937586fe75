"""The other APIs' shapes in process over the fake runner: Jina's late_chunking and task on
/v1/embeddings, Voyage's /v1/contextualizedembeddings, input_type, TEI's /similarity; their
output formats and every bad input a 4xx naming its field. The numbers through the real
clients and a real export: test_http_server.py."""
from __future__ import annotations

import base64

import numpy as np
import pytest
from http_checks import joined_spans, late_chunk_vectors
from http_fakes import fake_client

CHUNKS = ["Late chunking embeds the document once.", "Each chunk then takes the mean of its tokens.", "The end."]


@pytest.fixture(scope="module")
def client():
    with fake_client(max_length=128, max_client_batch_size=4) as c:
        yield c


def openai_error(r, status, param, *words):
    assert r.status_code == status, r.text[:500]
    error = r.json()["error"]
    assert error["param"] == param, error
    for word in words:
        assert word in error["message"], error
    return error


def test_late_chunking_is_embed_chunks_over_the_joined_spans(client):
    r = client.post("/v1/embeddings", json={"input": CHUNKS, "model": "m", "late_chunking": True, "task": "retrieval.passage"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    text, _ = joined_spans(CHUNKS)
    tokens = len(client.post("/tokenize", json={"inputs": text}).json()[0])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), late_chunk_vectors(client, CHUNKS), atol=1e-6)
    one = client.post("/v1/embeddings", json={"input": ["one chunk"], "model": "m", "late_chunking": True}).json()
    np.testing.assert_allclose(one["data"][0]["embedding"], client.post("/embed", json={"inputs": "one chunk"}).json()[0], atol=1e-6)


def test_contextualized_embeddings_in_voyages_shape(client):
    r = client.post("/v1/contextualizedembeddings", json={"inputs": [CHUNKS, ["alone"]], "model": "m", "input_type": "document",
                                                          "output_dimension": None, "output_dtype": None, "encoding_format": None})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "attnserve-fake" and body["usage"]["total_tokens"] > 0
    assert [d["index"] for d in body["data"]] == [0, 1] and [d["object"] for d in body["data"]] == ["list", "list"]
    assert [[c["index"] for c in d["data"]] for d in body["data"]] == [[0, 1, 2], [0]]
    first = np.array([c["embedding"] for c in body["data"][0]["data"]])
    np.testing.assert_allclose(first, late_chunk_vectors(client, CHUNKS), atol=1e-6)
    np.testing.assert_allclose(body["data"][1]["data"][0]["embedding"], client.post("/embed", json={"inputs": "alone"}).json()[0], atol=1e-6)


def test_output_formats_dimensions_bits_base64(client):
    floats = np.array(client.post("/v1/contextualizedembeddings", json={"inputs": [CHUNKS], "model": "m"}).json()
                      ["data"][0]["data"][0]["embedding"])
    short = client.post("/v1/contextualizedembeddings", json={"inputs": [CHUNKS], "model": "m", "output_dimension": 64,
                                                              "encoding_format": "base64"}).json()["data"][0]["data"][0]["embedding"]
    short = np.frombuffer(base64.b64decode(short), "<f4")
    np.testing.assert_allclose(short, floats[:64] / np.linalg.norm(floats[:64]), atol=1e-6)
    bits = np.packbits(floats > 0)
    for dtype, expected in (("ubinary", bits), ("binary", bits.astype(np.int16) - 128)):
        got = client.post("/v1/contextualizedembeddings", json={"inputs": [CHUNKS], "model": "m", "output_dtype": dtype}).json()
        assert got["data"][0]["data"][0]["embedding"] == expected.tolist()
    jina = client.post("/v1/embeddings", json={"input": CHUNKS, "model": "m", "late_chunking": True, "embedding_type": "ubinary"}).json()
    assert jina["data"][0]["embedding"] == bits.tolist() and len(bits) == 48
    raw = client.post("/v1/embeddings", json={"input": "some text", "model": "m", "normalized": False}).json()["data"][0]["embedding"]
    assert abs(np.linalg.norm(raw) - 3) < 1e-4  # the fake's pooled hidden states are 3x the unit vector


def test_input_type_and_task_name_one_side(client):
    for body in ({"input_type": "query"}, {"input_type": "search_query"}, {"task": "retrieval.query"},
                 {"input_type": "document"}, {"input_type": "search_document"}, {"task": "text-matching"}):
        r = client.post("/v1/embeddings", json={"input": "a question", "model": "m", **body})
        assert r.status_code == 200, (body, r.text)
    assert client.post("/embed", json={"inputs": "a question", "input_type": "query"}).status_code == 200
    info = client.get("/info").json()["input_types"]
    assert set(info) == {"query", "document"} and "mean" in info["query"] and "late" in info["document"]


def test_similarity_is_cosine_of_embed_vectors(client):
    r = client.post("/similarity", json={"inputs": {"source_sentence": "cats", "sentences": ["cats", "dogs", "birds"]},
                                         "parameters": {"truncate": False, "truncation_direction": "right", "prompt_name": None}})
    assert r.status_code == 200, r.text
    vectors = np.array(client.post("/embed", json={"inputs": ["cats", "cats", "dogs", "birds"]}).json())
    np.testing.assert_allclose(r.json(), vectors[1:] @ vectors[0], atol=1e-6)
    assert r.json()[0] == pytest.approx(1.0, abs=1e-6)
    assert client.post("/v1/contextualizedembeddings", json={"inputs": [["a"]], "model": "m"}).status_code == 200
    metrics = client.get("/metrics").text
    for route in ("/similarity", "/v1/contextualizedembeddings"):
        assert f'attnserve_requests_success_total{{precision="float32",route="{route}",variant="fake"}}' in metrics


@pytest.mark.parametrize("path, body, status, param, words", [
    # an empty chunk list, or no documents
    ("/v1/contextualizedembeddings", {"inputs": [[]], "model": "m"}, 422, "inputs", ["at least 1"]),
    ("/v1/contextualizedembeddings", {"inputs": [], "model": "m"}, 422, "inputs", ["at least 1"]),
    ("/v1/embeddings", {"input": [], "model": "m", "late_chunking": True}, 422, "input", []),
    # mixed types
    ("/v1/contextualizedembeddings", {"inputs": [["a", 3]], "model": "m"}, 422, "inputs", ["string"]),
    ("/v1/contextualizedembeddings", {"inputs": ["a", "b"], "model": "m"}, 422, "inputs", ["list"]),
    ("/v1/embeddings", {"input": ["a", 3], "model": "m", "late_chunking": True}, 422, "input", []),
    ("/v1/embeddings", {"input": [101, 102], "model": "m", "late_chunking": True}, 422, None, ["late_chunking", "token ids"]),
    # unknown input_type or task, sides that disagree
    ("/v1/embeddings", {"input": "a", "model": "m", "input_type": "classification"}, 422, "input_type", ["search_query"]),
    ("/v1/contextualizedembeddings", {"inputs": [["a"]], "model": "m", "input_type": "passage"}, 422, "input_type", ["document"]),
    ("/v1/embeddings", {"input": "a", "model": "m", "task": "retrieval"}, 422, "task", ["retrieval.query"]),
    ("/v1/embeddings", {"input": "a", "model": "m", "input_type": "query", "task": "retrieval.passage"}, 422, "input_type", ["agree"]),
    ("/v1/embeddings", {"input": ["a", "b"], "model": "m", "late_chunking": True, "input_type": "query"}, 422, "late_chunking", ["queries"]),
    ("/v1/contextualizedembeddings", {"inputs": [["q", "r"]], "model": "m", "input_type": "query"}, 422, "inputs", ["one query"]),
    # formats this model cannot give, sizes past its own
    ("/v1/contextualizedembeddings", {"inputs": [["a"]], "model": "m", "output_dtype": "int8"}, 422, "output_dtype", ["binary"]),
    ("/v1/contextualizedembeddings", {"inputs": [["a"]], "model": "m", "output_dimension": 1024}, 422, "output_dimension", ["384"]),
    ("/v1/contextualizedembeddings", {"inputs": [["a"]], "model": "m", "enable_auto_chunking": True}, 422, "enable_auto_chunking", ["xtra"]),
    # a chunk that holds no token
    ("/v1/contextualizedembeddings", {"inputs": [["words", "\u0301", "more"]], "model": "m"}, 422, "inputs", ["inputs[1]", "no token"]),
    # more inputs than the server takes at once
    ("/v1/contextualizedembeddings", {"inputs": [["a"]] * 5, "model": "m"}, 413, "inputs", ["4"]),
])
def test_bad_input_is_4xx_naming_the_field(client, path, body, status, param, words):
    openai_error(client.post(path, json=body), status, param, *words)


def test_bad_similarity_and_embed_input_type(client):
    r = client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}})
    assert r.status_code == 422 and "sentences" in r.json()["error"]
    r = client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": ["b"] * 4}})
    assert r.status_code == 413 and "4" in r.json()["error"]
    r = client.post("/embed", json={"inputs": "a", "input_type": "querry"})
    assert r.status_code == 422 and "input_type" in r.json()["error"]


def test_chunks_past_max_length_with_and_without_truncation(client):
    long = ["word " * 60, "more " * 60, "last " * 60, "past " * 10]  # 190 tokens, the server's max_length is 128
    r = client.post("/v1/embeddings", json={"input": long, "model": "m", "late_chunking": True})
    openai_error(r, 413, "input", "joined from input", "192 tokens", "truncate=true")
    r = client.post("/v1/embeddings", json={"input": long, "model": "m", "late_chunking": True, "truncate": True})
    openai_error(r, 413, "input", "chunk 3 lies wholly past the 128 tokens")
    r = client.post("/v1/embeddings", json={"input": long[:3], "model": "m", "late_chunking": True, "truncate": True})
    assert r.status_code == 200 and len(r.json()["data"]) == 3 and r.json()["usage"]["prompt_tokens"] == 128  # the last one cut
    r = client.post("/v1/contextualizedembeddings", json={"inputs": [["x"], long], "model": "m"})
    openai_error(r, 413, "inputs", "inputs[1]", "192 tokens")
    assert client.get("/health").status_code == 200
