"""`python -m research.context cache`: run the frozen encoder once over training documents and keep what
the context heads (research/context/heads.py) learn from, so that training never runs the encoder.

For each document, cut at max_length tokens and split into the deployment's chunks
(`chunk_tokens` document tokens each, the boundaries /embed_chunks uses):

    hidden    (n, d)  the last hidden states of one pass over the whole document (the long pass)
    late      (C, d)  each chunk's mean hidden state from that pass (late chunking), unnormalised
    naive     (C, d)  each chunk embedded alone, [CLS] chunk [SEP], L2-normalised (naive chunking)
    query     (d,)    the document's query (its title or description), embedded alone
    passages  (P, d)  P passages of 30 words from the kept text, embedded alone
    passage_chunk (P,) the chunk each passage starts in
    needle    (d,)    the document's own needle passage, where it has one (the dev set's)

all float16 but passage_chunk, through the deployment's ONNX export (the graphs serving runs,
so a head learns on the states a deployment computes). Queries and passages are short texts: they get
the vectors the service gives any short text. Shards of `shard` documents are written
atomically (temporary file, then rename), so an interrupted run resumes where it stopped;
cache.json says what the cache was built from and refuses to mix recipes in one folder.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from attnserve.data import read_jsonl
from attnserve.contract.pooling import naive_chunk_ids, pool_chunks, token_chunks

CACHE_FORMAT = 1
CACHE_FILE = "cache.json"
PASSAGE_WORDS = 30


class CacheError(ValueError):
    """A cache folder that cannot be used as asked; the message says why and what to do."""


def passages(text: str, count: int, rng: np.random.Generator, end_char: int) -> list[tuple[str, int]]:
    """Up to `count` distinct passages of PASSAGE_WORDS consecutive words that start before
    end_char (the kept text), as (passage, character offset of its first word)."""
    words = [(m.start(), m.group()) for m in re.finditer(r"\S+", text[:end_char])]
    if len(words) < PASSAGE_WORDS:
        return [(" ".join(w for _, w in words), 0)] if words else []
    starts = rng.choice(len(words) - PASSAGE_WORDS + 1, size=min(count, len(words) - PASSAGE_WORDS + 1), replace=False)
    return [(" ".join(w for _, w in words[s : s + PASSAGE_WORDS]), words[s][0]) for s in sorted(starts)]


def chunk_of(bounds, char: int) -> int:
    """Index of the chunk whose character range holds `char`."""
    for index, b in enumerate(bounds):
        if b.start <= char < b.end:
            return index
    return len(bounds) - 1


class ExportRunner:
    """One export's embedding graphs through ONNX Runtime (its short graph for inputs it takes,
    as serving picks it), and its tokenizer cutting at max_length."""

    def __init__(self, export_dir: Path, threads: int = 0):
        from tokenizers import Tokenizer

        from attnserve.export.verify import ort_session
        from attnserve.contract.export_format import TOKENIZER_FILE, read_manifest

        export_dir = Path(export_dir)
        self.manifest = read_manifest(export_dir)
        self.max_length, self.hidden_size = self.manifest.max_length, self.manifest.hidden_size
        self.main = ort_session(export_dir / self.manifest.graphs.embedding.file, threads)
        short = self.manifest.graphs.short
        self.short = ort_session(export_dir / short.file, threads) if short else None
        self.short_max_length = short.max_length if short else 0
        self.tokenizer = Tokenizer.from_file(str(export_dir / TOKENIZER_FILE))
        self.tokenizer.enable_truncation(self.max_length)
        self.tokenizer.no_padding()

    def run(self, ids: list[list[int]], output: str) -> np.ndarray:
        """(B, hidden) sentence_embedding or (B, N, hidden) last_hidden_state of right-padded ids."""
        from attnserve.contract.export_format import pad_to

        width = max(len(x) for x in ids)
        batch = np.zeros((len(ids), width), dtype=np.int64)
        mask = np.zeros_like(batch)
        for i, x in enumerate(ids):
            batch[i, : len(x)], mask[i, : len(x)] = x, 1
        if width <= self.short_max_length:
            session, (batch, mask) = self.short, pad_to(batch, mask, 1, self.manifest.min_length)
        else:
            session, (batch, mask) = self.main, pad_to(batch, mask, self.manifest.length_multiple, self.manifest.min_length)
        return session.run([output], {"input_ids": batch, "attention_mask": mask})[0]


class CacheWriter:
    """The frozen parts, through one export: the long pass and short texts alike."""

    def __init__(self, export_dir: Path, chunk_tokens: int, threads: int = 0):
        self.runner = ExportRunner(export_dir, threads)
        self.tokenizer = self.runner.tokenizer
        self.chunk_tokens = chunk_tokens

    def embed(self, ids: list[list[int]], batch_tokens: int = 8192) -> np.ndarray:
        """(len(ids), hidden) unit mean-pooled vectors, in batches of about batch_tokens."""
        out, start = [], 0
        while start < len(ids):
            width, stop = len(ids[start]), start + 1
            while stop < len(ids) and (stop - start + 1) * max(width, len(ids[stop])) <= batch_tokens:
                width = max(width, len(ids[stop]))
                stop += 1
            out.append(self.runner.run(ids[start:stop], "sentence_embedding"))
            start = stop
        return np.concatenate(out) if out else np.zeros((0, self.runner.hidden_size), np.float32)

    def long_pass(self, ids: list[int]) -> np.ndarray:
        """(n, hidden) last hidden states of one document."""
        return self.runner.run([ids], "last_hidden_state")[0, : len(ids)]

    def encode(self, text: str):
        """(ids, chunk bounds) of a document cut at max_length."""
        encoding = self.tokenizer.encode(text)
        bounds = token_chunks(encoding.offsets, len(text), self.chunk_tokens, 0, bool(encoding.overflowing))
        return list(encoding.ids), bounds

    def document(self, row: dict, passages_per_doc: int, rng: np.random.Generator) -> dict:
        ids, bounds = self.encode(row["text"])
        hidden = self.long_pass(ids)
        late = pool_chunks(hidden, bounds, normalize=False)
        cls, sep = ids[0], ids[-1]
        naive = self.embed(naive_chunk_ids(ids, bounds, cls, sep))
        picked = passages(row["text"], passages_per_doc, rng, bounds[-1].end)
        needle = [row["needle"]] if row.get("needle") else []
        texts = [row["query"]] + needle + [p for p, _ in picked]
        short = self.embed([e.ids for e in self.tokenizer.encode_batch(texts)])
        extra = {"needle": short[1].astype(np.float16)} if needle else {}
        short = np.concatenate([short[:1], short[1 + len(needle):]])
        return {**extra, "hidden": hidden.astype(np.float16), "late": late.astype(np.float16), "naive": naive.astype(np.float16),
                "query": short[0].astype(np.float16), "passages": short[1:].astype(np.float16),
                "passage_chunk": np.array([chunk_of(bounds, c) for _, c in picked], dtype=np.int32)}


def build_cache(data: str | Path, out: str | Path, export_dir, recipe: dict, *, chunk_tokens: int = 256,
                passages_per_doc: int = 8, shard: int = 16, limit: int = 0, seed: int = 0, threads: int = 0,
                progress=None) -> Path:
    """Fill `out` with shards for every document of `data` (the first `limit` when > 0);
    shards already there are kept. `export_dir`: the export's folder, or a function that makes
    it (called only if a shard is missing). Returns out."""
    rows = [r for r in read_jsonl(data, limit) if isinstance(r.get("text"), str) and r["text"].strip() and r.get("query")]
    if not rows:
        raise CacheError(f"{data}: no document with both 'text' and 'query'; build one with research/training_docs.py")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": CACHE_FORMAT, "data": str(Path(data).resolve()), "documents": len(rows), "chunk_tokens": chunk_tokens,
            "passages_per_doc": passages_per_doc, "shard": shard, "seed": seed, "recipe": recipe}
    meta_path = out / CACHE_FILE
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if _identity(old) != _identity(meta):
            raise CacheError(f"{out}: holds a cache of another recipe or data ({meta_path}); pass another --out or delete it")
    else:
        meta_path.write_text(json.dumps(meta, indent=1))
    writer = None
    shards = range(0, len(rows), shard)
    for number, first in enumerate(shards):
        path = out / f"shard-{number:05d}.npz"
        if not path.is_file():
            if writer is None:  # only when a shard is missing: a complete cache needs no export
                writer = CacheWriter(export_dir() if callable(export_dir) else export_dir, chunk_tokens, threads)
            rng = np.random.default_rng([seed, number])
            docs = [writer.document(row, passages_per_doc, rng) for row in rows[first : first + shard]]
            arrays = {f"{i}/{key}": value for i, doc in enumerate(docs) for key, value in doc.items()}
            scratch = path.with_suffix(".tmp.npz")
            np.savez(scratch, **arrays)
            os.replace(scratch, path)
        if progress:
            progress(min(shard, len(rows) - first))
    meta["complete"] = True
    meta_path.write_text(json.dumps(meta, indent=1))
    return out


def _identity(meta: dict) -> dict:
    """What makes two caches the same: the data, the chunking, the passages and the frozen
    model's outputs (variant, parameters, max_length, weights), not the code version."""
    recipe = {k: meta["recipe"].get(k) for k in ("variant", "parameters", "max_length", "weights_sha256")}
    return {**{k: v for k, v in meta.items() if k not in ("complete", "recipe")}, "recipe": recipe}


def load_cache(folder: str | Path) -> tuple[dict, list[dict]]:
    """(cache.json, one dict of arrays per document) of a complete cache."""
    folder = Path(folder)
    meta_path = folder / CACHE_FILE
    if not meta_path.is_file():
        raise CacheError(f"{folder}: no {CACHE_FILE}; build the cache first with `python -m research.context cache --out {folder}`")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != CACHE_FORMAT:
        raise CacheError(f"{meta_path}: cache format {meta.get('format')}, this attnserve reads {CACHE_FORMAT}; rebuild it")
    if not meta.get("complete"):
        raise CacheError(f"{folder}: the cache is not complete; run `python -m research.context cache` again with the same options to finish it")
    docs = []
    for number in range((meta["documents"] + meta["shard"] - 1) // meta["shard"]):
        with np.load(folder / f"shard-{number:05d}.npz") as shard:
            grouped: dict[int, dict] = {}
            for key in shard.files:
                index, _, name = key.partition("/")
                grouped.setdefault(int(index), {})[name] = shard[key]
            docs += [grouped[i] for i in sorted(grouped)]
    return meta, docs


# --------------------------------------------------------------------------- command


def configure(parser) -> None:
    from attnserve.data import TRAIN_DOCUMENTS

    parser.add_argument("--data", action="append", default=[],
                        help="documents, .jsonl or .jsonl.gz with 'text' and 'query' (repeatable; default: the bundled "
                             "data/longdocs-train.jsonl.gz): training documents for `train`, or a report set for "
                             "`bench`; never train on the documents you report on")
    parser.add_argument("--out", required=True, help="cache folder (one per --data file: FOLDER/<file name>)")
    parser.add_argument("--variant", default="longformer", help="the deployment's attention variant (default longformer)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="variant parameter (repeatable)")
    parser.add_argument("--max-length", type=int, default=4096, help="documents are cut at this many tokens (default 4096)")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="document tokens per chunk (default 256)")
    parser.add_argument("--passages", type=int, default=8, help="30-word passages kept per document as queries (default 8)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N documents of each file (0: all)")
    parser.add_argument("--models-dir", default="~/.cache/attnserve", help="where the export is made or found (serve's --models-dir)")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (default: its choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(default_data=str(TRAIN_DOCUMENTS))


def cache_command(args) -> int:
    import functools
    import sys

    from tqdm import tqdm

    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe
    from attnserve.contract.export_format import parse_params

    try:
        params = parse_params(args.param)
        files = args.data or [args.default_data]
        missing = [f for f in files if not Path(f).is_file()]
        if missing:
            raise CacheError(f"--data {missing[0]}: no such file")
        # The export `attnserve serve --models-dir` makes and serves (analysis graph included).
        resolved = Recipe.resolve(args.variant, params, args.max_length)
        export_dir = functools.partial(cached_export, Path(args.models_dir).expanduser(), resolved)
        recipe = resolved.record()
        for data in files:
            out = Path(args.out) / Path(data).name.split(".")[0]
            total = len(read_jsonl(data, args.limit))
            with tqdm(total=total, desc=f"cache {Path(data).name}", unit="doc") as bar:
                build_cache(data, out, export_dir, recipe, chunk_tokens=args.chunk_tokens, passages_per_doc=args.passages,
                            limit=args.limit, seed=args.seed, threads=args.threads, progress=bar.update)
            print(f"wrote {out}")
    except (CacheError, ValueError) as exc:
        print(f"research.context cache: {exc}", file=sys.stderr)
        return 2
    return 0
