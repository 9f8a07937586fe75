"""The contract between exporting and serving: what an export directory holds and how to call it.

attnserve.export.exporter writes exports through this module and attnserve.service reads them
through it; it needs numpy and pydantic only (no torch, nothing from attnserve.models), so it
is the one module both sides import. An export directory holds:

    model.onnx (+ model.onnx.data)       the embedding graph: input_ids, attention_mask ->
                                         sentence_embedding, last_hidden_state (exports made
                                         before analysis.onnx held it: rank_collapse too)
    analysis.onnx (+ analysis.onnx.data) the attention maps of every layer, compact form, and
                                         rank_collapse (one ratio per layer)
    collapse.onnx (+ collapse.onnx.data) written with analysis.onnx: the rank-collapse ratio
                                         per layer along each path of graphs.collapse.paths
    short.onnx (+ short.onnx.data)       only for variants exact on short inputs: the embedding
                                         graph with full attention, unpadded, for inputs up to
                                         graphs.short.max_length tokens
    tokenizer.json                       the model's tokenizer
    adapt.json                           only with adapted weights: their DIR/adapt.json
    manifest.json                        `Manifest`: what was exported, file hashes, how to call it

Every graph takes sequences padded to its `length_multiple` (`pad_to`), and every file is
checked against the manifest's size and sha256 before anything is served (`check_files`).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from attnserve.contract.schedule import schedule_slug

FORMAT = "attnserve-onnx/1"
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
GRAPH_FILES = ("model.onnx", "model.onnx.data", "analysis.onnx", "analysis.onnx.data", "collapse.onnx", "collapse.onnx.data",
               "short.onnx", "short.onnx.data")
INPUT_NAMES = ["input_ids", "attention_mask"]
EMBEDDING_OUTPUTS = ["sentence_embedding", "last_hidden_state"]
# Each layer's rank-collapse ratio, (batch, num_layers): an output of the analysis graph, computed
# beside the maps (in the embedding graph it held every layer's output until the last layer and
# slowed every embedding; exports made before still have it there, and are served as they are).
RANK_COLLAPSE_OUTPUT = "rank_collapse"
MIN_LENGTH = 2
# The paths through the same weights that "Attention is not all you need" (Dong, Cordonnier and
# Loukas 2021) compares, each a collapse graph output: the model itself; attention_only (skip
# connections and MLPs removed: pure self-attention, which loses rank doubly exponentially with
# depth); attention_skip (MLPs removed); attention_mlp (skips removed).
COLLAPSE_PATHS = ("model", "attention_only", "attention_skip", "attention_mlp")


# Adapted weights (`attnserve adapt variant --out DIR`): DIR holds these two; an export made with them
# carries DIR's adapt.json, and serving names its cache entry by the weights' sha256.
WEIGHTS_FILE = "weights.safetensors"
META_FILE = "adapt.json"
EXPORT_COMMAND = "attnserve export --variant VARIANT [--param KEY=VALUE ...] --max-length N --out DIR"
# The numeric precision of an export's weight matrix products (src/attnserve/export/precision.py):
# float32 as trained; int8, ONNX Runtime's dynamic quantization, for CPUs; float16 for GPUs.
# Inputs and outputs are the same in all three.
PRECISIONS = ("float32", "int8", "float16")
DEFAULT_PRECISION = "float32"


class ExportError(Exception):
    """The export directory cannot be served: a file is missing, corrupt or does not match
    manifest.json. The message names the file."""


class WeightsError(ValueError):
    """Adapted weights that cannot be applied; the message names the file and what to change."""


# --------------------------------------------------------------------------- manifest


class _Record(BaseModel):
    # Entries this reader does not know are kept as written (a newer exporter's notes).
    model_config = ConfigDict(extra="allow")


class FileRecord(_Record):
    sha256: str
    bytes: int | None = None


class Graph(_Record):
    """One ONNX graph of the export: its file and output names, in the graph's order."""
    file: str
    outputs: list[str]
    # Longest input in tokens the graph takes (None: the export's max_length).
    max_length: int | None = None


class ShortGraph(Graph):
    max_length: int
    length_multiple: int = 1
    attention: str = "full"
    verified: dict[str, Any] | None = None


class AnalysisGraph(Graph):
    max_length: int
    # Per layer, per piece of its SlotWeights: the output names of rows, cols and probs.
    attention: list[list[dict[str, str]]]


class CollapseGraph(Graph):
    max_length: int
    # Path name (model, attention_only, attention_skip, attention_mlp) -> its output, (batch,
    # 1 + num_layers): the ratio of the embeddings' output, then of each layer's along the path.
    paths: dict[str, str]


class Graphs(_Record):
    embedding: Graph
    short: ShortGraph | None = None
    analysis: AnalysisGraph | None = None
    collapse: CollapseGraph | None = None


class WeightsRecord(_Record):
    sha256: str
    dir: str | None = None
    tensors: int | None = None


class ModelRecord(_Record):
    """The model an export was made from (contract.model_folder.ModelFolder.describe): its
    name and the sha256 of its weights, its pooling and whether it normalises."""
    name: str
    sha256: str
    pooling: str = "mean"
    normalize: bool = True


class Manifest(_Record):
    """manifest.json, typed. `recipe` is everything the graphs depend on (the export is cached
    under its digest, `recipe_sha256`); `files` maps every file of the export to its size and hash."""
    format: str = FORMAT
    model: ModelRecord | None = None  # older exports: none (the bundled all-MiniLM-L6-v2, mean-pooled, normalised)
    variant: str
    parameters: dict[str, Any] = {}
    requested_parameters: dict[str, Any] = {}
    max_length: int
    length_multiple: int
    min_length: int = MIN_LENGTH
    max_batch: int = 1 << 30
    hidden_size: int
    num_layers: int
    num_heads: int
    layer_variants: list[str] = []  # the variant each layer runs (a schedule's differ); older exports: none
    precision: str = DEFAULT_PRECISION  # of the weight matrix products (PRECISIONS)
    opset: int | None = None
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    graphs: Graphs
    files: dict[str, FileRecord]
    sha256: str | None = None
    weights: WeightsRecord | None = None
    verified: dict[str, Any] | None = None
    versions: dict[str, str | None] = {}
    recipe: dict[str, Any] = {}
    recipe_sha256: str | None = None
    created: str | None = None
    export_seconds: float | None = None

    def as_json(self) -> dict:
        """The manifest as JSON data: the entries it was made or read with, none added."""
        return self.model_dump(mode="json", exclude_unset=True)

    def graph_files(self, graph: str) -> list[str]:
        """The files ONNX Runtime loads for one graph: the .onnx and its external data, if any."""
        main = getattr(self.graphs, graph).file
        return [main] + ([main + ".data"] if main + ".data" in self.files else [])

    def describe(self) -> str:
        precision = "" if self.precision == DEFAULT_PRECISION else f" in {self.precision}"
        return (f"{self.variant}{precision} at {self.max_length} tokens, made {self.created or '?'} by attnserve "
                f"{self.recipe.get('attnserve', '?')} (code {str(self.recipe.get('code_sha256', '?'))[:10]}) with torch "
                f"{self.versions.get('torch', '?')}")


def read_manifest(export_dir) -> Manifest:
    """export_dir/manifest.json as a Manifest; ExportError naming the file and the fix when it is
    missing, not JSON, of another format or lacks what serving needs."""
    path = Path(export_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ExportError(f"{path}: missing (not an attnserve export directory; run `attnserve export`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{path}: not valid JSON ({exc})") from exc
    found = data.get("format") if isinstance(data, dict) else None
    if found != FORMAT:
        raise ExportError(f"{path}: not an {FORMAT} manifest (format {found!r}); this attnserve serves {FORMAT} exports "
                          f"only: make the export again with `{EXPORT_COMMAND}`")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise ExportError(f"{path}: {problems}; make the export again with `{EXPORT_COMMAND}`") from None


def write_manifest(export_dir, manifest: Manifest) -> Path:
    path = Path(export_dir) / MANIFEST_FILE
    path.write_text(json.dumps(manifest.as_json(), indent=2) + "\n")
    return path


def file_records(export_dir, names) -> dict[str, FileRecord]:
    """Size and sha256 of each named file that exists in export_dir (what the manifest lists)."""
    export_dir = Path(export_dir)
    return {name: FileRecord(sha256=sha256(export_dir / name), bytes=(export_dir / name).stat().st_size)
            for name in names if (export_dir / name).exists()}


def check_files(export_dir, manifest: Manifest, names=None) -> None:
    """Every named file (default: every file manifest.json lists) exists and has the size and
    sha256 manifest.json records. All sizes are checked before any file is hashed, so a
    truncated file is named at once."""
    export_dir = Path(export_dir)
    files = manifest.files
    names = list(files if names is None else names)
    fix = (f"the export is damaged: delete {export_dir} and start `attnserve serve` again to export it anew, "
           f"or write it again with `attnserve export`")
    for name in names:
        path = export_dir / name
        if name not in files:
            raise ExportError(f"{path}: not listed in {export_dir / MANIFEST_FILE}; {fix}")
        if not path.is_file():
            raise ExportError(f"{path}: missing (manifest.json lists it); {fix}")
        expected = files[name].bytes
        size = path.stat().st_size
        if expected is not None and size != expected:
            raise ExportError(f"{path}: {size} bytes, manifest.json says {expected} (file changed or truncated); {fix}")
    for name in names:
        actual = sha256(export_dir / name)
        if actual != files[name].sha256:
            raise ExportError(f"{export_dir / name}: sha256 {actual[:16]}... does not match manifest.json "
                              f"({files[name].sha256[:16]}...); {fix}")


# --------------------------------------------------------------------------- digests


def sha256(path) -> str:
    """Hex sha256 of a file, read in 1 MiB pieces (the manifest records it per file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def code_sha256() -> str:
    """sha256 of the code of the `models` and `export` packages (what builds an export's graphs),
    read as files beside this package's (one distribution installs them all), so that a machine
    without torch, where they cannot be imported, computes it too. Comments, blank lines and
    docstrings are left out (code_tokens): an edit of the words about the code makes no new
    export."""
    root = Path(__file__).resolve().parents[1]
    paths = sorted(p for package in ("models", "export") for p in (root / package).rglob("*.py"))
    # Tokenizing takes 0.1 s and every recipe's name asks: kept while no file's stat changes.
    stamp = tuple((str(p), st.st_mtime_ns, st.st_size) for p, st in ((p, p.stat()) for p in paths))
    if _CODE_DIGEST.get("stamp") != stamp:
        digest = hashlib.sha256()
        for path in paths:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + code_tokens(path.read_bytes()) + b"\0")
        _CODE_DIGEST.update(stamp=stamp, digest=digest.hexdigest())
    return _CODE_DIGEST["digest"]


_CODE_DIGEST: dict = {}


def code_tokens(source: bytes) -> bytes:
    """A Python source's tokens without its comments, blank lines and statements that are a lone
    string (docstrings: they compute nothing), one per line with its type; the source as it is
    when it does not tokenize."""
    import io
    import tokenize

    try:
        tokens = [t for t in tokenize.tokenize(io.BytesIO(source).readline) if t.type not in (tokenize.COMMENT, tokenize.NL)]
    except (tokenize.TokenError, SyntaxError):
        return source
    kept, starts = [], (tokenize.ENCODING, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for i, token in enumerate(tokens):
        lone_string = (token.type == tokenize.STRING and i > 0 and tokens[i - 1].type in starts
                       and i + 1 < len(tokens) and tokens[i + 1].type in (tokenize.NEWLINE, tokenize.ENDMARKER))
        if lone_string:
            continue
        if token.type == tokenize.NEWLINE and kept and kept[-1][0] in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            continue  # the end of a statement left out
        kept.append((token.type, token.string))
    return "\n".join(f"{kind} {text}" for kind, text in kept).encode()


def package_version(name: str) -> str | None:
    """An installed distribution's version, without importing it (None when absent)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def recipe_sha256(recipe: dict) -> str:
    """The digest an export is cached under: of everything its recipe lists."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()


def export_name(recipe: dict) -> str:
    """The folder of a models directory that holds the export of `recipe` (the exporter's
    --print-recipe): where `attnserve serve --models-dir` looks, and where the exporter's own
    cache (attnserve.export.exporter.cached_export) puts it. An own model's export starts with
    the model's name (`my-model--longformer-L16384-<digest>`), and an int8 or float16 export
    says so in its name too."""
    precision = recipe.get("precision", DEFAULT_PRECISION)
    spelled = "" if precision == DEFAULT_PRECISION else f"{precision}-"
    model = (recipe.get("model") or {}).get("name") or BUNDLED_MODEL_NAME
    named = "" if model == BUNDLED_MODEL_NAME else f"{_slug(model)}--"
    return f"{named}{schedule_slug(recipe['variant'])}-L{recipe['max_length']}-{spelled}{recipe_sha256(recipe)[:12]}"


# The model an export holds unless its recipe names another: its folders go without a model name.
BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"


def _slug(name: str) -> str:
    """A model's name as part of a folder name: letters, digits, '.', '_' and '-' only, at most 40."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:40] or "model"


# --------------------------------------------------------------------------- rank collapse


def check_collapse_paths(paths, valid=COLLAPSE_PATHS) -> None:
    """ValueError naming the first of `paths` that is not in `valid`, or saying none was asked
    for: the one rule the PyTorch encoder and the served collapse graph both apply."""
    if not paths:
        raise ValueError(f"no rank-collapse path asked for: choose from {', '.join(valid)}")
    unknown = [p for p in paths if p not in valid]
    if unknown:
        raise ValueError(f"unknown rank-collapse path {unknown[0]!r}: choose from {', '.join(valid)}")


# --------------------------------------------------------------------------- inputs


def padded_width(n: int, multiple: int, minimum: int = MIN_LENGTH) -> int:
    """The sequence length a graph of granule `multiple` runs n tokens at."""
    return max(-(-n // multiple), -(-minimum // multiple)) * multiple


def pad_to(ids: np.ndarray, mask: np.ndarray, multiple: int, minimum: int = MIN_LENGTH):
    """Right-pad (B, N) ids/mask with zeros (attention mask 0) to a multiple of `multiple`, and
    to at least `minimum`: the sequence granule every exported graph takes. int64 out."""
    ids, mask = np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.int64)
    width = padded_width(ids.shape[1], multiple, minimum)
    if width == ids.shape[1]:
        return ids, mask
    pad = ((0, 0), (0, width - ids.shape[1]))
    return np.pad(ids, pad), np.pad(mask, pad)


def parse_param(pair: str) -> tuple[str, Any]:
    """One `--param KEY=VALUE` flag: VALUE as JSON where it is JSON (512, true, [0, 5]), else the
    text itself (recurrent, 0,5); the variant's config converts it to its field's type.
    ValueError naming a malformed flag."""
    key, sep, raw = str(pair).partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--param takes KEY=VALUE (got {pair!r})")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw.strip()
    return key.strip(), value


def parse_params(pairs) -> dict[str, Any]:
    """`--param KEY=VALUE` flags (repeatable) as a dict (parse_param)."""
    return dict(parse_param(pair) for pair in pairs)


def param_arg(key: str, value: Any) -> str:
    """KEY=VALUE as a `--param` flag that parse_param reads back as `value`."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value, separators=(',', ':'))}"


def weights_file(weights_dir) -> Path:
    """DIR/weights.safetensors, checked to exist (WeightsError naming what is missing)."""
    weights_dir = Path(weights_dir)
    if not weights_dir.is_dir():
        raise WeightsError(f"{weights_dir}: no such weights directory; pass a directory written by `attnserve adapt variant --out DIR`")
    path = weights_dir / WEIGHTS_FILE
    if not path.is_file():
        raise WeightsError(f"{path}: missing; a weights directory holds {WEIGHTS_FILE} (and {META_FILE}) "
                           f"as `attnserve adapt variant --out DIR` writes them")
    return path
