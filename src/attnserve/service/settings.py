"""Every setting of `attnserve serve`: an ATTNSERVE_* environment variable and a CLI flag.

The CLI flags are generated from the fields below (see `add_settings_arguments`), so a new
setting is one new field here and nothing else.
"""
from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from attnserve.contract.export_format import DEFAULT_PRECISION, PRECISIONS, parse_params
from attnserve.contract.model_folder import (
    DEFAULT_MAX_LENGTH,
    DEFAULT_VARIANT,
    read_model_folder,
)
from attnserve.contract.pooling import (
    DEFAULT_CHUNK_CONTEXT,
    DEFAULT_POOLING,
    ChunkContext,
    Pooling,
)
from attnserve.model_source import resolve_model

VERSION = "0.1.0"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ATTNSERVE_", extra="forbid")

    # What to serve.
    model: Path | None = Field(None, description="sentence-transformers folder of a BERT, XLM-RoBERTa, ModernBERT, NomicBERT or GTE model to serve (config.json, model.safetensors, tokenizer.json, modules.json; exported on first start; none: the bundled all-MiniLM-L6-v2), or a Hugging Face Hub id org/name, looked up in the Hugging Face cache first and fetched only when missing and HF_HUB_OFFLINE is unset")
    revision: str | None = Field(None, description="with a Hub id as model: its branch, tag or commit (none: main)")
    variant: str | None = Field(None, description="attention variant, or a schedule of one per layer such as linformer*5,longformer; native: the model's own attention, in every layer or in those a schedule names it (see `attnserve variants`)", json_schema_extra={"shown_default": f"{DEFAULT_VARIANT}; a rotary model, NomicBERT, GTE or ModernBERT: native"})
    params: dict[str, Any] = Field(default_factory=dict, description="variant parameters (JSON object; CLI: --param key=value, repeatable)")
    max_length: int | None = Field(None, ge=2, description="longest input in tokens, [CLS] and [SEP] included", json_schema_extra={"shown_default": f"{DEFAULT_MAX_LENGTH}; a rotary model, NomicBERT, GTE or ModernBERT: its trained length, max_position_embeddings"})
    models_dir: Path = Field(Path("~/.cache/attnserve"), description="directory holding one export per recipe: variant, resolved parameters, max_length, weights, attnserve code, torch/onnx versions")
    export_dir: Path | None = Field(None, description="serve this export directory instead of one under models_dir")
    weights: Path | None = Field(None, description="adapted weights to serve (a directory `attnserve adapt` wrote); exported with them on first start")
    precision: Literal[PRECISIONS] = Field(DEFAULT_PRECISION, description="of the export's weight matrix products: float32 (as trained), int8 (dynamic quantization: for CPUs) or float16 (for GPUs); exported so on first start (`attnserve variants` lists the variants that cannot take one)")
    model_name: str | None = Field(None, description="model name reported by /v1/embeddings and /info (none: attnserve-<variant served>)")
    pooling: Literal["mean", "cls", "lasttoken", "opening"] | None = Field(None, description="token vectors -> one vector for /embed and /v1/embeddings: mean of all tokens, the [CLS] token, the last token, or opening (the first opening_tokens tokens' mean mixed with the whole mean; texts of at most opening_tokens tokens get the mean)", json_schema_extra={"shown_default": f"{DEFAULT_POOLING}; the model's own where it is cls or lasttoken"})
    opening_weight: float = Field(Pooling.opening_weight, ge=0.0, le=1.0, description="pooling=opening: weight of the opening's mean (1 - it: the whole mean's)")
    opening_tokens: int | None = Field(None, ge=1, description="pooling=opening: document tokens in the opening ([CLS] joins them), counted as /embed_chunks counts chunk_tokens", json_schema_extra={"shown_default": "the length the model was trained at, its sentence_bert_config.json max_seq_length (256 for all-MiniLM-L6-v2)"})

    chunk_context: ChunkContext = Field(DEFAULT_CHUNK_CONTEXT, description="/embed_chunks' context when a request names none: none (each chunk embedded alone: the best measured on the bundled man pages, and the cheapest) or late (each chunk the mean of its tokens from one pass over the document)")
    # Where to listen.
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8080, ge=0, le=65535, description="port to bind")
    api_key: SecretStr | None = Field(None, description="if set, every route but /health and /ready needs 'Authorization: Bearer <key>' (empty or blank: refused at startup)")
    api_key_file: Path | None = Field(None, description="read api_key from this file (surrounding whitespace stripped), so the key stays out of the process list and the environment")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field("info", description="uvicorn log level")
    graceful_shutdown_timeout: float = Field(60.0, gt=0, description="seconds to finish accepted requests on shutdown")
    request_timeout: float = Field(300.0, ge=0, description="seconds a request may take from arrival to answer; past it the server stops its work and answers 504 (0: no deadline)")
    explorer_peers: Annotated[list[str], NoDecode] = Field(default_factory=list, description="URLs of other attnserve servers (http://host:port, CLI: comma separated) that /explorer's compare mode shows beside this one, and whose origins may call this server from a browser (CORS); list every server of a deployment on each (empty: no compare mode, no CORS)")

    # ONNX Runtime.
    providers: list[str] | None = Field(None, description="execution providers in order (CLI: comma separated; none: CUDA if this machine can run it, then CPU)")
    intra_op_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads (0: its default)")
    inter_op_threads: int = Field(0, ge=0, description="ONNX Runtime inter-op threads (0: its default)")
    arena_shrink_tokens: int = Field(8192, ge=0, description="a run of at least this many padded tokens (batch x length) gives ONNX Runtime's CPU memory arena back when it ends, so the process does not keep the peak of its longest documents (0: never; costs such runs about 15 to 25 percent on a CPU)")
    graph_optimization: Literal["disable", "basic", "extended", "all"] = Field("all", description="ONNX Runtime graph optimisation level")

    # Batching and limits.
    max_batch_tokens: int = Field(0, ge=0, description="tokens per inference batch, batch size x longest input padded to the export's length multiple (0: 2048 on CPU, 16384 on a GPU)")
    max_batch_requests: int = Field(32, ge=1, description="inputs per inference batch")
    batch_order: Literal["length", "arrival"] = Field("length", description="how a batch is filled after its first input (the round-robin's pick): length (the round-robin's request's longest waiting input, then the waiting inputs below it in length up to where a cut costs least, so little of the batch is padding) or arrival (in round-robin order, whatever their lengths)")
    max_concurrent_requests: int = Field(256, ge=1, description="requests accepted at once; more get 429")
    max_queued_tokens: int = Field(262144, ge=0, description="padded tokens the queue may hold (all waiting requests together); more get 429, a request over it alone 413 (0: no bound)")
    max_client_batch_size: int = Field(64, ge=1, description="inputs in one request")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="largest request body in bytes; larger get 413")
    max_attention_entries: int = Field(2_000_000, ge=1, description="largest sparse attention answer (non-zeros); ask for top_k or grid beyond it")
    max_request_memory_mb: int = Field(1024, ge=1, description="memory one request may need for its model outputs and its answer, estimated before any work; larger get 413")
    max_token_vectors: int = Field(16384, ge=1, description="most token vectors one /embed_all answer holds, and most chunk vectors one /embed_chunks answer holds (all its inputs together)")
    tokenization_workers: int = Field(2, ge=1, description="threads that tokenize")

    @field_validator("model", "models_dir", "export_dir", "weights")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @model_validator(mode="after")
    def _model_defaults(self) -> "Settings":
        """variant and max_length left unset: the model's (ModelFolder.default_variant and
        default_max_length; the bundled model's without --model), read from its folder; a Hub
        id as model is its folder in the Hugging Face cache (attnserve.model_source)."""
        if self.model is not None or self.revision is not None:
            self.model = resolve_model(self.model, self.revision, log=lambda message: print(message, file=sys.stderr))
        if self.variant is not None and self.max_length is not None:
            return self
        folder = read_model_folder(self.model) if self.model is not None else None
        if self.variant is None:
            self.variant = folder.default_variant if folder else DEFAULT_VARIANT
        if self.max_length is None:
            self.max_length = folder.default_max_length if folder else DEFAULT_MAX_LENGTH
        return self

    @field_validator("api_key")
    @classmethod
    def _no_blank_key(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty key must not read as "no key": that would serve without auth, silently.
        # Surrounding whitespace never arrives in a header, so it is not part of the key.
        if value is None:
            return None
        key = value.get_secret_value().strip()
        if not key:
            raise ValueError("api_key is empty or blank; set a key, or leave ATTNSERVE_API_KEY / --api-key unset to serve without auth")
        return SecretStr(key)

    @model_validator(mode="after")
    def _key_from_file(self) -> "Settings":
        if self.api_key_file is None:
            return self
        if self.api_key is not None:
            raise ValueError("api_key and api_key_file are both set; set one of them")
        path = self.api_key_file.expanduser()
        try:
            key = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"api_key_file {path}: cannot read it ({exc})") from None
        if not key:
            raise ValueError(f"api_key_file {path}: empty; write the key into it, or leave api_key_file unset to serve without auth")
        self.api_key = SecretStr(key)
        return self

    @field_validator("providers", "explorer_peers", mode="before")
    @classmethod
    def _split_providers(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if value.startswith("["):
                return json.loads(value)
            return [p.strip() for p in value.split(",") if p.strip()]
        return value



def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown_default(field) -> str:
    """The default a flag's help gives: a setting the model decides names what it comes to."""
    if isinstance(field.json_schema_extra, dict) and "shown_default" in field.json_schema_extra:
        return field.json_schema_extra["shown_default"]
    value = field.get_default(call_default_factory=True)
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, SecretStr):
        return "set"
    return str(value)


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per Settings field, its help ending in its default and environment variable;
    flags left out fall back to ATTNSERVE_* and defaults."""
    for name, field in Settings.model_fields.items():
        help_text = f"{field.description} (default: {_shown_default(field)}; env ATTNSERVE_{name.upper()})".replace("%", "%%")
        literal = next((a for a in (field.annotation, *typing.get_args(field.annotation)) if typing.get_origin(a) is Literal), None)
        choices = typing.get_args(literal) if literal is not None else None
        if name == "params":
            parser.add_argument("--param", dest="params", action="append", metavar="KEY=VALUE", help=help_text)
        else:
            parser.add_argument(_flag(name), dest=name, default=None, metavar=name.upper(), choices=choices, help=help_text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the flags given on the command line, then the environment, then defaults."""
    given: dict[str, Any] = {}
    for name in Settings.model_fields:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "params":
            value = parse_params(value)
        given[name] = value
    return Settings(**given)
