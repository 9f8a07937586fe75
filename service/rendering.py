"""Attention maps for people: top-k sparsification, pooling to a small grid, a PNG heatmap.

Pure numpy (and zlib for the PNG), so the serving image needs neither matplotlib nor torch.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np


def top_k_per_row(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, k: int):
    """Keep the k largest values of each row (query); ties broken by column."""
    if len(values) == 0:
        return rows, cols, values
    order = np.lexsort((cols, -values, rows))  # by row, then value descending
    rows, cols, values = rows[order], cols[order], values[order]
    starts = np.r_[0, np.flatnonzero(np.diff(rows)) + 1]
    rank = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
    keep = rank < k
    rows, cols, values = rows[keep], cols[keep], values[keep]
    order = np.lexsort((cols, rows))
    return rows[order], cols[order], values[order]


def pool_grid(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n: int, max_cells: int,
              queries: tuple[int, int] | None = None, keys: tuple[int, int] | None = None) -> tuple[np.ndarray, int]:
    """The (n, n) map, or its window of queries [q0, q1) x keys [k0, k1), pooled to at most
    max_cells per side in square cells: cell (i, j) holds the attention the queries of row-cell
    i pay, on average, to all keys of column-cell j, so each grid row of a full-width window
    still sums to about 1. Entries outside the window are ignored. Returns (grid, tokens per
    cell side)."""
    q0, q1 = queries or (0, n)
    k0, k1 = keys or (0, n)
    inside = (rows >= q0) & (rows < q1) & (cols >= k0) & (cols < k1)
    rows, cols, values = rows[inside] - q0, cols[inside] - k0, values[inside]
    cell = max(1, -(-max(q1 - q0, k1 - k0) // max_cells))
    gq, gk = -(-(q1 - q0) // cell), -(-(k1 - k0) // cell)
    grid = np.bincount((rows // cell) * gk + cols // cell, weights=values.astype(np.float64), minlength=gq * gk).reshape(gq, gk)
    queries_per_cell = np.bincount(np.arange(q1 - q0) // cell, minlength=gq).astype(np.float64)
    return (grid / queries_per_cell[:, None]).astype(np.float32), cell


# A few stops of viridis; values in between are interpolated.
_VIRIDIS = np.array(
    [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
     [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]],
    dtype=np.float64,
)


def colorize(grid: np.ndarray, decades: float = 4.0) -> np.ndarray:
    """(H, W) non-negative weights -> (H, W, 3) uint8, on a log scale spanning `decades`
    below the largest weight (attention weights span orders of magnitude)."""
    top = float(grid.max()) if grid.size else 0.0
    if top <= 0:
        scaled = np.zeros_like(grid, dtype=np.float64)
    else:
        floor = top * 10.0 ** (-decades)
        scaled = (np.log10(np.maximum(grid, floor)) - np.log10(floor)) / decades
    pos = np.clip(scaled, 0, 1) * (len(_VIRIDIS) - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, len(_VIRIDIS) - 1)
    frac = (pos - lo)[..., None]
    return np.round(_VIRIDIS[lo] * (1 - frac) + _VIRIDIS[hi] * frac).astype(np.uint8)


def png_bytes(rgb: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 image as PNG (8-bit truecolour, no filtering)."""
    height, width, _ = rgb.shape
    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), rgb.reshape(height, width * 3)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def heatmap_png(grid: np.ndarray, min_side: int = 256) -> bytes:
    """A heatmap of `grid`, each cell scaled up to whole pixels so the image is at least
    min_side pixels wide."""
    scale = max(1, min_side // max(1, grid.shape[0]))
    rgb = colorize(grid)
    if scale > 1:
        rgb = rgb.repeat(scale, axis=0).repeat(scale, axis=1)
    return png_bytes(rgb)
