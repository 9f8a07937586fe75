"""The real uvicorn process (over a fake runner): graceful shutdown answers accepted requests,
oversized bodies are refused before they are read, the server stays up."""
from __future__ import annotations

import socket
import threading

import httpx
import pytest
from http_server import start_fake_server, terminate_while_busy, wait_in_flight

from attnserve.bench.service import metric_value


@pytest.fixture(scope="module")
def server():
    proc = start_fake_server("--max-body-bytes", str(2 * 1024 * 1024))
    yield proc
    proc.stop()


def test_50_mb_body_is_413_and_server_alive(server):
    body = b'{"inputs": "' + b"a" * (50 * 1024 * 1024) + b'"}'
    try:
        r = httpx.post(server.url + "/embed", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 413 and r.json()["error_type"] == "Validation"
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
        pytest.fail("the server closed the connection without an answer")
    assert server.alive()


def test_413_is_sent_before_the_body_is_read(server):
    # Announce 50 MB, send none of it: the answer must come from the headers alone.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 52428800\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413")
    assert server.alive()


def test_million_character_document(server):
    doc = ("lorem ipsum dolor sit amet " * 40000)[:1_000_000]
    r = httpx.post(server.url + "/embed", json={"inputs": doc}, timeout=120)
    assert r.status_code == 413 and "tokens long" in r.json()["error"]
    r = httpx.post(server.url + "/embed", json={"inputs": doc, "truncate": True}, timeout=120)
    assert r.status_code == 200
    assert server.alive()


def test_graceful_shutdown_answers_accepted_requests():
    proc = start_fake_server("--max-batch-requests", "1", delay=0.4)
    # SIGTERM once all five are inside the server (the first one has started inference).
    results, code = terminate_while_busy(proc, [f"document {i}" for i in range(5)], timeout=60)
    assert results == [200] * 5, (results, proc.log())
    # uvicorn re-raises the SIGTERM it caught once it has shut down cleanly.
    assert code in (0, -15), proc.log()
    assert "Traceback" not in proc.log()


def test_serve_refuses_a_broken_export_with_a_clear_message(tmp_path):
    import subprocess
    import sys

    from http_server import ROOT

    (tmp_path / "manifest.json").write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "attnserve", "serve", "--export-dir", str(tmp_path), "--port", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "manifest.json" in proc.stderr and "Traceback" not in proc.stderr


def test_inference_does_not_block_the_event_loop():
    proc = start_fake_server(delay=3.0)
    try:
        done = threading.Event()

        def slow():
            httpx.post(proc.url + "/embed", json={"inputs": "slow one"}, timeout=60)
            done.set()

        worker = threading.Thread(target=slow)
        worker.start()
        wait_in_flight(proc, 1, timeout=20)
        # While the model runs, the loop still answers (and tokenizes) other requests.
        assert httpx.get(proc.url + "/health", timeout=10).status_code == 200
        assert httpx.post(proc.url + "/tokenize", json={"inputs": "other"}, timeout=10).status_code == 200
        # ... and /metrics too, which says the slow one has not been answered yet.
        assert metric_value(proc.url, "attnserve_requests_success_total", route="/embed") == 0
        worker.join(60)
        assert done.is_set()
    finally:
        proc.stop()
