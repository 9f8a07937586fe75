"""Late chunking and token vectors from a real export: /embed_chunks, /embed_all and pooling
from ONNX Runtime against the PyTorch encoder the export was made from, on real long text."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from export_helpers import SHARED_MAX_LENGTH, SHARED_VARIANT, get_export

DATA = Path(__file__).resolve().parents[1] / "data" / "longdocs-dev.jsonl.gz"


@pytest.fixture(scope="module")
def export():
    return get_export(SHARED_VARIANT, SHARED_MAX_LENGTH)


@pytest.fixture(scope="module")
def client(export):
    from attnserve.service.app import create_app
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings

    export_dir, _ = export
    runner = OnnxRunner(export_dir, intra_op_threads=2)
    app = create_app(Settings(max_length=SHARED_MAX_LENGTH, pooling="mean"), runner=runner, tokenizer_path=export_dir / "tokenizer.json")
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def texts(export):
    """Three real documents of about 100, 1,500 and 5,000 tokens."""
    _, encoder = export
    with gzip.open(DATA, "rt") as f:
        docs = [json.loads(line)["text"] for _, line in zip(range(40), f)]
    out = []
    for target in (100, 1500, 5000):
        doc = next(d for d in docs if len(encoder.tokenize([d])[0]) > target)
        words = doc.split()
        lo, hi = 1, len(words)
        while lo < hi:  # the longest word prefix under target tokens
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if len(encoder.tokenize([" ".join(words[:mid])])[0]) <= target else (lo, mid - 1)
        out.append(" ".join(words[:lo]))
    return out


def test_embed_chunks_from_onnx_equals_pytorch(client, export, texts):
    _, encoder = export
    expected = encoder.embed_chunks(texts, chunk_tokens=256, overlap_tokens=32, context="late")
    batched = client.post("/embed_chunks", json={"inputs": texts, "chunk_tokens": 256, "overlap_tokens": 32, "context": "late"})
    assert batched.status_code == 200, batched.text
    assert [len(c) for c in expected] == [1, 7, 23]
    for index, (want, got) in enumerate(zip(expected, batched.json())):
        alone = client.post("/embed_chunks", json={"inputs": texts[index], "chunk_tokens": 256, "overlap_tokens": 32, "context": "late"}).json()[0]
        for answer in (got, alone):
            assert [(c["start"], c["end"]) for c in answer] == [(c.start, c.end) for c in want]
            diff = np.abs(np.array([c["embedding"] for c in answer]) - np.stack([c.embedding.numpy() for c in want])).max()
            assert diff <= 1e-4, (index, diff)
    # The default context, the Python API's and the server's alike: each chunk embedded alone.
    naive = encoder.embed_chunks(texts[1:], chunk_tokens=256, overlap_tokens=32)
    served = client.post("/embed_chunks", json={"inputs": texts[1:], "chunk_tokens": 256, "overlap_tokens": 32}).json()
    for want, got in zip(naive, served):
        assert [(c["start"], c["end"]) for c in got] == [(c.start, c.end) for c in want]
        assert np.abs(np.array([c["embedding"] for c in got]) - np.stack([c.embedding.numpy() for c in want])).max() <= 1e-4


def test_one_chunk_is_the_embed_vector(client, texts):
    """In a mean-pooled deployment; with the default opening pooling it holds for documents of
    at most opening_tokens tokens (test_pooling.py)."""
    embed = np.array(client.post("/embed", json={"inputs": texts}).json())
    chunks = client.post("/embed_chunks", json={"inputs": texts, "chunk_tokens": SHARED_MAX_LENGTH}).json()
    for vector, (chunk,), text in zip(embed, chunks, texts):
        assert (chunk["start"], chunk["end"]) == (0, len(text))
        assert np.abs(np.array(chunk["embedding"]) - vector).max() <= 1e-5


def test_spans_from_onnx_equal_pytorch(client, export, texts):
    _, encoder = export
    text = texts[1]
    cuts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "." and i + 1 < len(text)][::6] + [len(text)]
    spans = [[a, b] for a, b in zip(cuts, cuts[1:]) if text[a:b].strip()]
    (want,) = encoder.embed_chunks([text], spans=[spans], context="late")
    (got,) = client.post("/embed_chunks", json={"inputs": text, "spans": spans, "context": "late"}).json()
    assert [[c["start"], c["end"]] for c in got] == spans == [[c.start, c.end] for c in want]
    assert np.abs(np.array([c["embedding"] for c in got]) - np.stack([c.embedding.numpy() for c in want])).max() <= 1e-4


def test_embed_all_mean_is_the_embed_vector(client, export, texts):
    _, encoder = export
    states = client.post("/embed_all", json={"inputs": texts[:2]}).json()
    embed = np.array(client.post("/embed", json={"inputs": texts[:2]}).json())
    for tokens, vector, torch_states in zip(states, embed, encoder.hidden_states(texts[:2])):
        tokens = np.array(tokens)
        assert tokens.shape == torch_states.shape
        assert np.abs(tokens - torch_states).max() <= 1e-3
        mean = tokens.mean(0)
        assert np.abs(mean / np.linalg.norm(mean) - vector).max() <= 1e-5


def test_python_api_late_chunks(export, texts):
    _, encoder = export
    for context in ("none", "late"):
        (one,) = encoder.embed_chunks([texts[0]], chunk_tokens=1000, context=context)
        assert len(one) == 1 and (one[0].start, one[0].end) == (0, len(texts[0]))
        assert float((one[0].embedding - encoder.embed([texts[0]])[0]).abs().max()) <= 1e-5
    (chunks,) = encoder.embed_chunks([texts[1]], chunk_tokens=100)
    assert "".join(texts[1][c.start:c.end] for c in chunks) == texts[1]
    with pytest.raises(ValueError, match="overlaps"):
        encoder.embed_chunks([texts[0]], spans=[[(0, 20), (10, 30)]])
    with pytest.raises(ValueError, match="context must be one of none, late"):
        encoder.embed_chunks([texts[0]], context="learned")


def test_pooling_modes_match_pytorch(export, texts):
    from attnserve.service.app import create_app
    from attnserve.contract.pooling import Pooling
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings

    export_dir, encoder = export
    runner = OnnxRunner(export_dir, intra_op_threads=2)
    texts = texts[:2]  # 100 and 1,500 tokens: past the opening's 256 and the window, at a quarter of the third's cost
    for mode in ("cls", "opening"):
        app = create_app(Settings(max_length=SHARED_MAX_LENGTH, pooling=mode), runner=runner, tokenizer_path=export_dir / "tokenizer.json")
        with TestClient(app) as c:
            got = np.array(c.post("/embed", json={"inputs": texts}).json())
        want = encoder.embed(texts, Pooling(mode)).numpy()
        assert np.abs(got - want).max() <= 1e-4, mode
