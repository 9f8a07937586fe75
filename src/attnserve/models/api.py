"""The public API: `load_encoder` and the Encoder it returns."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from attnserve.models.encoder import LongContextEncoder, rank_collapse_ratio
from attnserve.models.families import family_of
from attnserve.models.pretrained import load_model, load_pretrained, load_tokenizer
from attnserve.models.registry import VARIANTS, make_config, variant_class, variant_names
from attnserve.models.sparse import to_sparse
from attnserve.models.weights import load_weights
from attnserve.contract.model_folder import wrapping_ids
from attnserve.contract.schedule import repeating_text, resolve_native
from attnserve.contract.pooling import (
    CHUNK_CONTEXTS, DEFAULT_CHUNK_CONTEXT, Pooling, check_spans, naive_chunk_ids, opening_tokens_for, pool_chunks, pooling_for,
    span_chunks, token_chunks,
)

# Documents are embedded in batches of at most this many (padded) tokens: long documents
# alone, short ones many at a time.
BATCH_TOKENS = 16384
BATCH_TEXTS = 64


@dataclasses.dataclass(frozen=True)
class ChunkEmbedding:
    """One late chunk: characters [start, end) of its text and the chunk's vector."""

    start: int
    end: int
    embedding: torch.Tensor


class Encoder(LongContextEncoder):
    """A LongContextEncoder of a model folder's family and shape that carries the folder and
    its tokenizer, with the user-facing methods. `model`: a ModelFolder
    (models.pretrained.load_model; None: the bundled all-MiniLM-L6-v2). Its parameters are as
    initialised: build_encoder loads the folder's weights."""

    def __init__(self, model, attention_config, max_length):
        model = load_model(model)
        family = family_of(model.architecture)
        super().__init__(family, family.shape.of(model), attention_config, max_length)
        self.model = model
        self.tokenizer = load_tokenizer(max_length, self.model.dir)
        self.weights: dict | None = None  # the adapted weights applied (models.weights.load_weights)

    @property
    def variant(self) -> str:
        return self.attention_config.variant

    @property
    def special_ids(self) -> tuple[int, int]:
        """The ids each text is wrapped in: [CLS] and [SEP] for BERT, <s> and </s> for XLM-RoBERTa."""
        return wrapping_ids(self.tokenizer)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, the model's special tokens ([CLS] and [SEP], <s> and </s>)
        included, cut at max_length tokens."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    @property
    def default_pooling(self) -> Pooling:
        """What embed() pools by unless told otherwise: what a deployment of this model pools by
        (contract.pooling.pooling_for: opening for a mean-pooled model, the model's own cls or
        lasttoken otherwise), so embed() gives the vectors /embed gives."""
        return Pooling(pooling_for(self.shape.pooling), opening_tokens=opening_tokens_for(self.model.max_seq_length))

    @torch.no_grad()
    def embed(self, texts: list[str], pooling: Pooling | None = None, normalize: bool = True, query: bool = False) -> torch.Tensor:
        """(n, hidden) embeddings, the vectors /embed gives: pooled by `pooling` (None: the
        default_pooling; see contract.pooling.Pooling), by its pooling for queries where `query`
        (/embed's input_type query), L2-normalised unless normalize is False. A text that fits in
        the opening (and any text under the model's own pooling) gets what sentence-transformers
        gives the model (normalize=encoder.shape.normalize: with or without its Normalize
        module). A text longer than max_length tokens is cut to its first max_length tokens; an
        empty text gets the embedding of the empty document ([CLS] [SEP])."""
        ids = self.tokenize(texts)
        pooling = pooling or self.default_pooling
        pooling = pooling.for_queries if query else pooling
        if normalize == self.shape.normalize and all(pooling.applied_mode(len(i)) == self.shape.pooling for i in ids):
            return self.embed_ids(ids)  # the graph's own pooled output: no token vectors needed
        return torch.stack([torch.from_numpy(pooling(hidden, normalize)) for hidden in self.token_states(ids)])

    @torch.no_grad()
    def embed_ids(self, ids: list[list[int]]) -> torch.Tensor:
        """Vectors of token id lists ([CLS] ... [SEP] each, at most max_length long) as
        sentence-transformers computes them: the model's own pooling, L2-normalised where the
        model has a Normalize module."""
        out = torch.empty(len(ids), self.shape.hidden_size)
        for batch in self._batches(ids):
            input_ids, mask = pad_batch([ids[i] for i in batch])
            out[batch] = self(input_ids, mask)[0]
        return out

    @torch.no_grad()
    def hidden_states(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's last hidden states, (n_tokens, hidden) float32, [CLS] and [SEP] included
        (TEI's /embed_all); texts longer than max_length are cut."""
        return self.token_states(self.tokenize(texts))

    @torch.no_grad()
    def embed_chunks(self, texts: list[str], chunk_tokens: int = 256, overlap_tokens: int = 0,
                     spans: list[list[tuple[int, int]]] | None = None, normalize: bool = True,
                     context: str = DEFAULT_CHUNK_CONTEXT) -> list[list[ChunkEmbedding]]:
        """Chunk vectors, /embed_chunks' (same chunks, same default context): chunks hold
        chunk_tokens document tokens, consecutive ones sharing overlap_tokens; with `spans` (one
        list of (start_char, end_char) per text) the chunks are those spans instead. context
        none: each chunk embedded alone ([CLS] chunk [SEP], mean-pooled); late (late chunking):
        one forward per document, each chunk the mean of its tokens' last hidden states. Vectors
        are L2-normalised unless normalize is False. Each ChunkEmbedding's start/end slice the
        text; a document that fits in one chunk gets its mean vector. Texts longer than
        max_length tokens are cut."""
        texts = list(texts)
        if spans is not None and len(spans) != len(texts):
            raise ValueError(f"spans must hold one list per text ({len(texts)} texts, {len(spans)} span lists)")
        if context not in CHUNK_CONTEXTS:
            raise ValueError(f"context must be one of {', '.join(CHUNK_CONTEXTS)} (got {context!r})")
        encodings = self.tokenizer.encode_batch(texts)
        bounds = [token_chunks(e.offsets, len(t), chunk_tokens, overlap_tokens, bool(e.overflowing)) if spans is None
                  else span_chunks(e.offsets, check_spans(spans[i], len(t)), bool(e.overflowing))
                  for i, (t, e) in enumerate(zip(texts, encodings))]
        if context == "late":
            hidden = self.token_states([e.ids for e in encodings])
            vectors = [pool_chunks(h, b, normalize) for h, b in zip(hidden, bounds)]
        else:
            pieces = [naive_chunk_ids(e.ids, b, *self.special_ids) for e, b in zip(encodings, bounds)]
            states = iter(self.token_states([piece for doc in pieces for piece in doc]))
            mean = Pooling("mean")
            vectors = [np.stack([mean(next(states), normalize) for _ in doc]) for doc in pieces]
        return [[ChunkEmbedding(c.start, c.end, torch.from_numpy(v)) for c, v in zip(b, doc)] for b, doc in zip(bounds, vectors)]

    def _batches(self, ids: list[list[int]]):
        """Index lists of at most BATCH_TEXTS texts and BATCH_TOKENS padded tokens, shortest
        texts first (sorted by length, so the last text of a batch sets its padded width)."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        start = 0
        while start < len(order):
            stop = start + 1
            while stop < len(order) and stop - start < BATCH_TEXTS and (stop - start + 1) * len(ids[order[stop]]) <= BATCH_TOKENS:
                stop += 1
            yield order[start:stop]
            start = stop

    @torch.no_grad()
    def token_states(self, ids: list[list[int]]) -> list[np.ndarray]:
        """hidden_states() of token id lists."""
        out: list[np.ndarray] = [None] * len(ids)  # type: ignore[list-item]
        for batch in self._batches(ids):
            input_ids, mask = pad_batch([ids[i] for i in batch])
            last = self(input_ids, mask)[1]
            for row, i in enumerate(batch):
                out[i] = last[row, : len(ids[i])].numpy()
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
    def rank_collapse(self, text: str, paths=None):
        """For each layer's output X (N x hidden): ||X - 1 x^T|| / ||X|| with x the mean token
        and the sqrt(||.||_1 ||.||_inf) norm. Near 0 means the tokens collapsed to rank 1.

        paths None: the model's own curve, one ratio per layer. paths, a list of
        COLLAPSE_PATHS (model, attention_only, attention_skip, attention_mlp): {path: one ratio
        per layer} along each path through the same weights (LongContextEncoder.collapse_paths;
        the embeddings' ratio, where every path starts, is left out)."""
        input_ids, mask = pad_batch(self.tokenize([text]))
        if paths is None:
            states: list[torch.Tensor] = []
            self(input_ids, mask, hidden_states=states)
            return [float(rank_collapse_ratio(x)[0]) for x in states]
        return {path: [float(r) for r in ratios[0, 1:]] for path, ratios in self.collapse_paths(input_ids, mask, paths).items()}

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


def load_encoder(variant: str | None = None, max_length: int | None = None, weights=None, model=None, **params) -> Encoder:
    """An eval-mode encoder over `model` (a sentence-transformers folder of a BERT, XLM-RoBERTa
    or ModernBERT model, or a ModelFolder; None: the bundled all-MiniLM-L6-v2) whose attention is
    `variant` with `params` (see `attnserve variants`; None: the model's default_variant,
    longformer for BERT and XLM-RoBERTa, native for ModernBERT), for inputs of up to max_length
    tokens (None: the model's default_max_length). Unknown variants or parameters and
    impossible values raise ValueError saying what is valid; a folder that is not a supported
    model a ModelError (a ValueError) naming the file. `weights`: a directory `attnserve adapt`
    wrote, whose tensors replace the pretrained ones (models.weights; a WeightsError, a
    ValueError, names the file when they do not fit, or the model when they were trained on
    another). encoder.weights says which were applied (None: none)."""
    folder = load_model(model)
    variant, max_length = deployment_defaults(folder, variant, max_length)
    return build_encoder(model_config(variant, max_length, folder, params), max_length, model=folder, weights=weights)


def deployment_defaults(model, variant: str | None, max_length: int | None) -> tuple[str, int]:
    """(variant, max_length) with the model's defaults where None (ModelFolder.default_variant,
    default_max_length); ValueError for a max_length that is not an integer >= 2."""
    variant = model.default_variant if variant is None else variant
    max_length = model.default_max_length if max_length is None else max_length
    check_max_length(max_length)
    return variant, max_length


def check_rotary(model, config) -> None:
    """ValueError naming the variants of `config` that cannot carry a rotary model's positions
    (Attention.rotary_refused: RoPE rotates queries and keys, so only a variant that scores each
    query against single tokens' keys keeps it) and those that can."""
    layers = config.per_layer(model.num_layers)
    refused = {c.variant: variant_class(c.variant).rotary_refused for c in layers if variant_class(c.variant).rotary_refused}
    if refused:
        can = ", ".join(name for name, cls in VARIANTS.items() if not cls.rotary_refused)
        why = "; ".join(f"{name}: {reason}" for name, reason in refused.items())
        raise ValueError(f"{model.name}'s positions are rotary (RoPE: queries and keys rotated by position), which "
                         f"{', '.join(refused)} cannot carry ({why}); the variants that can: {can}")


def model_config(variant: str, max_length: int, model, params: dict | None = None):
    """The attention config of `variant` or a schedule over `model` (a ModelFolder): spelled
    for the model's layer count, `native` standing for the model's own attention in the layers
    it names (contract.schedule.resolve_native; its window a parameter the user's may override)."""
    text, native = resolve_native(variant, model.native_layers(), model.local_window, variant_names())
    config = make_config(text, max_length, num_layers=model.num_layers, **{**native, **(params or {})})
    if model.rotary:
        check_rotary(model, config)
    if model.rotary and max_length > model.max_positions and not model.extends_positions:
        unbounded = sorted({c.variant for c in config.per_layer(model.num_layers) if not variant_class(c.variant).bounded_span})
        if unbounded:
            bounded = ", ".join(name for name, cls in VARIANTS.items() if cls.bounded_span)
            example = repeating_text(["longformer" if own == "full" else "native" for own in model.native_layers()])
            raise ValueError(f"max_length {max_length} is past the {model.max_positions} positions {model.name} was trained "
                             f"at; rotary positions go past them only where every layer reaches a bounded span ({bounded}), "
                             f"and {', '.join(unbounded)} does not: serve at most {model.max_positions} tokens, or put "
                             f"bounded variants in those layers (e.g. --variant {example})")
    return config


def build_encoder(config, max_length: int, model=None, weights=None) -> Encoder:
    """load_encoder for an attention config already resolved (registry.make_config, or an
    export's Recipe.config)."""
    check_max_length(max_length)
    encoder = Encoder(model, config, max_length)
    load_pretrained(encoder, encoder.model)
    if weights is not None:
        load_weights(encoder, weights)
    return encoder.eval()


def check_max_length(max_length) -> None:
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2 (got {max_length!r})")
