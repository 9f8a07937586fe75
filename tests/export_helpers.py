"""Exports shared by the test_export_* files: each (variant, max_length, analysis) is exported
once per pytest process into a temporary directory (exporting costs 30-90 s on 2 cores)."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import numpy as np

# The one export the runtime, torch-free and parity tests share (with its analysis graph).
SHARED_VARIANT, SHARED_MAX_LENGTH = "longformer", 8200

_ROOT: Path | None = None
_CACHE: dict[tuple, tuple[Path, object]] = {}


def _root() -> Path:
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="attnserve-test-exports-"))
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


def get_export(variant: str, max_length: int, analysis: bool = False):
    """(export_dir, encoder): the export and the very PyTorch encoder it was made from."""
    import torch

    from attnserve.models import load_encoder
    from attnserve.models.export import export_encoder, length_multiple
    from attnserve.models.registry import make_config

    analysis = analysis or (variant, max_length) == (SHARED_VARIANT, SHARED_MAX_LENGTH)
    key = (variant, max_length, analysis)
    if key not in _CACHE:
        torch.set_num_threads(2)
        multiple = length_multiple(variant, make_config(variant, max_length))
        encoder = load_encoder(variant, -(-max_length // multiple) * multiple)
        out = _root() / f"{variant}-{max_length}-{int(analysis)}"
        # The tests compare ORT with PyTorch themselves; the export-time check is skipped.
        export_encoder(encoder, out, max_length=max_length, analysis=analysis, verify=False, log=lambda m: None)
        _CACHE[key] = (out, encoder)
    return _CACHE[key]


def padded_batch(lengths: list[int], seed: int = 0):
    """Random token ids ([CLS] first, [SEP] last) right-padded to the longest: (ids, mask) int64."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    mask = np.zeros((len(lengths), width), dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1000, 29000, n)
        ids[i, 0], ids[i, n - 1] = 101, 102
        mask[i, :n] = 1
    return ids, mask
