"""How the OpenAI-style routes write vectors: fewer dimensions (Matryoshka-style: the first k
values, renormalised), float or bits (binary: the signs packed eight to a byte, as int8 in
offset binary; ubinary: the same bytes as uint8, as Voyage's and Jina's APIs define them), as
JSON numbers or base64 of the little-endian bytes (float32, int8 or uint8)."""
from __future__ import annotations

import base64

import numpy as np

from attnserve.contract.pooling import l2_normalize

DTYPES = ("float", "binary", "ubinary")


def fewer_dimensions(vectors: np.ndarray, dimensions: int | None, normalize: bool = True) -> np.ndarray:
    """The first `dimensions` values of each row, renormalised unless `normalize` is False
    (None: as they are)."""
    if dimensions is None:
        return vectors
    return l2_normalize(vectors[..., :dimensions]) if normalize else vectors[..., :dimensions]


def as_dtype(vectors: np.ndarray, dtype: str) -> np.ndarray:
    """(n, d) float vectors as float32, or as packed sign bits ((n, ceil(d / 8)) int8 or uint8:
    bit 1 where a value is positive, the last byte padded with zeros)."""
    if dtype == "float":
        return vectors.astype("<f4", copy=False)
    bits = np.packbits(vectors > 0, axis=-1)
    return (bits.astype(np.int16) - 128).astype(np.int8) if dtype == "binary" else bits


def encode(vector: np.ndarray, encode_base64: bool):
    """One as_dtype row as JSON: a list of numbers, or base64 of its bytes."""
    return base64.b64encode(vector.tobytes()).decode() if encode_base64 else vector.tolist()
