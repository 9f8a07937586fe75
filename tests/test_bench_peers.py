"""`attnserve bench peers`' helpers and refusals; its small end-to-end run (every system on the
same texts, their vectors agreeing) goes through the installed wheel in
tests/test_wheel_install.py. The benchmark is run by hand for its numbers: nothing here reads a
timing."""
from __future__ import annotations

import subprocess
import sys

from attnserve.bench.peers import enc_text, least_cosines, summarize


def test_an_unknown_peer_is_exit_2():
    done = subprocess.run([sys.executable, "-m", "attnserve", "bench", "peers", "--peers", "tei"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown peer 'tei'" in done.stderr


def test_texts_are_cut_at_token_offsets():
    text = "alpha beta gamma delta"
    offsets = [(0, 5), (6, 10), (11, 16), (17, 22)]
    assert enc_text(text, offsets, 1, 3) == "beta gamma"


def test_summary_takes_the_median_round_and_a_peers_best_batch_size():
    """Each system's row is its median items/s over the rounds with their min and max; a peer is
    reported at its best batch_size, every batch_size's median kept. attnserve over HTTP is
    compared with the best peer served over HTTP (infinity), in process with the best library."""
    def run(system, batch_size, per_second, round_):
        return {"workload": "short", "concurrency": 1, "system": system, "batch_size": batch_size, "round": round_,
                "per_second": per_second, "latencies": [0.1, 0.2], "least_cosine": 0.99999}

    runs = [run("attnserve HTTP", None, r, i) for i, r in enumerate((10.0, 30.0, 20.0))]
    runs += [run("infinity", b, r, i) for b, rates in ((8, (4.0, 5.0, 6.0)), (32, (8.0, 10.0, 9.0))) for i, r in enumerate(rates)]
    runs += [run("attnserve in process", None, 12.0, i) for i in range(3)]
    runs += [run("sentence-transformers", 4, r, i) for i, r in enumerate((5.0, 6.0, 7.0))]
    runs += [run("sentence-transformers", 32, r, i) for i, r in enumerate((3.0, 4.0, 2.0))]
    http, infinity, in_process, st = summarize(runs, ["infinity", "sentence-transformers"])
    assert (http["per_second"], http["min"], http["max"], http["rounds"]) == (20.0, 10.0, 30.0, 3)
    assert infinity["batch_size"] == 32 and infinity["batch_sizes"] == {"8": 5.0, "32": 9.0}
    assert st["batch_size"] == 4 and st["per_second"] == 6.0 and st["batch_sizes"] == {"4": 6.0, "32": 3.0}
    assert http["over_best_peer"] == 20.0 / 9.0 and infinity["over_best_peer"] == 1.0
    assert in_process["over_best_peer"] == 2.0 and st["over_best_peer"] == 1.0
    assert summarize(runs[:3], [])[0]["over_best_peer"] is None  # no peer, no ratio


def test_every_requests_vectors_are_compared():
    same, other = [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]
    assert least_cosines([same, other], [same, same]) == [1.0, 0.0]
    assert least_cosines([[[1.0, 0.0]]], [same]) == [-1.0]  # a missing vector cannot pass


def test_chunks_start_at_words():
    from attnserve.bench.peers import chunk_starts

    # words 0 0 1 2 2 2 3 4: a start that falls inside a word moves back to the word's first
    # token, so no chunk is longer than chunk_tokens
    assert chunk_starts([0, 0, 1, 2, 2, 2, 3, 4], 3) == [0, 3, 6]
    assert chunk_starts([0, 0, 1, 2, 2, 2, 3, 4], 2) == [0, 2, 3, 4, 6]  # a word longer than a chunk is cut
    assert chunk_starts([0, 1, 2, 3, 4], 2) == [0, 2, 4]


def test_fastembeds_model_is_the_fused_graph_with_sentence_transformers_vectors(tmp_path):
    """fastembed gets the bundled model as fastembed's own files are, fused by onnxruntime's
    transformer optimizer (one Attention per layer), and its mean-pooled last_hidden_state over a
    padded batch is sentence-transformers' vector."""
    import json

    import numpy as np
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from attnserve.bench.peers import onnx_model_folder
    from attnserve.models.pretrained import model_dir

    folder = onnx_model_folder(tmp_path)
    fused = json.loads((folder / "fused.json").read_text())
    assert fused["Attention"] == 6 and fused["SkipLayerNormalization"] == 12 and fused["EmbedLayerNormalization"] == 1
    assert not list(tmp_path.glob(".*partial"))
    texts = ["short", "a longer passage on sparse attention and the cost of the full matrix " * 6, "two words"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encodings])
    mask = np.array([e.attention_mask for e in encodings])
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    reference = SentenceTransformer(str(model_dir()), device="cpu").encode(texts, normalize_embeddings=True)
    assert np.abs(pooled - reference).max() < 1e-4
