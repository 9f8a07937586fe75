"""Context heads end to end: `attnserve adapt cache` on 3 documents, `attnserve adapt train` on
that cache, the heads' ONNX graphs against PyTorch, and a server that serves them
(/embed_chunks' context none / late / learned, pooling=learned), on the suite's HTTP export."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch
from export_helpers import EXPORTS_ROOT, HTTP_MAX_LENGTH, HTTP_VARIANT
from fastapi.testclient import TestClient
from http_fakes import FakeRunner, tokenizer_json
from http_server import start_real_server

from attnserve.train.context_cache import load_cache
from attnserve.train.context_files import PARITY_TOL, load_heads
from attnserve.train.context_train import Document
from attnserve.service.app import create_app
from attnserve.service.cli import main
from attnserve.service.context import ContextHeads
from attnserve.contract.context_format import SPEC_FILE, ContextHeadError, read_spec
from attnserve.service.settings import Settings

LONG = " ".join(f"Section {i}: the scheduler moves task {i} to queue {i % 7} when its budget runs out." for i in range(50))
SHORT = "How does the scheduler pick a queue?"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnserve.service.cli", *args], capture_output=True, text=True, timeout=600)


def refusal(capsys, *args: str) -> str:
    """stderr of an `attnserve` command run in this process, which must exit 2."""
    assert main(list(args)) == 2
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, export_dir):
    """(cache folder, heads folder): 3 training documents cached through the HTTP export, and
    heads of both kinds trained on them for a few steps."""
    root = tmp_path_factory.mktemp("context")
    cached = cli("adapt", "cache", "--out", str(root / "cache"), "--limit", "3", "--passages", "4", "--variant", HTTP_VARIANT,
                 "--max-length", str(HTTP_MAX_LENGTH), "--models-dir", str(EXPORTS_ROOT))
    assert cached.returncode == 0, cached.stderr
    cache = root / "cache" / "longdocs-train"
    trained = cli("adapt", "train", "--cache", str(cache), "--out", str(root / "heads"), "--steps", "6", "--eval-every", "3",
                  "--holdout", "1", "--designs", "attend,attention-pooling", "--lr", "0.05", "--select", "last")
    assert trained.returncode == 0, trained.stderr
    return cache, root / "heads"


def test_a_cache_of_three_documents_trains_and_exports(trained):
    cache, heads = trained
    meta, docs = load_cache(cache)
    assert meta["documents"] == len(docs) == 3 and meta["complete"]
    for doc in docs:
        chunks = len(doc["naive"])
        assert doc["late"].shape == (chunks, 384) and doc["hidden"].shape[1] == 384 and doc["passages"].shape == (4, 384)
        assert np.all((0 <= doc["passage_chunk"]) & (doc["passage_chunk"] < chunks))
    spec = read_spec(heads)
    assert spec.variant == HTTP_VARIANT and set(spec.heads) == {"chunks", "pooling"}
    assert {k: h.design for k, h in spec.heads.items()} == {"chunks": "attend", "pooling": "attention-pooling"}
    record = json.loads((heads / SPEC_FILE).read_text())
    for kind in ("chunks", "pooling"):
        assert record["heads"][kind]["onnx_max_abs_diff"] <= PARITY_TOL
        assert [p["step"] for p in record["trained"][kind]["curve"]] == [0, 3, 6]
    assert (heads / "curve.png").stat().st_size > 0


def test_onnx_heads_equal_pytorch_on_cached_states(trained):
    cache, folder = trained
    torch_heads = load_heads(folder)
    onnx_heads = ContextHeads(folder, HTTP_VARIANT, 384)
    _, docs = load_cache(cache)
    doc = max((Document(d) for d in docs), key=lambda d: len(d.naive))
    assert len(doc.naive) >= 2
    with torch.no_grad():
        chunks = torch_heads["chunks"](doc.naive, doc.late, doc.doc).numpy()
        pooled = torch_heads["pooling"](doc.hidden).numpy()
    assert np.abs(onnx_heads.chunks(doc.naive.numpy(), doc.late.numpy(), doc.doc.numpy()) - chunks).max() <= 1e-4
    assert np.abs(onnx_heads.pool(doc.hidden.numpy()) - pooled).max() <= 1e-4
    # A head that learned something: the trained chunk vectors are not the naive ones.
    assert np.abs(chunks - doc.naive.numpy()).max() > 1e-3


@pytest.fixture(scope="module")
def server(trained, export_dir):
    _, heads = trained
    proc = start_real_server(export_dir, "--context-heads", str(heads), "--pooling", "learned", "--chunk-context", "learned")
    try:
        yield proc
    finally:
        proc.stop()


def post(server, route, body):
    r = httpx.post(server.url + route, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_served_contexts_and_the_head_match_pytorch(server, trained):
    _, folder = trained
    info = post_get(server, "/info")
    assert info["chunk_context"] == "learned" and info["pooling"]["mode"] == "learned"
    assert info["chunk_contexts"] == ["none", "late", "learned"]
    schema = post_get(server, "/openapi.json")["components"]["schemas"]["EmbedChunksRequest"]["properties"]["context"]
    assert schema["anyOf"][0]["enum"] == ["none", "late", "learned"]
    assert info["context_heads"]["heads"] == {"chunks": "attend", "pooling": "attention-pooling"}
    by_context = {c: np.array([x["embedding"] for x in post(server, "/embed_chunks", {"inputs": LONG, "context": c})[0]])
                  for c in ("none", "late", "learned")}
    default = np.array([x["embedding"] for x in post(server, "/embed_chunks", {"inputs": LONG})[0]])
    assert len(default) >= 3 and np.array_equal(default, by_context["learned"])
    (hidden,) = post(server, "/embed_all", {"inputs": LONG})
    hidden = torch.tensor(hidden)
    heads = load_heads(folder)
    with torch.no_grad():
        # The head sees unit late vectors and a unit document vector: /embed_chunks' late
        # answer and the mean of /embed_all's states carry all it needs.
        expected = heads["chunks"](torch.tensor(by_context["none"], dtype=torch.float32),
                                   torch.tensor(by_context["late"], dtype=torch.float32), hidden.mean(0)).numpy()
        pooled = heads["pooling"](hidden).numpy()
    assert np.abs(by_context["learned"] - expected).max() <= 1e-4
    assert np.abs(np.array(post(server, "/embed", {"inputs": LONG})[0]) - pooled).max() <= 1e-4
    # Naive chunks are the chunks' own /embed vectors.
    texts = [LONG[x["start"]:x["end"]].strip() for x in post(server, "/embed_chunks", {"inputs": LONG, "context": "none"})[0]]
    alone = np.array(post(server, "/embed", {"inputs": texts[:2]}))
    assert np.min((alone * by_context["none"][:2]).sum(1)) >= 0.999


def test_a_text_of_one_chunk_keeps_its_pretrained_vector(server):
    (hidden,) = post(server, "/embed_all", {"inputs": SHORT})
    mean = np.mean(hidden, axis=0)
    mean /= np.linalg.norm(mean)
    vectors = [np.array(post(server, "/embed_chunks", {"inputs": SHORT, "context": c})[0][0]["embedding"]) for c in ("none", "late", "learned")]
    vectors.append(np.array(post(server, "/embed", {"inputs": SHORT})[0]))
    for v in vectors:
        assert float(v @ mean) >= 0.9999


def post_get(server, route):
    r = httpx.get(server.url + route, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_learned_context_without_heads_is_a_422_naming_the_field():
    app = create_app(Settings(max_length=512), runner=FakeRunner(max_length=512), tokenizer_path=tokenizer_json())
    with TestClient(app) as client:
        info = client.get("/info").json()
        assert info["chunk_context"] == "none" and info["chunk_contexts"] == ["none", "late"]
        context = client.get("/openapi.json").json()["components"]["schemas"]["EmbedChunksRequest"]["properties"]["context"]
        assert context["anyOf"][0]["enum"] == ["none", "late"]
        r = client.post("/embed_chunks", json={"inputs": "a b c", "context": "learned"})
        assert r.status_code == 422 and "context" in r.json()["error"]
        assert client.post("/embed_chunks", json={"inputs": "a b c", "context": "sideways"}).status_code == 422


def test_a_missing_or_mismatched_head_file_is_named(trained, tmp_path, export_dir, capsys):
    _, folder = trained
    broken = tmp_path / "heads"
    shutil.copytree(folder, broken)
    with pytest.raises(ContextHeadError, match="heads learned on longformer's states, this deployment runs local"):
        ContextHeads(broken, "local", 384)
    (broken / "chunks.onnx").write_bytes(b"not the graph")
    with pytest.raises(ContextHeadError, match="chunks.onnx: its sha256 differs"):
        read_spec(broken)
    (broken / "chunks.onnx").unlink()
    with pytest.raises(ContextHeadError, match="chunks.onnx: missing"):
        read_spec(broken)
    (broken / SPEC_FILE).unlink()
    with pytest.raises(ContextHeadError, match=f"{SPEC_FILE}: missing"):
        read_spec(broken)
    assert f"{broken / SPEC_FILE}: missing" in refusal(capsys, "serve", "--export-dir", str(export_dir), "--context-heads", str(broken), "--port", "0")
    assert "chunk_context=learned" in refusal(capsys, "serve", "--export-dir", str(export_dir), "--chunk-context", "learned",
                                              "--variant", HTTP_VARIANT, "--port", "0")


def test_train_refuses_bad_designs(trained, capsys):
    cache, _ = trained
    assert "both chunks heads" in refusal(capsys, "adapt", "train", "--cache", str(cache), "--out", "unused", "--designs", "mix,attend")
    assert "unknown design 'telepathy'" in refusal(capsys, "adapt", "train", "--cache", str(cache), "--out", "unused", "--designs", "telepathy")


def test_bench_context_scores_and_times_every_representation(trained):
    cache, heads = trained
    run = cli("bench", "context", "--cache", str(cache), "--heads", str(heads), "--timing-docs", "2", "--repeats", "1",
              "--data", str(cache_data(cache)), "--models-dir", str(EXPORTS_ROOT))
    assert run.returncode == 0, run.stderr
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line for line in run.stdout.splitlines() if line.startswith("| ")}
    for key in [("chunks MaxP", "naive"), ("chunks MaxP", "late"), ("chunks MaxP", f"learned {heads.name}"),
                ("one vector", "opening 0.35"), ("one vector", f"learned pooling {heads.name}")]:
        mrrs = [float(x) for x in rows[key].strip("|").split("|")[2:]]
        assert len(mrrs) == 2 and all(1 / 3 <= m <= 1 for m in mrrs), rows[key]  # 3 documents: MRR is 1/3 at worst
    timed = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in run.stdout.splitlines() if line.count("|") == 4}
    assert timed["naive chunks"] == "1.00" and {"late chunks", "learned chunks", "long pass, learned pooling"} <= set(timed)


def cache_data(cache):
    return json.loads((cache / "cache.json").read_text())["data"]
