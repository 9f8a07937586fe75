"""Context heads end to end, the research tool they are (research/context/, outside the wheel):
`python -m research.context cache` on 3 documents, `... train` on that cache, the heads' ONNX
graphs against PyTorch, and `... bench` scoring and timing them, on the suite's HTTP export. No
deployment serves them (they lost to naive chunks: docs/results/context.md); test_http_chunks.py
checks that serve refuses them."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from export_helpers import EXPORTS_ROOT, HTTP_MAX_LENGTH, HTTP_VARIANT

from research.context.cache import load_cache
from research.context.cli import main
from research.context.files import PARITY_TOL, load_heads
from research.context.format import SPEC_FILE, ContextHeadError, read_spec
from research.context.runtime import ContextHeads
from research.context.train import Document

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m research.context ARGS` from the repository root, as research/README.md runs it."""
    return subprocess.run([sys.executable, "-m", "research.context", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def refusal(capsys, *args: str) -> str:
    """stderr of a `research.context` command run in this process, which must exit 2."""
    assert main(list(args)) == 2
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, export_dir):
    """(cache folder, heads folder): 3 training documents cached through the HTTP export, and
    heads of both kinds trained on them for a few steps."""
    root = tmp_path_factory.mktemp("context")
    cached = cli("cache", "--out", str(root / "cache"), "--limit", "3", "--passages", "4", "--variant", HTTP_VARIANT,
                 "--max-length", str(HTTP_MAX_LENGTH), "--models-dir", str(EXPORTS_ROOT))
    assert cached.returncode == 0, cached.stderr
    cache = root / "cache" / "longdocs-train"
    trained = cli("train", "--cache", str(cache), "--out", str(root / "heads"), "--steps", "6", "--eval-every", "3",
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
    # A document of one chunk keeps its naive vector.
    one = doc.naive[:1].numpy()
    assert np.array_equal(onnx_heads.chunks(one, doc.late[:1].numpy(), doc.doc.numpy()), one)
    # A head that learned something: the trained chunk vectors are not the naive ones.
    assert np.abs(chunks - doc.naive.numpy()).max() > 1e-3


def test_a_missing_or_mismatched_head_file_is_named(trained, tmp_path):
    _, folder = trained
    broken = tmp_path / "heads"
    shutil.copytree(folder, broken)
    with pytest.raises(ContextHeadError, match="heads learned on longformer's states, this export runs local"):
        ContextHeads(broken, "local", 384)
    with pytest.raises(ContextHeadError, match="heads for 384-wide vectors, this export's are 768"):
        ContextHeads(broken, HTTP_VARIANT, 768)
    (broken / "chunks.onnx").write_bytes(b"not the graph")
    with pytest.raises(ContextHeadError, match="chunks.onnx: its sha256 differs"):
        read_spec(broken)
    (broken / "chunks.onnx").unlink()
    with pytest.raises(ContextHeadError, match="chunks.onnx: missing"):
        read_spec(broken)
    (broken / SPEC_FILE).unlink()
    with pytest.raises(ContextHeadError, match=f"{SPEC_FILE}: missing"):
        read_spec(broken)


def test_train_refuses_bad_designs(trained, capsys):
    cache, _ = trained
    assert "both chunks heads" in refusal(capsys, "train", "--cache", str(cache), "--out", "unused", "--designs", "mix,attend")
    assert "unknown design 'telepathy'" in refusal(capsys, "train", "--cache", str(cache), "--out", "unused", "--designs", "telepathy")


def test_bench_context_scores_and_times_every_representation(trained):
    cache, heads = trained
    run = cli("bench", "--cache", str(cache), "--heads", str(heads), "--timing-docs", "2", "--repeats", "1",
              "--data", str(cache_data(cache)), "--models-dir", str(EXPORTS_ROOT))
    assert run.returncode == 0, run.stderr
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line for line in run.stdout.splitlines() if line.startswith("| ")}
    for key in [("chunks MaxP", "naive"), ("chunks MaxP", "late"), ("chunks MaxP", f"learned {heads.name}"),
                ("one vector", "opening 0.35"), ("one vector", f"learned pooling {heads.name}")]:
        mrrs = [float(x) for x in rows[key].strip("|").split("|")[2:]]
        assert len(mrrs) == 2 and all(1 / 3 <= m <= 1 for m in mrrs), rows[key]  # 3 documents: MRR is 1/3 at worst
    timed = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in run.stdout.splitlines() if line.count("|") == 4}
    assert timed["naive chunks"] == "1.00" and {"late chunks", "learned chunks", "long pass, learned pooling"} <= set(timed)


def test_bench_context_names_heads_of_another_variant(trained, tmp_path):
    cache, heads = trained
    other = tmp_path / "heads"
    shutil.copytree(heads, other)
    spec = json.loads((other / SPEC_FILE).read_text())
    (other / SPEC_FILE).write_text(json.dumps({**spec, "variant": "local"}))
    run = cli("bench", "--cache", str(cache), "--heads", str(other), "--timing-docs", "1", "--repeats", "1",
              "--data", str(cache_data(cache)), "--models-dir", str(EXPORTS_ROOT))
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert f"heads learned on local's states, this export runs {HTTP_VARIANT}" in run.stderr


def cache_data(cache):
    return json.loads((cache / "cache.json").read_text())["data"]
