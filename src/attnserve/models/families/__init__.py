"""Model families: the modules of each architecture attnserve runs, around the attention step
(base.py says what a family gives; one module per family)."""
from __future__ import annotations

from attnserve.models.families.base import Family
from attnserve.models.families.bert import FAMILY as BERT
from attnserve.models.families.modernbert import FAMILY as MODERNBERT
from attnserve.models.families.rotary_bert import FAMILY as ROTARY_BERT

FAMILIES: tuple[Family, ...] = (BERT, MODERNBERT, ROTARY_BERT)


def family_of(architecture: str) -> Family:
    """The family that runs a model folder's architecture (ModelFolder.architecture)."""
    for family in FAMILIES:
        if architecture in family.architectures:
            return family
    known = ", ".join(a for family in FAMILIES for a in family.architectures)
    raise ValueError(f"no model family runs architecture {architecture!r}; attnserve runs {known}")
