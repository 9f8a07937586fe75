"""Attention maps for people: top-k sparsification, pooling to a small grid, an annotated PNG
heatmap.

numpy, and Pillow for the PNG, so the serving image needs neither matplotlib nor torch.
"""
from __future__ import annotations

import io

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


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)  # Pillow's own font: nothing to install or find


def _label(token: str, limit: int = 12) -> str:
    return token if len(token) <= limit else token[: limit - 1] + "…"


def _ticks(count: int, cell: int, start: int, pixels: float, every_px: int = 64) -> list[tuple[int, int]]:
    """(cell index, first token index) at about every `every_px` pixels along an axis."""
    step = max(1, int(np.ceil(every_px / pixels)))
    return [(i, start + i * cell) for i in range(0, count, step)]


def render_attention(grid: np.ndarray, cell: int, tokens: list[str], queries: tuple[int, int], keys: tuple[int, int],
                     title: str, min_side: int = 512, decades: float = 4.0):
    """An attention map as a PIL image for people: the heatmap (log scale, `decades` below its
    largest weight) in whole pixels per cell, the most that fit min_side (or one a cell), query tokens
    down the left and key tokens along the top once a cell is tall enough for a label (token
    indices otherwise), a colour bar with its scale at the right, and `title` above. Its
    `info` holds the boxes (left, top, right, bottom) of the map and the colour bar."""
    from PIL import Image, ImageDraw

    rows, cols = grid.shape
    scale = max(1, min_side // max(1, rows, cols))
    font, small = _font(12), _font(11)
    exact = cell == 1 and scale >= 11
    if exact:
        left_labels = [(i, _label(tokens[queries[0] + i])) for i in range(rows)]
        top_labels = [(j, _label(tokens[keys[0] + j])) for j in range(cols)]
    else:
        left_labels = [(i, str(t)) for i, t in _ticks(rows, cell, queries[0], scale)]
        top_labels = [(j, str(t)) for j, t in _ticks(cols, cell, keys[0], scale)]
    width_of = lambda text: int(np.ceil(small.getlength(text)))  # noqa: E731
    left = 8 + max((width_of(t) for _, t in left_labels), default=0) + 6
    key_depth = max((width_of(t) for _, t in top_labels), default=0) if exact else 14
    top = 8 + 18 + 16 + key_depth + 6  # title, axis name, key labels
    map_w, map_h = cols * scale, rows * scale
    bar_x = left + map_w + 16
    bar_w = 16
    tick_labels = [f"{float(grid.max()) * 10.0 ** -d:.1e}" if grid.size and grid.max() > 0 else "0" for d in range(int(decades) + 1)]
    width = bar_x + bar_w + 6 + max(width_of(t) for t in tick_labels) + 10
    height = top + max(map_h, 120) + 24
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((8, 6), title, fill="black", font=font)
    draw.text((left, 8 + 18), "keys ->", fill="#666666", font=small)
    heat = Image.fromarray(colorize(grid, decades)).resize((map_w, map_h), Image.NEAREST)
    image.paste(heat, (left, top))
    for i, text in left_labels:
        y = top + (i + 0.5) * scale
        draw.text((left - 6, y), text, fill="black", font=small, anchor="rm")
    for j, text in top_labels:
        x = left + (j + 0.5) * scale
        if exact:
            # Written left to right on its own strip, then turned upright above its column.
            strip = Image.new("RGB", (width_of(text) + 2, 14), "white")
            ImageDraw.Draw(strip).text((0, 0), text, fill="black", font=small)
            strip = strip.rotate(90, expand=True)
            image.paste(strip, (int(x - strip.width / 2), top - 6 - strip.height))
        else:
            draw.text((x, top - 4), text, fill="black", font=small, anchor="mb")
    draw.text((6, top + map_h + 6), "queries (down)", fill="#666666", font=small)
    ramp = colorize(np.logspace(0.0, -decades, map_h)[:, None], decades)
    image.paste(Image.fromarray(ramp).resize((bar_w, map_h), Image.NEAREST), (bar_x, top))
    for d, text in enumerate(tick_labels):
        y = top + round(d / decades * (map_h - 1))
        draw.line([(bar_x + bar_w, y), (bar_x + bar_w + 4, y)], fill="black")
        draw.text((bar_x + bar_w + 6, y), text, fill="black", font=small, anchor="lm")
    draw.text((bar_x, top - 4), "weight (log)", fill="#666666", font=small, anchor="lb")
    image.info["map_box"] = (left, top, left + map_w, top + map_h)
    image.info["bar_box"] = (bar_x, top, bar_x + bar_w, top + map_h)
    return image


def attention_png(*args, **kwargs) -> bytes:
    """render_attention(...) encoded as PNG."""
    out = io.BytesIO()
    render_attention(*args, **kwargs).save(out, format="PNG", optimize=False)
    return out.getvalue()
