"""Retrieval scoring shared by `attnserve adapt` (its held-out score) and `attnserve bench quality`
(attnserve/bench/quality.py): needle passages cut from a text, ranks and mean reciprocal rank."""
from __future__ import annotations

import re

import numpy as np

NEEDLE_WORDS, NEEDLE_FROM = 30, 600


def first_sentence(text: str) -> tuple[str, str]:
    """(first sentence, the text without it); a sentence ends at . ! ? or a line break, and is
    cut at 40 words."""
    match = re.search(r"[.!?](\s|$)|\n", text)
    end = match.end() if match else len(text)
    words = text[:end].split()
    if len(words) > 40:
        end = len(" ".join(text.split()[:40]))
    sentence, rest = text[:end].strip(), text[end:].strip()
    return (sentence, rest) if rest else (sentence, text)


def passage(text: str, rng: np.random.Generator) -> str:
    """NEEDLE_WORDS consecutive words from past word NEEDLE_FROM (from the middle of shorter texts)."""
    words = text.split()
    lo = NEEDLE_FROM if len(words) >= NEEDLE_FROM + NEEDLE_WORDS else max(0, (len(words) - NEEDLE_WORDS) // 2)
    start = int(rng.integers(lo, max(lo, len(words) - NEEDLE_WORDS) + 1))
    return " ".join(words[start : start + NEEDLE_WORDS])


# --------------------------------------------------------------------------- scoring


def ranks(queries: np.ndarray, docs: np.ndarray, owner: np.ndarray | None = None) -> np.ndarray:
    """Rank of query i's document i among all (1 = first), both sides L2-normalised. With
    `owner` (one document index per row of docs, ascending), a document scores by its best row
    (MaxP)."""
    scores = queries @ docs.T
    if owner is not None:
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        scores = np.maximum.reduceat(scores, starts, axis=1)
    return (scores > scores.diagonal()[:, None]).sum(1) + 1


def mean_reciprocal_rank(queries, docs, owner=None) -> float:
    return float((1.0 / ranks(np.asarray(queries), np.asarray(docs), owner)).mean())


def scores(queries, needles, docs, owner=None) -> dict:
    s, n = ranks(queries, docs, owner), ranks(needles, docs, owner)
    return {"summary_mrr": float((1 / s).mean()), "summary_r1": float((s == 1).mean()),
            "needle_mrr": float((1 / n).mean()), "needle_r1": float((n == 1).mean())}
