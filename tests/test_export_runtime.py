"""Issue 3: the export command, its manifest, the ONNX Runtime runner, attention maps and
rank collapse from the analysis graph, and bad exports / bad input (must-show 4)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from export_helpers import SHARED_MAX_LENGTH, SHARED_VARIANT, get_export, padded_batch

VARIANT, MAX_LENGTH = SHARED_VARIANT, SHARED_MAX_LENGTH


@pytest.fixture(scope="module")
def export():
    return get_export(VARIANT, MAX_LENGTH, analysis=True)


@pytest.fixture(scope="module")
def runner(export):
    from attnserve.service.runtime import OnnxRunner

    return OnnxRunner(export[0], intra_op_threads=2)


def test_manifest_describes_the_export(export):
    import onnx

    from attnserve.contract.export_format import sha256

    export_dir, encoder = export
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["variant"] == VARIANT and manifest["max_length"] == MAX_LENGTH
    assert manifest["parameters"]["window"] == 512 and manifest["parameters"]["global_tokens"] == [0]
    assert manifest["hidden_size"] == 384 and manifest["num_layers"] == 6 and manifest["opset"] == 23
    assert manifest["length_multiple"] == 256
    assert manifest["sha256"] == sha256(export_dir / "model.onnx")
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(export_dir / name), name
    assert set(manifest["files"]) == {"model.onnx", "model.onnx.data", "analysis.onnx", "analysis.onnx.data", "collapse.onnx",
                                      "collapse.onnx.data", "short.onnx", "short.onnx.data", "tokenizer.json"}  # short: tests/test_short_inputs.py
    assert manifest["versions"]["torch"] == torch.__version__ and manifest["versions"]["onnx"] == onnx.__version__
    model = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    # The embedding graph computes nothing else (ONNX Runtime runs every node on every call);
    # the per-layer rank collapse is the analysis graph's last output.
    assert [o.name for o in model.graph.output] == ["sentence_embedding", "last_hidden_state"]
    assert manifest["graphs"]["analysis"]["outputs"][-1] == "rank_collapse"
    analysis = onnx.load(str(export_dir / "analysis.onnx"), load_external_data=False)
    assert [o.name for o in analysis.graph.output] == manifest["graphs"]["analysis"]["outputs"]
    for value in model.graph.input:  # batch and sequence stayed symbolic
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert all(d.dim_param for d in value.type.tensor_type.shape.dim)
    assert len(manifest["graphs"]["analysis"]["attention"]) == 6
    assert manifest["graphs"]["analysis"]["max_length"] == MAX_LENGTH  # longformer's maps are O(N * window)
    collapse = manifest["graphs"]["collapse"]  # tests/test_collapse.py checks its values
    assert collapse["paths"] == {path: f"collapse_{path}" for path in ("model", "attention_only", "attention_skip", "attention_mlp")}
    assert collapse["max_length"] == MAX_LENGTH // 4  # four paths in one batch: one max_length input's tokens
    assert collapse["outputs"] == list(collapse["paths"].values())


def test_runner_reports_the_provider_that_runs(runner):
    import onnxruntime as ort

    # Asked for CUDA then CPU (the default); where CUDA cannot run, the sessions never try it
    # and the runner says why.
    assert runner.requested_providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if runner.cuda_unavailable:
        assert runner.session_providers == ["CPUExecutionProvider"] and runner.provider == "CPUExecutionProvider"
    assert runner.provider == runner._session.get_providers()[0]
    assert runner.provider in ort.get_available_providers()
    if runner.provider == "CUDAExecutionProvider":
        assert runner.io_binding_device == "cuda"
    else:
        assert runner.provider == "CPUExecutionProvider" and runner.io_binding_device is None
    assert runner.variant == VARIANT and runner.max_length == MAX_LENGTH


def test_embedding_graphs_on_the_cpu_run_without_the_planners_buffer_reuse(runner):
    """DEVELOPERS.md, "Peak memory": ONNX Runtime's planner keeps every buffer it hands from a dead
    tensor to a later one for the whole run; the embedding graphs run without that reuse on
    the CPU (ModernBERT-base's peak at 2,048 tokens: 260-297 -> 106-121 MiB), the maps' graphs
    with it."""
    sessions = {"embedding": runner._session, "analysis": runner._lazy_session("analysis")}
    if runner._short is not None:
        sessions["short"] = runner._short
    on_cpu = runner.provider == "CPUExecutionProvider"
    reuse = {graph: session.get_session_options().enable_mem_reuse for graph, session in sessions.items()}
    assert reuse == {graph: graph == "analysis" or not on_cpu for graph in sessions}


def test_io_binding_path_gives_the_same_outputs(runner, monkeypatch):
    """The IO-binding path (what runs on CUDA) bound to host memory, the only device this
    machine has: same outputs as session.run, for both graphs."""
    ids, mask = padded_batch([300, 77], seed=6)
    outputs = ("sentence_embedding", "last_hidden_state")
    plain = runner.run(ids, mask, outputs)
    plain_map, plain_ratios = runner.attention(ids, mask, 2), runner.rank_collapse(ids, mask)
    monkeypatch.setattr(runner, "io_binding_device", "cpu")
    bound = runner.run(ids, mask, outputs)
    for name in outputs:
        np.testing.assert_array_equal(bound[name], plain[name])
    for got, expected in zip(runner.attention(ids, mask, 2), plain_map):
        np.testing.assert_array_equal(got, expected)
    assert runner.rank_collapse(ids, mask) == plain_ratios


def test_a_map_and_its_rank_collapse_take_one_run_of_the_analysis_graph(runner, monkeypatch):
    """/attention answers a map and the text's rank collapse: the ratios come from the map's
    own run (the analysis graph's last output), and are the same as a run of their own."""
    ids, mask = padded_batch([300], seed=7)
    runs = []
    session = runner._lazy_session("analysis")
    monkeypatch.setattr(runner, "_run", lambda s, names, *a, _run=runner._run: runs.append(names) or _run(s, names, *a))
    runner._last_ratios.clear()
    alone = runner.rank_collapse(ids, mask)
    assert runs == [["rank_collapse"]]
    runner.attention(ids, mask, 1)
    assert runs[-1][-1] == "rank_collapse" and len(runs) == 2
    assert runner.rank_collapse(ids, mask) == alone and len(runs) == 2  # reused, not run again
    other = padded_batch([200], seed=8)
    assert runner.rank_collapse(*other) != alone and len(runs) == 3  # another text runs
    assert session is runner._lazy_session("analysis")
    assert len(alone) == runner.num_layers and all(0 < r <= 1.5 for r in alone)


def test_embed_matches_the_encoder_on_real_text(export, runner):
    export_dir, encoder = export
    texts = ["The cat sat on the mat.", "ONNX Runtime serves the exported encoder. " * 40, "x"]
    ids = encoder.tokenize(texts)
    width = max(map(len, ids))
    batch = np.zeros((3, width), np.int64)
    mask = np.zeros((3, width), np.int64)
    for i, row in enumerate(ids):
        batch[i, : len(row)], mask[i, : len(row)] = row, 1
    expected = encoder.embed_ids(ids).numpy()  # the graph's own pooling (mean), as runner.embed gives it
    got = runner.embed(batch, mask)
    assert got.dtype == np.float32 and got.shape == (3, 384)
    assert np.abs(got - expected).max() <= 1e-4
    # Extra padding past max_length (but no real token past it) is accepted and changes nothing.
    wide = np.zeros((1, MAX_LENGTH + 100), np.int64)
    wide_mask = np.zeros_like(wide)
    wide[:, :width], wide_mask[:, :width] = batch[1], mask[1]
    assert np.abs(runner.embed(wide, wide_mask) - got[1:2]).max() <= 1e-5


@pytest.mark.parametrize("head", [None, 3])
def test_attention_map_matches_the_encoder(export, runner, head):
    export_dir, encoder = export
    text = "Attention maps come from the analysis graph, in the variant's compact form. " * 30
    ids = encoder.tokenize([text])[0][:700]
    n = len(ids)
    arr = np.array([ids], np.int64)
    for layer in (0, 5):
        rows, cols, values = runner.attention(arr, np.ones_like(arr), layer, head)
        with torch.no_grad():
            _, _, weights = encoder(torch.tensor(arr), torch.ones(1, n, dtype=torch.long), weights_layer=layer)
        from attnserve.models.sparse import to_sparse

        expected = to_sparse(weights, n, head)
        idx, val = expected.indices().numpy(), expected.values().numpy()
        np.testing.assert_array_equal(rows, idx[0])
        np.testing.assert_array_equal(cols, idx[1])
        assert np.abs(values - val).max() <= 1e-5
        assert rows.max() < n and cols.max() < n
        # Every real query's weights sum to 1.
        np.testing.assert_allclose(np.bincount(rows, weights=values, minlength=n), 1.0, atol=1e-4)


def test_attention_pieces_cover_the_whole_batch(export, runner):
    """attention_pieces: every layer of every document, in compact form, from one run; its
    first document's layer is what attention() turns into COO."""
    from attnserve.service.runtime import compact_to_coo

    ids, mask = padded_batch([300, 77], seed=4)
    pieces = runner.attention_pieces(ids, mask)
    assert len(pieces) == 6
    for layer in (0, 5):
        for rows, cols, probs in pieces[layer]:
            assert probs.shape[:2] == (2, 12) and rows.ndim == 3 and cols.ndim == 4
        first = compact_to_coo([(r[:1], c[:1], p[:1]) for r, c, p in pieces[layer]], 300, None, 12)
        for got, expected in zip(first, runner.attention(ids[:1, :300], mask[:1, :300], layer)):
            np.testing.assert_allclose(got, expected, atol=1e-6)


def test_rank_collapse_matches_the_encoder(export, runner):
    export_dir, encoder = export
    text = "Rank collapse: how close each layer's token states are to rank one. " * 20
    ids = np.array(encoder.tokenize([text]), np.int64)
    got = runner.rank_collapse(ids, np.ones_like(ids))
    assert len(got) == 6
    np.testing.assert_allclose(got, encoder.rank_collapse(text), atol=1e-4)


def test_too_long_input_is_refused(runner):
    ids, mask = padded_batch([MAX_LENGTH + 1])
    with pytest.raises(ValueError, match=f"longer than the export's max_length {MAX_LENGTH}"):
        runner.embed(ids, mask)
    with pytest.raises(ValueError, match="max_length"):
        runner.attention(ids, mask, 0, None)
    ok_ids, ok_mask = padded_batch([MAX_LENGTH])
    assert runner.embed(ok_ids, ok_mask).shape == (1, 384)
    # Attention maps (all layers at once) have their own, memory-bound limit.
    assert 0 < runner.attention_max_length <= MAX_LENGTH
    limit = runner.attention_max_length
    try:
        runner.attention_max_length = 50
        with pytest.raises(ValueError, match="limited to 50 tokens"):
            runner.attention(ok_ids[:, :51], ok_mask[:, :51], 0, None)
    finally:
        runner.attention_max_length = limit
    with pytest.raises(ValueError, match="layer"):
        runner.attention(ok_ids[:, :10], ok_mask[:, :10], 6, None)
    with pytest.raises(ValueError, match="head"):
        runner.attention(ok_ids[:, :10], ok_mask[:, :10], 0, 12)


def _copy(export, tmp_path):
    target = tmp_path / "export"
    shutil.copytree(export[0], target)
    return target


def test_missing_model_is_a_clear_error(export, tmp_path):
    from attnserve.service.runtime import ExportError, OnnxRunner

    target = _copy(export, tmp_path)
    (target / "model.onnx").unlink()
    with pytest.raises(ExportError, match=r"model\.onnx: missing"):
        OnnxRunner(target)
    shutil.rmtree(target)
    with pytest.raises(ExportError, match="does not exist"):
        OnnxRunner(target)
    target.mkdir()
    with pytest.raises(ExportError, match=r"manifest\.json: missing"):
        OnnxRunner(target)


def test_corrupt_model_is_a_clear_error(export, tmp_path):
    from attnserve.contract.export_format import sha256
    from attnserve.service.runtime import ExportError, OnnxRunner

    target = _copy(export, tmp_path)
    model = target / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    model.write_bytes(bytes(data))
    with pytest.raises(ExportError, match=r"model\.onnx: sha256 .* does not match manifest\.json"):
        OnnxRunner(target)
    # Even with a manifest rewritten to match, a file that is not ONNX is refused by name.
    model.write_bytes(b"this is not a protobuf" * 100)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["files"]["model.onnx"] = {"sha256": sha256(model), "bytes": model.stat().st_size}
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match=r"model\.onnx: ONNX Runtime cannot load it"):
        OnnxRunner(target)


def test_manifest_mismatch_is_a_clear_error(export, tmp_path):
    from attnserve.service.runtime import ExportError, OnnxRunner

    target = _copy(export, tmp_path)
    manifest_path = target / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["model.onnx.data"]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match=r"model\.onnx\.data: sha256 .* does not match"):
        OnnxRunner(target)
    manifest_path.write_text("{not json")
    with pytest.raises(ExportError, match=r"manifest\.json: not valid JSON"):
        OnnxRunner(target)
    # A truncated external-data file is caught by its size before hashing.
    manifest["files"]["model.onnx.data"] = json.loads((export[0] / "manifest.json").read_text())["files"]["model.onnx.data"]
    manifest_path.write_text(json.dumps(manifest))
    with open(target / "model.onnx.data", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ExportError, match=r"model\.onnx\.data: 1000 bytes, manifest\.json says"):
        OnnxRunner(target)
    # The analysis graph, opened only when first used, is checked with the others at startup.
    target2 = _copy(export, tmp_path / "b")
    (target2 / "analysis.onnx").write_bytes(b"garbage")
    with pytest.raises(ExportError, match=r"analysis\.onnx: 7 bytes, manifest\.json says"):
        OnnxRunner(target2)


class _ShapeBranch(nn.Module):
    """Branches on the sequence length: a graph traced at one length is wrong at others."""

    def forward(self, input_ids, attention_mask):
        x = input_ids.float()
        if x.shape[1] > 300:
            return (x * 2).sum(1, keepdim=True), x, x
        return x.sum(1, keepdim=True), x, x


def test_export_refuses_a_graph_that_narrows_a_dimension(tmp_path):
    from attnserve.export.graphs import ExportFailed, export_graph

    with pytest.raises(ExportFailed, match="torch.export could not trace model.onnx with dynamic batch and sequence"):
        export_graph(_ShapeBranch(), tmp_path / "model.onnx", ["a", "b", "c"], 1, 1024, 8, 23, False, lambda m: None)
    assert not (tmp_path / "model.onnx").exists()


def test_export_command_errors_exit_nonzero(capsys, tmp_path):
    from attnserve.cli import main

    assert main(["export", "--variant", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown attention variant 'nope'" in capsys.readouterr().err
    assert main(["export", "--variant", "local", "--param", "window=1", "--out", str(tmp_path / "y")]) == 2
    assert "invalid parameter window" in capsys.readouterr().err
    assert main(["export", "--variant", "local", "--param", "window", "--out", str(tmp_path / "z")]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


MAP_MEMORY_LENGTHS = (2048, 8192)
_MAP_PEAKS = """
import json, sys
import numpy as np
from attnserve.bench.memory import peak_extra_bytes
from attnserve.service.runtime import OnnxRunner

runner = OnnxRunner(sys.argv[1], providers=["CPUExecutionProvider"], intra_op_threads=2)

def text(n):
    ids = np.full((1, n), 2000, np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    return ids, np.ones_like(ids)

runner.attention(*text(64), layer=2)  # opens the analysis graph
found = {}
for n in map(int, sys.argv[2:]):
    extra, _ = peak_extra_bytes(lambda: runner.attention(*text(n), layer=2))
    found[n] = [extra, runner.attention_cost(n).work_bytes]
print(json.dumps(found))
"""


def test_a_maps_memory_estimate_bounds_what_its_run_holds(export):
    """What a map is refused on (MapCost.work_bytes, from the analysis graph's output shapes)
    against the peak resident growth of computing that map (the analysis run and the COO
    conversion; one head's run is the same, its COO smaller), in a fresh process, at two lengths
    4x apart: the estimate is never below what the run holds, is at most 3x it (a looser one
    refuses maps that fit), and grows from one length to the other as the run does, within 1.6x."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _MAP_PEAKS, str(export[0]), *map(str, MAP_MEMORY_LENGTHS)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    short, long = MAP_MEMORY_LENGTHS
    (held_short, said_short), (held_long, said_long) = found[str(short)], found[str(long)]
    for n, held, said in ((short, held_short, said_short), (long, held_long, said_long)):
        assert held <= said <= 3 * held, f"{n} tokens: held {held / 2**20:.0f} MiB, estimated {said / 2**20:.0f} MiB"
    growth_held, growth_said = held_long - held_short, said_long - said_short
    assert growth_held / 1.6 <= growth_said <= 1.6 * growth_held, \
        f"{short} -> {long} tokens: held +{growth_held / 2**20:.0f} MiB, estimated +{growth_said / 2**20:.0f} MiB"
