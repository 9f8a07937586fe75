"""Fault suite, a request's life: admission before the body, fairness between requests, work
of a client that went away cancelled, the deadline, and shutdown past its graceful timeout.
Each test runs the real app and uvicorn in a subprocess on 127.0.0.1 over the fake runner,
whose --delay makes every batch take that long; every wait is bounded."""
from __future__ import annotations

import socket
import threading

import httpx
from http_server import poll, start_fake_server, wait_in_flight

from attnserve.bench.service import metric_value

# One input per batch: inputs of 3 to 5 tokens, a token budget that holds one of them.
ONE_PER_BATCH = ("--max-batch-tokens", "7")


def metric(proc, name: str, **labels: str) -> float:
    """A sample of the server's /metrics (the sum over the label values not given)."""
    return metric_value(proc.url, name, **labels)


def post_in_thread(proc, path: str, body: dict, timeout: float) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def call():
        try:
            out["response"] = httpx.post(proc.url + path, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            out["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, out


def test_a_short_request_is_not_starved_by_a_big_one():
    delay = 0.3
    proc = start_fake_server(*ONE_PER_BATCH, delay=delay)
    try:
        big, big_out = post_in_thread(proc, "/embed", {"inputs": [f"document {i}" for i in range(20)]}, timeout=60)
        assert wait_in_flight(proc, 1, timeout=20)
        assert poll(lambda: metric(proc, "attnserve_inputs_run_total") >= 1, timeout=20)
        small = httpx.post(proc.url + "/embed", json={"inputs": "hello"}, timeout=60)
        assert small.status_code == 200
        # Round-robin: the short one ran next, while most of the 20 still wait (queued, unanswered).
        assert metric(proc, "attnserve_queue_inputs") > 10
        assert metric(proc, "attnserve_inputs_run_total") < 10
        big.join(60)
        assert big_out["response"].status_code == 200 and len(big_out["response"].json()) == 20
    finally:
        proc.stop()


def test_a_disconnected_clients_work_is_cancelled():
    delay = 0.5
    proc = start_fake_server(*ONE_PER_BATCH, delay=delay)
    try:
        # 16 inputs of one batch each; the client gives up after the first has started.
        try:
            httpx.post(proc.url + "/embed", json={"inputs": [f"document {i}" for i in range(16)]}, timeout=1.5 * delay)
        except httpx.TimeoutException:
            pass
        assert poll(lambda: metric(proc, "attnserve_requests_cancelled_total", reason="disconnect") == 1, timeout=10), proc.log()
        # Its place is free at once and its inputs leave the queue after the batch in progress.
        assert metric(proc, "attnserve_requests_in_flight") == 0
        assert poll(lambda: metric(proc, "attnserve_queue_inputs") == 0, timeout=10)
        run_before = metric(proc, "attnserve_inputs_run_total")
        r = httpx.post(proc.url + "/embed", json={"inputs": "hello"}, timeout=60)
        assert r.status_code == 200
        # Queued behind nothing: its own input is the only one run since, none of the 14 abandoned ones.
        assert metric(proc, "attnserve_inputs_run_total") == run_before + 1
        assert metric(proc, "attnserve_inputs_run_total") <= 4  # 1-2 abandoned ones, then hello
        assert proc.alive()
    finally:
        proc.stop()


def test_the_deadline_answers_504_and_frees_the_request():
    proc = start_fake_server("--request-timeout", "0.5", delay=3.0)
    try:
        r = httpx.post(proc.url + "/embed", json={"inputs": "slow"}, timeout=30)
        assert r.status_code == 504
        assert "request_timeout" in r.json()["error"]
        assert metric(proc, "attnserve_requests_cancelled_total", reason="deadline") == 1
        assert metric(proc, "attnserve_requests_in_flight") == 0
        r = httpx.post(proc.url + "/v1/embeddings", json={"input": "slow", "model": "x"}, timeout=30)
        assert r.status_code == 504 and "request_timeout" in r.json()["error"]["message"]
    finally:
        proc.stop()


def test_429_comes_from_the_headers_with_retry_after():
    proc = start_fake_server("--max-concurrent-requests", "1", delay=3.0)
    try:
        busy, _ = post_in_thread(proc, "/embed", {"inputs": "slow"}, timeout=60)
        assert wait_in_flight(proc, 1, timeout=20)
        # Announce a body and send none of it: the refusal must not wait for it.
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as s:
            s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            reply = s.recv(4096)
        head = reply.split(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 429") and b"retry-after: 1" in head, reply
        busy.join(60)
    finally:
        proc.stop()


def test_shutdown_past_the_graceful_timeout_answers_503_json():
    proc = start_fake_server("--graceful-shutdown-timeout", "1", *ONE_PER_BATCH, delay=2.0)
    try:
        worker, out = post_in_thread(proc, "/embed", {"inputs": [f"document {i}" for i in range(5)]}, timeout=60)
        assert wait_in_flight(proc, 1, timeout=20)
        proc.terminate()
        worker.join(60)
        r = out["response"]
        assert r.status_code == 503, (r.status_code, r.text)
        assert r.headers["retry-after"] and "shut down" in r.json()["error"]
        assert proc.stop(30) in (0, -15)
        assert "Exception in ASGI application" not in proc.log()
    finally:
        proc.stop()


def test_the_queue_is_bounded_in_tokens():
    proc = start_fake_server("--max-queued-tokens", "40", *ONE_PER_BATCH, delay=1.0)
    try:
        r = httpx.post(proc.url + "/embed", json={"inputs": ["word " * 50]}, timeout=30)
        assert r.status_code == 413 and "ATTNSERVE_MAX_QUEUED_TOKENS" in r.json()["error"]
        first, out = post_in_thread(proc, "/embed", {"inputs": [f"document {i}" for i in range(8)]}, timeout=60)
        assert wait_in_flight(proc, 1, timeout=20)
        assert poll(lambda: metric(proc, "attnserve_queue_inputs") > 0, timeout=20)
        r = httpx.post(proc.url + "/embed", json={"inputs": [f"text {i}" for i in range(8)]}, timeout=30)
        assert r.status_code == 429 and r.headers.get("retry-after") == "1", r.text
        first.join(60)
        assert out["response"].status_code == 200
    finally:
        proc.stop()
