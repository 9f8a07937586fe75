"""`attnserve bench peers`' helpers and refusals; its small end-to-end run (every system on the
same texts, their vectors agreeing) goes through the installed wheel in
tests/test_wheel_install.py. The benchmark is run by hand for its numbers: nothing here reads a
timing."""
from __future__ import annotations

import subprocess
import sys

from attnserve.bench.peers import cosine, enc_text, summarize


def test_an_unknown_peer_is_exit_2():
    done = subprocess.run([sys.executable, "-m", "attnserve", "bench", "peers", "--peers", "infinity"],
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
