"""One embedding library in a process of its own, for `attnserve bench peers`.

    python peer_worker.py SYSTEM MODEL_DIR THREADS

SYSTEM is sentence-transformers, fastembed or attnserve (attnserve's in-process Embedder over
the export in MODEL_DIR). The file imports nothing of attnserve at its top, so it runs in a
peer's own virtual environment (fastembed brings onnxruntime, which must not sit beside
onnxruntime-gpu). It prints "ready", then answers each line of JSON on stdin,
{"requests": [[text, ...], ...], "concurrency": c, "batch_size": b}, with one line of JSON: c
client threads send the requests in turn (each its next one when the last came back) into one
queue, which the model takes first come first served, one encode call per request with the
library's batch_size b (the calls queue instead of contending for the cores, as a server's
would). The answer holds the wall-clock seconds of the whole run, each request's latency from
its arrival in the queue, and every request's vectors.
"""
from __future__ import annotations

import json
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def load(system: str, model_dir: str, threads: int):
    """encode(texts, batch_size) -> (len(texts), dim) float32 array: the model's own pooling,
    L2-normalised."""
    if system == "sentence-transformers":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        model = SentenceTransformer(model_dir, device="cpu")
        # encode() sorts a call's texts by length itself, then cuts them into batches of batch_size.
        return lambda texts, batch_size: model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
    if system == "fastembed":
        import numpy as np
        from fastembed import TextEmbedding

        model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=model_dir, threads=threads)
        return lambda texts, batch_size: np.stack(list(model.embed(texts, batch_size=batch_size)))
    if system == "attnserve":
        from attnserve.contract.pooling import Pooling
        from attnserve.service.embedder import Embedder

        embedder = Embedder(model_dir, pooling=Pooling("mean"), threads=threads)
        # Its batches are its own: grouped by length under the server's token budget.
        return lambda texts, batch_size: embedder.embed(texts)
    raise SystemExit(f"peer_worker: unknown system {system!r} (sentence-transformers, fastembed, attnserve)")


def run(encode, requests: list[list[str]], concurrency: int, batch_size: int) -> dict:
    jobs: queue.Queue = queue.Queue()
    latencies = [0.0] * len(requests)
    vectors: list = [None] * len(requests)
    cursor = iter(range(len(requests)))
    cursor_lock = threading.Lock()

    def model():
        """One call at a time, in the order the requests arrived."""
        while (job := jobs.get()) is not None:
            index, done = job
            try:
                vectors[index] = encode(requests[index], batch_size).tolist()
            except Exception as exc:  # noqa: BLE001 - its client re-raises it
                vectors[index] = exc
            done.set()

    def client():
        while True:
            with cursor_lock:
                index = next(cursor, None)
            if index is None:
                return
            started, done = time.perf_counter(), threading.Event()
            jobs.put((index, done))
            done.wait()
            latencies[index] = time.perf_counter() - started
            if isinstance(vectors[index], Exception):
                raise vectors[index]

    server = threading.Thread(target=model, daemon=True)
    server.start()
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            for future in [pool.submit(client) for _ in range(concurrency)]:
                future.result()
        seconds = time.perf_counter() - started
    finally:
        jobs.put(None)
        server.join()
    return {"seconds": seconds, "latencies": latencies, "vectors": vectors}


def main() -> None:
    system, model_dir, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    encode = load(system, model_dir, threads)
    encode(["warm up the model", "and its first batch " * 20], 32)
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(run(encode, job["requests"], int(job["concurrency"]), int(job["batch_size"]))), flush=True)


if __name__ == "__main__":
    main()
