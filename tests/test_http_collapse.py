"""POST /rank_collapse in process over the fake runner: the answer's shape and what it holds,
the paths asked for and only those, and every bad request a 4xx naming what to change. The
real export's graph against PyTorch: test_collapse.py; the route over it: test_http_server.py."""
from __future__ import annotations

import pytest
from http_fakes import FakeRunner, fake_client

PATHS = ["model", "attention_only", "attention_skip", "attention_mlp"]
TEXT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def client():
    with fake_client(max_length=64) as c:
        yield c


def test_every_path_by_default_one_ratio_per_layer(client):
    r = client.post("/rank_collapse", json={"inputs": TEXT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["variant"] == "fake" and body["n_tokens"] == 11 and len(body["layer_variants"]) == 6
    assert list(body["paths"]) == PATHS and all(len(curve) == 6 for curve in body["paths"].values())
    assert body["embeddings"] == 0.95
    # The model path is the curve /attention answers with.
    assert body["paths"]["model"] == client.post("/attention", json={"inputs": TEXT, "layer": 0}).json()["rank_collapse"]
    assert body["paths"]["attention_only"] == pytest.approx([0.95 * 0.5 ** (layer + 1) for layer in range(6)])
    assert "x-inference-time" in r.headers


def test_info_says_what_the_route_takes(client):
    info = client.get("/info").json()
    assert info["rank_collapse_paths"] == PATHS and info["rank_collapse_max_length"] == info["attention_max_length"] == 64


def test_only_the_paths_asked_for_in_their_order(client):
    body = client.post("/rank_collapse", json={"inputs": TEXT, "paths": ["attention_mlp", "attention_only"]}).json()
    assert list(body["paths"]) == ["attention_mlp", "attention_only"]


@pytest.mark.parametrize("paths, says", [
    (["attention"], "attention_only"),  # an unknown path: the message lists the valid ones
    ([], "at least 1"),
    (["model", "model"], "more than once"),
    ("model", "valid list"),
])
def test_bad_paths_are_422_naming_the_field(client, paths, says):
    r = client.post("/rank_collapse", json={"inputs": TEXT, "paths": paths})
    assert r.status_code == 422, r.text
    assert "paths" in r.text and says in r.text


def test_too_long_is_413_and_truncate_fits_it(client):
    long = " ".join(["word"] * 80)
    r = client.post("/rank_collapse", json={"inputs": long})
    assert r.status_code == 413 and "truncate" in r.json()["error"]
    assert client.post("/rank_collapse", json={"inputs": long, "truncate": True}).json()["n_tokens"] == 64
    assert client.post("/rank_collapse", json={"inputs": "   "}).status_code == 422


def test_past_the_collapse_limit_is_413_naming_it():
    runner = FakeRunner(max_length=64)
    runner.collapse_max_length = 20
    with fake_client(runner=runner) as c:
        r = c.post("/rank_collapse", json={"inputs": " ".join(["word"] * 30)})
        assert r.status_code == 413 and "limited to 20 tokens" in r.json()["error"] and "truncate=true" in r.json()["error"]
        assert c.post("/rank_collapse", json={"inputs": TEXT}).status_code == 200


@pytest.mark.parametrize("words", [30, 80])  # past the route's limit only, and past max_length too
def test_truncate_cuts_to_the_collapse_limit(words):
    """truncate=true cuts to rank_collapse_max_length, the route's own limit (TEI's truncate
    cuts to what the route takes), keeping [CLS] and [SEP]: the same ratios as the text cut by hand."""
    runner = FakeRunner(max_length=64)
    runner.collapse_max_length = 20
    with fake_client(runner=runner) as c:
        text = " ".join(f"w{i}" for i in range(words))
        body = c.post("/rank_collapse", json={"inputs": text, "truncate": True}).json()
        assert body["n_tokens"] == 20
        kept = c.post("/tokenize", json={"inputs": text, "truncate": True}).json()[0][1:19]
        cut = text[kept[0]["start"]:kept[-1]["stop"]]
        assert c.post("/rank_collapse", json={"inputs": cut}).json() == body


def test_attention_truncate_cuts_to_the_maps_limit():
    runner = FakeRunner(max_length=64)
    runner.attention_max_length = 24
    with fake_client(runner=runner) as c:
        text = " ".join(["word"] * 40)
        r = c.post("/attention", json={"inputs": text, "layer": 0})
        assert r.status_code == 413 and "truncate=true to cut it to 24" in r.json()["error"]
        body = c.post("/attention", json={"inputs": text, "layer": 0, "truncate": True}).json()
        assert len(body["tokens"]) == 24 and body["tokens"][0] == "[CLS]" and body["tokens"][-1] == "[SEP]"


def test_an_export_without_the_graph_is_422_saying_to_export_again():
    runner = FakeRunner(max_length=64)
    runner.collapse_max_length, runner.collapse_paths = 0, []
    with fake_client(runner=runner) as c:
        r = c.post("/rank_collapse", json={"inputs": TEXT})
        assert r.status_code == 422 and "export it again" in r.json()["error"]
        assert c.get("/info").json()["rank_collapse_paths"] == []
        assert c.get("/health").status_code == 200
