"""attnserve against the libraries people would pick instead: `attnserve bench peers`.

One run, interleaved: the same all-MiniLM-L6-v2 embeds the same texts through
  - attnserve over HTTP (`attnserve serve` on 127.0.0.1, the clients in this process): batches
    grouped by length across requests, and the same server filling batches in arrival order
    (--batch-order arrival), the ablation of that grouping;
  - attnserve in process (src/attnserve/service/embedder.py's Embedder over the same export:
    each call's texts grouped by length, one call at a time);
  - sentence-transformers (PyTorch) on the bundled model folder, in a process of its own, at
    each of --batch-sizes;
  - fastembed (ONNX Runtime) in a virtual environment of its own (it brings onnxruntime, which
    must not sit beside onnxruntime-gpu), at each of --batch-sizes, on a folder holding the
    bundled model's tokenizer and the model exported to ONNX the way fastembed's own
    all-MiniLM-L6-v2 files are (input_ids, attention_mask, token_type_ids -> last_hidden_state),
    its attention and layer norms fused by onnxruntime's transformer optimizer;
  - infinity (infinity-emb, a batching embedding server) in a virtual environment of its own,
    serving over HTTP on the CPU with each of its engines for a CPU, at each of --batch-sizes
    (its largest batch), asked by the same client as attnserve's server: "infinity", its torch
    engine on the bundled model folder; "infinity-onnx", its optimum (ONNX Runtime) engine, in a
    virtual environment with optimum and onnxruntime, on fastembed's fused model folder (its own
    optimisation step fails with optimum 2.x: OptimizationConfig has no
    optimize_with_onnxruntime_only, so it is given the graph already fused and told not to).
Nothing is downloaded but fastembed and infinity themselves, from the package index, on the
first run.

Two workloads, each at every --concurrency (c clients sending requests back to back):
  - short: passages of 8 to 256 tokens cut from the bundled dev documents at random lengths,
    in requests of --request-texts texts;
  - documents: dev documents of at least --doc-tokens tokens cut to exactly that many, one a
    request, in chunks of --chunk-tokens tokens cut at the tokenizer's offsets. The libraries
    are given the chunks' texts in one call; the server gets the document and those chunks'
    character spans (POST /embed_chunks with spans, each chunk embedded alone), at the levels of
    --concurrency that have a document for every client.
The in-process systems take requests first come first served from one queue, one call at a
time (peer_worker.py): on a small CPU, concurrent calls only contend for the cores. Every system
is warmed up, then every case runs once a round for --rounds rounds, in an order shuffled anew
each round. Every system pools by the mean and L2-normalises: every request's vectors of every
run are compared with sentence-transformers', and a cosine under --min-cosine stops the run.
"""
from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
import venv
from pathlib import Path

import numpy as np

from attnserve.bench.provenance import commit, cpu_model
from attnserve.bench.service import (
    ServerProcess,
    closed_loop,
    free_port,
    percentile,
    start_serve,
)
from attnserve.contract.export_format import package_version

HERE = Path(__file__).resolve().parent
# fastembed with the onnxruntime (CPU build) of the same version as attnserve's onnxruntime-gpu.
FASTEMBED = ("fastembed==0.9.1", "onnxruntime==1.31.1")
# infinity's pins (numpy<2, sentence-transformers<4, uvicorn<0.33, typer<0.13) clash with
# attnserve's, so it gets a virtual environment of its own; torch is the CPU build attnserve pins.
INFINITY = ("infinity-emb[server,torch]==0.0.78", "torch==2.13.0")
INFINITY_ONNX = ("infinity-emb[server,optimum]==0.0.78", "torch==2.13.0", "onnxruntime==1.31.1")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
PEERS = ("sentence-transformers", "fastembed", "infinity", "infinity-onnx")
HTTP_PEERS = ("infinity", "infinity-onnx")  # servers of their own, asked over HTTP by the same client as attnserve
MIN_TOKENS = 8


def configure(parser) -> None:
    from attnserve.data import DEV_DOCUMENTS

    parser.add_argument("--variant", default="longformer", help="what attnserve serves (default: the default deployment's variant)")
    parser.add_argument("--max-length", type=int, default=4096, help="the server's max_length (at least --doc-tokens)")
    parser.add_argument("--models-dir", type=Path, default=None, help="where attnserve keeps its exports (default: serve's)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma separated, of {', '.join(PEERS)} (empty: attnserve only)")
    parser.add_argument("--peers-dir", type=Path, default=Path("~/.cache/attnserve/peers"),
                        help="fastembed's and infinity's virtual environments and fastembed's model folder, made on the first run")
    parser.add_argument("--torch-index", default=TORCH_CPU_INDEX,
                        help="extra package index for infinity's CPU torch (empty: pip's own configuration, e.g. a find-links folder)")
    parser.add_argument("--docs", type=Path, default=DEV_DOCUMENTS, help="JSONL documents the texts are cut from")
    parser.add_argument("--texts", type=int, default=512, help="short passages per run")
    parser.add_argument("--request-texts", type=int, default=16, help="short passages per request")
    parser.add_argument("--documents", type=int, default=8, help="documents per run")
    parser.add_argument("--doc-tokens", type=int, default=4096, help="tokens of each document, [CLS] and [SEP] included")
    parser.add_argument("--chunk-tokens", type=int, default=254,
                        help="document tokens per chunk (254: a chunk with [CLS] and [SEP] is the model's 256)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=5, help="rounds: every system runs every case once a round, in a shuffled order")
    parser.add_argument("--batch-sizes", default="4,8,16,32",
                        help="the libraries' batch_size values, each a run; a library is reported at its best (all in --out)")
    parser.add_argument("--min-cosine", type=float, default=0.9999,
                        help="least cosine of any request's vectors to sentence-transformers' before the run stops")
    parser.add_argument("--threads", type=int, default=2, help="threads each system computes with")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write every run and the summary here as JSON")


# -- inputs -------------------------------------------------------------------------------------
def workloads(tokenizer, docs_path: Path, args) -> dict:
    """{"short": [request texts], "documents": [(document, [(start, end) chunk spans])]} cut
    from real documents at token offsets, so every text is the length it says in this
    tokenizer: a document is one of at least doc_tokens - 2 tokens, cut to exactly that."""
    from attnserve.data import read_jsonl

    rng = random.Random(args.seed)
    rows = list(read_jsonl(docs_path))
    rng.shuffle(rows)
    encodings = tokenizer.encode_batch([row["text"] for row in rows], add_special_tokens=False)
    short = []
    for i in range(args.texts):
        enc = encodings[i % 64]
        body = rng.randint(MIN_TOKENS, 256) - 2
        start = rng.randrange(max(1, len(enc.ids) - body))
        short.append(enc_text(rows[i % 64]["text"], enc.offsets, start, start + body))
    requests = [short[i : i + args.request_texts] for i in range(0, len(short), args.request_texts)]
    body = args.doc_tokens - 2
    documents = []
    for row, enc in zip(rows, encodings):
        if len(enc.ids) < body or len(documents) == args.documents:
            continue
        starts = chunk_starts(enc.word_ids[:body], args.chunk_tokens)
        spans = [(enc.offsets[a][0], enc.offsets[b - 1][1]) for a, b in zip(starts, [*starts[1:], body])]
        documents.append((enc_text(row["text"], enc.offsets, 0, body), spans))
    return {"short": requests, "documents": documents}


def chunk_starts(word_ids: list[int], chunk_tokens: int) -> list[int]:
    """Chunk starts every chunk_tokens tokens, each moved back to its word's first token: a
    chunk's text then tokenizes alone into the tokens it has in its document (a word cut after
    its first piece would not), so every system embeds the same tokens, and no chunk is longer
    than chunk_tokens (none is truncated by a library's max_seq_length)."""
    starts = [0]
    while starts[-1] + chunk_tokens < len(word_ids):
        at = starts[-1] + chunk_tokens
        while at > starts[-1] + 1 and word_ids[at] == word_ids[at - 1]:
            at -= 1
        starts.append(at)
    return starts


def enc_text(text: str, offsets, first: int, stop: int) -> str:
    """The text of tokens first .. stop - 1."""
    return text[offsets[first][0] : offsets[stop - 1][1]]


# -- the peers' environments ---------------------------------------------------------------------
def peer_python(peers_dir: Path, name: str, requirements: tuple[str, ...], pip_args: tuple[str, ...] = ()) -> Path:
    """The Python of a virtual environment of the peer's own (its pins never meet attnserve's),
    made (pip install) on first use."""
    env = peers_dir / f"{name}-venv"
    python = env / "bin" / "python"
    if not (env / ".installed").is_file():
        print(f"installing {' '.join(requirements)} into {env} (once)", flush=True)
        shutil.rmtree(env, ignore_errors=True)
        venv.create(env, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements, *pip_args], check=True)
        (env / ".installed").write_text("\n".join(requirements) + "\n")
    return python


def fastembed_python(peers_dir: Path) -> Path:
    return peer_python(peers_dir, "fastembed", FASTEMBED)


def start_infinity(python: Path, model: Path, threads: int, batch_size: int, engine: str = "torch") -> ServerProcess:
    """infinity (`infinity_emb v2`) serving the model folder on a free loopback port, computing
    with `threads` threads, its batches at most batch_size texts. The optimum engine runs in the
    folder as model id "." (given a folder's absolute path, infinity 0.0.78 passes the ONNX
    file's absolute path as optimum's file_name, which optimum 2.x cannot find)."""
    port = free_port()
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    onnx = engine == "optimum"
    argv = [str(python.parent / "infinity_emb"), "v2", "--model-id", "." if onnx else str(model), "--served-model-name", "model",
            "--engine", engine, "--device", "cpu", "--batch-size", str(batch_size), "--host", "127.0.0.1", "--port", str(port),
            # Its optimum engine pools by the first token unless told (the torch engine reads modules.json).
            *(["--onnx-disable-optimize", "--pooling-method", "mean"] if onnx else []),
            "--log-level", "warning"]  # no access line per request, as attnserve serve by default
    return ServerProcess(argv, port, env=env, python=str(python), cwd=model if onnx else None).wait_ready(timeout=600)


def onnx_model_folder(peers_dir: Path) -> Path:
    """The bundled model as fastembed's files are (its tokenizer files and model.onnx: input_ids,
    attention_mask, token_type_ids -> last_hidden_state, dynamic batch and sequence axes), at its
    best for a CPU: BertModel exported by torch.onnx, then fused by onnxruntime's transformer
    optimizer (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization: the fused
    kernels attnserve's short path runs too), as a fastembed user optimising their model would.
    Made on first use; fused.json names the fused operators."""
    import torch
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModel

    from attnserve.models.pretrained import model_dir

    folder = peers_dir / "all-MiniLM-L6-v2-onnx-fused"
    if (folder / "model.onnx").is_file():
        return folder
    scratch = peers_dir / ".all-MiniLM-L6-v2-onnx-fused.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for name in MODEL_FILES:
        shutil.copy(model_dir() / name, scratch / name)
    bert = AutoModel.from_pretrained(model_dir(), attn_implementation="eager").eval()  # the pattern the optimizer fuses

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.ones(2, 16, dtype=torch.int64)
    torch.onnx.export(LastHiddenState(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(scratch / "unfused.onnx"),
                      input_names=names, output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]})
    fused = optimize_model(str(scratch / "unfused.onnx"), model_type="bert", num_heads=bert.config.num_attention_heads,
                           hidden_size=bert.config.hidden_size)
    fused.save_model_to_file(str(scratch / "model.onnx"))
    (scratch / "unfused.onnx").unlink()
    counts = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    (scratch / "fused.json").write_text(json.dumps(counts, indent=1) + "\n")
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

    def run(self, requests: list[list[str]], concurrency: int, batch_size: int) -> dict:
        """The requests at this concurrency and library batch_size."""
        self.proc.stdin.write(json.dumps({"requests": requests, "concurrency": concurrency, "batch_size": batch_size}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.system}: its worker exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def http_run(url: str, workload: str, items: list, concurrency: int, api: str = "attnserve") -> dict:
    """The workload over HTTP, each request sent once (closed_loop in sequence order): its seconds,
    latencies and every request's vectors (a document's: its chunks'). api "attnserve": short
    texts to /embed, a document and its chunks' spans to /embed_chunks; "openai" (infinity):
    texts, or a document's chunk texts, to /embeddings."""
    if api == "openai":
        payload, path = (lambda texts: {"model": "model", "input": texts}), "/embeddings"
    elif workload == "short":
        payload, path = (lambda texts: {"inputs": texts}), "/embed"
    else:
        payload, path = (lambda doc: {"inputs": doc[0], "spans": doc[1], "context": "none"}), "/embed_chunks"
    run = asyncio.run(closed_loop(url, items, concurrency, duration=3600.0, path=path, payload=payload, order="sequence",
                                  max_requests=len(items), inspect=lambda r: {"json": r.json()} if r.status_code == 200 else {}))
    failed = [r for r in run["requests"] if r.status != 200]
    if failed:
        raise RuntimeError(f"{url}{path}: {len(failed)} requests failed ({failed[0].status} {failed[0].error})")
    vectors: list = [None] * len(items)
    latencies = [0.0] * len(items)
    assert sorted(r.text_index for r in run["requests"]) == list(range(len(items))), "every request sent once"
    for r in run["requests"]:
        answer = r.details["json"]
        if api == "openai":
            vectors[r.text_index] = [d["embedding"] for d in sorted(answer["data"], key=lambda d: d["index"])]
        else:
            vectors[r.text_index] = answer if workload == "short" else [chunk["embedding"] for chunk in answer[0]]
        latencies[r.text_index] = r.latency
    return {"seconds": run["elapsed"], "latencies": latencies, "vectors": vectors}


# -- the run ---------------------------------------------------------------------------------------
def least_cosines(vectors: list, reference: list) -> list[float]:
    """Per request, the least cosine between a system's vectors and the reference's; a request
    whose vectors differ in shape is -1 (it cannot be compared, so it fails the check)."""
    out = []
    for mine, theirs in zip(vectors, reference, strict=True):
        a, b = np.asarray(mine, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
        if a.shape != b.shape:
            out.append(-1.0)
            continue
        a /= np.linalg.norm(a, axis=1, keepdims=True)
        b /= np.linalg.norm(b, axis=1, keepdims=True)
        out.append(float((a * b).sum(1).min()))
    return out


def bench_peers(args) -> int:
    import httpx
    from tokenizers import Tokenizer
    from tqdm import tqdm

    from attnserve.models.pretrained import model_dir
    from attnserve.service.exports import ensure_export
    from attnserve.service.settings import Settings

    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        print(f"attnserve bench peers: unknown peer {min(unknown)!r}; choose from {', '.join(PEERS)}", file=sys.stderr)
        return 2
    if args.doc_tokens > args.max_length:
        print(f"attnserve bench peers: --doc-tokens {args.doc_tokens} is over --max-length {args.max_length}", file=sys.stderr)
        return 2
    levels = [int(c) for c in args.concurrency.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    peers_dir = args.peers_dir.expanduser()
    settings = {"variant": args.variant, "max_length": args.max_length}
    if args.models_dir:
        settings["models_dir"] = args.models_dir
    export_dir = ensure_export(Settings(**settings))
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    work = workloads(tokenizer, args.docs, args)
    if len(work["documents"]) < args.documents:
        print(f"attnserve bench peers: {args.docs} has {len(work['documents'])} documents of {args.doc_tokens} tokens or more, "
              f"fewer than --documents {args.documents}: lower --doc-tokens or --documents", file=sys.stderr)
        return 2
    peer_items = {"short": work["short"], "documents": [[doc[a:b] for a, b in spans] for doc, spans in work["documents"]]}
    http_items = {"short": work["short"], "documents": work["documents"]}

    python = {"attnserve": Path(sys.executable), "sentence-transformers": Path(sys.executable)}
    model = {"attnserve": export_dir, "sentence-transformers": model_dir()}
    if "fastembed" in peers:
        python["fastembed"], model["fastembed"] = fastembed_python(peers_dir), onnx_model_folder(peers_dir)
    index = ("--extra-index-url", args.torch_index) if args.torch_index else ()
    if "infinity" in peers:
        python["infinity"], model["infinity"] = peer_python(peers_dir, "infinity", INFINITY, index), model_dir()
    if "infinity-onnx" in peers:
        python["infinity-onnx"] = peer_python(peers_dir, "infinity-onnx", INFINITY_ONNX, index)
        model["infinity-onnx"] = onnx_model_folder(peers_dir)
    flags = ["--max-length", str(args.max_length), "--pooling", "mean", "--intra-op-threads", str(args.threads),
             "--tokenization-workers", "1", "--max-client-batch-size", str(max(64, args.request_texts))]
    servers, peer_servers, workers = {}, {}, {}
    try:
        servers["attnserve HTTP"] = start_serve(export_dir, *flags)
        servers["attnserve HTTP, arrival order"] = start_serve(export_dir, *flags, "--batch-order", "arrival")
        for peer in (p for p in HTTP_PEERS if p in peers):
            for b in batch_sizes:
                engine = "optimum" if peer == "infinity-onnx" else "torch"
                peer_servers[(peer, b)] = start_infinity(python[peer], model[peer], args.threads, b, engine)
        for system in dict.fromkeys(["attnserve", "sentence-transformers", *(p for p in peers if p not in HTTP_PEERS)]):
            workers["attnserve in process" if system == "attnserve" else system] = Worker(
                system, python[system], model[system], args.threads)
        # The reference: sentence-transformers' vectors of every request (its default batch_size).
        reference = {w: workers["sentence-transformers"].run(peer_items[w], 1, 32)["vectors"] for w in peer_items}
        timed = [*servers, "attnserve in process", *peers]
        setups = [(system, b) for system in timed for b in (batch_sizes if system in peers else [None])]
        # Arrival order changes nothing where every input is one chunk length: short texts only.
        # Documents run at the levels that have a document for every client.
        cases = [(w, c, system, b) for w in ("short", "documents") for c in levels for system, b in setups
                 if w == "short" or (c <= len(peer_items["documents"]) and system != "attnserve HTTP, arrival order")]
        runs = []

        def one(workload, concurrency, system, batch_size, first: int | None = None):
            if system in servers:
                return http_run(servers[system].url, workload, http_items[workload][:first], concurrency)
            if system in HTTP_PEERS:
                return http_run(peer_servers[(system, batch_size)].url, workload, peer_items[workload][:first], concurrency, "openai")
            return workers[system].run(peer_items[workload][:first], concurrency, batch_size or 32)

        for system, b in tqdm(setups, desc="warm up", unit="system"):  # two requests of each workload, untimed
            for workload in ("short", "documents"):
                one(workload, 1, system, b, first=2)
        rng = random.Random(args.seed)
        with tqdm(total=args.rounds * len(cases), desc="bench peers", unit="run") as bar:
            for round_ in range(args.rounds):
                order = rng.sample(cases, len(cases))
                for workload, concurrency, system, batch_size in order:
                    bar.set_postfix_str(f"{workload} c={concurrency} {system}{f' bs={batch_size}' if batch_size else ''}")
                    run = one(workload, concurrency, system, batch_size)
                    cosines = least_cosines(run.pop("vectors"), reference[workload])
                    worst = min(range(len(cosines)), key=cosines.__getitem__)
                    if cosines[worst] < args.min_cosine:
                        raise RuntimeError(f"{system}{f' batch_size {batch_size}' if batch_size else ''}, {workload}, concurrency "
                                           f"{concurrency}: request {worst}'s vectors have cosine {cosines[worst]:.6f} to "
                                           f"sentence-transformers', under --min-cosine {args.min_cosine}")
                    items = [len(r) for r in peer_items[workload]] if workload == "short" else [1] * len(peer_items[workload])
                    runs.append({"round": round_, "workload": workload, "concurrency": concurrency, "system": system,
                                 "batch_size": batch_size, "per_second": sum(items) / run["seconds"], "least_cosine": cosines[worst],
                                 **run})
                    bar.update()
        provider = httpx.get(servers["attnserve HTTP"].url + "/info", timeout=30).json().get("provider")
    finally:
        for server in [*servers.values(), *peer_servers.values()]:
            server.stop()
        for worker in workers.values():
            worker.close()
    summary = summarize(runs, peers)
    doc_tokens = [len(tokenizer.encode(doc, add_special_tokens=True).ids) for doc, _ in work["documents"]]
    print_summary(summary, args, export_dir, doc_tokens)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:], "machine": machine(), "versions": versions(python),
                  "commit": commit(), "export": export_record(export_dir), "provider": provider, "threads": args.threads,
                  "fastembed_model": fastembed_record(model.get("fastembed") or model.get("infinity-onnx")),
                  "document_tokens": doc_tokens, "short_tokens": [len(tokenizer.encode(t).ids) for r in work["short"] for t in r],
                  "summary": summary, "runs": runs}
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


def display_order(system: str) -> tuple:
    """attnserve over HTTP, the HTTP peers, attnserve in process, then the libraries."""
    return (not system.startswith("attnserve HTTP") and system not in HTTP_PEERS, not system.startswith("attnserve"), system)


def summarize(runs: list[dict], peers: list[str]) -> list[dict]:
    """Per workload, concurrency and system: items/s per round, their median and spread (min-max),
    p50 and p99 request latency over every round, the least cosine to sentence-transformers' of
    any request, and the median over the best peer's of its kind (served over HTTP, or a library
    in process). A peer is reported at the batch_size with the best median (every batch_size's
    median is kept in batch_sizes)."""
    rows = []
    for workload in ("short", "documents"):
        for concurrency in sorted({r["concurrency"] for r in runs}):
            case = [r for r in runs if r["workload"] == workload and r["concurrency"] == concurrency]
            rows_here = []
            for system in sorted(dict.fromkeys(r["system"] for r in case), key=display_order):
                setups = {}
                for r in (r for r in case if r["system"] == system):
                    setups.setdefault(r["batch_size"], []).append(r)
                medians = {b: statistics.median(r["per_second"] for r in mine) for b, mine in setups.items()}
                best = max(medians, key=lambda b: medians[b])
                mine = setups[best]
                rates = [r["per_second"] for r in mine]
                latencies = [x for r in mine for x in r["latencies"]]
                rows_here.append({"workload": workload, "concurrency": concurrency, "system": system, "batch_size": best,
                                  "per_second": medians[best], "min": min(rates), "max": max(rates), "rounds": len(rates),
                                  "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99),
                                  "least_cosine": min(r["least_cosine"] for s in setups.values() for r in s),
                                  "batch_sizes": {str(b): m for b, m in medians.items()} if best is not None else None})
            for r in rows_here:  # HTTP rows over the best peer served over HTTP, the others over the best library's
                r["over"] = "http" if r["system"].startswith("attnserve HTTP") or r["system"] in HTTP_PEERS else "process"
            for kind in ("http", "process"):
                best_peer = max((r["per_second"] for r in rows_here if r["system"] in peers and r["over"] == kind), default=None)
                for r in (r for r in rows_here if r["over"] == kind):
                    r["over_best_peer"] = r["per_second"] / best_peer if best_peer else None
            rows += rows_here
    return rows


# -- what the run ran on ---------------------------------------------------------------------------
def machine() -> dict:
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def versions(python: dict) -> dict:
    """This environment's libraries, and each peer venv's (fastembed and the onnxruntime it brings)."""
    out = {name: package_version(name) for name in ("attnserve", "onnxruntime-gpu", "torch", "transformers",
                                                    "sentence-transformers", "tokenizers", "numpy", "uvicorn", "fastapi")}
    wanted = {"fastembed": ("fastembed", "onnxruntime", "tokenizers", "numpy"),
              "infinity": ("infinity-emb", "torch", "sentence-transformers", "transformers", "numpy", "uvicorn"),
              "infinity-onnx": ("infinity-emb", "optimum", "optimum-onnx", "onnxruntime", "transformers", "numpy")}
    for peer, names in wanted.items():
        if peer in python:
            script = f"from importlib import metadata as m; import json; print(json.dumps({{n: m.version(n) for n in {names!r}}}))"
            said = subprocess.run([str(python[peer]), "-c", script], capture_output=True, text=True, check=True)
            out[f"{peer} venv"] = json.loads(said.stdout)
    return out


def fastembed_record(folder: Path | None) -> dict | None:
    """fastembed's (and infinity-onnx's) model: its folder and the operators onnxruntime's
    optimizer fused into it."""
    if folder is None:
        return None
    return {"dir": str(folder), "fused_operators": json.loads((folder / "fused.json").read_text())}


def export_record(export_dir: Path) -> dict:
    manifest = json.loads((export_dir / "manifest.json").read_text())
    return {"dir": str(export_dir), "variant": manifest.get("variant"), "max_length": manifest.get("max_length"),
            "precision": manifest.get("precision"), "recipe": manifest.get("recipe")}


def print_summary(rows: list[dict], args, export_dir: Path, doc_tokens: list[int]) -> None:
    print(f"\nattnserve bench peers: export {export_dir}; {os.cpu_count()} CPUs shared by every system and the HTTP clients; "
          f"{args.rounds} rounds in shuffled order, {args.threads} threads each; median items/s (min-max)")
    unit = {"short": f"texts/s ({args.texts} texts of {MIN_TOKENS}-256 tokens, {args.request_texts} a request)",
            "documents": f"documents/s ({len(doc_tokens)} of {min(doc_tokens)}-{max(doc_tokens)} tokens, chunks of {args.chunk_tokens})"}
    for workload in ("short", "documents"):
        print(f"\n{workload}: {unit[workload]}")
        print(f"{'concurrency':>11}  {'system':<30} {'bs':>3} {'per s (min-max)':>22} {'p50 ms':>9} {'p99 ms':>9} {'/ best peer':>11} {'cos to ST':>9}")
        for r in (r for r in rows if r["workload"] == workload):
            ratio = f"{r['over_best_peer']:.2f}x" if r["over_best_peer"] else "-"
            spread = f"{r['per_second']:.2f} ({r['min']:.2f}-{r['max']:.2f})"
            print(f"{r['concurrency']:>11}  {r['system']:<30} {r['batch_size'] or '-':>3} {spread:>22} {r['p50_ms']:>9.1f} "
                  f"{r['p99_ms']:>9.1f} {ratio:>11} {r['least_cosine']:>9.5f}")
