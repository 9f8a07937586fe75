"""Rank collapse along the four paths of "Attention is not all you need" (Dong et al. 2021):
the model path is today's curve, the others equal a direct computation with full attention
written here from the layer's weights, the export's collapse graph equals PyTorch on every
path, and bad paths are refused. `attnserve bench collapse` writes its CSV and figure through the
installed wheel: tests/test_wheel_install.py."""
from __future__ import annotations

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


@pytest.mark.parametrize("variant, max_length, params", [("longformer", 8200, {}), ("local,full", 512, {"window": 16})])
def test_the_collapse_graph_equals_pytorch_on_every_path(variant, max_length, params):
    """The exports the other tests share (longformer's, and a schedule with a 16-token window):
    each path's ratios from ONNX Runtime within 1e-4 of PyTorch's on two padded documents, and
    the model path is the curve the embedding graph gives."""
    import numpy as np
    from export_helpers import get_export

    from attnserve.service.runtime import OnnxRunner

    export_dir, encoder = get_export(variant, max_length, analysis=True, **params)
    runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"])
    limit = runner.collapse_max_length
    assert runner.collapse_paths == list(COLLAPSE_PATHS) and limit == min(runner.attention_max_length, max_length // 4)
    # Two documents, the longer one at the limit, the other half as long.
    rows = [ids[: n - 1] + [102] for ids, n in zip(encoder.tokenize([long_text(2000, seed=1), long_text(2000, seed=4)]), (limit, limit // 2))]
    width = max(len(r) for r in rows)
    ids = np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    mask = (np.arange(width)[None] < np.array([len(r) for r in rows])[:, None]).astype(np.int64)
    with torch.no_grad():
        expected = encoder.collapse_paths(torch.tensor(ids), torch.tensor(mask))
    for row in range(2):
        got = runner.collapse(ids[row:row + 1], mask[row:row + 1], list(COLLAPSE_PATHS))
        for path in COLLAPSE_PATHS:
            assert np.abs(np.array(got[path]) - expected[path][row].numpy()).max() <= 1e-4, (row, path)
    # The analysis graph's per-layer curve (every layer's maps computed too: the shorter document's).
    assert got["model"][1:] == pytest.approx(runner.rank_collapse(ids[1:2], mask[1:2]), abs=1e-5)
    # Only the paths asked for, in that order.
    assert list(runner.collapse(ids[1:2], mask[1:2], ["attention_mlp", "model"])) == ["attention_mlp", "model"]
    with pytest.raises(ValueError, match="choose from model, attention_only"):
        runner.collapse(ids[:1], mask[:1], ["attention"])


def test_bad_path_names_the_valid_ones(full):
    with pytest.raises(ValueError, match="attention_only.*attention_skip"):
        full.rank_collapse("a text", paths=["attention"])
    with pytest.raises(ValueError, match="no rank-collapse path asked for: choose from model"):
        full.rank_collapse("a text", paths=[])
