"""`attnserve variants`: the variants as a Markdown table."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from attnserve.models.attention.base import AttentionConfig
from attnserve.models.registry import VARIANTS, make_config, parameters, variant_names


# The length `attnserve variants` states exactness at: the serving default max_length.
VARIANTS_MAX_LENGTH = 16384


def exactness(name: str, max_length: int = VARIANTS_MAX_LENGTH) -> str:
    """For which inputs the variant with default parameters is exactly full attention."""
    exact = VARIANTS[name].exact_up_to(make_config(name, max_length), max_length)
    return "all lengths" if exact >= max_length else f"<= {exact} tokens" if exact else "never"


def variants_table() -> list[str]:
    """The variants as a Markdown table (what `attnserve variants` prints and README.md shows):
    cost, where each is exactly full attention, and the parameters of its own with defaults."""
    variant_names()
    common = {f.name for f in dataclasses.fields(AttentionConfig)}
    lines = ["| variant | cost | exact full attention | parameters (defaults) |", "|---|---|---|---|"]
    for name, cls in VARIANTS.items():
        own = ", ".join(f"{k}={v!r}" for k, v in parameters(name).items() if k not in common) or "-"
        lines.append(f"| {name} | {cls.cost} | {exactness(name)} | {own} |")
    shared = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(AttentionConfig))
    return [*lines, "", f"Every variant also takes {shared}."]


def variants_command(args) -> int:
    print("\n".join(variants_table()))
    return 0
