"""`attnserve bench encoder --model DIR`: a model folder's deployments in ONNX Runtime against
transformers' own class of the folder, same threads, same inputs.

For each length, the systems are timed in rounds (one call of each per round, after one call of
each to warm up), so a slow phase of the machine hits all of them alike; the median of the
rounds is reported. Each deployment is the export `attnserve serve --model DIR --variant V`
makes (without the attention-map graphs), cached under --exports-dir; transformers runs the
folder with its default attention for the CPU (AutoModel, no code from the folder). Where a
deployment is the model's own attention, its pooled vector is compared with transformers'
last hidden states pooled as the folder says (max abs difference). Peak memory is measured
for every system and length in a fresh process, as attnserve.bench.memory measures
(peak_extra_bytes: resident bytes above the loaded model's at the peak of one call, exact, with
every large allocation mapped on its own).

Lengths past the model's trained positions run only in attnserve (transformers stops at its
max_position_embeddings); the table gives each deployment's time per token against its own at
the longest length both ran.

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np

from attnserve.bench.provenance import commit, cpu_model
from attnserve.contract.export_format import package_version

TRANSFORMERS = "transformers"


def configure(parser) -> None:
    parser.add_argument("--deployment", action="append", default=[], metavar="VARIANT[:LENGTHS]",
                        help="with --model: a variant or schedule to serve the folder with (native: its own attention), "
                             "at the lengths after the colon (default: --lengths); repeatable (default: the model's "
                             "default variant)")
    parser.add_argument("--threads", type=int, default=0, help="with --model: threads for every system (default: torch's)")
    parser.add_argument("--exports-dir", default="~/.cache/attnserve",
                        help="with --model: where the deployments' exports are cached (serve's --models-dir)")


def parse_deployments(items: list[str], default_variant: str, lengths: list[int]) -> list[tuple[str, list[int]]]:
    """[(variant, lengths)] from VARIANT[:LENGTHS] items (the default variant at `lengths` for none)."""
    out = []
    for item in items or [default_variant]:
        variant, _, at = item.partition(":")
        out.append((variant.strip(), [int(x) for x in at.split(",") if x] if at else list(lengths)))
    return out


def _inputs(folder, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One text of n random ordinary tokens, wrapped in the tokenizer's own special tokens."""
    from tokenizers import Tokenizer

    from attnserve.contract.model_folder import TOKENIZER_FILE, wrapping_ids

    opening, closing = wrapping_ids(Tokenizer.from_file(str(folder.dir / TOKENIZER_FILE)))
    ids = np.random.default_rng(seed).integers(min(1000, folder.vocab_size // 2), folder.vocab_size, (1, n)).astype(np.int64)
    ids[0, 0], ids[0, -1] = opening, closing
    return ids, np.ones_like(ids)


def _transformers_call(model, folder, ids, mask):
    """The folder's pooled vector from transformers' last hidden states (its pooling, its Normalize)."""
    import torch

    from attnserve.contract.pooling import Pooling

    input_ids, attention_mask = torch.from_numpy(ids), torch.from_numpy(mask)

    def call():
        with torch.no_grad():
            hidden = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[0].numpy()
        return Pooling(folder.pooling)(hidden, normalize=folder.normalize)

    return call


def _load(system: str, folder, export_dir, threads: int, short_graph: bool = True):
    """A call maker for one system: (ids, mask) -> a function returning its pooled vector.
    short_graph: False runs every text on the export's main graph."""
    import torch

    torch.set_num_threads(threads)
    if system == TRANSFORMERS:
        from transformers import AutoModel

        model = AutoModel.from_pretrained(folder.dir, trust_remote_code=False).eval()
        return lambda ids, mask: _transformers_call(model, folder, ids, mask)
    from attnserve.service.runtime import OnnxRunner

    runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=threads, short_graph=short_graph)

    def make(ids, mask):
        from attnserve.contract.export_format import pad_to

        padded = pad_to(ids, mask, runner.length_multiple)
        return lambda: runner.embed(*padded)[0]

    return make


def _peak(system: str, model_dir: str, export_dir: str | None, threads: int, n: int) -> int:
    """In a fresh process: bytes above the loaded system's footprint (its weights resident) at the peak
    of one call at n tokens."""
    from attnserve.bench.memory import peak_extra_bytes
    from attnserve.models.pretrained import load_model

    folder = load_model(model_dir)
    # The main graph throughout: the export's short graph would take the short warm-up text.
    make = _load(system, folder, export_dir, threads, short_graph=False)
    make(*_inputs(folder, 16))()  # allocator, kernels and sessions warmed up on a short text
    if export_dir:
        page_in_mapped(Path(export_dir))
    extra, _ = peak_extra_bytes(make(*_inputs(folder, n)))
    return extra


def page_in_mapped(folder: Path) -> None:
    """Make resident every page this process maps from files under `folder`. ONNX Runtime maps
    an export's data file and reads some weights in place (the embedding table), so a text pages
    in the rows it touches, and a first call's peak would count up to the whole table (51 MiB
    of ModernBERT-base's at 2,048 random tokens), which transformers holds in its loaded
    footprint. Linux's MADV_POPULATE_READ (5.14+), else a read of one byte a page."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    prefix = str(folder.resolve())
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith(prefix) or "r" not in fields[1]:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 22) != 0:  # MADV_POPULATE_READ
            for address in range(start, end, mmap.PAGESIZE):
                ctypes.string_at(address, 1)


def measure_peak(system: str, folder, export_dir, threads: int, n: int) -> int:
    from attnserve.bench.memory import fresh_python, measuring_env

    code = ("import json, sys; from attnserve.bench.model_speed import _peak; "
            f"print(json.dumps(_peak({system!r}, {str(folder.dir)!r}, {str(export_dir) if export_dir else None!r}, {threads}, {n})))")
    out = subprocess.run(fresh_python("-c", code), capture_output=True, text=True, env=measuring_env())
    if out.returncode != 0:
        return -1  # it did not fit, or failed: the table says so
    return int(out.stdout.strip().splitlines()[-1])


def bench_model(args) -> int:
    import torch
    from tqdm import tqdm

    from attnserve.contract.schedule import resolve_native
    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe
    from attnserve.models.pretrained import load_model

    folder = load_model(args.model)
    threads = args.threads or torch.get_num_threads()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    deployments = parse_deployments(args.deployment, folder.default_variant, lengths)
    root = Path(args.exports_dir).expanduser()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{folder.name} ({folder.architecture}, {folder.num_layers} layers, hidden {folder.hidden_size}, trained at "
          f"{folder.max_positions} positions), {threads} threads, batch 1, median of {args.repeats} rounds")
    native = resolve_native("native", folder.native_layers())[0]
    exports = {}
    for variant, at in deployments:
        recipe = Recipe.resolve(variant, {}, max(at), model=folder, analysis=False)
        exports[variant] = (recipe, cached_export(root, recipe, log=lambda m: print(m, flush=True)))
    makers = {variant: _load(variant, folder, export_dir, threads) for variant, (_, export_dir) in exports.items()}
    theirs = [n for n in lengths if n <= folder.max_positions]
    if theirs:
        makers[TRANSFORMERS] = _load(TRANSFORMERS, folder, None, threads)
    rows = []
    all_lengths = sorted({n for _, at in deployments for n in at} | set(theirs))
    bar = tqdm(total=sum(len([s for s in _systems(deployments, theirs, n)]) for n in all_lengths) * (args.repeats + 1),
               desc="bench encoder --model", unit="call")
    for n in all_lengths:
        systems = _systems(deployments, theirs, n)
        ids, mask = _inputs(folder, n)
        calls = {system: makers[system](ids, mask) for system in systems}
        vectors = {}
        for system, call in calls.items():  # warm-up, and the vectors compared
            vectors[system] = call()
            bar.update()
        samples = {system: [] for system in systems}
        for _ in range(args.repeats):
            for system, call in calls.items():
                started = time.perf_counter()
                call()
                samples[system].append(time.perf_counter() - started)
                bar.update()
        for system in systems:
            row = {"system": system, "tokens": n, "seconds": float(np.median(samples[system])),
                   "min_s": min(samples[system]), "max_s": max(samples[system])}
            if system != TRANSFORMERS:
                row["schedule"] = exports[system][0].variant
                if TRANSFORMERS in vectors and row["schedule"] == native:  # the same model: the same vector
                    row["max_abs_diff_to_transformers"] = float(np.abs(vectors[system] - vectors[TRANSFORMERS]).max())
            rows.append(row)
    bar.close()
    for row in tqdm(rows, desc="peak memory", unit="run"):
        export_dir = None if row["system"] == TRANSFORMERS else exports[row["system"]][1]
        row["peak_extra_bytes"] = measure_peak(row["system"], folder, export_dir, threads, row["tokens"])
    report = {"model": folder.describe(), "cpu": cpu_model(), "commit": commit(), "threads": threads, "repeats": args.repeats,
              "rows": rows,
              "versions": {name: package_version(name) for name in ("attnserve", "onnxruntime-gpu", "torch", "transformers",
                                                                "tokenizers", "numpy")}}
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(table(rows)))
    print(f"\nwrote {out / 'results.json'}")
    return 0


def _systems(deployments, theirs, n) -> list[str]:
    return [variant for variant, at in deployments if n in at] + ([TRANSFORMERS] if n in theirs else [])


def table(rows: list[dict]) -> list[str]:
    """Markdown: per deployment and length, seconds (min-max), speed-up over transformers, time
    per token against the deployment's own at the longest length transformers ran, the vector's
    max abs difference and peak memory beside transformers'."""
    by = {(r["system"], r["tokens"]): r for r in rows}
    reference_length = max((r["tokens"] for r in rows if r["system"] == TRANSFORMERS), default=None)
    lines = ["| deployment | tokens | seconds (min-max) | vs transformers | per token vs at "
             f"{reference_length} | max abs diff | peak MiB (transformers) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["system"] == TRANSFORMERS:
            continue
        hf = by.get((TRANSFORMERS, r["tokens"]))
        base = by.get((r["system"], reference_length))
        speed = f"{hf['seconds'] / r['seconds']:.2f}x" if hf else "-"
        per_token = (f"{(r['seconds'] / r['tokens']) / (base['seconds'] / base['tokens']):.2f}x"
                     if base and r["tokens"] != reference_length else "-")
        diff = f"{r['max_abs_diff_to_transformers']:.1e}" if "max_abs_diff_to_transformers" in r else "-"
        memory = f"{_mib(r['peak_extra_bytes'])} ({_mib(hf['peak_extra_bytes'])})" if hf else _mib(r["peak_extra_bytes"])
        lines.append(f"| {r['system']} | {r['tokens']} | {r['seconds']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f}) | {speed} | "
                     f"{per_token} | {diff} | {memory} |")
    for r in rows:
        if r["system"] == TRANSFORMERS:
            lines.append(f"| transformers | {r['tokens']} | {r['seconds']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f}) | 1.00x | - | - | "
                         f"{_mib(r['peak_extra_bytes'])} |")
    return lines


def _mib(value) -> str:
    return "failed" if value is None or value < 0 else f"{value / 2**20:.0f}"
