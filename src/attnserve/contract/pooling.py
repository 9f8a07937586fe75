"""From token vectors to document and chunk vectors: pooling modes and late chunking.

numpy only (no torch), so the service and the PyTorch API (`attnserve.models.api.Encoder`) pool with the
same code. Every function takes one document's last hidden states `hidden` (n, d), [CLS] at 0
and [SEP] at n - 1, padding already removed.

Late chunking (Günther et al. 2024): the document runs through the encoder once, then each
chunk's vector is the mean of its tokens' hidden states, so every chunk vector has seen the
whole document. Chunks are runs of document tokens (`chunk_tokens` each, consecutive chunks
sharing `overlap_tokens`) or the caller's own character spans; [CLS] belongs to the chunk that
holds the first document token and [SEP] to the one that holds the last, so a document that fits
in one chunk gets exactly its mean-pooled vector.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence, get_args

import numpy as np

POOLING_MODES = ("mean", "cls", "lasttoken", "opening")
DEFAULT_POOLING = "opening"  # what a deployment pools by unless told otherwise (serve's --pooling)
# The opening of a model whose folder says no trained length (sentence_bert_config.json's
# max_seq_length): all-MiniLM-L6-v2's 256.
OPENING_TOKENS = 256


def default_pooling(manifest: dict | None) -> str:
    """What a deployment of an export pools by unless told otherwise: the model's own pooling
    (manifest.json's model) where it is cls or lasttoken, since opening mixes means, which only
    a mean-pooled model was trained for; DEFAULT_POOLING otherwise."""
    return pooling_for(((manifest or {}).get("model") or {}).get("pooling"))


def default_opening_tokens(manifest: dict | None) -> int:
    """The opening of a deployment of an export unless told otherwise: the length the model was
    trained at (its max_seq_length, manifest.json's model), so that opening pooling changes no
    vector of a text the model was trained to read whole; OPENING_TOKENS where it says none."""
    return opening_tokens_for(((manifest or {}).get("model") or {}).get("max_seq_length"))


def opening_tokens_for(max_seq_length: int | None) -> int:
    """The default opening of a model trained at max_seq_length tokens: the same for a
    deployment (default_opening_tokens) and for the Python API (Encoder.default_pooling)."""
    return max_seq_length or OPENING_TOKENS


def pooling_for(model_pooling: str | None) -> str:
    """The default pooling of a model pooled by `model_pooling` (its 1_Pooling mode): the
    same for a deployment (default_pooling) and for the Python API (Encoder.embed)."""
    return model_pooling if model_pooling in ("cls", "lasttoken") else DEFAULT_POOLING


@dataclass(frozen=True)
class Pooling:
    """How a deployment turns token vectors into one vector.

    mean: mean of every token (what all-MiniLM-L6-v2 was trained with); cls: the first token's
    vector ([CLS] or <s>); lasttoken: the last token's ([SEP] or </s>); opening: opening_weight x the mean of the document's first late chunk (its first
    opening_tokens document tokens, [CLS] with them) + (1 - opening_weight) x the mean of all,
    each L2-normalised first. A document's opening often says what it is about, the rest holds
    its details; a document that fits in one such chunk gets its mean vector.
    """

    mode: str
    opening_weight: float = 0.35
    opening_tokens: int = OPENING_TOKENS

    def __post_init__(self):
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)} (got {self.mode!r})")
        if not 0.0 <= self.opening_weight <= 1.0:
            raise ValueError(f"opening_weight must be in 0..1 (got {self.opening_weight})")
        if self.opening_tokens < 1:
            raise ValueError(f"opening_tokens must be >= 1 (got {self.opening_tokens})")

    @property
    def for_queries(self) -> "Pooling":
        """The pooling a query gets (input_type query): what a short text gets under this mode,
        whatever the query's length: the [CLS] vector for cls, the mean of every token otherwise."""
        return self if self.mode in ("mean", "cls", "lasttoken") else Pooling("mean")

    def applied_mode(self, tokens: int) -> str:
        """The mode a text of this many tokens ([CLS] and [SEP] included) is pooled by: opening
        is the mean for a text that fits in its opening."""
        return "mean" if self.mode == "opening" and tokens <= self.opening_tokens + 2 else self.mode

    def __call__(self, hidden: np.ndarray, normalize: bool = True) -> np.ndarray:
        """(d,) vector of one document."""
        mode = self.applied_mode(len(hidden))
        if mode == "cls":
            vector = hidden[0]
        elif mode == "lasttoken":
            vector = hidden[-1]
        elif mode == "opening":
            # The opening is the first chunk of token_chunks(..., opening_tokens): [CLS] and the
            # first opening_tokens document tokens. A shorter document is all opening: its mean.
            head = l2_normalize(hidden[: self.opening_tokens + 1].mean(0))
            vector = self.opening_weight * head + (1.0 - self.opening_weight) * l2_normalize(hidden.mean(0))
        else:
            vector = hidden.mean(0)
        vector = vector.astype(np.float32, copy=False)
        return l2_normalize(vector) if normalize else vector


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Unit length along the last axis (zero vectors stay zero)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


@dataclass(frozen=True)
class ChunkBounds:
    """One chunk of a tokenized document: tokens [first, stop) of its id list (special tokens
    included where they belong) and characters [start, end) of its text."""

    first: int
    stop: int
    start: int
    end: int


class BadSpans(ValueError):
    """Spans that cannot be chunk boundaries; the message says which and why, `index` is the
    first bad span's."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


def check_spans(spans: Sequence[Sequence[int]], text_length: int) -> list[tuple[int, int]]:
    """Spans as (start, end) pairs: each 0 <= start < end <= text_length, in order, none
    overlapping the one before. Raises BadSpans naming the first bad one."""
    out: list[tuple[int, int]] = []
    for index, span in enumerate(spans):
        if len(span) != 2:
            raise BadSpans(f"span {index} has {len(span)} numbers; send [start_char, end_char]")
        start, end = int(span[0]), int(span[1])
        if not 0 <= start < end <= text_length:
            raise BadSpans(f"span {index} [{start}, {end}) is empty or outside the text's {text_length} characters; "
                           "send 0 <= start < end <= len(text)")
        if out and start < out[-1][1]:
            raise BadSpans(f"span {index} [{start}, {end}) overlaps or precedes span {index - 1} {list(out[-1])}; "
                           "send spans in order, without overlap")
        out.append((start, end))
    if not out:
        raise BadSpans("spans is empty; send at least one [start_char, end_char] or null")
    return out


def token_chunks(offsets: Sequence[tuple[int, int]], text_length: int, chunk_tokens: int, overlap_tokens: int = 0,
                 truncated: bool = False) -> list[ChunkBounds]:
    """Fixed-size chunks of a document tokenized with [CLS] ... [SEP] (offsets per token, the
    specials' ignored): runs of chunk_tokens document tokens starting every chunk_tokens -
    overlap_tokens tokens. Character ranges cover the text in order, from 0 to its end (to the
    last kept token's end when the document was truncated): without overlap each chunk ends
    where the next one starts."""
    n = len(offsets)
    ranges = token_ranges(n, chunk_tokens, overlap_tokens)
    text_end = offsets[n - 2][1] if truncated and n > 2 else text_length
    chunks = []
    for i, (first, stop) in enumerate(ranges):
        start = 0 if i == 0 else offsets[first][0]
        if i == len(ranges) - 1:
            end = text_end
        elif overlap_tokens == 0:
            end = offsets[ranges[i + 1][0]][0]
        else:
            end = offsets[stop - 1][1]
        chunks.append(ChunkBounds(first, stop, start, end))
    return chunks


def token_ranges(tokens: int, chunk_tokens: int, overlap_tokens: int = 0) -> list[tuple[int, int]]:
    """[first, stop) token ranges of the fixed-size chunks of a text of `tokens` tokens, [CLS]
    and [SEP] included: runs of chunk_tokens document tokens starting every chunk_tokens -
    overlap_tokens tokens, [CLS] in the first and [SEP] in the last. The one definition of chunk
    bounds: serving (token_chunks) and training (train.adapt.late_chunks) both cut here."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 (got {chunk_tokens})")
    if not 0 <= overlap_tokens < chunk_tokens:
        raise ValueError(f"overlap_tokens must be in 0..chunk_tokens - 1 = {chunk_tokens - 1} (got {overlap_tokens})")
    content = tokens - 2  # document tokens between [CLS] and [SEP]
    if content <= 0:
        return [(0, tokens)]
    starts = range(0, max(content - overlap_tokens, 1), chunk_tokens - overlap_tokens)
    ranges = [(1 + s, 1 + min(s + chunk_tokens, content)) for s in starts]
    ranges[0] = (0, ranges[0][1])
    ranges[-1] = (ranges[-1][0], tokens)
    return ranges


def span_chunks(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]], truncated: bool = False) -> list[ChunkBounds]:
    """Chunks at the caller's character spans (checked by check_spans): a document token
    belongs to the span its first character falls in. Raises BadSpans for a span that holds
    no token, unless the document was truncated before it (those spans are left out)."""
    n = len(offsets)
    token_starts = np.array([offsets[i][0] for i in range(1, n - 1)], dtype=np.int64)
    chunks = []
    for index, (start, end) in enumerate(spans):
        lo = int(np.searchsorted(token_starts, start, side="left"))
        hi = int(np.searchsorted(token_starts, end, side="left"))
        if hi <= lo:
            if truncated and lo >= len(token_starts):
                break  # past the truncation point
            raise BadSpans(f"span {index} [{start}, {end}) holds no token (only whitespace or control characters?); "
                           "merge it with a neighbour or leave it out", index)
        first, stop = 1 + lo, 1 + hi
        chunks.append(ChunkBounds(first, stop, start, end))
    if chunks:
        if chunks[0].first == 1:
            chunks[0] = ChunkBounds(0, chunks[0].stop, chunks[0].start, chunks[0].end)
        if chunks[-1].stop == n - 1:
            chunks[-1] = ChunkBounds(chunks[-1].first, n, chunks[-1].start, chunks[-1].end)
    return chunks


ChunkContext = Literal["none", "late"]  # what a chunk's vector sees: its own text, or its document
CHUNK_CONTEXTS: tuple[str, ...] = get_args(ChunkContext)
DEFAULT_CHUNK_CONTEXT = "none"  # measured best on the dev set, and the cheapest (serve's --chunk-context)


def naive_chunk_ids(ids: Sequence[int], chunks: Sequence[ChunkBounds], cls: int, sep: int) -> list[list[int]]:
    """Each chunk as a text of its own, for context none: [CLS] its document tokens [SEP]."""
    return [[cls] + [i for i in ids[c.first : c.stop] if i not in (cls, sep)] + [sep] for c in chunks]


def pool_chunks(hidden: np.ndarray, chunks: Sequence[ChunkBounds], normalize: bool = True) -> np.ndarray:
    """(len(chunks), d): the mean hidden state of each chunk's tokens, L2-normalised unless
    normalize is False."""
    cumulative = np.concatenate([np.zeros((1, hidden.shape[1]), dtype=np.float64), np.cumsum(hidden, axis=0, dtype=np.float64)])
    firsts = np.array([c.first for c in chunks])
    stops = np.array([c.stop for c in chunks])
    means = ((cumulative[stops] - cumulative[firsts]) / (stops - firsts)[:, None]).astype(np.float32)
    return l2_normalize(means) if normalize else means
