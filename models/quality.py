"""`attnserve bench quality`: how well each variant's embeddings cover long documents.

On ../shared/data/longdocs-dev.jsonl (344 man pages): summary MRR (the page's one-line
description retrieves the page) and needle MRR (30 words from past word 600 retrieve it),
plus each variant's mean cosine to `full` on the documents' first 512 tokens (how far the
variant moves away from the pretrained model where full attention is still affordable).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "longdocs-dev.jsonl"


def configure(parser):
    from models.registry import variant_names

    parser.add_argument("--variants", default=",".join(variant_names()))
    parser.add_argument("--max-length", type=int, default=16384, help="documents are cut at this many tokens")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N documents (0 = all)")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--out", default="reports/quality.csv")
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True, help="also score the 512-token-server baselines")
    parser.add_argument("--param", action="append", default=[], metavar="VARIANT.KEY=VALUE", help="override a variant parameter")


def mean_reciprocal_rank(queries: torch.Tensor, docs: torch.Tensor) -> float:
    """Query i's right answer is document i; both sides L2-normalised."""
    scores = queries @ docs.T
    rank = (scores > scores.diagonal()[:, None]).sum(1) + 1
    return float((1.0 / rank).mean())


def first_tokens(encoder, texts, n):
    return [encoder.tokenizer.decode(ids[1 : n - 1]) for ids in encoder.tokenize(texts)]


def baselines(rows, max_length):
    """What a 512-token server does, as measured in DESIGN.md: full attention on the first
    256 or 512 tokens, and 256-token chunks embedded separately and averaged."""
    from models import load_encoder

    full = load_encoder("full", max_length=512)
    texts = [r["text"] for r in rows]
    ids = [x[1:-1] for x in load_encoder("full", max_length=max_length).tokenize(texts)]
    chunked = []
    for doc in ids:
        chunks = [full.tokenizer.decode(doc[i : i + 254]) for i in range(0, max(len(doc), 1), 254)]
        chunked.append(torch.nn.functional.normalize(full.embed(chunks).mean(0), dim=0))
    queries = full.embed([r["query"] for r in rows])
    needles = full.embed([r["needle"] for r in rows])
    results = []
    for name, docs in [("baseline: first 256 tokens", full.embed(first_tokens(full, texts, 256))),
                       ("baseline: first 512 tokens", full.embed(first_tokens(full, texts, 512))),
                       ("baseline: 256-token chunks averaged", torch.stack(chunked))]:
        results.append({"variant": name, "summary_mrr": mean_reciprocal_rank(queries, docs),
                        "needle_mrr": mean_reciprocal_rank(needles, docs), "cosine_to_full_512": float("nan"), "seconds": 0.0, "params": {}})
    return results


def evaluate(variant, rows, max_length, params, full_head):
    from models import load_encoder

    encoder = load_encoder(variant, max_length=max_length, **params)
    start = time.perf_counter()
    docs = encoder.embed([r["text"] for r in rows])
    summary = mean_reciprocal_rank(encoder.embed([r["query"] for r in rows]), docs)
    needle = mean_reciprocal_rank(encoder.embed([r["needle"] for r in rows]), docs)
    head = encoder.embed(first_tokens(encoder, [r["text"] for r in rows], 512))
    cosine = float((head * full_head).sum(1).mean())
    return {"variant": variant, "summary_mrr": summary, "needle_mrr": needle, "cosine_to_full_512": cosine,
            "seconds": time.perf_counter() - start, "params": params}


def quality_command(args) -> int:
    from models import load_encoder

    rows = [json.loads(line) for line in open(args.data)]
    rows = rows[: args.limit] if args.limit else rows
    params: dict[str, dict] = {}
    for item in args.param:
        key, _, value = item.partition("=")
        variant, _, name = key.partition(".")
        params.setdefault(variant, {})[name] = value
    full = load_encoder("full", max_length=512)
    full_head = full.embed(first_tokens(full, [r["text"] for r in rows], 512))
    print(f"{len(rows)} documents, cut at {args.max_length} tokens")
    print("| variant | summary MRR | needle MRR | cosine to full (first 512 tokens) | seconds |")
    print("|---|---|---|---|---|")
    results = baselines(rows, args.max_length) if args.baselines else []
    for result in results:
        print(f"| {result['variant']} | {result['summary_mrr']:.3f} | {result['needle_mrr']:.3f} | - | - |", flush=True)
    for variant in [v for v in args.variants.split(",") if v]:
        result = evaluate(variant, rows, args.max_length, params.get(variant, {}), full_head)
        results.append(result)
        print(f"| {variant} | {result['summary_mrr']:.3f} | {result['needle_mrr']:.3f} | {result['cosine_to_full_512']:.4f} | {result['seconds']:.0f} |", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        f.write("variant,params,max_length,documents,summary_mrr,needle_mrr,cosine_to_full_512,seconds\n")
        for r in results:
            f.write(f"{r['variant']},\"{r['params']}\",{args.max_length},{len(rows)},{r['summary_mrr']:.4f},{r['needle_mrr']:.4f},{r['cosine_to_full_512']:.4f},{r['seconds']:.1f}\n")
    print(f"wrote {out}")
    return 0
