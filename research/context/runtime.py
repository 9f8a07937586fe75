"""Context heads through ONNX Runtime: the small graphs of a context-head folder
(research/context/format.py says what one holds), run on the CPU one document at a
time, as `python -m research.context bench` times them beside naive and late chunks. test_context.py
checks them against the PyTorch heads (research.context.files.load_heads).

`chunks(naive, late, doc)` gives a document's chunk vectors their context; `pool(hidden)` is the
learned pooling. No deployment serves them: they lost to naive chunks (docs/results/context.md).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from research.context.format import GRAPH_INPUTS, GRAPH_OUTPUTS, check_export, read_spec


class ContextHeads:
    """The heads of `folder`, checked against the export they run beside (its variant and
    hidden size): ContextHeadError naming context.json otherwise."""

    def __init__(self, folder, variant: str, hidden_size: int):
        import onnxruntime as ort

        self.folder = Path(folder)
        self.spec = read_spec(self.folder)
        check_export(self.spec, self.folder, variant, hidden_size)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # graphs of a few hundred kFLOP: threads cost more than they give
        self._sessions = {kind: ort.InferenceSession(str(self.folder / head.graph), options, providers=["CPUExecutionProvider"])
                          for kind, head in self.spec.heads.items()}

    @property
    def kinds(self) -> list[str]:
        return list(self._sessions)

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
