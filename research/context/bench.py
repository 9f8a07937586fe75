"""`python -m research.context bench`: what document context buys chunk vectors and one-vector documents,
from a cache of the frozen encoder's outputs (`python -m research.context cache`) over documents you
report on, and what it costs.

Quality: summary (a document's query retrieves it) and needle (its 30-word needle passage
does) MRR over all cached documents, every representation from the same cached pass:

    chunks, scored by their best chunk (MaxP):
        naive     each chunk embedded alone (what a 512-token server and chunking give)
        late      each chunk the mean of its tokens from one pass over the document
        naive + 0.3 doc   the naive vector plus 0.3 x the document's mean, training-free
        learned (DIR)     each --heads folder's chunk head
    one vector:
        naive chunks mean, long-pass mean, opening (0.35), and each --heads folder's pooling
        head (texts of one chunk get the mean, what the service gives a short text)

Cost (--timing-docs N, 0: none): seconds per document through ONNX Runtime for the first N
documents of --data, each representation in turn on every document, in --repeats rounds
(interleaved, so a slow phase of the machine hits all alike): medians, and ratios to naive
chunks. Queries are the cache's vectors of short texts, as the service embeds them.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from attnserve.data import DEV_DOCUMENTS


def configure(parser) -> None:
    parser.add_argument("--cache", required=True, help="cache folder of the documents to report on (`python -m research.context cache --data FILE`)")
    parser.add_argument("--heads", action="append", default=[], metavar="DIR", help="context-head folder to score (repeatable)")
    parser.add_argument("--data", default=str(DEV_DOCUMENTS), help="the documents the cache was built from (for --timing-docs)")
    parser.add_argument("--timing-docs", type=int, default=0, help="time each representation on this many documents (0: no timing)")
    parser.add_argument("--repeats", type=int, default=3, help="timing rounds (default 3)")
    parser.add_argument("--models-dir", default="~/.cache/attnserve", help="where the cache's export is found or made")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (default: its choice)")


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def quality_rows(docs, heads: dict[str, dict]) -> list[dict]:
    """One row per representation: (label, kind, summary MRR, needle MRR)."""
    from research.context.train import doc_scores, mrr
    from attnserve.contract.pooling import Pooling

    queries = torch.stack([d.query for d in docs])
    needles = torch.stack([d.needle for d in docs])
    targets = torch.arange(len(docs))
    opening = Pooling("opening")

    def row(label, representation, vectors):
        return {"representation": representation, "system": label,
                "summary_mrr": mrr(doc_scores(queries, vectors), targets), "needle_mrr": mrr(doc_scores(needles, vectors), targets)}

    def single(d, head):
        return unit(d.doc)[None] if len(d.naive) == 1 else head(d.hidden)[None]

    rows = []
    with torch.no_grad():
        rows.append(row("naive", "chunks MaxP", [d.naive for d in docs]))
        rows.append(row("late", "chunks MaxP", [unit(d.late) for d in docs]))
        rows.append(row("naive + 0.3 doc", "chunks MaxP", [unit(d.naive + 0.3 * unit(d.doc)) for d in docs]))
        for label, by_kind in heads.items():
            if "chunks" in by_kind:
                head = by_kind["chunks"]
                rows.append(row(f"learned {label}", "chunks MaxP", [d.naive if len(d.naive) == 1 else head(d.naive, d.late, d.doc) for d in docs]))
        rows.append(row("naive chunks mean", "one vector", [unit(d.naive.mean(0))[None] for d in docs]))
        rows.append(row("long-pass mean", "one vector", [unit(d.doc)[None] for d in docs]))
        rows.append(row("opening 0.35", "one vector", [torch.from_numpy(opening(d.hidden.numpy()))[None] for d in docs]))
        for label, by_kind in heads.items():
            if "pooling" in by_kind:
                rows.append(row(f"learned pooling {label}", "one vector", [single(d, by_kind["pooling"]) for d in docs]))
    return rows


def timing_rows(meta: dict, data: str, heads_dir: str | None, n: int, repeats: int, models_dir: Path, threads: int) -> dict:
    """Median seconds per document of each representation, interleaved."""
    from tqdm import tqdm

    from research.context.cache import CacheWriter
    from attnserve.data import read_jsonl
    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe
    from research.context.runtime import ContextHeads
    from attnserve.contract.pooling import Pooling, naive_chunk_ids, pool_chunks

    recipe = meta["recipe"]
    export_dir = cached_export(models_dir, Recipe.resolve(recipe["variant"], recipe["parameters"], recipe["max_length"]))
    writer = CacheWriter(export_dir, meta["chunk_tokens"], threads)
    heads = ContextHeads(heads_dir, recipe["variant"], writer.runner.hidden_size) if heads_dir else None
    docs = [writer.encode(r["text"]) for r in read_jsonl(data, n)]

    def naive(ids, bounds):
        return writer.embed(naive_chunk_ids(ids, bounds, ids[0], ids[-1]))

    long_pass = writer.long_pass

    def late(ids, bounds):
        return pool_chunks(long_pass(ids), bounds)

    def learned(ids, bounds):
        hidden = long_pass(ids)
        return heads.chunks(naive(ids, bounds), pool_chunks(hidden, bounds, normalize=False), hidden.mean(0))

    opening = Pooling("opening")
    systems = {"naive chunks": naive, "late chunks": late, "long pass, opening": lambda ids, b: opening(long_pass(ids))}
    if heads and "chunks" in heads.kinds:
        systems["learned chunks"] = learned
    if heads and "pooling" in heads.kinds:
        systems["long pass, learned pooling"] = lambda ids, b: heads.pool(long_pass(ids))
    seconds = {k: [] for k in systems}
    for ids, bounds in docs[:2]:  # warm-up: first runs pay for allocation
        for fn in systems.values():
            fn(ids, bounds)
    with tqdm(total=repeats * len(docs) * len(systems), desc="timing", unit="run") as bar:
        for _ in range(repeats):
            for ids, bounds in docs:
                for key, fn in systems.items():
                    started = time.perf_counter()
                    fn(ids, bounds)
                    seconds[key].append(time.perf_counter() - started)
                    bar.update()
    per_doc = {k: float(np.median(np.array(v).reshape(repeats, len(docs)).sum(1))) / len(docs) for k, v in seconds.items()}
    return per_doc


def bench_context_command(args) -> int:
    from tqdm import tqdm

    from research.context.cache import CacheError, load_cache
    from research.context.files import load_heads
    from research.context.train import Document
    from research.context.format import ContextHeadError

    try:
        heads = {Path(d).name: load_heads(d) for d in args.heads}
        meta, arrays = load_cache(args.cache)
    except (CacheError, ContextHeadError) as exc:
        raise SystemExit(f"research.context bench: {exc}") from None
    docs = [Document(a) for a in tqdm(arrays, desc="load cache", unit="doc")]
    if any(d.needle is None for d in docs):
        raise SystemExit(f"research.context bench: {args.cache} has documents without a needle; cache a set with 'needle' fields (the dev set)")
    recipe = meta["recipe"]
    print(f"{len(docs)} documents of {meta['data']}, {recipe['variant']} at {recipe['max_length']} tokens, "
          f"chunks of {meta['chunk_tokens']} tokens")
    print("| representation | system | summary MRR | needle MRR |")
    print("|---|---|---|---|")
    for r in quality_rows(docs, heads):
        print(f"| {r['representation']} | {r['system']} | {r['summary_mrr']:.3f} | {r['needle_mrr']:.3f} |")
    if args.timing_docs:
        try:
            per_doc = timing_rows(meta, args.data, args.heads[0] if args.heads else None, args.timing_docs, args.repeats,
                                  Path(args.models_dir).expanduser(), args.threads)
        except ContextHeadError as exc:  # heads of another variant or width than the cache's export
            raise SystemExit(f"research.context bench: {exc}") from None
        base = per_doc["naive chunks"]
        print(f"\nSeconds per document, first {args.timing_docs} documents, median of {args.repeats} interleaved rounds:")
        print("| system | s/doc | ratio to naive chunks |")
        print("|---|---|---|")
        for key, value in per_doc.items():
            print(f"| {key} | {value:.3f} | {value / base:.2f} |")
    return 0
