"""Attention schedules: a variant per layer.

A schedule is written wherever a variant name is accepted: comma-separated entries, each a
variant name or `name*k` for k layers of it, as many layers as the model has, or fewer that
divide the layer count and repeat. Over all-MiniLM-L6-v2's six layers:

    linformer*5,longformer   linformer in layers 0-4, longformer in layer 5
    local,local,full         ModernBERT's pattern: local, local, full, local, local, full
    longformer               a plain name: every layer (the same as longformer*6)

A schedule's config (ScheduleConfig) holds one config per distinct variant and says which
variant each layer runs. Its text is canonical (the shortest repeating unit, runs written
name*k), and a schedule whose layers all run one variant is that variant's own config, so
every spelling of one deployment is one export.

Parameters: `key=value` sets key on every variant of the schedule that has it (position
parameters are the embeddings' and so shared by all layers); `variant.key=value` sets it on
that variant only.

The schedule texts (parsing, the canonical spelling) are the contract's
(src/attnserve/contract/schedule.py): serving finds exports by them.
"""
from __future__ import annotations

import dataclasses

from attnserve.contract.schedule import FORMS, NATIVE, NUM_LAYERS, parse_schedule, schedule_text  # noqa: F401
from attnserve.models.attention.base import AttentionConfig


def shared_fields() -> list[str]:
    """The parameters every variant's config has (AttentionConfig's: the embeddings' position
    parameters), which a schedule's layers share."""
    return [f.name for f in dataclasses.fields(AttentionConfig)]


def split_params(params: dict, names, shared) -> dict[str, dict]:
    """Each variant's own keyword parameters from a schedule's: `variant.key` goes to that
    variant, a plain key to every variant of the schedule whose config has it (`shared`: the
    position parameters every config has; a lone variant gets every key, and its config says
    which it does not take). `names` maps each variant to its config's field names."""
    names = dict(names)  # name -> its config's field names
    out: dict[str, dict] = {name: {} for name in names}
    for key, value in params.items():
        prefix, dot, field = key.rpartition(".")
        if dot:
            if prefix not in names:
                raise ValueError(f"parameter {key}: {prefix!r} is not a variant of this schedule ({', '.join(names)})")
            if field in shared and len(names) > 1:
                raise ValueError(f"parameter {key}: {field} applies to every layer (the embeddings'); set it as {field}=VALUE")
            out[prefix][field] = value
            continue
        takers = [name for name, fields in names.items() if key in fields or len(names) == 1]
        if not takers:
            takes = "; ".join(f"{name}: {', '.join(sorted(set(fields) - set(shared))) or '-'}" for name, fields in names.items())
            raise ValueError(f"unknown parameter {key} for schedule {','.join(names)}; its variants take {takes}; "
                             f"every layer takes {', '.join(sorted(shared))}")
        for name in takers:
            out[name][key] = value
    return out


@dataclasses.dataclass
class ScheduleConfig:
    """The attention of a model whose layers run different variants: `configs` holds one
    config per distinct variant, `layers` the variant of each layer, `variant` the canonical
    schedule text. It answers what a variant's config does (the shared position parameters,
    per_layer) so that the encoder and the exporter take either."""

    variant: str
    layers: tuple[str, ...]
    configs: dict

    def as_params(self) -> dict:
        """The keyword parameters that make this schedule again: the shared position parameters
        plainly, each variant's own as variant.key."""
        shared = shared_fields()
        out = {key: getattr(self, key) for key in sorted(shared)}
        for name, config in self.configs.items():
            out.update({f"{name}.{key}": value for key, value in dataclasses.asdict(config).items() if key not in shared})
        return out

    def per_layer(self, num_layers: int) -> list:
        """Each layer's config in a model of num_layers layers: the schedule's unit repeated
        (ValueError naming the schedule and the model's layer count where it does not divide it)."""
        layers = self.layers
        if num_layers != len(layers):
            try:
                layers = parse_schedule(self.variant, num_layers=num_layers)
            except ValueError:
                raise ValueError(f"schedule {self.variant} does not fit the model's {num_layers} layers: write one whose "
                                 f"layer count is {num_layers} or divides it") from None
        return [self.configs[name] for name in layers]

    @property
    def position_period(self) -> int:
        return self._shared("position_period")

    @property
    def positions(self) -> str:
        return self._shared("positions")

    @property
    def attention_scaling(self) -> bool:
        return self._shared("attention_scaling")

    def _shared(self, field: str):
        return getattr(self.configs[self.layers[0]], field)


def distinct_configs(config) -> list:
    """Each distinct variant's config of a variant's or a schedule's config, in layer order."""
    seen: dict[str, object] = {}
    for layer in config.per_layer(len(getattr(config, "layers", ())) or NUM_LAYERS):
        seen.setdefault(layer.variant, layer)
    return list(seen.values())


def layer_variants(config, num_layers: int = NUM_LAYERS) -> list[str]:
    """The variant each of a model's num_layers layers runs."""
    return [layer.variant for layer in config.per_layer(num_layers)]


# Schedules docs/results/schedules.md measures: the learned variants in layers 0-4 with longformer in layer 5,
# where their error sits (`attnserve bench quality --by-layer`), and ModernBERT's pattern.
PRESETS = ("linformer*5,longformer", "compressed*5,longformer", "sinkhorn*5,longformer", "local,local,full")
