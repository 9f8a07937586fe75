"""`attnserve bench runtime`: ONNX Runtime against PyTorch eager, side by side in one run.

For each variant: export its embedding graph once (max_length = the longest length asked
for), then at each length time one forward of a batch of random tokens in PyTorch eager and
in ONNX Runtime (same thread count), and print the medians and the ratio eager / ORT (> 1:
ORT is faster). Beside them, the FLOPs of the forward (matrix products and attention
kernels) and the rate each runtime reaches, against the machine's matrix-multiply rate: their
ratio, the "ceiling", is the most any runtime could gain over eager by running every counted
FLOP at that rate. With --output-pruning it also measures whether asking ONNX Runtime for the
embedding alone skips the attention-map outputs of a graph that has both (it does not,
which is why exports have a separate analysis graph).

With --short-inputs it times short texts instead (16 and 128 tokens by default) through
OnnxRunner on every variant, as a latency ratio to full, all variants in the same rounds: a
variant exact on them runs its export's short graph (src/attnserve/export/exporter.py); the others run their
own graph padded to its granule. Variants with a short graph are also timed on their main
graph alone, which is what an export without the short graph runs.

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnserve.bench.flops import count_flops, matmul_peak_flops
from attnserve.bench.procfs import proc_bytes
from attnserve.bench.timing import interleaved_medians, median_seconds

DEFAULT_LENGTHS = (512, 4096, 16384)
SHORT_LENGTHS = (16, 128)  # a retrieval query, a short passage
SHORT_EXPORT_LENGTH = 1024
SHORT_TARGET = 1.1  # latency ratio to full a variant exact on an input should stay within


def configure_bench_runtime(parser) -> None:
    parser.add_argument("--variants", default="all", help="comma-separated variants, or all (default)")
    parser.add_argument("--schedule", action="append", default=[], metavar="SCHEDULE",
                        help="also time this schedule, a variant per layer (e.g. linformer*5,longformer; repeatable)")
    parser.add_argument("--param", action="append", default=[], metavar="VARIANT.KEY=VALUE",
                        help="set a parameter of one timed variant or schedule, named as written "
                             "(compressed.stride=2, or compressed*5,longformer.compressed.stride=2; repeatable)")
    parser.add_argument("--lengths", default=None,
                        help=f"comma-separated sequence lengths (default {','.join(map(str, DEFAULT_LENGTHS))}; "
                             f"{','.join(map(str, SHORT_LENGTHS))} with --short-inputs)")
    parser.add_argument("--batch", type=int, default=1, help="documents per forward (default 1)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs per length below 8192 tokens, median (default 3; 21 rounds with --short-inputs)")
    parser.add_argument("--long-repeats", type=int, default=1, help="timed runs per length from 8192 tokens")
    parser.add_argument("--threads", type=int, default=0, help="threads for both PyTorch and ORT (0: all cores)")
    parser.add_argument("--exports-dir", default=None,
                        help="reuse/keep exports here, a folder per recipe as `attnserve serve --models-dir` names them "
                             "(default: a temporary directory)")
    parser.add_argument("--optimize", action="store_true", help="export with the exporter's onnxscript optimiser")
    parser.add_argument("--output-pruning", action="store_true", help="also measure embedding-only requests on a graph with attention outputs")
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    parser.add_argument("--precision", default=None, metavar="P[,P]",
                        help="time ONNX Runtime at these precisions (int8, float16) beside float32 instead of against "
                             "PyTorch: median of --repeats rounds (default 5), speedup over float32, embedding cosine "
                             "to float32, and the ceiling float32's matrix-product share sets")
    parser.add_argument("--short-inputs", action="store_true",
                        help="time short texts through OnnxRunner on every variant as a latency ratio to full")
    parser.add_argument("--max-length", type=int, default=SHORT_EXPORT_LENGTH,
                        help=f"max_length of the exports --short-inputs makes (default {SHORT_EXPORT_LENGTH})")


def _inputs(batch: int, length: int):
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(1000, 29000, (batch, length), generator=g)
    ids[:, 0] = 101
    return ids, torch.ones_like(ids)


def _recipe(variant: str, max_length: int, optimize: bool = False, params: dict | None = None):
    """The recipe the benchmark exports `variant` (with `params`) by: embedding graphs only."""
    from attnserve.export.recipe import Recipe

    return Recipe.resolve(variant, params, max_length, analysis=False, optimize=optimize)


def _export(recipe, root: Path, log) -> Path:
    """The export of `recipe` under root, reused when root already holds it (--exports-dir keeps
    them between runs; `attnserve serve --models-dir` finds them too)."""
    from attnserve.export.exporter import cached_export

    return cached_export(root, recipe, log=log)


def _available_bytes() -> int:
    available = proc_bytes("/proc/meminfo", "MemAvailable")
    return 1 << 40 if available is None else available


def _ort_dense_bytes(provider: str, batch: int, length: int, heads: int, config) -> int:
    """Memory ONNX Runtime needs for the scores of a variant that scores every query against
    O(N) keys at once (`Attention.dense_keys`), in its MultiHeadAttention node: none to speak of
    on the CPU, whose flash kernel goes through the keys in blocks; elsewhere (CUDA's float32
    kernel) the (B, H, N, keys) float scores of all the heads, counted twice to be safe."""
    from attnserve.models.registry import dense_keys

    if provider == "CPUExecutionProvider":
        return 0
    return 2 * batch * heads * length * dense_keys(config, length) * 4


def bench_runtime(variants, lengths, batch=1, repeats=3, long_repeats=1, threads=0, exports_dir=None, optimize=False,
                  log=print, params: dict[str, dict] | None = None) -> list[dict]:
    """Eager PyTorch and ONNX Runtime times of each variant at each length; params: {variant:
    its parameters} for those not run at their defaults."""
    from attnserve.service.runtime import OnnxRunner

    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    peak = matmul_peak_flops()
    log(f"matrix-multiply rate on {threads} threads: {peak / 1e9:.0f} GFLOP/s")
    root = Path(exports_dir) if exports_dir else Path(tempfile.mkdtemp(prefix="attnserve-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    max_length = max(lengths)
    rows = []
    for variant in variants:
        started = time.perf_counter()
        own = (params or {}).get(variant, {})
        try:
            recipe = _recipe(variant, max_length, optimize, own)
            export_dir = _export(recipe, root, log)
        except Exception as exc:  # one variant failing must not hide the others' numbers
            log(f"{variant}: export failed: {exc}")
            rows.append({"variant": variant, "error": str(exc)[:300]})
            continue
        encoder = recipe.encoder()
        runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=threads)
        warm_ids, warm_mask = _inputs(batch, min(lengths))
        with torch.no_grad():
            encoder(warm_ids, warm_mask)
        runner.embed(warm_ids.numpy(), warm_mask.numpy())
        for length in lengths:
            need = _ort_dense_bytes(runner.provider, batch, length, encoder.shape.num_heads, encoder.attention_config)
            if need > 0.6 * _available_bytes():
                log(f"{variant:12s} {length:6d}  skipped: ONNX Runtime's {runner.provider} attention kernel materialises "
                    f"N x N scores per head (~{need / 2**30:.0f} GiB), more than this machine has free")
                rows.append({"variant": variant, "length": length, "skipped": f"needs ~{need / 2**30:.0f} GiB in ORT"})
                continue
            ids, mask = _inputs(batch, length)
            n_ids, n_mask = ids.numpy(), mask.numpy()
            reps = repeats if length < 8192 else long_repeats
            # One after the other, not in rounds: ONNX Runtime's threads spin for a while after
            # each run and slow an eager call that follows.
            with torch.no_grad():
                eager = median_seconds(lambda: encoder(ids, mask), reps)
            ort_s = median_seconds(lambda: runner.embed(n_ids, n_mask), reps)
            with torch.no_grad():
                diff = float(np.abs(runner.embed(n_ids, n_mask) - encoder(ids, mask)[0].numpy()).max()) if length <= 4096 else None
            flops = count_flops(lambda: encoder(ids, mask))
            row = {"variant": variant, "params": own, "length": length, "batch": batch, "eager_ms": eager * 1e3, "ort_ms": ort_s * 1e3,
                   "speedup": eager / ort_s, "provider": runner.provider, "threads": threads, "max_abs_diff": diff,
                   "gflop": flops / 1e9, "eager_gflops": flops / eager / 1e9, "ort_gflops": flops / ort_s / 1e9,
                   "matmul_gflops": peak / 1e9, "ceiling": peak * eager / flops}
            rows.append(row)
            log(f"{variant:12s} {length:6d}  eager {eager * 1e3:9.1f} ms  ort {ort_s * 1e3:9.1f} ms  eager/ort {eager / ort_s:5.2f}x"
                f"  {flops / 1e9:6.1f} GFLOP: eager {row['eager_gflops']:4.0f}, ort {row['ort_gflops']:4.0f} GFLOP/s,"
                f" ceiling {row['ceiling']:4.2f}x" + (f"  max|diff| {diff:.1e}" if diff is not None else ""))
        log(f"{variant}: {time.perf_counter() - started:.0f}s")
        del runner, encoder
    if not exports_dir:  # a temporary directory of ours: exports are ~100 MB each
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _progress(message: str, done: bool = False) -> None:
    """A status line on stderr: rewritten in place on a terminal, one line each otherwise."""
    if sys.stderr.isatty():
        print(f"\r{message}\x1b[K", end="\n" if done else "", file=sys.stderr, flush=True)
    else:
        print(message, file=sys.stderr, flush=True)


def bench_short_inputs(variants, lengths=SHORT_LENGTHS, max_length=SHORT_EXPORT_LENGTH, repeats=21, threads=0,
                       exports_dir=None, progress=_progress) -> list[dict]:
    """Latency of short texts through OnnxRunner on each variant (full always included) as a
    ratio to full's: median of `repeats` rounds that each time every (variant, length) once,
    in a new random order each round, so that no call always follows the same one (after a
    padded main-graph call, ONNX Runtime's spinning threads slow whatever runs next). Rows:
    variant, length, exact_up_to, graph (the one the runner chose), padded_to, ms, ratio, and
    for variants with a short graph main_ms / main_ratio (their main graph alone)."""
    from attnserve.export.lengths import short_graph_length
    from attnserve.models.registry import exact_up_to
    from attnserve.service.runtime import OnnxRunner

    threads = threads or torch.get_num_threads()
    names = ["full"] + [v for v in variants if v != "full"]
    root = Path(exports_dir) if exports_dir else Path(tempfile.mkdtemp(prefix="attnserve-bench-short-"))
    root.mkdir(parents=True, exist_ok=True)
    runners, main_only, exact = {}, {}, {}
    try:
        for i, variant in enumerate(names, 1):
            recipe = _recipe(variant, max_length)
            config = recipe.config
            exact[variant] = exact_up_to(config, max_length)
            progress(f"[{i}/{len(names)}] exporting {variant} (max_length {max_length}"
                     f"{', with a short graph' if short_graph_length(config, max_length) else ''})")
            started = time.perf_counter()
            # Exported with its check: both graphs against the variant's PyTorch encoder.
            export_dir = _export(recipe, root, log=lambda m: None)
            runners[variant] = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=threads)
            if runners[variant].short_max_length:
                main_only[variant] = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=threads,
                                                short_graph=False)
            progress(f"[{i}/{len(names)}] {variant}: exported and loaded in {time.perf_counter() - started:.0f}s", done=True)
        inputs = {n: tuple(x.numpy() for x in _inputs(1, n)) for n in lengths}
        calls = {}
        for variant in names:
            for n, (ids, mask) in inputs.items():
                calls[(variant, n, "runner")] = lambda r=runners[variant], ids=ids, mask=mask: r.embed(ids, mask)
                if variant in main_only:
                    calls[(variant, n, "main")] = lambda r=main_only[variant], ids=ids, mask=mask: r.embed(ids, mask)
        samples = {key: [] for key in calls}
        keys = list(calls)
        shuffle = random.Random(0).shuffle
        for round_ in range(repeats):
            progress(f"timing {len(keys)} calls in rounds: {round_ + 1}/{repeats}")
            order = list(keys)
            shuffle(order)
            for key, seconds in interleaved_medians({k: calls[k] for k in order}, 1).items():
                samples[key].append(seconds)
        progress(f"timed {len(keys)} calls in {repeats} rounds", done=True)
    finally:
        if not exports_dir:
            shutil.rmtree(root, ignore_errors=True)
    ms = {key: float(np.median(values)) * 1e3 for key, values in samples.items()}
    rows = []
    for variant in names:
        runner = runners[variant]
        for n in lengths:
            row = {"variant": variant, "length": n, "exact_up_to": exact[variant], "exact": n <= exact[variant],
                   "graph": "short" if n <= runner.short_max_length else "embedding", "padded_to": runner.padded_length(n),
                   "ms": ms[(variant, n, "runner")], "ratio": ms[(variant, n, "runner")] / ms[("full", n, "runner")],
                   "threads": threads, "repeats": repeats, "max_length": max_length}
            if variant in main_only:
                row["main_padded_to"] = main_only[variant].padded_length(n)
                row["main_ms"] = ms[(variant, n, "main")]
                row["main_ratio"] = row["main_ms"] / ms[("full", n, "runner")]
            rows.append(row)
    return rows


def short_inputs_table(rows: list[dict]) -> list[str]:
    """The markdown table and notes of bench_short_inputs' rows."""
    lengths = sorted({r["length"] for r in rows})
    names = list(dict.fromkeys(r["variant"] for r in rows))
    cell = {(r["variant"], r["length"]): r for r in rows}
    head = ["variant", "exact full attention"] + [f"{n} tokens" for n in lengths] + [f"{n}, main graph only" for n in lengths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in names:
        first = cell[(variant, lengths[0])]
        exact = first["exact_up_to"]
        span = "all lengths" if exact >= first["max_length"] else f"<= {exact} tokens" if exact else "never"
        cells = [variant, span]
        for n in lengths:
            r = cell[(variant, n)]
            where = "short graph" if r["graph"] == "short" else f"padded to {r['padded_to']}" if r["padded_to"] != n else "unpadded"
            cells.append(f"{r['ratio']:.2f}x ({r['ms']:.1f} ms, {where})")
        for n in lengths:
            r = cell[(variant, n)]
            cells.append(f"{r['main_ratio']:.2f}x (padded to {r['main_padded_to']})" if "main_ms" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for n in lengths:
        exact = [v for v in names if cell[(v, n)]["exact"] and v != "full"]
        missed = [f"{v} {cell[(v, n)]['ratio']:.2f}x" for v in exact if cell[(v, n)]["ratio"] > SHORT_TARGET]
        others = [v for v in names if not cell[(v, n)]["exact"]]
        lines.append(f"{n} tokens: exact (full attention, target <= {SHORT_TARGET}x full): {', '.join(exact) or 'none'}; "
                     + (f"over the target: {', '.join(missed)}" if missed else "all within the target")
                     + f". Not exact (their own graph): {', '.join(others) or 'none'}.")
    return lines


def output_pruning(variant: str, length: int, threads: int = 0, repeats: int = 5, log=print) -> dict:
    """Export one graph with the embedding and every layer's attention weights, and time it
    asked for the embedding alone vs for everything, beside the embedding-only graph."""
    from torch import nn

    from attnserve.contract.export_format import EMBEDDING_OUTPUTS, pad_to
    from attnserve.export.graphs import AnalysisGraph, EmbeddingGraph, analysis_layout, export_graph
    from attnserve.export.verify import ort_session

    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    recipe = _recipe(variant, length)
    multiple, capacity = recipe.length_multiple, recipe.capacity
    encoder = recipe.encoder()

    class CombinedGraph(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding, self.analysis = EmbeddingGraph(encoder), AnalysisGraph(encoder)

        def forward(self, input_ids, attention_mask):
            return (*self.embedding(input_ids, attention_mask), *self.analysis(input_ids, attention_mask))

    layout = analysis_layout(encoder, min(capacity, 2 * multiple))
    names = [f"attn{l}_{p}_{part}" for l, pieces in enumerate(layout) for p in range(pieces) for part in ("rows", "cols", "probs")]
    root = Path(tempfile.mkdtemp(prefix="attnserve-pruning-"))
    with torch.no_grad():
        export_graph(EmbeddingGraph(encoder).eval(), root / "embedding.onnx", EMBEDDING_OUTPUTS, multiple, capacity, 8, 23, False, log)
        export_graph(CombinedGraph().eval(), root / "combined.onnx", EMBEDDING_OUTPUTS + names, multiple, capacity, 8, 23, False, log)
    embedding, combined = ort_session(root / "embedding.onnx", threads), ort_session(root / "combined.onnx", threads)
    ids, mask = _inputs(1, length)
    ids, mask = pad_to(ids.numpy(), mask.numpy(), multiple)
    feeds = {"input_ids": ids, "attention_mask": mask}
    for s in (embedding, combined):
        s.run(None, feeds)
    timed = interleaved_medians({
        "embedding_graph_ms": lambda: embedding.run(["sentence_embedding"], feeds),
        "combined_graph_embedding_only_ms": lambda: combined.run(["sentence_embedding"], feeds),
        "combined_graph_all_outputs_ms": lambda: combined.run(None, feeds),
    }, repeats)
    result = {"variant": variant, "length": length, **{key: seconds * 1e3 for key, seconds in timed.items()}}
    del embedding, combined
    shutil.rmtree(root, ignore_errors=True)
    log(f"output pruning, {variant} at {length} tokens: embedding graph {result['embedding_graph_ms']:.1f} ms; "
        f"one graph with attention outputs asked for the embedding only {result['combined_graph_embedding_only_ms']:.1f} ms, "
        f"for everything {result['combined_graph_all_outputs_ms']:.1f} ms")
    return result


def schedule_ratios(rows: list[dict], schedules, lengths) -> list[str]:
    """A Markdown table: each schedule's ONNX Runtime time as a ratio to full's and to each of
    its pure variants' at each length, from the rows of one run (- where one is missing)."""
    from attnserve.models.registry import make_config
    from attnserve.models.schedule import distinct_configs

    ort = {(r["variant"], r["length"]): r["ort_ms"] for r in rows if "ort_ms" in r}

    def ratio(a, b, n):
        return f"{ort[(a, n)] / ort[(b, n)]:.2f}x" if (a, n) in ort and (b, n) in ort else "-"

    lines = ["| schedule | vs | " + " | ".join(f"{n} tokens" for n in lengths) + " |", "|---|---|" + "---|" * len(lengths)]
    for schedule in schedules:
        pure = [c.variant for c in distinct_configs(make_config(schedule, max(lengths)))]
        for other in dict.fromkeys(["full", *pure]):
            lines.append(f"| {schedule} | {other} | " + " | ".join(ratio(schedule, other, n) for n in lengths) + " |")
    return ["ONNX Runtime time of each schedule as a ratio to full's and to its pure variants' (< 1: the schedule is faster)",
            "", *lines]


def _precision_command(args, names: list[str], lengths: list[int]) -> int:
    from attnserve.bench.precision import bench_precision, parse_precisions, precision_table

    try:
        precisions = parse_precisions(args.precision)
    except ValueError as exc:
        print(f"attnserve bench runtime: --precision: {exc}", file=sys.stderr)
        return 2
    rows = bench_precision(names, lengths, precisions, args.repeats or 5, args.threads, args.exports_dir,
                           log=lambda m: print(m, flush=True))
    print()
    print(f"ONNX Runtime at each precision against float32, batch 1, {args.threads or torch.get_num_threads()} threads, "
          f"median of {args.repeats or 5} rounds (speedup = float32 time / its time)")
    print()
    print("\n".join(precision_table(rows, precisions)))
    if args.json:
        Path(args.json).write_text(json.dumps({"precision": rows}, indent=2) + "\n")
    return 0


def bench_runtime_command(args) -> int:
    from attnserve.models import variant_names

    names = variant_names() if args.variants == "all" else [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in variant_names()]
    if unknown:
        print(f"attnserve bench runtime: unknown variant(s) {', '.join(unknown)}; valid: {', '.join(variant_names())}", file=sys.stderr)
        return 2
    from attnserve.models.registry import make_config
    from attnserve.bench.quality import variant_params

    try:
        params = variant_params(args.param)
    except ValueError as exc:
        print(f"attnserve bench runtime: {exc}", file=sys.stderr)
        return 2
    for schedule in args.schedule:
        try:
            make_config(schedule, 512)
        except ValueError as exc:
            print(f"attnserve bench runtime: --schedule {schedule}: {exc}", file=sys.stderr)
            return 2
    names += [s for s in args.schedule if s not in names]
    unused = [name for name in params if name not in names]
    if unused or (params and (args.precision is not None or args.short_inputs)):
        why = (f"names {', '.join(unused)}, not one of the timed {', '.join(names)}" if unused
               else "is taken by the default timing only, not with --precision or --short-inputs")
        print(f"attnserve bench runtime: --param {why}", file=sys.stderr)
        return 2
    for name, own in params.items():
        try:
            make_config(name, 512, **own)
        except ValueError as exc:
            print(f"attnserve bench runtime: --param for {name}: {exc}", file=sys.stderr)
            return 2
    default_lengths = SHORT_LENGTHS if args.short_inputs else DEFAULT_LENGTHS
    try:
        lengths = sorted({int(x) for x in (args.lengths or ",".join(map(str, default_lengths))).split(",") if x.strip()})
    except ValueError:
        print(f"attnserve bench runtime: --lengths takes comma-separated integers (got {args.lengths!r})", file=sys.stderr)
        return 2
    if args.precision is not None:
        return _precision_command(args, names, lengths)
    if args.short_inputs:
        if not lengths or min(lengths) < 2 or max(lengths) > args.max_length:
            print(f"attnserve bench runtime: --lengths must be in 2..--max-length {args.max_length} (got {lengths})", file=sys.stderr)
            return 2
        rows = bench_short_inputs(names, lengths, args.max_length, args.repeats or 21, args.threads, args.exports_dir)
        print()
        print(f"Short inputs through OnnxRunner, batch 1, {rows[0]['threads']} threads, exports at max_length "
              f"{args.max_length}: latency as a ratio to full, median of {rows[0]['repeats']} rounds")
        print()
        print("\n".join(short_inputs_table(rows)))
        if args.json:
            Path(args.json).write_text(json.dumps({"short_inputs": rows}, indent=2) + "\n")
        return 0
    rows = bench_runtime(names, lengths, args.batch, args.repeats or 3, args.long_repeats, args.threads, args.exports_dir,
                         args.optimize, log=lambda m: print(m, flush=True), params=params)
    print()
    print(f"ONNX Runtime vs PyTorch eager, batch {args.batch}, {rows[0].get('threads', '?') if rows else '?'} threads "
          f"(speedup = eager time / ORT time; > 1 means ORT is faster)")
    header = f"{'variant':12s}" + "".join(f"{n:>10d}" for n in lengths)
    print(header)
    for variant in names:
        cells = []
        for n in lengths:
            row = next((r for r in rows if r["variant"] == variant and r.get("length") == n), None)
            if row and "speedup" in row:
                cells.append(f"{row['speedup']:9.2f}x")
            else:
                cells.append(f"{'skipped' if row else 'failed':>10s}")
        print(f"{variant:12s}" + "".join(cells))
    print()
    print("ceiling = eager time x matrix-multiply rate / FLOPs: the most any runtime could gain over eager")
    print(header)
    for variant in names:
        cells = [next((f"{r['ceiling']:9.2f}x" for r in rows if r["variant"] == variant and r.get("length") == n and "ceiling" in r),
                      f"{'-':>10s}") for n in lengths]
        print(f"{variant:12s}" + "".join(cells))
    if args.schedule:
        print()
        print("\n".join(schedule_ratios(rows, args.schedule, lengths)))
    pruning = None
    if args.output_pruning:
        pruning = output_pruning(names[0], min(4096, max(lengths)), args.threads, log=lambda m: print(m, flush=True))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "output_pruning": pruning}, indent=2) + "\n")
    return 0
