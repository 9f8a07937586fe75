"""Tiny random sentence-transformers folders, built locally (nothing downloaded): a BERT one
with the bundled MiniLM's WordPiece tokenizer, and an XLM-RoBERTa one with a small Unigram
tokenizer (<s> ... </s>) trained here on the dev documents. transformers' save_pretrained
writes config.json and model.safetensors; the sentence-transformers files (modules.json,
1_Pooling/config.json, sentence_bert_config.json) are written as sentence-transformers saves
them. Seeded, so a folder's weights (and the export cache's key) are the same every run."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

HIDDEN, LAYERS, HEADS, INTERMEDIATE = 32, 2, 4, 64
MAX_SEQ_LENGTH = 128
BERT_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def write_sentence_transformers_files(folder: Path, pooling: str, normalize: bool, hidden: int = HIDDEN,
                                      max_seq_length: int = MAX_SEQ_LENGTH) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    flags = {"pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
             "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
             "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": pooling == "lasttoken",
             "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden, **flags}, indent=2))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))


def bert_folder(folder: Path, pooling: str = "mean", normalize: bool = True, seed: int = 0) -> Path:
    """A random 2-layer BertModel (hidden 32, 4 heads, 512 positions) with MiniLM's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    from attnserve.models.pretrained import model_dir

    folder.mkdir(parents=True, exist_ok=True)
    config = BertConfig(vocab_size=30522, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        intermediate_size=INTERMEDIATE, max_position_embeddings=512, type_vocab_size=2)
    torch.manual_seed(seed)
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    for name in BERT_TOKENIZER_FILES:
        shutil.copyfile(model_dir() / name, folder / name)
    write_sentence_transformers_files(folder, pooling, normalize)
    return folder


def unigram_tokenizer(folder: Path) -> int:
    """Train a small Unigram tokenizer wrapping texts in <s> ... </s> (XLM-RoBERTa's
    specials: <s> 0, <pad> 1, </s> 2, <unk> 3) on the dev documents and save it with
    transformers' PreTrainedTokenizerFast (tokenizer.json, tokenizer_config.json). Returns its
    vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from attnserve.data import DEV_DOCUMENTS, read_jsonl

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = trainers.UnigramTrainer(vocab_size=800, special_tokens=specials, unk_token="<unk>", show_progress=False)
    tokenizer.train_from_iterator([row["text"] for row in read_jsonl(DEV_DOCUMENTS)[:40]], trainer)
    # The trainer's threads sum its scores in any order (their last digits differ per run), and
    # it appends the characters it must keep, each a step below the last, in a hash map's order:
    # tokenizer.json's sha256, hence every export recipe of the folder (the suite's export
    # cache), would differ per run. Scores rounded, ties by piece, appended characters sorted.
    spec = json.loads(tokenizer.to_str())
    entries = [(piece, round(score, 8)) for piece, score in spec["model"]["vocab"][len(specials):]]
    floor = min(score for piece, score in entries if len(piece) > 1)
    trained = sorted((entry for entry in entries if entry[1] >= floor), key=lambda entry: (-entry[1], entry[0]))
    kept = sorted(piece for piece, score in entries if score < floor)
    step_from = max((score for _, score in entries if score < floor), default=floor)
    spec["model"]["vocab"] = ([[piece, 0.0] for piece in specials] + [list(entry) for entry in trained]
                              + [[piece, round(step_from - 1e-4 * i, 8)] for i, piece in enumerate(kept)])
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", cls_token="<s>", sep_token="</s>")
    fast.save_pretrained(folder)
    return tokenizer.get_vocab_size()


def xlm_roberta_folder(folder: Path, pooling: str = "cls", normalize: bool = True, seed: int = 1, positions: int = 514) -> Path:
    """A random 2-layer XLMRobertaModel (hidden 32, 4 heads, `positions` positions from offset 2:
    514 as XLM-RoBERTa's, 8,194 as bge-m3's; one token type) with a Unigram tokenizer."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    folder.mkdir(parents=True, exist_ok=True)
    vocab = unigram_tokenizer(folder)
    config = XLMRobertaConfig(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                              intermediate_size=INTERMEDIATE, max_position_embeddings=positions, type_vocab_size=1,
                              pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    write_sentence_transformers_files(folder, pooling, normalize)
    return folder


def sentence_transformers_vectors(folder: Path, texts: list[str]):
    """What sentence-transformers computes for `texts` with the folder (its own modules)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, convert_to_tensor=True)


def modernbert_folder(folder: Path, pooling: str = "mean", normalize: bool = True, seed: int = 2, layers: int = 4,
                      hidden: int = 64, heads: int = 4, intermediate: int = 96, window: int = 16, every: int = 3,
                      max_positions: int = 2048, max_seq_length: int | None = None) -> Path:
    """A random ModernBertModel (global attention every `every` layers from layer 0, a window
    of `window` tokens on the others, RoPE, no biases) with MiniLM's WordPiece tokenizer as
    ModernBERT's own wraps texts: [CLS] ... [SEP]."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    from attnserve.models.pretrained import model_dir

    folder.mkdir(parents=True, exist_ok=True)
    config = ModernBertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                              intermediate_size=intermediate, max_position_embeddings=max_positions, local_attention=window,
                              global_attn_every_n_layers=every, pad_token_id=0, bos_token_id=101, eos_token_id=102,
                              cls_token_id=101, sep_token_id=102)
    torch.manual_seed(seed)
    ModernBertModel(config).eval().save_pretrained(folder)
    for name in BERT_TOKENIZER_FILES:
        shutil.copyfile(model_dir() / name, folder / name)
    write_sentence_transformers_files(folder, pooling, normalize, hidden=hidden, max_seq_length=max_seq_length or max_positions)
    return folder


def rotary_bert_folder(folder: Path, architecture: str, pooling: str = "mean", normalize: bool = True, seed: int = 3,
                       layers: int = 4, hidden: int = 64, heads: int = 4, intermediate: int = 96, trained: int = 256,
                       rope: dict | None = None) -> Path:
    """A random NomicBertModel (architecture nomic_bert: silu, no biases, theta 1,000) or
    GteModel (gte: gelu, biases, theta 160,000), trained length `trained`, with dynamic NTK
    scaling (factor 2) unless `rope` says otherwise, and MiniLM's WordPiece tokenizer (both
    models' English versions use BERT's vocabulary)."""
    import torch
    from transformers import GteConfig, GteModel, NomicBertConfig, NomicBertModel

    from attnserve.models.pretrained import model_dir

    folder.mkdir(parents=True, exist_ok=True)
    config_class, model_class, theta = {"nomic_bert": (NomicBertConfig, NomicBertModel, 1000.0),
                                        "gte": (GteConfig, GteModel, 160000.0)}[architecture]
    config = config_class(vocab_size=30528, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                          intermediate_size=intermediate, max_position_embeddings=trained, pad_token_id=0,
                          rope_parameters=rope or {"rope_type": "dynamic", "rope_theta": theta, "factor": 2.0})
    torch.manual_seed(seed)
    model_class(config).eval().save_pretrained(folder)
    for name in BERT_TOKENIZER_FILES:
        shutil.copyfile(model_dir() / name, folder / name)
    write_sentence_transformers_files(folder, pooling, normalize, hidden=hidden, max_seq_length=4096)
    return folder


HUB_REPO = "acme/tiny-bert"
HUB_MAIN, HUB_TAGGED = "a" * 40, "b" * 40  # commits


def hub_cache(root: Path) -> Path:
    """A Hugging Face hub cache (the folder HF_HUB_CACHE names, HF_HOME/hub) holding
    acme/tiny-bert at main (a mean-pooled BERT folder) and at tag v1 (the same with cls pooling),
    in huggingface_hub's layout: models--org--name/refs and snapshots/<commit> with the files."""
    repo = root / "models--acme--tiny-bert"
    for commit, pooling in ((HUB_MAIN, "mean"), (HUB_TAGGED, "cls")):
        bert_folder(repo / "snapshots" / commit, pooling=pooling)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_MAIN)
    (repo / "refs" / "v1").write_text(HUB_TAGGED)
    return root


def minilm_folder(folder: Path, layers: int = 2) -> Path:
    """The bundled all-MiniLM-L6-v2 cut to its first `layers` layers: its own trained weights,
    tokenizer and pooling files, config.json's num_hidden_layers set to match. What makes an
    export faithful is per layer, so two trained layers test it on real attention patterns at
    a third of the six layers' export and run time."""
    from safetensors.numpy import load_file, save_file

    from attnserve.models.pretrained import model_dir

    source = model_dir()
    if folder.exists():
        shutil.rmtree(folder)
    rewritten = {"model.safetensors", "config.json", "README.md"}
    shutil.copytree(source, folder, ignore=lambda where, names: rewritten & set(names) if Path(where) == source else set())
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))

    def layer(name: str) -> int:  # encoder.layer.3.attention... -> 3; -1 outside the layers
        match = re.search(r"\.layer\.(\d+)\.", name)
        return int(match.group(1)) if match else -1

    kept = {name: tensor for name, tensor in load_file(source / "model.safetensors").items() if layer(name) < layers}
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    return folder
