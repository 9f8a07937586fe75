"""Pydantic models for every request and response body."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


def _check_text(text: str) -> str:
    """Refuse what no tokenizer should see: empty strings, NUL characters, lone surrogates."""
    if text == "":
        raise ValueError("empty string: send at least one character")
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


Text = Annotated[str, AfterValidator(_check_text)]
TextOrTexts = Annotated[Text | Annotated[list[Text], Field(min_length=1)], Field(description="one text or a non-empty list of texts")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True)


# -- text-embeddings-inference ---------------------------------------------------------------
class EmbedRequest(_Strict):
    inputs: TextOrTexts
    truncate: bool = Field(False, description="cut inputs longer than max_length tokens instead of answering 413")
    normalize: bool = Field(True, description="L2-normalised embeddings; false returns the mean-pooled hidden states as they are")


Span = Annotated[list[int], Field(min_length=2, max_length=2, description="[start_char, end_char): Python string indices (Unicode code points)")]


class EmbedChunksRequest(_Strict):
    inputs: TextOrTexts
    chunk_tokens: int = Field(256, ge=1, description="document tokens per chunk ([CLS] and [SEP] join the first and last chunk)")
    overlap_tokens: int = Field(0, ge=0, description="tokens each chunk shares with the one before; less than chunk_tokens")
    spans: list[Span] | list[list[Span]] | None = Field(
        None,
        description="your own chunk boundaries instead of chunk_tokens: [[start_char, end_char], ...] for one input, "
        "one such list per input for a list; in order, not overlapping, each holding at least one token",
    )
    truncate: bool = Field(False, description="cut inputs longer than max_length tokens instead of answering 413; chunks then cover the kept part")
    normalize: bool = Field(True, description="L2-normalised chunk vectors; false returns the mean hidden states as they are")

    @model_validator(mode="after")
    def _check(self):
        if self.overlap_tokens >= self.chunk_tokens:
            raise ValueError(f"overlap_tokens ({self.overlap_tokens}) must be less than chunk_tokens ({self.chunk_tokens})")
        if self.spans is not None:
            one_text = isinstance(self.inputs, str)
            nested = bool(self.spans) and isinstance(self.spans[0][0], list)
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


class EmbedAllRequest(_Strict):
    inputs: TextOrTexts
    truncate: bool = False


TokenId = Annotated[int, Field(ge=0)]


class DecodeRequest(_Strict):
    ids: Annotated[list[TokenId], Field(min_length=1)] | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    skip_special_tokens: bool = True


class TokenizeRequest(_Strict):
    inputs: TextOrTexts
    add_special_tokens: bool = True
    truncate: bool = False


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(None, description="character offset of the token's start (null for token-id input)")
    stop: int | None = None


# -- OpenAI embeddings -----------------------------------------------------------------------
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class OpenAIEmbeddingRequest(_Strict):
    input: Annotated[
        Text | Annotated[list[Text], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)],
        Field(description="a text, a list of texts, a list of token ids, or a list of token-id lists"),
    ]
    model: str = Field(description="any name; the answer names the model this server runs")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="keep the first `dimensions` values, renormalised")
    user: str | None = None


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


# -- attention maps --------------------------------------------------------------------------
class AttentionRequest(_Strict):
    inputs: Text
    layer: int = Field(ge=0, description="0 .. num_layers - 1 (see /info)")
    head: int | None = Field(None, ge=0, description="0 .. num_heads - 1, or null for the mean over heads")
    format: Literal["sparse", "grid", "png"] = "sparse"
    max_cells: int = Field(64, ge=1, le=2048, description="grid and png: at most this many cells per side")
    top_k: int | None = Field(None, ge=1, description="sparse: keep the k largest weights of each query")
    truncate: bool = False


class _AttentionCommon(BaseModel):
    variant: str
    layer: int
    head: int | None
    n_tokens: int
    tokens: list[str]
    rank_collapse: list[float] = Field(description="per layer: ||X - 1 x^T|| / ||X||, sqrt(l1 * linf) norm")


class SparseAttentionResponse(_AttentionCommon):
    format: Literal["sparse"] = "sparse"
    rows: list[int]
    cols: list[int]
    values: list[float]


class GridAttentionResponse(_AttentionCommon):
    format: Literal["grid"] = "grid"
    cell_tokens: int = Field(description="tokens per cell side")
    grid: list[list[float]] = Field(description="mean attention of the queries in row-cell i on the keys in column-cell j (summed)")


# -- service ---------------------------------------------------------------------------------
class BatchingLimits(BaseModel):
    max_batch_tokens: int
    max_batch_requests: int
    max_concurrent_requests: int
    max_client_batch_size: int
    max_body_bytes: int


class PoolingInfo(BaseModel):
    mode: Literal["mean", "cls", "opening"]
    opening_weight: float | None = Field(None, description="pooling=opening only")
    opening_tokens: int | None = Field(None, description="pooling=opening only")


class InfoResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())
    model_name: str
    variant: str
    parameters: dict
    pooling: PoolingInfo
    max_length: int
    hidden_size: int
    num_layers: int
    num_heads: int
    provider: str
    model_sha256: str | None
    weights_sha256: str | None = Field(None, description="sha256 of the adapted weights the export carries (null: the pretrained model's)")
    batching: BatchingLimits
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
