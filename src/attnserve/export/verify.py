"""The export-time parity check: ONNX Runtime on an exported graph against the PyTorch encoder.

ONNX Runtime runs inputs padded to the graph's multiple, PyTorch the unpadded ones, at two
lengths and batch sizes 1 and 3 (one row padded): padding never changes the real tokens'
outputs (every variant is batch/padding invariant, tests/test_variants.py), and this proves it
for each export.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from attnserve.models.api import Encoder
from attnserve.export.graphs import ExportFailed, example_inputs
from attnserve.models import registry
from attnserve.contract.export_format import pad_to

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


def ort_session(path: Path, threads: int = 0):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def verify_embedding_graph(encoder: Encoder, path: Path, multiple: int, lengths: list[int], log=print,
                           discontinuous: bool | None = None, min_cosine: float | None = None) -> dict:
    """ONNX Runtime (padded to the multiple) against PyTorch (unpadded) at each length, batch
    1 and 3 (padded rows). Raises ExportFailed past EMBEDDING_TOL / HIDDEN_TOL, or for a
    discontinuous variant (unless discontinuous=False) below DISCONTINUOUS_MIN_COSINE. With
    `min_cosine` (a graph converted to int8 or float16) the embeddings' cosine to PyTorch's
    float32 ones is held to it instead, and the abs diffs are only recorded."""
    session = ort_session(path)
    discontinuous = registry.is_discontinuous(encoder.attention_config) if discontinuous is None else discontinuous
    worst = {"sentence_embedding": 0.0, "last_hidden_state": 0.0}
    lowest = 1.0
    for length in lengths:
        for batch in (1, 3):
            ids, mask = example_inputs(batch, length, seed=length + batch, vocab_size=encoder.shape.vocab_size)
            with torch.no_grad():
                emb, hidden = encoder(ids, mask)
            pid, pm = pad_to(ids.numpy(), mask.numpy(), multiple)
            o_emb, o_hidden = session.run(["sentence_embedding", "last_hidden_state"], {"input_ids": pid, "attention_mask": pm})
            real = mask.numpy().astype(bool)
            d_emb = float(np.abs(o_emb - emb.numpy()).max())
            d_hid = float(np.abs(o_hidden[:, :length] - hidden.numpy())[real].max())
            worst["sentence_embedding"] = max(worst["sentence_embedding"], d_emb)
            worst["last_hidden_state"] = max(worst["last_hidden_state"], d_hid)
            if not np.isfinite(o_emb).all() or not np.isfinite(o_hidden[:, :length][real]).all():
                raise ExportFailed(f"{path.name} gives non-finite outputs at batch {batch}, {length} tokens")
            if min_cosine is not None:
                cos = float(cosines(o_emb, emb.numpy()).min())
                lowest = min(lowest, cos)
                if cos < min_cosine:
                    raise ExportFailed(f"{path.name} is too far from PyTorch's float32 at batch {batch}, {length} tokens: "
                                       f"embedding cosine {cos:.5f} (at least {min_cosine})")
                continue
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
        f"{worst['sentence_embedding']:.1e}, hidden {worst['last_hidden_state']:.1e}"
        + (f", embedding cosine >= {lowest:.5f}" if min_cosine is not None else ""))
    exact = worst.pop("exact", True) and min_cosine is None
    cosine = {"min_cosine_sentence_embedding": lowest} if min_cosine is not None else {}
    return {"lengths": lengths, "batches": [1, 3], "exact": exact, **{f"max_abs_diff_{k}": v for k, v in worst.items()}, **cosine}
