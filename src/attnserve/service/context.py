"""Context heads at serving time: the small ONNX graphs of a context-head folder
(src/attnserve/contract/context_format.py), run with ONNX Runtime on the CPU, one document at a time.

`chunks(naive, late, doc)` gives a document's chunk vectors their context; `pool(hidden)` is the
learned pooling. A document of one chunk never reaches either: it keeps its naive vector and its
mean (what the pretrained model gives a short text), which `covers` decides.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from attnserve.contract.context_format import GRAPH_INPUTS, GRAPH_OUTPUTS, check_deployment, read_spec


class ContextHeads:
    def __init__(self, folder, variant: str, hidden_size: int):
        import onnxruntime as ort

        self.folder = Path(folder)
        self.spec = read_spec(self.folder)
        check_deployment(self.spec, self.folder, variant, hidden_size)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # graphs of a few hundred kFLOP: threads cost more than they give
        self._sessions = {kind: ort.InferenceSession(str(self.folder / head.graph), options, providers=["CPUExecutionProvider"])
                          for kind, head in self.spec.heads.items()}

    @property
    def kinds(self) -> list[str]:
        return list(self._sessions)

    @property
    def chunk_tokens(self) -> int:
        return self.spec.chunk_tokens

    def covers(self, tokens: int) -> bool:
        """Whether a text of this many tokens ([CLS] and [SEP] included) is longer than one of
        the chunks the heads were trained on, the texts they apply to."""
        return tokens > self.spec.chunk_tokens + 2

    def _run(self, kind: str, *arrays: np.ndarray) -> np.ndarray:
        feeds = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in zip(GRAPH_INPUTS[kind], arrays)}
        return self._sessions[kind].run([GRAPH_OUTPUTS[kind]], feeds)[0]

    def chunks(self, naive: np.ndarray, late: np.ndarray, doc: np.ndarray) -> np.ndarray:
        """(C, d) unit chunk vectors from naive (C, d) unit vectors, late (C, d) chunk means and
        the document's mean hidden state (d,); one chunk: the naive vector."""
        if len(naive) < 2:
            return naive
        return self._run("chunks", naive, late, doc)

    def pool(self, hidden: np.ndarray) -> np.ndarray:
        """(d,) unit vector of one document's last hidden states (n, d)."""
        return self._run("pooling", hidden)

    def describe(self) -> dict:
        """What /info shows."""
        return {"folder": str(self.folder), "variant": self.spec.variant, "chunk_tokens": self.spec.chunk_tokens,
                "heads": {kind: head.design for kind, head in self.spec.heads.items()}}

