"""One embedding library in a process of its own, for `attnserve bench peers`.

    python peer_worker.py SYSTEM MODEL_DIR THREADS

SYSTEM is sentence-transformers, fastembed or attnserve (attnserve's in-process Embedder over
the export in MODEL_DIR). The file imports nothing of attnserve at its top, so it runs in a
peer's own virtual environment (fastembed brings onnxruntime, which must not sit beside
onnxruntime-gpu). It prints "ready", then answers each line of JSON on stdin,
{"requests": [[text, ...], ...], "concurrency": c}, with one line of JSON: c client threads
send the requests in turn (each its next one when the last came back) to one shared model,
which runs one call at a time in one encode call per request: the calls queue instead of
contending for the cores. The answer holds the wall-clock seconds of the whole run, each
request's latency, and the vectors of the first request.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def load(system: str, model_dir: str, threads: int):
    """encode(texts) -> (len(texts), dim) float32 array: the model's own pooling, L2-normalised."""
    if system == "sentence-transformers":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        model = SentenceTransformer(model_dir, device="cpu")
        # encode() sorts a call's texts by length itself; batch_size as the library's default.
        return lambda texts: model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    if system == "fastembed":
        import numpy as np
        from fastembed import TextEmbedding

        model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=model_dir, threads=threads)
        return lambda texts: np.stack(list(model.embed(texts, batch_size=32)))
    if system == "attnserve":
        from attnserve.contract.pooling import Pooling
        from attnserve.service.embedder import Embedder

        embedder = Embedder(model_dir, pooling=Pooling("mean"), threads=threads)
        return lambda texts: embedder.embed(texts)
    raise SystemExit(f"peer_worker: unknown system {system!r} (sentence-transformers, fastembed, attnserve)")


def run(encode, requests: list[list[str]], concurrency: int) -> dict:
    lock = threading.Lock()
    latencies = [0.0] * len(requests)
    first = []
    cursor = iter(range(len(requests)))
    cursor_lock = threading.Lock()

    def client():
        while True:
            with cursor_lock:
                index = next(cursor, None)
            if index is None:
                return
            started = time.perf_counter()
            with lock:
                vectors = encode(requests[index])
            latencies[index] = time.perf_counter() - started
            if index == 0:
                first.append(vectors.tolist())

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(client) for _ in range(concurrency)]:
            future.result()
    return {"seconds": time.perf_counter() - started, "latencies": latencies, "first": first[0]}


def main() -> None:
    system, model_dir, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    encode = load(system, model_dir, threads)
    encode(["warm up the model", "and its first batch " * 20])
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(run(encode, job["requests"], int(job["concurrency"]))), flush=True)


if __name__ == "__main__":
    main()
