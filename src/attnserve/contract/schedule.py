"""Attention schedule texts: which variant each layer runs (src/attnserve/models/schedule.py builds them).

A schedule is comma-separated entries, each a variant name or `name*k` for k layers of it, as
many layers as the model has, or fewer that divide the layer count and repeat. Parsing and the
canonical spelling live here, torch-free, because serving names and finds exports by them.
"""
from __future__ import annotations

import re

# all-MiniLM-L6-v2's, the bundled model's: schedules are spelled for it unless a model says otherwise.
NUM_LAYERS = 6

FORMS = ("a variant name (every layer), or comma-separated entries NAME or NAME*K whose layer count is the model's "
         "(6 for all-MiniLM-L6-v2) or divides it and repeats (e.g. linformer*5,longformer or local,local,full); "
         "native: the model's own attention (in every layer, or in the layers a schedule names it)")


def parse_schedule(text: str, known=None, num_layers: int = NUM_LAYERS, cut: bool = False) -> tuple[str, ...]:
    """The variant of each of num_layers layers. ValueError naming the entry at fault and the
    valid forms for an unknown name (not in `known`; without it, any word is a name), a count
    that is not a positive integer, or a layer count that does not divide num_layers (with
    `cut`, the entries repeat from layer 0 and stop at the last layer whatever their count)."""
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
    if cut:
        return tuple((names * -(-num_layers // len(names)))[:num_layers])
    if num_layers % len(names):
        raise ValueError(f"schedule {text!r} covers {len(names)} layers, which does not divide the model's {num_layers}; "
                         f"write {FORMS}")
    return tuple(names * (num_layers // len(names)))


# In a schedule, the layer's own attention: the model's (full, or its window: ModernBERT's local
# layers), whatever the other layers run. A plain `native` is the model's own schedule.
NATIVE = "native"


def resolve_native(text: str, native_layers, local_window: int = 0, known=None) -> tuple[str, dict]:
    """A schedule that may name `native` as the canonical schedule of variants it stands for:
    each native layer runs the model's own attention there (native_layers: full or local per
    layer; local within local_window tokens, given as local.window in the parameters returned).
    A schedule naming native repeats from layer 0 and stops at the last layer, as a model's own
    pattern does (ModernBERT-base: a global layer every 3rd of 22), so `longformer,native,native`
    puts longformer on its global layers. ValueError as parse_schedule's for a bad schedule
    (`known`: the variant names)."""
    native_layers = tuple(native_layers)
    cut = NATIVE in [entry.partition("*")[0].strip() for entry in str(text).split(",")]
    names = parse_schedule(text, None if known is None else [*known, NATIVE], len(native_layers), cut=cut)
    layers = [own if name == NATIVE else name for name, own in zip(names, native_layers)]
    params = {"local.window": local_window} if local_window and NATIVE in names and "local" in layers else {}
    return schedule_text(layers), params


def repeating_text(layers) -> str:
    """The shortest schedule text that, repeated from layer 0 and cut at the last layer (as a
    schedule naming native is), gives `layers`: ModernBERT-base's 22 layers of global every 3rd
    are full,local*2."""
    layers = list(layers)
    period = next(p for p in range(1, len(layers) + 1) if all(layers[i] == layers[i % p] for i in range(len(layers))))
    return schedule_text(layers[:period])


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


def canonical_schedule(text: str, num_layers: int = NUM_LAYERS) -> str:
    """The canonical spelling of a schedule text (names unchecked) for a model of num_layers
    layers: what an export records."""
    return schedule_text(parse_schedule(text, num_layers=num_layers))


def schedule_slug(text: str) -> str:
    """A schedule as a file and label name: linformer*5,longformer -> linformer-x5.longformer
    (a plain variant name is itself)."""
    return text.replace("*", "-x").replace(",", ".")
