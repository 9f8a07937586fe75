#!/usr/bin/env python3
"""ONNX Runtime's CUDA path against PyTorch on CUDA, for every attention variant, in one run.

    python -m attnserve.bench.gpu --out reports/gpu               # on a machine with a GPU (docs/gpu.md)
    python -m attnserve.bench.gpu --dry-run --out /tmp/gpu-dry    # the same code on the CPU, tiny sizes
    python -m attnserve.bench.gpu --tables reports/gpu/gpu.json   # docs/gpu.md's tables from a run

For each variant (full first: every ratio is to full attention):

1. export its embedding graph once, for max_length = the longest length asked (exports of all
   variants run first, several at a time, in worker processes);
2. PyTorch eager on the device, batch 1, at each length: fp32 and bf16 (torch.autocast) latency
   and peak memory (torch.cuda.max_memory_allocated);
3. ONNX Runtime through `attnserve.service.runtime.OnnxRunner` on [CUDA, CPU] providers, batch 1, at each
   length: latency with the runner's IO binding and with plain session.run, the embedding's max
   abs diff to PyTorch fp32, the device memory the session holds;
4. which nodes ONNX Runtime placed on the CPU provider and why (its graph-assignment record and
   the reasons its CUDA provider logs while partitioning);
5. throughput: `--docs` documents of `--doc-tokens` tokens through the runner one at a time,
   in batches of fixed sizes, and as the service feeds it (all submitted at once to its
   TokenBudgetBatcher, which packs them under the GPU token budget).

Weights are seeded random (BERT's initialisation; each variant's own parameters keep their
initialisation): the graphs, and so every timing and every node placement, are those of the
pretrained model, and the GPU machine needs no weights package. Needs torch, numpy, onnx,
onnxscript, onnxruntime-gpu, tokenizers and safetensors (imported by models/); tqdm if present.

Writes OUT/gpu.json (every figure; rewritten after each variant, so a run cut short keeps what it
measured) and prints the markdown tables docs/gpu.md lays out. A benchmark, not a test: numbers
depend on the machine. --dry-run runs every step on the CPU (CPU provider, bf16 autocast on the
CPU, two variants, 64 and 128 tokens) so that CI proves the script runs.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

SCHEMA = "attnserve-gpu-bench/1"
GPU_DEFAULTS = {"variants": "all", "lengths": "1024,4096,16384", "repeats": 10, "docs": 32, "doc_tokens": 4096,
                "batch_sizes": "4,8,16,32"}
DRY_RUN_DEFAULTS = {"variants": "full,global", "lengths": "64,128", "repeats": 1, "docs": 8, "doc_tokens": 128,
                    "batch_sizes": "4,8"}
# A timed cell (one runtime, one length) stops repeating after about this long: a node left on
# the CPU can make one ONNX Runtime call take seconds, and the whole run has to fit in one sitting.
CELL_SECONDS = 5.0
# Throughput past batch 1 is not timed when one pass of the documents at batch 1 took longer.
THROUGHPUT_SECONDS = 60.0
BF16 = "torch.autocast(bfloat16)"  # matmuls in bf16, softmax / norms as autocast keeps them
INIT_STD = 0.02  # BERT's initializer_range
REQUIRED_MODULES = ("numpy", "torch", "onnx", "onnxscript", "onnxruntime", "tokenizers", "safetensors")


# --------------------------------------------------------------------------- environment


def check_environment(dry_run: bool) -> dict:
    """Versions of everything the run uses; SystemExit naming what is missing (docs/gpu.md says
    how to bring it to an offline machine)."""
    import importlib
    import importlib.metadata as metadata

    missing = []
    for name in REQUIRED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if missing:
        raise SystemExit(f"attnserve.bench.gpu: missing {', '.join(missing)}; docs/gpu.md lists the wheels to bring")
    import onnx
    import onnxruntime as ort
    import onnxscript
    import torch

    installed = {d.metadata["Name"].lower() for d in metadata.distributions() if d.metadata["Name"]}
    env = {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__, "onnxruntime": ort.__version__, "onnxruntime_module": ort.__file__,
        "onnxruntime_packages": sorted(p for p in installed if p.startswith("onnxruntime")),
        "onnxruntime_available_providers": ort.get_available_providers(),
        "onnxruntime_build_cuda": getattr(ort, "cuda_version", None),
    }
    if dry_run:
        env["device"] = "cpu"
        return env
    if not torch.cuda.is_available():
        raise SystemExit("attnserve.bench.gpu: torch sees no CUDA device; on a machine without a GPU run it with --dry-run")
    if "CUDAExecutionProvider" not in env["onnxruntime_available_providers"]:
        raise SystemExit(f"attnserve.bench.gpu: {ort.__file__} has no CUDAExecutionProvider (providers "
                         f"{env['onnxruntime_available_providers']}): install onnxruntime-gpu, and only it (docs/gpu.md)")
    if "onnxruntime" in installed and "onnxruntime-gpu" in installed:
        print("warning: both onnxruntime and onnxruntime-gpu are installed; they share the onnxruntime module and "
              f"the one imported is {ort.__file__}", file=sys.stderr)
    props = torch.cuda.get_device_properties(0)
    env.update(device=props.name, device_memory_bytes=props.total_memory, cuda_capability=f"{props.major}.{props.minor}",
               cudnn=torch.backends.cudnn.version(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    return env


class Progress:
    """tqdm when it is installed, one printed line per step otherwise (a bare GPU machine)."""

    def __init__(self, total: int, desc: str):
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self._bar = None
        self.total, self.done, self.desc = total, 0, desc

    def note(self, message: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(message)
        else:
            print(f"{self.desc} [{self.done}/{self.total}] {message}", file=sys.stderr, flush=True)

    def step(self, message: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            if message:
                self._bar.set_postfix_str(message)
        elif message:
            print(f"{self.desc} [{self.done}/{self.total}] {message}", file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@contextlib.contextmanager
def captured_stderr():
    """What native code writes to file descriptor 2 inside the block (ONNX Runtime logs there),
    appended as one string to the list it yields."""
    sys.stderr.flush()
    saved = os.dup(2)
    text: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text.append(tmp.read().decode("utf-8", "replace"))


# --------------------------------------------------------------------------- encoders and exports


def seeded_encoder(variant: str, max_length: int, seed: int):
    """The variant's LongContextEncoder with BERT's random initialisation drawn from `seed`
    (normal(0, 0.02) embeddings and projections, zero biases, unit layer norms) in the places the
    pretrained weights fill; the variant's own parameters keep the initialisation they get from
    the config, as models.pretrained.load_pretrained leaves them. Built on the CPU, identical in
    every process."""
    import torch
    from torch import nn

    from attnserve.models.encoder import LongContextEncoder
    from attnserve.models.families.bert import FAMILY, MINILM
    from attnserve.models.registry import length_multiple, make_config

    class SeededEncoder(LongContextEncoder):
        """What models.export needs of models.api.Encoder, without its tokenizer."""

        tokenizer = None

        @property
        def variant(self) -> str:
            return self.attention_config.variant

    config = make_config(variant, max_length)
    multiple = length_multiple(config)
    capacity = -(-max_length // multiple) * multiple  # the graph runs on inputs padded to the multiple
    torch.manual_seed(seed)
    encoder = SeededEncoder(FAMILY, MINILM, config, capacity)
    own = {id(p) for layer in encoder.layers for p in layer.attention.parameters()}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in encoder.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and id(module.weight) not in own:
                module.weight.normal_(0.0, INIT_STD, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
    return encoder.eval()


def stand_in_model(tokenizer_dir: str, seed: int, shape):
    """What export_model records of the model (encoder.model) and copies its tokenizer.json
    from: the seeded random weights, named by their seed, with the stand-in tokenizer."""
    import dataclasses

    from attnserve.contract.model_folder import ModelFolder

    facts = {f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)}
    return ModelFolder(dir=Path(tokenizer_dir), name=f"seeded-random-{seed}", sha256=f"seeded random, seed {seed}, std {INIT_STD}",
                       architecture="bert", position_offset=0, **facts)


def write_stand_in_tokenizer(directory: Path) -> Path:
    """export_model copies the model's tokenizer.json (encoder.model.dir's) beside the
    graphs, for serving. These exports hold random weights and are never served,
    and the GPU machine has no weights package: a WordPiece tokenizer of BERT's special tokens
    alone stands in for it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    Tokenizer(WordPiece(vocab, unk_token="[UNK]")).save(str(directory / "tokenizer.json"))
    return directory


def export_variant(variant: str, max_length: int, out_dir: str, seed: int, threads: int, tokenizer_dir: str,
                   precision: str = "float32") -> dict:
    """In a worker process: export the seeded encoder's embedding graph at `precision` (no
    analysis graph, no CPU parity check: the run compares ONNX Runtime with PyTorch's float32
    itself, on the device). An export of the same variant, length, seed and precision, made by
    the same models code (its sha256), already in out_dir is reused."""
    import torch

    from attnserve.export.exporter import export_model
    from attnserve.export.recipe import Recipe
    from attnserve.contract.export_format import ExportError, code_sha256, read_manifest

    out = Path(out_dir)
    stamp = {"variant": variant, "max_length": max_length, "seed": seed, "weights": f"seeded random, std {INIT_STD}",
             "code_sha256": code_sha256(), "precision": precision}
    stamp_path = out / "bench-weights.json"
    if stamp_path.is_file():
        old = json.loads(stamp_path.read_text())
        try:
            sha = read_manifest(out).sha256
        except ExportError:  # none, or not one this attnserve serves: export again
            sha = None
        if sha and {k: old.get(k) for k in stamp} == stamp and old.get("sha256") == sha:
            return {**old, "reused": True}
    torch.set_num_threads(threads)
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    encoder = seeded_encoder(variant, max_length, seed)
    encoder.model = stand_in_model(tokenizer_dir, seed, encoder.shape)
    with open(out.parent / f"{variant}.export.log", "w") as log_file:
        recipe = Recipe.of_encoder(encoder, max_length, analysis=False, precision=precision)
        export_model(recipe, out, verify=False, encoder=encoder, log=lambda message: print(message, file=log_file, flush=True))
    manifest = read_manifest(out)
    stamp.update(sha256=manifest.sha256, length_multiple=manifest.length_multiple,
                 graphs=sorted(name for name, graph in manifest.graphs if graph is not None),
                 seconds=round(time.perf_counter() - started, 1), bytes=sum(f.bytes or 0 for f in manifest.files.values()),
                 threads=threads)
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return {**stamp, "reused": False}


def export_folder(root: Path, variant: str, precision: str) -> Path:
    return root / (variant if precision == "float32" else f"{variant}-{precision}")


def export_all(variants: list[str], max_length: int, root: Path, seed: int, jobs: int, progress: Progress,
               precision: str = "float32") -> dict:
    """Every variant's export, `jobs` at a time in spawned worker processes (tracing is mostly
    one core's work). Returns variant -> export record, or {"error": ...}."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    tokenizer_dir = write_stand_in_tokenizer(root / "tokenizer-stand-in")
    threads = max(1, (os.cpu_count() or 1) // jobs)
    records = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(export_variant, v, max_length, str(export_folder(root, v, precision)), seed, threads,
                               str(tokenizer_dir), precision): v for v in variants}
        for future in as_completed(futures):
            variant = futures[future]
            try:
                records[variant] = future.result()
                progress.step(f"exported {variant} ({records[variant]['seconds']}s"
                              f"{', reused' if records[variant]['reused'] else ''})")
            except Exception as exc:  # one variant failing must not hide the others' figures
                records[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:600]}"}
                progress.step(f"export of {variant} failed")
                progress.write(f"{variant}: export failed: {records[variant]['error']}")
    return records


# --------------------------------------------------------------------------- timing


def token_inputs(batch: int, length: int, seed: int):
    """(batch, length) int64 ids past the special tokens, [CLS] first, every token real."""
    import numpy as np

    ids = np.random.default_rng(seed).integers(1000, 29000, size=(batch, length), dtype=np.int64)
    ids[:, 0] = 101
    return ids, np.ones_like(ids)


def timed(fn, repeats: int, cell_seconds: float = CELL_SECONDS) -> tuple[float, int]:
    """(median seconds, calls timed): untimed warm-up calls (the first pays for allocation and
    kernel and algorithm selection; a second unless the first alone passed cell_seconds), then
    `repeats` timed calls (each after two untimed ones, attnserve.bench.timing), fewer when those
    would take more than cell_seconds."""
    from attnserve.bench.timing import CALLS_PER_SAMPLE, median_seconds

    one = _seconds(fn)
    if one < cell_seconds:
        one = _seconds(fn)
    count = max(1, min(repeats, int(cell_seconds / max(CALLS_PER_SAMPLE * one, 1e-9))))
    return median_seconds(fn, count), count


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Device:
    """The torch device and what timing and memory figures need from it (CUDA or the CPU)."""

    def __init__(self, dry_run: bool):
        import torch

        self.torch = torch
        self.cuda = not dry_run
        self.type = "cuda" if self.cuda else "cpu"
        self.device = torch.device(self.type)
        # Plain session.run copies outputs to the host, the runner's IO binding copies them back
        # too; CPU runs share the host.
        self.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.cuda else ["CPUExecutionProvider"]

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int | None:
        return self.torch.cuda.memory_allocated() if self.cuda else None

    def peak(self) -> int | None:
        return self.torch.cuda.max_memory_allocated() if self.cuda else None

    def in_use(self) -> int | None:
        """Device memory in use by anyone (cudaMemGetInfo): what an ONNX Runtime session holds
        shows up only here, torch's counters never see it."""
        if not self.cuda:
            return None
        free, total = self.torch.cuda.mem_get_info()
        return total - free

    def release(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()


def eager_figures(variant: str, max_length: int, lengths: list[int], seed: int, repeats: int, device: Device,
                  progress: Progress) -> tuple[list[dict], dict]:
    """PyTorch eager rows (one per length: fp32 and bf16 ms, peak bytes, calls timed) and the
    fp32 embeddings by length (host numpy), the reference ONNX Runtime is compared with."""
    import torch

    encoder = seeded_encoder(variant, max_length, seed).to(device.device)
    model_bytes = device.allocated()
    rows, reference = [], {}
    for length in lengths:
        ids, mask = (torch.from_numpy(x).to(device.device) for x in token_inputs(1, length, seed=length))
        row = {"length": length, "model_bytes": model_bytes}
        for mode in ("fp32", "bf16"):
            precision = (torch.autocast(device.type, dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext())
            progress.note(f"{variant}: PyTorch eager {mode}, {length} tokens")

            def forward():
                with torch.no_grad(), precision:
                    out = encoder(ids, mask)[0]
                device.sync()
                return out

            try:
                device.reset_peak()
                seconds, count = timed(forward, repeats)
                embedding = forward().float().cpu().numpy()
                row.update({f"eager_{mode}_ms": seconds * 1e3, f"eager_{mode}_calls": count,
                            f"eager_{mode}_peak_bytes": device.peak()})
                if mode == "fp32":
                    reference[length] = embedding
                else:
                    row["bf16_max_abs_diff"] = float(abs(embedding - reference[length]).max()) if length in reference else None
            except Exception as exc:  # e.g. a variant's own code rejecting bf16: reported, the rest still runs
                row[f"eager_{mode}_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                progress.write(f"{variant} eager {mode} at {length}: {row[f'eager_{mode}_error']}")
        rows.append(row)
    del encoder
    device.release()
    return rows, reference


# --------------------------------------------------------------------------- ONNX Runtime


# What the CUDA provider logs (INFO) while partitioning a graph, for each node it leaves to the CPU.
_FALLBACK_REASONS = [
    (re.compile(r"Force fallback to CPU execution for node: (?P<name>\S+)"),
     "ORT keeps it on the CPU on purpose: a small (shape) computation whose inputs live on the host, "
     "cheaper there than a copy to the device"),
    (re.compile(r"CUDA kernel not found in registries for Op type: (?P<op>\S+) node name: (?P<name>\S+)"),
     "no CUDA kernel for this op with these input types"),
    (re.compile(r"CUDA kernel not supported\. Fallback to CPU execution provider for Op type: (?P<op>\S+) node name: (?P<name>\S+)"),
     "the CUDA kernel does not support this node's attributes or shapes"),
]
_MEMCPY = re.compile(r"Add (Memcpy(?:FromHost|ToHost)) (?:after|before) (\S+) for (\S+)")


def fallback_reasons(log: str) -> dict[str, str]:
    """node name -> why ONNX Runtime's CUDA provider left it to the CPU, from its partitioning log."""
    reasons = {}
    for line in fallback_lines(log):
        for pattern, why in _FALLBACK_REASONS:
            match = pattern.search(line)
            if match:
                reasons[match.group("name")] = why + (f" ({match.group('op')})" if "op" in pattern.groupindex else "")
    return reasons


def fallback_lines(log: str) -> list[str]:
    """The partitioning log's lines about nodes left to the CPU, each once, in order."""
    lines = (line.strip() for line in log.splitlines() if any(p.search(line) for p, _ in _FALLBACK_REASONS))
    return list(dict.fromkeys(lines))


def placement_session(path: Path, providers: list[str], provider_options: dict, log_level: int = 1):
    """A session on the graph the runner runs, recording which provider got each node; returns
    (session, what it logged while loading). Opened with the runner's optimisation level (all),
    so the placement is the runner's. log_level 1 (INFO): the CUDA provider says why it leaves
    a node to the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = log_level
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    asked = [(p, provider_options[p]) if p in provider_options else p for p in providers]
    with captured_stderr() as log:
        session = ort.InferenceSession(str(path), options, providers=asked)
    return session, log[0]


def placement_figures(session, log: str) -> dict:
    """Nodes per provider and op type, and every node on the CPU provider with its reason, when
    the session's first provider is not the CPU's."""
    by_provider: dict[str, dict[str, int]] = {}
    cpu_nodes = []
    for subgraph in session.get_provider_graph_assignment_info():
        counts = by_provider.setdefault(subgraph.ep_name, {})
        for node in subgraph.get_nodes():
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
            if subgraph.ep_name == "CPUExecutionProvider":
                cpu_nodes.append({"name": node.name, "op_type": node.op_type})
    primary = session.get_providers()[0]
    figures = {"providers": session.get_providers(), "nodes_by_provider": by_provider,
               "memcpy_nodes": len(_MEMCPY.findall(log))}
    if primary == "CPUExecutionProvider":
        figures.update(cpu_fallback=None, cpu_fallback_note="the session runs on the CPU provider: every node is on it")
        return figures
    reasons = fallback_reasons(log)
    for node in cpu_nodes:
        # Nodes that graph optimisation made after partitioning have names the log never saw.
        node["reason"] = reasons.get(node["name"], "not stated in ONNX Runtime's log")
    figures["cpu_fallback"] = cpu_nodes
    figures["fallback_log"] = fallback_lines(log)[:200]
    return figures


def ort_figures(variant: str, export_dir: Path, lengths: list[int], reference: dict, repeats: int, device: Device,
                throughput_plan: dict, progress: Progress) -> dict:
    """Node placement and strict-fp32 parity (a session of its own), then through OnnxRunner:
    latency with IO binding and with session.run, parity, device memory, throughput."""
    import numpy as np

    from attnserve.service.runtime import OnnxRunner

    figures: dict = {"errors": []}
    graph = export_dir / "model.onnx"

    # Placement, with the provider's default options (the runner's) ...
    progress.note(f"{variant}: ONNX Runtime node placement")
    session, log = placement_session(graph, device.providers, {})
    figures["placement"] = placement_figures(session, log)
    figures["provider_options"] = session.get_provider_options()
    if device.cuda and session.get_providers()[0] != "CUDAExecutionProvider":
        cuda_lines = [line for line in log.splitlines() if "CUDA" in line or "cuda" in line][:20]
        raise SystemExit(f"attnserve.bench.gpu: ONNX Runtime could not start its CUDA provider on {graph}:\n  "
                         + "\n  ".join(cuda_lines or log.splitlines()[-20:]))
    del session
    # ... and parity with TF32 off in ONNX Runtime's CUDA kernels, as in PyTorch's fp32 matmuls.
    strict_diffs = {}
    try:
        strict, _ = placement_session(graph, device.providers, {"CUDAExecutionProvider": {"use_tf32": "0"}}, log_level=3)
        for length in lengths:
            if length in reference:
                ids, mask = token_inputs(1, length, seed=length)
                embedding = _run_padded(strict, ids, mask, export_dir)
                strict_diffs[length] = float(np.abs(embedding - reference[length]).max())
        del strict
    except Exception as exc:
        figures["errors"].append(f"parity with TF32 off: {type(exc).__name__}: {str(exc)[:400]}")
    gc.collect()

    device.release()
    before = device.in_use()
    runner = OnnxRunner(export_dir, providers=device.providers, short_graph=False)
    figures.update(provider=runner.provider, providers=runner.providers, io_binding_device=runner.io_binding_device)
    rows = []
    for length in lengths:
        progress.note(f"{variant}: ONNX Runtime, {length} tokens")
        ids, mask = token_inputs(1, length, seed=length)
        row = {"length": length, "strict_fp32_max_abs_diff": strict_diffs.get(length)}
        try:
            embedding = runner.embed(ids, mask)
            seconds, row["ort_calls"] = timed(lambda: runner.embed(ids, mask), repeats)
            row["ort_ms"] = seconds * 1e3
            if length in reference:
                row["max_abs_diff"] = float(np.abs(embedding - reference[length]).max())
                row["cosine"] = float((embedding * reference[length]).sum() /
                                      (np.linalg.norm(embedding) * np.linalg.norm(reference[length])))
            binding, runner.io_binding_device = runner.io_binding_device, None  # plain session.run
            try:
                seconds, count = timed(lambda: runner.embed(ids, mask), repeats)
                row["ort_session_run_ms"], row["ort_session_run_calls"] = seconds * 1e3, count
            finally:
                runner.io_binding_device = binding
        except Exception as exc:
            row["ort_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            figures["errors"].append(f"ORT at {length} tokens: {row['ort_error']}")
        rows.append(row)
    figures["latency"] = rows
    after = device.in_use()
    figures["device_bytes"] = None if before is None else after - before
    try:
        figures["throughput"] = throughput_figures(runner, throughput_plan, progress, variant)
    except Exception as exc:
        figures["errors"].append(f"throughput: {type(exc).__name__}: {str(exc)[:400]}")
    figures["device_bytes_after_throughput"] = None if before is None else device.in_use() - before
    del runner
    device.release()
    return figures


def _run_padded(session, ids, mask, export_dir: Path):
    """sentence_embedding from a bare session, inputs padded to the export's granule as the runner pads them."""
    from attnserve.contract.export_format import pad_to, read_manifest

    manifest = read_manifest(export_dir)
    pid, pm = pad_to(ids, mask, manifest.length_multiple, manifest.min_length)
    return session.run(["sentence_embedding"], {"input_ids": pid, "attention_mask": pm})[0]


def throughput_figures(runner, plan: dict, progress: Progress, variant: str) -> dict:
    """Documents per second for plan["docs"] documents of plan["doc_tokens"] tokens: one per
    runner call; in batches of each of plan["batch_sizes"]; and submitted all at once to the
    service's TokenBudgetBatcher (its GPU or CPU token budget, 32 inputs per batch at most, one
    inference thread), which forms the batches the service would."""
    import numpy as np

    from attnserve.service.batching import TokenBudgetBatcher, Timings, default_batch_tokens

    docs, tokens = plan["docs"], plan["doc_tokens"]
    ids, mask = token_inputs(docs, tokens, seed=tokens + 1)
    out = {"docs": docs, "doc_tokens": tokens}

    def docs_per_second(batch: int) -> float:
        runner.embed(ids[:batch], mask[:batch])  # warm-up: one batch of this shape
        started = time.perf_counter()
        for start in range(0, docs, batch):
            runner.embed(ids[start:start + batch], mask[start:start + batch])
        return docs / (time.perf_counter() - started)

    progress.note(f"{variant}: throughput, batch 1")
    out["batch_1_docs_per_s"] = docs_per_second(1)
    out["batched_docs_per_s"] = {}
    if docs / out["batch_1_docs_per_s"] > THROUGHPUT_SECONDS:
        out["skipped"] = (f"batches and batcher not timed: one pass at batch 1 took {docs / out['batch_1_docs_per_s']:.0f} s "
                          f"(over {THROUGHPUT_SECONDS:.0f} s; see the nodes on the CPU)")
        return out
    for batch in plan["batch_sizes"]:
        progress.note(f"{variant}: throughput, batches of {batch}")
        out["batched_docs_per_s"][str(batch)] = docs_per_second(batch)

    budget = default_batch_tokens(runner.provider)
    lists = [row.tolist() for row in ids]

    async def through_batcher() -> tuple[float, list[int]]:
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=budget, max_batch_requests=32, max_concurrent_requests=docs)
        await batcher.start()
        try:
            await batcher.embed(lists[:1], Timings())  # warm-up
            timings = [Timings() for _ in lists]
            started = time.perf_counter()
            await asyncio.gather(*(batcher.embed([doc], t) for doc, t in zip(lists, timings)))
            seconds = time.perf_counter() - started
        finally:
            await batcher.stop()
        return docs / seconds, [t.batch_sizes[0] for t in timings]

    progress.note(f"{variant}: throughput through the batcher")
    rate, sizes = asyncio.run(through_batcher())
    out.update(batcher_docs_per_s=rate, batcher_batch_tokens=budget, batcher_batch_sizes=sizes,
               batcher_mean_batch=float(np.mean(sizes)), batcher_speedup=rate / out["batch_1_docs_per_s"])
    return out


# --------------------------------------------------------------------------- the run


def run(args) -> dict:
    dry = args.dry_run
    defaults = DRY_RUN_DEFAULTS if dry else GPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    env = check_environment(dry)
    import torch

    from attnserve.models.registry import variant_names

    names = variant_names() if args.variants == "all" else [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(variant_names()))
    if unknown:
        raise SystemExit(f"attnserve.bench.gpu: unknown variant(s) {', '.join(unknown)}; valid: {', '.join(variant_names())}")
    names = ["full"] + [v for v in names if v != "full"]  # every ratio is to full's
    from attnserve.models.registry import make_config, precision_refused

    refused = {v: why for v in names for p, why in precision_refused(make_config(v, 512)).items() if p == args.precision}
    for variant, why in refused.items():
        print(f"attnserve.bench.gpu: {variant} skipped: it cannot be exported in {args.precision}: {why}", file=sys.stderr)
    names = [v for v in names if v not in refused]
    lengths = sorted({int(x) for x in str(args.lengths).split(",")})
    batch_sizes = [int(x) for x in str(args.batch_sizes).split(",") if x.strip()]
    max_length = max(lengths + [args.doc_tokens])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = args.export_jobs or max(1, min(len(names), (os.cpu_count() or 1) // 2))
    # Strict fp32 in PyTorch: TF32 would round matmul inputs to 10 mantissa bits.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    result = {
        "schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "dry_run": dry, "command": " ".join([Path(sys.executable).name, *sys.argv]), "complete": False,
        "environment": env,
        "settings": {"variants": names, "lengths": lengths, "batch": 1, "repeats": args.repeats, "cell_seconds": CELL_SECONDS,
                     "seed": args.seed, "weights": f"seeded random (BERT initialisation, std {INIT_STD})",
                     "bf16": BF16, "torch_tf32": False, "precision": args.precision, "refused": refused,
                     "providers": Device(dry).providers, "export_jobs": jobs,
                     "throughput": {"docs": args.docs, "doc_tokens": args.doc_tokens, "batch_sizes": batch_sizes}},
        "variants": [],
    }
    path = out / "gpu.json"

    def save():
        path.write_text(json.dumps(result, indent=1) + "\n")

    save()
    progress = Progress(len(names) * 2, "gpu bench")
    try:
        started = time.perf_counter()
        exports_dir = Path(args.exports_dir) if args.exports_dir else out / "exports"
        exports = export_all(names, max_length, exports_dir, args.seed, jobs, progress, args.precision)
        result["export_seconds"] = round(time.perf_counter() - started, 1)
        device = Device(dry)
        plan = {"docs": args.docs, "doc_tokens": args.doc_tokens, "batch_sizes": batch_sizes}
        for variant in names:
            entry = {"variant": variant, "export": exports[variant], "errors": []}
            result["variants"].append(entry)
            if "error" in exports[variant]:
                entry["errors"].append(f"export: {exports[variant]['error']}")
                progress.step(f"{variant}: skipped (export failed)")
                save()
                continue
            t0 = time.perf_counter()
            try:
                rows, reference = eager_figures(variant, max_length, lengths, args.seed, args.repeats, device, progress)
                ort = ort_figures(variant, export_folder(exports_dir, variant, args.precision), lengths, reference,
                                  args.repeats, device, plan, progress)
            except Exception as exc:  # e.g. ONNX Runtime refusing the graph on CUDA: the other variants still run
                entry["errors"].append(f"{type(exc).__name__}: {str(exc)[:600]}")
                progress.write(f"{variant}: {entry['errors'][-1]}")
                device.release()
                save()
                progress.step(f"{variant}: failed")
                continue
            entry["errors"] += ort.pop("errors")
            for row, ort_row in zip(rows, ort.pop("latency")):
                row.update(ort_row)
            entry.update(latency=rows, ort=ort, seconds=round(time.perf_counter() - t0, 1))
            save()
            progress.step(f"{variant} measured in {entry['seconds']}s")
        result["complete"] = True
        result["seconds"] = round(time.perf_counter() - started, 1)
        save()
    finally:
        progress.close()
    return result


# --------------------------------------------------------------------------- tables


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def tables(result: dict) -> str:
    """docs/gpu.md's markdown tables from a run's gpu.json."""
    env, settings = result["environment"], result["settings"]
    lengths = settings["lengths"]
    entries = [e for e in result["variants"] if e.get("latency")]
    full = next((e for e in entries if e["variant"] == "full"), None)
    base = {row["length"]: row for row in full["latency"]} if full else {}
    lines = [f"Measured {result['date']} on {env.get('device')} ({'a dry run, not GPU figures' if result['dry_run'] else 'one run'}): "
             f"torch {env['torch']} (CUDA {env.get('torch_cuda')}), onnxruntime {env['onnxruntime']} with "
             f"{settings.get('precision', 'float32')} exports, batch 1, "
             f"{settings['weights']}; `{result['command']}`."
             + ("" if result.get("complete") else " Incomplete run: only the variants listed were measured."), ""]

    def cell(entry_row, key, base_row):
        value = entry_row.get(key)
        if value is None:
            return "error" if entry_row.get(key.removesuffix("_ms") + "_error") else "-"
        ratio = "" if not base_row or not base_row.get(key) else f" / {value / base_row[key]:.2f}"
        return f"{_ms(value)}{ratio}"

    for key, title in (("eager_fp32_ms", "PyTorch eager fp32"), ("eager_bf16_ms", f"PyTorch eager bf16 ({settings['bf16']})"),
                       ("ort_ms", f"ONNX Runtime ({'CUDA' if not result['dry_run'] else 'CPU'} provider, OnnxRunner)")):
        lines += [f"{title}: ms / latency as a fraction of full's", "",
                  "| variant | " + " | ".join(f"{n:,}" for n in lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
        for entry in entries:
            by_length = {row["length"]: row for row in entry["latency"]}
            lines.append(f"| {entry['variant']} | " + " | ".join(cell(by_length.get(n, {}), key, base.get(n)) for n in lengths) + " |")
        lines.append("")

    longest = lengths[-1]
    lines += [f"Memory at {longest:,} tokens (MiB): PyTorch's peak allocation (model included), and the device memory the "
              "ONNX Runtime session holds after the latency runs", "",
              "| variant | eager fp32 peak | eager bf16 peak | ORT session |", "|---|---|---|---|"]
    for entry in entries:
        row = {r["length"]: r for r in entry["latency"]}.get(longest, {})
        lines.append(f"| {entry['variant']} | {_mib(row.get('eager_fp32_peak_bytes'))} | {_mib(row.get('eager_bf16_peak_bytes'))} | "
                     f"{_mib(entry['ort'].get('device_bytes'))} |")
    lines.append("")

    lines += ["Parity and placement: ONNX Runtime's embedding against PyTorch fp32 on the same weights (max abs diff "
              "over the lengths; target <= 1e-3), with ONNX Runtime's default CUDA options and with TF32 off; "
              "nodes ONNX Runtime placed on the CPU provider", "",
              "| variant | max abs diff | TF32 off | nodes on the CPU | reasons |", "|---|---|---|---|---|"]
    for entry in entries:
        diffs = [r.get("max_abs_diff") for r in entry["latency"] if r.get("max_abs_diff") is not None]
        strict = [r.get("strict_fp32_max_abs_diff") for r in entry["latency"] if r.get("strict_fp32_max_abs_diff") is not None]
        placement = entry["ort"]["placement"]
        fallback = placement.get("cpu_fallback")
        if fallback is None:
            nodes, reasons = "all (CPU provider)", "-"
        else:
            ops: dict[str, int] = {}
            why: dict[str, int] = {}
            for node in fallback:
                ops[node["op_type"]] = ops.get(node["op_type"], 0) + 1
                why[node["reason"]] = why.get(node["reason"], 0) + 1
            nodes = f"{len(fallback)}" + (": " + ", ".join(f"{op} x{c}" for op, c in sorted(ops.items())) if ops else "")
            reasons = "; ".join(f"{c} x {w}" for w, c in sorted(why.items(), key=lambda item: (-item[1], item[0]))) or "-"
        lines.append(f"| {entry['variant']} | {max(diffs):.1e} | {max(strict):.1e} | {nodes} | {reasons} |"
                     if diffs and strict else f"| {entry['variant']} | - | - | {nodes} | {reasons} |")
    lines.append("")

    plan = settings["throughput"]
    sizes = plan["batch_sizes"]
    lines += [f"IO binding and throughput: {plan['docs']} documents of {plan['doc_tokens']:,} tokens through OnnxRunner "
              "(documents per second); session.run / binding is the latency ratio at that length without and with "
              "the runner's IO binding; the batcher is the service's TokenBudgetBatcher with all documents submitted at once", "",
              "| variant | provider | IO binding | session.run / binding | batch 1 | "
              + " | ".join(f"batches of {b}" for b in sizes) + " | batcher (mean batch) | batcher / batch 1 |",
              "|---" * (7 + len(sizes)) + "|"]
    for entry in entries:
        ort = entry["ort"]
        tp = ort.get("throughput") or {}
        row = {r["length"]: r for r in entry["latency"]}.get(plan["doc_tokens"]) or entry["latency"][-1]
        ratio = (f"{row['ort_session_run_ms'] / row['ort_ms']:.2f}" if row.get("ort_session_run_ms") and row.get("ort_ms") else "-")
        batched = [f"{tp['batched_docs_per_s'][str(b)]:.1f}" if str(b) in tp.get("batched_docs_per_s", {}) else "-" for b in sizes]
        lines.append(f"| {entry['variant']} | {ort.get('provider')} | {ort.get('io_binding_device') or 'none'} | {ratio} | "
                     f"{tp.get('batch_1_docs_per_s', 0):.1f} | " + " | ".join(batched) + " | "
                     + (f"{tp['batcher_docs_per_s']:.1f} ({tp['batcher_mean_batch']:.1f}) | {tp['batcher_speedup']:.2f}x |"
                        if "batcher_docs_per_s" in tp else "- | - |"))
    errors = [f"- {e['variant']}: {err}" for e in result["variants"] for err in e.get("errors", [])]
    errors += [f"- {e['variant']} {row['length']}: {k} {v}" for e in entries for row in e["latency"]
               for k, v in row.items() if k.endswith("_error")]
    if errors:
        lines += ["", "Errors:", *errors]
    untimed = [f"- {e['variant']}: {e['ort']['throughput']['skipped']}" for e in entries
               if (e["ort"].get("throughput") or {}).get("skipped")]
    if untimed:
        lines += ["", "Not timed:", *untimed]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", help=f"comma-separated variants or all (default {GPU_DEFAULTS['variants']}; "
                                           f"dry run {DRY_RUN_DEFAULTS['variants']})")
    parser.add_argument("--lengths", help=f"comma-separated tokens (default {GPU_DEFAULTS['lengths']}; dry run {DRY_RUN_DEFAULTS['lengths']})")
    parser.add_argument("--repeats", type=int, help=f"timed calls per cell, median (default {GPU_DEFAULTS['repeats']}; dry run 1)")
    parser.add_argument("--docs", type=int, help=f"documents for the throughput figures (default {GPU_DEFAULTS['docs']})")
    parser.add_argument("--doc-tokens", type=int, help=f"tokens per throughput document (default {GPU_DEFAULTS['doc_tokens']})")
    parser.add_argument("--batch-sizes", help=f"fixed batch sizes timed for throughput (default {GPU_DEFAULTS['batch_sizes']})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--precision", default="float32", choices=("float32", "int8", "float16"),
                        help="precision of the ONNX Runtime exports (default float32; float16 for GPUs, see "
                             "`attnserve export --precision`); PyTorch stays fp32 and bf16 autocast")
    parser.add_argument("--export-jobs", type=int, default=0, help="exports at a time (default: half the CPU cores, at most one per variant)")
    parser.add_argument("--out", default="reports/gpu", help="directory for gpu.json and the exports (default reports/gpu)")
    parser.add_argument("--exports-dir", help="where the exports are made, and reused by later runs (default OUT/exports)")
    parser.add_argument("--dry-run", action="store_true", help="run every step on the CPU with tiny sizes (CI)")
    parser.add_argument("--tables", metavar="GPU_JSON", help="only print the markdown tables of an earlier run's gpu.json")
    args = parser.parse_args(argv)
    if args.tables:
        print(tables(json.loads(Path(args.tables).read_text())), end="")
        return 0
    result = run(args)
    print(tables(result), end="")
    print(f"wrote {Path(args.out) / 'gpu.json'}", file=sys.stderr)
    return 0 if not any(e.get("errors") for e in result["variants"]) else 1


if __name__ == "__main__":
    sys.exit(main())
