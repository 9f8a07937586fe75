"""The in-process Embedder (src/attnserve/service/embedder.py) over the HTTP tests' export: a batch of mixed
lengths, grouped by length, gives each text the vector it gets alone and the server's pooling
by default; its limits are the export's."""
from __future__ import annotations

import numpy as np
import pytest

from attnserve.contract.pooling import DEFAULT_POOLING, Pooling
from attnserve.service.embedder import Embedder
from attnserve.service.tokenizer import InputTooLong

TEXTS = [" ".join(["word"] * n) + f" {n}" for n in (3, 240, 7, 600, 30, 250, 1, 90, 12, 200, 60, 5)]


@pytest.fixture(scope="module")
def embedder(export_dir):
    return Embedder(export_dir, threads=1, max_batch_tokens=2048, max_batch=8)


def test_mixed_lengths_in_input_order_same_as_alone(embedder):
    together = embedder.embed(TEXTS)
    alone = np.concatenate([embedder.embed([text]) for text in TEXTS])
    assert together.shape == (len(TEXTS), embedder.runner.hidden_size) and together.dtype == np.float32
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_pools_as_the_server_does_by_default(embedder, export_dir):
    assert embedder.backend.pooling == Pooling(DEFAULT_POOLING)
    mean = Embedder(export_dir, pooling=Pooling("mean"), threads=1)
    ids = [t.ids for t in embedder.tokenizer.encode(TEXTS[:4], truncate=False)]
    from attnserve.service.batching import pad
    np.testing.assert_allclose(mean.embed(TEXTS[:4]), np.concatenate([mean.runner.embed(*pad([x])) for x in ids]), atol=1e-5)
    # The 600-word text is past the opening, where opening pooling and the mean differ.
    assert np.abs(embedder.embed([TEXTS[3]]) - mean.embed([TEXTS[3]])).max() > 1e-3


def test_too_long_raises_unless_truncated(embedder):
    long = "long " * 1500
    with pytest.raises(InputTooLong, match="truncate"):
        embedder.embed([long])
    np.testing.assert_allclose(embedder.embed([long], truncate=True), embedder.embed(["long " * 1500], truncate=True))
    assert embedder.embed([], truncate=True).shape == (0, embedder.runner.hidden_size)
