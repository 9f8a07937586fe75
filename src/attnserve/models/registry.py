"""The one registry of attention variants: name -> its module class (whose config dataclass
names it: `variant`).

The shipped variants are imported here, one module each (they import nothing of this file), so
the registry is complete as soon as it is imported; a variant defined elsewhere (a test, a
plugin) joins with `@register_attention("name")`. The encoder only ever calls
`build_attention(config, ...)`, so it never branches on which variant it runs.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import typing

from attnserve.models.attention.base import Attention, AttentionConfig
from attnserve.models.attention.bigbird import BigBirdAttention
from attnserve.models.attention.compressed import MemoryCompressedAttention
from attnserve.models.attention.full import FullAttention
from attnserve.models.attention.global_tokens import GlobalTokenAttention
from attnserve.models.attention.linformer import LinformerAttention
from attnserve.models.attention.local import SlidingWindowAttention
from attnserve.models.attention.longformer import LongformerAttention
from attnserve.models.attention.lsh import LSHAttention
from attnserve.models.attention.sinkhorn import SinkhornAttention
from attnserve.models.attention.strided import StridedAttention
from attnserve.models.attention.synthesizer import SynthesizerAttention
from attnserve.models.schedule import (NUM_LAYERS, ScheduleConfig, distinct_configs, layer_variants, parse_schedule,
                                       schedule_text, shared_fields, split_params)

# In table order (`attnserve variants`): full attention, the fixed patterns, the learned ones.
SHIPPED: tuple[type[Attention], ...] = (
    FullAttention, SlidingWindowAttention, StridedAttention, GlobalTokenAttention, LongformerAttention, BigBirdAttention,
    LSHAttention, SinkhornAttention, LinformerAttention, MemoryCompressedAttention, SynthesizerAttention,
)
VARIANTS: dict[str, type[Attention]] = {cls.config_class.variant: cls for cls in SHIPPED}


def register_attention(name: str):
    """Class decorator adding a variant defined outside this package under `name` (its config
    class is named so too)."""
    def register(cls: type[Attention]) -> type[Attention]:
        if name in VARIANTS:
            raise ValueError(f"attention variant {name!r} registered twice")
        cls.config_class.variant = name
        VARIANTS[name] = cls
        return cls

    return register


def unregister_attention(name: str) -> None:
    """Remove a variant registered at run time (one a test defines), so the registry lists
    exactly the shipped ones again."""
    if name not in {cls.config_class.variant for cls in SHIPPED}:
        VARIANTS.pop(name, None)


def variant_names() -> list[str]:
    return list(VARIANTS)


def parameters(variant: str) -> dict[str, object]:
    """Every parameter of a variant with its default."""
    config_class = variant_class(variant).config_class
    return {f.name: f.default for f in dataclasses.fields(config_class)}


def make_config(variant: str, max_length: int, *, num_layers: int = NUM_LAYERS, **params) -> AttentionConfig | ScheduleConfig:
    """The config of a variant or of a schedule (a variant per layer, src/attnserve/models/schedule.py,
    spelled for a model of num_layers layers) from keyword parameters (`key` or `variant.key`);
    unknown names and impossible values are a ValueError that lists what is valid. String
    values (from a CLI) are converted. A schedule whose layers all run one variant gives that
    variant's config."""
    layers = parse_schedule(variant, variant_names(), num_layers)
    shared = set(shared_fields())
    fields = {name: {f.name for f in dataclasses.fields(variant_class(name).config_class)} for name in dict.fromkeys(layers)}
    configs = {name: _variant_config(name, max_length, own) for name, own in split_params(params, fields, shared).items()}
    if len(configs) == 1:
        return next(iter(configs.values()))
    return ScheduleConfig(schedule_text(layers), layers, configs)


def _variant_config(variant: str, max_length: int, params: dict) -> AttentionConfig:
    cls = variant_class(variant)
    fields = {f.name: f for f in dataclasses.fields(cls.config_class)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        valid = ", ".join(f"{n}={f.default!r}" for n, f in fields.items())
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for variant {variant!r}; valid: {valid}")
    hints = typing.get_type_hints(cls.config_class)
    converted = {name: _convert(name, value, hints[name]) for name, value in params.items()}
    config = cls.config_class(**converted)
    config.validate(max_length)
    return config


# --------------------------------------------------------------------------- facts of a config
# A variant's facts live on its class; a schedule's are its layers' combined. Each takes the
# config of a variant or of a schedule.


def length_multiple(config) -> int:
    """The sequence granule of the graph (every layer's block divides it)."""
    return math.lcm(*(int(variant_class(c.variant).length_multiple(c)) for c in distinct_configs(config)))


def exact_up_to(config, max_length: int) -> int:
    """The longest input every layer computes exactly as full attention (Attention.exact_up_to)."""
    return min(variant_class(c.variant).exact_up_to(c, max_length) for c in distinct_configs(config))


def dense_keys(config, n: int) -> int:
    """The most keys any layer scores per query in one dense call (Attention.dense_keys)."""
    return max(variant_class(c.variant).dense_keys(c, n) for c in distinct_configs(config))


def is_discontinuous(config) -> bool:
    """Whether any layer decides which tokens meet discontinuously (Attention.discontinuous)."""
    return any(variant_class(c.variant).discontinuous for c in distinct_configs(config))


def precision_refused(config) -> dict[str, str]:
    """The export precisions a variant or schedule cannot take, each with its reason (a
    schedule's name the layer's variant): Attention.precisions_refused over its layers."""
    refused: dict[str, str] = {}
    for c in distinct_configs(config):
        for precision, why in variant_class(c.variant).precisions_refused.items():
            refused.setdefault(precision, why if c.variant == config.variant else f"its {c.variant} layers: {why}")
    return refused


def adapt_lr(config) -> float:
    """The learning rate `attnserve adapt` trains the layers with parameters of their own at."""
    return max(variant_class(c.variant).adapt_lr for c in distinct_configs(config))


def cost(config) -> str:
    """The attention cost per forward: the variant's, or a schedule's as the sum of its layers'."""
    counts = collections.Counter(layer_variants(config))
    if len(counts) == 1:
        return variant_class(next(iter(counts))).cost
    return " + ".join(f"{k} x {variant_class(name).cost}" for name, k in counts.items())


def build_attention(config: AttentionConfig, num_heads: int, head_dim: int, max_length: int) -> Attention:
    return variant_class(config.variant)(config, num_heads, head_dim, max_length)


def variant_class(name: str) -> type[Attention]:
    """The registered class of a variant: its facts (length_multiple, exact_up_to,
    discontinuous, config_class ...) are read from it. ValueError listing the valid names."""
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; valid: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def _convert(name: str, value, hint):
    """Turn CLI/JSON values into the field's type: '3' -> 3, '0,5' -> (0, 5)."""
    origin = typing.get_origin(hint)
    try:
        if origin is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(int(x) for x in items if str(x).strip() != "")
        if hint is bool and isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("true", "1")
        if hint in (int, float, str):
            if hint is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if hint is int and isinstance(value, bool):
                raise ValueError(value)
            return hint(value)
    except (TypeError, ValueError):
        raise ValueError(f"invalid parameter {name}: {value!r} is not a {getattr(hint, '__name__', hint)}") from None
    return value
