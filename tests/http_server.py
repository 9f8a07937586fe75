"""Start the service in a subprocess on 127.0.0.1 for the end-to-end tests, bounded in time."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx

from attnserve.bench.service import ServerProcess as _ServerProcess
from attnserve.bench.service import free_port, metric_value

ROOT = Path(__file__).resolve().parents[1]


class ServerProcess(_ServerProcess):
    """attnserve.bench.service's server subprocess with the tests' defaults: tests/ importable (the
    fake server and the torch-blocking wrappers) before whatever PYTHONPATH already holds, a log
    named for the tests, 30 s to stop."""

    def __init__(self, argv: list[str], port: int, env: dict | None = None, log_path: Path | None = None):
        path = os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p)
        env = {"PYTHONPATH": path, **(env or {})}
        log_path = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"attnserve-test-{port}.log"
        super().__init__(argv, port, env=env, log_path=log_path)

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        return super().wait_ready(timeout, interval=0.2)

    def stop(self, timeout: float = 30.0) -> int:
        return super().stop(timeout)


def start_fake_server(*args: str, delay: float = 0.0, max_length: int = 512) -> ServerProcess:
    port = free_port()
    argv = [str(ROOT / "tests" / "http_fake_server.py"), "--port", str(port), "--delay", str(delay), "--max-length", str(max_length), *args]
    return ServerProcess(argv, port).wait_ready(60)


def start_real_server(export_dir: Path | None, *args: str, env: dict | None = None, ready_timeout: float = 180.0) -> ServerProcess:
    """`attnserve serve` over `export_dir`, or (None) over the export its flags name."""
    port = free_port()
    where = ["--export-dir", str(export_dir)] if export_dir is not None else []
    argv = ["-m", "attnserve", "serve", *where, "--port", str(port), "--log-level", "warning", *args]
    return ServerProcess(argv, port, env=env).wait_ready(ready_timeout)


def requests_in_flight(proc: ServerProcess) -> float:
    """The server's attnserve_requests_in_flight gauge."""
    return metric_value(proc.url, "attnserve_requests_in_flight")


def poll(ask, until=bool, timeout: float = 30.0, interval: float = 0.05):
    """ask() every `interval` seconds until until(answer) holds or `timeout` seconds pass; the
    last answer (so poll(condition) is True once the condition holds, False if it never did)."""
    deadline = time.monotonic() + timeout
    answer = ask()
    while not until(answer) and time.monotonic() < deadline:
        time.sleep(interval)
        answer = ask()
    return answer


def wait_in_flight(proc: ServerProcess, n: int, timeout: float) -> bool:
    """Poll until the server holds at least n requests (True) or timeout seconds pass (False)."""
    return poll(lambda: requests_in_flight(proc) >= n, timeout=timeout)


def terminate_while_busy(proc: ServerProcess, texts: list[str], timeout: float) -> tuple[list, int]:
    """POST each text to /embed from a thread of its own, wait until the server holds all of
    them, send SIGTERM, and wait for every answer and for the exit (each step bounded by
    timeout seconds). Returns (each request's status code or transport error, exit status)."""
    results: list = [None] * len(texts)

    def call(i: int) -> None:
        try:
            results[i] = httpx.post(proc.url + "/embed", json={"inputs": texts[i]}, timeout=timeout).status_code
        except httpx.HTTPError as exc:
            results[i] = repr(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    wait_in_flight(proc, len(texts), timeout)
    proc.terminate()
    for t in threads:
        t.join(timeout)
    return results, proc.stop(timeout)
