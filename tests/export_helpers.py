"""The suite's one export cache, shared by every test, pytest-xdist worker and subprocess the
tests start, and kept between runs: ATTNSERVE_TEST_EXPORTS, by default
~/.cache/attnserve/test-exports. Each export sits in the folder named after its recipe
(attnserve.export.exporter.cached_export: variant, resolved parameters, max_length, weights, the
models package's code, converters' versions), so a change to the model code exports anew and
`attnserve serve --models-dir EXPORTS_ROOT` serves a cached export as it is. A lock per recipe
makes concurrent workers wait for one export instead of each making it (30-90 s on 2 cores).
Tests of exporting itself still export, into their own folders."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

# The one export the runtime, torch-free, late-chunking, memory and browser tests share (with
# its analysis graph), at a length that is a multiple of none of the block sizes.
SHARED_VARIANT, SHARED_MAX_LENGTH = "longformer", 8200
# The export the HTTP server tests serve (conftest's export_dir), short so each request is quick.
HTTP_VARIANT, HTTP_MAX_LENGTH = "longformer", 1024

EXPORTS_ROOT = Path(os.environ.get("ATTNSERVE_TEST_EXPORTS") or Path.home() / ".cache" / "attnserve" / "test-exports")
UNUSED_DAYS = 14  # exports of code no run has used for this long are removed

_ENCODERS: dict[tuple, object] = {}


def export_path(variant: str, max_length: int, *, analysis: bool = True, params: dict | None = None,
                model: Path | None = None) -> Path:
    """The cached export (made now if missing) of `variant` at `max_length` over `model` (a
    folder; None: the bundled MiniLM); the tests compare ONNX Runtime with PyTorch themselves,
    so the export-time check is skipped."""
    import torch

    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe

    torch.set_num_threads(2)
    recipe = Recipe.resolve(variant, params, max_length, model=model, analysis=analysis)
    return cached_export(EXPORTS_ROOT, recipe, verify=False, log=lambda message: None)


def get_export(variant: str, max_length: int, analysis: bool = False, model: Path | None = None, **params):
    """(export_dir, encoder): the cached export and a PyTorch encoder of the same recipe (loads
    are deterministic: tests/test_encoder.py::test_two_loads_are_identical)."""
    from attnserve.export.recipe import Recipe

    analysis = analysis or (variant, max_length, model) == (SHARED_VARIANT, SHARED_MAX_LENGTH, None)
    export_dir = export_path(variant, max_length, analysis=analysis, params=params, model=model)
    key = (variant, max_length, model, tuple(sorted(params.items())))
    if key not in _ENCODERS:
        _ENCODERS[key] = Recipe.resolve(variant, params, max_length, model=model).encoder()
    return export_dir, _ENCODERS[key]


def prune_unused(now: float | None = None) -> None:
    """Remove the exports (and scratch folders of exports killed midway) that no run has used
    for UNUSED_DAYS: cached_export touches each export it hands out."""
    if not EXPORTS_ROOT.is_dir():
        return
    cutoff = (now or time.time()) - UNUSED_DAYS * 86400
    for entry in EXPORTS_ROOT.iterdir():
        if entry.is_dir() and entry.stat().st_mtime < cutoff:
            shutil.rmtree(entry, ignore_errors=True)


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
