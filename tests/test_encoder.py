"""The encoder end to end: pretrained parity, batch invariance, memory, determinism, API."""

import pytest
import torch

from discrete_decisions import recorded_orders, replayed_orders
from attnserve.models import load_encoder, variant_names
from attnserve.models.api import pad_batch
from attnserve.export.verify import DISCONTINUOUS_MIN_COSINE
from attnserve.models.registry import variant_class
from attnserve.models.pretrained import model_dir
from attnserve.data import DEV_DOCUMENTS, read_jsonl

ROWS = read_jsonl(DEV_DOCUMENTS)


def real_sentences():
    """One-line descriptions and opening paragraphs of real man pages (all <= 256 tokens)."""
    rows = ROWS[:40]
    texts = [r["query"] for r in rows]
    texts += [" ".join(r["text"].split()[:60]) for r in rows[:20]]
    return texts + ["", "a", "Ünïcödé — 漢字 and emoji 🙂 survive too."]


def long_text(words, seed=0):
    rows = ROWS
    return " ".join(" ".join(r["text"] for r in rows[seed : seed + 3]).split()[:words])


def test_full_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    texts = real_sentences()
    reference = SentenceTransformer(str(model_dir()), device="cpu").encode(texts, normalize_embeddings=True, convert_to_tensor=True)
    encoder = load_encoder("full", max_length=512)
    assert max(len(ids) for ids in encoder.tokenize(texts)) <= 256
    cosine = torch.nn.functional.cosine_similarity(encoder.embed(texts), reference)
    assert cosine.min() >= 0.9999, cosine


# 519, 1,465, 120 and 1,211 tokens: past longformer's 512-token window, linformer's 1,024 and every block size.
BATCH_DOCS = [long_text(250, 0), long_text(900, 3), long_text(40, 6), long_text(700, 9)]


@pytest.mark.parametrize("variant", [v for v in variant_names() if not variant_class(v).discontinuous])
def test_batch_invariance(variant, encoders):
    """A document embedded alone or batched with longer and shorter ones: the same vector."""
    encoder = encoders(variant)
    batched = encoder.embed(BATCH_DOCS)
    for i, doc in enumerate(BATCH_DOCS):
        assert (encoder.embed([doc])[0] - batched[i]).abs().max() <= 1e-5


@pytest.mark.parametrize("variant", [v for v in variant_names() if variant_class(v).discontinuous])
def test_batch_invariance_of_discontinuous_variants(variant, encoders):
    """LSH's buckets are an argmax: matmul rounding that differs with the batch's shape (~1e-6
    on some CPUs) can move a token whose rotations nearly tie to another bucket. Taking the
    batch's decisions, a document alone gives the batch's vector; taking its own, the two stay
    within the cosine the export check allows."""
    encoder = encoders(variant)
    ids = encoder.tokenize(BATCH_DOCS)
    with torch.no_grad(), recorded_orders(encoder) as log:
        batched = encoder(*pad_batch(ids))[0]
    for i, x in enumerate(ids):
        # Row i of the batch's orders over its first len(x) tokens (padding sorts last): its own.
        own_rows = [[tuple(o[i:i + 1, :, :len(x)] for o in rounds[r]) for r in sorted(rounds)] for rounds in log]
        with torch.no_grad(), replayed_orders(encoder, own_rows):
            alone = encoder(*pad_batch([x]))[0][0]
        assert (alone - batched[i]).abs().max() <= 1e-5
        own = encoder.embed_ids([x])[0]  # pooled as the batch's output is
        assert float(own @ batched[i]) >= DISCONTINUOUS_MIN_COSINE


@pytest.mark.parametrize("variant", variant_names())
def test_two_loads_are_identical(variant, encoders):
    """A fresh load gives the same vector bit for bit (seeded random parts: LSH's rotations, the
    random Synthesizer, projections), on a document past 512 tokens (each table is drawn whole)."""
    doc = [long_text(420, 12)]
    assert torch.equal(encoders(variant).embed(doc), load_encoder(variant, max_length=4096).embed(doc))


def test_empty_text_is_the_empty_document(encoders):
    encoder = encoders("longformer")
    empty = encoder.embed([""])
    assert empty.shape == (1, 384) and torch.isfinite(empty).all()
    assert torch.allclose(empty.norm(dim=1), torch.ones(1))
    assert encoder.tokenize([""]) == [[101, 102]]


def test_long_text_is_cut_at_max_length():
    encoder = load_encoder("local", max_length=300)
    text = long_text(2000)
    ids = encoder.tokenize([text])[0]
    assert len(ids) == 300 and ids[-1] == 102
    cut = encoder.tokenizer.decode(ids[1:-1])
    assert (encoder.embed([text]) - encoder.embed([cut])).abs().max() <= 1e-4


@pytest.mark.parametrize("variant", ["longformer", "linformer", "lsh"])
def test_attention_map_is_a_sparse_row_stochastic_matrix(variant, encoders):
    encoder = encoders(variant)
    text = long_text(300)
    n = len(encoder.tokenize([text])[0])
    matrix = encoder.attention_map(text, layer=2)
    assert matrix.is_sparse and matrix.shape == (n, n)
    assert torch.allclose(torch.sparse.sum(matrix, dim=1).to_dense(), torch.ones(n), atol=1e-4)
    one_head = encoder.attention_map(text, layer=5, head=11)
    assert torch.allclose(torch.sparse.sum(one_head, dim=1).to_dense(), torch.ones(n), atol=1e-4)


def test_longformer_map_is_banded_plus_global(encoders):
    encoder = encoders("longformer", window=64)
    text = long_text(300)
    matrix = encoder.attention_map(text, layer=0).coalesce()
    rows, cols = matrix.indices()
    local = (rows - cols).abs() <= 32
    assert ((rows == 0) | (cols == 0) | local).all()
    n = matrix.shape[0]
    assert matrix._nnz() < n * 66 + 2 * n


def test_bad_layer_or_head(encoders):
    encoder = encoders("longformer")
    with pytest.raises(ValueError, match="layer must be in 0..5"):
        encoder.attention_map("hello", layer=6)
    with pytest.raises(ValueError, match="head must be in 0..11"):
        encoder.attention_map("hello", layer=0, head=12)


def test_rank_collapse_per_layer(encoders):
    ratios = encoders("full").rank_collapse(long_text(200))
    assert len(ratios) == 6
    assert all(0 < r <= 1.0 for r in ratios)


def test_rank_collapse_ratio_is_zero_for_identical_tokens():
    from attnserve.models.encoder import rank_collapse_ratio

    x = torch.randn(1, 1, 8).expand(1, 10, 8)
    assert rank_collapse_ratio(x).item() <= 1e-6
    assert rank_collapse_ratio(torch.randn(1, 10, 8)).item() > 0.1


def test_unknown_variant_is_rejected_with_the_valid_ones():
    with pytest.raises(ValueError, match="unknown attention variant 'reformer'; valid: full, local"):
        load_encoder("reformer")
    with pytest.raises(ValueError, match="unknown parameter"):
        load_encoder("bigbird", blocks=3)
