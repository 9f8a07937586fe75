"""Checks of HTTP answers shared by the in-process tests (fake runner) and the end-to-end ones
(real export)."""
from __future__ import annotations

import numpy as np


def check_attention_formats(client, text: str, layer: int, atol: float,
                            opening: str = "[CLS]") -> tuple[dict, np.ndarray, np.ndarray]:
    """POST /attention for `text` in every format (client: httpx.Client or TestClient) and check
    what holds for any model: the sparse map has one token per position starting with the
    model's `opening` token, a rank-collapse ratio per layer (/info's num_layers) and rows
    summing to 1; top_k keeps k entries a row; the grid is square, covers every token and its
    rows sum to 1; png is a PNG. Returns the sparse answer, its rows and its cols for the
    caller's own checks."""
    r = client.post("/attention", json={"inputs": text, "layer": layer})
    assert r.status_code == 200, r.text[:500]
    body = r.json()
    n = body["n_tokens"]
    assert body["tokens"][0] == opening and len(body["tokens"]) == n
    assert len(body["rank_collapse"]) == client.get("/info").json()["num_layers"]
    rows, cols, vals = (np.array(body[k]) for k in ("rows", "cols", "values"))
    np.testing.assert_allclose(np.bincount(rows, weights=vals, minlength=n), 1, atol=atol)
    r = client.post("/attention", json={"inputs": text, "layer": layer, "head": 3, "top_k": 2})
    assert r.status_code == 200 and np.bincount(r.json()["rows"]).max() == 2
    r = client.post("/attention", json={"inputs": text, "layer": 0, "format": "grid", "max_cells": 8})
    grid = np.array(r.json()["grid"])
    assert grid.shape[0] <= 8 and grid.shape[0] == grid.shape[1] and r.json()["cell_tokens"] * grid.shape[0] >= n
    np.testing.assert_allclose(grid.sum(axis=1), 1, atol=atol)
    r = client.post("/attention", json={"inputs": text, "layer": layer, "format": "png", "max_cells": 16})
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert r.content.startswith(b"\x89PNG\r\n\x1a\n")
    return body, rows, cols


def joined_spans(chunks: list[str]) -> tuple[str, list[list[int]]]:
    """The document chunks make joined with one space (as late_chunking and contextualized
    embeddings join them), and each chunk's [start, end) span in it."""
    starts = np.cumsum([0] + [len(c) + 1 for c in chunks[:-1]])
    return " ".join(chunks), [[int(a), int(a) + len(c)] for a, c in zip(starts, chunks)]


def late_chunk_vectors(client, chunks: list[str]) -> np.ndarray:
    """/embed_chunks' vectors of the chunks' spans in their joined document, with the context
    late chunking and contextualized embeddings use where the deployment's chunk_context is
    none (late)."""
    assert client.get("/info").json()["chunk_context"] == "none"
    text, spans = joined_spans(chunks)
    r = client.post("/embed_chunks", json={"inputs": text, "spans": spans, "context": "late"})
    assert r.status_code == 200, r.text[:500]
    return np.array([c["embedding"] for c in r.json()[0]], dtype=np.float32)
