"""Export an encoder to ONNX for serving with ONNX Runtime (`attnserve export`).

An export directory holds:

    model.onnx (+ model.onnx.data)       the embedding graph: input_ids, attention_mask ->
                                         sentence_embedding, last_hidden_state, rank_collapse
    analysis.onnx (+ analysis.onnx.data) the attention maps of every layer, compact form
    short.onnx (+ short.onnx.data)       only for variants exact on short inputs: the embedding
                                         graph with full attention, unpadded, for inputs up to
                                         manifest graphs.short.max_length tokens
    tokenizer.json                       the model's tokenizer
    adapt.json                           only with adapted weights: their DIR/adapt.json
    manifest.json                        what was exported, file hashes, how to call it
                                         ("weights": the adapted weights' sha256, or null)

Why two graphs: ONNX Runtime runs every node of a graph whatever outputs are asked for (see
`attnserve bench runtime --output-pruning`), and the explicit attention weights cost far more
than the fused attention they replace, so the embedding path gets a graph without them.

Why a short graph: up to `Attention.exact_up_to` tokens a variant computes exactly what full
attention computes (a window or the blocks cover every token), yet its graph pads every input
to its granule (a 128-token text runs as 256 on longformer, at ~3x full's latency). Where
that range holds more than one granule, the export adds the same encoder with full attention
(same weights, positions and config) over a sequence axis of multiple 1, checked against the
variant's own PyTorch encoder, and the runner sends batches that fit in it there.

Dynamic shapes. Batch and sequence are dynamic axes. The block-sparse variants pad the
sequence to a multiple of their block inside forward(); torch.export cannot prove the shape
identities that padding creates for every length (it raises on them), so the sequence axis is
exported as `length_multiple * k` with k dynamic, and the runner pads every batch (attention
mask 0) to that multiple before running it. Padding never changes the real tokens' outputs
(every variant is batch/padding invariant, tests/test_variants.py), and the parity check below compares ONNX
Runtime on padded inputs with PyTorch on unpadded ones to prove it for each export.

The exporter's own onnxscript optimiser is off by default: ONNX Runtime applies its graph
optimisations when it loads the model, and on longformer at 4,096 tokens the unoptimised
export ran no slower (7.2 s vs 8.3 s median, 2 threads, busy machine) while exporting in half
the time.

Every export runs `torch.export.export` with Dim-based dynamic batch and sequence first (it
raises instead of silently narrowing a dimension), then `torch.onnx.export` from that program,
then onnx.checker, then checks the graph kept both axes symbolic, then compares ONNX Runtime
with PyTorch at two lengths and batch sizes 1 and 3. Any failure is an ExportFailed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnserve.models.api import Encoder, load_encoder
from attnserve.models.attention.base import MASKED, AttentionConfig
from attnserve.models.encoder import rank_collapse_ratio
from attnserve.models.pretrained import model_dir
from attnserve.models.registry import _variant, build_attention, make_config
from attnserve.models.weights import META_FILE
# The export format is defined once, by its torch-free reader (the serving runtime).
from attnserve.service.runtime import FORMAT, code_sha256, package_version, pad_to, recipe_sha256, sha256

# Opset 23 turns scaled_dot_product_attention into one ONNX `Attention` node, which ONNX
# Runtime 1.31 runs fused on CPU (checked by the parity tests; 18 would decompose it into
# MatMul/Softmax and materialise the scores).
OPSET = 23
HEADS_PER_NODE = 2  # heads per ONNX Attention node over all N keys (see onnx_friendly_attention)
INPUT_NAMES = ["input_ids", "attention_mask"]
EMBEDDING_OUTPUTS = ["sentence_embedding", "last_hidden_state", "rank_collapse"]
MAX_BATCH = 1024
GRAPH_FILES = ("model.onnx", "model.onnx.data", "analysis.onnx", "analysis.onnx.data", "short.onnx", "short.onnx.data")
# Parity tolerances of the export-time check (the tests hold the same ones).
EMBEDDING_TOL = 1e-4
HIDDEN_TOL = 1e-3


# Variants whose attention pattern is a discontinuous function of the hidden states
# (`Attention.discontinuous`, LSH's buckets) can take other discrete decisions in ONNX Runtime
# than in PyTorch on float rounding; their exports are held to the embeddings' cosine
# similarity to PyTorch's, at least DISCONTINUOUS_MIN_COSINE, instead of max abs diff.
DISCONTINUOUS_MIN_COSINE = 0.99  # measured: 0.9969 for a 1,001-token document (test_export_parity)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (B, d) arrays."""
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def is_discontinuous(variant: str) -> bool:
    return bool(_variant(variant).discontinuous)


class ExportFailed(RuntimeError):
    """The encoder could not be exported faithfully; the message says what and why."""


# --------------------------------------------------------------------------- graphs


class EmbeddingGraph(nn.Module):
    """What model.onnx computes: the encoder's forward plus each layer's rank-collapse ratio
    (a few reductions per layer, nothing next to the attention)."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        states: list[torch.Tensor] = []
        embedding, last = self.encoder(input_ids, attention_mask, hidden_states=states)
        key_valid = attention_mask.bool()
        return embedding, last, torch.stack([rank_collapse_ratio(x, key_valid) for x in states], dim=1)


def _compact(weights) -> list[torch.Tensor]:
    """A layer's SlotWeights as graph outputs of fixed rank: rows (B|1, H|1, R) int64,
    cols (B|1, H|1, R|1, S) int64, probs (B, H, R, S) float32; broadcast dims stay 1."""
    out = []
    for rows, cols, probs in weights:
        while rows.dim() < 3:
            rows = rows[None]
        while cols.dim() < 4:
            cols = cols[None]
        out += [rows.to(torch.int64), cols.to(torch.int64), probs.to(torch.float32)]
    return out


class AnalysisGraph(nn.Module):
    """What analysis.onnx computes: every layer's attention weights in the variant's compact
    form (see models.attention.base.SlotWeights): for layer l and piece p the outputs
    attn{l}_{p}_rows, attn{l}_{p}_cols, attn{l}_{p}_probs."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        key_valid = attention_mask.bool()
        # The mask too: positions and query scaling follow each document's own length.
        x = self.encoder.embeddings(input_ids, attention_mask)
        outputs = []
        for layer in self.encoder.layers:
            x, weights = layer(x, key_valid, need_weights=True)
            outputs += _compact(weights)
        return tuple(outputs)


def analysis_layout(encoder: Encoder, length: int) -> list[int]:
    """How many SlotWeights pieces each layer returns (fixed per variant; found by running it)."""
    ids = torch.full((1, length), 1000, dtype=torch.long)
    counts = []
    with torch.no_grad():
        x = encoder.embeddings(ids)
        valid = torch.ones_like(ids, dtype=torch.bool)
        for layer in encoder.layers:
            x, weights = layer(x, valid, need_weights=True)
            counts.append(len(weights))
    return counts


# The analysis graph returns every layer's weights at once; its probs outputs may take at most
# this much memory, which bounds the tokens an attention-map request may have (dense variants:
# full, linformer, compressed, synthesizer give N x N effective weights).
ANALYSIS_BUDGET_BYTES = 2 << 30


def analysis_max_length(encoder: Encoder, multiple: int, capacity: int, max_length: int) -> int:
    """The longest input whose attention maps (all layers, float32) fit ANALYSIS_BUDGET_BYTES,
    from the weights' size at two lengths (linear or quadratic growth)."""
    n1 = min(capacity, multiple * -(-256 // multiple))
    n2 = min(capacity, 2 * n1)

    def elements(n):
        ids = torch.full((1, n), 1000, dtype=torch.long)
        with torch.no_grad():
            x = encoder.embeddings(ids)
            _, weights = encoder.layers[0](x, torch.ones_like(ids, dtype=torch.bool), need_weights=True)
        return sum(w.probs.numel() for w in weights)

    if n2 <= n1:
        return max_length
    e1, e2 = elements(n1), elements(n2)
    per_layer_bytes = 4 * len(encoder.layers)
    quadratic = e2 / e1 > 3
    limit = n2
    while limit < max_length:
        step = min(max_length, limit * 2)
        grown = e2 * (step / n2) ** (2 if quadratic else 1)
        if grown * per_layer_bytes > ANALYSIS_BUDGET_BYTES:
            # Largest multiple of the granule under the budget between limit and step.
            scale = (ANALYSIS_BUDGET_BYTES / (e2 * per_layer_bytes)) ** (0.5 if quadratic else 1.0)
            return max(limit, min(max_length, int(n2 * scale) // multiple * multiple))
        limit = step
    return max_length


# --------------------------------------------------------------------------- shapes


def length_multiple(variant: str, config) -> int:
    """The sequence granule of a variant's graph (`Attention.length_multiple`, its block):
    inputs are padded to a multiple of it."""
    return int(_variant(variant).length_multiple(config))


def short_graph_length(config, max_length: int, encoder=None) -> int:
    """Capacity in tokens of an export's short graph, 0 for none: the longest input the variant
    computes exactly as full attention does (`Attention.exact_up_to`, and with `encoder` only
    while every layer's own parameters keep it: `Attention.keeps_exactness`), when that is more
    than one granule of its graph (inputs within one granule pad to it anyway) and the variant
    is not full attention at every length (then its own graph is the full path)."""
    cls = _variant(config.variant)
    multiple = cls.length_multiple(config)
    exact = min(cls.exact_up_to(config, max_length), max_length)
    if encoder is not None and not all(layer.attention.keeps_exactness() for layer in encoder.layers):
        return 0
    return exact if exact > multiple and (multiple > 1 or exact < max_length) else 0


def full_attention_encoder(encoder: Encoder, capacity: int) -> Encoder:
    """`encoder` with full attention in every layer, for inputs of up to `capacity` tokens: the
    same embeddings, projections, FFNs and norms (shared, not copied) and the parameters every
    variant has (positions, query scaling), so that where the variant is exact the two compute
    the same function."""
    import copy

    config = encoder.attention_config
    full = make_config("full", capacity, **{f.name: getattr(config, f.name) for f in dataclasses.fields(AttentionConfig)})
    shared = {id(t): t for t in (*encoder.parameters(), *encoder.buffers())}
    if getattr(encoder, "tokenizer", None) is not None:
        shared[id(encoder.tokenizer)] = encoder.tokenizer
    short = copy.deepcopy(encoder, shared)
    head_dim = encoder.shape.hidden_size // encoder.shape.num_heads
    for layer in short.layers:
        layer.attention = build_attention(full, encoder.shape.num_heads, head_dim, capacity)
    short.attention_config, short.max_length = full, capacity
    return short.eval()


def _example(batch: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids (past the special tokens) with the last row's second half padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 29000, (batch, length), generator=g)
    ids[:, 0] = 101
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[-1, max(2, length // 2):] = 0
        ids[-1, max(2, length // 2):] = 0
    return ids, mask


# --------------------------------------------------------------------------- export


def _dynamic_shapes(multiple: int, capacity: int, max_batch: int):
    from torch.export import Dim

    batch = Dim("batch", min=1, max=max_batch)
    if multiple > 1:
        blocks = capacity // multiple
        seq = multiple * Dim("blocks", min=1, max=blocks) if blocks > 1 else None
    else:
        seq = Dim("seq", min=2, max=capacity)
    axes = {0: batch} if seq is None else {0: batch, 1: seq}
    return {"input_ids": axes, "attention_mask": axes}


@contextlib.contextmanager
def onnx_friendly_attention():
    """While exporting: scaled_dot_product_attention calls whose mask broadcasts over the
    queries (shape (..., 1, N), e.g. a key-padding mask) are rewritten so that ONNX Runtime
    can run them. ORT 1.31's fused Attention op (opset 23) requires the mask's query dimension
    to equal the query length, and expanding the mask would build an N x N tensor; instead the
    mask becomes one extra key feature: q' = [q, 1], k' = [k, mask / scale], so that
    q'.k' * scale = q.k * scale + mask, exactly the masked scores, with O(N) memory. Eager
    PyTorch is untouched (only the traced graph sees this)."""
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        if attn_mask is None or attn_mask.dim() < 2 or not (isinstance(attn_mask.shape[-2], int) and attn_mask.shape[-2] == 1):
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(~attn_mask, MASKED)
        else:
            bias = attn_mask.to(query.dtype)
        # (..., 1, N) -> (..., N, 1), broadcast to key's leading dims.
        column = (bias / scale).transpose(-1, -2).expand(*key.shape[:-1], 1)
        query = torch.cat([query, torch.ones_like(query[..., :1])], dim=-1)
        key = torch.cat([key, column], dim=-1)
        # ORT's CPU Attention kernel also stores the scores of all the heads it is given at
        # once (12 x N x N floats: 12.9 GB at 16,384 tokens); a few heads per node bound that.
        parts = [
            original(*(x[:, h : h + HEADS_PER_NODE] for x in (query, key, value)), dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs)
            for h in range(0, query.shape[1], HEADS_PER_NODE)
        ]
        return torch.cat(parts, dim=1)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _export_graph(module: nn.Module, path: Path, output_names: list[str], multiple: int, capacity: int,
                  max_batch: int, opset: int, optimize: bool, log) -> None:
    """torch.export (raises on narrowed dims) -> ONNX -> onnx.checker -> symbolic-axes check."""
    import onnx

    blocks = capacity // multiple
    example_len = multiple * (min(blocks, max(2, -(-300 // multiple))) if blocks > 1 else 1)
    args = _example(2, example_len)
    t0 = time.perf_counter()
    try:
        with onnx_friendly_attention():
            program = torch.export.export(module, args, dynamic_shapes=_dynamic_shapes(multiple, capacity, max_batch), strict=False)
    except Exception as exc:  # constraint violations, data-dependent branches, unsupported ops
        first = "\n".join(str(exc).strip().splitlines()[:6])
        raise ExportFailed(
            f"torch.export could not trace {path.name} with dynamic batch and sequence "
            f"(sequence = {multiple} * k): {type(exc).__name__}: {first}"
        ) from exc
    log(f"  torch.export {path.name}: {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    try:
        onnx_program = torch.onnx.export(
            program, args, dynamo=True, opset_version=opset, input_names=INPUT_NAMES,
            output_names=output_names, optimize=optimize, verbose=False,
        )
        onnx_program.save(str(path), external_data=True)
    except Exception as exc:
        raise ExportFailed(f"torch.onnx.export failed for {path.name}: {type(exc).__name__}: {str(exc)[:800]}") from exc
    log(f"  onnx export {path.name}: {time.perf_counter() - t0:.1f}s")
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:
        raise ExportFailed(f"onnx.checker rejected {path}: {exc}") from exc
    model = onnx.load(str(path), load_external_data=False)
    names = [o.name for o in model.graph.output]
    if names != list(output_names):
        raise ExportFailed(f"{path.name} has outputs {names}, expected {output_names}")
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in INPUT_NAMES or len(dims) != 2:
            raise ExportFailed(f"{path.name}: unexpected input {value.name} of rank {len(dims)}")
        if not dims[0].dim_param or (blocks > 1 and not dims[1].dim_param):
            fixed = [d.dim_value or d.dim_param for d in dims]
            raise ExportFailed(f"{path.name}: input {value.name} lost a dynamic axis (shape {fixed}); the exporter narrowed it")


def with_spare_position(encoder: Encoder, capacity: int) -> Encoder:
    """A copy of `encoder` whose attention tables indexed by position (a dim of size
    `capacity`, e.g. Linformer's E/F, the Synthesizer's factors) get one zero row more.

    forward() slices such tables to the sequence length, `table[:n]`; when the table is
    exactly as long as the longest n, torch.export cannot prove the slice is always n rows
    and refuses n == capacity. With a spare row it can; the row is never read (n <= capacity)."""
    import copy

    spare = copy.deepcopy(encoder)
    for layer in spare.layers:
        for module in layer.attention.modules():
            grown: dict[int, torch.Tensor] = {}  # by id of the old tensor: aliases stay aliases
            for table in (module._parameters, module._buffers):
                for name, tensor in list(table.items()):
                    if tensor is None or capacity not in tensor.shape:
                        continue
                    if id(tensor) not in grown:
                        dim = list(tensor.shape).index(capacity)
                        data = torch.cat([tensor.data, torch.zeros_like(tensor.data.narrow(dim, 0, 1))], dim=dim)
                        grown[id(tensor)] = nn.Parameter(data, requires_grad=False) if isinstance(tensor, nn.Parameter) else data
                    table[name] = grown[id(tensor)]
    return spare


def _ort_session(path: Path, threads: int = 0):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def verify_embedding_graph(encoder: Encoder, path: Path, multiple: int, lengths: list[int], log=print,
                           discontinuous: bool | None = None) -> dict:
    """ONNX Runtime (padded to the multiple) against PyTorch (unpadded) at each length, batch
    1 and 3 (padded rows). Raises ExportFailed past EMBEDDING_TOL / HIDDEN_TOL, or for a
    discontinuous variant (unless discontinuous=False) below DISCONTINUOUS_MIN_COSINE."""
    session = _ort_session(path)
    discontinuous = is_discontinuous(encoder.variant) if discontinuous is None else discontinuous
    worst = {"sentence_embedding": 0.0, "last_hidden_state": 0.0}
    for length in lengths:
        for batch in (1, 3):
            ids, mask = _example(batch, length, seed=length + batch)
            with torch.no_grad():
                emb, hidden = encoder(ids, mask)
            pid, pm = pad_to(ids.numpy(), mask.numpy(), multiple)
            o_emb, o_hidden, o_rank = session.run(None, {"input_ids": pid, "attention_mask": pm})
            real = mask.numpy().astype(bool)
            d_emb = float(np.abs(o_emb - emb.numpy()).max())
            d_hid = float(np.abs(o_hidden[:, :length] - hidden.numpy())[real].max())
            worst["sentence_embedding"] = max(worst["sentence_embedding"], d_emb)
            worst["last_hidden_state"] = max(worst["last_hidden_state"], d_hid)
            if not np.isfinite(o_emb).all() or not np.isfinite(o_rank).all():
                raise ExportFailed(f"{path.name} gives non-finite outputs at batch {batch}, {length} tokens")
            if discontinuous and (d_emb > EMBEDDING_TOL or d_hid > HIDDEN_TOL):
                # Hash buckets flipped on float rounding (see LSHAttention.discontinuous).
                worst["exact"] = False
                cos = float(cosines(o_emb, emb.numpy()).min())
                if cos >= DISCONTINUOUS_MIN_COSINE:
                    log(f"  note: {encoder.variant} at batch {batch}, {length} tokens: hash buckets differ from PyTorch "
                        f"(embedding diff {d_emb:.1e}, cosine {cos:.5f}, hidden {d_hid:.1e}); allowed for hashed attention")
                    continue
            if d_emb > EMBEDDING_TOL or d_hid > HIDDEN_TOL:
                raise ExportFailed(
                    f"{path.name} disagrees with PyTorch at batch {batch}, {length} tokens: embedding max abs diff "
                    f"{d_emb:.2e} (limit {EMBEDDING_TOL}), hidden states {d_hid:.2e} (limit {HIDDEN_TOL})"
                )
    log(f"  verified {path.name} at lengths {lengths}, batch 1 and 3: max abs diff embedding "
        f"{worst['sentence_embedding']:.1e}, hidden {worst['last_hidden_state']:.1e}")
    exact = worst.pop("exact", True)
    return {"lengths": lengths, "batches": [1, 3], "exact": exact, **{f"max_abs_diff_{k}": v for k, v in worst.items()}}


def export_recipe(config: AttentionConfig, max_length: int, weights_sha256: str | None = None, *, analysis: bool = True,
                  opset: int = OPSET, optimize: bool = False, max_batch: int = MAX_BATCH) -> dict:
    """Everything an export's graphs depend on: the variant's resolved parameters (so a default
    spelled out is the same export), max_length, the adapted weights, the code that builds the
    graphs and the versions of what converts them. `attnserve serve` caches an export under
    its digest (service.exports.export_path), and the manifest records it."""
    return {
        "variant": config.variant,
        "parameters": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "max_length": max_length,
        "weights_sha256": weights_sha256,
        "attnserve": package_version("attnserve"),
        "code_sha256": code_sha256(),
        "opset": opset,
        "analysis": analysis,
        "optimize": optimize,
        "max_batch": max_batch,
        "versions": {name: package_version(name) for name in ("torch", "onnx", "onnxscript")},
    }


def export_model(variant: str, params: dict, max_length: int, out_dir, *, analysis: bool = True, verify: bool = True,
                 opset: int = OPSET, optimize: bool = False, max_batch: int = MAX_BATCH, weights=None, log=print) -> Path:
    """Export `variant` with `params` for inputs of up to `max_length` tokens into out_dir:
    model.onnx (+ .data), analysis.onnx (+ .data) unless analysis=False, tokenizer.json and
    manifest.json; with `weights` (a directory `attnserve adapt` wrote) the encoder carries
    them and the manifest records their sha256. Returns out_dir. Raises ValueError for bad
    variant/params (WeightsError for weights that do not fit) and ExportFailed when the
    export is not faithful."""
    config = make_config(variant, max_length, **params)
    multiple = length_multiple(variant, config)
    # The graph runs on inputs padded up to the multiple, so the encoder is built for that.
    capacity = -(-max_length // multiple) * multiple
    encoder = load_encoder(variant, capacity, weights=weights, **params)
    return export_encoder(encoder, out_dir, max_length=max_length, params=params, analysis=analysis, verify=verify,
                          opset=opset, optimize=optimize, max_batch=max_batch, log=log)


def export_encoder(encoder: Encoder, out_dir, *, max_length: int | None = None, params: dict | None = None,
                   analysis: bool = True, verify: bool = True, opset: int = OPSET, optimize: bool = False,
                   max_batch: int = MAX_BATCH, log=print) -> Path:
    """export_model for an encoder already built (its max_length must be a multiple of the
    variant's length multiple, or max_length given and at most it). Adapted weights loaded
    into it (encoder.weights) are recorded in the manifest."""
    import onnx
    import onnxscript

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    encoder = encoder.eval()
    variant, config = encoder.variant, encoder.attention_config
    multiple = length_multiple(variant, config)
    capacity = encoder.max_length - encoder.max_length % multiple
    max_length = min(max_length or capacity, capacity)
    if capacity < multiple:
        raise ExportFailed(f"max_length {encoder.max_length} is shorter than {variant}'s block of {multiple} tokens")
    started = time.perf_counter()
    log(f"exporting {variant} {dataclasses.asdict(config)} max_length {max_length} (sequence padded to multiples of {multiple}) to {out_dir}")
    if getattr(encoder, "weights", None):
        log(f"  with adapted weights from {encoder.weights['dir']} (sha256 {encoder.weights['sha256'][:10]}, {encoder.weights['tensors']} tensors)")
    for stale in (*GRAPH_FILES, META_FILE, "manifest.json"):
        (out_dir / stale).unlink(missing_ok=True)

    traced = with_spare_position(encoder, capacity)
    with torch.no_grad():
        _export_graph(EmbeddingGraph(traced).eval(), out_dir / "model.onnx", EMBEDDING_OUTPUTS, multiple, capacity,
                      max_batch, opset, optimize, log)
    verified = None
    if verify:
        # One length inside the first block, one past two blocks and not a multiple of one.
        short = min(max_length, max(5, multiple // 2 + 3))
        longer = min(max_length, max(2 * multiple + 37, 300))
        verified = verify_embedding_graph(encoder, out_dir / "model.onnx", multiple, sorted({short, longer}), log)

    graphs = {"embedding": {"file": "model.onnx", "outputs": EMBEDDING_OUTPUTS}}
    short_length = short_graph_length(config, max_length, encoder)
    if short_length:
        log(f"  short inputs: {variant} is full attention up to {short_length} tokens; short.onnx runs them unpadded")
        with torch.no_grad():
            _export_graph(EmbeddingGraph(full_attention_encoder(encoder, short_length)), out_dir / "short.onnx",
                          EMBEDDING_OUTPUTS, 1, short_length, max_batch, opset, optimize, log)
        graphs["short"] = {"file": "short.onnx", "outputs": EMBEDDING_OUTPUTS, "max_length": short_length,
                           "length_multiple": 1, "attention": "full"}
        if verify:
            # Against the variant's own encoder: that is what the runner stands the graph in for.
            # Exact attention takes no discrete decision, so LSH too is held to max abs diff.
            lengths = sorted({min(short_length, 13), short_length // 2 + 1, short_length})
            graphs["short"]["verified"] = verify_embedding_graph(encoder, out_dir / "short.onnx", 1, lengths, log,
                                                                 discontinuous=False)
    if analysis:
        layout = analysis_layout(encoder, min(capacity, 2 * multiple))
        names, attention = [], []
        for layer, pieces in enumerate(layout):
            attention.append([])
            for piece in range(pieces):
                piece_names = {part: f"attn{layer}_{piece}_{part}" for part in ("rows", "cols", "probs")}
                names += list(piece_names.values())
                attention[-1].append(piece_names)
        with torch.no_grad():
            _export_graph(AnalysisGraph(traced).eval(), out_dir / "analysis.onnx", names, multiple, capacity,
                          max_batch, opset, optimize, log)
        graphs["analysis"] = {"file": "analysis.onnx", "outputs": names, "attention": attention,
                              "max_length": analysis_max_length(encoder, multiple, capacity, max_length)}
        log(f"  attention maps: up to {graphs['analysis']['max_length']} tokens (all layers' weights <= "
            f"{ANALYSIS_BUDGET_BYTES >> 30} GiB)")

    shutil.copyfile(model_dir() / "tokenizer.json", out_dir / "tokenizer.json")
    weights = getattr(encoder, "weights", None)
    if weights and (Path(weights["dir"]) / META_FILE).is_file():
        # What the weights were trained on travels with the export that serves them.
        shutil.copyfile(Path(weights["dir"]) / META_FILE, out_dir / META_FILE)
    files = {}
    for name in (*GRAPH_FILES, "tokenizer.json", META_FILE):
        path = out_dir / name
        if path.exists():
            files[name] = {"sha256": sha256(path), "bytes": path.stat().st_size}
    shape = encoder.shape
    recipe = export_recipe(config, max_length, weights["sha256"] if weights else None, analysis=analysis, opset=opset,
                           optimize=optimize, max_batch=max_batch)
    manifest = {
        "format": FORMAT,
        "variant": variant,
        "parameters": json.loads(json.dumps(dataclasses.asdict(config))),
        "requested_parameters": json.loads(json.dumps(params or {}, default=str)),
        "max_length": max_length,
        "length_multiple": multiple,
        "min_length": 2,
        "max_batch": max_batch,
        "hidden_size": shape.hidden_size,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "opset": opset,
        "inputs": {name: {"dtype": "int64", "shape": ["batch", f"sequence ({multiple} * k)"]} for name in INPUT_NAMES},
        "outputs": {
            "sentence_embedding": {"dtype": "float32", "shape": ["batch", shape.hidden_size], "note": "mean-pooled, L2-normalised"},
            "last_hidden_state": {"dtype": "float32", "shape": ["batch", "sequence", shape.hidden_size]},
            "rank_collapse": {"dtype": "float32", "shape": ["batch", shape.num_layers],
                              "note": "||X - 1 x^T|| / ||X|| per layer over real tokens, sqrt(l1 * linf) norm"},
        },
        "graphs": graphs,
        "files": files,
        "sha256": files["model.onnx"]["sha256"],
        "weights": {key: weights[key] for key in ("sha256", "dir", "tensors")} if weights else None,
        "verified": verified,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
                     "onnxruntime": _ort_version()},
        "recipe": recipe,
        "recipe_sha256": recipe_sha256(recipe),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "export_seconds": round(time.perf_counter() - started, 1),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out_dir} in {manifest['export_seconds']}s")
    return out_dir


def _ort_version() -> str | None:
    try:
        import onnxruntime

        return onnxruntime.__version__
    except ImportError:
        return None


# --------------------------------------------------------------------------- CLI


def configure_export(parser) -> None:
    parser.add_argument("--variant", required=True, help="attention variant (see `attnserve variants`)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="variant parameter (repeatable)")
    parser.add_argument("--max-length", type=int, default=16384, help="longest input in tokens (default 16384)")
    parser.add_argument("--out", required=True, help="export directory to write")
    parser.add_argument("--no-analysis", action="store_true", help="skip analysis.onnx (attention maps)")
    parser.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime vs PyTorch check")
    parser.add_argument("--optimize", action="store_true",
                        help="run the exporter's onnxscript optimiser too (2x slower export; ONNX Runtime optimises at load anyway)")
    parser.add_argument("--opset", type=int, default=OPSET)
    parser.add_argument("--weights", metavar="DIR", help="adapted weights to export with (a directory `attnserve adapt` wrote)")


def parse_params(pairs: list[str]) -> dict[str, str]:
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param takes KEY=VALUE (got {pair!r})")
        params[key.strip()] = value.strip()
    return params


def export_command(args) -> int:
    import sys

    try:
        export_model(args.variant, parse_params(args.param), args.max_length, args.out, analysis=not args.no_analysis,
                     verify=not args.no_verify, opset=args.opset, optimize=args.optimize, weights=args.weights)
    except (ValueError, ExportFailed) as exc:  # WeightsError is a ValueError
        print(f"attnserve export: error: {exc}", file=sys.stderr)
        return 2
    return 0
