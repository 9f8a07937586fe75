"""Pydantic models for every request and response body.

The OpenAPI schema states what each route accepts, so that a request the schema allows is
answered 2xx (or a limit it documents: 413, 429) and one it forbids is refused with 422. Bounds
that only the loaded model and the settings know (vocabulary, hidden size, layers, heads, inputs
per request) are marked here with `x-deployment-maximum` / `x-deployment-maxItems` and filled in
by `fill_deployment_bounds` once the service has loaded; the routes check the same bounds.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from attnserve.contract.export_format import COLLAPSE_PATHS
from attnserve.contract.pooling import ChunkContext
from attnserve.service.input_types import INPUT_TYPES, JINA_TASKS

# A text needs one character that is neither whitespace nor NUL. The whitespace is Python's
# (str.isspace, what the validator below strips), spelled out because ECMA's, Rust's and
# Python's `\s` differ, so that every regex engine reads the pattern as the validator does.
_SPACE = r"\t-\r\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
TEXT_PATTERN = rf"^[^\u0000]*[^\u0000{_SPACE}][^\u0000]*$"


def _check_text(text: str) -> str:
    """Refuse what no tokenizer should see: empty or whitespace-only text, NUL characters,
    lone surrogates."""
    if not text.strip():
        raise ValueError(f"{'empty string' if not text else 'only whitespace'}: send text with at least one character that is not whitespace")
    nul = text.find("\x00")
    if nul >= 0:
        raise ValueError(f"NUL character (U+0000) at position {nul}: remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"lone surrogate U+{ord(text[exc.start]):04X} at position {exc.start} is not valid Unicode text: "
            "send UTF-8 text (encode astral characters as a surrogate pair or directly)"
        ) from None
    return text


def _integral(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer: take it as 3 (3.5 still fails as not an integer)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def deployment_maximum(bound: str) -> dict:
    """Schema marker: this integer's maximum is the deployment's `bound`."""
    return {"x-deployment-maximum": bound}


def deployment_max_items(bound: str) -> dict:
    """Schema marker: this list's maxItems is the deployment's `bound`."""
    return {"x-deployment-maxItems": bound}


_MARKERS = {"x-deployment-maximum": "maximum", "x-deployment-maxItems": "maxItems"}


def fill_deployment_bounds(schema: Any, bounds: dict[str, Any]) -> Any:
    """Replace every deployment marker in `schema` (in place) by its keyword with the value
    `bounds` names; idempotent, as the markers are gone once filled."""
    if isinstance(schema, dict):
        for marker, keyword in _MARKERS.items():
            if marker in schema:
                schema[keyword] = bounds[schema.pop(marker)]
        for value in schema.values():
            fill_deployment_bounds(value, bounds)
    elif isinstance(schema, list):
        for value in schema:
            fill_deployment_bounds(value, bounds)
    return schema


def _int(**field) -> Any:
    """An integer field type, its bounds in the schema (constraints before the validator, or
    pydantic writes `ge` instead of `minimum`)."""
    return Annotated[int, Field(**field), BeforeValidator(_integral)]


Int = _int()
Text = Annotated[
    str,
    AfterValidator(_check_text),
    Field(json_schema_extra={"minLength": 1, "pattern": TEXT_PATTERN}, description="at least one character that is not whitespace; no NUL"),
]
Texts = Annotated[list[Text], Field(min_length=1, json_schema_extra=deployment_max_items("max_inputs"))]
TextOrTexts = Annotated[Text | Texts, Field(description="one text or a non-empty list of texts (at most max_client_batch_size)")]


class _Strict(BaseModel):
    # A field this server does not know is refused (422 naming it), as OpenAI's API does: a
    # misspelt option (`truncation` for `truncate`) must not be ignored silently.
    model_config = ConfigDict(strict=True, extra="forbid")


def _no_prompts(name: Any) -> None:
    if name is not None:
        raise ValueError(f"this server has no prompts configured (got prompt_name {name!r}): send null or leave the field out")
    return name


# Fields TEI's clients send (huggingface_hub's feature_extraction among them), accepted for
# the values this server can honour.
TruncationDirection = Annotated[
    Literal["right", "left", "Right", "Left"],
    Field(description="with truncate=true, which end of a long input is cut: right keeps the start, left keeps the end"),
]
PromptName = Annotated[None, BeforeValidator(_no_prompts), Field(description="TEI's prompt name: this server has no prompts, so only null")]


class _TruncationDirection:
    """For the requests with a truncation_direction field."""

    @property
    def keeps_end(self) -> bool:
        """Truncation keeps a long input's end (TEI's truncation_direction=left), not its start."""
        return self.truncation_direction.lower() == "left"


InputType = Annotated[
    Literal[tuple(INPUT_TYPES)],
    Field(description="which side of a search the texts are on (Voyage's and Cohere's names): a query is embedded as a short "
          "text always is, a document takes the deployment's document path; null: the document path (/info's input_types)"),
]


# -- text-embeddings-inference ---------------------------------------------------------------
class EmbedRequest(_TruncationDirection, _Strict):
    inputs: TextOrTexts
    truncate: bool = Field(False, description="cut inputs longer than max_length tokens instead of answering 413")
    truncation_direction: TruncationDirection = "right"
    normalize: bool = Field(True, description="L2-normalised embeddings; false returns the pooled hidden states (the deployment's pooling) as they are")
    prompt_name: PromptName = None
    input_type: InputType | None = None


class SimilarityInput(_Strict):
    source_sentence: Text
    sentences: Annotated[list[Text], Field(min_length=1, json_schema_extra=deployment_max_items("max_sentences"),
                                           description="compared with source_sentence (with it, at most max_client_batch_size texts)")]


class SimilarityParameters(_TruncationDirection, _Strict):
    truncate: bool | None = Field(False, description="cut texts longer than max_length tokens instead of answering 413")
    truncation_direction: TruncationDirection = "right"
    prompt_name: PromptName = None


class SimilarityRequest(_Strict):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


Span = Annotated[list[_int(ge=0)], Field(min_length=2, max_length=2, description="[start_char, end_char): Python string indices (Unicode code points)")]
Spans = Annotated[list[Span], Field(min_length=1)]


class EmbedChunksRequest(_Strict):
    inputs: TextOrTexts
    chunk_tokens: Int = Field(256, ge=1, description="document tokens per chunk ([CLS] and [SEP] join the first and last chunk)")
    overlap_tokens: Int = Field(0, ge=0, description="tokens each chunk shares with the one before; less than chunk_tokens")
    spans: Spans | Annotated[list[Spans], Field(min_length=1, json_schema_extra=deployment_max_items("max_inputs"))] | None = Field(
        None,
        description="your own chunk boundaries instead of chunk_tokens: [[start_char, end_char], ...] for one input, "
        "one such list per input for a list; in order, not overlapping, each holding at least one token",
    )
    truncate: bool = Field(False, description="cut inputs longer than max_length tokens instead of answering 413; chunks then cover the kept part")
    normalize: bool = Field(True, description="L2-normalised chunk vectors; false returns the mean hidden states as they are")
    context: ChunkContext | None = Field(
        None,
        description="how chunk vectors get their document's context: none (each chunk embedded alone, as a 512-token server "
        "does) or late (each chunk the mean of its tokens from one pass over the whole document). Null: the deployment's "
        "default, /info's chunk_context",
    )

    @model_validator(mode="after")
    def _check(self):
        if self.overlap_tokens >= self.chunk_tokens:
            raise ValueError(f"overlap_tokens ({self.overlap_tokens}) must be less than chunk_tokens ({self.chunk_tokens})")
        if self.spans is not None:
            one_text = isinstance(self.inputs, str)
            nested = isinstance(self.spans[0][0], list)
            if one_text and nested:
                raise ValueError("inputs is one text, so spans is one list of [start_char, end_char] pairs")
            if not one_text and (not nested or len(self.spans) != len(self.inputs)):
                raise ValueError(f"inputs is a list of {len(self.inputs)} texts, so spans is a list of {len(self.inputs)} lists of "
                                 "[start_char, end_char] pairs, one per text")
        return self

    def texts_and_spans(self) -> tuple[list[str], list | None]:
        """The inputs as a list, and one span list per input (None: fixed-size chunks)."""
        if isinstance(self.inputs, str):
            return [self.inputs], None if self.spans is None else [self.spans]
        return self.inputs, self.spans


class ChunkEmbedding(BaseModel):
    start: int = Field(description="first character of the chunk in its input")
    end: int = Field(description="one past its last character: input[start:end] is the chunk's text")
    embedding: list[float]


class EmbedAllRequest(_TruncationDirection, _Strict):
    inputs: TextOrTexts
    truncate: bool = False
    truncation_direction: TruncationDirection = "right"
    prompt_name: PromptName = None


TokenId = _int(ge=0, json_schema_extra=deployment_maximum("vocab_max"), description="0 .. vocabulary size - 1")
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
TokenIdLists = Annotated[list[TokenIds], Field(min_length=1, json_schema_extra=deployment_max_items("max_inputs"))]


class DecodeRequest(_Strict):
    ids: TokenIds | TokenIdLists
    skip_special_tokens: bool = True


class TokenizeRequest(_Strict):
    inputs: TextOrTexts
    add_special_tokens: bool = True
    truncate: bool = False
    prompt_name: PromptName = None


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(None, description="character offset of the token's start (null for token-id input)")
    stop: int | None = None


# -- OpenAI embeddings -----------------------------------------------------------------------
Dimensions = _int(ge=1, json_schema_extra=deployment_maximum("hidden_size"))


class OpenAIEmbeddingRequest(_Strict):
    input: Annotated[
        Text | Texts | TokenIds | TokenIdLists,
        Field(description="a text, a list of texts, a list of token ids, or a list of token-id lists"),
    ]
    model: str = Field(description="any name; the answer names the model this server runs")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = Field(
        None, description="keep the first `dimensions` values (1 .. hidden size), renormalised")
    user: str | None = None
    # Jina's embeddings API.
    late_chunking: bool = Field(False, description="Jina's late chunking: the texts of input are consecutive chunks of one "
                                "document, joined with one space and embedded in one pass; each gets the vector of its own "
                                "span (/info's input_types.document says which context)")
    task: Literal[tuple(JINA_TASKS)] | None = Field(None, description="Jina's task: *.query embeds queries, every other task "
                                                    "documents (this model has no task adapters)")
    truncate: bool = Field(False, description="cut inputs (with late_chunking: the joined document) longer than max_length "
                           "tokens instead of answering 413")
    embedding_type: Literal["float", "base64", "binary", "ubinary"] | None = Field(
        None, description="Jina's output type: base64 as encoding_format base64; binary and ubinary pack the signs eight to "
        "a byte (int8 in offset binary, uint8)")
    normalized: bool = Field(True, description="Jina's: L2-normalised vectors; false gives the pooled hidden states as they are")
    input_type: InputType | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.late_chunking and not (isinstance(self.input, str) or isinstance(self.input[0], str)):
            raise ValueError("late_chunking takes texts (the chunks of one document), not token ids")
        return self

    @property
    def dtype(self) -> str:
        """float, binary or ubinary (service.vector_formats)."""
        return self.embedding_type if self.embedding_type in ("binary", "ubinary") else "float"

    @property
    def base64(self) -> bool:
        return self.encoding_format == "base64" or self.embedding_type == "base64"


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


# -- Voyage's contextualized chunk embeddings ---------------------------------------------------
Chunks = Annotated[list[Text], Field(min_length=1, description="one document: its chunks in order (or one query)")]


class ContextualizedEmbeddingRequest(_Strict):
    inputs: Annotated[list[Chunks], Field(min_length=1, json_schema_extra=deployment_max_items("max_inputs"),
                                          description="documents, each a list of its consecutive chunks, embedded in one pass")]
    model: str = Field(description="any name; the answer names the model this server runs")
    input_type: InputType | None = None
    output_dimension: Dimensions | None = Field(None, description="keep the first output_dimension values, renormalised")
    output_dtype: Literal["float", "binary", "ubinary"] | None = Field(
        None, description="float, or binary / ubinary (signs packed eight to a byte: int8 in offset binary, uint8); not "
        "Voyage's int8 and uint8, which need a scale calibrated for the model's values that this model does not have")
    encoding_format: Literal["base64"] | None = Field(None, description="base64: each vector as base64 of its bytes "
                                                      "(float32 or int8 / uint8, little-endian)")


class ContextualizedChunk(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | list[int] | str
    index: int


class ContextualizedDocument(BaseModel):
    object: Literal["list"] = "list"
    data: list[ContextualizedChunk]
    index: int


class ContextualizedUsage(BaseModel):
    total_tokens: int


class ContextualizedEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ContextualizedDocument]
    model: str
    usage: ContextualizedUsage


# -- attention maps --------------------------------------------------------------------------
Head = _int(ge=0, json_schema_extra=deployment_maximum("head_max"))
PositiveInt = _int(ge=1)
TokenRange = Annotated[list[_int(ge=0)], Field(min_length=2, max_length=2, description="[start, stop): token indices, start < stop")]


class AttentionRequest(_Strict):
    inputs: Text
    layer: Int = Field(ge=0, json_schema_extra=deployment_maximum("layer_max"), description="0 .. num_layers - 1 (see /info)")
    head: Head | None = Field(
        None, description="0 .. num_heads - 1, or null for the mean over heads")
    format: Literal["sparse", "grid", "png"] = "sparse"
    max_cells: Int = Field(64, ge=1, le=2048, description="grid and png: at most this many cells per side")
    top_k: PositiveInt | None = Field(None, description="sparse: keep the k largest weights of each query (within key_range)")
    truncate: bool = Field(False, description="cut a text longer than the maps' limit (/info attention_max_length), or whose map would pass the server's memory or answer limits, to the longest that fits instead of answering 413")
    query_range: TokenRange | None = Field(None, description="only the queries start .. stop - 1 (token indices, [CLS] is 0; stop at most n_tokens); null: all")
    key_range: TokenRange | None = Field(None, description="only the keys start .. stop - 1; null: all")

    @model_validator(mode="after")
    def _check_ranges(self):
        for name in ("query_range", "key_range"):
            value = getattr(self, name)
            if value is not None and value[0] >= value[1]:
                raise ValueError(f"{name} [{value[0]}, {value[1]}] is empty: send [start, stop] with start < stop")
        return self


class _AttentionCommon(BaseModel):
    variant: str = Field(description="the deployment's variant or schedule (a variant per layer)")
    layer: int
    layer_variant: str = Field(description="the variant this layer runs: its pattern is what the map shows")
    head: int | None
    n_tokens: int
    tokens: list[str]
    offsets: list[list[int]] = Field(description="each token's [start_char, end_char) in inputs ([0, 0] for [CLS] and [SEP])")
    query_range: list[int] = Field(description="[start, stop) of the queries answered (token indices)")
    key_range: list[int] = Field(description="[start, stop) of the keys answered")
    rank_collapse: list[float] = Field(description="per layer: ||X - 1 x^T|| / ||X||, sqrt(l1 * linf) norm")


class SparseAttentionResponse(_AttentionCommon):
    format: Literal["sparse"] = "sparse"
    rows: list[int]
    cols: list[int]
    values: list[float]


class GridAttentionResponse(_AttentionCommon):
    format: Literal["grid"] = "grid"
    cell_tokens: int = Field(description="tokens per cell side")
    grid: list[list[float]] = Field(description="mean attention of the queries in row-cell i on the keys in column-cell j (summed), over query_range x key_range")


# -- rank collapse ---------------------------------------------------------------------------
CollapsePath = Literal[COLLAPSE_PATHS]


class RankCollapseRequest(_Strict):
    inputs: Text
    paths: list[CollapsePath] = Field(
        list(COLLAPSE_PATHS), min_length=1, max_length=len(COLLAPSE_PATHS), json_schema_extra={"uniqueItems": True},
        description="model: the model itself; attention_only: skip connections and MLPs removed (pure self-attention); "
        "attention_skip: MLPs removed; attention_mlp: skip connections removed. Each is one pass through the same weights")
    truncate: bool = Field(False, description="cut a text longer than this route's limit (/info rank_collapse_max_length) to it instead of answering 413")

    @model_validator(mode="after")
    def _check_paths(self):
        twice = sorted({p for p in self.paths if self.paths.count(p) > 1})
        if twice:
            raise ValueError(f"paths lists {twice[0]!r} more than once: send each path once")
        return self


class RankCollapseResponse(BaseModel):
    variant: str = Field(description="the deployment's variant or schedule")
    layer_variants: list[str] = Field(description="the variant each layer runs, layer 0 first")
    n_tokens: int
    embeddings: float = Field(description="the ratio of the embeddings' output, where every path starts")
    paths: dict[str, list[float]] = Field(
        description="per path asked for, per layer: ||X - 1 x^T|| / ||X|| of the layer's output along the path (x the mean "
        "token, sqrt(l1 * linf) norm; near 0: every token has the same vector)")


# -- service ---------------------------------------------------------------------------------
class BatchingLimits(BaseModel):
    max_batch_tokens: int
    max_batch_requests: int
    batch_order: Literal["length", "arrival"]
    max_concurrent_requests: int
    max_client_batch_size: int
    max_body_bytes: int


class PoolingInfo(BaseModel):
    mode: Literal["mean", "cls", "lasttoken", "opening"]
    opening_weight: float | None = Field(None, description="pooling=opening only")
    opening_tokens: int | None = Field(None, description="pooling=opening only")


class ModelInfo(BaseModel):
    name: str = Field(description="the model folder's name (all-MiniLM-L6-v2: the bundled model)")
    sha256: str = Field(description="sha256 of the model's model.safetensors")
    pooling: str = Field(description="the model's own pooling (its sentence-transformers Pooling module): mean, cls or lasttoken")
    normalize: bool = Field(description="whether the model L2-normalises its vectors (a Normalize module)")
    architecture: str | None = Field(None, description="bert, xlm-roberta, modernbert, nomic_bert or gte (null: an export older than this field)")
    max_positions: int | None = Field(None, description="the positions the model was trained with (its position table's rows, or a rotary model's max_position_embeddings)")
    max_seq_length: int | None = Field(None, description="the length its sentence-transformers folder says it was trained at (sentence_bert_config.json)")
    position_scaling: str | None = Field(None, description="how a rotary model's positions scale past max_positions, where they do (RoPE with dynamic NTK scaling: per document, so a vector never depends on its batch); null: they do not")


class InfoResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model_name: str
    model: ModelInfo | None = Field(None, description="the model the export was made from (null: an export older than this field)")
    variant: str = Field(description="the attention variant, or the schedule (a variant per layer, e.g. linformer*5,longformer)")
    layer_variants: list[str] = Field(description="the variant each layer runs, layer 0 first")
    precision: str = Field(description="of the export's weight matrix products: float32, int8 (CPUs) or float16 (GPUs)")
    parameters: dict
    pooling: PoolingInfo
    max_length: int
    past_trained_length: bool = Field(description="whether max_length is past the positions the model was trained with (max_positions): positions past them are stretched (a learned table) or extrapolated (rotary, served only where every layer's span is bounded)")
    hidden_size: int
    num_layers: int
    num_heads: int
    provider: str
    model_sha256: str | None
    weights_sha256: str | None = Field(None, description="sha256 of the adapted weights the export carries (null: the pretrained model's)")
    batching: BatchingLimits
    chunk_context: ChunkContext = Field(description="/embed_chunks' context when a request names none")
    chunk_contexts: list[ChunkContext] = Field(description="the contexts /embed_chunks serves")
    input_types: dict[str, str] = Field(description="what a query and a document get here (input_type, Jina's task)")
    attention_max_length: int = Field(description="longest text /attention maps (0: the export has no analysis graph)")
    rank_collapse_paths: list[str] = Field(description="the paths /rank_collapse follows ([]: the export has no collapse graph)")
    rank_collapse_max_length: int = Field(description="longest text /rank_collapse takes (0: none)")
    version: str


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class TEIError(BaseModel):
    error: str
    error_type: str


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail
    detail: str | None = Field(None, description="the message again, in Voyage's form (/v1/contextualizedembeddings only)")
