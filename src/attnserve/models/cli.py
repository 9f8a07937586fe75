"""`attnserve variants`: the variants as a Markdown table."""
from __future__ import annotations

import dataclasses
import sys

from attnserve.models.attention.base import AttentionConfig
from attnserve.models.registry import VARIANTS, cost, exact_up_to, make_config, parameters, variant_names
from attnserve.contract.export_format import PRECISIONS
from attnserve.models.schedule import FORMS, PRESETS, layer_variants


# The length `attnserve variants` states exactness at: the serving default max_length.
VARIANTS_MAX_LENGTH = 16384


def exactness(name: str, max_length: int = VARIANTS_MAX_LENGTH) -> str:
    """For which inputs the variant (or schedule) with default parameters is exactly full attention."""
    exact = exact_up_to(make_config(name, max_length), max_length)
    return "all lengths" if exact >= max_length else f"<= {exact} tokens" if exact else "never"


def variants_table() -> list[str]:
    """The variants as a Markdown table (what `attnserve variants` prints and README.md shows):
    cost, where each is exactly full attention, the export precisions it takes (and why not the
    others) and the parameters of its own with defaults."""
    variant_names()
    common = {f.name for f in dataclasses.fields(AttentionConfig)}
    lines = ["| variant | cost | exact full attention | precisions | parameters (defaults) |", "|---|---|---|---|---|"]
    refusals = []
    for name, cls in VARIANTS.items():
        own = ", ".join(f"{k}={v!r}" for k, v in parameters(name).items() if k not in common) or "-"
        takes = ", ".join(p for p in PRECISIONS if p not in cls.precisions_refused)
        lines.append(f"| {name} | {cls.cost} | {exactness(name)} | {takes} | {own} |")
        refusals += [f"- {name} cannot be exported in {p}: {why}." for p, why in cls.precisions_refused.items()]
    shared = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(AttentionConfig))
    return [*lines, "", f"Every variant also takes {shared}.", *([""] + refusals if refusals else [])]


def schedules_table(schedules) -> list[str]:
    """Schedules (a variant per layer) as a Markdown table: each layer's variant, the cost as
    the sum of the layers', and where the whole is exactly full attention."""
    lines = ["| schedule | layers 0-5 | cost (sum of the layers') | exact full attention |", "|---|---|---|---|"]
    for text in schedules:
        config = make_config(text, VARIANTS_MAX_LENGTH)
        lines.append(f"| {config.variant} | {' '.join(layer_variants(config))} | {cost(config)} | {exactness(text)} |")
    return lines


def configure(parser) -> None:
    parser.add_argument("--schedule", action="append", default=[], metavar="SCHEDULE",
                        help=f"also describe this schedule, a variant per layer: {FORMS} (repeatable)")


def variants_command(args) -> int:
    try:
        schedules = [*PRESETS, *args.schedule]
        lines = [*variants_table(), "", "Schedules (a variant per layer; pass one wherever a variant is taken):", "",
                 *schedules_table(schedules)]
    except ValueError as exc:
        print(f"attnserve variants: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
