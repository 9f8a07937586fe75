"""`attnserve bench maps`: what an attention map costs, as /attention computes it.

For each variant, its export at --max-length (with the analysis graph) is made or reused, and
for each length a dev-set text of that many tokens gets one layer's map, mean over heads, in
each form the route answers with: a grid (pooled to --max-cells per side, as `format: grid`
and `png` are with `max_cells`) and a sparse top-k (`format: sparse, top_k`). Each row gives
the seconds and the peak resident memory above the process's size before the map (the
analysis graph's run, the conversion of its slot weights to COO, and the reduction to the
form), beside the memory estimate the server refuses maps on and whether a server with the default limits
(max_request_memory_mb 1,024 MB, max_attention_entries 2,000,000) would answer it. A length
past the export's map limit (`attention_max_length`) is a row that says so.

One timed map per row, after one untimed map at the shortest length (each map runs seconds to
minutes; the graph's memory goes back after each run).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from attnserve.bench.runtime import _export, _progress

FORMS = ("grid", "top_k")
DEFAULT_LENGTHS = (2048, 4096, 16384)


def configure(parser) -> None:
    parser.add_argument("--variants", default="longformer,bigbird,full", help="comma-separated variants (default longformer,bigbird,full)")
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)),
                        help=f"comma-separated text lengths in tokens (default {','.join(map(str, DEFAULT_LENGTHS))})")
    parser.add_argument("--max-length", type=int, default=16384, help="max_length of the exports (default 16384, the server's)")
    parser.add_argument("--layer", type=int, default=0, help="the layer mapped (default 0)")
    parser.add_argument("--max-cells", type=int, default=256, help="grid cells per side (default 256, as a request with max_cells 256; /attention's own default is 64)")
    parser.add_argument("--top-k", type=int, default=32, help="weights kept per query row in the sparse form (default 32)")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: all cores)")
    parser.add_argument("--exports-dir", default=None,
                        help="reuse/keep exports here, a folder per recipe as `attnserve serve --models-dir` names them "
                             "(default: a temporary directory)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")


def dev_text(n: int) -> str:
    """The dev documents (the bundled man pages) run together, at least n tokens' worth."""
    from attnserve.data import DEV_DOCUMENTS, read_jsonl

    words, rows = [], iter(read_jsonl(DEV_DOCUMENTS))
    while len(words) < 2 * n:  # a token is at most one word here; most words are one or more tokens
        words += next(rows)["text"].split()
    return " ".join(words)


def text_of(tokenizer, text: str, n: int) -> list[int]:
    """Token ids of the first n tokens of `text` (at most the tokenizer's max_length)."""
    (tokenized,) = tokenizer.encode([text], truncate=True, max_length=n)
    return tokenized.ids


def one_map(runner, ids: list[int], layer: int, form: str, max_cells: int, top_k: int) -> int:
    """The map /attention computes for `form`; returns how many numbers it holds."""
    import numpy as np

    from attnserve.service.rendering import pool_grid, top_k_per_row

    batch = np.asarray([ids], dtype=np.int64)
    rows, cols, values = runner.attention(batch, np.ones_like(batch), layer, None)
    if form == "grid":
        grid, _ = pool_grid(rows, cols, values, len(ids), max_cells)
        return int(grid.size)
    return len(top_k_per_row(rows, cols, values, top_k)[2])


def bench_maps(variants: list[str], lengths: list[int], max_length: int, layer: int = 0, max_cells: int = 256,
               top_k: int = 32, threads: int = 0, exports_dir=None, progress=_progress) -> list[dict]:
    import os

    from attnserve.bench.memory import peak_extra_bytes
    from attnserve.export.recipe import Recipe
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings
    from attnserve.service.state import MapAsk, attention_need
    from attnserve.service.tokenizer import TextTokenizer

    # What a server with the default settings refuses maps on.
    entry_limit = Settings.model_fields["max_attention_entries"].default
    budget_mb = Settings.model_fields["max_request_memory_mb"].default
    asks = {"grid": MapAsk(None, lambda m: None, frozenset()), "top_k": MapAsk(None, lambda m: min(m, top_k), frozenset())}
    text = dev_text(max(lengths))

    threads = threads or os.cpu_count() or 1
    root = Path(exports_dir) if exports_dir else Path(tempfile.mkdtemp(prefix="attnserve-bench-maps-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, variant in enumerate(variants, 1):
        progress(f"[{i}/{len(variants)}] exporting {variant} (max_length {max_length}, with its analysis graph)")
        started = time.perf_counter()
        export_dir = _export(Recipe.resolve(variant, {}, max_length), root, log=lambda message: None)
        runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=threads)
        tokenizer = TextTokenizer(export_dir / "tokenizer.json", max_length)
        progress(f"[{i}/{len(variants)}] {variant}: exported and loaded in {time.perf_counter() - started:.0f}s", done=True)
        if not 0 <= layer < runner.num_layers:
            raise ValueError(f"--layer must be in 0..{runner.num_layers - 1} (got {layer})")
        limit = runner.attention_max_length
        one_map(runner, text_of(tokenizer, text, min(lengths + [limit])), layer, "grid", max_cells, top_k)  # opens the graph
        for n in lengths:
            ids = text_of(tokenizer, text, n)
            for form in FORMS:
                row = {"variant": variant, "tokens": n, "form": form, "attention_max_length": limit}
                rows.append(row)
                if len(ids) < n:
                    row["status"] = f"past the export's max_length ({max_length})"
                    continue
                if n > limit:
                    row["status"] = f"past the export's map limit ({limit} tokens)"
                    continue
                entries, needed = attention_need(runner, n, asks[form])
                row["estimate_mib"] = round(needed / 2**20)
                progress(f"  {variant}: a {form} map of {n} tokens")
                began = time.perf_counter()
                extra, _ = peak_extra_bytes(lambda: one_map(runner, ids, layer, form, max_cells, top_k))
                row["seconds"] = round(time.perf_counter() - began, 2)
                row["peak_mib"] = round(extra / 2**20)
                row["status"] = (f"needs more than the default {budget_mb} MB" if needed > budget_mb * 2**20
                                 else f"more weights than the default {entry_limit:,} per answer" if entries > entry_limit
                                 else "served by default")
        runner = None  # its sessions go before the next variant's are opened
    if not exports_dir:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| variant | tokens | form | seconds | peak MiB | estimate MiB | default server |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['tokens']} | {r['form']} | {r.get('seconds', '-')} | {r.get('peak_mib', '-')} "
                     f"| {r.get('estimate_mib', '-')} | {r['status']} |")
    return "\n".join(lines)


def bench_maps_command(args) -> int:
    from attnserve.models import variant_names

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in variant_names()]
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        lengths = []
    problem = (f"unknown variant(s) {', '.join(unknown)}; valid: {', '.join(variant_names())}" if unknown or not variants
               else f"--lengths must be comma-separated token counts of at least 2 (got {args.lengths!r})" if not lengths or min(lengths) < 2
               else f"--top-k and --max-cells must be at least 1 (got {args.top_k}, {args.max_cells})" if min(args.top_k, args.max_cells) < 1
               else None)
    if problem:
        print(f"attnserve bench maps: {problem}", file=sys.stderr)
        return 2
    try:
        rows = bench_maps(variants, lengths, args.max_length, args.layer, args.max_cells, args.top_k, args.threads, args.exports_dir)
    except ValueError as exc:
        print(f"attnserve bench maps: {exc}", file=sys.stderr)
        return 2
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "settings": {k: v for k, v in vars(args).items() if not k.startswith("_")}}, indent=1, default=str))
    return 0
