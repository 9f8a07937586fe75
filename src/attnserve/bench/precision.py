"""Precision beside float32: `attnserve bench runtime --precision` and `bench quality --precision`.

Runtime: each variant exported at float32 and at each precision asked for (int8 and float16
exports are converted from the float32 one, src/attnserve/export/precision.py), then at each length
one forward of the same random tokens through OnnxRunner per precision, in rounds (every
precision once per round, so a slow phase of a shared machine hits them alike); the speedup is
float32's median over the precision's. In the same rounds runs the ceiling: float32's graph with
every weight product (what int8 and float16 convert) replaced by a copy of its output's shape,
as if lower precision made those products free; float32's time over its time is the most any
precision of them can gain. (ONNX Runtime's profiler is no measure of that share: its per-node
overhead inflates the thousand small nodes around the products.)

Quality: an ExportedEncoder runs a variant's export at that precision with the interface
attnserve.bench.quality scores PyTorch encoders through (tokenize, token_states, embed_ids).

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from attnserve.service.batching import pad
from attnserve.contract.export_format import DEFAULT_PRECISION, PRECISIONS, pad_to
from attnserve.bench.timing import interleaved_samples


def parse_precisions(text: str) -> list[str]:
    """--precision's comma-separated list as [float32, *others] (ValueError naming the valid ones)."""
    asked = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in asked if p not in PRECISIONS]
    if unknown or not asked:
        raise ValueError(f"unknown precision(s) {', '.join(unknown) or repr(text)}; valid: {', '.join(PRECISIONS)}")
    return [DEFAULT_PRECISION, *dict.fromkeys(p for p in asked if p != DEFAULT_PRECISION)]


def random_tokens(length: int, seed: int = 0):
    rng = np.random.default_rng(seed + length)
    ids = rng.integers(1000, 29000, (1, length)).astype(np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    return ids, np.ones_like(ids)


def products_free(graph: Path, out: Path) -> Path:
    """`graph` (float32) with every weight product (attnserve.export.precision.weight_products) replaced
    by a copy of its input cut or tiled to the product's width: the same graph around free
    products, whose outputs mean nothing. Timing only."""
    from onnx import helper, numpy_helper

    from attnserve.export.precision import _folded, rewrite_products

    def copied(node, weight, model):
        din, dout = weight.dims
        wide = f"{node.name}.tiled"
        cut = [numpy_helper.from_array(np.array([v], dtype=np.int64), f"{node.name}.{k}") for k, v in
               (("start", 0), ("end", dout), ("axis", -1))]
        model.graph.initializer.extend(cut)
        return [helper.make_node("Concat", [node.input[0]] * -(-dout // din), [wide], axis=-1, name=wide),
                helper.make_node("Slice", [wide, *(t.name for t in cut)], [node.output[0]], name=node.name)]

    with tempfile.TemporaryDirectory(prefix="attnserve-products-free-") as scratch:
        folded = Path(scratch) / "folded.onnx"
        _folded(graph, folded)
        rewrite_products(folded, out, copied)
    return out


def bench_precision(variants, lengths, precisions, repeats: int = 5, threads: int = 0, exports_dir=None,
                    log=print) -> list[dict]:
    """Rows per variant, length and precision: median ms, speedup over float32, the cosine of
    its embedding to float32's, and for float32 the ceiling (float32's time over that of its
    graph with free weight products, products_free)."""
    import torch

    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe
    from attnserve.service.runtime import OnnxRunner

    threads = threads or torch.get_num_threads()
    root = Path(exports_dir) if exports_dir else Path(tempfile.mkdtemp(prefix="attnserve-bench-precision-"))
    rows = []
    try:
        for variant in variants:
            runners = {}
            for precision in precisions:
                started = time.perf_counter()
                try:
                    recipe = Recipe.resolve(variant, {}, max(lengths), analysis=False, precision=precision)
                    export_dir = cached_export(root, recipe, log=lambda m: None)
                except ValueError as exc:  # a precision the variant cannot take
                    log(f"{variant} {precision}: {exc}")
                    rows.append({"variant": variant, "precision": precision, "error": str(exc)})
                    continue
                runners[precision] = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=threads)
                log(f"{variant} {precision}: exported and loaded in {time.perf_counter() - started:.0f}s")
            free = free_sessions(runners[DEFAULT_PRECISION], root / f".{variant}-products-free", threads)
            for length in lengths:
                ids, mask = random_tokens(length)
                reference = runners[DEFAULT_PRECISION].embed(ids, mask)
                cosine = {p: float((r.embed(ids, mask) * reference).sum()) for p, r in runners.items()}
                calls = {p: (lambda r=r: r.embed(ids, mask)) for p, r in runners.items()}
                graph, multiple = graph_for(runners[DEFAULT_PRECISION], length)
                feeds = dict(zip(("input_ids", "attention_mask"), pad_to(ids, mask, multiple)))
                calls["free"] = lambda s=free[graph]: s.run(["sentence_embedding"], feeds)
                samples = interleaved_samples(calls, repeats)
                ms = {p: float(np.median(s)) * 1e3 for p, s in samples.items()}
                for precision in runners:
                    row = {"variant": variant, "length": length, "precision": precision, "ms": ms[precision],
                           "speedup": ms[DEFAULT_PRECISION] / ms[precision], "cosine_to_float32": cosine[precision],
                           "threads": threads, "repeats": repeats}
                    if precision == DEFAULT_PRECISION:
                        row.update(products_free_ms=ms["free"], ceiling=ms[DEFAULT_PRECISION] / ms["free"])
                    rows.append(row)
                log(f"{variant:12s} {length:6d}  " + "  ".join(f"{p} {ms[p]:8.1f} ms ({ms[DEFAULT_PRECISION] / ms[p]:.2f}x, "
                                                             f"cos {cosine[p]:.4f})" for p in runners)
                    + f"  products free {ms['free']:8.1f} ms (ceiling {ms[DEFAULT_PRECISION] / ms['free']:.2f}x)")
            del runners, free
    finally:
        if not exports_dir:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def graph_for(runner, length: int) -> tuple[str, int]:
    """The graph OnnxRunner runs `length` tokens on, and the multiple it pads them to."""
    if runner.short_max_length and length <= runner.short_max_length:
        return "short", 1
    return "embedding", runner.length_multiple


def free_sessions(runner, folder: Path, threads: int) -> dict:
    """An ONNX Runtime session of each of the runner's graphs with free weight products."""
    import onnxruntime as ort

    folder.mkdir(parents=True, exist_ok=True)
    sessions = {}
    for graph in ("embedding", "short"):
        spec = getattr(runner.export_manifest.graphs, graph)
        if spec is None:
            continue
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = threads
        path = products_free(runner.export_dir / spec.file, folder / spec.file)
        sessions[graph] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return sessions


def precision_table(rows: list[dict], precisions: list[str]) -> list[str]:
    """Markdown: per variant and length, float32's ms, each precision's speedup (ms), and the
    ceiling: float32 with free weight products."""
    others = [p for p in precisions if p != DEFAULT_PRECISION]
    cell = {(r["variant"], r["length"], r["precision"]): r for r in rows if "ms" in r}
    head = ["variant", "tokens", "float32", *[f"{p} (speedup, cosine)" for p in others], "float32, weight products free (ceiling)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = dict.fromkeys((r["variant"], r["length"]) for r in rows if "ms" in r)
    for variant, length in keys:
        base = cell[(variant, length, DEFAULT_PRECISION)]
        cells = [variant, str(length), f"{base['ms']:.1f} ms"]
        for p in others:
            r = cell.get((variant, length, p))
            cells.append(f"{r['ms']:.1f} ms ({r['speedup']:.2f}x, {r['cosine_to_float32']:.4f})" if r else "refused")
        cells.append(f"{base['products_free_ms']:.1f} ms ({base['ceiling']:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


class ExportedEncoder:
    """A variant's export at one precision, scored the way attnserve.bench.quality scores a PyTorch
    encoder: tokenizer, tokenize(), token_states() and embed_ids() (the model's own pooling)."""

    def __init__(self, export_dir: Path, threads: int = 0):
        from tokenizers import Tokenizer

        from attnserve.service.runtime import OnnxRunner

        self.runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=threads)
        self.tokenizer = Tokenizer.from_file(str(Path(export_dir) / "tokenizer.json"))
        self.tokenizer.no_padding()  # the file pads a batch to its longest text, which would feed [PAD] as tokens
        self.tokenizer.enable_truncation(self.runner.max_length)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def token_states(self, ids: list[list[int]], batch: int = 32) -> list[np.ndarray]:
        out = []
        for start in range(0, len(ids), batch):
            part = ids[start : start + batch]
            hidden = self.runner.hidden_states(*pad(part))
            out += [hidden[row, : len(i)] for row, i in enumerate(part)]
        return out

    def embed_ids(self, ids: list[list[int]], batch: int = 32):
        import torch

        return torch.from_numpy(np.concatenate([self.runner.embed(*pad(ids[s : s + batch]))
                                                for s in range(0, len(ids), batch)]))
