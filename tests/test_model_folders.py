"""Your own encoder: any BERT or XLM-RoBERTa sentence-transformers folder (`--model DIR`).

Tiny random folders built here (tests/model_folders.py: transformers' save_pretrained and the
sentence-transformers files; nothing downloaded). What each must show: `full` gives what
sentence-transformers gives for the same folder (its pooling: mean, cls or lasttoken, and its
Normalize or none); every variant and a schedule run over it; the export records the model and
serves it (ONNX Runtime against PyTorch and sentence-transformers, /info and /v1/embeddings name
it); a folder that is not a supported model, and weights trained on another model, are refused
naming the file or both models, with nothing left half-written.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from model_folders import HIDDEN, MAX_SEQ_LENGTH, bert_folder, sentence_transformers_vectors, xlm_roberta_folder  # noqa: E402
from attnserve.models import load_encoder, variant_names  # noqa: E402
from attnserve.models.documents import DEV_DOCUMENTS, read_jsonl  # noqa: E402
from attnserve.service.contract.model_folder import DEFAULT_MODEL_NAME, ModelError, read_model_folder  # noqa: E402

ROWS = read_jsonl(DEV_DOCUMENTS)
TEXTS = [r["query"] for r in ROWS[:12]] + ["", "a", "Ünïcödé — 漢字 and emoji 🙂 survive too."]
LONG_TEXT = " ".join(" ".join(r["text"] for r in ROWS[:3]).split()[:900])
# name -> (builder, pooling, Normalize module)
FOLDERS = {"bert-mean": (bert_folder, "mean", True), "bert-lasttoken": (bert_folder, "lasttoken", False),
           "xlmr-cls": (xlm_roberta_folder, "cls", True), "xlmr-mean": (xlm_roberta_folder, "mean", False)}
EXPORT_LENGTH = 1024


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: build(root / name, pooling=pooling, normalize=normalize) for name, (build, pooling, normalize) in FOLDERS.items()}


@pytest.mark.parametrize("name", list(FOLDERS))
def test_full_matches_sentence_transformers(folders, name):
    folder = folders[name]
    encoder = load_encoder("full", 512, model=folder)
    assert max(len(ids) for ids in encoder.tokenize(TEXTS)) <= MAX_SEQ_LENGTH  # sentence-transformers cuts there
    reference = sentence_transformers_vectors(folder, TEXTS)
    ours = encoder.embed(TEXTS)
    assert ours.shape == (len(TEXTS), HIDDEN)
    assert (ours - reference).abs().max() <= 1e-4
    _, pooling, normalize = FOLDERS[name]
    assert (encoder.shape.pooling, encoder.shape.normalize) == (pooling, normalize)
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(TEXTS))) == normalize


def test_the_folder_sentence_transformers_saves_reads_the_same(folders, tmp_path):
    """sentence-transformers 6 writes other module type names and `pooling_mode` in place of
    the flags: the same model, the same vectors."""
    from sentence_transformers import SentenceTransformer

    SentenceTransformer(str(folders["xlmr-cls"]), device="cpu").save(str(tmp_path / "saved"))
    saved, original = read_model_folder(tmp_path / "saved"), read_model_folder(folders["xlmr-cls"])
    assert (saved.architecture, saved.pooling, saved.normalize, saved.max_positions, saved.position_offset) == \
        (original.architecture, original.pooling, original.normalize, original.max_positions, original.position_offset) == \
        ("xlm-roberta", "cls", True, 512, 2)
    reference = sentence_transformers_vectors(folders["xlmr-cls"], TEXTS)
    assert (load_encoder("full", 512, model=tmp_path / "saved").embed(TEXTS) - reference).abs().max() <= 1e-4


def test_the_model_is_read_from_its_folder(folders):
    model = read_model_folder(folders["xlmr-cls"])
    assert (model.name, model.num_layers, model.num_heads, model.hidden_size, model.vocab_size) == ("xlmr-cls", 2, 4, 32, 800)
    assert model.max_seq_length == MAX_SEQ_LENGTH and len(model.sha256) == 64
    default = load_encoder("full", 64).model
    assert (default.name, default.architecture, default.pooling, default.normalize) == (DEFAULT_MODEL_NAME, "bert", "mean", True)


@pytest.mark.parametrize("variant", variant_names())
def test_every_variant_runs_over_an_xlm_roberta_folder(folders, variant):
    encoder = load_encoder(variant, EXPORT_LENGTH, model=folders["xlmr-cls"])
    vectors = encoder.embed([LONG_TEXT, TEXTS[0]])
    assert vectors.shape == (2, HIDDEN) and torch.isfinite(vectors).all()
    assert torch.allclose(vectors.norm(dim=1), torch.ones(2), atol=1e-5)
    assert len(encoder.tokenize([LONG_TEXT])[0]) == EXPORT_LENGTH  # the long text fills max_length


def test_schedules_repeat_over_the_models_layers(folders):
    encoder = load_encoder("local,full", 512, model=folders["bert-mean"])
    assert [layer.attention.config.variant for layer in encoder.layers] == ["local", "full"]
    with pytest.raises(ValueError, match=r"schedule linformer\*5,longformer does not fit the model's 2 layers"):
        load_encoder("linformer*5,longformer", 512, model=folders["bert-mean"])
