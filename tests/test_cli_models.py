"""The model-side CLI: `attnserve variants` and the quality metric."""
import subprocess
import sys
from pathlib import Path

import torch
from export_helpers import EXPORTS_ROOT

from attnserve.models import parameters, variant_names
from attnserve.models.quality import mean_reciprocal_rank


def test_variants_lists_every_variant_with_parameters_and_cost():
    out = subprocess.run([sys.executable, "-m", "attnserve.service.cli", "variants"], capture_output=True, text=True, check=True).stdout
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


def test_readme_variants_table_is_what_the_command_prints():
    from attnserve.models.cli import schedules_table, variants_table
    from attnserve.models.schedule import PRESETS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "\n".join(variants_table()) in readme, "README.md's variants table differs: paste `attnserve variants` there"
    assert "\n".join(schedules_table(PRESETS)) in readme, "README.md's schedules table differs: paste `attnserve variants` there"


def test_mean_reciprocal_rank():
    docs = torch.eye(3)
    assert mean_reciprocal_rank(docs, docs) == 1.0
    swapped = docs[[1, 0, 2]]  # queries 0 and 1 rank their document second
    assert abs(mean_reciprocal_rank(swapped, docs) - (0.5 + 0.5 + 1) / 3) < 1e-6


def test_flop_count_of_the_full_encoder_is_its_matrix_products():
    """count_flops (behind bench runtime's ceilings) counts every projection, FFN and the CPU
    attention kernel FlopCounterMode alone misses: 6 layers at n tokens, multiply-add = 2."""
    from attnserve.models import load_encoder
    from benchmarks.flops import count_flops

    encoder = load_encoder("full", 256)
    n, width, inner = 100, 384, 1536
    ids = torch.randint(1000, 29000, (1, n))
    per_layer = 2 * n * width * (4 * width + 2 * inner) + 2 * (2 * n * n * width)  # linears + QK^T and PV
    assert count_flops(lambda: encoder(ids, torch.ones_like(ids))) == 6 * per_layer


def test_bench_runtime_prints_ratios_and_ceilings(tmp_path):
    """A smoke run of `attnserve bench runtime` on one short variant (no timing is asserted)."""
    import json

    out = subprocess.run(
        [sys.executable, "-m", "attnserve.service.cli", "bench", "runtime", "--variants", "strided", "--lengths", "64,130",
         "--threads", "2", "--repeats", "1", "--json", str(tmp_path / "rows.json"), "--exports-dir", str(EXPORTS_ROOT)],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout
    assert "GFLOP/s" in out and "ceiling = eager time" in out
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [r["length"] for r in rows] == [64, 130]
    for row in rows:
        assert row["max_abs_diff"] <= 1e-4 and row["gflop"] > 0 and row["ceiling"] > 0 and row["speedup"] > 0


def test_bench_runtime_times_a_variant_with_the_parameters_it_is_given(tmp_path):
    """--param VARIANT.KEY=VALUE: the timed export and encoder are built with it (checked
    against each other); one that names no timed variant, or is malformed, is an exit 2."""
    import json

    def bench(*extra, **kw):
        return subprocess.run([sys.executable, "-m", "attnserve.service.cli", "bench", "runtime", "--variants", "strided",
                               "--lengths", "130", "--threads", "2", "--repeats", "1", "--exports-dir", str(EXPORTS_ROOT), *extra],
                              capture_output=True, text=True, timeout=600, **kw)

    bench("--param", "strided.stride=2", "--json", str(tmp_path / "rows.json"), check=True)
    [row] = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert row["params"] == {"stride": 2} and row["max_abs_diff"] <= 1e-4
    for flag, said in (("linformer.k=8", "names linformer, not one of the timed strided"), ("stride=2", "wants VARIANT.KEY=VALUE"),
                       ("strided.stride=0", "--param for strided: ")):
        out = bench("--param", flag)
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, (flag, out.stderr)


def test_bench_encoder_writes_every_table(tmp_path):
    """A smoke run of `attnserve bench encoder` at small sizes (no timing is asserted): every
    variant asked for gets a row in each table and in the CSV, full included."""
    import csv

    out = subprocess.run(
        [sys.executable, "-m", "attnserve.service.cli", "bench", "encoder", "--variants", "local,synthesizer", "--op-lengths", "256",
         "--lengths", "130", "--repeats", "1", "--op-repeats", "2", "--hf-length", "256", "--out", str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout
    assert "## Attention op alone" in out and "## Whole encoder forward" in out and "| bigbird |" in out
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    cells = {(r["table"], r["variant"], r["tokens"]) for r in rows}
    for name in ("full", "local", "synthesizer"):
        assert ("op", name, "256") in cells and ("encoder", name, "130") in cells
    assert {("transformers", "longformer", "256"), ("attnserve", "bigbird", "256")} <= cells
    assert all(float(r["seconds"]) > 0 for r in rows)
    assert (tmp_path / "encoder-latency.png").stat().st_size > 0


def test_maxp_scores_a_document_by_its_best_chunk():
    import numpy as np

    from attnserve.models.quality import ranks

    queries = np.eye(3)
    chunks = np.array([[0, 1, 0], [1, 0, 0], [0.9, 0.1, 0], [0, 0, 1]])  # doc 0: chunks 0-1, doc 1: chunk 2, doc 2: chunk 3
    owner = np.array([0, 0, 1, 2])
    # Query 0 finds doc 0 by its second chunk (1 > doc 1's 0.9); query 1 ranks doc 0's first chunk above doc 1.
    assert ranks(queries, chunks, owner).tolist() == [1, 2, 1]
    # Scored by its first chunk alone, doc 0 loses query 0 to doc 1.
    assert ranks(queries, chunks[[0, 2, 3]]).tolist() == [2, 2, 1]


def test_documents_without_queries_get_self_supervised_ones(tmp_path):
    import json

    from benchmarks.quality import load_documents

    words = " ".join(f"w{i}" for i in range(900))
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "Opening sentence here. " + words}) + "\n" + json.dumps({"text": "x", "query": "q", "needle": "x"}) + "\n")
    first, given = load_documents(path)
    assert first["query"] == "Opening sentence here." and first["text"] == words
    needle = first["needle"].split()
    assert len(needle) == 30 and int(needle[0][1:]) >= 600 and first["needle"] in first["text"]
    assert (given["query"], given["needle"]) == ("q", "x")


def test_bench_quality_writes_table_csv_and_plot(tmp_path):
    """A smoke run of `attnserve bench quality` on 6 documents of your own, no queries given."""
    import csv
    import json

    from attnserve.models.documents import DEV_DOCUMENTS, read_jsonl

    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in read_jsonl(DEV_DOCUMENTS, limit=6)))
    out = subprocess.run(
        [sys.executable, "-m", "attnserve.service.cli", "bench", "quality", "--data", str(data), "--max-length", "600",
         "--variants", "local", "--chunk-tokens", "128", "--opening-weight", "0.3,0.6", "--by-layer", "--out", str(tmp_path / "q")],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout
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


def test_the_wheel_installs_the_product_packages_and_no_benchmarks(tmp_path):
    """The wheel, built from the checkout's files as a fresh clone has them (no stale build/),
    holds the packages of src/attnserve/ (found, not listed) and the explorer's page; benchmarks/
    stays in the source tree."""
    import shutil
    import zipfile

    root = Path(__file__).resolve().parents[1]
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    tree = tmp_path / "tree"
    for name in files:
        if (root / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w"), str(tree)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "w").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"attnserve", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert {n.split("/")[1] for n in names if n.startswith("attnserve/")} == {"__init__.py", "contract", "models", "export", "train", "service"}
    assert {"attnserve/export/exporter.py", "attnserve/train/adapt.py", "attnserve/service/app.py",
            "attnserve/contract/model_folder.py", "attnserve/service/static/explorer/index.html"} <= set(names)
    for module in ("runtime", "encoder", "quality", "service", "memory", "flops", "timing"):
        assert not any(n.endswith(f"/benchmarks/{module}.py") for n in names), module
    assert not any(n.endswith(("bench_runtime.py", "/flops.py", "/timing.py", "/memory.py")) for n in names)


def test_bench_commands_without_a_source_checkout_exit_2_saying_how_to_get_one(monkeypatch, capsys, tmp_path):
    """As installed from the wheel: no benchmarks/ beside the package."""
    import pytest

    from attnserve.service import bench
    from attnserve.service.cli import main

    monkeypatch.setattr(bench, "BENCHMARKS", tmp_path / "benchmarks")
    monkeypatch.delitem(sys.modules, "benchmarks", raising=False)
    for words in (["bench", "runtime", "--variants", "full"], ["bench", "load"], ["bench", "encoder", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(words)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "source checkout" in err and "git clone" in err and "pip install -e '.[test]'" in err, err
    assert main(["variants"]) == 0  # the product's own commands need no checkout


def test_timers_run_every_callable_in_rounds_at_torchs_thread_count():
    """benchmarks.timing: one sample of each callable per round (so a slow phase of the machine
    hits them alike), each timed call after torch's Timer's two untimed ones, at torch's thread
    count as set (the Timer's own default is one thread). Only the order and the settings are
    checked."""
    from benchmarks.timing import CALLS_PER_SAMPLE, interleaved_samples

    calls, threads = [], []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def call(key):
            return lambda: (calls.append(key), threads.append(torch.get_num_threads()))

        samples = interleaved_samples({"a": call("a"), "b": call("b")}, repeats=3)
    finally:
        torch.set_num_threads(before)
    assert calls == (["a"] * CALLS_PER_SAMPLE + ["b"] * CALLS_PER_SAMPLE) * 3
    assert set(threads) == {2}
    assert [len(v) for v in samples.values()] == [3, 3] and all(s >= 0 for v in samples.values() for s in v)
