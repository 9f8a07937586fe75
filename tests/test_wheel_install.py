"""attnserve as a user installs it: the wheel built from this checkout, installed (not editable)
into a fresh virtual environment, run from a folder outside the checkout. Every verb answers
--help, and every verb the README tells users about makes one small real run there: variants,
export, serve, adapt variant and each `attnserve bench ...`. Whatever a verb reads by default
(the bundled documents, the explorer's page) must come with the wheel; nothing may need a
checkout on sys.path or PYTHONPATH.

The venv sees this test environment's third-party packages (torch, onnx, sentence-transformers,
...) through a .pth file listing its site-packages: .pth lines are plain sys.path entries, so
the editable install's own .pth there is never run and the venv's attnserve is the wheel's
(checked). Exports come from the suite's export cache (--exports-dir / --models-dir
EXPORTS_ROOT) wherever a verb takes one; each run uses the smallest arguments that still do
real work. No timing is asserted.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from export_helpers import EXPORTS_ROOT, HTTP_MAX_LENGTH, HTTP_VARIANT, padded_batch

from attnserve.bench.service import free_port, wait_until_healthy
from attnserve.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT = 600


class Installed:
    """The wheel's venv: run(*words) runs its `attnserve` from a folder outside the checkout."""

    def __init__(self, prefix: Path, wheel: Path, cwd: Path):
        self.prefix, self.wheel, self.cwd = prefix, wheel, cwd
        self.bin = prefix / "bin"
        self.python = self.bin / "python"
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        self.env.update(PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}", VIRTUAL_ENV=str(prefix))

    def run(self, *words: str, timeout: float = RUN_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([str(self.bin / "attnserve"), *words], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"attnserve {' '.join(words)}: exit {done.returncode}\n{done.stderr[-4000:]}"
        return done

    def popen(self, *words: str, log: Path) -> subprocess.Popen:
        return subprocess.Popen([str(self.bin / "attnserve"), *words], cwd=self.cwd, env=self.env,
                                stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def build_wheel(out: Path) -> Path:
    """The wheel of the checkout's files as a fresh clone has them (tracked and not ignored;
    no stale build/ or egg-info), built offline with the setuptools this environment has."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    tree = out / "tree"
    for name in files:
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out / "wheel"),
                    str(tree)], check=True, capture_output=True, timeout=300)
    (wheel,) = (out / "wheel").glob("attnserve-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(root)
    prefix = root / "venv"
    venv.create(prefix, with_pip=False)
    site = Path(subprocess.run([str(prefix / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # This environment's packages, as plain path entries (their own .pth files are not run).
    theirs = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "test-environment.pth").write_text("".join(f"{path}\n" for path in theirs))
    work = root / "elsewhere"
    work.mkdir()
    venv_ = Installed(prefix, wheel, work)
    subprocess.run([str(venv_.python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], env=venv_.env,
                   check=True, capture_output=True, timeout=300)
    where = subprocess.run([str(venv_.python), "-c", "import attnserve; print(attnserve.__file__)"], cwd=work, env=venv_.env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site), f"the venv imports attnserve from {where}, not the installed wheel"
    return venv_


def test_the_wheel_holds_the_product_the_benchmarks_and_the_documents(installed):
    """The packages of src/attnserve/ (found, not listed), the explorer's page, the benchmarks and
    the bundled documents; nothing of research/ or tests/."""
    names = zipfile.ZipFile(installed.wheel).namelist()
    wheel = installed.wheel.name
    assert {n.split("/")[0] for n in names} == {"attnserve", "-".join(wheel.split("-")[:2]) + ".dist-info"}
    assert {n.split("/")[1] for n in names if n.startswith("attnserve/")} == {
        "__init__.py", "__main__.py", "cli.py", "model_source.py", "contract", "models", "export", "train", "service", "data", "bench"}
    assert {"attnserve/export/exporter.py", "attnserve/train/adapt.py", "attnserve/service/app.py", "attnserve/bench/quality.py",
            "attnserve/bench/peer_worker.py", "attnserve/contract/model_folder.py", "attnserve/service/static/explorer/index.html",
            "attnserve/data/longdocs-dev.jsonl.gz", "attnserve/data/longdocs-train.jsonl.gz"} <= set(names)
    assert not any("context_" in n or "training_docs" in n for n in names)
    entry = zipfile.ZipFile(installed.wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "attnserve = attnserve.cli:main" in entry


def test_every_verb_answers_help(installed):
    words = [(), *(c.words for c in COMMANDS)]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda w: installed.run(*w, "--help", timeout=300), words))
    for w, d in zip(words, done):
        assert d.stdout.startswith(f"usage: attnserve {' '.join(w)}".rstrip()), (w, d.stdout[:200])
    assert all(c.words[0] in done[0].stdout for c in COMMANDS)


def test_variants_lists_every_variant_with_parameters_and_cost(installed):
    from attnserve.models import parameters, variant_names

    out = installed.run("variants").stdout
    variants, _, schedules = out.partition("\n\n")
    rows = {line.split("|")[1].strip(): line for line in variants.splitlines()[2:] if line.startswith("| ")}
    assert list(rows) == variant_names()
    assert "O(N^2)" in rows["full"] and "O(N * window)" in rows["local"]
    shared = schedules.splitlines()[0]
    # Then the preset schedules, each layer's variant and the cost as the sum of the layers'.
    assert "| linformer*5,longformer | linformer linformer linformer linformer linformer longformer | "\
           "5 x O(N * k) + 1 x O(N * (window + g)) |" in schedules
    for name in variant_names():
        for key, default in parameters(name).items():
            assert f"{key}={default!r}" in rows[name] or f"{key}={default!r}" in shared


@pytest.fixture(scope="module")
def exported(installed, tmp_path_factory) -> tuple[Path, str]:
    """`attnserve export` of full attention at a short max_length (to stay quick), no analysis graph."""
    out = tmp_path_factory.mktemp("export") / "full"
    done = installed.run("export", "--variant", "full", "--max-length", "300", "--out", str(out), "--no-analysis")
    return out, done.stdout


def test_export_writes_a_verified_export(exported):
    """Exit 0, the export-time ORT-vs-PyTorch check recorded, and the runner serves it."""
    from attnserve.service.runtime import OnnxRunner

    out, said = exported
    assert "verified model.onnx" in said
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["variant"] == "full" and manifest["max_length"] == 300 and "analysis" not in manifest["graphs"]
    assert manifest["verified"]["exact"] and manifest["verified"]["max_abs_diff_sentence_embedding"] <= 1e-4
    runner = OnnxRunner(out, providers=["CPUExecutionProvider"])
    ids, mask = padded_batch([300, 7])
    assert runner.embed(ids, mask).shape == (2, 384)
    assert runner.attention_max_length == 0
    with pytest.raises(ValueError, match="no analysis graph"):
        runner.attention(ids, mask, 0, None)


def test_prepare_checks_the_export_serve_would_serve_and_prints_its_folder(installed, exported):
    """`attnserve prepare` with an export already there exports nothing: it checks it and prints
    its folder, alone on stdout (a Kubernetes init container's step, docs/deploy.md)."""
    out, _ = exported
    done = installed.run("prepare", "--export-dir", str(out))
    assert done.stdout == f"{out}\n" and "exporting" not in done.stderr


def test_serve_answers_health_and_embed(installed, exported, tmp_path):
    out, _ = exported
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = installed.popen("serve", "--export-dir", str(out), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                           log=tmp_path / "serve.log")
    try:
        problem = wait_until_healthy(proc, url, 180)
        assert problem is None, f"attnserve serve {problem}:\n{(tmp_path / 'serve.log').read_text()[-3000:]}"
        vectors = httpx.post(url + "/embed", json={"inputs": ["a short text", "another one, a little longer"]}, timeout=60)
        assert vectors.status_code == 200, vectors.text
        assert np.array(vectors.json()).shape == (2, 384)
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == -signal.SIGTERM  # uvicorn re-raises the SIGTERM it caught once it has shut down cleanly


def test_adapt_variant_trains_on_the_bundled_documents(installed, tmp_path):
    """A few steps of `attnserve adapt variant` on its default data, the kernel pages that ship
    in the wheel."""
    installed.run("adapt", "variant", "--variant", "linformer", "--param", "k=16", "--max-length", "512", "--batch", "2",
                  "--holdout", "4", "--max-steps", "2", "--eval-seconds", "0", "--minutes", "2", "--threads", "2",
                  "--out", str(tmp_path / "adapted"))
    record = json.loads((tmp_path / "adapted" / "adapt.json").read_text())
    assert record["data"]["file"] == "data/longdocs-train.jsonl.gz" and record["steps"] == 2
    assert (tmp_path / "adapted" / "weights.safetensors").stat().st_size > 0


def test_bench_encoder_writes_every_table(installed, tmp_path):
    """At small sizes: every variant asked for gets a row in each table and in the CSV, full
    included."""
    out = installed.run("bench", "encoder", "--variants", "local,synthesizer", "--op-lengths", "256", "--lengths", "130",
                        "--repeats", "1", "--op-repeats", "2", "--hf-length", "256", "--out", str(tmp_path)).stdout
    assert "## Attention op alone" in out and "## Whole encoder forward" in out and "| bigbird |" in out
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    cells = {(r["table"], r["variant"], r["tokens"]) for r in rows}
    for name in ("full", "local", "synthesizer"):
        assert ("op", name, "256") in cells and ("encoder", name, "130") in cells
    assert {("transformers", "longformer", "256"), ("attnserve", "bigbird", "256")} <= cells
    assert all(float(r["seconds"]) > 0 for r in rows)
    assert (tmp_path / "encoder-latency.png").stat().st_size > 0


def test_bench_quality_scores_the_bundled_documents(installed, tmp_path):
    """6 of the bundled dev documents (the default --data, from the wheel): table, CSV, plot and
    --by-layer."""
    out = installed.run("bench", "quality", "--limit", "6", "--max-length", "600", "--variants", "local", "--chunk-tokens", "128",
                        "--opening-weight", "0.3,0.6", "--by-layer", "--out", str(tmp_path / "q")).stdout
    assert "6 documents from " in out and "longdocs-dev.jsonl.gz" in out
    assert "| baseline: naive chunks MaxP |" in out and "| local | mean | late chunks MaxP |" in out
    rows = list(csv.DictReader(open(tmp_path / "q" / "quality.csv")))
    systems = {(r["system"], r["pooling"], r["representation"]) for r in rows}
    assert {("local", "opening 0.3", "one vector"), ("local", "cls", "one vector"), ("local", "mean", "late chunks MaxP"),
            ("baseline: first 256 tokens", "mean", "first 256 tokens")} <= systems
    for r in rows:
        assert 0 < float(r["summary_mrr"]) <= 1 and 0 <= float(r["needle_r1"]) <= 1 and r["documents"] == "6"
    assert float(next(r for r in rows if r["system"] == "local")["cosine_to_full_512"]) > 0.9
    assert (tmp_path / "q" / "quality.png").stat().st_size > 10_000
    # --by-layer: local's cosine with only one layer local (window 512 covers most of 512 tokens).
    assert "| system | layer 0 | layer 1 | layer 2 | layer 3 | layer 4 | layer 5 |" in out
    (by_layer,) = list(csv.DictReader(open(tmp_path / "q" / "by_layer.csv")))
    assert by_layer["system"] == "local" and all(0.9 < float(by_layer[f"layer_{i}"]) <= 1.0001 for i in range(6))


def test_bench_peers_compares_every_system_on_the_same_texts(installed, export_dir, tmp_path):
    """The HTTP test export served twice (by length and in arrival order), attnserve in process
    and sentence-transformers (two batch sizes) in processes of their own, every request's
    vectors agreeing (the bench stops on any that do not). fastembed and infinity (venvs installed
    from the package index on first use) are left to the benchmark."""
    out = tmp_path / "peers.json"
    done = installed.run("bench", "peers", "--variant", HTTP_VARIANT, "--max-length", str(HTTP_MAX_LENGTH), "--models-dir",
                         str(EXPORTS_ROOT), "--peers", "sentence-transformers", "--texts", "12", "--request-texts", "4",
                         "--documents", "1", "--doc-tokens", "1024", "--concurrency", "1,2", "--rounds", "1", "--threads", "1",
                         "--batch-sizes", "4,32",
                         "--out", str(out))
    summary = json.loads(out.read_text())["summary"]
    systems = {"attnserve HTTP", "attnserve HTTP, arrival order", "attnserve in process", "sentence-transformers"}
    assert {r["system"] for r in summary if r["workload"] == "short"} == systems
    assert {r["system"] for r in summary if r["workload"] == "documents"} == systems - {"attnserve HTTP, arrival order"}
    # One document: documents run at concurrency 1 only (a second client would have none to send).
    assert {r["concurrency"] for r in summary if r["workload"] == "documents"} == {1}
    for row in summary:
        assert row["per_second"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0 and row["min"] <= row["per_second"] <= row["max"]
        # Same model, same pooling, the same chunks (HTTP: their spans): every request's vectors agree.
        assert row["least_cosine"] >= 0.9999, row
    st = next(r for r in summary if r["system"] == "sentence-transformers")
    assert st["over_best_peer"] == 1.0 and set(st["batch_sizes"]) == {"4", "32"}
    record = json.loads(out.read_text())
    assert record["document_tokens"] == [1024] and record["machine"]["cpus"] and record["versions"]["sentence-transformers"]
    assert record["machine"]["cpu"] and record["threads"] == 1
    assert record["export"]["variant"] == HTTP_VARIANT and record["provider"] == "CPUExecutionProvider"
    assert "short: texts/s" in done.stdout and "documents: documents/s" in done.stdout


def test_bench_runtime_prints_ratios_and_ceilings(installed, tmp_path):
    """One short variant (no timing is asserted)."""
    installed.run("bench", "runtime", "--variants", "strided", "--lengths", "64,130", "--threads", "2", "--repeats", "1",
                  "--json", str(tmp_path / "rows.json"), "--exports-dir", str(EXPORTS_ROOT))
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [r["length"] for r in rows] == [64, 130]
    for row in rows:
        assert row["max_abs_diff"] <= 1e-4 and row["gflop"] > 0 and row["ceiling"] > 0 and row["speedup"] > 0


def test_bench_maps_measures_each_form_and_says_where_maps_stop(installed, tmp_path):
    """The HTTP tests' cached export (longformer, 1,024 tokens): a short map in both forms,
    measured and within its estimate; past max_length a row that says so (no timing asserted)."""
    installed.run("bench", "maps", "--variants", HTTP_VARIANT, "--max-length", str(HTTP_MAX_LENGTH), "--lengths", "300,2000",
                  "--top-k", "4", "--threads", "2", "--json", str(tmp_path / "maps.json"), "--exports-dir", str(EXPORTS_ROOT))
    rows = json.loads((tmp_path / "maps.json").read_text())["rows"]
    assert [(r["tokens"], r["form"]) for r in rows] == [(300, "grid"), (300, "top_k"), (2000, "grid"), (2000, "top_k")]
    for row in rows[:2]:
        assert row["seconds"] > 0 and 0 < row["peak_mib"] <= row["estimate_mib"] and row["status"] == "served by default", row
    assert all(r["status"] == f"past the export's max_length ({HTTP_MAX_LENGTH})" and "seconds" not in r for r in rows[2:])
    refused = installed.run("bench", "maps", "--variants", "nope", check=False)
    assert refused.returncode == 2 and "unknown variant(s) nope" in refused.stderr


def test_bench_service_compares_http_with_raw_onnx_runtime(installed, exported):
    out, _ = exported
    said = installed.run("bench", "service", "--export-dir", str(out), "--max-length", "300", "--lengths", "64,200", "--reps", "2",
                         "--clients", "2", "--text-tokens", "32", "--duration", "2", "--rounds", "1", "--intra-op-threads", "1").stdout
    assert "1. POST /embed latency over raw ONNX Runtime" in said and "throughput ratio batching / batch size 1" in said


def test_bench_load_answers_every_request(installed, exported):
    out, _ = exported
    said = installed.run("bench", "load", "--export-dir", str(out), "--max-length", "300", "--clients", "2", "--duration", "2",
                         "--documents", "4", "--min-tokens", "20", "--max-tokens", "250").stdout
    assert "PASS: no failures other than 429" in said, said[-2000:]


def test_bench_collapse_writes_csv_and_figure(installed, tmp_path):
    from attnserve.models.encoder import COLLAPSE_PATHS

    done = installed.run("bench", "collapse", "--variants", "local,full", "--schedule", "full*3,local*3", "--schedule",
                         "full*3,local*3", "--lengths", "64,128", "--documents", "2", "--out", str(tmp_path))
    rows = list(csv.DictReader(open(tmp_path / "collapse.csv")))
    assert {r["variant"] for r in rows} == {"local", "full", "full*3,local*3"}  # a schedule named replaces the default
    assert len(rows) == 3 * 2 * len(COLLAPSE_PATHS) * 7  # names x lengths x paths x depths (embeddings + 6 layers)
    assert (tmp_path / "collapse.png").stat().st_size > 10_000
    assert "| full*3,local*3 | 128 |" in done.stdout
