"""Torch-free tokenization from the export's tokenizer.json.

Texts are tokenized whole (no truncation inside the tokenizer) so that a too-long input can
be refused with its real length; truncation, when asked for, keeps the first
max_length - 1 tokens and the final [SEP], exactly what the tokenizer's own truncation does
for a single sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


class InputTooLong(ValueError):
    def __init__(self, index: int, length: int, max_length: int):
        self.index, self.length, self.max_length = index, length, max_length
        super().__init__(
            f"input {index} is {length} tokens long, longer than this server's limit of {max_length} tokens "
            f"([CLS] and [SEP] included); shorten it or send truncate=true"
        )


@dataclass
class Tokenized:
    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    special: list[bool]
    original_length: int  # before truncation

    def __len__(self) -> int:
        return len(self.ids)


class TextTokenizer:
    def __init__(self, path: str | Path, max_length: int):
        self.path = Path(path)
        self._tokenizer = Tokenizer.from_file(str(self.path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.max_length = max_length
        self.vocab_size = self._tokenizer.get_vocab_size()
        self.cls_id = self._tokenizer.token_to_id("[CLS]")
        self.sep_id = self._tokenizer.token_to_id("[SEP]")

    def encode(self, texts: list[str], truncate: bool, add_special_tokens: bool = True) -> list[Tokenized]:
        """Tokenize `texts`; raises InputTooLong for the first text over max_length unless
        `truncate`."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        out = []
        for index, enc in enumerate(encodings):
            ids, tokens, offsets = enc.ids, enc.tokens, enc.offsets
            special = [bool(s) for s in enc.special_tokens_mask]
            n = len(ids)
            if n > self.max_length:
                if not truncate:
                    raise InputTooLong(index, n, self.max_length)
                keep = self.max_length - 1 if add_special_tokens else self.max_length
                tail = slice(n - 1, n) if add_special_tokens else slice(0, 0)
                ids = ids[:keep] + ids[tail]
                tokens = tokens[:keep] + tokens[tail]
                offsets = offsets[:keep] + offsets[tail]
                special = special[:keep] + special[tail]
            out.append(Tokenized(ids, tokens, offsets, special, n))
        return out

    def decode(self, batches: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Text of each id list (ids checked against the vocabulary by the caller)."""
        return self._tokenizer.decode_batch(batches, skip_special_tokens=skip_special_tokens)

    def from_ids(self, batches: list[list[int]], truncate: bool = False) -> list[Tokenized]:
        """Inputs already tokenized (OpenAI's token-array form): wrap each in [CLS] ... [SEP]
        unless it already is, and check the ids and the length."""
        out = []
        for index, raw in enumerate(batches):
            bad = [i for i in raw if not 0 <= i < self.vocab_size]
            if bad:
                raise ValueError(f"input {index} has token id {bad[0]}, outside the vocabulary 0..{self.vocab_size - 1}")
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
