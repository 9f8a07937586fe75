"""Adapted weights: the tensors `attnserve adapt` trained, applied on top of the pretrained model.

A weights directory DIR holds:

    weights.safetensors   only the trained tensors, keyed by their LongContextEncoder.state_dict()
                          names (e.g. layers.0.attention.E); a tensor tied under two names (linformer
                          sharing='kv') is stored once, under its first name; its metadata names
                          the model (model_name, model_sha256)
    adapt.json            what was trained: at least "variant", "parameters" (the variant config),
                          "max_length", "model" (the name and weights sha256 of the model the
                          weights were trained on; none: the bundled all-MiniLM-L6-v2), plus
                          the trainer's own facts

A variant's position tables (Attention.position_tables: a row per token position) are stored
with the rows training reached and load into an encoder of any max_length: the rows both
have are copied and the encoder's others keep their initial values.

Weights of one variant apply layer by layer: a layer's tensors (layers.I.*) load into an
encoder whose layer I runs that variant, and are left unused (said once in the log) where it
runs another: weights adapted for linformer serve the linformer layers of
`linformer*5,longformer`. Weights adapted in a schedule serve that schedule only. Weights no
layer of the encoder can take are refused.

Weights run with the parameters they were trained with: an encoder of their own variant or
schedule whose parameters differ from adapt.json's (compressed.stride 3 for weights trained at
stride 2) is refused with the `--param` flags that fix it, since the tensors would load and
silently mean something else. `attnserve adapt` alone may start from them under other values.

load_weights checks everything it can before copying anything in, so a mismatch leaves the
encoder as it was and says which file and tensor to change.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

# The file names, the error and the existence check are the export format's (torch-free:
# serving names exports by the weights' sha256).
from attnserve.contract.export_format import META_FILE, WEIGHTS_FILE, WeightsError, param_arg, sha256, weights_file
from attnserve.contract.model_folder import describe_record
from attnserve.contract.schedule import schedule_text
from attnserve.models.schedule import layer_variants

__all__ = ["META_FILE", "WEIGHTS_FILE", "WeightsError", "check_weights_dir", "load_weights", "read_meta", "save_weights",
           "weights_file"]


def is_position_table(encoder: torch.nn.Module, name: str) -> bool:
    """Whether state_dict entry `name` is one of its variant's position tables."""
    owner, _, attribute = name.rpartition(".")
    try:
        module = encoder.get_submodule(owner)
    except AttributeError:
        return False
    return attribute in getattr(type(module), "position_tables", ())


def rows_differ_only(a: torch.Size, b: torch.Size) -> bool:
    """Whether two shapes of at least two dimensions differ in their second-to-last only."""
    return len(a) == len(b) >= 2 and a[:-2] + a[-1:] == b[:-2] + b[-1:]


def save_weights(encoder: torch.nn.Module, out_dir, names, position_rows: int = 0) -> str:
    """Write the state_dict entries `names` of `encoder` to out_dir/weights.safetensors (a
    tensor tied under several names once, under the first) and return the file's sha256.
    position_rows: keep only that many rows of the position tables (the ones training reached)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = encoder.state_dict()
    unknown = [n for n in names if n not in state]
    if unknown:
        raise WeightsError(f"{out_dir / WEIGHTS_FILE}: {', '.join(unknown)} not in the encoder's state_dict; "
                           f"name tensors as LongContextEncoder.state_dict() does")
    tensors, seen = {}, set()
    for name in names:
        tensor = state[name]
        # safetensors refuses tensors that share memory; a tied one is written once.
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        if position_rows and is_position_table(encoder, name):
            tensor = tensor[..., :position_rows, :]
        tensors[name] = tensor.detach().clone().contiguous()
    path = out_dir / WEIGHTS_FILE
    model = getattr(encoder, "model", None)
    # The model the tensors belong to travels in the file too (adapt.json says it as well).
    save_file(tensors, str(path), metadata={"model_name": model.name, "model_sha256": model.sha256} if model else None)
    sort_metadata(path)
    return sha256(path)


def sort_metadata(path: Path) -> None:
    """Rewrite a safetensors file's header with its metadata's keys in sorted order, so that the
    same tensors give the same bytes and sha256 on every save. safetensors writes the metadata
    in the order of a Rust HashMap, which is random per save (safetensors issue 584): the same
    `attnserve adapt` run gave weights of another sha256, hence another export recipe, each
    time. The header keeps its length (the same entries, reordered; padded with spaces, which
    the format allows), so the tensors' offsets stay as they are."""
    with open(path, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        metadata = header.get("__metadata__")
        if not metadata:
            return
        header["__metadata__"] = dict(sorted(metadata.items()))
        text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
        if len(text) > size:  # not safetensors' own compact form: leave the file as written
            return
        f.seek(8)
        f.write(text.ljust(size))


def read_meta(weights_dir) -> dict | None:
    """DIR/adapt.json as a dict, None when the directory has none."""
    path = Path(weights_dir) / META_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{path}: not valid JSON ({exc}); rewrite it with `attnserve adapt` or remove it") from exc
    if not isinstance(meta, dict):
        raise WeightsError(f"{path}: must hold a JSON object with 'variant', 'parameters' and 'max_length'")
    return meta


log = logging.getLogger("attnserve.models.weights")

LAYER_TENSOR = re.compile(r"layers\.(\d+)\.")


def trained_layers(meta: dict | None, layers) -> list[int] | None:
    """The layers of an encoder whose layers run `layers` (a variant name each) that take the
    weights: where it runs the variant adapt.json's names, for weights of one variant; every
    layer of the same schedule, for weights trained in a schedule (its layers learned together,
    so they serve only it). None without an adapt.json (nothing says, so every tensor applies)."""
    from attnserve.models.registry import variant_names
    from attnserve.models.schedule import parse_schedule

    if meta is None:
        return None
    layers = list(layers)
    try:
        trained = list(parse_schedule(str(meta.get("variant")), variant_names(), len(layers)))
    except ValueError:
        return []
    if len(set(trained)) > 1:
        return list(range(len(layers))) if trained == layers else []
    return [i for i, (a, b) in enumerate(zip(trained, layers)) if a == b]


def file_model(path) -> dict | None:
    """The model weights.safetensors' metadata names (save_weights writes it), None where it
    names none or cannot be read (load_weights then says what is wrong with the file)."""
    try:
        with safe_open(str(path), "pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError):
        return None
    if not metadata.get("model_sha256"):
        return None
    return {"name": metadata.get("model_name", "?"), "sha256": metadata["model_sha256"]}


def check_weights_dir(weights_dir, layers, model=None) -> dict | None:
    """The directory holds weights.safetensors and, when it has an adapt.json, was trained for
    the variant of some of `layers` (each layer's variant name) or for their schedule, and on `model` (a
    ModelFolder; adapt.json's "model", else weights.safetensors' metadata's, else the bundled
    all-MiniLM-L6-v2 where an adapt.json names none);
    returns that adapt.json (None without one). WeightsError otherwise."""
    weights_dir = Path(weights_dir)
    weights_file(weights_dir)
    meta = read_meta(weights_dir)
    trained_on = (meta or {}).get("model") or file_model(weights_dir / WEIGHTS_FILE)
    if model is not None and (meta is not None or trained_on) and not model.same_as(trained_on):
        raise WeightsError(f"weights in {weights_dir} were trained for the model {describe_record(trained_on)}, "
                           f"not {describe_record(model.record)} ({model.dir}); serve them with the model they were "
                           f"trained for (--model), or adapt this model (see {weights_dir / META_FILE})")
    if trained_layers(meta, layers) == []:
        trained_for, variant = meta.get("variant"), schedule_text(layers)
        raise WeightsError(f"weights in {weights_dir} were trained for {trained_for}, not {variant}; "
                           f"use variant {trained_for!r} (or a schedule with its layers) with them or adapt {variant} "
                           f"(see {weights_dir / META_FILE})")
    return meta


def parameter_mismatch(meta: dict | None, config) -> dict:
    """{key: (trained, encoder's)} for the parameters adapt.json says the weights were trained
    with that `config` (an AttentionConfig or ScheduleConfig) sets otherwise; only for weights
    trained for config's own variant or schedule (a pure variant's weights in a schedule's
    layers name their parameters another way). Compared as JSON, as adapt.json holds them."""
    if not meta or meta.get("variant") != config.variant or not isinstance(meta.get("parameters"), dict):
        return {}
    ours = json.loads(json.dumps(config.as_params(), default=str))
    return {key: (value, ours.get(key)) for key, value in meta["parameters"].items() if ours.get(key) != value}


def load_weights(encoder: torch.nn.Module, weights_dir, any_parameters: bool = False) -> dict:
    """Copy DIR/weights.safetensors into `encoder` and return (and set as encoder.weights)
    {"dir", "sha256", "tensors", "adapt"}. Raises WeightsError for a missing directory or
    file, weights trained for another variant or with other values of its parameters (unless
    any_parameters: `attnserve adapt` may start from them), and tensors the encoder lacks or
    shapes it does not have; nothing is copied in then."""
    weights_dir = Path(weights_dir)
    variant = encoder.attention_config.variant
    layers = layer_variants(encoder.attention_config, len(encoder.layers))
    meta = check_weights_dir(weights_dir, layers, getattr(encoder, "model", None))
    mismatch = {} if any_parameters else parameter_mismatch(meta, encoder.attention_config)
    if mismatch:
        flags = " ".join(f"--param {param_arg(key, trained)}" for key, (trained, _) in mismatch.items())
        said = ", ".join(f"{param_arg(key, trained)} (this encoder: {param_arg(key, ours)})" for key, (trained, ours) in mismatch.items())
        raise WeightsError(f"weights in {weights_dir} were trained for {variant} with {said} "
                           f"({weights_dir / META_FILE}); pass {flags} (load_encoder: the same keyword arguments) "
                           f"to run them as trained")
    path = weights_dir / WEIGHTS_FILE
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise WeightsError(f"{path}: not a readable safetensors file ({exc}); rewrite it with `attnserve adapt`") from exc
    layers = trained_layers(meta, layers)
    unused = sorted(name for name in tensors if layers is not None and (m := LAYER_TENSOR.match(name)) and int(m[1]) not in layers)
    if unused:
        log.warning("%s: %d tensors of layers the %s encoder runs another variant in are unused (trained for %s: %s)",
                    path, len(unused), variant, meta.get("variant"), ", ".join(unused))
        tensors = {name: tensor for name, tensor in tensors.items() if name not in unused}
    state = encoder.state_dict()
    for name, tensor in tensors.items():
        if name not in state:
            raise WeightsError(f"{path}: tensor {name} is not a parameter of the {variant} encoder; "
                               f"the weights were written for another model or variant")
        if tensor.shape != state[name].shape and not (is_position_table(encoder, name) and rows_differ_only(tensor.shape, state[name].shape)):
            trained = f" ({META_FILE}: max_length {meta.get('max_length')}, parameters {meta.get('parameters')})" if meta else ""
            raise WeightsError(f"{path}: tensor {name} has shape {tuple(tensor.shape)}, the encoder's is "
                               f"{tuple(state[name].shape)}; load it with the max_length and variant parameters "
                               f"it was trained with{trained}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if tensor.shape == state[name].shape:
                state[name].copy_(tensor)
            else:  # a position table (checked above): the rows both have
                rows = min(tensor.shape[-2], state[name].shape[-2])
                state[name][..., :rows, :].copy_(tensor[..., :rows, :])
    encoder.weights = {"dir": str(weights_dir.resolve()), "sha256": sha256(path), "tensors": len(tensors), "adapt": meta,
                       "unused": unused}
    return encoder.weights
