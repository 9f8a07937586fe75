"""Rank collapse along the four paths of "Attention is not all you need" (Dong et al. 2021):
the model path is today's curve, the others equal a direct computation with full attention
written here from the layer's weights, bad paths are refused, and `attnserve bench collapse`
writes its CSV and figure."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from test_encoder import long_text

from attnserve.models import load_encoder
from attnserve.models.encoder import COLLAPSE_PATHS, rank_collapse_ratio


@pytest.fixture(scope="module")
def full():
    return load_encoder("full", max_length=512)


def direct_paths(encoder, text: str) -> dict[str, list[float]]:
    """Each path by hand: softmax(q k^T / sqrt(d)) v per head over every token, the output
    projection, then the skip, norm and MLP each path keeps."""
    ids = torch.tensor(encoder.tokenize([text]))
    start = encoder.embeddings(ids, torch.ones_like(ids))
    heads = encoder.shape.num_heads

    def attend(layer, x):
        n, hidden = x.shape[1], x.shape[2]
        split = [t.view(1, n, heads, -1).transpose(1, 2) for t in (layer.query(x), layer.key(x), layer.value(x))]
        mixed = F.scaled_dot_product_attention(*split)
        return layer.attention_out(mixed.transpose(1, 2).reshape(1, n, hidden))

    def mlp(layer, h):
        return layer.output(F.gelu(layer.intermediate(h)))

    steps = {
        "model": lambda layer, x: (lambda h: layer.output_norm(h + mlp(layer, h)))(layer.attention_norm(x + attend(layer, x))),
        "attention_only": attend,
        "attention_skip": lambda layer, x: layer.attention_norm(x + attend(layer, x)),
        "attention_mlp": lambda layer, x: layer.output_norm(mlp(layer, layer.attention_norm(attend(layer, x)))),
    }
    out = {}
    with torch.no_grad():
        for path, step in steps.items():
            x, ratios = start, []
            for layer in encoder.layers:
                x = step(layer, x)
                ratios.append(float(rank_collapse_ratio(x)[0]))
            out[path] = ratios
    return out


def test_model_path_is_todays_curve_and_the_others_match_a_direct_computation(full):
    text = long_text(300)
    paths = full.rank_collapse(text, paths=list(COLLAPSE_PATHS))
    assert list(paths) == list(COLLAPSE_PATHS) and all(len(r) == 6 for r in paths.values())
    assert paths["model"] == full.rank_collapse(text)
    direct = direct_paths(full, text)
    for path in COLLAPSE_PATHS:
        assert paths[path] == pytest.approx(direct[path], rel=1e-4, abs=1e-6), path
    # The paper's finding on this text: pure attention collapses (to float32's floor) within a
    # few layers, the skips keep the rank.
    assert paths["attention_only"][-1] < 1e-4 < 0.5 < paths["attention_skip"][-1]


def test_bad_path_names_the_valid_ones(full):
    with pytest.raises(ValueError, match="attention_only.*attention_skip"):
        full.rank_collapse("a text", paths=["attention"])


def test_bench_collapse_writes_csv_and_figure(tmp_path):
    done = subprocess.run([sys.executable, "-m", "attnserve.service.cli", "bench", "collapse", "--variants", "local,full",
                           "--schedule", "full*3,local*3", "--schedule", "full*3,local*3", "--lengths", "64,128", "--documents", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "collapse.csv")))
    assert {r["variant"] for r in rows} == {"local", "full", "full*3,local*3"}  # a schedule named replaces the default
    assert len(rows) == 3 * 2 * len(COLLAPSE_PATHS) * 7  # names x lengths x paths x depths (embeddings + 6 layers)
    assert (tmp_path / "collapse.png").stat().st_size > 10_000
    assert "| full*3,local*3 | 128 |" in done.stdout
