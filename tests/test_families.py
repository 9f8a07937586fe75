"""Each model family (attnserve.models.families) against transformers' own class for its
architectures: a small random model saved with save_pretrained, loaded as attnserve's encoder
with full attention, gives transformers' last hidden states on every real token of a padded
batch. The pooled vectors (sentence-transformers' modules on top) are tests/test_model_folders.py's."""
from __future__ import annotations

import pytest
import torch

from model_folders import bert_folder, xlm_roberta_folder

# architecture (ModelFolder.architecture) -> (a folder builder, transformers' class of it)
BUILDERS = {"bert": (bert_folder, "BertModel"), "xlm-roberta": (xlm_roberta_folder, "XLMRobertaModel")}
LENGTHS = [7, 200, 481]  # padded into one batch; up to the 512-row position tables


def test_every_family_architecture_has_a_parity_case():
    from attnserve.models.families import FAMILIES

    assert sorted(a for family in FAMILIES for a in family.architectures) == sorted(BUILDERS)


@pytest.mark.parametrize("architecture", sorted(BUILDERS))
def test_the_family_gives_transformers_hidden_states(architecture, tmp_path):
    import transformers

    from attnserve.models.api import load_encoder
    from attnserve.models.families import family_of
    from attnserve.models.pretrained import load_model

    build, class_name = BUILDERS[architecture]
    folder = build(tmp_path / architecture)
    model = load_model(folder)
    assert model.architecture == architecture
    encoder = load_encoder("full", max_length=512, model=folder)
    assert encoder.family is family_of(architecture)
    reference = getattr(transformers, class_name).from_pretrained(folder, add_pooling_layer=False).eval()
    generator = torch.Generator().manual_seed(0)
    special = min(model.vocab_size - 1, 5)
    ids = torch.randint(special, model.vocab_size, (len(LENGTHS), max(LENGTHS)), generator=generator)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    ids = ids * mask + reference.config.pad_token_id * (1 - mask)  # padding as a tokenizer pads
    with torch.no_grad():
        ours = encoder(ids, mask)[1]
        theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max() <= 1e-4
