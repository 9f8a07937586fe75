"""`attnserve adapt`: a tiny distillation run writes weights that load, export and serve the
same vectors; the training forward of every trained variant is its inference forward."""
from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess

import numpy as np
import pytest
import torch

from attnserve.models import load_encoder
from attnserve.train.adapt import Plan, adapt, trainable
from attnserve.models.registry import build_attention, make_config
from attnserve.data import TRAIN_DOCUMENTS, read_jsonl

MAX_LENGTH = 256


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    """The first 12 bundled training documents (8 to train on, 4 held out)."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for row in read_jsonl(TRAIN_DOCUMENTS, limit=12):
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def adapted(train_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapted")
    plan = Plan(variant="linformer", params={"k": 32}, max_length=MAX_LENGTH, data=str(train_file), out=str(out),
                minutes=5, window=128, batch=2, holdout=4, eval_seconds=0, max_steps=6, seed=0)
    return out, adapt(plan, log=lambda *a: None)


def test_adapt_writes_weights_record_and_plot(adapted):
    out, record = adapted
    assert {p.name for p in out.iterdir()} >= {"weights.safetensors", "adapt.json", "loss.png"}
    meta = json.loads((out / "adapt.json").read_text())
    assert meta == json.loads(json.dumps(record))
    assert meta["variant"] == "linformer" and meta["parameters"]["k"] == 32 and meta["max_length"] == MAX_LENGTH
    # The model the weights belong to (src/attnserve/models/weights.py refuses them on another).
    assert meta["model"]["name"] == "all-MiniLM-L6-v2" and len(meta["model"]["sha256"]) == 64
    assert meta["steps"] == 6 and len(meta["curve"]["loss"]) == 6
    # Scored before training and after every step (eval_seconds=0): best is the max of those.
    scores = meta["curve"]["held_out"]
    assert len(scores) == 7 and meta["held_out"]["before"] == pytest.approx(scores[0], abs=1e-5)
    assert meta["held_out"]["after"] == pytest.approx(max(scores), abs=1e-5)
    # Only linformer's E (shared by keys and values): one tensor per layer, 32 rows x 512 columns.
    assert meta["trained"] == {f"layers.{i}.attention.E": [32, MAX_LENGTH] for i in range(6)}
    assert meta["data"]["held_out"] == 4 and len(meta["data"]["held_out_ids"]) == 4
    # The held-out score by layer, before and after: one cosine per layer.
    by_layer = meta["held_out"]["by_layer"]
    assert len(by_layer["before"]) == len(by_layer["after"]) == 6
    assert all(0 < c <= 1 + 1e-5 for c in by_layer["before"] + by_layer["after"])


def test_layer_cosines_put_the_error_on_the_layer_that_differs():
    """Only layer 2 of the student differs from the teacher: every other layer scores 1, and
    layer 2 scores what the whole student does."""
    import copy

    from attnserve.train.adapt import layer_cosines

    teacher = load_encoder("full", 512)
    ids = [teacher.tokenize([r["text"]])[0][:300] for r in read_jsonl(TRAIN_DOCUMENTS, limit=5)]
    assert layer_cosines(teacher, teacher, ids) == pytest.approx([1.0] * 6, abs=1e-5)
    student = copy.deepcopy(teacher)
    student.layers[2] = load_encoder("local", 512, window=8).layers[2]
    calls = []
    cosines = layer_cosines(student, teacher, ids, batch=2, progress=calls.append)
    assert calls == [2, 2, 1]
    whole = float((student.embed_ids(ids) * teacher.embed_ids(ids)).sum(1).mean())
    assert whole < 0.999
    assert cosines == pytest.approx([1, 1, whole, 1, 1, 1], abs=1e-5)


def test_adapted_weights_load_and_change_only_the_variant(adapted):
    out, record = adapted
    base = load_encoder("linformer", MAX_LENGTH, k=32)
    tuned = load_encoder("linformer", MAX_LENGTH, weights=out, k=32)
    texts = ["a short text", "the kernel's memory management documentation " * 30]
    if record["held_out"]["after"] > record["held_out"]["before"]:
        assert not torch.allclose(base.embed(texts), tuned.embed(texts))
    changed = {n for n, p in tuned.state_dict().items() if not torch.equal(p, base.state_dict()[n])}
    assert changed and changed <= {f"layers.{i}.attention.{m}" for i in range(6) for m in "EF"}


def test_adapted_export_matches_pytorch(adapted, tmp_path):
    """Weights round-trip: adapt -> export --weights -> ONNX Runtime equals the PyTorch encoder."""
    import onnxruntime as ort

    from attnserve.models.api import pad_batch
    from attnserve.export.exporter import export_model
    from attnserve.export.recipe import Recipe

    out, _ = adapted
    export_model(Recipe.resolve("linformer", {"k": 32}, MAX_LENGTH, analysis=False, weights=out), tmp_path, log=lambda *a: None)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["weights"]["sha256"] == json.loads((out / "adapt.json").read_text())["weights_sha256"]
    encoder = load_encoder("linformer", MAX_LENGTH, weights=out, k=32)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for lengths in ([7], [130], [MAX_LENGTH], [MAX_LENGTH, 90, 3]):
        ids = [[101, *rng.integers(1000, 30000, n - 2).tolist(), 102] for n in lengths]
        input_ids, mask = pad_batch(ids)
        got = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": mask.numpy()})
        with torch.no_grad():
            want, hidden = encoder(input_ids, mask)
        assert np.abs(got[0] - want.numpy()).max() <= 1e-4
        real = mask.bool().numpy()
        assert np.abs(got[1][real] - hidden.numpy()[real]).max() <= 1e-4


@pytest.mark.parametrize("variant", ["linformer", "compressed", "sinkhorn", "synthesizer"])
def test_training_forward_is_the_inference_forward_and_has_gradients(variant):
    torch.manual_seed(0)
    attention = build_attention(make_config(variant, 512), 4, 32, 512)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 300, 32, generator=g) for _ in range(3))
    valid = torch.arange(300)[None] < torch.tensor([300, 170])[:, None]
    with torch.no_grad():
        inference, _ = attention.eval()(q, k, v, valid)
    training, _ = attention.train()(q, k, v, valid)
    assert torch.equal(training, inference)
    (training[valid[:, None, :, None].expand_as(training)] ** 2).sum().backward()
    grads = [p.grad for p in attention.parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_trainable_is_the_variant_parameters_only():
    encoder = load_encoder("sinkhorn", 512)
    assert set(trainable(encoder)) == {f"layers.{i}.attention.{n}" for i in range(6) for n in ("sort_projection", "identity_bonus")}
    assert trainable(load_encoder("longformer", 512)) == {}


def test_end_to_end_distillation_starts_from_weights_and_keeps_what_it_does_not_train(adapted, train_file, tmp_path):
    """--loss end-to-end from a layer-local run's weights, training the output projections too:
    the new directory holds E (trained again) and the output projections, loads alone, and
    differs from the start only in what this run trained."""
    start, _ = adapted
    plan = Plan(variant="linformer", params={"k": 32}, max_length=MAX_LENGTH, data=str(train_file), out=str(tmp_path),
                minutes=5, window=128, batch=2, holdout=4, eval_seconds=0, max_steps=3, seed=1, loss="end-to-end",
                also=("attention_out", "5.intermediate"), weights=str(start), lr=0.05)
    record = adapt(plan, log=lambda *a: None)
    assert record["loss"].startswith("end-to-end") and record["started_from"]["dir"] == str(start.resolve())
    # attention_out in every layer, intermediate (named with its layer) in layer 5 only.
    assert set(record["trained"]) == {f"layers.{i}.{m}" for i in range(6) for m in ("attention.E", "attention_out.weight", "attention_out.bias")} | {
        "layers.5.intermediate.weight", "layers.5.intermediate.bias"}
    assert all(np.isfinite(record["curve"]["loss"])) and record["steps"] == 3
    first = load_encoder("linformer", MAX_LENGTH, weights=start, k=32).state_dict()
    again = load_encoder("linformer", MAX_LENGTH, weights=tmp_path, k=32).state_dict()
    pretrained = load_encoder("linformer", MAX_LENGTH, k=32).state_dict()
    trained = {again[n].data_ptr() for n in record["trained"]}  # F is E (shared by keys and values)
    for name, tensor in again.items():
        if tensor.data_ptr() not in trained:  # untouched by this run: the starting weights (pretrained elsewhere)
            assert torch.equal(tensor, first[name]), name
    if record["held_out"]["after"] > record["held_out"]["before"]:  # a trained step was kept
        assert any(not torch.equal(again[n], pretrained[n]) for n in record["trained"] if "attention_out" in n)


def test_adapt_command_errors_name_what_to_change(train_file, tmp_path, capsys):
    """The CLI's main() in this process (each refusal comes before any training; a subprocess
    per case only added a start of Python and torch)."""
    from attnserve.cli import main

    def run(*args):
        try:
            status = main(["adapt", "variant", *args, "--holdout", "4", "--out", str(tmp_path / "o")])
        except SystemExit as exc:  # argparse's own refusals
            status = exc.code
        said = capsys.readouterr()
        return subprocess.CompletedProcess(args, status, said.out, said.err)

    fixed = run("--variant", "longformer", "--max-length", "512", "--data", str(train_file))
    assert fixed.returncode == 2 and "no parameters of its own" in fixed.stderr and "linformer" in fixed.stderr
    missing = run("--variant", "linformer", "--max-length", "512", "--data", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "nope.jsonl" in missing.stderr
    window = run("--variant", "linformer", "--max-length", "512", "--data", str(train_file), "--window", "4096")
    assert window.returncode == 2 and "--window" in window.stderr
    no_weights = run("--variant", "linformer", "--max-length", "512", "--data", str(train_file), "--weights", str(tmp_path / "none"))
    assert no_weights.returncode == 2 and str(tmp_path / "none") in no_weights.stderr
    long_loss = run("--variant", "local", "--param", "positions=learned", "--stage", "long", "--max-length", "1024",
                    "--data", str(train_file), "--loss", "end-to-end")
    assert long_loss.returncode == 2 and "--loss applies to stage distill only" in long_loss.stderr
    no_layer = run("--variant", "linformer", "--max-length", "512", "--data", str(train_file), "--also", "9.intermediate")
    assert no_layer.returncode == 2 and "--also 9.intermediate: no such module" in no_layer.stderr and "5.intermediate" in no_layer.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def adapted_long(train_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapted-long")
    plan = Plan(variant="local", params={"positions": "learned", "window": 128}, max_length=640, data=str(train_file),
                out=str(out), minutes=5, stage="long", batch=3, holdout=4, eval_seconds=0, max_steps=3, seed=0, lr=1e-2)
    return out, adapt(plan, log=lambda *a: None)


def test_long_stage_trains_only_the_offsets_and_keeps_short_inputs_pretrained(adapted_long):
    out, record = adapted_long
    assert record["stage"] == "long" and record["trained"] == {"embeddings.long_offsets": [512, 384]}
    assert record["steps"] == 3 and len(record["curve"]["held_out"]) == 4
    assert all(np.isfinite(record["curve"]["loss"]))
    pretrained = load_encoder("local", 640, window=128)
    tuned = load_encoder("local", 640, weights=out, positions="learned", window=128)
    # Whatever the offsets (the run may keep its initial zeros as the best checkpoint), only
    # tokens past 512 read them.
    with torch.no_grad():
        tuned.embeddings.long_offsets.add_(torch.randn(512, 384, generator=torch.Generator().manual_seed(0)))
    short = ["a short query", "the scheduler documentation " * 60]  # 3 and about 360 tokens
    assert torch.allclose(tuned.embed(short), pretrained.embed(short), atol=1e-6)
    long_text = ["memory management in the kernel " * 120]  # past 512 tokens
    assert not torch.allclose(tuned.embed(long_text), pretrained.embed(long_text), atol=1e-4)


def test_long_stage_needs_learned_positions_and_a_long_window(train_file, tmp_path):
    plan = Plan(variant="local", params={}, max_length=640, data=str(train_file), out=str(tmp_path), stage="long", holdout=4)
    with pytest.raises(ValueError, match="positions=learned"):
        adapt(plan)
    plan = dataclasses.replace(plan, params={"positions": "learned"}, window=512)
    with pytest.raises(ValueError, match="--window must be in 514..max_length 640"):
        adapt(plan)


def test_late_chunks_train_on_the_chunks_embed_chunks_serves():
    """One definition of chunk bounds: the training loss's late chunks are /embed_chunks'
    (contract.pooling.token_chunks, [CLS] in the first chunk, [SEP] in the last)."""
    from attnserve.contract.pooling import pool_chunks, token_chunks
    from attnserve.train.adapt import late_chunks, max_chunk_scores

    hidden = torch.randn(2, 1 + 10, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 7:] = 0  # the second document: [CLS] + 5 tokens + [SEP]
    chunks, valid = late_chunks(hidden, mask, chunk_tokens=4)
    assert chunks.shape == (2, 3, 4) and valid.tolist() == [[True, True, True], [True, True, False]]
    for row, tokens in enumerate((11, 7)):
        offsets = [(0, 0)] + [(i, i + 1) for i in range(tokens - 2)] + [(0, 0)]
        served = pool_chunks(hidden[row, :tokens].numpy(), token_chunks(offsets, tokens - 2, 4))
        assert np.allclose(chunks[row, : len(served)].numpy(), served, atol=1e-6)
    assert torch.allclose(chunks[1, 1], torch.nn.functional.normalize(hidden[1, 5:7].mean(0), dim=0), atol=1e-6)
    queries = chunks[:, 0]
    scores = max_chunk_scores(queries, chunks, valid)
    assert torch.allclose(scores.diagonal(), torch.ones(2), atol=1e-6)


def test_the_shipped_adapted_weights_load_and_say_what_they_were_trained_on():
    from pathlib import Path

    from attnserve.contract.export_format import sha256

    presets = sorted((Path(__file__).resolve().parents[1] / "weights").glob("*/adapt.json"))
    assert {p.parent.name for p in presets} >= {"linformer", "compressed", "sinkhorn", "longformer-long"}
    for path in presets:
        meta = json.loads(path.read_text())
        # The bundled kernel pages, or them with the Debian manuals of research.training_docs
        # (the README's commands): never the dev set's man pages.
        assert meta["data"]["file"] in {"data/longdocs-train.jsonl.gz", "train-mix.jsonl.gz"}, path
        assert meta["held_out"]["after"] >= meta["held_out"]["before"]
        assert sha256(path.parent / "weights.safetensors") == meta["weights_sha256"]
        encoder = load_encoder(meta["variant"], 1024, weights=path.parent, **meta["parameters"])
        assert encoder.weights["tensors"] == len(meta["trained"])
