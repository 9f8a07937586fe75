"""NomicBERT and GTE folders (transformers' NomicBertModel and GteModel): their own full attention
with RoPE and dynamic NTK scaling served as attnserve's `full`, equal to transformers' class plus
the folder's pooling in PyTorch, in the ONNX export and over HTTP; attnserve's variants carry
the rotary term, and one that cannot is refused naming those that can.

The folders are small and random (tests/model_folders.rotary_bert_folder: 4 layers, hidden 64,
trained length 256, NTK factor 2), and texts run below and above the trained length; the exports
go through the shared test cache."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from export_helpers import EXPORTS_ROOT
from model_folders import rotary_bert_folder

ARCHITECTURES = ("nomic_bert", "gte")
TEXTS = ["a short text", "a longer passage about rotary positions " * 12, "the whole document, again and again. " * 100]
MAX_LENGTH = 1024


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    # The folders' names are part of the export recipe: the same names every run keep the cache warm.
    root = tmp_path_factory.mktemp("models")
    return {arch: rotary_bert_folder(root / f"{arch}-mean", arch) for arch in ARCHITECTURES}


def transformers_vectors(folder, texts: list[str], together: bool = False) -> np.ndarray:
    """transformers' class of the folder (a fresh instance per call: its dynamic RoPE keeps the
    longest length it has seen), mean-pooled over real tokens and normalised: each text alone,
    or all of them as one batch padded to the longest."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = []
    for batch in ([texts] if together else [[t] for t in texts]):
        model = AutoModel.from_pretrained(folder).eval()
        ids = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.no_grad():
            hidden = model(**ids).last_hidden_state
        mask = ids["attention_mask"][..., None].float()
        out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy())
    return np.concatenate(out)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_folder_is_read(folders, architecture):
    from attnserve.contract.model_folder import read_model_folder

    model = read_model_folder(folders[architecture])
    assert (model.architecture, model.default_variant, model.max_positions, model.rotary) == (architecture, "native", 256, True)
    theta = {"nomic_bert": 1000.0, "gte": 160000.0}[architecture]
    assert (model.detail("rope_theta"), model.detail("rope_type"), model.detail("rope_factor")) == (theta, "dynamic", 2.0)
    assert model.detail("activation") == {"nomic_bert": "silu", "gte": "gelu"}[architecture]
    assert "per document" in model.position_scaling


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_native_matches_transformers_below_and_above_the_trained_length(folders, architecture):
    """native is full attention; in one padded batch, each text's vector is transformers' for the
    text alone (NTK scaling by each document's own length, from 5 to 1,000 tokens), and a batch
    whose texts are all within the trained length is transformers' batch."""
    from attnserve.models import load_encoder

    encoder = load_encoder(model=folders[architecture], max_length=MAX_LENGTH)
    assert encoder.attention_config.variant == "full"
    lengths = [len(ids) for ids in encoder.tokenize(TEXTS)]
    assert lengths[0] < 10 and 50 < lengths[1] < 256 < 3 * 256 < lengths[2] <= MAX_LENGTH
    batched = encoder.embed(TEXTS, normalize=True).numpy()
    assert np.abs(batched - transformers_vectors(folders[architecture], TEXTS)).max() <= 1e-4
    short = encoder.embed(TEXTS[:2], normalize=True).numpy()
    assert np.abs(short - transformers_vectors(folders[architecture], TEXTS[:2], together=True)).max() <= 1e-4


def test_variants_carry_the_rotary_term_and_others_are_refused(folders):
    from attnserve.models import load_encoder

    folder = folders["nomic_bert"]
    reference = transformers_vectors(folder, TEXTS[:2])
    for variant in ("longformer", "bigbird", "local", "full,longformer"):
        encoder = load_encoder(variant, MAX_LENGTH, model=folder)
        vectors = encoder.embed(TEXTS[:2], normalize=True).numpy()
        # Short texts: each of these is full attention within its window, so the vectors are the model's.
        assert np.abs(vectors - reference).max() <= 1e-4, variant
    with pytest.raises(ValueError, match="rotary") as refused:
        load_encoder("linformer", MAX_LENGTH, model=folder)
    assert "longformer" in str(refused.value)
    with pytest.raises(ValueError, match="no position table"):
        load_encoder("longformer", MAX_LENGTH, model=folder, positions="grouped")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_export_and_the_server_give_transformers_vectors(folders, architecture):
    from fastapi.testclient import TestClient

    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe
    from attnserve.service.app import create_app
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings

    folder = folders[architecture]
    torch.set_num_threads(2)
    maps = architecture == "nomic_bert"  # the analysis and collapse graphs too, once
    export_dir = cached_export(EXPORTS_ROOT, Recipe.resolve(model=folder, max_length=MAX_LENGTH, analysis=maps), log=lambda m: None)
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["variant"] == "full" and manifest["model"]["architecture"] == architecture
    reference = transformers_vectors(folder, TEXTS)
    runner = OnnxRunner(export_dir, intra_op_threads=2)
    # One padded batch through the graph (5 to 800 tokens: below and past the NTK threshold).
    from attnserve.models import load_encoder

    ids = load_encoder(model=folder, max_length=MAX_LENGTH).tokenize(TEXTS)
    width = runner.padded_length(max(len(i) for i in ids))
    batch, mask = np.zeros((len(ids), width), np.int64), np.zeros((len(ids), width), np.int64)
    for row, i in enumerate(ids):
        batch[row, : len(i)], mask[row, : len(i)] = i, 1
    assert np.abs(runner.embed(batch, mask) - reference).max() <= 1e-4
    app = create_app(Settings(model=folder, export_dir=export_dir, max_length=MAX_LENGTH), runner=runner, tokenizer_path=export_dir / "tokenizer.json")
    with TestClient(app) as client:
        info = client.get("/info").json()
        assert info["model"]["architecture"] == architecture and "per document" in info["model"]["position_scaling"]
        assert info["max_length"] == MAX_LENGTH and info["past_trained_length"] is True
        body = client.post("/v1/embeddings", json={"input": TEXTS, "model": "m"}).json()
        served = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        assert np.abs(served - reference).max() <= 1e-4
        if maps:  # full rows that sum to 1 on every layer, and the rank-collapse paths through its layers
            grid = np.array(client.post("/attention", json={"inputs": TEXTS[1], "layer": 3, "format": "grid", "max_cells": 8}).json()["grid"])
            assert np.allclose(grid.sum(1), 1, atol=1e-3) and (grid > 0).all()
            collapse = client.post("/rank_collapse", json={"inputs": TEXTS[1]}).json()
            assert all(len(ratios) == 4 for ratios in collapse["paths"].values()) and collapse["paths"], collapse


def edit_config(folder, tmp_path, **changes):
    import shutil

    copy = shutil.copytree(folder, tmp_path / folder.name)
    config = json.loads((copy / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 2.0}}, "rope_type 'yarn' is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}}, "partial_rotary_factor 0.5"),
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ({"head_dim": 8}, "head_dim 8 is not hidden_size / num_attention_heads"),
    ({"num_hidden_layers": 5}, "has no tensor encoder.layers.4.attn.Wqkv.weight"),
    ({"auto_map": {"AutoModel": "modeling_hf_nomic_bert.NomicBertModel"}}, "auto_map names the folder's own code"),
])
def test_what_cannot_run_is_refused_naming_the_file(folders, tmp_path, changes, message):
    from attnserve.contract.model_folder import ModelError, read_model_folder

    with pytest.raises(ModelError, match=re.escape(message)) as refused:
        read_model_folder(edit_config(folders["nomic_bert"], tmp_path, **changes))
    assert "config.json" in str(refused.value) or "model.safetensors" in str(refused.value)


def test_a_head_is_refused_and_a_pooler_left_unread(folders, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from attnserve.contract.model_folder import ModelError, read_model_folder

    copy = shutil.copytree(folders["gte"], tmp_path / "gte")
    tensors = load_file(copy / "model.safetensors")
    save_file({**tensors, "pooler.dense.weight": torch.zeros(64, 64)}, copy / "model.safetensors")
    assert read_model_folder(copy).architecture == "gte"
    save_file({**tensors, "lm_head.decoder.weight": torch.zeros(30528, 64)}, copy / "model.safetensors")
    with pytest.raises(ModelError, match="tensor lm_head.decoder.weight is not GteModel's"):
        read_model_folder(copy)
