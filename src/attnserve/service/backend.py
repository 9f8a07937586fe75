"""What the serving layers need from a runtime (`Runner`), and the backend that turns its token
vectors into the answers routes send (`Backend`: a runner and the deployment's pooling).

The batcher groups and pads requests and hands each batch to the backend; the backend runs it
and pools, so the batcher knows nothing of pooling modes and the runner nothing of requests.
`attnserve.service.runtime.OnnxRunner` is the runner in production; the HTTP tests' fakes
implement the same Protocol with numpy alone.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from attnserve.service.attention_maps import MapCost
from attnserve.contract.pooling import Pooling, default_opening_tokens, default_pooling


@runtime_checkable
class Runner(Protocol):
    """One loaded export. Every call takes right-padded (B, N) int64 input_ids and
    attention_mask and refuses what the export cannot run; the serving layers check inputs
    against these attributes before anything reaches it."""

    variant: str
    precision: str  # of the export: float32, int8 or float16
    provider: str  # the execution provider that actually runs
    manifest: dict  # the export's manifest.json, as JSON
    max_length: int  # longest input the export runs, [CLS] and [SEP] included
    max_batch: int  # most inputs in one call
    length_multiple: int  # the sequence granule the main graphs run at
    attention_max_length: int  # longest input an attention map may have (0: no maps)
    collapse_max_length: int  # longest input the rank collapse paths may have (0: none)
    collapse_paths: list  # of str: the paths the export computes (model, attention_only, ...)

    def padded_length(self, n: int) -> int:
        """The sequence length a batch whose longest input has n tokens runs at."""

    def embed(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, hidden) float32: the graph's sentence_embedding, pooled as the model pools and
        L2-normalised where it has a Normalize module (manifest.json's model)."""

    def hidden_states(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, N, hidden) float32: every token's last hidden state."""

    def attention(self, input_ids: np.ndarray, attention_mask: np.ndarray, layer: int, head: int | None):
        """(rows, cols, values): one layer's attention over the first input's real tokens."""

    def rank_collapse(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> list[float]:
        """One ratio per layer for the first input."""

    def collapse(self, input_ids: np.ndarray, attention_mask: np.ndarray, paths: list[str]) -> dict[str, list[float]]:
        """{path: the embeddings' ratio, then one per layer along the path} for the first input."""

    def attention_cost(self, n: int, head: int | None = None) -> MapCost:
        """Upper bounds of what a one-layer map of an n-token text holds, before it runs."""


class Backend:
    """A runner and the deployment's pooling: token ids in, pooled vectors, reduced token
    vectors or attention maps out. Called in the batcher's inference thread. `pooling`: what
    the deployment pools by (None: the export's default, contract.pooling.default_pooling)."""

    def __init__(self, runner: Runner, pooling: Pooling | None = None):
        self.runner = runner
        manifest = getattr(runner, "manifest", None)
        self.pooling = pooling or Pooling(default_pooling(manifest), opening_tokens=default_opening_tokens(manifest))
        # How the graph's own sentence_embedding is pooled: the model's pooling (manifest.json's
        # model; older exports: the bundled model's mean, normalised).
        model = (getattr(runner, "manifest", None) or {}).get("model") or {}
        self.graph_pooling, self.graph_normalizes = model.get("pooling", "mean"), bool(model.get("normalize", True))

    def embed(self, ids: np.ndarray, mask: np.ndarray, normalize: bool = True, query: bool = False) -> np.ndarray:
        """(B, hidden) float32, each input pooled as the deployment's pooling says (queries:
        its pooling for queries). Where every input's pooling comes to the model's own (opening
        is the mean for a text within its opening), normalised, the graph's own output is it and
        no token vectors are needed (Encoder.embed takes the same rule)."""
        pooling = self.pooling.for_queries if query else self.pooling
        lengths = mask.sum(1)
        if normalize and self.graph_normalizes and all(pooling.applied_mode(int(n)) == self.graph_pooling for n in lengths):
            return self.runner.embed(ids, mask).astype(np.float32, copy=False)
        return np.stack(self.reduce(ids, mask, [lambda hidden: pooling(hidden, normalize=normalize)] * len(ids)))

    def reduce(self, ids: np.ndarray, mask: np.ndarray, reducers: list[Callable[[np.ndarray], Any]]) -> list:
        """reducers[i](input i's last hidden states, padding removed: (n_i, hidden))."""
        hidden = self.runner.hidden_states(ids, mask)
        lengths = mask.sum(1)
        return [reduce(hidden[row, : int(lengths[row])]) for row, reduce in enumerate(reducers)]

    def attention(self, ids: np.ndarray, mask: np.ndarray, layer: int, head: int | None):
        """((rows, cols, values), rank-collapse ratio per layer) of the first input."""
        coo = self.runner.attention(ids, mask, layer, head)
        return coo, [float(r) for r in self.runner.rank_collapse(ids, mask)]

    def collapse(self, ids: np.ndarray, mask: np.ndarray, paths: list[str]) -> dict[str, list[float]]:
        """The first input's rank-collapse ratios along each of `paths` (Runner.collapse)."""
        return self.runner.collapse(ids, mask, paths)
