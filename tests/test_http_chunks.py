"""/embed_chunks, /embed_all, /decode and pooling settings, in process over the fake runner: the
HTTP contract (offsets, coverage, validation, limits). The numbers from a real export:
test_late_chunking.py."""
from __future__ import annotations

import numpy as np
import pytest
from http_fakes import fake_client

TEXT = ("Late chunking embeds the whole document once. " * 30).strip()


def make_client(**settings):
    return fake_client(**{"max_length": 512, **settings})


@pytest.fixture(scope="module")
def client():
    with make_client(max_client_batch_size=4, max_token_vectors=600) as c:
        yield c


def chunks_of(client, **body):
    r = client.post("/embed_chunks", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_document_in_one_chunk_gets_its_embed_vector(client):
    embed = np.array(client.post("/embed", json={"inputs": ["short text", TEXT]}).json())
    out = chunks_of(client, inputs=["short text", TEXT], chunk_tokens=1000)
    assert [len(chunks) for chunks in out] == [1, 1]
    for vector, (chunk,), text in zip(embed, out, ["short text", TEXT]):
        assert (chunk["start"], chunk["end"]) == (0, len(text))
        assert np.abs(np.array(chunk["embedding"]) - vector).max() <= 1e-5


@pytest.mark.parametrize("overlap", [0, 5])
def test_chunks_cover_the_input_in_order(client, overlap):
    (chunks,) = chunks_of(client, inputs=TEXT, chunk_tokens=32, overlap_tokens=overlap)
    assert len(chunks) > 5
    assert chunks[0]["start"] == 0 and chunks[-1]["end"] == len(TEXT)
    for a, b in zip(chunks, chunks[1:]):
        assert a["start"] < b["start"] < a["end"] if overlap else a["end"] == b["start"]
    if not overlap:
        assert "".join(TEXT[c["start"]:c["end"]] for c in chunks) == TEXT
    tokens = client.post("/tokenize", json={"inputs": TEXT}).json()[0]
    # Each chunk (but the last) starts at a token and holds chunk_tokens of them.
    starts = [t["start"] for t in tokens if not t["special"]]
    assert [c["start"] for c in chunks[1:]] == starts[32 - overlap::32 - overlap][: len(chunks) - 1]
    for c in chunks:
        assert len(c["embedding"]) == 384
        assert abs(np.linalg.norm(c["embedding"]) - 1) < 1e-5


def test_spans_are_the_chunks(client):
    first = TEXT.index(".") + 1
    spans = [[0, first], [first + 1, 200], [300, len(TEXT)]]
    (chunks,) = chunks_of(client, inputs=TEXT, spans=spans)
    assert [[c["start"], c["end"]] for c in chunks] == spans
    two = chunks_of(client, inputs=[TEXT, "two words"], spans=[spans, [[0, 3], [4, 9]]])
    assert [[c["start"], c["end"]] for c in two[1]] == [[0, 3], [4, 9]]


def test_normalize_false_and_truncate(client):
    raw = chunks_of(client, inputs="short text", normalize=False)[0][0]["embedding"]
    assert np.linalg.norm(raw) > 1.5  # the fake's hidden states are 3x a unit vector
    long = "word " * 700
    r = client.post("/embed_chunks", json={"inputs": long})
    assert r.status_code == 413 and "702 tokens" in r.json()["error"]
    (chunks,) = chunks_of(client, inputs=long, truncate=True, chunk_tokens=100)
    assert len(chunks) == 6 and chunks[-1]["end"] == len("word " * 510) - 1


def test_an_answer_of_more_chunk_vectors_than_max_token_vectors_is_413(client):
    body = {"inputs": ["word " * 400] * 2, "chunk_tokens": 1}
    r = client.post("/embed_chunks", json=body)
    assert r.status_code == 413 and "800 chunk vectors" in r.json()["error"] and "(600" in r.json()["error"], r.text
    assert r.json()["error_type"] == "Validation"
    (chunks,) = chunks_of(client, inputs="word " * 400, chunk_tokens=1)
    assert len(chunks) == 400  # [CLS] joins the first word, [SEP] the last


@pytest.mark.parametrize("body, says", [
    ({"chunk_tokens": 0}, "chunk_tokens"),
    ({"chunk_tokens": -3}, "chunk_tokens"),
    ({"chunk_tokens": 8, "overlap_tokens": 8}, "overlap_tokens (8) must be less than chunk_tokens (8)"),
    ({"overlap_tokens": -1}, "overlap_tokens"),
    ({"spans": [[0, 10], [5, 20]]}, "overlaps"),
    ({"spans": [[0, 10], [10, 99999]]}, "outside the text"),
    ({"spans": [[4, 4]]}, "empty"),
    ({"spans": [[-1, 4]]}, "spans"),
    ({"spans": []}, "spans: List should have at least 1 item"),
    ({"spans": [[0, 1, 2]]}, "spans"),
    ({"spans": [[[0, 4]]]}, "one list of [start_char, end_char] pairs"),
    ({"spans": [[0, 5], [5, 6]]}, "holds no token"),
])
def test_bad_chunking_is_422_with_a_message(client, body, says):
    text = "Hello world, a text of some length."
    if body.get("spans") == [[0, 5], [5, 6]]:
        text = "Hello  world"  # [5, 6) is one space
    r = client.post("/embed_chunks", json={"inputs": text, **body})
    assert r.status_code == 422, r.text
    assert says in r.json()["error"], r.json()


def test_list_inputs_need_one_span_list_each(client):
    r = client.post("/embed_chunks", json={"inputs": ["a b", "c d"], "spans": [[0, 1]]})
    assert r.status_code == 422 and "2 lists" in r.json()["error"]
    r = client.post("/embed_chunks", json={"inputs": ["a b", "c d"], "spans": [[[0, 1]], [[9, 12]]]})
    assert r.status_code == 422 and "input 1" in r.json()["error"]


def test_embed_all_gives_every_token_vector(client):
    tokens = client.post("/tokenize", json={"inputs": ["some text", "a bit more text"]}).json()
    r = client.post("/embed_all", json={"inputs": ["some text", "a bit more text"]})
    assert r.status_code == 200
    states = r.json()
    assert [len(s) for s in states] == [len(t) for t in tokens]
    raw = np.array(client.post("/embed", json={"inputs": "some text", "normalize": False}).json()[0])
    np.testing.assert_allclose(np.array(states[0]).mean(0), raw, rtol=1e-5)
    r = client.post("/embed_all", json={"inputs": ["word " * 300, "word " * 300]})
    assert r.status_code == 413 and "604 token vectors" in r.json()["error"] and "600" in r.json()["error"]


def test_decode_is_tokenize_backwards(client):
    ids = [t["id"] for t in client.post("/tokenize", json={"inputs": "Hello decoding world"}).json()[0]]
    assert client.post("/decode", json={"ids": ids}).json() == ["hello decoding world"]
    both = client.post("/decode", json={"ids": [ids, ids[1:3]], "skip_special_tokens": False}).json()
    assert both[0].startswith("[CLS] hello") and len(both) == 2
    r = client.post("/decode", json={"ids": [101, 99999]})
    assert r.status_code == 422 and "99999" in r.json()["error"] and "0..30521" in r.json()["error"]
    assert client.post("/decode", json={"ids": []}).status_code == 422
    assert client.post("/decode", json={"ids": [-1]}).status_code == 422


def test_metrics_count_the_new_routes(client):
    chunks_of(client, inputs="metrics please")
    text = client.get("/metrics").text
    assert 'attnserve_requests_success_total{precision="float32",route="/embed_chunks",variant="fake"}' in text


@pytest.mark.parametrize("mode", ["cls", "opening", "mean"])
def test_pooling_setting(mode):
    with make_client(pooling=mode, opening_weight=0.25, opening_tokens=4) as c:
        info = c.get("/info").json()["pooling"]
        assert info["mode"] == mode
        if mode == "opening":
            assert (info["opening_weight"], info["opening_tokens"]) == (0.25, 4)
        r = c.post("/embed", json={"inputs": ["pool me", "and me too, a longer text than four tokens"]})
        assert r.status_code == 200
        v = np.array(r.json())
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-5)
    # The fake's token vectors are all alike, so every pooling gives the mean's direction.
    with make_client(pooling="mean") as plain:
        np.testing.assert_allclose(v, plain.post("/embed", json={"inputs": ["pool me", "and me too, a longer text than four tokens"]}).json(), atol=1e-6)


def test_default_pooling_is_opening():
    from attnserve.contract.pooling import Pooling

    with make_client() as c:
        assert c.get("/info").json()["pooling"] == {"mode": "opening", "opening_weight": Pooling.opening_weight,
                                                    "opening_tokens": Pooling.opening_tokens}


def test_context_heads_are_not_a_serving_option(capsys, monkeypatch, tmp_path):
    """Context heads lost to naive chunks (docs/results/context.md): `python -m research.context bench`
    measures them, and no deployment serves them. Asking for them is refused, naming what is."""
    with make_client() as c:
        info = c.get("/info").json()
        assert (info["chunk_context"], info["chunk_contexts"]) == ("none", ["none", "late"]) and "context_heads" not in info
        schema = c.get("/openapi.json").json()["components"]["schemas"]["EmbedChunksRequest"]["properties"]["context"]
        assert schema["anyOf"][0]["enum"] == ["none", "late"]
        for context in ("learned", "sideways"):
            r = c.post("/embed_chunks", json={"inputs": TEXT, "context": context})
            assert r.status_code == 422 and r.json()["error"] == "context: Input should be 'none' or 'late'", r.text
    from attnserve.cli import main

    unused = str(tmp_path / "unused")
    for flags, said in [(["--pooling", "learned"], ("--pooling", "invalid choice: 'learned'", "opening")),
                        (["--chunk-context", "learned"], ("--chunk-context", "invalid choice: 'learned'", "late")),
                        (["--context-heads", unused], ("unrecognized arguments: --context-heads",))]:
        with pytest.raises(SystemExit) as exit:
            main(["serve", "--export-dir", unused, "--port", "0", *flags])
        err = capsys.readouterr().err
        assert exit.value.code == 2 and all(s in err for s in said), err
    for name, allowed in [("ATTNSERVE_POOLING", "'mean', 'cls', 'lasttoken' or 'opening'"), ("ATTNSERVE_CHUNK_CONTEXT", "'none' or 'late'")]:
        with monkeypatch.context() as env:
            env.setenv(name, "learned")
            assert main(["serve", "--export-dir", unused, "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert "invalid settings" in err and f"Input should be {allowed} (got 'learned')" in err, err
    assert not (tmp_path / "unused").exists()  # refused before looking for an export
