"""Each attention variant on random q, k, v: mask variants equal dense masked softmax, every
variant's attention map reproduces its output, and padding changes nothing."""
import pytest
import torch

from attnserve.models import variant_names
from attnserve.models.registry import VARIANTS, build_attention, make_config
from attnserve.models.sparse import to_sparse

HEADS, DIM = 12, 32
MASK_VARIANTS = ["full", "local", "strided", "global", "longformer", "bigbird"]
# Lengths off every block and window size, one shorter than a block, one spanning many.
LENGTHS = [37, 130, 700, 1500]


def attention(name, max_length=4096, **params):
    return build_attention(make_config(name, max_length, **params), HEADS, DIM, max_length)


def inputs(batch, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS, n, DIM, generator=g) for _ in range(3)]


def test_registry_has_exactly_the_variants():
    assert variant_names() == ["full", "local", "strided", "global", "longformer", "bigbird", "lsh", "sinkhorn", "linformer", "compressed", "synthesizer"]
    assert sorted(name for name, cls in VARIANTS.items() if cls.is_mask) == sorted(MASK_VARIANTS)


def test_dense_keys_are_what_the_attention_maps_show():
    """Attention.dense_keys (what the runtime benchmark sizes ONNX Runtime's score buffers by):
    the variants that score every query against O(N) keys say how many, the others 0, as
    each one's cost states."""
    n = 1536
    for name, cls in VARIANTS.items():
        keys = cls.dense_keys(make_config(name, 4096), n)
        assert (keys > 0) == cls.cost.startswith("O(N^2"), name
    assert VARIANTS["full"].dense_keys(make_config("full", 4096), n) == n
    assert VARIANTS["compressed"].dense_keys(make_config("compressed", 4096, stride=4, kernel=4), n) == n // 4
    _, weights = attention("full")(*inputs(1, 64), torch.ones(1, 64, dtype=torch.bool), need_weights=True)
    assert weights[0].probs.shape[-1] == VARIANTS["full"].dense_keys(make_config("full", 4096), 64)


@pytest.mark.parametrize("name", MASK_VARIANTS)
@pytest.mark.parametrize("n", LENGTHS)
def test_mask_variant_equals_dense_masked_softmax(name, n):
    att = attention(name)
    q, k, v = inputs(3, n)
    key_valid = torch.ones(3, n, dtype=torch.bool)
    key_valid[1, n // 2 :] = False  # a padded batch: row 1 is a shorter document
    key_valid[2, n - 5 :] = False
    allowed = att.allowed_mask(key_valid)
    scores = (q @ k.transpose(-1, -2) * att.scale).masked_fill(~allowed, float("-inf"))
    reference = torch.softmax(scores, -1) @ v
    real = key_valid[:, None, :, None].expand_as(reference)
    for need_weights in (False, True):
        out, _ = att(q, k, v, key_valid, need_weights=need_weights)
        assert (out - reference)[real].abs().max() <= 1e-5


@pytest.mark.parametrize("name", MASK_VARIANTS)
def test_mask_variant_map_is_the_dense_masked_softmax(name):
    n = 300
    att = attention(name)
    q, k, v = inputs(1, n, seed=1)
    key_valid = torch.ones(1, n, dtype=torch.bool)
    allowed = att.allowed_mask(key_valid)
    probs = torch.softmax((q @ k.transpose(-1, -2) * att.scale).masked_fill(~allowed, float("-inf")), -1)
    _, weights = att(q, k, v, key_valid, need_weights=True)
    assert (to_sparse(weights, n).to_dense() - probs[0].mean(0)).abs().max() <= 1e-6
    assert (to_sparse(weights, n, head=5).to_dense() - probs[0, 5]).abs().max() <= 1e-6


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("n", [130, 700])
def test_attention_map_times_values_is_the_output(name, n):
    """The map is the real attention: its rows mix V into exactly what the variant outputs."""
    att = attention(name)
    q, k, v = inputs(1, n, seed=2)
    key_valid = torch.ones(1, n, dtype=torch.bool)
    out, weights = att(q, k, v, key_valid, need_weights=True)
    fast, none = att(q, k, v, key_valid)
    assert none is None
    assert (fast - out).abs().max() <= 1e-5
    for head in (0, 7):
        dense = to_sparse(weights, n, head=head).to_dense()
        assert torch.allclose(dense.sum(-1), torch.ones(n), atol=1e-5)  # rows are distributions
        assert (dense @ v[0, head] - out[0, head]).abs().max() <= 1e-5


@pytest.mark.parametrize("name", VARIANTS)
def test_padding_does_not_change_a_document(name):
    """A document alone and inside a longer padded batch gives the same output rows."""
    att = attention(name)
    n, longer = 333, 1030
    q, k, v = inputs(2, longer, seed=3)
    key_valid = torch.ones(2, longer, dtype=torch.bool)
    key_valid[0, n:] = False
    batched, _ = att(q, k, v, key_valid)
    alone, _ = att(q[:1, :, :n], k[:1, :, :n], v[:1, :, :n], key_valid[:1, :n])
    assert (batched[0, :, :n] - alone[0]).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("local", {"window": 0}, "window"),
        ("local", {"window": -4}, "window"),
        ("strided", {"stride": 0}, "stride"),
        ("bigbird", {"block": 0}, "block"),
        ("bigbird", {"window_blocks": 2}, "window_blocks"),
        ("bigbird", {"block": 8192}, "block"),
        ("linformer", {"k": 5000}, "k"),
        ("linformer", {"sharing": "heads"}, "sharing"),
        ("compressed", {"kernel": 2, "stride": 3}, "kernel"),
        ("sinkhorn", {"temperature": 0}, "temperature"),
        ("lsh", {"n_hashes": 9}, "n_hashes"),
        ("lsh", {"n_buckets": 7}, "n_buckets"),
        ("synthesizer", {"mode": "mlp"}, "mode"),
        ("global", {"global_tokens": (0, 99999)}, "global_tokens"),
        ("full", {"position_period": 1000}, "position_period"),
    ],
)
def test_impossible_parameters_fail_at_load(name, params, message):
    with pytest.raises(ValueError, match=f"invalid parameter {message}"):
        make_config(name, 4096, **params)


def test_unknown_variant_and_parameter_list_the_valid_ones():
    with pytest.raises(ValueError, match="valid: full, local, strided"):
        make_config("performer", 512)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) windw.*valid: position_period=512, positions='recurrent', attention_scaling=False, window=512"):
        make_config("local", 512, windw=3)


def test_string_parameters_are_converted():
    config = make_config("longformer", 4096, window="128", global_tokens="0,5")
    assert config.window == 128 and config.global_tokens == (0, 5)
    with pytest.raises(ValueError, match="invalid parameter window"):
        make_config("local", 512, window="wide")


def test_lsh_orders_read_back_from_its_map():
    """LSH's sort orders (its only discrete decisions) can be recovered from its attention map,
    also from a run padded wider (what an export runs), and replaying them reproduces the
    output: what tests/test_export_parity.py relies on."""
    att = attention("lsh")
    n, wider = 1001, 1088
    q, k, v = inputs(2, wider, seed=5)
    key_valid = torch.ones(2, wider, dtype=torch.bool)
    key_valid[1, 640:] = False
    out, weights = att(q[:, :, :n], k[:, :, :n], v[:, :, :n], key_valid[:, :n], need_weights=True)
    _, wide_weights = att(q, k, v, key_valid & (torch.arange(wider) < n), need_weights=True)
    expected = [att.orders(q[:, :, :n], k[:, :, :n], key_valid[:, :n], r) for r in range(att.config.n_hashes)]
    for pieces in (weights, wide_weights):
        recovered = att.orders_from_weights(pieces, n)
        assert len(recovered) == len(expected) == 2
        for (q_order, k_order), (q_expected, k_expected) in zip(recovered, expected):
            assert torch.equal(q_order, q_expected) and torch.equal(k_order, k_expected)
    att.orders = lambda q_, k_, valid, round_: recovered[round_]
    replayed, _ = att(q[:, :, :n], k[:, :, :n], v[:, :, :n], key_valid[:, :n])
    assert torch.equal(replayed, out)


@pytest.mark.parametrize("mode", ["random", "dense"])
def test_synthesizer_is_softmax_of_its_factors_per_head(mode):
    """Heads that share weights (random mode) run grouped, with their values side by side;
    each head must still get softmax(A B^T) V over its own values, in a padded batch."""
    att = attention("synthesizer", mode=mode)
    if mode == "dense":  # W2 starts at 0 (uniform weights): give it something to show
        with torch.no_grad():
            att.right.normal_(generator=torch.Generator().manual_seed(4))
    n = 300
    q, k, v = inputs(2, n, seed=6)
    key_valid = torch.ones(2, n, dtype=torch.bool)
    key_valid[1, 170:] = False
    out, _ = att(q, k, v, key_valid)
    a, b = att.factors(q)
    scores = (a @ b.transpose(-1, -2)).expand(2, HEADS, n, n).masked_fill(~key_valid[:, None, None, :], float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    rows = key_valid[:, None, :, None]  # padding queries' rows are never read
    assert ((out - expected) * rows).abs().max() <= 1e-5
    shared = {"random": 1, "dense": HEADS}[mode]
    assert att.right.shape == (shared, 4096, att.config.rank)
