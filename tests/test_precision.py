"""Issue 30: int8 and float16 exports. They convert the cached float32 export (seconds, no
tracing), round-trip through serving (embed, chunks, attention maps, /info and the metrics'
labels), key the export cache on the precision, and a precision a variant cannot take is exit 2
naming it."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export_helpers import EXPORTS_ROOT, HTTP_MAX_LENGTH, HTTP_VARIANT, get_export
from test_faults_startup import run_serve

# Two deployments the suite exports anyway (with attention maps): the HTTP tests' longformer,
# and test_schedules' local,full (a 16-token window in layers 0, 2, 4, full attention between).
DEPLOYMENTS = {"longformer": (HTTP_VARIANT, HTTP_MAX_LENGTH, {}), "local,full": ("local,full", 512, {"window": 16})}
TEXT = " ".join(f"word{i % 50} is a token of the test text" for i in range(40))  # about 400 tokens


def converted(variant: str, max_length: int, params: dict, precision: str):
    """(converted export, float32 export, PyTorch float32 encoder), checked against PyTorch."""
    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe

    base, encoder = get_export(variant, max_length, analysis=True, **params)
    recipe = Recipe.resolve(variant, params, max_length, analysis=True, precision=precision)
    export_dir = cached_export(EXPORTS_ROOT, recipe, verify=True, log=lambda message: None)
    return export_dir, base, encoder


@pytest.mark.parametrize("precision", ["int8", "float16"])
@pytest.mark.parametrize("deployment", list(DEPLOYMENTS))
def test_an_int8_or_float16_export_serves_embeddings_chunks_and_maps(deployment, precision):
    from fastapi.testclient import TestClient

    from attnserve.export.precision import MIN_COSINE
    from attnserve.service.app import create_app
    from attnserve.contract.export_format import read_manifest
    from attnserve.service.settings import Settings

    variant, max_length, params = DEPLOYMENTS[deployment]
    export_dir, base, encoder = converted(variant, max_length, params, precision)
    manifest = read_manifest(export_dir)
    assert manifest.precision == precision and manifest.verified["min_cosine_sentence_embedding"] >= MIN_COSINE[precision]
    # Every graph converted: the int8 ones hold int8 products, the float16 ones float16 weights.
    graphs = {name: getattr(manifest.graphs, name).file for name in type(manifest.graphs).model_fields
              if getattr(manifest.graphs, name) is not None}
    assert {"analysis", "collapse"} <= set(graphs)
    for file in graphs.values():
        ops, dtypes = graph_contents(export_dir / file)
        assert ("MatMulInteger" in ops) if precision == "int8" else (10 in dtypes), file  # 10: FLOAT16
    with TestClient(create_app(Settings(export_dir=export_dir, max_length=max_length))) as client:
        info = client.get("/info").json()
        assert info["precision"] == precision and info["variant"] == variant
        served = np.array(client.post("/embed", json={"inputs": TEXT}).json())[0]
        expected = encoder.embed([TEXT]).numpy()[0]
        assert float(served @ expected) >= MIN_COSINE[precision]
        if precision == "float16":
            assert float(served @ expected) >= 0.999
        chunks = client.post("/embed_chunks", json={"inputs": TEXT, "chunk_tokens": 128}).json()[0]
        assert len(chunks) >= 3 and all(abs(np.linalg.norm(c["embedding"]) - 1) < 1e-4 for c in chunks)
        layer = 0
        answer = client.post("/attention", json={"inputs": TEXT, "layer": layer, "format": "sparse"}).json()
        n = answer["n_tokens"]
        sums = np.zeros(n)
        np.add.at(sums, np.array(answer["rows"]), np.array(answer["values"]))
        assert np.allclose(sums, 1.0, atol=1e-3)  # each query's weights over the keys it reads
        if deployment == "local,full":  # layer 0 keeps its 16-token window
            assert np.abs(np.array(answer["rows"]) - np.array(answer["cols"])).max() <= 8
        metrics = client.get("/metrics").text
        assert f'precision="{precision}",route="/embed",variant="{variant}"' in metrics


def graph_contents(path) -> tuple[set[str], set[int]]:
    """The op types of an ONNX graph and the dtypes of its weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {node.op_type for node in model.graph.node}, {t.data_type for t in model.graph.initializer}


def test_the_export_cache_keys_on_precision():
    from attnserve.export.recipe import Recipe
    from attnserve.contract.export_format import export_name, read_manifest
    from attnserve.service.exports import export_path
    from attnserve.service.settings import Settings

    recipe = Recipe.resolve(HTTP_VARIANT, {}, HTTP_MAX_LENGTH)
    recipes = {p: recipe.at_precision(p).record() for p in ("float32", "int8", "float16")}
    names = {p: export_name(r) for p, r in recipes.items()}
    assert len(set(names.values())) == 3 and "-int8-" in names["int8"] and "-float16-" in names["float16"]
    assert {k for k in recipes["int8"] if recipes["int8"][k] != recipes["float32"][k]} == {"precision", "versions"}
    # A converted export sits where serving looks for that precision, and says what it is.
    export_dir, base, _ = converted(HTTP_VARIANT, HTTP_MAX_LENGTH, {}, "int8")
    assert export_dir.name == names["int8"] and base.name == names["float32"]
    manifest = read_manifest(export_dir)
    assert export_name(manifest.recipe) == export_dir.name and manifest.recipe_sha256 != read_manifest(base).recipe_sha256
    for precision, folder in (("int8", export_dir), ("float32", base)):
        settings = Settings(variant=HTTP_VARIANT, max_length=HTTP_MAX_LENGTH, models_dir=EXPORTS_ROOT, precision=precision)
        assert export_path(settings) == folder


def test_an_export_dir_of_another_precision_is_refused_where_one_is_named():
    from attnserve.contract.export_format import ExportError
    from attnserve.service.exports import check_export_fits
    from attnserve.service.settings import Settings

    export_dir, _, _ = converted(HTTP_VARIANT, HTTP_MAX_LENGTH, {}, "int8")
    check_export_fits(export_dir, Settings(export_dir=export_dir))  # none named: it serves its own
    with pytest.raises(ExportError, match="exported in int8, not float16"):
        check_export_fits(export_dir, Settings(export_dir=export_dir, precision="float16"))


def test_float16_keeps_index_arithmetic_in_float32(two_layer_minilm):
    """Linformer turns positions into gather indices through float arithmetic: rounded to
    float16, indices past 2,048 collide (onnxruntime.transformers.float16 fails here). On the
    parity test's two-layer export (tests/test_export_parity.py)."""
    from attnserve.export.exporter import convert_export
    from attnserve.export.recipe import Recipe
    from attnserve.contract.export_format import read_manifest

    base, encoder = get_export("linformer", 2050, model=two_layer_minilm)
    out = base.parent / f".{base.name}-float16-test"
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    try:
        recipe = Recipe.resolve("linformer", {}, 2050, model=two_layer_minilm, analysis=False, precision="float16")
        convert_export(base, out, recipe, encoder, log=lambda message: None)
        assert read_manifest(out).verified["min_cosine_sentence_embedding"] >= 0.999
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_a_precision_a_variant_cannot_take_is_exit_2_naming_it(tmp_path, capsys):
    from attnserve.models.cli import variants_table
    from attnserve.export.exporter import main

    assert main(["--variant", "lsh", "--precision", "float16", "--out", str(tmp_path / "x")]) == 2
    said = capsys.readouterr().err
    assert "lsh cannot be exported in float16: its hash buckets flip" in said and "it takes float32, int8" in said
    assert main(["--variant", "local,lsh", "--precision", "float16", "--print-recipe"]) == 2
    assert "its lsh layers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--variant", "local", "--precision", "int4", "--out", str(tmp_path / "y")])
    assert exit_.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert any(line.startswith("- lsh cannot be exported in float16:") for line in variants_table())
    # serve: refused before anything is exported, by the exporter's message.
    result = run_serve("--variant", "lsh", "--precision", "float16", "--models-dir", str(tmp_path / "models"))
    assert result.returncode == 2 and "lsh cannot be exported in float16" in result.stderr, result.stderr
    result = run_serve("--export-dir", str(tmp_path / "z"), env={"ATTNSERVE_PRECISION": "int4"})
    assert result.returncode == 2 and "precision" in result.stderr and "'float32', 'int8' or 'float16'" in result.stderr
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_bench_runtime_tabulates_each_precision_against_float32():
    from attnserve.bench.precision import parse_precisions, precision_table

    assert parse_precisions("int8") == ["float32", "int8"] and parse_precisions("float16,float32") == ["float32", "float16"]
    with pytest.raises(ValueError, match="valid: float32, int8, float16"):
        parse_precisions("int4")
    rows = [{"variant": "longformer", "length": 4096, "precision": "float32", "ms": 1500.0, "speedup": 1.0,
             "cosine_to_float32": 1.0, "products_free_ms": 900.0, "ceiling": 1500 / 900},
            {"variant": "longformer", "length": 4096, "precision": "int8", "ms": 1000.0, "speedup": 1.5,
             "cosine_to_float32": 0.991}]
    table = precision_table(rows, ["float32", "int8"])
    assert table[2] == "| longformer | 4096 | 1500.0 ms | 1000.0 ms (1.50x, 0.9910) | 900.0 ms (1.67x) |"


def test_bench_quality_scores_an_int8_export_beside_float32(tmp_path):
    """bench quality --precision on three documents: the int8 rows come from the export that
    serving finds (the local,full one the tests above convert)."""
    import argparse

    from attnserve.bench.quality import configure, quality_command

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--variants", "", "--schedule", "local,full", "--param", "local,full.window=16",
                              "--precision", "int8", "--limit", "3",
                              "--max-length", "512", "--no-baselines", "--no-cosine", "--poolings", "mean",
                              "--exports-dir", str(EXPORTS_ROOT), "--out", str(tmp_path)])
    with torch.no_grad():
        assert quality_command(args) == 0
    import csv

    rows = {(r["system"], r["representation"]): r for r in csv.DictReader(open(tmp_path / "quality.csv"))}
    # The export's tokenizer pads no batch: a short query's states are its own tokens' only,
    # the same beside a long text as alone (float32; int8 quantizes each batch's activations
    # with one scale, so there a text's vector moves a little with its batch).
    from attnserve.bench.precision import ExportedEncoder

    int8, base, _ = converted("local,full", 512, {"window": 16}, "int8")
    for export_dir, bound in ((base, 1e-4), (int8, None)):
        exported = ExportedEncoder(export_dir)
        ids = exported.tokenize(["short query", TEXT])
        assert len(ids[0]) == 4 and len(ids[1]) > 100
        together, alone = exported.token_states(ids)[0], exported.token_states(ids[:1])[0]
        assert together.shape == alone.shape
        if bound:
            assert np.abs(together - alone).max() < bound
        else:
            a, b = together.mean(0), alone.mean(0)
            assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.98
    # The int8 export also embeds each chunk alone: what its /embed_chunks serves by default.
    assert set(rows) == {(s, r) for s in ("local,full", "local,full@int8") for r in ("one vector", "late chunks MaxP")} | {
        ("local,full@int8", "naive chunks MaxP")}
    naive = rows[("local,full@int8", "naive chunks MaxP")]
    assert 1 / 3 <= float(naive["summary_mrr"]) <= 1 and 1 / 3 <= float(naive["needle_mrr"]) <= 1
    assert json.loads(rows[("local,full@int8", "one vector")]["params"]) == {"window": 16}
