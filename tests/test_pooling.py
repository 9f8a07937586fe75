"""attnserve.contract.pooling on known token vectors: the pooling modes and the chunk boundaries."""
from __future__ import annotations

import numpy as np
import pytest

from attnserve.contract.pooling import BadSpans, Pooling, check_spans, pool_chunks, span_chunks, token_chunks


def unit(v):
    return v / np.linalg.norm(v)


@pytest.fixture
def hidden():
    return np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)


def test_pooling_modes(hidden):
    np.testing.assert_allclose(Pooling("mean")(hidden), unit(hidden.mean(0)), rtol=1e-6)
    np.testing.assert_allclose(Pooling("mean")(hidden, normalize=False), hidden.mean(0), rtol=1e-6)
    np.testing.assert_allclose(Pooling("cls")(hidden), unit(hidden[0]), rtol=1e-6)
    # Opening: [CLS] and the first 4 document tokens, mixed 0.3 / 0.7 with the whole mean.
    mix = 0.3 * unit(hidden[:5].mean(0)) + 0.7 * unit(hidden.mean(0))
    np.testing.assert_allclose(Pooling("opening", 0.3, 4)(hidden), unit(mix), rtol=1e-5)
    np.testing.assert_allclose(Pooling("opening", 0.3, 4)(hidden, normalize=False), mix, rtol=1e-5)
    # A document of at most opening_tokens document tokens is all opening: its mean, raw too.
    np.testing.assert_allclose(Pooling("opening", 0.3, 10)(hidden, normalize=False), hidden.mean(0), rtol=1e-6)
    # The opening is the first late chunk of the same size.
    (first, *_) = token_chunks([(0, 0)] + [(i, i + 1) for i in range(10)] + [(0, 0)], 10, 4)
    np.testing.assert_allclose(pool_chunks(hidden, [first])[0], unit(hidden[:5].mean(0)), rtol=1e-5)


@pytest.mark.parametrize("bad, says", [({"mode": "max"}, "pooling must be one of"), ({"opening_weight": 1.5}, "opening_weight"), ({"opening_tokens": 0}, "opening_tokens")])
def test_bad_pooling_is_a_clear_error(bad, says):
    with pytest.raises(ValueError, match=says):
        Pooling(**{"mode": "opening", **bad})


def test_token_chunks_tile_the_text():
    text = "aa bb cc dd ee"
    offsets = [(0, 0), (0, 2), (3, 5), (6, 8), (9, 11), (12, 14), (0, 0)]
    chunks = token_chunks(offsets, len(text), 2)
    assert [(c.first, c.stop) for c in chunks] == [(0, 3), (3, 5), (5, 7)]  # [CLS] first, [SEP] last
    assert [text[c.start:c.end] for c in chunks] == ["aa bb ", "cc dd ", "ee"]
    overlapping = token_chunks(offsets, len(text), 3, overlap_tokens=1)
    assert [(c.first, c.stop) for c in overlapping] == [(0, 4), (3, 7)]
    assert [text[c.start:c.end] for c in overlapping] == ["aa bb cc", "cc dd ee"]
    # Truncated after "cc": the chunks end at the last kept token.
    cut = token_chunks(offsets[:4] + [(0, 0)], len(text), 2, truncated=True)
    assert [text[c.start:c.end] for c in cut] == ["aa bb ", "cc"]
    with pytest.raises(ValueError, match="overlap_tokens"):
        token_chunks(offsets, len(text), 2, overlap_tokens=2)


def test_span_chunks():
    offsets = [(0, 0), (0, 2), (3, 5), (6, 8), (9, 11), (12, 14), (0, 0)]
    chunks = span_chunks(offsets, check_spans([[0, 5], [6, 11]], 14))
    assert [(c.first, c.stop, c.start, c.end) for c in chunks] == [(0, 3, 0, 5), (3, 5, 6, 11)]  # "ee" is in no span
    last = span_chunks(offsets, check_spans([[6, 14]], 14))
    assert [(c.first, c.stop) for c in last] == [(3, 7)]
    with pytest.raises(BadSpans, match="holds no token"):
        span_chunks(offsets, check_spans([[0, 2], [2, 3]], 14))
    assert span_chunks(offsets[:3] + [(0, 0)], check_spans([[0, 5], [6, 14]], 14), truncated=True)[-1].end == 5


def test_python_and_http_share_one_default_pooling():
    """A deployment (default_pooling of its manifest) and the Python API (pooling_for the
    model's own pooling) pool alike: opening for a mean-pooled model, its own cls or lasttoken."""
    from attnserve.contract.pooling import DEFAULT_POOLING, default_pooling, pooling_for

    for own, expected in (("mean", DEFAULT_POOLING), ("cls", "cls"), ("lasttoken", "lasttoken"), (None, DEFAULT_POOLING)):
        assert pooling_for(own) == default_pooling({"model": {"pooling": own}}) == expected
    opening = Pooling("opening", opening_tokens=4)
    assert [opening.applied_mode(n) for n in (5, 6, 7)] == ["mean", "mean", "opening"]


def test_every_path_takes_its_default_pooling_from_the_contract():
    """No second default: Pooling names no mode of its own, and the backend (server, batcher,
    Embedder) and serve's settings fall back to contract.pooling.default_pooling of the export."""
    from attnserve.contract.pooling import DEFAULT_POOLING, default_pooling
    from attnserve.service.app import deployment_pooling
    from attnserve.service.backend import Backend
    from attnserve.service.settings import Settings
    from http_fakes import FakeRunner

    with pytest.raises(TypeError):
        Pooling()
    mean_model, cls_model = FakeRunner(), FakeRunner()
    cls_model.manifest = {**cls_model.manifest, "model": {"pooling": "cls"}}
    assert Backend(mean_model).pooling == Pooling(DEFAULT_POOLING) and Backend(cls_model).pooling == Pooling("cls")
    assert Settings().pooling is None
    for runner in (mean_model, cls_model):
        assert deployment_pooling(Settings(), runner) == default_pooling(runner.manifest)
        assert deployment_pooling(Settings(pooling="mean"), runner) == "mean"
