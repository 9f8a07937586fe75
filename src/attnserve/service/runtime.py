"""ONNX Runtime runner over an export directory (src/attnserve/contract/export_format.py says what it holds).

Needs numpy and onnxruntime only: neither torch nor models/ is imported here, so a serving
image without PyTorch runs it.

    runner = OnnxRunner("exports/longformer")
    runner.provider                                   # what actually runs: CUDA... or CPU...
    runner.embed(input_ids, attention_mask)           # (B, 384) float32
    runner.attention(ids, mask, layer=2, head=None)   # (rows, cols, values) COO over tokens
    runner.rank_collapse(ids, mask)                   # one float per layer
    runner.collapse(ids, mask, ["attention_only"])    # {path: input's ratio, then one per layer}

Every batch is right-padded (attention mask 0) to the export's `length_multiple` before it
runs: the graphs take sequences of that granule (src/attnserve/export/graphs.py says why), and padding
never changes the real tokens' results. Exports of variants that are exactly full attention
on short inputs also hold a short graph (full attention, any length up to
`short_max_length`): a batch whose real tokens all fit in it runs there, unpadded, with the
same outputs. Inputs longer than the export's max_length are refused with ValueError, never
cut or run past what the graph was exported and checked for.
"""
from __future__ import annotations

import collections
import ctypes
import logging
import threading
from pathlib import Path

import numpy as np

from attnserve.service.attention_maps import MapCost, compact_to_coo, map_cost  # noqa: F401 - compact_to_coo is part of this module's API
from attnserve.contract.export_format import (
    RANK_COLLAPSE_OUTPUT, ExportError, Manifest, check_collapse_paths, check_files, pad_to, padded_width, read_manifest)

log = logging.getLogger("attnserve")

DEFAULT_PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]
# Graphs opened at their first request, without ONNX Runtime's memory arena (rare and large).
LAZY_GRAPHS = ("analysis", "collapse")
_OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


def cuda_unavailable(ort) -> str | None:
    """Why ONNX Runtime's CUDA provider cannot run here (None: it may; ORT then tries it): no
    CUDA provider in this onnxruntime build, no NVIDIA driver, no GPU, or a library the
    provider needs that is missing (what the dynamic loader says, e.g. libcublasLt.so.13)."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"this onnxruntime ({ort.__version__}) has no CUDA provider; install onnxruntime-gpu"
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver (libcuda.so.1 not found)"
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "the NVIDIA driver sees no GPU"
    library = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if library.is_file():
        try:
            ctypes.CDLL(str(library))
        except OSError as exc:
            if "cannot open shared object file" in str(exc):
                return f"{exc} (install the CUDA and cuDNN versions onnxruntime-gpu {ort.__version__} needs)"
    return None


class OnnxRunner:
    """One export, opened with ONNX Runtime.

    providers: execution providers in order of preference (default CUDA then CPU); ONNX
    Runtime falls back along the list when one cannot start (no GPU, missing CUDA libraries),
    and `.provider` reports the one that actually runs. intra_op_threads / inter_op_threads:
    0 leaves ONNX Runtime's defaults. graph_optimization: disable, basic, extended or all.
    short_graph: use the export's short graph when it has one (False: every batch runs the
    main graph, as on an export without it; for comparisons).
    """

    def __init__(self, export_dir, providers=None, intra_op_threads: int = 0, inter_op_threads: int = 0,
                 graph_optimization: str = "all", short_graph: bool = True, arena_shrink_tokens: int = 8192):
        import onnxruntime as ort

        self._ort = ort
        # A run of at least this many padded tokens (batch x length) hands ONNX Runtime's CPU
        # arena back when it ends (0: never): such runs grow it by gigabytes, which it would
        # otherwise keep for good; shorter runs keep it, and their speed.
        self.arena_shrink_tokens = int(arena_shrink_tokens)
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._arena_sessions: set[int] = set()  # sessions with an arena to shrink (ORT refuses the option on others)
        self.export_dir = Path(export_dir)
        if not self.export_dir.is_dir():
            raise ExportError(f"{self.export_dir}: export directory does not exist")
        self.export_manifest: Manifest = read_manifest(self.export_dir)
        spec = self.export_manifest
        # The same manifest as plain JSON, for what reports it (the /info route).
        self.manifest: dict = spec.as_json()
        # Every file, the lazily opened analysis graph and tokenizer.json too, is checked before
        # serving starts: a damaged export fails here, by name, not in the first requests. The
        # hashing reads what ONNX Runtime loads next (DEVELOPERS.md gives its cost).
        graph_files = [name for graph in self._graphs() for name in spec.graph_files(graph)]
        check_files(self.export_dir, spec, dict.fromkeys([*spec.files, *graph_files]))
        self.variant: str = spec.variant
        self.precision: str = spec.precision
        self.max_length: int = spec.max_length
        self.length_multiple: int = spec.length_multiple
        self.min_length: int = spec.min_length
        self.max_batch: int = spec.max_batch
        self.hidden_size: int = spec.hidden_size
        self.num_layers: int = spec.num_layers
        self.num_heads: int = spec.num_heads
        if graph_optimization not in _OPTIMIZATION_LEVELS:
            raise ValueError(f"graph_optimization must be one of {', '.join(_OPTIMIZATION_LEVELS)} (got {graph_optimization!r})")
        self.requested_providers = list(providers) if providers else list(DEFAULT_PROVIDERS)
        # Decided from what is installed, so that a CPU machine logs one plain line instead of
        # ONNX Runtime's error about the CUDA libraries it tried to load.
        self.cuda_unavailable: str | None = cuda_unavailable(ort) if "CUDAExecutionProvider" in self.requested_providers else None
        # What the sessions are opened with: the providers asked for, less CUDA where it cannot run.
        self.session_providers = [p for p in self.requested_providers if not (self.cuda_unavailable and p == "CUDAExecutionProvider")]
        self.session_providers = self.session_providers or ["CPUExecutionProvider"]
        if self.cuda_unavailable:
            log.info("CUDA not available: %s; serving on CPU", self.cuda_unavailable)
        self._options = dict(intra=intra_op_threads, inter=inter_op_threads, level=graph_optimization)
        self._session = self._open("embedding")
        self.provider: str = self._session.get_providers()[0]
        self.providers: list[str] = self._session.get_providers()
        if self.provider != self.session_providers[0]:
            log.warning("ONNX Runtime runs %s on %s (asked for %s)", self.export_dir, self.provider, self.session_providers)
        else:
            log.info("ONNX Runtime runs %s on %s", self.export_dir, self.provider)
        # Where run() binds its outputs: on CUDA, device memory through IO binding; None: plain
        # session.run (on CPU a binding would only add copies).
        self.io_binding_device: str | None = "cuda" if self.provider == "CUDAExecutionProvider" else None
        # Batches whose real tokens end within short_max_length run the short graph (0: none).
        short = spec.graphs.short if short_graph else None
        self._short = self._open("short") if short else None
        if short and short.outputs != spec.graphs.embedding.outputs:
            raise ExportError(f"{self.export_dir / 'manifest.json'}: the short graph's outputs differ from the embedding graph's")
        self.short_max_length: int = min(short.max_length, self.max_length) if short else 0
        # Embedding-graph runs per graph ("embedding", "short"): which one served the batches.
        self.graph_runs: collections.Counter = collections.Counter()
        analysis = spec.graphs.analysis
        # Longest text an attention-map request may have (0: the export has no analysis graph).
        self.attention_max_length: int = analysis.max_length if analysis else 0
        collapse = spec.graphs.collapse
        # Rank collapse along the paths of "Attention is not all you need" (0 and none: the
        # export has no collapse graph); its four paths run as one batch, so a text may have a
        # quarter of max_length tokens, and no more than a map.
        self.collapse_max_length: int = collapse.max_length if collapse else 0
        self.collapse_paths: list[str] = list(collapse.paths) if collapse else []
        self._lazy: dict[str, object] = {}
        # The first input's rank-collapse ratios from the last analysis run, by its padded ids and mask.
        self._last_ratios: dict[tuple[bytes, bytes], np.ndarray] = {}
        self._lazy_lock = threading.Lock()

    # ------------------------------------------------------------------ sessions

    def _graphs(self) -> list[str]:
        """The graphs this export holds: every graph the manifest format names (embedding, and
        short, analysis and collapse where exported)."""
        graphs = self.export_manifest.graphs
        return [name for name in type(graphs).model_fields if getattr(graphs, name) is not None]

    def _open(self, graph: str):
        ort = self._ort
        if graph not in self._graphs():
            raise ExportError(f"{self.export_dir / 'manifest.json'}: export has no {graph} graph (exported with --no-analysis?)")
        path = self.export_dir / getattr(self.export_manifest.graphs, graph).file
        options = ort.SessionOptions()
        options.log_severity_level = 3  # the CUDA fallback is reported through .provider
        arena = graph not in LAZY_GRAPHS
        if not arena:
            # Maps and collapse paths are rare and large: without ORT's arena their memory goes back after each
            # one (with it the process stays at the largest map's peak; embedding graphs keep
            # the arena, which is 10-25% faster on long inputs).
            options.enable_cpu_mem_arena = False
        if self._options["intra"]:
            options.intra_op_num_threads = int(self._options["intra"])
        if self._options["inter"]:
            options.inter_op_num_threads = int(self._options["inter"])
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        options.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self._options["level"]]
        available = set(ort.get_available_providers())
        providers = [p for p in self.session_providers if p in available] or ["CPUExecutionProvider"]
        if arena and providers == ["CPUExecutionProvider"]:
            # ORT's planner gives a dead tensor's buffer to a later one of the same size and keeps
            # every such buffer for the whole run, so a deep encoder holds a dozen of them at
            # once. Embedding graphs run without that reuse (DEVELOPERS.md, "Peak memory"); the
            # maps' graphs keep it: they hold every layer's weights to the end anyway, and
            # measured no lower without it.
            options.enable_mem_reuse = False
        try:
            session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types for bad protobufs
            raise ExportError(f"{path}: ONNX Runtime cannot load it: {str(exc).strip()[:500]}") from exc
        expected = getattr(self.export_manifest.graphs, graph).outputs
        names = [o.name for o in session.get_outputs()]
        if names != expected:
            raise ExportError(f"{path}: outputs {names[:4]}... do not match manifest.json")
        if arena:
            self._arena_sessions.add(id(session))
        return session

    def _lazy_session(self, graph: str):
        """The session of an analysis graph, opened at its first use."""
        with self._lazy_lock:
            if graph not in self._lazy:
                self._lazy[graph] = self._open(graph)
            return self._lazy[graph]

    # ------------------------------------------------------------------ inputs

    def _prepare(self, input_ids, attention_mask) -> tuple[np.ndarray, np.ndarray, int]:
        """Checked inputs padded for the main and analysis graphs, and their width."""
        ids, mask, n = self._checked(input_ids, attention_mask)
        ids, mask = pad_to(ids, mask, self.length_multiple, self.min_length)
        return np.ascontiguousarray(ids), np.ascontiguousarray(mask), n

    def _checked(self, input_ids, attention_mask) -> tuple[np.ndarray, np.ndarray, int]:
        """(B, N) int64 ids and mask, refused with ValueError when they cannot run; padding
        past max_length dropped. N is the width the caller's outputs keep."""
        ids = np.asarray(input_ids)
        mask = np.asarray(attention_mask)
        if ids.ndim == 1:
            ids, mask = ids[None], mask[None]
        if ids.ndim != 2 or ids.shape != mask.shape:
            raise ValueError(f"input_ids and attention_mask must both be (batch, sequence) (got {ids.shape} and {mask.shape})")
        if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(mask.dtype, np.integer):
            raise ValueError(f"input_ids and attention_mask must be integers (got {ids.dtype}, {mask.dtype})")
        batch, n = ids.shape
        if batch == 0 or n == 0:
            raise ValueError("empty batch")
        if batch > self.max_batch:
            raise ValueError(f"batch of {batch} is larger than the export's max batch {self.max_batch}")
        longest = int(mask.astype(bool).sum(1).max())
        if n > self.max_length and longest > self.max_length:
            raise ValueError(f"sequence of {longest} tokens is longer than the export's max_length {self.max_length}; "
                             f"shorten it or export with a larger --max-length")
        if n > self.max_length:  # only padding past max_length: drop it
            ids, mask, n = ids[:, : self.max_length], mask[:, : self.max_length], self.max_length
        return ids.astype(np.int64, copy=False), mask.astype(np.int64, copy=False), n

    def padded_length(self, n: int) -> int:
        """The sequence length a batch whose longest input has n tokens runs at (what a
        token budget should count)."""
        if n <= self.short_max_length:
            return max(n, self.min_length)
        return self._granule_length(n)

    def _granule_length(self, n: int) -> int:
        """n tokens padded to the main and analysis graphs' sequence multiple."""
        return padded_width(n, self.length_multiple, self.min_length)

    def _run(self, session, outputs: list[str], ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.io_binding_device is None:
            shrink = self.arena_shrink_tokens and ids.size >= self.arena_shrink_tokens and id(session) in self._arena_sessions
            return session.run(outputs, feeds, self._shrink if shrink else None)
        # On CUDA: inputs copied once into device memory, outputs allocated there by ORT and
        # copied back once, instead of the per-run staging of session.run.
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in outputs:
            binding.bind_output(name, self.io_binding_device)
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()

    # ------------------------------------------------------------------ API

    def run(self, input_ids, attention_mask, outputs=("sentence_embedding",)) -> dict[str, np.ndarray]:
        """Named outputs of the embedding graph, last_hidden_state as wide as the input. A batch
        whose real tokens end within short_max_length runs the short graph, cut to that end
        (its last_hidden_state is 0 past it, where the main graph leaves padding's values)."""
        ids, mask, n = self._checked(input_ids, attention_mask)
        columns = np.flatnonzero(mask.any(0))
        end = int(columns[-1]) + 1 if len(columns) else 0
        if self._short is not None and end <= self.short_max_length:
            graph, session = "short", self._short
            ids, mask = pad_to(ids[:, :end], mask[:, :end], 1, self.min_length)
        else:
            graph, session = "embedding", self._session
            ids, mask = pad_to(ids, mask, self.length_multiple, self.min_length)
        result = dict(zip(outputs, self._run(session, list(outputs), np.ascontiguousarray(ids), np.ascontiguousarray(mask))))
        self.graph_runs[graph] += 1
        if "last_hidden_state" in result:
            hidden = result["last_hidden_state"][:, :n]
            if hidden.shape[1] < n:
                hidden = np.pad(hidden, ((0, 0), (0, n - hidden.shape[1]), (0, 0)))
            result["last_hidden_state"] = hidden
        return result

    def embed(self, input_ids, attention_mask) -> np.ndarray:
        """(B, hidden) float32: the graph's sentence_embedding, pooled as the model pools (its
        1_Pooling mode) and L2-normalised where the model has a Normalize module (manifest.json's
        model)."""
        return self.run(input_ids, attention_mask, ("sentence_embedding",))["sentence_embedding"]

    def hidden_states(self, input_ids, attention_mask) -> np.ndarray:
        return self.run(input_ids, attention_mask, ("last_hidden_state",))["last_hidden_state"]

    def rank_collapse(self, input_ids, attention_mask) -> list[float]:
        """Per layer, ||X - 1 x^T|| / ||X|| of the first document's real tokens: from the
        analysis graph (its run for attention() of the same input is reused), or from the
        embedding graph of an export made before analysis.onnx held it."""
        if RANK_COLLAPSE_OUTPUT in self.export_manifest.graphs.embedding.outputs:
            return [float(r) for r in self.run(input_ids, attention_mask, (RANK_COLLAPSE_OUTPUT,))[RANK_COLLAPSE_OUTPUT][0]]
        self._require_analysis()
        ids, mask, _ = self._prepare(input_ids, attention_mask)
        ids, mask = ids[:1], mask[:1]
        key = (ids.tobytes(), mask.tobytes())
        ratios = self._last_ratios.get(key)
        if ratios is None:
            self._check_map_length(int(mask[0].sum()))
            ratios = self._run(self._lazy_session("analysis"), [RANK_COLLAPSE_OUTPUT], ids, mask)[0][0]
        return [float(r) for r in ratios]

    def collapse(self, input_ids, attention_mask, paths) -> dict[str, list[float]]:
        """{path: the rank-collapse ratio of the embeddings' output, then of each layer's output
        along that path} for the first document's real tokens, from the collapse graph: each of
        `paths` one of collapse_paths."""
        if not self.collapse_max_length:
            raise ValueError(f"this export has no collapse graph, so no rank collapse paths (exported with --no-analysis, "
                             f"or by an attnserve before them): {self.export_dir}")
        check_collapse_paths(paths, self.collapse_paths)
        ids, mask, _ = self._prepare(input_ids, attention_mask)
        ids, mask = ids[:1], mask[:1]
        n = int(mask[0].sum())
        if n > self.collapse_max_length:
            raise ValueError(f"rank collapse paths of {self.variant} are limited to {self.collapse_max_length} tokens; got {n}: "
                             f"send a shorter text")
        names = self.export_manifest.graphs.collapse.paths
        values = self._run(self._lazy_session("collapse"), [names[p] for p in paths], ids, mask)
        return {path: [float(r) for r in ratios[0]] for path, ratios in zip(paths, values)}

    def attention(self, input_ids, attention_mask, layer: int, head: int | None = None):
        """Layer `layer`'s attention over the first document's real tokens as COO arrays
        (rows, cols, values), duplicates summed, sorted by (row, col); the mean over heads
        when head is None."""
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in 0..{self.num_layers - 1} (got {layer!r})")
        if head is not None and (not isinstance(head, (int, np.integer)) or not 0 <= head < self.num_heads):
            raise ValueError(f"head must be in 0..{self.num_heads - 1} or None (got {head!r})")
        self._require_analysis()
        ids, mask, _ = self._prepare(input_ids, attention_mask)
        ids, mask = ids[:1], mask[:1]
        n = int(mask[0].sum())
        self._check_map_length(n)
        return compact_to_coo(self._pieces(ids, mask, [layer])[0], n, head, self.num_heads)

    def attention_pieces(self, input_ids, attention_mask, layers=None) -> list[list[tuple]]:
        """The whole batch's attention weights in the variant's compact form, from one run of
        the analysis graph: for each layer asked (all by default), its pieces (rows, cols,
        probs) over the padded width (see models.attention.base.SlotWeights)."""
        self._require_analysis()
        ids, mask, _ = self._prepare(input_ids, attention_mask)
        self._check_map_length(int(mask.sum(1).max()))
        return self._pieces(ids, mask, range(self.num_layers) if layers is None else layers)

    def attention_cost(self, n: int, head: int | None = None) -> MapCost:
        """Upper bounds of what a one-layer map of an n-token text holds (its non-zeros, the
        bytes of the layer's outputs and their conversion), from the analysis graph's output
        shapes, before anything runs."""
        self._require_analysis()
        session = self._lazy_session("analysis")
        shapes = {o.name: tuple(o.shape) for o in session.get_outputs()}
        pieces = self.export_manifest.graphs.analysis.attention[0]
        piece_shapes = [(shapes[p["rows"]], shapes[p["cols"]], shapes[p["probs"]]) for p in pieces]
        sequence_dim = session.get_inputs()[0].shape[1]
        return map_cost(piece_shapes, sequence_dim, self._granule_length(n), n, head)

    def _require_analysis(self) -> None:
        if self.export_manifest.graphs.analysis is None:
            raise ValueError(f"this export has no analysis graph, so no attention maps (exported with --no-analysis): {self.export_dir}")

    def _check_map_length(self, n: int) -> None:
        if n > self.attention_max_length:
            raise ValueError(f"attention maps of {self.variant} are limited to {self.attention_max_length} tokens "
                             f"(every layer's weights are computed at once); got {n}: send a shorter text")

    def _pieces(self, ids, mask, layers) -> list[list[tuple]]:
        session = self._lazy_session("analysis")
        per_layer = [self.export_manifest.graphs.analysis.attention[layer] for layer in layers]
        names = [piece[part] for pieces in per_layer for piece in pieces for part in ("rows", "cols", "probs")]
        # The run computes every output anyway: the first input's rank-collapse ratios are kept
        # for rank_collapse() of the same input (a map's answer carries them).
        collapse = RANK_COLLAPSE_OUTPUT in self.export_manifest.graphs.analysis.outputs
        values = self._run(session, names + [RANK_COLLAPSE_OUTPUT] * collapse, ids, mask)
        if collapse:
            self._last_ratios = {(ids[:1].tobytes(), mask[:1].tobytes()): values.pop()[0]}
        values = iter(values)
        return [[(next(values), next(values), next(values)) for _ in pieces] for pieces in per_layer]
