"""`--model org/name`: a Hugging Face Hub id, resolved offline first from a cache in the standard
layout (models--org--name/refs, snapshots/<commit>) that the tests build; nothing is downloaded
(HF_HUB_OFFLINE=1 throughout), and a folder path is never taken for a Hub id."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import model_folders
import numpy as np
import pytest
from export_helpers import EXPORTS_ROOT
from model_folders import HUB_MAIN, HUB_REPO, HUB_TAGGED, sentence_transformers_vectors

from attnserve.contract.model_folder import read_model_folder
from attnserve.model_source import ModelSourceError, resolve_model

MAIN, TAGGED, REPO = HUB_MAIN, HUB_TAGGED, HUB_REPO


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    return model_folders.hub_cache(tmp_path_factory.mktemp("hf") / "hub")


@pytest.fixture
def offline(hub_cache, monkeypatch) -> Path:
    """This process resolves against hub_cache with the network off."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


def test_a_hub_id_resolves_to_its_cached_snapshot(offline):
    folder = resolve_model(REPO)
    assert folder == offline / "models--acme--tiny-bert" / "snapshots" / MAIN
    model = read_model_folder(folder)
    assert model.name == REPO and model.pooling == "mean"  # named by its id, not by the commit
    assert resolve_model(REPO, "v1").name == TAGGED and read_model_folder(resolve_model(REPO, "v1")).pooling == "cls"
    assert resolve_model(REPO, TAGGED).name == TAGGED  # a commit


def test_a_folder_is_never_taken_for_a_hub_id(offline, tmp_path, monkeypatch):
    """A path that exists is that folder, even one spelled org/name; --revision with it is an error."""
    local = shutil.copytree(offline / "models--acme--tiny-bert" / "snapshots" / TAGGED, tmp_path / "acme" / "tiny-bert")
    monkeypatch.chdir(tmp_path)
    assert resolve_model(REPO) == Path(REPO) and read_model_folder(resolve_model(REPO)).dir == local.resolve()
    with pytest.raises(ModelSourceError, match="applies to a Hub id"):
        resolve_model(REPO, "v1")
    with pytest.raises(ModelSourceError, match="no model folder"):
        resolve_model("./missing/folder/here")


def test_a_miss_offline_says_what_and_where_and_writes_nothing(offline):
    before = sorted(p.relative_to(offline) for p in offline.rglob("*"))
    for repo, revision in (("acme/absent", None), (REPO, "v2")):
        with pytest.raises(ModelSourceError) as caught:
            resolve_model(repo, revision)
        message = str(caught.value)
        assert f"{repo} (revision {revision or 'main'})" in message and str(offline) in message and "HF_HUB_OFFLINE" in message
    assert sorted(p.relative_to(offline) for p in offline.rglob("*")) == before


def test_a_snapshot_without_safetensors_is_refused(offline, tmp_path, monkeypatch):
    """A repository with only pickled weights (pytorch_model.bin) is refused, never loaded."""
    from huggingface_hub import constants

    cache = shutil.copytree(offline, tmp_path / "hub")
    snapshot = cache / "models--acme--tiny-bert" / "snapshots" / MAIN
    (snapshot / "model.safetensors").rename(snapshot / "pytorch_model.bin")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(ModelSourceError, match="safetensors weights only"):
        resolve_model(REPO)


def run_cli(*args, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "attnserve", *args], check=False, capture_output=True, text=True, env=env, timeout=300)


def test_export_takes_a_hub_id_and_a_miss_is_exit_2(hub_cache, tmp_path):
    import json

    done = run_cli("export", "--model", REPO, "--revision", "v1", "--variant", "full", "--max-length", "64", "--print-recipe", cache=hub_cache)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"]["name"] == REPO
    out = tmp_path / "never"
    missed = run_cli("export", "--model", "acme/absent", "--out", str(out), cache=hub_cache)
    assert missed.returncode == 2 and "acme/absent (revision main) is not in the Hugging Face cache" in missed.stderr, missed.stderr
    assert "Traceback" not in missed.stderr and not out.exists()


def test_serving_a_hub_id_serves_its_vectors(offline, tmp_path):
    """Settings(model=org/name) (serve --model, ATTNSERVE_MODEL) serve the cached snapshot: its
    export is named after the model, and /embed gives sentence-transformers' vectors of it."""
    from fastapi.testclient import TestClient

    from attnserve.service.app import create_app
    from attnserve.service.exports import ensure_export
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings

    # The suite's export cache: the snapshot's name, weights and files make the same recipe every run.
    settings = Settings(model=REPO, variant="full", max_length=64, models_dir=EXPORTS_ROOT)
    assert settings.model == offline / "models--acme--tiny-bert" / "snapshots" / MAIN
    export_dir = ensure_export(settings)
    assert export_dir.name.startswith("acme-tiny-bert--full-L64-")
    texts = ["a first text", "and a second, longer one"]
    app = create_app(settings, runner=OnnxRunner(export_dir, intra_op_threads=1), tokenizer_path=export_dir / "tokenizer.json")
    with TestClient(app) as client:
        assert client.get("/info").json()["model"]["name"] == REPO
        served = np.array(client.post("/embed", json={"inputs": texts}).json())
    assert np.abs(served - sentence_transformers_vectors(settings.model, texts).numpy()).max() <= 1e-4
