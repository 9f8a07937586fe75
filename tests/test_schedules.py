"""Attention schedules, a variant per layer (src/attnserve/models/schedule.py): parsing and its errors, the
parameters of each variant, weights landing only in their variant's layers, and a schedule
exported with ONNX parity and served, each layer's attention map showing its own pattern."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from attnserve.models import load_encoder
from attnserve.models.attention.full import FullAttention
from attnserve.models.attention.linformer import LinformerAttention
from attnserve.models.attention.local import SlidingWindowAttention
from attnserve.models.attention.longformer import LongformerAttention
from attnserve.models.registry import cost, exact_up_to, length_multiple, make_config
from attnserve.models.weights import WeightsError

# A schedule cheap to export whose two layers' maps differ at a glance: a 16-token window
# (8 either side) in layers 0, 2, 4 and full attention in layers 1, 3, 5.
SCHEDULE, WINDOW, MAX_LENGTH = "local,full", 16, 512


@pytest.mark.parametrize("text, problem", [
    ("performer*5,longformer", "unknown attention variant 'performer'"),
    ("local*0,full", "the count after * must be a positive integer (got '0')"),
    ("local*two", "the count after * must be a positive integer (got 'two')"),
    ("local,local,local,full", "covers 4 layers, which does not divide the model's 6"),
    ("local,,full", "has an empty entry"),
])
def test_a_bad_schedule_is_an_error_naming_the_problem_and_the_valid_forms(text, problem):
    with pytest.raises(ValueError) as raised:
        make_config(text, 4096)
    assert problem in str(raised.value) and "NAME*K" in str(raised.value)


def test_a_bad_schedule_is_exit_2_on_the_command_line(capsys):
    from attnserve.models.cli import configure, variants_command
    from attnserve.export.exporter import main as export_main

    assert export_main(["--variant", "local*0,full", "--print-recipe"]) == 2
    assert "count after * must be a positive integer" in capsys.readouterr().err
    import argparse

    parser = argparse.ArgumentParser()
    configure(parser)
    assert variants_command(parser.parse_args(["--schedule", "local,local,local,full"])) == 2
    assert "does not divide the model's 6" in capsys.readouterr().err


def test_spellings_of_one_schedule_are_one_config_and_a_uniform_one_is_the_plain_variant():
    from attnserve.export.recipe import Recipe

    assert make_config("local,local,full", 4096).variant == "local*2,full"
    assert make_config("local*2,full,local,local,full", 4096) == make_config("local,local,full", 4096)
    assert make_config("longformer*6", 4096) == make_config("longformer", 4096)
    # What recipes, manifests and adapt.json record makes the same config again.
    config = make_config("linformer*5,longformer", 4096, window=128)
    assert config.as_params()["longformer.window"] == 128 and make_config(config.variant, 4096, **config.as_params()) == config
    name = Recipe.resolve("linformer*5,longformer", {}, 4096).name()
    assert name.startswith("linformer-x5.longformer-L4096-")  # a folder name: no * or ,


def test_parameters_reach_the_variants_that_take_them():
    config = make_config("linformer*5,longformer", 4096, **{"window": "128", "linformer.k": 64, "positions": "grouped"})
    assert config.configs["longformer"].window == 128 and config.configs["linformer"].k == 64
    assert config.positions == "grouped" and all(c.positions == "grouped" for c in config.configs.values())
    with pytest.raises(ValueError, match="positions applies to every layer"):
        make_config("linformer*5,longformer", 4096, **{"linformer.positions": "grouped"})
    with pytest.raises(ValueError, match="'bigbird' is not a variant of this schedule"):
        make_config("linformer*5,longformer", 4096, **{"bigbird.random_blocks": 2})
    with pytest.raises(ValueError, match=r"unknown parameter windw .*linformer: k, sharing; longformer: global_tokens, window"):
        make_config("linformer*5,longformer", 4096, windw=3)


def test_each_layer_runs_its_variant_and_the_facts_combine_the_layers():
    encoder = load_encoder("linformer*5,longformer", 4096)
    kinds = [type(layer.attention) for layer in encoder.layers]
    assert kinds == [LinformerAttention] * 5 + [LongformerAttention]
    config = make_config("local,full", 4096, window=WINDOW)
    assert [type(layer.attention) for layer in load_encoder("local,full", 512, window=WINDOW).layers] == [SlidingWindowAttention, FullAttention] * 3
    assert length_multiple(config) == length_multiple(make_config("local", 4096, window=WINDOW))
    assert exact_up_to(config, 4096) == exact_up_to(make_config("local", 4096, window=WINDOW), 4096) < 4096
    assert cost(config) == "3 x O(N * window) + 3 x O(N^2)"


def test_weights_land_only_in_the_layers_of_their_variant(caplog):
    plain = load_encoder("linformer", 4096, weights="weights/linformer")
    with caplog.at_level(logging.WARNING, logger="attnserve.models.weights"):
        mixed = load_encoder("linformer*5,longformer", 4096, weights="weights/linformer")
    pretrained = load_encoder("linformer", 4096)
    for i in range(5):
        assert torch.equal(mixed.layers[i].attention.E, plain.layers[i].attention.E)
        assert not torch.equal(mixed.layers[i].attention.E, pretrained.layers[i].attention.E)
    assert not any(name.startswith("layers.5.attention.") for name, _ in mixed.named_parameters())
    assert mixed.weights["unused"] == ["layers.5.attention.E"]
    said = [r.getMessage() for r in caplog.records if "unused" in r.getMessage()]
    assert len(said) == 1 and "layers.5.attention.E" in said[0]
    with pytest.raises(WeightsError, match="were trained for linformer, not longformer"):
        load_encoder("longformer", 4096, weights="weights/linformer")


@pytest.fixture(scope="module")
def exported():
    from export_helpers import get_export

    return get_export(SCHEDULE, MAX_LENGTH, analysis=True, window=WINDOW)


def test_a_schedule_exports_with_parity(exported):
    from attnserve.contract.export_format import pad_to
    from attnserve.export.verify import EMBEDDING_TOL, ort_session
    from attnserve.models.registry import length_multiple
    from export_helpers import padded_batch

    export_dir, encoder = exported
    session = ort_session(export_dir / "model.onnx")
    multiple = length_multiple(encoder.attention_config)
    for lengths in ([300], [77, 200, 131]):
        ids, mask = padded_batch(lengths, seed=len(lengths))
        with torch.no_grad():
            expected = encoder(torch.from_numpy(ids), torch.from_numpy(mask))[0].numpy()
        got = session.run(["sentence_embedding"], dict(zip(("input_ids", "attention_mask"), pad_to(ids, mask, multiple))))[0]
        assert np.abs(got - expected).max() <= EMBEDDING_TOL


def test_a_served_schedule_shows_each_layer_its_own_pattern(exported):
    from fastapi.testclient import TestClient

    from attnserve.service.app import create_app
    from attnserve.service.settings import Settings

    export_dir, encoder = exported
    text = " ".join(f"word{i % 50}" for i in range(120))
    with TestClient(create_app(Settings(export_dir=export_dir, max_length=MAX_LENGTH))) as client:
        info = client.get("/info").json()
        assert info["variant"] == "local,full" and info["layer_variants"] == ["local", "full"] * 3
        expected = encoder.embed([text]).numpy()
        served = np.array(client.post("/embed", json={"inputs": text}).json())
        assert np.abs(served - expected).max() <= 1e-4
        maps = {}
        for layer in (0, 1):
            answer = client.post("/attention", json={"inputs": text, "layer": layer, "format": "sparse"}).json()
            assert answer["layer_variant"] == info["layer_variants"][layer]
            maps[layer] = answer
    local, full = maps[0], maps[1]
    n = local["n_tokens"]
    reach = np.abs(np.array(local["rows"]) - np.array(local["cols"]))
    assert reach.max() <= WINDOW // 2 and len(local["values"]) < n * (WINDOW + 1)
    assert len(full["values"]) == n * n  # every query over every token


def test_bench_runtime_gives_a_schedule_as_ratios_to_full_and_its_pure_variants():
    from attnserve.bench.runtime import schedule_ratios

    rows = [{"variant": v, "length": n, "ort_ms": ms * n / 1024} for v, ms in
            (("full", 40.0), ("linformer", 10.0), ("longformer", 20.0), ("linformer*5,longformer", 12.0)) for n in (1024, 4096)]
    rows.append({"variant": "full", "length": 16384, "skipped": "needs memory"})
    lines = schedule_ratios(rows, ["linformer*5,longformer"], [1024, 4096, 16384])
    assert "| linformer*5,longformer | full | 0.30x | 0.30x | - |" in lines
    assert "| linformer*5,longformer | linformer | 1.20x | 1.20x | - |" in lines
    assert "| linformer*5,longformer | longformer | 0.60x | 0.60x | - |" in lines


def test_adapt_trains_the_learned_layers_of_a_schedule_and_its_weights_serve_that_schedule(tmp_path):
    import gzip
    import json

    from attnserve.train.adapt import Plan, adapt
    from attnserve.data import TRAIN_DOCUMENTS, read_jsonl

    data = tmp_path / "train.jsonl.gz"
    with gzip.open(data, "wt") as f:
        for row in read_jsonl(TRAIN_DOCUMENTS, limit=8):
            f.write(json.dumps(row) + "\n")
    params = {"linformer.k": 32}
    plan = Plan(variant="linformer*5,longformer", params=params, max_length=256, data=str(data), out=str(tmp_path / "w"),
                minutes=5, window=128, batch=2, holdout=4, eval_seconds=0, max_steps=2, seed=0)
    record = adapt(plan, log=lambda *a: None)
    assert record["variant"] == "linformer*5,longformer"
    assert record["trained"] == {f"layers.{i}.attention.E": [32, 256] for i in range(5)}
    assert make_config(record["variant"], 256, **record["parameters"]).configs["linformer"].k == 32
    encoder = load_encoder("linformer*5,longformer", 256, weights=tmp_path / "w", **params)
    assert encoder.weights["tensors"] == 5 and encoder.weights["unused"] == []
    with pytest.raises(WeightsError, match="trained for linformer\\*5,longformer, not linformer"):
        load_encoder("linformer", 256, weights=tmp_path / "w", k=32)


def test_by_layer_against_a_deployment_profiles_whole_documents_against_it():
    """bench quality --by-layer-against V: one layer the variant's, the others V's, on the whole
    (cut) documents. Against a schedule that holds the variant in layer 0 only, layer 0 is exact."""
    import argparse

    from attnserve.bench.quality import layer_row

    encoder = load_encoder("local", 512, window=WINDOW)
    encodings = encoder.tokenizer.encode_batch([" ".join(f"w{i}" for i in range(300)), "a short one"])
    args = argparse.Namespace(max_length=512, by_layer_against="local,full*5")
    teacher = load_encoder("local,full*5", 512, window=WINDOW)
    row = layer_row("local", {"window": WINDOW}, encodings, args, teacher)
    assert row["layer_0"] == pytest.approx(1.0, abs=1e-5)
    assert all(row[f"layer_{i}"] < 0.9999 for i in range(1, 6))  # a 16-token window where full attention was
