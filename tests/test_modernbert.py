"""ModernBERT folders (issue: long-context encoders people serve): its own attention served as a
schedule of attnserve's variants (full on global layers, a real 16-token window on local ones,
RoPE applied to queries and keys in each layer), equal to transformers' ModernBertModel plus the
folder's pooling in PyTorch, in the ONNX export and over HTTP; a schedule replaces the global
layers past the trained length; what cannot work is refused naming the remedy.

The folder is small and random (tests/model_folders.modernbert_folder: 4 layers, hidden 64,
global every 3rd, trained length 2,048), so the export goes through the shared test cache."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export_helpers import EXPORTS_ROOT
from model_folders import modernbert_folder, sentence_transformers_vectors

TEXTS = ["a short text", "a longer passage about rotary positions " * 30, "the whole document, again and again. " * 170]
WINDOW = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # The folder's name is part of the export recipe: the same name every run keeps the cache warm.
    return modernbert_folder(tmp_path_factory.mktemp("models") / "modernbert-mean", window=WINDOW)


@pytest.fixture(scope="module")
def exported(folder):
    """(export dir, PyTorch encoder) of the folder's own attention at its trained length, maps included."""
    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe

    torch.set_num_threads(2)
    recipe = Recipe.resolve(model=folder)
    return cached_export(EXPORTS_ROOT, recipe, log=lambda message: None), recipe.encoder()


def test_the_folder_is_read_in_either_config_spelling(folder, tmp_path):
    """transformers 5 writes layer_types and rope_parameters; gte-modernbert-base and the other
    published folders have transformers 4's global_attn_every_n_layers and *_rope_theta."""
    import shutil

    from attnserve.contract.model_folder import read_model_folder

    model = read_model_folder(folder)
    assert (model.architecture, model.layer_attention, model.local_window) == ("modernbert", ("full", "local", "local", "full"), WINDOW)
    assert (model.default_variant, model.default_max_length, model.max_seq_length) == ("native", 2048, 2048)
    assert (model.detail("global_rope_theta"), model.detail("local_rope_theta")) == (160000.0, 10000.0)
    old = shutil.copytree(folder, tmp_path / "old")
    config = json.loads((old / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        config.pop(key)
    config.update(global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0)
    (old / "config.json").write_text(json.dumps(config))
    again = read_model_folder(old)
    assert (again.layer_attention, again.details) == (model.layer_attention, model.details)


def test_native_is_the_models_own_attention_and_matches_sentence_transformers(folder):
    """Default variant: native, spelled as the schedule it is; pooled vectors of a padded batch
    of texts that cross the window many times equal sentence-transformers' (transformers'
    ModernBertModel and the folder's mean and Normalize), and the default pooling (opening, whose
    opening is the model's trained length) is the mean for them."""
    from attnserve.models import load_encoder
    from attnserve.models.attention.full import FullAttention
    from attnserve.models.attention.local import SlidingWindowAttention

    encoder = load_encoder(model=folder)
    assert encoder.attention_config.variant == "full,local*2,full" and encoder.max_length == 2048
    assert [type(layer.attention) for layer in encoder.layers] == [FullAttention, SlidingWindowAttention, SlidingWindowAttention, FullAttention]
    assert encoder.layers[1].attention.config.window == WINDOW
    assert encoder.default_pooling.opening_tokens == 2048
    lengths = [len(ids) for ids in encoder.tokenize(TEXTS)]
    assert lengths[0] < WINDOW < 4 * WINDOW < lengths[1] and lengths[2] > 1000
    reference = sentence_transformers_vectors(folder, TEXTS).numpy()
    assert np.abs(encoder.embed(TEXTS, normalize=encoder.shape.normalize).numpy() - reference).max() <= 1e-4


def test_the_export_and_the_server_give_the_same_vectors(folder, exported):
    from fastapi.testclient import TestClient

    from attnserve.service.app import create_app
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings

    export_dir, encoder = exported
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["variant"] == "full,local*2,full" and manifest["layer_variants"] == ["full", "local", "local", "full"]
    assert manifest["model"]["architecture"] == "modernbert" and manifest["verified"]["exact"]
    reference = sentence_transformers_vectors(folder, TEXTS).numpy()
    runner = OnnxRunner(export_dir, intra_op_threads=2)
    ids = encoder.tokenize(TEXTS)
    width = runner.padded_length(max(len(i) for i in ids))
    batch, mask = np.zeros((len(ids), width), np.int64), np.zeros((len(ids), width), np.int64)
    for row, i in enumerate(ids):
        batch[row, : len(i)], mask[row, : len(i)] = i, 1
    assert np.abs(runner.embed(batch, mask) - reference).max() <= 1e-4
    app = create_app(Settings(model=folder, export_dir=export_dir), runner=runner, tokenizer_path=export_dir / "tokenizer.json")
    with TestClient(app) as client:
        info = client.get("/info").json()
        assert info["variant"] == "full,local*2,full" and info["model"]["architecture"] == "modernbert"
        assert info["max_length"] == 2048 and info["past_trained_length"] is False and info["pooling"]["opening_tokens"] == 2048
        body = client.post("/v1/embeddings", json={"input": TEXTS, "model": "m"}).json()
        served = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        assert np.abs(served - reference).max() <= 1e-4
        # The maps: the band on a local layer (|i - j| <= 8), full rows on a global one.
        text = TEXTS[1]
        local = client.post("/attention", json={"inputs": text, "layer": 1}).json()
        rows, cols = np.array(local["rows"]), np.array(local["cols"])
        n = local["n_tokens"]
        assert np.abs(rows - cols).max() == WINDOW // 2 and len(rows) == sum(min(n, i + WINDOW // 2 + 1) - max(0, i - WINDOW // 2) for i in range(n))
        full = client.post("/attention", json={"inputs": text, "layer": 0}).json()
        assert len(full["rows"]) == n * n


def test_a_schedule_replaces_the_global_layers_past_the_trained_length(folder):
    """native in the layers a schedule names it; past the 2,048 trained positions only where
    every layer's span is bounded."""
    from attnserve.export.recipe import Recipe
    from attnserve.models.schedule import layer_variants

    long = Recipe.resolve("longformer,native,native", max_length=4096, model=folder)
    assert layer_variants(long.config, 4) == ["longformer", "local", "local", "longformer"]
    assert long.config.configs["local"].window == WINDOW
    with pytest.raises(ValueError, match=r"max_length 4096 is past the 2048 positions .* trained at.*full does not.*--variant longformer,native\*2\)"):
        Recipe.resolve(max_length=4096, model=folder)
    with pytest.raises(ValueError, match="positions are rotary"):
        Recipe.resolve(params={"positions": "grouped"}, model=folder).encoder()


def test_a_variant_that_cannot_carry_rotary_positions_is_exit_2_naming_those_that_can(folder, capsys):
    from attnserve.export.exporter import main

    for variant in ("linformer", "compressed*2,native"):  # refused with the recipe: before serve would export
        assert main(["--model", str(folder), "--variant", variant, "--print-recipe"]) == 2
        said = capsys.readouterr().err.strip().splitlines()
        refused = variant.partition("*")[0]
        assert len(said) == 1 and f"which {refused} cannot carry" in said[0], said
        assert "the variants that can: full, local, strided, global, longformer, bigbird, lsh, sinkhorn" in said[0]


@pytest.mark.parametrize("case", ["missing", "shape", "head"])
def test_a_broken_folder_is_exit_2_naming_the_tensor_and_nothing_is_written(folder, tmp_path, capsys, case):
    import shutil

    from safetensors.torch import load_file, save_file

    from attnserve.export.exporter import main

    broken = shutil.copytree(folder, tmp_path / "broken")
    tensors = load_file(str(broken / "model.safetensors"))
    name = {"missing": "layers.2.mlp.Wi.weight", "shape": "layers.1.attn.Wo.weight", "head": "head.dense.weight"}[case]
    if case == "missing":
        del tensors[name]
    elif case == "shape":
        tensors[name] = tensors[name][:, :32].contiguous()
    else:
        tensors[name] = torch.zeros(64, 64)
    save_file(tensors, str(broken / "model.safetensors"))
    out = tmp_path / "out"
    assert main(["--model", str(broken), "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert "model.safetensors" in said and name in said
    assert not out.exists()


def test_every_variant_that_carries_rotary_positions_runs_on_it(folder):
    """In every layer, each variant not refused runs the model (finite unit vectors); linformer,
    compressed and the synthesizer are refused."""
    from attnserve.models import load_encoder
    from attnserve.models.registry import VARIANTS

    carried = [name for name, cls in VARIANTS.items() if not cls.rotary_refused]
    assert sorted(set(VARIANTS) - set(carried)) == ["compressed", "linformer", "synthesizer"]
    for name in carried:
        vectors = load_encoder(name, 512, model=folder).embed(TEXTS[:2])
        assert torch.isfinite(vectors).all() and torch.allclose(vectors.norm(dim=1), torch.ones(2), atol=1e-5), name


def test_bench_encoder_times_the_folder_against_transformers(folder, tmp_path):
    """`attnserve bench encoder --model DIR`, the command behind docs/results/modernbert.md, on
    the small folder at one short length: the native deployment's vector equals transformers'
    pooled one, both systems get a time and a peak, and results.json says what ran it. Its export
    (no maps, max_length the longest length) is kept in the suite's export cache."""
    import subprocess
    import sys

    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "attnserve", "bench", "encoder", "--model", str(folder), "--lengths", "100",
                           "--deployment", "native", "--threads", "1", "--repeats", "1", "--exports-dir", str(EXPORTS_ROOT),
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| native | 100 |" in done.stdout and "| transformers | 100 |" in done.stdout, done.stdout
    report = json.loads((out / "results.json").read_text())
    rows = {row["system"]: row for row in report["rows"]}
    assert sorted(rows) == ["native", "transformers"] and {row["tokens"] for row in rows.values()} == {100}
    assert rows["native"]["schedule"] == "full,local*2,full" and rows["native"]["max_abs_diff_to_transformers"] <= 1e-4
    assert all(row["seconds"] > 0 and row["peak_extra_bytes"] > 0 for row in rows.values()), rows
    assert report["model"]["architecture"] == "modernbert" and report["threads"] == 1 and report["commit"]
    assert all(report["versions"][name] for name in ("attnserve", "onnxruntime-gpu", "torch", "transformers")), report["versions"]
