"""Start the service in a subprocess on 127.0.0.1 for the end-to-end tests, bounded in time."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, argv: list[str], port: int, env: dict | None = None, log_path: Path | None = None):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"attnserve-test-{port}.log"
        self._log = open(self.log_path, "wb")
        full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", **(env or {})}
        self.proc = subprocess.Popen([PYTHON, *argv], cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def alive(self) -> bool:
        return self.proc.poll() is None and httpx.get(self.url + "/health", timeout=10).status_code == 200

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> int:
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def start_fake_server(*args: str, delay: float = 0.0, max_length: int = 512) -> ServerProcess:
    port = free_port()
    argv = [str(ROOT / "tests" / "http_fake_server.py"), "--port", str(port), "--delay", str(delay), "--max-length", str(max_length), *args]
    return ServerProcess(argv, port).wait_ready(60)


def start_real_server(export_dir: Path | None, *args: str, env: dict | None = None) -> ServerProcess:
    """`attnserve serve` over `export_dir`, or (None) over the export its flags name."""
    port = free_port()
    where = ["--export-dir", str(export_dir)] if export_dir is not None else []
    argv = ["-m", "service", "serve", *where, "--port", str(port), "--log-level", "warning", *args]
    return ServerProcess(argv, port, env=env).wait_ready(180)
