"""Positions past the 512 learned ones (recurrent, grouped, interpolated) and the attention
scaling option, as LongEmbed (Zhu et al. 2024) defines them, on every variant's config.

What each must keep: documents of up to 512 tokens are the pretrained model's under every
scheme; a document's vector does not depend on what it is batched with (s and the scaling
come from its own length); past 512 tokens the schemes really differ.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from export_helpers import get_export, padded_batch
from attnserve.models.positions import interpolated_positions, look_up, query_scale
from attnserve.models.registry import make_config

SCHEMES = [("recurrent", True), ("grouped", False), ("grouped", True), ("interpolated", False), ("interpolated", True)]
VARIANT, MAX_LENGTH = "local", 2048
LONG = 1500


def run(encoder, lengths, seed=0):
    ids, mask = padded_batch(lengths, seed=seed)
    with torch.no_grad():
        emb, hidden = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
    return emb, hidden


def test_a_long_document_without_a_scheme_is_todays_encoder(encoders):
    """The defaults (recurrent, no scaling) are position i mod 512 and unscaled queries."""
    encoder = encoders(VARIANT, MAX_LENGTH)
    ids, mask = padded_batch([LONG, 300], seed=1)
    table = encoder.embeddings.position_embeddings.weight
    vectors = encoder.embeddings.position_vectors(torch.from_numpy(ids), torch.from_numpy(mask))
    assert torch.equal(vectors[0], table[torch.arange(LONG) % 512])
    assert encoder.layers[0].scaled_length is None


@pytest.mark.parametrize("positions,scaling", SCHEMES)
def test_up_to_512_tokens_every_scheme_is_the_pretrained_model(encoders, positions, scaling):
    default = encoders("full", 512)
    encoder = encoders("full", 512, positions=positions, attention_scaling=scaling)
    for lengths in ([512], [512, 77, 3]):
        expected, expected_hidden = run(default, lengths, seed=len(lengths))
        got, hidden = run(encoder, lengths, seed=len(lengths))
        assert (got - expected).abs().max() <= 1e-6
        assert (hidden - expected_hidden).abs().max() <= 1e-6


@pytest.mark.parametrize("positions,scaling", SCHEMES)
def test_long_document_is_the_same_alone_and_in_a_padded_batch_and_differs_from_recurrent(encoders, positions, scaling):
    encoder = encoders(VARIANT, MAX_LENGTH, positions=positions, attention_scaling=scaling)
    alone, _ = run(encoder, [LONG], seed=3)
    short, _ = run(encoder, [300], seed=4)
    # One batch in which the long document is padded (a longer one sets the width, with its
    # own s = 4 against the long one's 3) and the short one is padded far past 512.
    ids, mask = padded_batch([LONG, 300, 1900], seed=5)
    ids[0, :LONG] = padded_batch([LONG], seed=3)[0][0]
    ids[1, :300] = padded_batch([300], seed=4)[0][0]
    with torch.no_grad():
        batched, _ = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
    assert (batched[0] - alone[0]).abs().max() <= 1e-5
    assert (batched[1] - short[0]).abs().max() <= 1e-5
    recurrent, _ = run(encoders(VARIANT, MAX_LENGTH), [LONG], seed=3)
    assert (alone - recurrent).abs().max() >= 1e-3, "past 512 tokens the scheme changes the vector"


def test_grouped_positions_at_two_tokens_a_row_are_row_i_div_2(encoders):
    """n = 1000 -> s = 2, also when the document sits padded in a wider batch."""
    embeddings = encoders(VARIANT, MAX_LENGTH, positions="grouped").embeddings
    ids, mask = (torch.from_numpy(a) for a in padded_batch([LONG, 1000], seed=6))
    table = embeddings.position_embeddings.weight
    with torch.no_grad():
        vectors = embeddings.position_vectors(ids, mask)
        out = embeddings(ids, mask)
        expected = embeddings.LayerNorm(embeddings.word_embeddings(ids[1, :1000]) + table[torch.arange(1000) // 2]
                                        + embeddings.token_type_embeddings.weight[0])
    assert torch.equal(vectors[1, :1000], table[torch.arange(1000) // 2])
    assert torch.equal(vectors[0], table[torch.arange(LONG) // 3])
    assert (out[1, :1000] - expected).abs().max() <= 1e-6


def test_interpolated_positions_are_table_rows_at_integers_and_between_them_elsewhere(encoders):
    """n = 1500 -> s = 3: token 3k is row k exactly, token 3k + 1 is 2/3 row k + 1/3 row k + 1."""
    embeddings = encoders(VARIANT, MAX_LENGTH, positions="interpolated").embeddings
    ids, mask = (torch.from_numpy(a) for a in padded_batch([LONG], seed=7))
    table = embeddings.position_embeddings.weight
    with torch.no_grad():
        vectors = embeddings.position_vectors(ids, mask)[0]
    k = torch.arange(LONG // 3)
    assert torch.equal(vectors[3 * k], table[k])
    between = table[k[:-1]] * (2 / 3) + table[k[:-1] + 1] * (1 / 3)
    assert (vectors[3 * k[:-1] + 1] - between).abs().max() <= 1e-6
    # At 1,536 tokens (s = 3) the last position, 1535 / 3 = 511.67, has no row above it: it
    # is clamped onto row 511.
    last = interpolated_positions(torch.arange(1536)[None], torch.tensor([1536]), 512, 512)
    assert last.max() == 511 and torch.equal(look_up(table, last)[0, -1], table[511])


def test_attention_scaling_is_log_n_over_log_512_per_document():
    valid = torch.zeros(4, 2048, dtype=torch.bool)
    for row, n in enumerate([2048, 512, 100, 1024]):
        valid[row, :n] = True
    scale = query_scale(valid, 512).flatten()
    assert scale[1] == 1.0 and scale[2] == 1.0  # exactly: short documents keep their queries
    assert abs(scale[0].item() - math.log(2048) / math.log(512)) <= 1e-6
    assert abs(scale[3].item() - 10 / 9) <= 1e-6


def test_cli_strings_are_converted_and_bad_values_say_what_is_valid():
    config = make_config("longformer", 4096, positions="grouped", attention_scaling="true")
    assert config.positions == "grouped" and config.attention_scaling is True
    assert make_config("bigbird", 4096, attention_scaling="0").attention_scaling is False
    with pytest.raises(ValueError, match="invalid parameter positions: must be one of recurrent, grouped, interpolated, learned"):
        make_config("local", 4096, positions="linear")
    with pytest.raises(ValueError, match="invalid parameter attention_scaling"):
        make_config("local", 4096, attention_scaling="maybe")
    with pytest.raises(ValueError, match="invalid parameter attention_scaling"):
        make_config("local", 4096, attention_scaling=2)
    with pytest.raises(ValueError, match="invalid parameter position_period: applies to positions=recurrent only"):
        make_config("full", 4096, positions="interpolated", position_period=256)


def test_onnx_runtime_matches_pytorch_with_interpolated_positions_and_scaling():
    """The export computes s and the scaling per document inside the graph: ONNX Runtime on
    inputs padded to the export's granule equals PyTorch on the unpadded ones."""
    from attnserve.service.runtime import OnnxRunner

    export_dir, encoder = get_export("local", 1024, positions="interpolated", attention_scaling=True)
    runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=2)
    for lengths in ([300], [1000], [1000, 700, 13]):
        ids, mask = padded_batch(lengths, seed=sum(lengths))
        out = runner.run(ids, mask, ("sentence_embedding", "last_hidden_state"))
        with torch.no_grad():
            emb, hidden = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
        real = mask.astype(bool)
        assert np.abs(out["sentence_embedding"] - emb.numpy()).max() <= 1e-4, lengths
        assert np.abs(out["last_hidden_state"] - hidden.numpy())[real].max() <= 1e-3, lengths
