"""Each model family (attnserve.models.families) against transformers' own class for its
architectures: a small random model saved with save_pretrained, loaded as attnserve's encoder
with its own attention (native: full, and ModernBERT's windows on its local layers), gives
transformers' last hidden states on every real token of a padded batch. The pooled vectors (sentence-transformers' modules on top) are tests/test_model_folders.py's."""
from __future__ import annotations

import pytest
import torch
from model_folders import (
    bert_folder,
    modernbert_folder,
    rotary_bert_folder,
    xlm_roberta_folder,
)

# architecture (ModelFolder.architecture) -> (a folder builder, transformers' class of it, lengths
# padded into one batch: up to the 512-row position tables; ModernBERT's cross its 16-token window)
BUILDERS = {"bert": (bert_folder, "BertModel", [7, 200, 481]),
            "xlm-roberta": (xlm_roberta_folder, "XLMRobertaModel", [7, 200, 481]),
            "modernbert": (modernbert_folder, "ModernBertModel", [7, 200, 1500]),
            # Within the trained length (256): past it, transformers scales RoPE by the batch's padded
            # width and attnserve by each document's length (tests/test_rotary_bert.py compares those).
            "nomic_bert": (lambda folder: rotary_bert_folder(folder, "nomic_bert"), "NomicBertModel", [7, 200, 256]),
            "gte": (lambda folder: rotary_bert_folder(folder, "gte"), "GteModel", [7, 200, 256])}


def test_every_family_architecture_has_a_parity_case():
    from attnserve.models.families import FAMILIES

    assert sorted(a for family in FAMILIES for a in family.architectures) == sorted(BUILDERS)


@pytest.mark.parametrize("architecture", sorted(BUILDERS))
def test_the_family_gives_transformers_hidden_states(architecture, tmp_path):
    import transformers

    from attnserve.models.api import load_encoder
    from attnserve.models.families import family_of
    from attnserve.models.pretrained import load_model

    build, class_name, lengths = BUILDERS[architecture]
    folder = build(tmp_path / architecture)
    model = load_model(folder)
    assert model.architecture == architecture
    encoder = load_encoder("native", max_length=max(lengths), model=folder)
    assert encoder.family is family_of(architecture)
    extra = {"add_pooling_layer": False} if architecture in ("bert", "xlm-roberta") else {}
    reference = getattr(transformers, class_name).from_pretrained(folder, **extra).eval()
    generator = torch.Generator().manual_seed(0)
    special = min(model.vocab_size - 1, 5)
    ids = torch.randint(special, model.vocab_size, (len(lengths), max(lengths)), generator=generator)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    ids = ids * mask + reference.config.pad_token_id * (1 - mask)  # padding as a tokenizer pads
    with torch.no_grad():
        ours = encoder(ids, mask)[1]
        theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max() <= 1e-4


def test_an_xlm_roberta_of_8194_positions_takes_a_7984_token_document_whole(tmp_path):
    """bge-m3's shape: its own 8,192 positions cover the document, so full attention is the
    model itself (transformers' XLMRobertaModel), and longformer runs it too."""
    import transformers

    from attnserve.models.api import load_encoder

    folder = xlm_roberta_folder(tmp_path / "xlmr-8194", positions=8194)
    n = 7984
    ids = torch.randint(5, 800, (1, n), generator=torch.Generator().manual_seed(1))
    ids[0, 0], ids[0, -1] = 0, 2
    mask = torch.ones_like(ids)
    reference = transformers.XLMRobertaModel.from_pretrained(folder, add_pooling_layer=False).eval()
    with torch.no_grad():
        theirs = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        full = load_encoder("full", max_length=8192, model=folder)
        assert full.shape.max_positions == 8192
        assert (full(ids, mask)[1] - theirs).abs().max() <= 1e-4
        vector = load_encoder("longformer", max_length=8192, model=folder)(ids, mask)[0]
    assert vector.shape == (1, 32) and torch.isfinite(vector).all()
