"""Torch-free tokenization from the export's tokenizer.json.

Texts are tokenized without truncation inside the tokenizer so that a too-long input can be
refused with its length; truncation, when asked for, keeps the first max_length - 1 tokens
and the final [SEP], exactly what the tokenizer's own truncation does for a single sequence.

A long text is tokenized only as far as it must be: a prefix of it, cut at whitespace, is
tokenized first, and grown only while it gives at most max_length tokens. For the BERT
pipeline (BertNormalizer, BertPreTokenizer, WordPiece) the tokens of such a prefix are
exactly the first tokens of the whole text: normalisation works character by character,
whitespace always ends a word, and WordPiece splits each word on its own, so no word before
the cut can change with what follows it. Once a prefix has more than max_length tokens the
whole text has too, and the truncated result (ids, tokens, offsets) is the same as the whole
text's. Other pipelines are tokenized whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from attnserve.service.errors import ServiceError
from attnserve.contract.export_format import ExportError
from attnserve.contract.model_folder import wrapping_ids


class InputTooLong(ServiceError):
    """An input over max_length tokens, where truncation was not asked for (413)."""

    def __init__(self, index: int, length: int, max_length: int, at_least: bool = False):
        self.index, self.length, self.max_length, self.at_least = index, length, max_length, at_least
        self.name(f"input {index}")
        super().__init__(413, self.advise("shorten it or send truncate=true"), "too_long")

    def name(self, name: str) -> None:
        """Call the input `name` in the message (e.g. the document its chunks were joined into)."""
        self.fact = (f"{name} is {'more than ' if self.at_least else ''}{self.length} tokens long, longer than this server's limit of "
                     f"{self.max_length} tokens ([CLS] and [SEP] included)")

    def advise(self, remedy: str) -> str:
        """The message with what the caller's API lets the user do about it."""
        return f"{self.fact}; {remedy}"


@dataclass
class Tokenized:
    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: list[bool]
    # Tokens before truncation. For a long text of which only a prefix was tokenized, the
    # prefix's count: a lower bound, and still larger than len(ids), so `truncated` holds.
    original_length: int

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def truncated(self) -> bool:
        return self.original_length > len(self.ids)


# Characters a text is cut before when only a prefix is tokenized: whitespace to both
# BertNormalizer (it maps them to a space) and BertPreTokenizer (it splits there).
_CUT_CHARS = (" ", "\n", "\t", "\r")
# First prefix tried, in characters per token of max_length: English runs at 4-5, so one
# prefix nearly always suffices; each shortfall quadruples it.
_PREFIX_CHARS_PER_TOKEN = 8


def _prefix_is_exact(tokenizer: Tokenizer) -> bool:
    """Whether a prefix cut at whitespace tokenizes to a prefix of the whole text's tokens
    (see the module docstring): the BERT pipeline, and no added token that holds whitespace
    or absorbs the whitespace beside it."""
    if not isinstance(tokenizer.normalizer, normalizers.BertNormalizer):
        return False
    if not isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer):
        return False
    if not isinstance(tokenizer.model, models.WordPiece):
        return False
    for token in tokenizer.get_added_tokens_decoder().values():
        if token.lstrip or token.rstrip or token.single_word or any(c.isspace() for c in token.content):
            return False
    return True


class TextTokenizer:
    def __init__(self, path: str | Path, max_length: int):
        self.path = Path(path)
        try:
            self._tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers raises a bare Exception for unreadable or corrupt JSON
            raise ExportError(f"{self.path}: not a tokenizer the tokenizers library can load ({str(exc).strip()[:300]}); "
                              f"the export is damaged: delete its directory and start `attnserve serve` again to export it anew, "
                              f"or write it again with `attnserve export`") from exc
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.max_length = max_length
        self.vocab_size = self._tokenizer.get_vocab_size()
        # The special tokens the post-processor wraps a text in: [CLS] and [SEP] for BERT, <s>
        # and </s> for XLM-RoBERTa (read from the tokenizer, never assumed).
        wrapping = wrapping_ids(self._tokenizer)
        if wrapping is None:
            raise ExportError(f"{self.path}: its post-processor adds fewer than two special tokens to a text; attnserve "
                              f"serves models whose tokenizer wraps each text in two ([CLS] ... [SEP] or <s> ... </s>)")
        self.cls_id, self.sep_id = wrapping
        # Texts longer than this many characters are tokenized a prefix at a time (0: never).
        self.prefix_chars = max_length * _PREFIX_CHARS_PER_TOKEN if _prefix_is_exact(self._tokenizer) else 0

    def encode(self, texts: list[str], truncate: bool, add_special_tokens: bool = True, keep_end: bool = False,
               max_length: int | None = None) -> list[Tokenized]:
        """Tokenize `texts`; raises InputTooLong for the first text over max_length (this
        call's, at most the tokenizer's: a route's own limit) unless `truncate`, which keeps its
        first tokens, or its last with `keep_end` (TEI's truncation_direction=left; [CLS] and
        [SEP] stay either way)."""
        limit = min(max_length or self.max_length, self.max_length)
        texts = list(texts)
        encodings: list = [None] * len(texts)
        whole = []
        for index, text in enumerate(texts):
            # Keeping the end needs the whole text's tokens, so only the start is read in prefixes.
            if self.prefix_chars and len(text) > self.prefix_chars and not (truncate and keep_end):
                encodings[index] = self._encode_long(text, add_special_tokens)
            else:
                whole.append(index)
        batch = self._tokenizer.encode_batch([texts[i] for i in whole], add_special_tokens=add_special_tokens)
        for index, enc in zip(whole, batch):
            encodings[index] = (enc, True)
        out = []
        for index, (enc, complete) in enumerate(encodings):
            ids, tokens, offsets = enc.ids, enc.tokens, enc.offsets
            special = [bool(s) for s in enc.special_tokens_mask]
            n = len(ids)
            if n > limit:
                if not truncate:
                    raise InputTooLong(index, n, limit, at_least=not complete)
                ends = 1 if add_special_tokens else 0  # [CLS] and [SEP], kept in place
                body = limit - 2 * ends
                kept = slice(n - ends - body, n - ends) if keep_end else slice(ends, ends + body)
                pick = lambda xs: xs[:ends] + xs[kept] + xs[n - ends:n]  # noqa: E731
                ids, tokens, offsets, special = pick(ids), pick(tokens), pick(offsets), pick(special)
            out.append(Tokenized(ids, tokens, offsets, special, n))
        return out

    def _encode_long(self, text: str, add_special_tokens: bool):
        """(encoding, complete): of the shortest prefix tried, cut before whitespace, with more
        than max_length tokens (complete False), or of the whole text when none has."""
        chars = self.prefix_chars
        while chars < len(text):
            cut = max(text.rfind(c, 0, chars) for c in _CUT_CHARS)
            if cut > 0:
                enc = self._tokenizer.encode(text[:cut], add_special_tokens=add_special_tokens)
                if len(enc.ids) > self.max_length:
                    return enc, False
            chars *= 4
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens), True

    def decode(self, batches: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Text of each id list (ids checked against the vocabulary by the caller)."""
        return self._tokenizer.decode_batch(batches, skip_special_tokens=skip_special_tokens)

    def from_ids(self, batches: list[list[int]], truncate: bool = False) -> list[Tokenized]:
        """Inputs already tokenized (OpenAI's token-array form): wrap each in [CLS] ... [SEP]
        unless it already is, and check the ids (422 outside the vocabulary) and the length."""
        out = []
        for index, raw in enumerate(batches):
            bad = [i for i in raw if not 0 <= i < self.vocab_size]
            if bad:
                raise ServiceError(422, f"input {index} has token id {bad[0]}, outside the vocabulary 0..{self.vocab_size - 1}", "validation")
            ids = list(raw)
            if not ids or ids[0] != self.cls_id:
                ids = [self.cls_id] + ids
            if ids[-1] != self.sep_id or len(ids) == 1:
                ids = ids + [self.sep_id]
            n = len(ids)
            if n > self.max_length:
                if not truncate:
                    raise InputTooLong(index, n, self.max_length)
                ids = ids[: self.max_length - 1] + [self.sep_id]
            tokens = [self._tokenizer.id_to_token(i) or "" for i in ids]
            special = [i in (self.cls_id, self.sep_id) for i in ids]
            out.append(Tokenized(ids, tokens, [(0, 0)] * len(ids), special, n))
        return out
