"""How fast /health and /ready answer while a real server runs long documents: the check
behind the liveness and readiness probes' timeouts (docs/deploy.md). Loopback only, bounded.

    python deploy/kubernetes/probe-check.py EXPORT_DIR [--tokens 4096] [--documents 2]

Starts `attnserve serve` over EXPORT_DIR on 127.0.0.1 with max_concurrent_requests equal to
--documents, posts that many documents of exactly --tokens tokens at once, and asks /health
and /ready every 0.5 s until they are answered (at most 200 asks each); prints each probe's
status codes and latencies and each document's.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docker" / "loadtest"))
from loadtest import DEFAULT_DATA, default_tokenizer_path, make_documents  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--documents", type=int, default=2)
    parser.add_argument("--port", type=int, default=8121)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen([sys.executable, "-m", "attnserve", "serve", "--export-dir", args.export_dir, "--host", "127.0.0.1",
                               "--port", str(args.port), "--log-level", "warning", "--max-concurrent-requests", str(args.documents)],
                              cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        docs = make_documents(DEFAULT_DATA, default_tokenizer_path(), [args.tokens], args.documents)[args.tokens]
        answers: list[tuple[int, float]] = []

        def post(text: str) -> None:
            started = time.perf_counter()
            r = httpx.post(url + "/embed", json={"inputs": text}, timeout=600)
            answers.append((r.status_code, time.perf_counter() - started))

        posts = [threading.Thread(target=post, args=(d["text"],)) for d in docs]
        for thread in posts:
            thread.start()
        time.sleep(1.0)  # the documents are admitted and the first runs
        asks: list[tuple[str, int, float, str | None]] = []
        while any(t.is_alive() for t in posts) and len(asks) < 400:
            for path in ("/health", "/ready"):
                started = time.perf_counter()
                r = httpx.get(url + path, timeout=10)
                asks.append((path, r.status_code, time.perf_counter() - started, r.json().get("reason")))
            time.sleep(0.5)
        for thread in posts:
            thread.join()
        for path in ("/health", "/ready"):
            mine = [a for a in asks if a[0] == path]
            latencies = sorted(a[2] * 1000 for a in mine)
            answers_seen = sorted({(a[1], a[3]) for a in mine}, key=str)
            print(f"{path}: {len(mine)} asks while busy, answers {answers_seen}, "
                  f"median {latencies[len(latencies) // 2]:.0f} ms, max {latencies[-1]:.0f} ms")
        print("documents: " + ", ".join(f"{code} in {seconds:.1f} s" for code, seconds in sorted(answers, key=lambda a: a[1])))
    finally:
        server.terminate()
        server.wait(90)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
