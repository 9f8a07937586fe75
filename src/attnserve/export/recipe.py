"""The recipe of an export: everything its graphs depend on, resolved once.

`Recipe.resolve` (or `Recipe.from_args`, for `attnserve export`'s flags) turns what a user
names (a variant or schedule and its parameters, max_length, a model folder, adapted weights, a
precision, which graphs) into one object: the attention config with every default filled in,
the model folder read and checked, the weights' sha256. The export path takes that object and
never resolves a name again: export_model, cached_export and convert_export read it,
`Recipe.encoder()` builds the PyTorch encoder the graphs are traced from, and
`Recipe.record()` is what the manifest records and the export cache is keyed by (its digest
names the folder `attnserve serve --models-dir` looks in).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from attnserve.contract.export_format import (
    DEFAULT_PRECISION, PRECISIONS, code_sha256, export_name, package_version, parse_params, sha256, weights_file)
from attnserve.contract.model_folder import ModelFolder
from attnserve.export.graphs import OPSET
from attnserve.export.precision import check_precision
from attnserve.models.api import Encoder, build_encoder, deployment_defaults, model_config
from attnserve.models.pretrained import load_model
from attnserve.models.registry import length_multiple, precision_refused

MAX_BATCH = 1024  # the most inputs a graph's batch axis is exported for


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One export, resolved. `config`: the attention config (a variant's or a schedule's, every
    parameter resolved); `max_length`: the longest input, in tokens; `model`: the model folder;
    `weights`: a directory `attnserve adapt` wrote (None: the pretrained model's own) and
    `weights_sha256` its file's; `precision`: of the weight matrix products; `analysis`: with
    analysis.onnx and collapse.onnx (attention maps, rank collapse); `optimize`: run the
    exporter's onnxscript optimiser; `opset`, `max_batch`: of the graphs; `requested`: the
    parameters as they were given (the manifest records both)."""

    config: object
    max_length: int
    model: ModelFolder
    weights: Path | None = None
    weights_sha256: str | None = None
    precision: str = DEFAULT_PRECISION
    analysis: bool = True
    optimize: bool = False
    opset: int = OPSET
    max_batch: int = MAX_BATCH
    requested: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def resolve(cls, variant: str | None = None, params: dict | None = None, max_length: int | None = None, *, model=None, weights=None,
                precision: str = DEFAULT_PRECISION, analysis: bool = True, optimize: bool = False, opset: int = OPSET,
                max_batch: int = MAX_BATCH) -> "Recipe":
        """The recipe of `variant` (or a schedule; None: the model's default_variant) with `params`
        for inputs of up to max_length tokens (None: the model's default_max_length) over `model`
        (a folder or ModelFolder; None: the bundled all-MiniLM-L6-v2). ValueError for an unknown
        variant or parameter, an impossible value or a precision the variant cannot take;
        ModelError for a folder that is not a supported model and WeightsError for a weights
        directory without its file (both ValueErrors)."""
        params = dict(params or {})
        folder = load_model(model)
        variant, max_length = deployment_defaults(folder, variant, max_length)
        config = model_config(variant, max_length, folder, params)
        check_variant_precision(config, precision)
        digest = sha256(weights_file(weights)) if weights is not None else None
        return cls(config, max_length, folder, Path(weights) if weights is not None else None, digest, precision,
                   analysis, optimize, opset, max_batch, params)

    @classmethod
    def from_args(cls, args) -> "Recipe":
        """The recipe `attnserve export`'s flags ask for (cli.configure_export's)."""
        return cls.resolve(args.variant, parse_params(args.param), args.max_length, model=args.model, weights=args.weights,
                           precision=args.precision, analysis=not args.no_analysis, optimize=args.optimize, opset=args.opset)

    @classmethod
    def of_encoder(cls, encoder: Encoder, max_length: int | None = None, **options) -> "Recipe":
        """The recipe of an encoder already built (its config, model and adapted weights), for
        inputs of up to max_length tokens (None: its own max_length); `options` as resolve's."""
        weights = getattr(encoder, "weights", None)
        precision = options.get("precision", DEFAULT_PRECISION)
        check_variant_precision(encoder.attention_config, precision)
        return cls(encoder.attention_config, max_length or encoder.max_length, encoder.model,
                   Path(weights["dir"]) if weights else None, weights["sha256"] if weights else None, **options)

    @property
    def variant(self) -> str:
        """The variant's name, or the schedule's canonical text."""
        return self.config.variant

    @property
    def length_multiple(self) -> int:
        """The sequence granule of the graphs (every layer's block divides it)."""
        return length_multiple(self.config)

    @property
    def capacity(self) -> int:
        """max_length rounded up to the granule: the length the traced encoder is built for."""
        return -(-self.max_length // self.length_multiple) * self.length_multiple

    def at_precision(self, precision: str) -> "Recipe":
        """The same export at another precision (ValueError where the variant cannot take it)."""
        check_variant_precision(self.config, precision)
        return dataclasses.replace(self, precision=precision)

    def encoder(self) -> Encoder:
        """The PyTorch encoder the graphs are traced from: built for inputs padded up to the
        granule, since the graphs run on those, with the adapted weights loaded (WeightsError
        when they do not fit, before anything is written)."""
        return build_encoder(self.config, self.capacity, model=self.model, weights=self.weights)

    def record(self) -> dict:
        """Everything the graphs depend on, as JSON: the model (its name and the sha256 of its
        weights), the variant's resolved parameters (so a default spelled out is the same
        export), max_length, the adapted weights, the precision, the code that builds the graphs
        and the versions of what converts them. The manifest records it and the export cache
        names its folders after its digest."""
        recipe = {
            "model": self.model.record,
            "variant": self.variant,
            "parameters": json.loads(json.dumps(self.config.as_params(), default=str)),
            "max_length": self.max_length,
            "weights_sha256": self.weights_sha256,
            "attnserve": package_version("attnserve"),
            "code_sha256": code_sha256(),
            "opset": self.opset,
            "analysis": self.analysis,
            "optimize": self.optimize,
            "max_batch": self.max_batch,
            "precision": DEFAULT_PRECISION,
            "versions": {name: package_version(name) for name in ("torch", "onnx", "onnxscript")},
        }
        if self.precision == DEFAULT_PRECISION:
            return recipe
        # What converting adds: the precision, and ONNX Runtime (its quantizer and optimiser convert).
        return {**recipe, "precision": self.precision, "versions": {**recipe["versions"], "onnxruntime": ort_version()}}

    def name(self) -> str:
        """The export folder's name under a models_dir: variant, max_length and the record's digest."""
        return export_name(self.record())


def check_variant_precision(config, precision: str) -> None:
    """ValueError naming the variant, the precision and why, for a pair that cannot be exported
    (`Attention.precisions_refused`); the precisions it takes otherwise."""
    check_precision(precision)
    refused = precision_refused(config)
    if precision in refused:
        takes = ", ".join(p for p in PRECISIONS if p not in refused)
        raise ValueError(f"{config.variant} cannot be exported in {precision}: {refused[precision]}; it takes {takes}")


def ort_version() -> str | None:
    try:
        import onnxruntime

        return onnxruntime.__version__
    except ImportError:
        return None
