"""attnserve against the libraries people would pick instead: `attnserve bench peers`.

One run, interleaved: the same all-MiniLM-L6-v2 embeds the same texts through
  - attnserve over HTTP (`attnserve serve` on 127.0.0.1, the clients in this process), and the
    same server filling batches in arrival order (--batch-order arrival) for what grouping by
    length buys;
  - attnserve in process (src/attnserve/service/embedder.py's Embedder over the same export);
  - sentence-transformers (PyTorch) on the bundled model folder, in a process of its own;
  - fastembed (ONNX Runtime) in a virtual environment of its own (it brings onnxruntime, which
    must not sit beside onnxruntime-gpu), on a folder holding the bundled model's tokenizer and
    the model exported to ONNX the way fastembed's own all-MiniLM-L6-v2 files are (input_ids,
    attention_mask, token_type_ids -> last_hidden_state).
Nothing is downloaded but fastembed itself, from the package index, on the first run.

Two workloads, each at concurrency 1, 8 and 32 (c clients sending requests back to back):
  - short: passages of 8 to 256 tokens cut from the bundled dev documents at random lengths,
    in requests of --request-texts texts;
  - documents: dev documents cut to --doc-tokens tokens, one a request. The libraries are given
    the document's chunks of --chunk-tokens tokens (cut at the tokenizer's offsets) in one call;
    the server gets the document and chunks it itself (POST /embed_chunks, naive chunks).
Each library runs one call at a time (peer_worker.py): on a small CPU, concurrent calls only
contend for the cores. Every system pools by the mean and L2-normalises, so their vectors can
be compared: the run checks that each system's vectors of one request agree with
sentence-transformers' (cosine).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import numpy as np

from attnserve.bench.service import closed_loop, percentile, start_serve

HERE = Path(__file__).resolve().parent
FASTEMBED = "fastembed==0.9.1"
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
PEERS = ("sentence-transformers", "fastembed")
MIN_TOKENS = 8


def configure(parser) -> None:
    from attnserve.data import DEV_DOCUMENTS

    parser.add_argument("--variant", default="longformer", help="what attnserve serves (default: the default deployment's variant)")
    parser.add_argument("--max-length", type=int, default=4096, help="the server's max_length (at least --doc-tokens)")
    parser.add_argument("--models-dir", type=Path, default=None, help="where attnserve keeps its exports (default: serve's)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma separated, of {', '.join(PEERS)} (empty: attnserve only)")
    parser.add_argument("--peers-dir", type=Path, default=Path("~/.cache/attnserve/peers"),
                        help="fastembed's virtual environment and model folder, made on the first run")
    parser.add_argument("--docs", type=Path, default=DEV_DOCUMENTS, help="JSONL documents the texts are cut from")
    parser.add_argument("--texts", type=int, default=512, help="short passages per run")
    parser.add_argument("--request-texts", type=int, default=16, help="short passages per request")
    parser.add_argument("--documents", type=int, default=8, help="documents per run")
    parser.add_argument("--doc-tokens", type=int, default=4096, help="tokens of each document, [CLS] and [SEP] included")
    parser.add_argument("--chunk-tokens", type=int, default=254,
                        help="document tokens per chunk (254: a chunk with [CLS] and [SEP] is the model's 256)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds: every system runs every case once a round")
    parser.add_argument("--threads", type=int, default=2, help="threads each system computes with")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write every run and the summary here as JSON")


# -- inputs -------------------------------------------------------------------------------------
def workloads(tokenizer, docs_path: Path, args) -> dict:
    """{"short": [request texts], "documents": [(document, [chunk texts])]} cut from real
    documents at token offsets, so every text is the length it says in this tokenizer."""
    from attnserve.data import read_jsonl

    rng = random.Random(args.seed)
    rows = list(read_jsonl(docs_path))
    rng.shuffle(rows)
    encodings = tokenizer.encode_batch([row["text"] for row in rows[: max(args.documents, 64)]], add_special_tokens=False)
    short = []
    for i in range(args.texts):
        enc = encodings[i % len(encodings)]
        body = rng.randint(MIN_TOKENS, 256) - 2
        start = rng.randrange(max(1, len(enc.ids) - body))
        short.append(enc_text(rows[i % len(encodings)]["text"], enc.offsets, start, start + body))
    requests = [short[i : i + args.request_texts] for i in range(0, len(short), args.request_texts)]
    documents = []
    for row, enc in zip(rows, encodings[: args.documents]):
        body = min(len(enc.ids), args.doc_tokens - 2)
        chunks = [enc_text(row["text"], enc.offsets, s, min(s + args.chunk_tokens, body)) for s in range(0, body, args.chunk_tokens)]
        documents.append((enc_text(row["text"], enc.offsets, 0, body), chunks))
    return {"short": requests, "documents": documents}


def enc_text(text: str, offsets, first: int, stop: int) -> str:
    """The text of tokens first .. stop - 1."""
    return text[offsets[first][0] : offsets[stop - 1][1]]


# -- the peers' environments ---------------------------------------------------------------------
def fastembed_python(peers_dir: Path) -> Path:
    """The Python of a virtual environment with fastembed, made (pip install) on first use."""
    env = peers_dir / "fastembed-venv"
    python = env / "bin" / "python"
    if not (env / ".installed").is_file():
        print(f"installing {FASTEMBED} into {env} (once)", flush=True)
        shutil.rmtree(env, ignore_errors=True)
        venv.create(env, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", FASTEMBED], check=True)
        (env / ".installed").write_text(FASTEMBED + "\n")
    return python


def onnx_model_folder(peers_dir: Path) -> Path:
    """The bundled model as fastembed's files are: its tokenizer files and model.onnx (BertModel
    exported by torch.onnx with dynamic batch and sequence axes), made on first use."""
    import torch
    from transformers import AutoModel

    from attnserve.models.pretrained import model_dir

    folder = peers_dir / "all-MiniLM-L6-v2-onnx"
    if (folder / "model.onnx").is_file():
        return folder
    scratch = peers_dir / ".all-MiniLM-L6-v2-onnx.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for name in MODEL_FILES:
        shutil.copy(model_dir() / name, scratch / name)
    bert = AutoModel.from_pretrained(model_dir()).eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.ones(2, 16, dtype=torch.int64)
    torch.onnx.export(LastHiddenState(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(scratch / "model.onnx"),
                      input_names=names, output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]})
    os.replace(scratch, folder)
    return folder


class Worker:
    """peer_worker.py in a process of its own: one library, loaded once, run on request."""

    def __init__(self, system: str, python: Path, model: Path, threads: int):
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        self.system = system
        self.proc = subprocess.Popen([str(python), str(HERE / "peer_worker.py"), system, str(model), str(threads)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise RuntimeError(f"{system}: its worker did not start (exit {self.proc.returncode}); its errors are above")

    def run(self, requests: list[list[str]], concurrency: int, items: list[int]) -> dict:
        """The requests at this concurrency; items[i]: what request i counts for (texts, or 1 document)."""
        self.proc.stdin.write(json.dumps({"requests": requests, "concurrency": concurrency}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.system}: its worker exited with {self.proc.wait()}")
        out = json.loads(line)
        return {"seconds": out["seconds"], "latencies": out["latencies"], "items": items, "first": out["first"]}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def http_run(url: str, workload: str, items: list, concurrency: int, chunk_tokens: int) -> dict:
    """The workload over HTTP, each request sent once (closed_loop in cycle order)."""
    if workload == "short":
        payload, path = (lambda texts: {"inputs": texts}), "/embed"
    else:
        payload, path = (lambda doc: {"inputs": doc, "chunk_tokens": chunk_tokens}), "/embed_chunks"
    run = asyncio.run(closed_loop(url, items, concurrency, duration=3600.0, path=path, payload=payload, order="cycle",
                                  max_requests=len(items), inspect=lambda r: {"json": r.json()} if r.status_code == 200 else {}))
    failed = [r for r in run["requests"] if r.status != 200]
    if failed:
        raise RuntimeError(f"{url}{path}: {len(failed)} requests failed ({failed[0].status} {failed[0].error})")
    vectors = next(r.details["json"] for r in run["requests"] if r.text_index == 0)
    if workload != "short":
        vectors = [chunk["embedding"] for chunk in vectors[0]]
    return {"seconds": run["elapsed"], "latencies": run["latencies"],
            "items": [len(items[r.text_index]) if workload == "short" else 1 for r in run["requests"]], "first": vectors}


# -- the run ---------------------------------------------------------------------------------------
def bench_peers(args) -> int:
    from tokenizers import Tokenizer
    from tqdm import tqdm

    from attnserve.models.pretrained import model_dir
    from attnserve.service.exports import ensure_export
    from attnserve.service.settings import Settings

    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        print(f"attnserve bench peers: unknown peer {sorted(unknown)[0]!r}; choose from {', '.join(PEERS)}", file=sys.stderr)
        return 2
    if args.doc_tokens > args.max_length:
        print(f"attnserve bench peers: --doc-tokens {args.doc_tokens} is over --max-length {args.max_length}", file=sys.stderr)
        return 2
    levels = [int(c) for c in args.concurrency.split(",")]
    peers_dir = args.peers_dir.expanduser()
    settings = {"variant": args.variant, "max_length": args.max_length}
    if args.models_dir:
        settings["models_dir"] = args.models_dir
    export_dir = ensure_export(Settings(**settings))
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    work = workloads(tokenizer, args.docs, args)
    peer_items = {"short": work["short"], "documents": [chunks for _, chunks in work["documents"]]}
    http_items = {"short": work["short"], "documents": [doc for doc, _ in work["documents"]]}

    python = {"attnserve": Path(sys.executable), "sentence-transformers": Path(sys.executable)}
    model = {"attnserve": export_dir, "sentence-transformers": model_dir()}
    if "fastembed" in peers:
        python["fastembed"], model["fastembed"] = fastembed_python(peers_dir), onnx_model_folder(peers_dir)
    flags = ["--max-length", str(args.max_length), "--pooling", "mean", "--intra-op-threads", str(args.threads),
             "--tokenization-workers", "1", "--max-client-batch-size", str(max(64, args.request_texts))]
    servers, workers = {}, {}
    try:
        servers["attnserve HTTP"] = start_serve(export_dir, *flags)
        servers["attnserve HTTP, arrival order"] = start_serve(export_dir, *flags, "--batch-order", "arrival")
        for system in ["attnserve", *peers]:
            workers["attnserve in process" if system == "attnserve" else system] = Worker(
                system, python[system], model[system], args.threads)
        systems = [*servers, *workers]
        cases = [(w, c, s) for w in ("short", "documents") for c in levels for s in systems
                 if not (w == "documents" and s == "attnserve HTTP, arrival order")]
        runs = []
        with tqdm(total=args.rounds * len(cases), desc="bench peers", unit="run") as bar:
            for round_ in range(args.rounds):
                order = cases[round_ % len(systems):] + cases[: round_ % len(systems)]  # who goes first changes
                for workload, concurrency, system in order:
                    bar.set_postfix_str(f"{workload} c={concurrency} {system}")
                    if system in servers:
                        run = http_run(servers[system].url, workload, http_items[workload], concurrency, args.chunk_tokens)
                    else:
                        requests = peer_items[workload]
                        counts = [len(r) if workload == "short" else 1 for r in requests]
                        run = workers[system].run(requests, concurrency, counts)
                    runs.append({"round": round_, "workload": workload, "concurrency": concurrency, "system": system, **run})
                    bar.update()
    finally:
        for server in servers.values():
            server.stop()
        for worker in workers.values():
            worker.close()
    summary = summarize(runs, peers)
    print_summary(summary, args, export_dir)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:], "cpus": os.cpu_count(),
                                        "summary": summary, "runs": [{k: v for k, v in r.items() if k != "first"} for r in runs]},
                                       indent=1) + "\n")
    return 0


def summarize(runs: list[dict], peers: list[str]) -> list[dict]:
    """Per workload, concurrency and system: items/s over every round's runs together, p50 and
    p99 request latency, the least cosine of its first request's vectors to
    sentence-transformers' (when it ran), and its items/s over the best peer's."""
    rows = []
    for workload in ("short", "documents"):
        reference = next((r["first"] for r in runs if r["workload"] == workload and r["system"] == "sentence-transformers"), None)
        for concurrency in sorted({r["concurrency"] for r in runs}):
            case = [r for r in runs if r["workload"] == workload and r["concurrency"] == concurrency]
            rows_here = []
            for system in dict.fromkeys(r["system"] for r in case):
                mine = [r for r in case if r["system"] == system]
                latencies = [x for r in mine for x in r["latencies"]]
                rows_here.append({"workload": workload, "concurrency": concurrency, "system": system,
                                  "per_second": sum(sum(r["items"]) for r in mine) / sum(r["seconds"] for r in mine),
                                  "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99),
                                  "cosine_to_st": cosine(mine[0]["first"], reference)})
            best = max((r["per_second"] for r in rows_here if r["system"] in peers), default=None)
            for r in rows_here:
                r["over_best_peer"] = r["per_second"] / best if best else None
            rows += rows_here
    return rows


def cosine(vectors, reference) -> float | None:
    """Least cosine between a system's vectors of the first request and sentence-transformers'
    (None without them)."""
    if reference is None:
        return None
    a, b = np.asarray(vectors, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        return None
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def print_summary(rows: list[dict], args, export_dir: Path) -> None:
    print(f"\nattnserve bench peers: export {export_dir}; {os.cpu_count()} CPUs shared by every system and the HTTP clients; "
          f"{args.rounds} interleaved rounds, {args.threads} threads each")
    unit = {"short": f"texts/s ({args.texts} texts of {MIN_TOKENS}-256 tokens, {args.request_texts} a request)",
            "documents": f"documents/s ({args.documents} of {args.doc_tokens} tokens, chunks of {args.chunk_tokens})"}
    for workload in ("short", "documents"):
        print(f"\n{workload}: {unit[workload]}")
        print(f"{'concurrency':>11}  {'system':<30} {'per s':>8} {'p50 ms':>9} {'p99 ms':>9} {'/ best peer':>11} {'cos to ST':>9}")
        for r in (r for r in rows if r["workload"] == workload):
            ratio = f"{r['over_best_peer']:.2f}x" if r["over_best_peer"] else "-"
            cos = f"{r['cosine_to_st']:.5f}" if r["cosine_to_st"] is not None else "-"
            print(f"{r['concurrency']:>11}  {r['system']:<30} {r['per_second']:>8.2f} {r['p50_ms']:>9.1f} {r['p99_ms']:>9.1f} {ratio:>11} {cos:>9}")

