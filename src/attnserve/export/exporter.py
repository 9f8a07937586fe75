"""Export an encoder to ONNX for serving with ONNX Runtime (`attnserve export`).

What an export directory holds, and manifest.json's schema, are the serving side's contract:
attnserve.contract.export_format, which this module writes through. The pieces:

    graphs.py     the graphs (EmbeddingGraph, AnalysisGraph), the SDPA rewrite ONNX Runtime
                  needs, and tracing one graph to ONNX (export_graph)
    lengths.py    how long each graph's inputs may be, from the variant's class
    verify.py     the parity check of a graph against PyTorch
    precision.py  int8 and float16: a float32 export's graphs converted after tracing
    recipe.py     the Recipe: everything an export depends on, resolved once from the
                  command line or the caller, passed down the export path
    exporter.py   this: export_model (graphs, check, manifest), the export cache
                  (cached_export) and the `attnserve export` command

Why two graphs: ONNX Runtime runs every node of a graph whatever outputs are asked for (see
`attnserve bench runtime --output-pruning`), and the explicit attention weights cost far more
than the fused attention they replace, so the embedding path gets a graph without them.

Every export runs `torch.export.export` with Dim-based dynamic batch and sequence first (it
raises instead of silently narrowing a dimension), then `torch.onnx.export` from that program,
then onnx.checker, then checks the graph kept both axes symbolic, then compares ONNX Runtime
with PyTorch at two lengths and batch sizes 1 and 3. Any failure is an ExportFailed.

`python -m attnserve.export.exporter` is the same command as `attnserve export`; serving runs it
as a child process (with --print-recipe for the cache key), so that it never imports torch.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnserve.contract.export_format import (
    DEFAULT_PRECISION, EMBEDDING_OUTPUTS, FORMAT, RANK_COLLAPSE_OUTPUT, GRAPH_FILES, INPUT_NAMES, META_FILE, MIN_LENGTH, MANIFEST_FILE, PRECISIONS,
    TOKENIZER_FILE, Manifest, file_records, read_manifest, recipe_sha256, write_manifest)
from attnserve.export.graphs import (
    COLLAPSE_OUTPUTS, OPSET, AnalysisGraph, CollapseGraph, EmbeddingGraph, ExportFailed, analysis_layout, export_graph,
    full_attention_encoder, with_spare_position)
from attnserve.export.lengths import ANALYSIS_BUDGET_BYTES, analysis_max_length, short_graph_length
from attnserve.export.precision import MIN_COSINE, convert_graphs
from attnserve.export.recipe import Recipe, ort_version
from attnserve.export.verify import verify_embedding_graph
from attnserve.models.api import Encoder
from attnserve.models.schedule import layer_variants


def export_model(recipe: Recipe, out_dir, *, verify: bool = True, encoder: Encoder | None = None, log=print) -> Path:
    """Export `recipe` into out_dir: model.onnx (+ .data), short.onnx where the variant is exact
    on short inputs, analysis.onnx and collapse.onnx (+ .data) where recipe.analysis,
    tokenizer.json, the weights' adapt.json and manifest.json; at int8 or float16 the float32
    export is made in a scratch folder beside out_dir and converted into it (precision.py).
    `verify`: compare each embedding graph with PyTorch (ExportFailed when it is not
    faithful). `encoder`: the PyTorch encoder of the recipe where the caller has built it
    (None: recipe.encoder(), which refuses weights that do not fit before out_dir is written).
    Returns out_dir."""
    encoder = encoder if encoder is not None else recipe.encoder()
    if recipe.precision == DEFAULT_PRECISION:
        return _export_float32(encoder, recipe, out_dir, verify=verify, log=log)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-float32-", dir=out_dir.parent))
    try:
        # Not checked itself: the converted graphs are, against the same PyTorch encoder.
        _export_float32(encoder, recipe.at_precision(DEFAULT_PRECISION), scratch, verify=False, log=log)
        return convert_export(scratch, out_dir, recipe, encoder, verify=verify, log=log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def cached_export(root, recipe: Recipe, *, verify: bool = True, log=print) -> Path:
    """The export of `recipe` under root, made first if it is not there yet: in
    root/recipe.name(), the folder `attnserve serve --models-dir root` looks in, so a server can
    serve straight from the cache. The recipe's record covers the variant's resolved
    parameters, max_length, model, weights, precision, the code that builds the graphs and the
    converters' versions, so a change to any of them makes a new export. A lock file per recipe
    lets processes share the folder (pytest-xdist workers, benchmark subprocesses): the first
    exports into a scratch folder renamed into place, the others wait for it and reuse it; an
    int8 or float16 export is converted from the cached float32 one. `verify` applies to an
    export this call makes."""
    from filelock import FileLock

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / recipe.name()
    with FileLock(str(target) + ".lock"):
        if not (target / MANIFEST_FILE).is_file():
            scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
            try:
                if recipe.precision == DEFAULT_PRECISION:
                    export_model(recipe, scratch, verify=verify, log=log)
                else:
                    base = cached_export(root, recipe.at_precision(DEFAULT_PRECISION), verify=verify, log=log)
                    convert_export(base, scratch, recipe, recipe.encoder(), verify=verify, log=log)
                try:
                    os.replace(scratch, target)  # replaces a missing or empty folder only
                except OSError as exc:
                    # `attnserve serve --models-dir root`, which takes no lock, may have finished the same export first.
                    if not (target / MANIFEST_FILE).is_file():
                        raise ExportFailed(f"{target}: not an export and not empty ({exc.strerror}); move it out of {root}") from exc
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    os.utime(target)  # when it was last used, for whoever prunes the cache
    return target


def _check_lengths(max_length: int, multiple: int) -> list[int]:
    """The lengths an embedding graph is checked at: one inside the first block, one past two
    blocks and not a multiple of one."""
    short = min(max_length, max(5, multiple // 2 + 3))
    longer = min(max_length, max(2 * multiple + 37, 300))
    return sorted({short, longer})


def _short_check_lengths(short_length: int) -> list[int]:
    return sorted({min(short_length, 13), short_length // 2 + 1, short_length})


def convert_export(base_dir, out_dir, recipe: Recipe, encoder: Encoder, *, verify: bool = True, log=print) -> Path:
    """The float32 export of `recipe` in base_dir, at recipe.precision in out_dir: every graph
    converted (precision.py), the embedding graphs checked against the PyTorch float32
    `encoder` it was made from (embedding cosine at least MIN_COSINE[precision]), and its
    manifest with the precision, the checks and the recipe of the converted export."""
    started = time.perf_counter()
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base = read_manifest(base_dir)
    precision = recipe.precision
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (*GRAPH_FILES, META_FILE, MANIFEST_FILE):
        (out_dir / stale).unlink(missing_ok=True)
    data = base.as_json()
    graphs = data["graphs"]
    log(f"converting {base.variant} to {precision} ({base_dir} -> {out_dir})")
    convert_graphs(base_dir, out_dir, [graph["file"] for graph in graphs.values()], precision, log)
    for name in (TOKENIZER_FILE, META_FILE):
        if (base_dir / name).is_file():
            shutil.copyfile(base_dir / name, out_dir / name)
    verified = None
    if verify:
        bound = MIN_COSINE[precision]
        verified = verify_embedding_graph(encoder, out_dir / "model.onnx", base.length_multiple,
                                          _check_lengths(base.max_length, base.length_multiple), log, min_cosine=bound)
        if "short" in graphs:
            graphs["short"]["verified"] = verify_embedding_graph(
                encoder, out_dir / "short.onnx", 1, _short_check_lengths(graphs["short"]["max_length"]), log,
                discontinuous=False, min_cosine=bound)
    files = file_records(out_dir, (*GRAPH_FILES, TOKENIZER_FILE, META_FILE))
    record = recipe.record()
    manifest = Manifest.model_validate({
        **data, "precision": precision, "graphs": graphs, "files": files, "sha256": files["model.onnx"].sha256,
        "verified": verified, "versions": {**base.versions, "onnxruntime": ort_version()},
        "recipe": record, "recipe_sha256": recipe_sha256(record),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "export_seconds": round((base.export_seconds or 0.0) + time.perf_counter() - started, 1),
    })
    write_manifest(out_dir, manifest)
    log(f"wrote {out_dir} ({precision}) in {time.perf_counter() - started:.1f}s")
    return out_dir


def _export_float32(encoder: Encoder, recipe: Recipe, out_dir, *, verify: bool, log) -> Path:
    """The float32 export of `recipe`, traced from `encoder` (built for recipe.capacity tokens
    or more)."""
    import onnx
    import onnxscript

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    encoder = encoder.eval()
    variant, config = recipe.variant, recipe.config
    multiple, max_length = recipe.length_multiple, recipe.max_length
    opset, optimize, max_batch = recipe.opset, recipe.optimize, recipe.max_batch
    capacity = encoder.max_length - encoder.max_length % multiple
    if capacity < max_length:
        raise ExportFailed(f"the encoder takes {encoder.max_length} tokens, fewer than the recipe's {max_length} "
                           f"rounded up to {variant}'s block of {multiple}")
    started = time.perf_counter()
    log(f"exporting {variant} {config.as_params()} max_length {max_length} (sequence padded to multiples of {multiple}) to {out_dir}")
    if getattr(encoder, "weights", None):
        log(f"  with adapted weights from {encoder.weights['dir']} (sha256 {encoder.weights['sha256'][:10]}, {encoder.weights['tensors']} tensors)")
    for stale in (*GRAPH_FILES, META_FILE, MANIFEST_FILE):
        (out_dir / stale).unlink(missing_ok=True)

    traced = with_spare_position(encoder, capacity)
    with torch.no_grad():
        export_graph(EmbeddingGraph(traced).eval(), out_dir / "model.onnx", list(EMBEDDING_OUTPUTS), multiple, capacity,
                      max_batch, opset, optimize, log)
    verified = None
    if verify:
        verified = verify_embedding_graph(encoder, out_dir / "model.onnx", multiple, _check_lengths(max_length, multiple), log)

    graphs = {"embedding": {"file": "model.onnx", "outputs": list(EMBEDDING_OUTPUTS)}}
    short_length = short_graph_length(config, max_length, encoder)
    if short_length:
        log(f"  short inputs: {variant} is full attention up to {short_length} tokens; short.onnx runs them unpadded")
        with torch.no_grad():
            export_graph(EmbeddingGraph(full_attention_encoder(encoder, short_length)), out_dir / "short.onnx",
                          list(EMBEDDING_OUTPUTS), 1, short_length, max_batch, opset, optimize, log)
        graphs["short"] = {"file": "short.onnx", "outputs": list(EMBEDDING_OUTPUTS), "max_length": short_length,
                           "length_multiple": 1, "attention": "full"}
        if verify:
            # Against the variant's own encoder: that is what the runner stands the graph in for.
            # Exact attention takes no discrete decision, so LSH too is held to max abs diff.
            graphs["short"]["verified"] = verify_embedding_graph(encoder, out_dir / "short.onnx", 1,
                                                                 _short_check_lengths(short_length), log, discontinuous=False)
    if recipe.analysis:
        layout = analysis_layout(encoder, min(capacity, 2 * multiple))
        names, attention = [], []
        for layer, pieces in enumerate(layout):
            attention.append([])
            for piece in range(pieces):
                piece_names = {part: f"attn{layer}_{piece}_{part}" for part in ("rows", "cols", "probs")}
                names += list(piece_names.values())
                attention[-1].append(piece_names)
        names.append(RANK_COLLAPSE_OUTPUT)
        with torch.no_grad():
            export_graph(AnalysisGraph(traced).eval(), out_dir / "analysis.onnx", names, multiple, capacity,
                          max_batch, opset, optimize, log)
        graphs["analysis"] = {"file": "analysis.onnx", "outputs": names, "attention": attention,
                              "max_length": analysis_max_length(encoder, multiple, capacity, max_length)}
        log(f"  attention maps: up to {graphs['analysis']['max_length']} tokens (all layers' weights <= "
            f"{ANALYSIS_BUDGET_BYTES >> 30} GiB)")
        # Rank collapse along the paths of "Attention is not all you need", served beside the
        # maps. The paths run as one batch of four, so a text may have a quarter of max_length
        # tokens (their memory is that of one max_length input) and no more than a map.
        with torch.no_grad():
            export_graph(CollapseGraph(traced).eval(), out_dir / "collapse.onnx", list(COLLAPSE_OUTPUTS.values()), multiple,
                          capacity, max_batch, opset, optimize, log)
        collapse_length = min(graphs["analysis"]["max_length"], max(MIN_LENGTH, max_length // len(COLLAPSE_OUTPUTS)))
        graphs["collapse"] = {"file": "collapse.onnx", "outputs": list(COLLAPSE_OUTPUTS.values()), "paths": COLLAPSE_OUTPUTS,
                              "max_length": collapse_length}
        log(f"  rank collapse paths: up to {collapse_length} tokens")

    shutil.copyfile(encoder.model.dir / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
    weights = getattr(encoder, "weights", None)
    if weights and (Path(weights["dir"]) / META_FILE).is_file():
        # What the weights were trained on travels with the export that serves them.
        shutil.copyfile(Path(weights["dir"]) / META_FILE, out_dir / META_FILE)
    files = file_records(out_dir, (*GRAPH_FILES, TOKENIZER_FILE, META_FILE))
    shape = encoder.shape
    record = recipe.record()
    manifest = Manifest.model_validate({
        "format": FORMAT,
        "model": encoder.model.describe(),
        "variant": variant,
        "parameters": json.loads(json.dumps(config.as_params())),
        "requested_parameters": json.loads(json.dumps(recipe.requested, default=str)),
        "max_length": max_length,
        "length_multiple": multiple,
        "min_length": MIN_LENGTH,
        "max_batch": max_batch,
        "hidden_size": shape.hidden_size,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "layer_variants": layer_variants(config, shape.num_layers),
        "precision": DEFAULT_PRECISION,
        "opset": opset,
        "inputs": {name: {"dtype": "int64", "shape": ["batch", f"sequence ({multiple} * k)"]} for name in INPUT_NAMES},
        "outputs": {
            "sentence_embedding": {"dtype": "float32", "shape": ["batch", shape.hidden_size],
                                   "note": f"{shape.pooling}-pooled{', L2-normalised' if shape.normalize else ''}"},
            "last_hidden_state": {"dtype": "float32", "shape": ["batch", "sequence", shape.hidden_size]},
            "rank_collapse": {"dtype": "float32", "shape": ["batch", shape.num_layers],
                              "note": "||X - 1 x^T|| / ||X|| per layer over real tokens, sqrt(l1 * linf) norm; "
                                      "an output of analysis.onnx"},
        },
        "graphs": graphs,
        "files": files,
        "sha256": files["model.onnx"].sha256,
        "weights": {key: weights[key] for key in ("sha256", "dir", "tensors")} if weights else None,
        "verified": verified,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxscript": onnxscript.__version__,
                     "onnxruntime": ort_version()},
        "recipe": record,
        "recipe_sha256": recipe_sha256(record),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "export_seconds": round(time.perf_counter() - started, 1),
    })
    write_manifest(out_dir, manifest)
    log(f"wrote {out_dir} in {manifest.export_seconds}s")
    return out_dir


# --------------------------------------------------------------------------- CLI


def configure_export(parser) -> None:
    parser.add_argument("--model", metavar="DIR", help="sentence-transformers folder of a BERT, XLM-RoBERTa or ModernBERT "
                        "model to export (config.json, model.safetensors, tokenizer.json, modules.json; default: the "
                        "bundled all-MiniLM-L6-v2)")
    parser.add_argument("--variant", help="attention variant, or a schedule of one per layer such as "
                        "linformer*5,longformer; native: the model's own attention (see `attnserve variants`; default: "
                        "native for a model with an attention pattern of its own, ModernBERT, else longformer)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="variant parameter (repeatable)")
    parser.add_argument("--max-length", type=int, help="longest input in tokens (default: a rotary model's trained "
                        "length, ModernBERT's max_position_embeddings, else 16384)")
    parser.add_argument("--out", help="export directory to write (required unless --print-recipe)")
    parser.add_argument("--no-analysis", action="store_true",
                        help="skip analysis.onnx and collapse.onnx (attention maps, rank collapse paths)")
    parser.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime vs PyTorch check")
    parser.add_argument("--optimize", action="store_true",
                        help="run the exporter's onnxscript optimiser too (2x slower export; ONNX Runtime optimises at load anyway)")
    parser.add_argument("--opset", type=int, default=OPSET)
    parser.add_argument("--weights", metavar="DIR", help="adapted weights to export with (a directory `attnserve adapt` wrote)")
    parser.add_argument("--precision", default=DEFAULT_PRECISION, choices=PRECISIONS,
                        help="of the weight matrix products: float32 (as trained), int8 (dynamic quantization, for CPUs) "
                             "or float16 (for GPUs); `attnserve variants` lists the variants that cannot take one")
    parser.add_argument("--print-recipe", action="store_true",
                        help="print the recipe (JSON) this export would be made and cached under, and export nothing")


def export_command(args) -> int:
    try:
        recipe = Recipe.from_args(args)
        if args.print_recipe:
            print(json.dumps(recipe.record()))
            return 0
        if not args.out:
            raise ValueError("--out DIR is required: the export directory to write")
        export_model(recipe, args.out, verify=not args.no_verify)
    except (ValueError, ExportFailed) as exc:  # WeightsError and ModelError are ValueErrors
        print(f"attnserve export: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="attnserve export", description="export a variant to ONNX")
    configure_export(parser)
    return export_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
