"""The public API: `load_encoder` and the Encoder it returns."""
from __future__ import annotations

import torch

from models.encoder import BertShape, LongContextEncoder, rank_collapse_ratio
from models.pretrained import load_bert_weights, load_tokenizer
from models.registry import make_config
from models.sparse import to_sparse

# Documents are embedded in batches of at most this many (padded) tokens: long documents
# alone, short ones many at a time.
BATCH_TOKENS = 16384
BATCH_TEXTS = 64


class Encoder(LongContextEncoder):
    """A LongContextEncoder that carries its tokenizer, with the user-facing methods."""

    def __init__(self, shape, attention_config, max_length):
        super().__init__(shape, attention_config, max_length)
        self.tokenizer = load_tokenizer(max_length)

    @property
    def variant(self) -> str:
        return self.attention_config.variant

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, [CLS] and [SEP] included, cut at max_length tokens."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """(n, hidden) L2-normalised mean-pooled embeddings, as sentence-transformers computes
        them. A text longer than max_length tokens is cut to its first max_length tokens; an
        empty text gets the embedding of the empty document ([CLS] [SEP])."""
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty(len(ids), self.shape.hidden_size)
        start = 0
        while start < len(order):
            stop = start + 1
            # Sorted by length, so the last text in a batch sets its padded width.
            while stop < len(order) and stop - start < BATCH_TEXTS and (stop - start + 1) * len(ids[order[stop]]) <= BATCH_TOKENS:
                stop += 1
            batch = order[start:stop]
            input_ids, mask = pad_batch([ids[i] for i in batch])
            out[batch] = self(input_ids, mask)[0]
            start = stop
        return out

    @torch.no_grad()
    def attention_map(self, text: str, layer: int, head: int | None = None) -> torch.Tensor:
        """Layer `layer`'s attention of every token over the tokens of `text`, as an (N, N)
        sparse COO tensor (indices and values); the mean over heads when head is None.
        For linformer and compressed these are the effective token-to-token weights
        (attention over compressed keys times the compression), which are dense."""
        self._check_layer_head(layer, head)
        input_ids, mask = pad_batch(self.tokenize([text]))
        _, _, weights = self(input_ids, mask, weights_layer=layer)
        return to_sparse(weights, input_ids.shape[1], head)

    @torch.no_grad()
    def rank_collapse(self, text: str) -> list[float]:
        """For each layer's output X (N x hidden): ||X - 1 x^T|| / ||X|| with x the mean token
        and the sqrt(||.||_1 ||.||_inf) norm. Near 0 means the tokens collapsed to rank 1."""
        input_ids, mask = pad_batch(self.tokenize([text]))
        states: list[torch.Tensor] = []
        self(input_ids, mask, hidden_states=states)
        return [float(rank_collapse_ratio(x)[0]) for x in states]

    def _check_layer_head(self, layer, head):
        if not 0 <= layer < self.shape.num_layers:
            raise ValueError(f"layer must be in 0..{self.shape.num_layers - 1} (got {layer})")
        if head is not None and not 0 <= head < self.shape.num_heads:
            raise ValueError(f"head must be in 0..{self.shape.num_heads - 1} or None (got {head})")


def pad_batch(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id lists into (input_ids, attention_mask), both int64."""
    width = max(len(x) for x in ids)
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, : len(x)] = 1
    return input_ids, mask


def load_encoder(variant: str = "longformer", max_length: int = 16384, **params) -> Encoder:
    """An eval-mode encoder over all-MiniLM-L6-v2 whose attention is `variant` with `params`
    (see `attnserve variants`). Unknown variants or parameters and impossible values raise
    ValueError saying what is valid."""
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2 (got {max_length!r})")
    config = make_config(variant, max_length, **params)
    encoder = Encoder(BertShape(), config, max_length)
    load_bert_weights(encoder)
    return encoder.eval()
