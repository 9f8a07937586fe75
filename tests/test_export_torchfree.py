"""Serving without torch: a process in which `import torch` fails loads an export into the
in-process Embedder, tokenizes with the export's tokenizer.json and embeds texts of mixed
lengths (batched by length, answered in input order), matching PyTorch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from export_helpers import SHARED_MAX_LENGTH, SHARED_VARIANT, get_export

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib.abc, json, sys

class NoTorch(importlib.abc.MetaPathFinder):
    # Any import of torch (or of models/, which needs it) fails, as in a serving image
    # without PyTorch.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch" or name.startswith("attnserve.models"):
            raise ImportError(f"{name} is blocked in this process")
        return None

sys.meta_path.insert(0, NoTorch())
try:
    import torch  # noqa: F401
    raise SystemExit("torch imported although blocked")
except ImportError:
    pass

from attnserve.service.embedder import Embedder

export_dir, texts = sys.argv[1], json.loads(sys.argv[2])
embedder = Embedder(export_dir, threads=1)  # the deployment's default pooling, encoder.embed's too
vectors = embedder.embed(texts, truncate=True)
assert not any(m.split(".")[0] == "torch" or m.startswith("attnserve.models") for m in sys.modules), "torch got imported"
print(json.dumps({"provider": embedder.runner.provider, "embeddings": vectors.tolist()}))
"""


def test_embed_without_torch_matches_pytorch():
    export_dir, encoder = get_export(SHARED_VARIANT, SHARED_MAX_LENGTH, analysis=True)
    texts = ["A process without PyTorch still embeds text.", "Long documents: " + "tokens and more tokens " * 150,
             "A third, short one.", "Mid-length: " + "words " * 60]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", CHILD, str(export_dir), json.dumps(texts)], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    got = np.array(out["embeddings"], dtype=np.float32)
    expected = encoder.embed(texts).numpy()
    assert got.shape == (4, 384)
    assert np.abs(got - expected).max() <= 1e-4
