"""A variant defined outside the product: it registers with @register_attention, exports with the
normal export function and serves embeddings and attention maps, with nothing else edited.

The variant, uniform attention (every query weighs every real token of its document equally),
lives in this file only; it is unregistered afterwards, so the other tests see the shipped
variants alone.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

NAME = "uniform"
MAX_LENGTH = 128


@pytest.fixture(scope="module")
def uniform_export(tmp_path_factory, two_layer_minilm):
    """(export directory, the PyTorch encoder it came from) of the uniform variant, over the
    bundled MiniLM cut to two layers (a third of the six layers' export time)."""
    import torch

    from attnserve.models import variant_names
    from attnserve.models.attention.base import Attention, AttentionConfig, SlotWeights
    from attnserve.export.exporter import export_model
    from attnserve.export.recipe import Recipe
    from attnserve.models.registry import register_attention, unregister_attention

    shipped = variant_names()

    @dataclasses.dataclass
    class UniformConfig(AttentionConfig):
        pass

    @register_attention(NAME)
    class UniformAttention(Attention):
        """Mean of the values of every real token: softmax of constant scores."""
        config_class = UniformConfig
        cost = "O(N)"

        def forward(self, q, k, v, key_valid, need_weights=False):
            weights = key_valid.to(v.dtype)[:, None, None, :]
            weights = weights / weights.sum(-1, keepdim=True)  # (B, 1, 1, N)
            out = torch.matmul(weights, v).expand(-1, -1, q.shape[2], -1)
            if not need_weights:
                return out, None
            n = q.shape[2]
            probs = weights.expand(q.shape[0], q.shape[1], n, n)
            return out, [SlotWeights(torch.arange(n, device=q.device), torch.arange(n, device=q.device).view(1, 1, 1, n), probs)]

    try:
        assert variant_names() == [*shipped, NAME]
        torch.set_num_threads(2)
        out = tmp_path_factory.mktemp("uniform-export")
        # With the export-time parity check: ONNX Runtime against PyTorch at two lengths.
        recipe = Recipe.resolve(NAME, {}, MAX_LENGTH, model=two_layer_minilm)
        export_model(recipe, out, log=lambda message: None)
        encoder = recipe.encoder().eval()
        yield out, encoder
    finally:
        unregister_attention(NAME)
        assert variant_names() == shipped


def test_a_variant_defined_in_a_test_exports_and_serves(uniform_export):
    import torch
    from fastapi.testclient import TestClient

    from attnserve.service.app import create_app
    from attnserve.contract.export_format import read_manifest
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings

    export_dir, encoder = uniform_export
    manifest = read_manifest(export_dir)
    assert manifest.variant == NAME and manifest.max_length == MAX_LENGTH and manifest.length_multiple == 1
    assert manifest.verified["exact"] and manifest.graphs.analysis is not None and manifest.graphs.short is None

    settings = Settings(variant=NAME, max_length=MAX_LENGTH, export_dir=export_dir, providers=["CPUExecutionProvider"])
    runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"])
    text = "uniform attention weighs every token of a document alike"
    with TestClient(create_app(settings, runner=runner, tokenizer_path=export_dir / "tokenizer.json")) as client:
        info = client.get("/info").json()
        embedded = client.post("/embed", json={"inputs": [text]})
        attention = client.post("/attention", json={"inputs": text, "layer": 1})
    assert info["variant"] == NAME and info["max_length"] == MAX_LENGTH
    assert embedded.status_code == 200, embedded.text
    vector = np.asarray(embedded.json()[0])
    with torch.no_grad():
        expected = encoder.embed([text])[0].numpy()
    assert vector.shape == (384,) and np.abs(vector - expected).max() < 1e-4

    assert attention.status_code == 200, attention.text
    body = attention.json()
    n = body["n_tokens"]
    assert body["variant"] == NAME and body["tokens"][0] == "[CLS]" and len(body["rank_collapse"]) == 2
    # Every query weighs all n tokens by 1 / n: a full n x n map of equal weights.
    assert len(body["values"]) == n * n and np.allclose(body["values"], 1 / n, atol=1e-6)
    assert sorted(zip(body["rows"], body["cols"])) == [(i, j) for i in range(n) for j in range(n)]
