"""`attnserve bench peers` end to end on a small scale: the HTTP test export served twice (by
length and in arrival order), attnserve in process and sentence-transformers in processes of
their own, every system's vectors agreeing. fastembed (a virtual environment installed from the
package index on first use) is left to the benchmark itself; its worker is the same file. The
benchmark is run by hand for its numbers: nothing here reads a timing."""
from __future__ import annotations

import json
import subprocess
import sys

from export_helpers import EXPORTS_ROOT, HTTP_MAX_LENGTH, HTTP_VARIANT

from benchmarks.peers import cosine, enc_text, summarize


def test_a_small_run_compares_every_system_on_the_same_texts(export_dir, tmp_path):
    out = tmp_path / "peers.json"
    done = subprocess.run(
        [sys.executable, "-m", "attnserve.service", "bench", "peers", "--variant", HTTP_VARIANT, "--max-length", str(HTTP_MAX_LENGTH),
         "--models-dir", str(EXPORTS_ROOT), "--peers", "sentence-transformers", "--texts", "12", "--request-texts", "4",
         "--documents", "1", "--doc-tokens", "1024", "--concurrency", "1,2", "--rounds", "1", "--threads", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    systems = {"attnserve HTTP", "attnserve HTTP, arrival order", "attnserve in process", "sentence-transformers"}
    assert {r["system"] for r in summary if r["workload"] == "short"} == systems
    assert {r["system"] for r in summary if r["workload"] == "documents"} == systems - {"attnserve HTTP, arrival order"}
    for row in summary:
        assert row["per_second"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
        # Same model, same pooling: the same vectors (chunks over HTTP are cut by the server's
        # own token bounds, not at the text's offsets, so they agree a little less).
        assert row["cosine_to_st"] > (0.999 if row["workload"] == "short" or "HTTP" not in row["system"] else 0.99), row
    st = next(r for r in summary if r["system"] == "sentence-transformers")
    assert st["over_best_peer"] == 1.0
    assert "short: texts/s" in done.stdout and "documents: documents/s" in done.stdout


def test_an_unknown_peer_is_exit_2():
    done = subprocess.run([sys.executable, "-m", "attnserve.service", "bench", "peers", "--peers", "infinity"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown peer 'infinity'" in done.stderr


def test_texts_are_cut_at_token_offsets():
    text = "alpha beta gamma delta"
    offsets = [(0, 5), (6, 10), (11, 16), (17, 22)]
    assert enc_text(text, offsets, 1, 3) == "beta gamma"


def test_summary_ratios_and_cosines():
    runs = [{"workload": "short", "concurrency": 1, "system": s, "seconds": secs, "latencies": [0.1, 0.2], "items": [4, 4],
             "first": [[1.0, 0.0], [0.0, 1.0]]} for s, secs in (("attnserve HTTP", 1.0), ("sentence-transformers", 2.0))]
    rows = summarize(runs, ["sentence-transformers"])
    assert [r["over_best_peer"] for r in rows] == [2.0, 1.0]
    assert rows[0]["cosine_to_st"] == 1.0
    assert cosine([[1.0, 0.0]], [[0.0, 1.0]]) == 0.0 and cosine([[1.0, 0.0]], None) is None
