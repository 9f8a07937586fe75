"""Adapted weights end to end: a weights directory written by hand (a compressed encoder's
convolutions perturbed with a fixed seed) loads into load_encoder, exports, serves and benches
as what was saved; every way a directory can fail to fit is a WeightsError naming the file.
One export (compressed, 512 tokens, through the serving path) is shared by the tests."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from export_helpers import EXPORTS_ROOT, padded_batch

from attnserve.models import load_encoder
from attnserve.models.weights import META_FILE, WEIGHTS_FILE, WeightsError, load_weights, save_weights
from attnserve.contract.export_format import sha256

VARIANT, OTHER, MAX_LENGTH = "compressed", "linformer", 512
TEXTS = ["Adapted weights change what the attention reads.", "word " * 300]


def perturbed(seed: int, variant: str = VARIANT):
    """The variant's encoder with every attention parameter moved by a seeded random amount
    (a tenth of the parameter's mean magnitude), and the names of what moved."""
    encoder = load_encoder(variant, MAX_LENGTH)
    names = [name for name in encoder.state_dict() if ".attention." in name]
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in encoder.named_parameters():
            if ".attention." in name:
                scale = 0.1 * float(parameter.abs().mean()) + 1e-3
                parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return encoder, names


def write_weights(out, seed: int, variant: str = VARIANT):
    encoder, names = perturbed(seed, variant)
    digest = save_weights(encoder, out, names)
    meta = {"variant": variant, "parameters": dataclasses.asdict(encoder.attention_config), "max_length": MAX_LENGTH, "seed": seed}
    (out / META_FILE).write_text(json.dumps(meta))
    return encoder, names, digest


@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    """(weights dir, the perturbed encoder it was saved from, its sha256)."""
    out = tmp_path_factory.mktemp("weights")
    encoder, _, digest = write_weights(out, seed=0)
    return out, encoder, digest


@pytest.fixture(scope="module")
def served_export(adapted):
    """The export `attnserve serve --weights DIR` makes on its first start, and its settings.
    The weights are seeded, so their sha256 and the recipe are the same every run: the suite's
    export cache keeps the export between runs, as a server's models_dir does."""
    from attnserve.service.exports import ensure_export
    from attnserve.service.settings import Settings

    torch.set_num_threads(2)
    settings = Settings(variant=VARIANT, max_length=MAX_LENGTH, models_dir=EXPORTS_ROOT, weights=adapted[0])
    return ensure_export(settings), settings


def test_load_encoder_with_weights_reproduces_the_saved_encoder(adapted):
    weights_dir, saved, digest = adapted
    loaded = load_encoder(VARIANT, MAX_LENGTH, weights=weights_dir)
    pretrained = load_encoder(VARIANT, MAX_LENGTH)
    assert torch.equal(loaded.embed(TEXTS), saved.embed(TEXTS))
    assert (loaded.embed(TEXTS) - pretrained.embed(TEXTS)).abs().max() > 1e-3
    assert loaded.weights["sha256"] == digest == sha256(weights_dir / WEIGHTS_FILE)
    assert loaded.weights["adapt"]["seed"] == 0 and pretrained.weights is None


def test_tied_tensors_are_stored_once_and_load_into_both_names(tmp_path):
    from safetensors.torch import load_file

    saved, names, _ = write_weights(tmp_path, seed=2, variant=OTHER)
    state = saved.state_dict()
    storages = {state[name].untyped_storage().data_ptr() for name in names}
    stored = load_file(str(tmp_path / WEIGHTS_FILE))
    assert len(stored) == len(storages) < len(names)  # linformer's sharing="kv": E and F are one tensor
    loaded = load_encoder(OTHER, MAX_LENGTH, weights=tmp_path)
    for name in names:
        assert torch.equal(loaded.state_dict()[name], state[name]), name
    assert torch.equal(loaded.embed(TEXTS), saved.embed(TEXTS))


def test_the_same_tensors_save_to_the_same_bytes(adapted, tmp_path):
    """safetensors writes its metadata (the model's name and sha256) in a random order per
    save: each save of the same tensors had one of two sha256s, so an export recipe keyed on
    the weights missed the cache every other run. Eight saves are one file."""
    from safetensors import safe_open

    _, encoder, digest = adapted
    names = [name for name in encoder.state_dict() if ".attention." in name]
    digests = {save_weights(encoder, tmp_path / str(i), names) for i in range(8)}
    assert digests == {digest}
    with safe_open(str(tmp_path / "0" / WEIGHTS_FILE), "pt") as f:
        assert f.metadata() == {"model_name": "all-MiniLM-L6-v2", "model_sha256": encoder.model.sha256}
        assert torch.equal(f.get_tensor(names[0]), encoder.state_dict()[names[0]])


def test_position_tables_keep_the_trained_rows_and_load_into_any_max_length(tmp_path):
    """The synthesizer's R1/R2 have a row per position: adapted weights keep the rows training
    reached and load into shorter and longer encoders (the other rows stay as they start);
    a table of another rank is still refused."""
    from safetensors.torch import load_file, save_file

    saved, names, _ = write_weights(tmp_path, seed=3, variant="synthesizer")
    save_weights(saved, tmp_path, names, position_rows=64)
    stored = load_file(str(tmp_path / WEIGHTS_FILE))
    assert {tuple(t.shape) for t in stored.values()} == {(1, 64, 32)} and len(stored) == 12
    for max_length in (32, 1024):
        start = load_encoder("synthesizer", max_length).state_dict()
        loaded = load_encoder("synthesizer", max_length, weights=tmp_path).state_dict()
        rows = min(64, max_length)
        for name in names:
            assert torch.equal(loaded[name][:, :rows], saved.state_dict()[name][:, :rows]), name
            assert torch.equal(loaded[name][:, rows:], start[name][:, rows:]), name
    # A short text reads positions below 64 only: the same vectors as the saved encoder.
    short = ["a sentence of a few words"]
    assert torch.allclose(load_encoder("synthesizer", 1024, weights=tmp_path).embed(short), saved.embed(short), atol=1e-6)
    other_rank = tmp_path / "rank"
    other_rank.mkdir()
    save_file({names[0]: torch.zeros(1, 64, 16)}, str(other_rank / WEIGHTS_FILE))
    with pytest.raises(WeightsError, match=r"has shape \(1, 64, 16\)"):
        load_encoder("synthesizer", 1024, weights=other_rank)


def test_export_with_weights_matches_pytorch_and_records_them(adapted, served_export):
    from safetensors.torch import load_file

    from attnserve.service.runtime import OnnxRunner

    weights_dir, _, digest = adapted
    export_dir, _ = served_export
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["weights"]["sha256"] == digest == sha256(weights_dir / WEIGHTS_FILE)
    assert manifest["weights"]["tensors"] == len(load_file(str(weights_dir / WEIGHTS_FILE)))
    # The folder the export was made from: this run's, or an earlier run's (the export is cached).
    recorded = Path(manifest["weights"]["dir"])
    assert recorded.is_absolute() and recorded.name == weights_dir.name
    assert (export_dir / META_FILE).read_bytes() == (weights_dir / META_FILE).read_bytes()
    assert manifest["files"][META_FILE]["sha256"] == sha256(weights_dir / META_FILE)

    encoder = load_encoder(VARIANT, MAX_LENGTH, weights=weights_dir)
    runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=2)
    for lengths in ([77], [MAX_LENGTH], [400, 130, 13]):
        ids, mask = padded_batch(lengths, seed=sum(lengths))
        out = runner.run(ids, mask, ("sentence_embedding",))
        with torch.no_grad():
            expected, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
        diff = np.abs(out["sentence_embedding"] - expected.numpy()).max()
        assert diff <= 1e-4, f"{lengths}: embedding max abs diff {diff:.2e}"


def test_service_names_serves_and_reports_the_weights(adapted, served_export, tmp_path):
    from fastapi.testclient import TestClient

    from attnserve.service.app import create_app
    from attnserve.service.exports import ensure_export, export_name, export_path, settings_recipe
    from attnserve.service.settings import Settings

    weights_dir, _, digest = adapted
    export_dir, settings = served_export
    plain = Settings(variant=VARIANT, max_length=MAX_LENGTH, models_dir=settings.models_dir)
    assert export_dir == export_path(settings) != export_path(plain)
    weighted, pretrained = settings_recipe(settings), settings_recipe(plain)  # each asks the exporter, a process of its own
    assert export_dir.name == export_name(weighted) and weighted["weights_sha256"] == digest
    assert export_path(plain).name == export_name(pretrained) and pretrained["weights_sha256"] is None
    assert ensure_export(settings) == export_dir  # found again by its name, not exported twice

    # /info through the whole serving path: settings -> export found by name -> runner.
    with TestClient(create_app(settings.model_copy(update={"providers": ["CPUExecutionProvider"]}))) as client:
        info = client.get("/info").json()
        assert info["weights_sha256"] == digest and info["variant"] == VARIANT
        assert client.post("/embed", json={"inputs": TEXTS[0]}).status_code == 200

    # An export directory given explicitly must hold the weights named with it.
    other = tmp_path / "other"
    _, _, other_digest = write_weights(other, seed=1)
    with pytest.raises(WeightsError, match="manifest.json") as raised:
        ensure_export(Settings(export_dir=export_dir, weights=other))
    assert other_digest[:10] in str(raised.value)
    assert ensure_export(Settings(export_dir=export_dir, weights=weights_dir)) == export_dir


def test_serving_finds_the_weighted_export_without_torch(adapted, served_export):
    export_dir, settings = served_export
    script = f"""
import sys
class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "safetensors") or name.startswith("attnserve.models"):
            raise ImportError(name + " is blocked: serving must not need it")
sys.meta_path.insert(0, BlockTorch())
from attnserve.service.exports import ensure_export
from attnserve.service.settings import Settings
print(ensure_export(Settings(variant={VARIANT!r}, max_length={MAX_LENGTH}, models_dir={str(settings.models_dir)!r}, weights={str(adapted[0])!r})))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(export_dir)


def test_weights_setting_from_flag_and_environment(monkeypatch, tmp_path):
    import argparse

    from attnserve.service.settings import Settings, add_settings_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    assert settings_from_args(parser.parse_args(["--weights", str(tmp_path)])).weights == tmp_path
    assert Settings().weights is None
    monkeypatch.setenv("ATTNSERVE_WEIGHTS", "~/adapted")
    assert Settings().weights == (tmp_path.home() / "adapted")


def test_missing_or_mismatched_weights_raise_naming_the_file(adapted, tmp_path):
    weights_dir, saved, _ = adapted
    encoder = load_encoder(VARIANT, MAX_LENGTH)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}

    with pytest.raises(WeightsError, match=str(tmp_path / "nope")):
        load_weights(encoder, tmp_path / "nope")

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WeightsError, match=str(empty / WEIGHTS_FILE)):
        load_weights(encoder, empty)

    # Trained for compressed, loaded into linformer.
    with pytest.raises(WeightsError, match=f"were trained for {VARIANT}, not {OTHER}") as raised:
        load_encoder(OTHER, MAX_LENGTH, weights=weights_dir)
    assert str(weights_dir / META_FILE) in str(raised.value)

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    from safetensors.torch import save_file

    save_file({"layers.0.attention.nope": torch.zeros(3)}, str(unknown / WEIGHTS_FILE))
    with pytest.raises(WeightsError, match="layers.0.attention.nope") as raised:
        load_weights(encoder, unknown)
    assert str(unknown / WEIGHTS_FILE) in str(raised.value)

    # Saved at another max_length: the shapes differ, and the message says what to match.
    wrong = tmp_path / "wrong-shape"
    name = next(n for n in saved.state_dict() if ".attention." in n)
    wrong.mkdir()
    save_file({name: torch.zeros(7, 5)}, str(wrong / WEIGHTS_FILE))
    (wrong / META_FILE).write_text(json.dumps({"variant": VARIANT, "parameters": {}, "max_length": 4096}))
    with pytest.raises(WeightsError, match=r"has shape \(7, 5\)") as raised:
        load_weights(encoder, wrong)
    message = str(raised.value)
    assert str(wrong / WEIGHTS_FILE) in message and "max_length" in message and "4096" in message
    assert str(tuple(saved.state_dict()[name].shape)) in message

    # Trained at compressed's default stride 3, loaded at stride 2: every tensor fits, and would
    # silently mean something else, so the flag that runs them as trained is named.
    strided = load_encoder(VARIANT, MAX_LENGTH, stride=2)
    strided_before = {k: v.clone() for k, v in strided.state_dict().items()}
    with pytest.raises(WeightsError, match=r"trained for compressed with stride=3 \(this encoder: stride=2\)") as raised:
        load_weights(strided, weights_dir)
    assert "--param stride=3" in str(raised.value) and str(weights_dir / META_FILE) in str(raised.value)
    assert all(torch.equal(strided_before[k], v) for k, v in strided.state_dict().items()) and strided.weights is None
    # `attnserve adapt` may start from them at another stride.
    load_weights(strided, weights_dir, any_parameters=True)
    assert all(torch.equal(strided.state_dict()[k], saved.state_dict()[k]) for k in saved.state_dict())

    # A refused directory leaves the encoder as it was.
    assert all(torch.equal(before[k], v) for k, v in encoder.state_dict().items()) and encoder.weights is None


def test_export_and_serve_cli_refuse_a_missing_weights_dir(tmp_path):
    nope = tmp_path / "nope"
    for command in (["export", "--variant", VARIANT, "--max-length", str(MAX_LENGTH), "--out", str(tmp_path / "out"), "--weights", str(nope)],
                    ["serve", "--variant", VARIANT, "--max-length", str(MAX_LENGTH), "--models-dir", str(tmp_path / "models"),
                     "--weights", str(nope)]):
        out = subprocess.run([sys.executable, "-m", "attnserve", *command], capture_output=True, text=True, timeout=300)
        assert out.returncode == 2, (command[0], out.stderr)
        assert f"{nope}: no such weights directory" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out" / "manifest.json").exists() and not (tmp_path / "models").exists()


def test_bench_quality_runs_a_variant_with_weights(adapted, tmp_path):
    import csv

    weights_dir, _, _ = adapted
    base = [sys.executable, "-m", "attnserve", "bench", "quality", "--limit", "4", "--max-length", str(MAX_LENGTH),
            "--variants", VARIANT, "--no-baselines", "--no-cosine", "--poolings", "mean", "--chunk-tokens", "128"]
    out = subprocess.run([*base, "--out", str(tmp_path / "q"), "--weights", f"{VARIANT}={weights_dir}"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "q" / "quality.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["system"] for r in rows} == {f"{VARIANT}+adapted"} and {r["variant"] for r in rows} == {VARIANT}
    refused = subprocess.run([*base, "--out", str(tmp_path / "r"), "--weights", f"{OTHER}={weights_dir}"],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and f"{OTHER} is not among --variants" in refused.stderr


def test_info_reports_no_weights_for_an_export_without_them():
    from fastapi.testclient import TestClient
    from http_fakes import FakeRunner, tokenizer_json

    from attnserve.service.app import create_app
    from attnserve.service.settings import Settings

    runner = FakeRunner(max_length=256)
    assert "weights" not in runner.manifest
    with TestClient(create_app(Settings(max_length=256), runner=runner, tokenizer_path=tokenizer_json())) as client:
        assert client.get("/info").json()["weights_sha256"] is None
