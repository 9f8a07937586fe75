"""For every variant, ONNX Runtime on the export equals PyTorch eager.

Embeddings within 1e-4 and hidden states (real tokens) within 1e-3, at 77 tokens (batch 1),
a padded batch of 3 documents of 1,001 / 640 / 13 tokens, and 2,050 tokens (batch 1): past
several of every sparse pattern's blocks and windows (longformer's 512-token window, 64-token
blocks, LSH's chunks), the longest export at its own max_length. 1,001 and 2,050 are
multiples of none of the block sizes (3, 32, 64, 256). PyTorch runs the unpadded batch; the
runner pads to the export's length multiple, so the test also proves that padding leaves the
real tokens alone.

One export per variant (embedding graph only; lsh also needs its analysis graph, see
replayed_decisions), from the suite's export cache (tests/export_helpers.py), of the bundled
MiniLM's first two layers (conftest's two_layer_minilm: its trained weights, a third of the
export and run time of six layers; faithfulness is per layer). Longformer's is the whole
model's shared 8,200-token export that the runtime, late-chunking and memory tests serve,
checked at the same lengths and at its full length.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from discrete_decisions import replayed_orders
from export_helpers import SHARED_MAX_LENGTH, SHARED_VARIANT, get_export, padded_batch
from attnserve.models import variant_names
from attnserve.models.encoder import rank_collapse_ratio
from attnserve.export.verify import DISCONTINUOUS_MIN_COSINE, cosines
from attnserve.models.registry import is_discontinuous, make_config

LONG = 2050
CASES = [[77], [1001, 640, 13], [LONG]]


@contextlib.contextmanager
def replayed_decisions(encoder, runner, ids, mask):
    """PyTorch takes ONNX Runtime's discrete decisions for these inputs.

    LSH (LSHAttention.discontinuous) sorts tokens by the argmax of random rotations: a
    rounding difference of ~1e-6 between the runtimes can move a token to another bucket, which
    reshuffles the chunks and, layer after layer, much of the document, so the two runtimes
    cannot agree on a whole forward. Its orders are its only discrete decisions; ORT's are read
    back from the analysis graph's attention maps and replayed in PyTorch, leaving the
    continuous part to compare exactly."""
    pieces = runner.attention_pieces(ids, mask)
    with replayed_orders(encoder, [layer.attention.orders_from_weights(layer_pieces, ids.shape[1])
                                   for layer, layer_pieces in zip(encoder.layers, pieces)]):
        yield


@pytest.mark.parametrize("variant", variant_names())
def test_onnx_runtime_matches_pytorch(variant, two_layer_minilm):
    if variant == SHARED_VARIANT:
        check_parity(variant, SHARED_MAX_LENGTH, CASES + [[SHARED_MAX_LENGTH]])
    else:
        check_parity(variant, LONG, CASES, model=two_layer_minilm)


def check_parity(variant: str, max_length: int, cases: list[list[int]], model=None) -> None:
    from attnserve.service.runtime import OnnxRunner

    discontinuous = is_discontinuous(make_config(variant, max_length))
    export_dir, encoder = get_export(variant, max_length, analysis=discontinuous, model=model)
    runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=2)
    assert runner.max_length == max_length and runner.variant == variant
    for lengths in cases:
        ids, mask = padded_batch(lengths, seed=sum(lengths))
        out = runner.run(ids, mask, ("sentence_embedding", "last_hidden_state"))
        if discontinuous:
            # On its own decisions PyTorch stays close (the export's own check) ...
            with torch.no_grad():
                own, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
            cos = cosines(out["sentence_embedding"], own.numpy())
            assert cos.min() >= DISCONTINUOUS_MIN_COSINE, f"{variant} {lengths}: embedding cosines {cos}"
        # ... and on ONNX Runtime's it is exact.
        with replayed_decisions(encoder, runner, ids, mask) if discontinuous else contextlib.nullcontext():
            states = []
            with torch.no_grad():
                emb, hidden = encoder(torch.from_numpy(ids), torch.from_numpy(mask), hidden_states=states)
        real = mask.astype(bool)
        d_emb = np.abs(out["sentence_embedding"] - emb.numpy()).max()
        d_hid = np.abs(out["last_hidden_state"] - hidden.numpy())[real].max()
        assert d_emb <= 1e-4, f"{variant} {lengths}: embedding max abs diff {d_emb:.2e}"
        assert d_hid <= 1e-3, f"{variant} {lengths}: hidden state max abs diff {d_hid:.2e}"
        assert out["last_hidden_state"].shape == (len(lengths), max(lengths), 384)
        if len(lengths) == 1 and lengths[0] < 1000 and runner.attention_max_length:
            # Per-layer rank collapse of an unpadded document (the analysis graph's) equals the
            # encoder's own (tests/test_collapse.py checks it on the exports with analysis graphs).
            expected = [float(rank_collapse_ratio(x)[0]) for x in states]
            np.testing.assert_allclose(runner.rank_collapse(ids, mask), expected, atol=1e-4)


@pytest.mark.parametrize("variant", ["longformer", "local", "bigbird"])
def test_a_block_mask_reaches_the_kernel_once_not_once_per_head(variant, two_layer_minilm):
    """MiniLM's narrow heads (32 dimensions against 128-token blocks): the block-sparse
    attention hands ONNX Runtime's kernel the blocks as its batch and the heads as its heads,
    so that a mask the heads share is broadcast, never copied per head (ONNX has no stride-0
    views: that copy was as large as the scores, and at 8,192 tokens the longformer export's
    peak went from 743 to 577 MiB without it). Read from the embedding graph's own shapes:
    every masked Attention node's query has the model's heads, its mask one. BigBird's mask is
    the same for every query of a block, so its blocks need no mask node at all: they run as
    the unmasked MultiHeadAttention kernel (onnx_friendly_attention)."""
    import onnx

    # The exports test_onnx_runtime_matches_pytorch checks (the suite's cache holds them).
    shared = variant == SHARED_VARIANT
    export_dir, encoder = get_export(variant, SHARED_MAX_LENGTH if shared else LONG, model=None if shared else two_layer_minilm)
    model = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in model.graph.value_info}
    masked = [node for node in model.graph.node if node.op_type == "Attention" and len(node.input) > 3 and node.input[3]]
    unmasked = [node for node in model.graph.node if node.op_type == "MultiHeadAttention"]
    if variant == "bigbird":
        assert not masked and len(unmasked) >= encoder.shape.num_layers, [n.op_type for n in masked + unmasked]
    assert masked or variant == "bigbird", f"{variant}: no masked Attention node in model.onnx"
    for node in masked:
        query, mask = shapes[node.input[0]], shapes[node.input[3]]
        assert query[1] == encoder.shape.num_heads and mask[1] == 1, f"{variant}: query {query}, mask {mask}"
