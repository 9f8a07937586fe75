"""`attnserve bench quality`: which variant, pooling and chunking to deploy on your documents.

On a JSONL of long documents (default: the 344 Debian man pages of data/longdocs-dev.jsonl.gz),
two retrieval tasks over the whole set: summary (a document's query retrieves it) and needle (a
30-word passage copied from past word 600 retrieves it). Documents without a `query` get a
self-supervised one: their first sentence, taken out of the text; without a `needle`, one is cut
from the text. For each system: MRR and recall@1 on both tasks, seconds per document, and for
variants the mean cosine to `full` on the documents' first 512 tokens (with --by-layer, also
that cosine with only one layer the variant's and the others full attention, layer by layer:
where a variant's error sits).

Systems:
- baselines, what a 512-token server does: full attention on the first 256 or 512 tokens;
  chunks of --chunk-tokens document tokens embedded one by one, then averaged ("naive chunks
  mean") or kept apart with a document scored by its best chunk ("naive chunks MaxP");
- every variant, one pass over each document (cut at --max-length), then from the same hidden
  states: one vector per pooling mode, and late chunks (the same chunk boundaries as the naive
  chunks, each the mean of its tokens' hidden states) scored MaxP. A variant given
  `--weights VARIANT=DIR` runs with those adapted weights, its rows named "VARIANT+adapted".
  With --precision, each variant's export at that precision ("VARIANT@int8") runs the same and
  also embeds the naive chunks, each alone (what its /embed_chunks serves with context none).
Queries go through the same encoder and pooling as the documents.

Writes OUT/quality.csv (appended to with --append) and OUT/quality.png (quality against cost,
one point per system).
"""
from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from attnserve.data.retrieval import first_sentence, passage, scores
from attnserve.data import DEV_DOCUMENTS, read_jsonl
from attnserve.contract.export_format import DEFAULT_PRECISION, parse_param
from attnserve.contract.model_folder import wrapping_ids
from attnserve.contract.pooling import POOLING_MODES, Pooling, naive_chunk_ids, pool_chunks, token_chunks

COLUMNS = ["system", "variant", "params", "pooling", "representation", "max_length", "chunk_tokens", "overlap_tokens",
           "documents", "summary_mrr", "summary_r1", "needle_mrr", "needle_r1", "seconds_per_doc", "cosine_to_full_512"]


def configure(parser):
    from attnserve.models.registry import variant_names

    parser.add_argument("--data", default=str(DEV_DOCUMENTS), help="JSONL (or .jsonl.gz) with a 'text' per line, optional 'query' and 'needle'")
    parser.add_argument("--variants", default=",".join(variant_names()), help="comma-separated variants ('' for baselines only)")
    parser.add_argument("--schedule", action="append", default=[], metavar="SCHEDULE",
                        help="also score this schedule, a variant per layer (e.g. linformer*5,longformer; repeatable); "
                             "--param SCHEDULE.KEY=VALUE and --weights SCHEDULE=DIR name it as written")
    parser.add_argument("--max-length", type=int, default=4096, help="documents are cut at this many tokens")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N documents (0 = all)")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="document tokens per chunk (naive and late chunks alike)")
    parser.add_argument("--overlap-tokens", type=int, default=0, help="tokens a late chunk shares with the one before")
    parser.add_argument("--poolings", default=",".join(POOLING_MODES), help=f"one-vector pooling modes to score ({', '.join(POOLING_MODES)})")
    parser.add_argument("--opening-weight", default=str(Pooling.opening_weight), help="pooling=opening: weight of the opening's mean; a comma-separated list scores each")
    parser.add_argument("--opening-tokens", type=int, default=256, help="pooling=opening: tokens in the opening")
    parser.add_argument("--param", action="append", default=[], metavar="VARIANT.KEY=VALUE", help="override a variant parameter (repeatable)")
    parser.add_argument("--weights", action="append", default=[], metavar="VARIANT=DIR",
                        help="run VARIANT with the adapted weights in DIR (`attnserve adapt variant --out DIR`); its rows are named VARIANT+adapted (repeatable)")
    parser.add_argument("--precision", default=DEFAULT_PRECISION, metavar="P[,P]",
                        help="also score each variant's export at these precisions (int8, float16) beside float32, "
                             "through ONNX Runtime; their rows are named VARIANT@PRECISION")
    parser.add_argument("--exports-dir", default="~/.cache/attnserve",
                        help="where --precision's exports are made or found, a folder per recipe (default: the one "
                             "`attnserve serve` uses, which then serves the export scored)")
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True, help="also score the 512-token-server baselines")
    parser.add_argument("--cosine", action=argparse.BooleanOptionalAction, default=True, help="also measure each variant's cosine to full on the first 512 tokens")
    parser.add_argument("--by-layer", action="store_true", help="also each variant's cosine to full on the first 512 tokens "
                        "with only one layer the variant's, the others full attention (writes OUT/by_layer.csv)")
    parser.add_argument("--by-layer-against", default="", metavar="VARIANT",
                        help="--by-layer against this variant or schedule on the whole documents (cut at --max-length) "
                             "instead of full attention on the first 512 tokens: where a variant loses a long-context "
                             "deployment, layer by layer")
    parser.add_argument("--out", default="reports/quality", help="folder for quality.csv and quality.png")
    parser.add_argument("--append", action="store_true", help="add rows to an existing quality.csv instead of replacing it")


# --------------------------------------------------------------------------- data


def load_documents(path: str | Path, limit: int = 0, seed: int = 0) -> list[dict]:
    """Rows with text, query and needle: given ones kept, missing ones made from the text."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"{path}: no such file; pass --data with a JSONL of documents (one {{'text': ...}} per line)")
    rows = read_jsonl(path, limit)
    rng = np.random.default_rng(seed)
    out = []
    for index, row in enumerate(rows):
        if not isinstance(row.get("text"), str) or not row["text"].strip():
            raise SystemExit(f"{path}: line {index + 1} has no 'text'")
        text, query, needle = row["text"], row.get("query"), row.get("needle")
        if not query:
            query, text = first_sentence(text)
        if not needle:
            needle = passage(text, rng)
        out.append({"id": row.get("id", str(index)), "text": text, "query": query, "needle": needle})
    return out


# --------------------------------------------------------------------------- systems


def document_ids(encoder, rows) -> list:
    """Each document's encoding, cut at the encoder's max_length."""
    return encoder.tokenizer.encode_batch([r["text"] for r in rows])


def first_tokens(encodings, n: int) -> list[list[int]]:
    """Each document's first n tokens, [CLS] and [SEP] included."""
    return [[e.ids[0]] + e.ids[1:-1][: n - 2] + [e.ids[-1]] for e in encodings]


def chunk_bounds(encodings, rows, chunk_tokens: int, overlap_tokens: int = 0):
    return [token_chunks(e.offsets, len(r["text"]), chunk_tokens, overlap_tokens, bool(e.overflowing)) for e, r in zip(encodings, rows)]


def naive_chunks(tokenizer, encodings, rows, chunk_tokens: int):
    """Each chunk's token ids as a text of its own ([CLS] chunk [SEP]) and the index of its
    document: what a 512-token server with a chunker embeds."""
    cls, sep = wrapping_ids(tokenizer)
    chunks, owner = [], []
    for index, bounds in enumerate(chunk_bounds(encodings, rows, chunk_tokens)):
        chunks += naive_chunk_ids(encodings[index].ids, bounds, cls, sep)
        owner += [index] * len(bounds)
    return chunks, np.array(owner)


def baselines(rows, encodings, args) -> list[dict]:
    """What a 512-token server does with the same documents and chunk boundaries."""
    from attnserve.models import load_encoder

    full = load_encoder("full", max_length=512)
    queries = full.embed([r["query"] for r in rows]).numpy()
    needles = full.embed([r["needle"] for r in rows]).numpy()
    results = []
    for keep in (256, 512):
        start = time.perf_counter()
        docs = full.embed_ids(first_tokens(encodings, keep)).numpy()
        results.append(_row(f"baseline: first {keep} tokens", scores(queries, needles, docs), time.perf_counter() - start, len(rows)))
    chunks, owner = naive_chunks(full.tokenizer, encodings, rows, args.chunk_tokens)
    start = time.perf_counter()
    vectors = np.concatenate([full.embed_ids(chunks[i : i + 256]).numpy() for i in tqdm(range(0, len(chunks), 256), desc="naive chunks", unit="x256")])
    seconds = time.perf_counter() - start
    mean = np.stack([vectors[owner == i].mean(0) for i in range(len(rows))])
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    results.append(_row("baseline: naive chunks mean", scores(queries, needles, mean), seconds, len(rows)))
    results.append(_row("baseline: naive chunks MaxP", scores(queries, needles, vectors, owner), seconds, len(rows)))
    return results


def evaluate_variant(variant: str, params: dict, rows, args, full_head, weights_dir=None,
                     precision: str = DEFAULT_PRECISION) -> list[dict]:
    """One pass per document; every pooling and the late chunks from the same hidden states.
    `weights_dir`: adapted weights to load the encoder with; a `precision` other than float32
    runs the variant's export at that precision through ONNX Runtime instead of PyTorch."""
    from attnserve.models import load_encoder

    system = f"{variant}+adapted" if weights_dir is not None else variant
    if precision == DEFAULT_PRECISION:
        encoder = load_encoder(variant, max_length=args.max_length, weights=weights_dir, **params)
    else:
        from attnserve.export.exporter import cached_export
        from attnserve.bench.precision import ExportedEncoder
        from attnserve.export.recipe import Recipe

        # With its attention maps: the export `attnserve serve --precision` makes, so it serves the one scored here.
        recipe = Recipe.resolve(variant, params, args.max_length, weights=weights_dir, precision=precision)
        export_dir = cached_export(Path(args.exports_dir).expanduser(), recipe, log=lambda m: print(m, flush=True))
        encoder, system = ExportedEncoder(export_dir, torch.get_num_threads()), f"{system}@{precision}"
    weights = [float(w) for w in str(args.opening_weight).split(",") if w]
    poolings = {}
    for mode in (m for m in args.poolings.split(",") if m):
        for weight in weights if mode == "opening" else [weights[0]]:
            label = f"opening {weight:g}" if mode == "opening" else mode
            poolings[label] = Pooling(mode, weight, args.opening_tokens)
    encodings = document_ids(encoder, rows)
    bounds = chunk_bounds(encodings, rows, args.chunk_tokens, args.overlap_tokens)
    pooled = {label: [] for label in poolings}
    late, owner = [], []
    seconds = 0.0
    for index, encoding in enumerate(tqdm(encodings, desc=system, unit="doc")):
        start = time.perf_counter()
        (hidden,) = encoder.token_states([encoding.ids])
        seconds += time.perf_counter() - start
        for label, pooling in poolings.items():
            pooled[label].append(pooling(hidden))
        late.append(pool_chunks(hidden, bounds[index]))
        owner += [index] * len(bounds[index])
    query_states = encoder.token_states(encoder.tokenize([r["query"] for r in rows]))
    needle_states = encoder.token_states(encoder.tokenize([r["needle"] for r in rows]))
    cosine = float("nan")
    if full_head is not None:
        head = encoder.embed_ids(first_tokens(encodings, 512)).numpy()
        cosine = float((head * full_head).sum(1).mean())
    results = []
    for label, pooling in poolings.items():
        queries = np.stack([pooling(h) for h in query_states])
        needles = np.stack([pooling(h) for h in needle_states])
        result = scores(queries, needles, np.stack(pooled[label]))
        results.append(_row(system, result, seconds, len(rows), variant, params, label, "one vector", cosine))
    mean = Pooling("mean")
    queries = np.stack([mean(h) for h in query_states])
    needles = np.stack([mean(h) for h in needle_states])
    result = scores(queries, needles, np.concatenate(late), np.array(owner))
    results.append(_row(system, result, seconds, len(rows), variant, params, "mean", "late chunks MaxP", cosine))
    if precision != DEFAULT_PRECISION:
        # What this export serves on /embed_chunks by default (context none): each chunk alone,
        # to set beside the float32 baseline of the same boundaries.
        chunks, chunk_owner = naive_chunks(encoder.tokenizer, encodings, rows, args.chunk_tokens)
        start = time.perf_counter()
        vectors = encoder.embed_ids(chunks).numpy()
        result = scores(queries, needles, vectors, chunk_owner)
        results.append(_row(system, result, time.perf_counter() - start, len(rows), variant, params, "mean", "naive chunks MaxP", cosine))
    return results


def layer_row(variant: str, params: dict, encodings, args, teacher, weights_dir=None) -> dict:
    """The cosine to the teacher with only layer i the variant's, per layer: full attention on
    the first 512 tokens, or with --by-layer-against the teacher's variant on whole documents."""
    from attnserve.models import load_encoder
    from attnserve.train.adapt import layer_cosines

    encoder = load_encoder(variant, max_length=args.max_length, weights=weights_dir, **params)
    ids = [e.ids for e in encodings] if args.by_layer_against else first_tokens(encodings, 512)
    with tqdm(total=len(ids), desc=f"{variant} by layer", unit="doc") as bar:
        cosines = layer_cosines(encoder, teacher, ids, progress=bar.update)
    system = f"{variant}+adapted" if weights_dir is not None else variant
    return {"system": system, "params": json.dumps(params, sort_keys=True), **{f"layer_{i}": c for i, c in enumerate(cosines)}}


def _row(system, result, seconds, documents, variant="", params=None, pooling="mean", representation="", cosine=float("nan")) -> dict:
    return {"system": system, "variant": variant, "params": json.dumps(params or {}, sort_keys=True), "pooling": pooling,
            "representation": representation or system.removeprefix("baseline: "), "documents": documents,
            "seconds_per_doc": seconds / max(documents, 1), "cosine_to_full_512": cosine, **result}


# --------------------------------------------------------------------------- command


def variant_params(items) -> dict[str, dict]:
    """`--param VARIANT.KEY=VALUE` flags (repeatable) as {VARIANT: {KEY: VALUE}}: the part
    before the first dot names a variant or schedule as written (`compressed*5,longformer.
    compressed.stride=2` sets the schedule's compressed.stride). ValueError for a malformed one."""
    params: dict[str, dict] = {}
    for item in items:
        try:
            key, value = parse_param(item)
        except ValueError:
            key, value = "", None
        variant, _, name = key.partition(".")
        if not name:
            raise ValueError(f"--param wants VARIANT.KEY=VALUE (got {item!r})")
        params.setdefault(variant, {})[name] = value
    return params


def quality_command(args) -> int:
    from attnserve.models import load_encoder
    from attnserve.models.registry import make_config, precision_refused

    rows = load_documents(args.data, args.limit)
    try:
        params = variant_params(args.param)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    variants = [v for v in args.variants.split(",") if v] + list(args.schedule)
    weights_dirs = parse_weights(args.weights, variants)
    from attnserve.bench.precision import parse_precisions

    try:
        precisions = parse_precisions(args.precision)
    except ValueError as exc:
        raise SystemExit(f"--precision: {exc}") from None
    print(f"{len(rows)} documents from {args.data}, cut at {args.max_length} tokens; chunks of {args.chunk_tokens} tokens"
          f"{f', overlap {args.overlap_tokens}' if args.overlap_tokens else ''}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "quality.csv"
    if not args.append or not csv_path.exists():
        with open(csv_path, "w", newline="") as f:
            csv.writer(f).writerow(COLUMNS)
    print("| system | pooling | representation | summary MRR | summary R@1 | needle MRR | needle R@1 | s/doc | cosine to full (512) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    results = []

    def emit(new):
        for r in new:
            r.update(max_length=args.max_length, chunk_tokens=args.chunk_tokens, overlap_tokens=args.overlap_tokens)
            cosine = "-" if np.isnan(r["cosine_to_full_512"]) else f"{r['cosine_to_full_512']:.4f}"
            label = r["system"] + (f" {r['params']}" if r["params"] != "{}" else "")
            print(f"| {label} | {r['pooling']} | {r['representation']} | {r['summary_mrr']:.3f} | {r['summary_r1']:.3f} | "
                  f"{r['needle_mrr']:.3f} | {r['needle_r1']:.3f} | {r['seconds_per_doc']:.3f} | {cosine} |", flush=True)
        with open(csv_path, "a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writerows({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()} for r in new)
        results.extend(new)

    # Every document tokenized once, cut at --max-length (the tokenizer is the same for all variants).
    encodings = document_ids(load_encoder("full", max_length=args.max_length), rows)
    if args.baselines:
        emit(baselines(rows, encodings, args))
    # Full attention on the first 512 tokens: what --cosine and --by-layer compare a variant with.
    teacher = load_encoder("full", max_length=512) if variants and (args.cosine or args.by_layer) else None
    full_head = teacher.embed_ids(first_tokens(encodings, 512)).numpy() if args.cosine and teacher else None
    if args.by_layer and args.by_layer_against:
        teacher = load_encoder(args.by_layer_against, max_length=args.max_length)
    layer_rows = []
    for variant in variants:
        refused = precision_refused(make_config(variant, args.max_length, **params.get(variant, {})))
        for precision in precisions:
            if precision in refused:  # the other precisions still run
                print(f"{variant} cannot be exported in {precision}: {refused[precision]}", flush=True)
                continue
            with torch.no_grad():
                emit(evaluate_variant(variant, params.get(variant, {}), rows, args, full_head, weights_dirs.get(variant),
                                      precision))
        if args.by_layer:
            layer_rows.append(layer_row(variant, params.get(variant, {}), encodings, args, teacher, weights_dirs.get(variant)))
    plot(csv_path, out / "quality.png")
    print(f"wrote {csv_path} and {out / 'quality.png'}")
    if layer_rows:
        print_layer_rows(layer_rows, out / "by_layer.csv", args.by_layer_against)
    return 0


def print_layer_rows(layer_rows: list[dict], path: Path, against: str = "") -> None:
    layers = [k for k in layer_rows[0] if k.startswith("layer_")]
    if against:
        print(f"\nCosine to {against} on the whole documents with only one layer the variant's (the others {against}'s):")
    else:
        print("\nCosine to full on the first 512 tokens with only one layer the variant's (the others full attention):")
    print("| system | " + " | ".join(f"layer {k.removeprefix('layer_')}" for k in layers) + " |")
    print("|---|" + "---|" * len(layers))
    for r in layer_rows:
        label = r["system"] + (f" {r['params']}" if r["params"] != "{}" else "")
        print(f"| {label} | " + " | ".join(f"{r[k]:.4f}" for k in layers) + " |")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(layer_rows[0]))
        writer.writeheader()
        writer.writerows({k: (f"{v:.5f}" if isinstance(v, float) else v) for k, v in r.items()} for r in layer_rows)
    print(f"wrote {path}")


def parse_weights(items: list[str], variants: list[str]) -> dict[str, str]:
    """--weights VARIANT=DIR items as {variant: dir}; each variant once, and one that runs."""
    from attnserve.models.registry import variant_names
    from attnserve.models.schedule import parse_schedule
    from attnserve.models.weights import WeightsError, check_weights_dir

    weights: dict[str, str] = {}
    for item in items:
        variant, sep, directory = item.partition("=")
        if not sep or not variant or not directory:
            raise SystemExit(f"--weights wants VARIANT=DIR (got {item!r})")
        if variant in weights:
            raise SystemExit(f"--weights names {variant} twice; give one weights directory per variant")
        if variant not in variants:
            raise SystemExit(f"--weights {item}: {variant} is not among --variants ({','.join(variants)}); add it there")
        try:  # before any document is embedded: the baselines alone take minutes
            check_weights_dir(directory, parse_schedule(variant, variant_names()))
        except WeightsError as exc:
            raise SystemExit(f"--weights {item}: {exc}") from None
        weights[variant] = directory
    return weights


def plot(csv_path: Path, path: Path) -> None:
    """Summary and needle MRR against seconds per document, one point per row of the CSV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    markers = {"one vector": "o", "late chunks MaxP": "^", "naive chunks MaxP": "v"}
    suffixes = {"late chunks MaxP": " late", "naive chunks MaxP": " naive"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), sharex=True)
    for ax, task in zip(axes, ("summary", "needle")):
        for r in rows:
            x, y = float(r["seconds_per_doc"]), float(r[f"{task}_mrr"])
            baseline = r["system"].startswith("baseline")
            label = r["system"].removeprefix("baseline: ") if baseline else f"{r['system']} {r['pooling']}" + suffixes.get(r["representation"], "")
            ax.scatter([max(x, 1e-3)], [y], marker="s" if baseline else markers.get(r["representation"], "o"),
                       color="black" if baseline else None, s=22)
            ax.annotate(label, (max(x, 1e-3), y), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.set(xscale="log", xlabel="seconds per document (CPU)", ylabel=f"{task} MRR", title=f"{task} retrieval")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
    fig.suptitle(f"{rows[0]['documents']} documents, cut at {rows[0]['max_length']} tokens: quality against cost "
                 "(squares: 512-token baselines, circles: one vector, triangles: late chunks MaxP)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
