"""The model-side CLI and the benchmarks' helpers: `attnserve variants`' table in the README, the
quality metric, FLOP counts, the timers, and `bench runtime --param`. The small real run of each
verb goes through the installed wheel: tests/test_wheel_install.py."""
import subprocess
import sys
from pathlib import Path

import torch
from export_helpers import EXPORTS_ROOT

from attnserve.data.retrieval import mean_reciprocal_rank


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
    from attnserve.bench.flops import count_flops

    encoder = load_encoder("full", 256)
    n, width, inner = 100, 384, 1536
    ids = torch.randint(1000, 29000, (1, n))
    per_layer = 2 * n * width * (4 * width + 2 * inner) + 2 * (2 * n * n * width)  # linears + QK^T and PV
    assert count_flops(lambda: encoder(ids, torch.ones_like(ids))) == 6 * per_layer


def test_bench_runtime_times_a_variant_with_the_parameters_it_is_given(tmp_path):
    """--param VARIANT.KEY=VALUE: the timed export and encoder are built with it (checked
    against each other); one that names no timed variant, or is malformed, is an exit 2."""
    import json

    def bench(*extra, **kw):
        return subprocess.run([sys.executable, "-m", "attnserve", "bench", "runtime", "--variants", "strided",
                               "--lengths", "130", "--threads", "2", "--repeats", "1", "--exports-dir", str(EXPORTS_ROOT), *extra],
                              capture_output=True, text=True, timeout=600, **kw)

    bench("--param", "strided.stride=2", "--json", str(tmp_path / "rows.json"), check=True)
    [row] = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert row["params"] == {"stride": 2} and row["max_abs_diff"] <= 1e-4
    for flag, said in (("linformer.k=8", "names linformer, not one of the timed strided"), ("stride=2", "wants VARIANT.KEY=VALUE"),
                       ("strided.stride=0", "--param for strided: ")):
        out = bench("--param", flag)
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, (flag, out.stderr)


def test_maxp_scores_a_document_by_its_best_chunk():
    import numpy as np

    from attnserve.data.retrieval import ranks

    queries = np.eye(3)
    chunks = np.array([[0, 1, 0], [1, 0, 0], [0.9, 0.1, 0], [0, 0, 1]])  # doc 0: chunks 0-1, doc 1: chunk 2, doc 2: chunk 3
    owner = np.array([0, 0, 1, 2])
    # Query 0 finds doc 0 by its second chunk (1 > doc 1's 0.9); query 1 ranks doc 0's first chunk above doc 1.
    assert ranks(queries, chunks, owner).tolist() == [1, 2, 1]
    # Scored by its first chunk alone, doc 0 loses query 0 to doc 1.
    assert ranks(queries, chunks[[0, 2, 3]]).tolist() == [2, 2, 1]


def test_documents_without_queries_get_self_supervised_ones(tmp_path):
    import json

    from attnserve.bench.quality import load_documents

    words = " ".join(f"w{i}" for i in range(900))
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "Opening sentence here. " + words}) + "\n" + json.dumps({"text": "x", "query": "q", "needle": "x"}) + "\n")
    first, given = load_documents(path)
    assert first["query"] == "Opening sentence here." and first["text"] == words
    needle = first["needle"].split()
    assert len(needle) == 30 and int(needle[0][1:]) >= 600 and first["needle"] in first["text"]
    assert (given["query"], given["needle"]) == ("q", "x")


def test_timers_run_every_callable_in_rounds_at_torchs_thread_count():
    """attnserve.bench.timing: one sample of each callable per round (so a slow phase of the machine
    hits them alike), each timed call after torch's Timer's two untimed ones, at torch's thread
    count as set (the Timer's own default is one thread). Only the order and the settings are
    checked."""
    from attnserve.bench.timing import CALLS_PER_SAMPLE, interleaved_samples

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
