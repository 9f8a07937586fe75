"""Building blocks shared by the block-sparse variants.

The pattern: cut the (padded) sequence into query blocks, gather for each block a context of
S keys, and run softmax attention of the block over its context under a boolean mask. Peak
memory is O(N * S), never N x N. The fused kernel (scaled_dot_product_attention) runs the
common path; the explicit path runs only when the weights are asked for.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnserve.models.attention.base import MASKED, SlotWeights, masked_softmax, pad_to_multiple


def context_attention(q, k_ctx, v_ctx, allowed, scale, need_weights=False):
    """Attention of query blocks over their own gathered context.

    q: (B, H, nb, bs, D); k_ctx, v_ctx: (B, H, nb, S, D); allowed: (B, H|1, nb, bs|1, S) bool
    (1 where every query of a block sees the same keys: the mask is then never copied).
    Returns out (B, H, nb, bs, D) and, if need_weights, probs (B, H, nb, bs, S).
    """
    if need_weights:
        scores = torch.einsum("bhnqd,bhnkd->bhnqk", q, k_ctx) * scale
        probs = masked_softmax(scores, allowed)
        return torch.einsum("bhnqk,bhnkd->bhnqd", probs, v_ctx), probs
    batch, heads, nb, bs, dim = q.shape
    ctx = k_ctx.shape[3]
    bias = torch.where(allowed, 0.0, MASKED).to(q.dtype)
    rows = allowed.shape[3]  # bs, or 1 where every query of a block sees the same keys
    if torch.compiler.is_exporting() and (rows == 1 or dim * (bs + 2 * ctx) < bs * ctx):
        # ONNX has no stride-0 views: the mask expanded over the heads below is a copy as large
        # as the kernel's scores (0.5 GB a layer for MiniLM longformer at 16,384 tokens). With
        # the blocks folded into the kernel's batch and the heads kept as its heads, the kernel
        # broadcasts one (B * nb, 1, bs|1, S) mask instead, for a transpose of the queries and
        # both contexts: cheaper where a head is narrow against the block (MiniLM's 32 against
        # 128), dearer where it is wide (ModernBERT's local layers: 64 against 32). A mask the
        # same for every query of a block (bigbird's) always folds so: it becomes a key bias of
        # the unmasked kernel (onnx_friendly_attention), which stores no scores, and that
        # kernel's heads must be the model's, a fixed number, not the blocks.
        def fold(x):
            return x.transpose(1, 2).reshape(batch * nb, x.shape[1], x.shape[3], x.shape[4])

        out = F.scaled_dot_product_attention(fold(q), fold(k_ctx), fold(v_ctx), attn_mask=fold(bias), scale=scale)
        return out.view(batch, nb, heads, bs, dim).transpose(1, 2), None
    # Heads and batch fold into the kernel's batch, blocks into its head dim; a mask shared
    # by all heads is expanded as a stride-0 view (no copy when batch is 1).
    bias = bias.expand(batch, heads, nb, bs, ctx).reshape(batch * heads, nb, bs, ctx)
    out = F.scaled_dot_product_attention(
        q.reshape(batch * heads, nb, bs, dim), k_ctx.reshape(batch * heads, nb, ctx, dim),
        v_ctx.reshape(batch * heads, nb, ctx, dim), attn_mask=bias, scale=scale,
    )
    return out.view(batch, heads, nb, bs, dim), None


def neighbour_blocks(x: torch.Tensor, reach: int, fill=0, extra: torch.Tensor | None = None) -> torch.Tensor:
    """x: (B, H, nb, bs, *rest) with blocks on dim 2. Returns (B, H, nb, (2*reach+1)*bs, *rest):
    for block b, blocks b-reach .. b+reach side by side (`fill` past either end), followed
    by `extra` (B, H, nb, E, *rest) when given (one copy instead of two)."""
    nb, bs = x.shape[2], x.shape[3]
    pad = [0, 0] * (x.dim() - 3) + [reach, reach]
    padded = F.pad(x, pad, value=fill)
    if extra is None:
        # Overlapping windows as a strided view: no copy of the keys.
        windows = padded.flatten(2, 3).unfold(2, (2 * reach + 1) * bs, bs)  # (B, H, nb, *rest, W)
        return windows.movedim(-1, 3)
    parts = [padded[:, :, i : i + nb] for i in range(2 * reach + 1)]
    return torch.cat(parts + [extra], dim=3)


def band_block(half: int, copied_context: bool = False) -> int:
    """Query block for a band of half-width `half`. Each block reads block + 2 * half keys or a
    little more, so smaller blocks waste fewer masked keys and larger ones cost fewer kernel
    calls. A context that is a view of the keys favours half / 4; one copied per block (global
    keys appended) favours half / 2: there each copy costs as much as the keys it holds, so
    fewer, larger copies win over wasting fewer masked keys (`attnserve bench encoder` shows
    both choices). An exported graph always copies: ONNX has no strided views, so the view
    becomes a Gather of every block's context (9 copies of the keys and of the values at
    half / 4, 0.4 GB a layer for ModernBERT-base at 8,192 tokens; 5 at half / 2)."""
    copied_context = copied_context or torch.compiler.is_exporting()
    return max(16, half // 2 if copied_context else half // 4)


def dense_rows_attention(q_rows, k, v, key_valid, scale, need_weights=False):
    """Some query rows (B, H, R, D) over all N keys: what global tokens do."""
    allowed = key_valid[:, None, None, :]
    if need_weights:
        scores = torch.einsum("bhrd,bhnd->bhrn", q_rows, k) * scale
        probs = masked_softmax(scores, allowed)
        return probs @ v, probs
    return F.scaled_dot_product_attention(q_rows, k, v, attn_mask=allowed, scale=scale), None


def take_rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """x: (B, H, N, D); order: (B, H, M) row indices per batch and head -> (B, H, M, D).
    One index_select over the flattened rows: it copies whole rows, where gather with an index
    expanded over D reads one index per element (an order of magnitude slower on CPU), and it
    exports as a Gather rather than a GatherElements node in ONNX."""
    b, h, n, d = x.shape
    offset = (torch.arange(b * h, device=x.device) * n).view(b, h, 1)
    return x.reshape(b * h * n, d).index_select(0, (order + offset).flatten()).view(b, h, order.shape[2], d)


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x: (B, H, N, D); rows: (B, R) token indices -> (B, H, R, D). For a few rows shared by
    all heads (global tokens): unlike take_rows it never copies a non-contiguous x whole."""
    index = rows[:, None, :, None].expand(x.shape[0], x.shape[1], rows.shape[1], x.shape[3])
    return x.gather(2, index)


def replace_rows(out, rows, new_rows, keep_old):
    """Write new_rows (B, H, R, D) at token rows (B, R) of out, except where keep_old (B, R)."""
    old = gather_rows(out, rows)
    new_rows = torch.where(keep_old[:, None, :, None], old, new_rows)
    index = rows[:, None, :, None].expand_as(new_rows)
    return out.scatter(2, index, new_rows)


def banded_attention(q, k, v, key_valid, half, block, scale, global_rows=None, need_weights=False):
    """Sliding-window attention (|i - j| <= half) plus optional global tokens.

    global_rows: None or ((B, G) token indices, (B, G) bool valid). A global token attends to
    every token and every token attends to it (its key is left out of the band so no query
    counts it twice). block: query block size, None for band_block's choice (global keys are
    appended by copying each block's context). Returns out (B, H, N, D) and a list of
    SlotWeights or None.
    """
    if block is None:
        block = band_block(half, copied_context=global_rows is not None)
    batch, heads, n, dim = q.shape
    reach = -(-half // block)
    qb, kb, vb = (pad_to_multiple(x, block, dim=2) for x in (q, k, v))
    padded = qb.shape[2]
    nb = padded // block
    valid = pad_to_multiple(key_valid, block, dim=1, value=False)
    is_global = torch.zeros_like(valid)
    if global_rows is not None:
        g_idx, g_valid = global_rows
        is_global = is_global.scatter(1, g_idx, g_valid)
    # Slot s of block b holds token (b - reach) * block + s, so the band is the same (bs, S)
    # pattern in every block; blocks past either end are masked through ctx_valid.
    slots = torch.arange((2 * reach + 1) * block, device=q.device)
    band = (torch.arange(block, device=q.device)[:, None] + reach * block - slots[None]).abs() <= half
    ctx_valid = neighbour_blocks((valid & ~is_global).view(batch, 1, nb, block), reach, fill=False)
    allowed = band[None, None] & ctx_valid[:, :, :, None, :]  # (B, 1, nb, bs, S)
    def context(x, x_blocks):  # the band's key blocks, then the global keys
        extra = None if global_rows is None else gather_rows(x, g_idx)[:, :, None].expand(-1, -1, nb, -1, -1)
        return neighbour_blocks(x_blocks.view(batch, heads, nb, block, dim), reach, extra=extra)

    k_ctx, v_ctx = context(k, kb), context(v, vb)
    if global_rows is not None:
        g = g_idx.shape[1]
        g_allowed = g_valid[:, None, None, None, :].expand(batch, 1, nb, block, g)
        allowed = torch.cat([allowed, g_allowed], dim=4)
    out, probs = context_attention(qb.view(batch, heads, nb, block, dim), k_ctx, v_ctx, allowed, scale, need_weights)
    out = out.reshape(batch, heads, padded, dim)[:, :, :n]
    weights = None
    if need_weights:
        first = (torch.arange(nb, device=q.device) - reach) * block
        cols = (first[:, None, None] + slots).expand(nb, block, -1)
        if global_rows is not None:
            cols = torch.cat([cols[None].expand(batch, -1, -1, -1), g_idx[:, None, None, :].expand(-1, nb, block, -1)], dim=3)
            cols = cols.reshape(batch, 1, padded, -1)
        else:
            cols = cols.reshape(1, 1, padded, -1)
        not_global_row = (~is_global)[:, None, :, None]
        weights = [SlotWeights(torch.arange(padded, device=q.device), cols, probs.reshape(batch, heads, padded, -1) * not_global_row)]
    if global_rows is not None:
        g_out, g_probs = dense_rows_attention(gather_rows(q, g_idx), k, v, key_valid, scale, need_weights)
        out = replace_rows(out, g_idx, g_out, ~g_valid)
        if need_weights:
            cols = torch.arange(n, device=q.device).view(1, 1, 1, n)
            weights.append(SlotWeights(g_idx[:, None, :], cols, g_probs * g_valid[:, None, :, None]))
    return out, weights


def band_exact_up_to(half: int, global_tokens: tuple[int, ...], max_length: int) -> int:
    """Up to how many tokens banded_attention is full attention (see Attention.exact_up_to).
    Global tokens see and are seen by every token; two other tokens see each other when at
    most `half` apart. So the first n tokens are exact while the non-global ones among them
    span at most `half` positions, and the first non-global token past that span ends it."""
    globals_ = set(global_tokens)
    others = (i for i in range(max_length) if i not in globals_)
    first = next(others, None)
    end = next((i for i in others if i - first > half), max_length) if first is not None else max_length
    return end if end >= 2 else 0


def banded_mask(key_valid, half, global_rows=None):
    """Dense (B, 1, N, N) reference of banded_attention's pattern, for tests."""
    n = key_valid.shape[1]
    pos = torch.arange(n, device=key_valid.device)
    allowed = ((pos[:, None] - pos[None, :]).abs() <= half)[None].expand(key_valid.shape[0], n, n)
    if global_rows is not None:
        g_idx, g_valid = global_rows
        is_global = torch.zeros_like(key_valid).scatter(1, g_idx, g_valid)
        allowed = allowed | is_global[:, :, None] | is_global[:, None, :]
    return (allowed & key_valid[:, None, :])[:, None]


def global_positions(positions: tuple[int, ...], key_valid: torch.Tensor):
    """(B, G) indices and validity of chosen global token positions; positions past a
    document's end are invalid (and clamped so that gathers stay in range)."""
    n = key_valid.shape[1]
    idx = torch.tensor(positions, device=key_valid.device, dtype=torch.long)[None].expand(key_valid.shape[0], -1)
    in_range = idx < n
    idx = idx.clamp(max=n - 1)
    return idx, in_range & key_valid.gather(1, idx)
