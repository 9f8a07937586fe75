"""The Docker load test (docker/loadtest/loadtest.py, driving attnserve.bench.service's load generator)
against a stub /embed server."""
from __future__ import annotations

import asyncio
import csv
import importlib.util
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# Needs the machine to itself: pytest-xdist runs this group on one worker, one test at a time.
pytestmark = pytest.mark.xdist_group("whole_machine")

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("loadtest", ROOT / "docker" / "loadtest" / "loadtest.py")
loadtest = importlib.util.module_from_spec(spec)
sys.modules["loadtest"] = loadtest  # dataclasses look their module up there
spec.loader.exec_module(loadtest)


def test_refuses_non_loopback_targets():
    with pytest.raises(SystemExit):
        loadtest.check_loopback("http://10.0.0.1:8080")
    assert loadtest.check_loopback("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    with pytest.raises(SystemExit):  # the generator itself refuses too, before it sends anything
        asyncio.run(loadtest.closed_loop("http://192.0.2.1:8080", ["text"], clients=1, duration=1.0))


def test_documents_have_exact_token_counts(tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"document {i} " + "alpha beta gamma delta " * 40}) for i in range(3)))
    docs = loadtest.make_documents(data, loadtest.default_tokenizer_path(), [64, 300], per_length=2)
    assert [d["tokens"] for d in docs[64]] == [64, 64]
    assert [d["tokens"] for d in docs[300]] == [300, 300]


class StubHandler(BaseHTTPRequestHandler):
    """/health always 200; /embed answers a 384-float vector, or 413 past 200 words."""

    def log_message(self, *args):
        pass

    def _send(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("x-inference-time", "1.5")
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._send(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(0.01)
        if len(body["inputs"].split()) > 200:
            self._send(413, {"error": "too long"})
        else:
            self._send(200, [[0.1] * 384])


@pytest.fixture
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_run_writes_report(tmp_path, stub_url):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"text {i} " + "word " * 100}) for i in range(4)))
    out = tmp_path / "report"
    status = loadtest.main([
        "--target", f"a={stub_url}", "--target", f"b={stub_url}",
        "--lengths", "32", "512", "--docs-per-length", "2", "--concurrency", "2",
        "--duration", "0.5", "--max-requests", "20", "--timeout", "10",
        "--data", str(data), "--out", str(out),
    ])
    assert status == 0
    for name in ("requests.csv", "summary.csv", "summary.md", "latency_vs_length.png", "throughput_vs_length.png", "run.json"):
        assert (out / name).is_file(), name
    rows = list(csv.DictReader(open(out / "requests.csv")))
    summary = list(csv.DictReader(open(out / "summary.csv")))
    assert [(s["variant"], s["length"]) for s in summary] == [("a", "32"), ("a", "512"), ("b", "32"), ("b", "512")]
    for s in summary:
        phase_rows = [r for r in rows if r["variant"] == s["variant"] and r["length"] == s["length"]]
        assert 0 < len(phase_rows) == int(s["requests"]) <= 20
        if s["length"] == "32":
            assert int(s["errors"]) == 0 and all(r["dim"] == "384" for r in phase_rows)
        else:  # the stub rejects long documents: every request counts as an error
            assert int(s["errors"]) == len(phase_rows) and all(r["status"] == "413" for r in phase_rows)
    table = (out / "summary.md").read_text()
    assert "| a | 32 |" in table and "p99" in table
