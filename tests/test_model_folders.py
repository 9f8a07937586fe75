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

from http_checks import check_attention_formats  # noqa: E402
from model_folders import HIDDEN, MAX_SEQ_LENGTH, bert_folder, sentence_transformers_vectors, xlm_roberta_folder  # noqa: E402
from attnserve.models import load_encoder, variant_names  # noqa: E402
from attnserve.data import DEV_DOCUMENTS, read_jsonl  # noqa: E402
from attnserve.contract.model_folder import DEFAULT_MODEL_NAME, ModelError, read_model_folder  # noqa: E402

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
    ours = encoder.embed(TEXTS, normalize=encoder.shape.normalize)
    assert ours.shape == (len(TEXTS), HIDDEN)
    assert (ours - reference).abs().max() <= 1e-4
    _, pooling, normalize = FOLDERS[name]
    assert (encoder.shape.pooling, encoder.shape.normalize) == (pooling, normalize)
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(TEXTS))) == normalize
    # By default the vectors /embed gives: the same, L2-normalised.
    assert (encoder.embed(TEXTS) - torch.nn.functional.normalize(reference, dim=1)).abs().max() <= 1e-4


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
    with pytest.raises(ValueError, match=r"schedule 'linformer\*5,longformer' covers 6 layers, which does not divide the model's 2"):
        load_encoder("linformer*5,longformer", 512, model=folders["bert-mean"])


# -- export and serving ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def xlmr_export(folders):
    """The export `serve --model DIR` makes of longformer over the XLM-RoBERTa folder (its
    attention-map and rank-collapse graphs too), from the suite's export cache: the folder is
    built the same every run (tests/model_folders.py), so its recipe is. The tests below compare
    ONNX Runtime with PyTorch and sentence-transformers themselves."""
    from export_helpers import export_path

    return export_path("longformer", EXPORT_LENGTH, model=folders["xlmr-cls"])


def test_the_export_records_the_model(folders, xlmr_export):
    from attnserve.contract.export_format import read_manifest

    model = read_model_folder(folders["xlmr-cls"])
    manifest = read_manifest(xlmr_export)
    assert manifest.model.name == "xlmr-cls" and manifest.model.sha256 == model.sha256
    assert (manifest.model.pooling, manifest.model.normalize) == ("cls", True)
    assert manifest.recipe["model"] == {"name": "xlmr-cls", "sha256": model.sha256, "files_sha256": model.files_sha256}
    assert (manifest.hidden_size, manifest.num_layers, manifest.num_heads) == (HIDDEN, 2, 4)
    assert (xlmr_export / "tokenizer.json").read_bytes() == (folders["xlmr-cls"] / "tokenizer.json").read_bytes()


def test_the_served_export_gives_sentence_transformers_vectors(folders, xlmr_export):
    """Short texts: longformer is full attention there, so the served vectors (the model's cls
    pooling by default) are sentence-transformers'; a long one: ONNX Runtime's are PyTorch's."""
    from attnserve.service.embedder import Embedder

    embedder = Embedder(xlmr_export, threads=1)
    assert (embedder.tokenizer.cls_id, embedder.tokenizer.sep_id) == (0, 2)  # <s> and </s>, read from the tokenizer
    reference = sentence_transformers_vectors(folders["xlmr-cls"], TEXTS).numpy()
    assert np.abs(embedder.embed(TEXTS) - reference).max() <= 1e-4
    encoder = load_encoder("longformer", EXPORT_LENGTH, model=folders["xlmr-cls"])
    served = embedder.embed([LONG_TEXT], truncate=True)
    assert np.abs(served - encoder.embed([LONG_TEXT]).numpy()).max() <= 1e-4


def test_info_and_embeddings_name_the_model(folders, xlmr_export):
    from fastapi.testclient import TestClient

    from attnserve.service.app import create_app
    from attnserve.service.settings import Settings

    sha = read_model_folder(folders["xlmr-cls"]).sha256
    with TestClient(create_app(Settings(export_dir=xlmr_export, intra_op_threads=1))) as client:
        info = client.get("/info").json()
        assert info["model"] == {"name": "xlmr-cls", "sha256": sha, "pooling": "cls", "normalize": True,
                                 "architecture": "xlm-roberta", "max_positions": 512, "max_seq_length": 128,
                                 "position_scaling": None}
        assert info["past_trained_length"] is True  # 1,024 tokens over a 512-row table
        assert info["model_name"] == "attnserve-longformer-xlmr-cls" and info["pooling"]["mode"] == "cls"
        answer = client.post("/v1/embeddings", json={"input": TEXTS[:2], "model": info["model_name"]}).json()
        assert answer["model"] == "attnserve-longformer-xlmr-cls"
        assert info["num_layers"] == 2
        body, _, _ = check_attention_formats(client, TEXTS[0], layer=1, atol=1e-4, opening="<s>")
        assert body["tokens"][-1] == "</s>"
    reference = sentence_transformers_vectors(folders["xlmr-cls"], TEXTS[:2]).numpy()
    assert np.abs(np.array([d["embedding"] for d in answer["data"]]) - reference).max() <= 1e-4


def test_a_lasttoken_model_without_normalize_exports_its_own_pooling(folders, tmp_path):
    """The graph's sentence_embedding is the model's: the last token's vector, not normalised."""
    from attnserve.export.exporter import export_model
    from attnserve.export.recipe import Recipe
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.tokenizer import TextTokenizer

    recipe = Recipe.resolve("full", {}, 512, analysis=False, model=folders["bert-lasttoken"])
    out = export_model(recipe, tmp_path / "export", log=lambda *a: None)
    runner = OnnxRunner(out, intra_op_threads=1)
    tokenized = TextTokenizer(out / "tokenizer.json", 512).encode(TEXTS[:1], truncate=False)
    ids = np.array([tokenized[0].ids])
    reference = sentence_transformers_vectors(folders["bert-lasttoken"], TEXTS[:1]).numpy()
    assert np.abs(runner.embed(ids, np.ones_like(ids)) - reference).max() <= 1e-4
    assert runner.manifest["outputs"]["sentence_embedding"]["note"] == "lasttoken-pooled"


def test_serving_passes_the_model_on_and_refuses_an_export_of_another(folders, xlmr_export):
    from attnserve.contract.export_format import ExportError
    from attnserve.service.exports import check_export_fits, export_command, exporter_args
    from attnserve.service.settings import Settings

    settings = Settings(model=folders["bert-mean"], variant="local")
    assert exporter_args(settings)[:6] == ["--variant", "local", "--max-length", "16384", "--model", str(folders["bert-mean"])]
    assert f"--model {folders['bert-mean']}" in export_command(settings)
    check_export_fits(xlmr_export, Settings(model=folders["xlmr-cls"]))
    with pytest.raises(ExportError, match=r"exported from the model xlmr-cls \(sha256 \w+\), not bert-mean"):
        check_export_fits(xlmr_export, Settings(model=folders["bert-mean"]))


# -- refusals -------------------------------------------------------------------------------


def broken(folder, tmp_path, change):
    """A copy of `folder` with `change(copy)` applied."""
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    change(copy)
    return copy


def first_rows(folder, rows: int) -> None:
    """The folder's word embeddings cut to their first `rows` rows (its tokenizer keeps its own)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("word_embeddings.weight"))
    tensors[name] = tensors[name][:rows].contiguous()
    save_file(tensors, str(folder / "model.safetensors"))


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


REFUSALS = {
    "unknown architecture": (lambda d: edit_json(d / "config.json", architectures=["DebertaV2Model"], model_type="deberta-v2"),
                             r"config.json: architecture DebertaV2Model is not supported; attnserve runs BertModel, XLMRobertaModel, "
                             r"ModernBertModel, NomicBertModel, GteModel"),
    "a decoder": (lambda d: edit_json(d / "config.json", architectures=["Qwen3Model"], model_type="qwen3"),
                  r"config.json: architecture Qwen3Model is not supported"),
    "missing tokenizer": (lambda d: (d / "tokenizer.json").unlink(), r"tokenizer.json: missing; attnserve serves"),
    "mismatched shapes": (lambda d: edit_json(d / "config.json", hidden_size=64),
                          r"model.safetensors: embeddings.word_embeddings.weight has shape \[30522, 32\], \S+config.json gives \[30522, 64\]"),
    "fewer layers": (lambda d: edit_json(d / "config.json", num_hidden_layers=3), r"model.safetensors: holds 2 layers, \S+ gives num_hidden_layers 3"),
    "max pooling": (lambda d: edit_json(d / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True),
                    r"1_Pooling/config.json: pooling pooling_mode_max_tokens is not supported"),
    "a Dense module": (lambda d: (d / "modules.json").write_text(json.dumps(
        [*json.loads((d / "modules.json").read_text()), {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}])),
        r"modules.json: module sentence_transformers.models.Dense is not supported"),
    "a vocabulary past the embeddings": (lambda d: (edit_json(d / "config.json", vocab_size=1000), first_rows(d, 1000)),
                                         r"tokenizer.json: gives token ids up to 30521, but \S+config.json has vocab_size 1000"),
    "custom code": (lambda d: edit_json(d / "config.json", auto_map={"AutoModel": "modeling_custom.CustomBert"}),
                    r"config.json: auto_map names the folder's own code \(AutoModel\)"),
    "cut-short weights": (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-1000]),
                          r"model.safetensors: not a readable safetensors file \(\d+ bytes where its header places tensors"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_folder_that_is_not_a_supported_model_is_exit_2_and_nothing_is_written(folders, tmp_path, capsys, case):
    from attnserve.export.exporter import main
    from attnserve.export.recipe import Recipe

    change, message = REFUSALS[case]
    folder = broken(folders["bert-mean"], tmp_path, change)
    out = tmp_path / "out"
    assert main(["--model", str(folder), "--variant", "full", "--max-length", "512", "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("attnserve export: error: ") and str(folder) in said
    assert __import__("re").search(message, said), said
    assert not out.exists()
    # The recipe reads the folder: it is refused before any cache folder, lock or export exists.
    with pytest.raises(ModelError):
        Recipe.resolve("full", {}, 512, model=folder)


def test_serve_refuses_such_a_folder_with_exit_2(folders, tmp_path, capsys):
    from attnserve.cli import main

    folder = broken(folders["xlmr-cls"], tmp_path, lambda d: (d / "tokenizer.json").unlink())
    status = main(["serve", "--model", str(folder), "--models-dir", str(tmp_path / "models"), "--port", "0"])
    assert status == 2
    assert f"{folder / 'tokenizer.json'}: missing" in capsys.readouterr().err
    assert not (tmp_path / "models").exists() or list((tmp_path / "models").iterdir()) == []


def test_weights_trained_on_another_model_are_refused_naming_both(folders, tmp_path):
    from safetensors.torch import save_file

    from attnserve.models.weights import save_weights
    from attnserve.contract.export_format import WeightsError

    weights = tmp_path / "weights"
    weights.mkdir()
    save_file({"layers.0.attention.E": torch.zeros(1)}, str(weights / "weights.safetensors"))
    meta = {"variant": "linformer", "parameters": {}, "max_length": 512}
    (weights / "adapt.json").write_text(json.dumps(meta))  # written before models were recorded: the bundled one's
    with pytest.raises(WeightsError, match=rf"trained for the model {DEFAULT_MODEL_NAME}, not bert-mean \(sha256 \w+\)"):
        load_encoder("linformer", 512, model=folders["bert-mean"], weights=weights)
    tiny = read_model_folder(folders["bert-mean"])
    (weights / "adapt.json").write_text(json.dumps({**meta, "model": tiny.record}))
    with pytest.raises(WeightsError, match=rf"trained for the model bert-mean \(sha256 {tiny.sha256[:12]}\), not {DEFAULT_MODEL_NAME}"):
        load_encoder("linformer", 512, weights=weights)
    # weights.safetensors names its model too, for a folder without adapt.json.
    alone = tmp_path / "alone"
    save_weights(load_encoder("linformer", 512, model=folders["bert-mean"]), alone, ["layers.0.attention.E"])
    with pytest.raises(WeightsError, match=rf"trained for the model bert-mean \(sha256 {tiny.sha256[:12]}\), not {DEFAULT_MODEL_NAME}"):
        load_encoder("linformer", 512, weights=alone)
    assert load_encoder("linformer", 512, model=folders["bert-mean"], weights=alone).weights["tensors"] == 1


def test_adapt_trains_for_the_folder_given_and_its_weights_serve_it_only(folders, tmp_path):
    """`attnserve adapt --model DIR`: the teacher is the folder's own model at its own length,
    windows are wrapped in its special tokens (<s> ... </s>), and adapt.json names it."""
    import gzip

    from attnserve.data import TRAIN_DOCUMENTS
    from attnserve.cli import main
    from attnserve.contract.export_format import WeightsError

    data = tmp_path / "train.jsonl.gz"
    with gzip.open(data, "wt") as f:
        for row in read_jsonl(TRAIN_DOCUMENTS, limit=8):
            f.write(json.dumps(row) + "\n")
    out = tmp_path / "adapted"
    assert main(["adapt", "variant", "--model", str(folders["xlmr-cls"]), "--variant", "linformer", "--param", "k=8",
                 "--max-length", "256", "--data", str(data), "--out", str(out), "--window", "64", "--batch", "2",
                 "--holdout", "3", "--eval-seconds", "0", "--max-steps", "2", "--threads", "1"]) == 0
    meta = json.loads((out / "adapt.json").read_text())
    model = read_model_folder(folders["xlmr-cls"])
    assert meta["model"] == model.record and meta["steps"] == 2
    assert meta["teacher"] == "full attention, pretrained xlmr-cls, 64 tokens"
    assert meta["trained"] == {f"layers.{i}.attention.E": [8, 256] for i in range(2)}
    adapted = load_encoder("linformer", 256, model=folders["xlmr-cls"], weights=out, k=8)
    assert adapted.weights["tensors"] == 2 and adapted.special_ids == (0, 2)
    with pytest.raises(WeightsError, match=r"trained for the model xlmr-cls"):
        load_encoder("linformer", 256, weights=out, k=8)
    # The teacher's length is the model's: a window past its positions is refused, naming them.
    assert main(["adapt", "variant", "--model", str(folders["xlmr-cls"]), "--variant", "linformer", "--max-length", "1024",
                 "--data", str(data), "--out", str(tmp_path / "no"), "--window", "600"]) == 2


def test_an_edited_folder_gets_a_new_export_that_serves_the_change(folders, tmp_path):
    """The recipe's model covers every file read from the folder: after its pooling and its
    tokenizer change, the same weights make another export (not the cached one), and a server
    of it pools and tokenizes as the folder now says; weights are still matched on the weights."""
    from fastapi.testclient import TestClient

    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe
    from attnserve.service.app import create_app
    from attnserve.service.runtime import OnnxRunner
    from attnserve.service.settings import Settings

    folder = shutil.copytree(folders["bert-mean"], tmp_path / "bert-mean")
    cache = tmp_path / "cache"
    before = cached_export(cache, Recipe.resolve("full", {}, 128, analysis=False, model=folder), log=lambda m: None)
    edit_json(folder / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["normalizer"]["lowercase"] = False  # MiniLM's tokenizer lowercases: now "Hello" is another token
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    edit_json(folder / "tokenizer_config.json", do_lower_case=False)  # as transformers' loader reads it (sentence-transformers)
    edited, original = read_model_folder(folder), read_model_folder(folders["bert-mean"])
    assert edited.sha256 == original.sha256 and edited.files_sha256 != original.files_sha256 and edited.same_as(original.record)
    after = cached_export(cache, Recipe.resolve("full", {}, 128, analysis=False, model=folder), log=lambda m: None)
    assert after != before and sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted([before.name, after.name])
    assert before.name.startswith("bert-mean--full-L128-") and after.name.startswith("bert-mean--full-L128-")  # says which model
    texts = ["Hello World", "a second text"]
    with TestClient(create_app(Settings(model=folder, export_dir=after), runner=OnnxRunner(after, intra_op_threads=1),
                               tokenizer_path=after / "tokenizer.json")) as client:
        assert client.get("/info").json()["pooling"]["mode"] == "cls"
        assert [t["text"] for t in client.post("/tokenize", json={"inputs": "Hello"}).json()[0]][1] != "hello"
        served = np.array(client.post("/embed", json={"inputs": texts}).json())
    assert np.abs(served - sentence_transformers_vectors(folder, texts).numpy()).max() <= 1e-4
    # The export made before the edit is refused for the folder as it is now.
    from attnserve.contract.export_format import ExportError
    from attnserve.service.exports import check_export_fits

    with pytest.raises(ExportError, match="export it again"):
        check_export_fits(before, Settings(model=folder, export_dir=before))
