"""Attention schedule texts: which variant each layer runs (src/attnserve/models/schedule.py builds them).

A schedule is comma-separated entries, each a variant name or `name*k` for k layers of it, as
many layers as the model has, or fewer that divide the layer count and repeat. Parsing and the
canonical spelling live here, torch-free, because serving names and finds exports by them.
"""
from __future__ import annotations

import re

# all-MiniLM-L6-v2, the only model attnserve serves.
NUM_LAYERS = 6

FORMS = (f"a variant name (every layer), or comma-separated entries NAME or NAME*K whose layer count is "
         f"{NUM_LAYERS} or divides it and repeats (e.g. linformer*5,longformer or local,local,full)")


def parse_schedule(text: str, known=None, num_layers: int = NUM_LAYERS) -> tuple[str, ...]:
    """The variant of each of num_layers layers. ValueError naming the entry at fault and the
    valid forms for an unknown name (not in `known`; without it, any word is a name), a count
    that is not a positive integer, or a layer count that does not divide num_layers."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty attention schedule; write {FORMS}")
    names: list[str] = []
    for entry in text.split(","):
        name, star, count = (part.strip() for part in entry.partition("*"))
        if not name:
            raise ValueError(f"attention schedule {text!r} has an empty entry; write {FORMS}")
        if not (name in known if known is not None else re.fullmatch(r"[\w-]+", name)):
            valid = ", ".join(known) if known is not None else "names of letters, digits, _ and -"
            where = f" (in schedule {text!r}; write {FORMS})" if text.strip() != name else ""
            raise ValueError(f"unknown attention variant {name!r}; valid: {valid}{where}")
        if star and not (count.isdigit() and int(count) > 0):
            raise ValueError(f"entry {entry.strip()!r} of schedule {text!r}: the count after * must be a positive integer "
                             f"(got {count!r}); write {FORMS}")
        names += [name] * (int(count) if star else 1)
    if num_layers % len(names):
        raise ValueError(f"schedule {text!r} covers {len(names)} layers, which does not divide the model's {num_layers}; "
                         f"write {FORMS}")
    return tuple(names * (num_layers // len(names)))


def schedule_text(layers) -> str:
    """The canonical text of per-layer names: the shortest unit that repeats to them, its
    consecutive runs written name*k (one name for a uniform schedule)."""
    layers = list(layers)
    unit = next(layers[:p] for p in range(1, len(layers) + 1)
                if len(layers) % p == 0 and layers[:p] * (len(layers) // p) == layers)
    runs: list[list] = []
    for name in unit:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ",".join(name if k == 1 else f"{name}*{k}" for name, k in runs)


def canonical_schedule(text: str) -> str:
    """The canonical spelling of a schedule text (names unchecked): what an export records."""
    return schedule_text(parse_schedule(text))


def schedule_slug(text: str) -> str:
    """A schedule as a file and label name: linformer*5,longformer -> linformer-x5.longformer
    (a plain variant name is itself)."""
    return text.replace("*", "-x").replace(",", ".")
