"""The graphs an export holds and how one is traced to ONNX.

EmbeddingGraph (model.onnx, and short.onnx over a full-attention copy of the encoder),
AnalysisGraph (analysis.onnx) and CollapseGraph (collapse.onnx) wrap the PyTorch encoder;
export_graph traces one with torch.export and converts it with torch.onnx, under
onnx_friendly_attention (attention over all keys as ONNX Runtime's MultiHeadAttention) and checks
what came out.

Dynamic shapes. Batch and sequence are dynamic axes. The block-sparse variants pad the
sequence to a multiple of their block inside forward(); torch.export cannot prove the shape
identities that padding creates for every length (it raises on them), so the sequence axis is
exported as `length_multiple * k` with k dynamic, and the runner pads every batch (attention
mask 0) to that multiple before running it (attnserve.contract.export_format.pad_to).

The exporter's own onnxscript optimiser is off by default: ONNX Runtime applies its graph
optimisations when it loads the model, and the unoptimised export runs no slower while it
exports in half the time.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.models.api import Encoder
from attnserve.models.attention.base import MASKED, AttentionConfig
from attnserve.models.encoder import COLLAPSE_PATHS, rank_collapse_ratio
from attnserve.models.attention.full import FullConfig
from attnserve.models.registry import build_attention
from attnserve.contract.export_format import INPUT_NAMES

# Opset 23: the graphs' standard operators. The attention over all N keys is ONNX Runtime's
# com.microsoft MultiHeadAttention (see onnx_friendly_attention); the block-sparse variants'
# masked blocks stay opset 23's Attention.
OPSET = 23
ORT_DOMAIN = "com.microsoft"


class ExportFailed(RuntimeError):
    """The encoder could not be exported faithfully; the message says what and why."""


class EmbeddingGraph(nn.Module):
    """What model.onnx computes: the encoder's forward, nothing else. ONNX Runtime runs every
    node whatever outputs are asked for, so anything added here (the rank-collapse ratios were,
    once) costs every embedding: they took 4% of the time of ModernBERT-base at 4,096 tokens,
    and held each layer's output until the last layer, 0.5 GB at 8,192."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids, attention_mask)


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
    attn{l}_{p}_rows, attn{l}_{p}_cols, attn{l}_{p}_probs; then each layer's rank-collapse
    ratio, (B, num_layers), the last output (RANK_COLLAPSE_OUTPUT)."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        key_valid = attention_mask.bool()
        # The mask too: positions and query scaling follow each document's own length.
        x = self.encoder.embeddings(input_ids, attention_mask)
        outputs, ratios = [], []
        for layer in self.encoder.layers:
            x, weights = layer(x, key_valid, need_weights=True)
            outputs += _compact(weights)
            ratios.append(rank_collapse_ratio(x, key_valid))
        return (*outputs, torch.stack(ratios, dim=1))


class CollapseGraph(nn.Module):
    """What collapse.onnx computes: for each of COLLAPSE_PATHS (LongContextEncoder.collapse_paths)
    the rank-collapse ratio of the embeddings' output and of every layer's output along that
    path, (B, 1 + num_layers), as output collapse_{path}. Its own graph, because ONNX Runtime
    runs every node whatever outputs are asked for: in model.onnx the three extra passes would
    slow every embedding, in analysis.onnx every attention map."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        return tuple(self.encoder.collapse_paths(input_ids, attention_mask).values())


COLLAPSE_OUTPUTS = {path: f"collapse_{path}" for path in COLLAPSE_PATHS}


def layer_weights(encoder: Encoder, length: int) -> list[list]:
    """Each layer's SlotWeights pieces for one input of `length` tokens (one ordinary token,
    inside the model's vocabulary whatever its size, repeated)."""
    token = min(1000, encoder.shape.vocab_size // 2)
    ids = torch.full((1, length), token, dtype=torch.long)
    per_layer = []
    with torch.no_grad():
        x = encoder.embeddings(ids)
        valid = torch.ones_like(ids, dtype=torch.bool)
        for layer in encoder.layers:
            x, weights = layer(x, valid, need_weights=True)
            per_layer.append(weights)
    return per_layer


def analysis_layout(encoder: Encoder, length: int) -> list[int]:
    """How many SlotWeights pieces each layer returns (fixed per variant; found by running it)."""
    return [len(weights) for weights in layer_weights(encoder, length)]


def full_attention_encoder(encoder: Encoder, capacity: int) -> Encoder:
    """`encoder` with full attention in every layer, for inputs of up to `capacity` tokens: the
    same embeddings, projections, FFNs and norms (shared, not copied) and the parameters every
    variant has (positions, query scaling), so that where the variant is exact the two compute
    the same function."""
    config = encoder.attention_config
    full = FullConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(AttentionConfig)})
    shared = {id(t): t for t in (*encoder.parameters(), *encoder.buffers())}
    if getattr(encoder, "tokenizer", None) is not None:
        shared[id(encoder.tokenizer)] = encoder.tokenizer
    short = copy.deepcopy(encoder, shared)
    head_dim = encoder.shape.hidden_size // encoder.shape.num_heads
    for layer in short.layers:
        layer.attention = build_attention(full, encoder.shape.num_heads, head_dim, capacity)
    short.attention_config, short.max_length = full, capacity
    return short.eval()


def example_inputs(batch: int, length: int, seed: int = 0, vocab_size: int = 30522) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids (past the special tokens, inside a vocabulary of vocab_size) with the
    last row's second half padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(1000, vocab_size // 2), min(29000, vocab_size), (batch, length), generator=g)
    ids[:, 0] = min(101, vocab_size - 1)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[-1, max(2, length // 2):] = 0
        ids[-1, max(2, length // 2):] = 0
    return ids, mask


def vocab_size(module: nn.Module, default: int = 30522) -> int:
    """The vocabulary of the encoder inside `module` (its word embeddings' rows); `default`
    (all-MiniLM's) for a module without word embeddings, which reads any ids."""
    return next((m.num_embeddings for name, m in module.named_modules() if name.endswith("word_embeddings")), default)


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


_SDPA = F.scaled_dot_product_attention  # the real kernel, whatever onnx_friendly_attention patches


@torch.library.custom_op("attnserve::unmasked_attention", mutates_args=())
def unmasked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, heads: int, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v of (B, heads, S, Dq) queries over (B, heads, L, Dq) keys and
    (B, heads, L, Dv) values, no mask: what ONNX Runtime's MultiHeadAttention runs (in
    PyTorch, scaled_dot_product_attention)."""
    return _SDPA(query, key, value, scale=scale)


@unmasked_attention.register_fake
def _(query, key, value, heads, scale):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


def _multi_head_attention_schema() -> None:
    """The part of ONNX Runtime's com.microsoft MultiHeadAttention (version 1) these graphs use,
    registered with onnx so that onnxscript can build the node and onnx.checker check it: query,
    key and value (B, S|L, heads * D), attributes num_heads and scale. ONNX Runtime defines the
    whole operator; onnx ships no schema for its contrib operators."""
    import onnx
    from onnx.defs import OpSchema

    if onnx.defs.has("MultiHeadAttention", 1, ORT_DOMAIN):
        return
    tensor = ("T", ["tensor(float)", "tensor(float16)"], "float tensors")
    onnx.defs.register_schema(OpSchema(
        "MultiHeadAttention", ORT_DOMAIN, 1,
        inputs=[OpSchema.FormalParameter(name, "T") for name in ("query", "key", "value")],
        outputs=[OpSchema.FormalParameter("output", "T")], type_constraints=[tensor],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "heads"),
                    OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "score scale")]))


def _unmasked_attention_onnx(query, key, value, heads: int, scale: float):
    """unmasked_attention as ONNX: (B, H, S, D) -> (B, S, H * D), MultiHeadAttention, and back.
    On CPU, ONNX Runtime runs an unmasked MultiHeadAttention with its flash kernel, which goes
    through the keys in blocks and never stores the N x N scores (opset 23's Attention does)."""
    import onnxscript
    from onnxscript import opset18 as op

    ms = onnxscript.values.Opset(ORT_DOMAIN, 1)
    flat = op.Constant(value_ints=[0, 0, -1])

    def sequence_major(x):
        return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), flat)

    out = ms.MultiHeadAttention(sequence_major(query), sequence_major(key), sequence_major(value), num_heads=heads, scale=scale)
    return op.Transpose(op.Reshape(out, op.Constant(value_ints=[0, 0, heads, -1])), perm=[0, 2, 1, 3])


CUSTOM_TRANSLATIONS = {torch.ops.attnserve.unmasked_attention.default: _unmasked_attention_onnx}


@contextlib.contextmanager
def onnx_friendly_attention():
    """While exporting: scaled_dot_product_attention calls with no mask, or with one that
    broadcasts over the queries (shape (..., 1, N), e.g. a key-padding mask), become
    unmasked_attention, which exports as ONNX Runtime's MultiHeadAttention: its CPU flash kernel
    keeps the memory of one call O(N) where opset 23's Attention stores every head's N x N
    scores (12.9 GB at 16,384 tokens), and it runs faster. That kernel takes no mask, so the
    mask becomes one extra key feature: q' = [q, 1], k' = [k, mask / scale], so that
    q'.k' * scale = q.k * scale + mask, exactly the masked scores. Eager PyTorch is untouched
    (only the traced graph sees this)."""
    _multi_head_attention_schema()

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        key_mask = attn_mask is not None and attn_mask.dim() >= 2 and isinstance(attn_mask.shape[-2], int) and attn_mask.shape[-2] == 1
        if (attn_mask is not None and not key_mask) or is_causal or dropout_p or kwargs or query.dim() != 4:
            return _SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        if key_mask:
            if attn_mask.dtype == torch.bool:
                bias = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(~attn_mask, MASKED)
            else:
                bias = attn_mask.to(query.dtype)
            # (..., 1, N) -> (..., N, 1), broadcast to key's leading dims.
            column = (bias / scale).transpose(-1, -2).expand(*key.shape[:-1], 1)
            query = torch.cat([query, torch.ones_like(query[..., :1])], dim=-1)
            key = torch.cat([key, column], dim=-1)
        return unmasked_attention(query, key, value, int(query.shape[1]), float(scale))

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _SDPA


@contextlib.contextmanager
def quiet_converter():
    """torch.onnx's notes that say nothing about this export: that torchvision's operators are
    not registered (attnserve uses none) and torch's own FutureWarning about its tree specs."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*treespec.*")
            yield
    finally:
        registration.setLevel(level)


def export_graph(module: nn.Module, path: Path, output_names: list[str], multiple: int, capacity: int,
                  max_batch: int, opset: int, optimize: bool, log) -> None:
    """torch.export (raises on narrowed dims) -> ONNX -> onnx.checker -> symbolic-axes check."""
    import onnx

    blocks = capacity // multiple
    example_len = multiple * (min(blocks, max(2, -(-300 // multiple))) if blocks > 1 else 1)
    args = example_inputs(2, example_len, vocab_size=vocab_size(module))
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
        with quiet_converter():
            onnx_program = torch.onnx.export(
                program, args, dynamo=True, opset_version=opset, input_names=list(INPUT_NAMES),
                output_names=output_names, optimize=optimize, verbose=False, custom_translation_table=CUSTOM_TRANSLATIONS,
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
