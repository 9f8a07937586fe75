"""Short inputs at full speed: where a variant is exactly full attention, and the short graph.

`Attention.exact_up_to(config, max_length)` says up to how many tokens a variant computes what
full attention computes. The first tests hold every variant to it on random q, k, v against
the dense masked softmax: exact at that length (and below, in a padded batch), not exact one
token past it. Exports of variants exact past their granule carry a `short` graph (full
attention, no padding) that the runner uses for batches that fit in it; the later tests check
that it equals the variant's own PyTorch encoder, that the runner routes to it, and that an
export without it still serves.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from export_helpers import EXPORTS_ROOT, get_export, padded_batch
from attnserve.models import variant_names
from attnserve.models.attention.base import masked_softmax
from attnserve.models.registry import VARIANTS, build_attention, make_config

HEADS, DIM, MAX = 4, 32, 512

# Defaults, and parameters that move each rule (windows, global positions, blocks, seeds).
CASES = [
    ("full", {}),
    ("local", {}), ("local", {"window": 64}),
    ("strided", {}), ("strided", {"stride": 1, "window": 32}),
    ("global", {}), ("global", {"global_tokens": (0, 1, 2)}),
    ("longformer", {}), ("longformer", {"window": 64, "global_tokens": (0, 1)}),
    ("bigbird", {}), ("bigbird", {"seed": 1}), ("bigbird", {"block": 16, "random_blocks": 0}),
    ("lsh", {}), ("lsh", {"chunk": 16, "n_hashes": 4}),
    ("sinkhorn", {}), ("sinkhorn", {"block": 16, "local_blocks": 2}),
    ("linformer", {}), ("linformer", {"k": MAX}),
    ("compressed", {}), ("compressed", {"kernel": 1, "stride": 1}),
    ("synthesizer", {}), ("synthesizer", {"mode": "dense"}),
]


def exactness(name, params, max_length=MAX):
    config = make_config(name, max_length, **params)
    return VARIANTS[name].exact_up_to(config, max_length), build_attention(config, HEADS, DIM, max_length)


def worst_difference(att, lengths, seed=0):
    """Max |variant - full attention| over the real rows of a padded batch of `lengths`."""
    n = max(lengths)
    g = torch.Generator().manual_seed(seed + n)
    q, k, v = (torch.randn(len(lengths), HEADS, n, DIM, generator=g) for _ in range(3))
    key_valid = torch.arange(n)[None] < torch.tensor(lengths)[:, None]
    reference = masked_softmax(q @ k.transpose(-1, -2) * att.scale, key_valid[:, None, None, :]) @ v
    with torch.no_grad():
        out, _ = att(q, k, v, key_valid)
    return float((out - reference).abs()[key_valid[:, None, :, None].expand_as(out)].max())


def test_every_variant_says_where_it_is_exact():
    """The defaults at 16,384 tokens (what `attnserve variants` prints)."""
    expected = {"full": 16384, "local": 257, "strided": 0, "global": 2, "longformer": 258,
                # 4 blocks from window and globals; seed 0's random blocks complete a 5th.
                "bigbird": 320, "lsh": 128, "sinkhorn": 128, "linformer": 256, "compressed": 0, "synthesizer": 0}
    assert {name: exactness(name, {}, 16384)[0] for name in variant_names()} == expected


@pytest.mark.parametrize("name,params", CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in p.items()) or 'defaults'}" for n, p in CASES])
def test_exact_up_to_is_where_the_variant_equals_full_attention(name, params):
    limit, att = exactness(name, params)
    if limit == 0:
        # Never exact: already two tokens differ from full attention.
        assert worst_difference(att, [2]) > 1e-3
        return
    # Exact at the limit, and below it for every document of a padded batch.
    assert worst_difference(att, [limit]) <= 1e-5
    assert worst_difference(att, [limit, limit // 2 + 1, 2], seed=1) <= 1e-5
    if limit < MAX:
        # One token more and some query misses a key (or, for LSH, a round misses one).
        assert worst_difference(att, [limit + 1]) > 1e-3


def test_length_multiples_and_discontinuity_live_on_the_variants():
    from attnserve.models.registry import is_discontinuous, length_multiple

    defaults = {name: length_multiple(make_config(name, 16384)) for name in variant_names()}
    assert defaults == {"full": 1, "local": 256, "strided": 256, "global": 32, "longformer": 256, "bigbird": 64,
                        "lsh": 64, "sinkhorn": 64, "linformer": 1, "compressed": 3, "synthesizer": 1}
    assert length_multiple(make_config("strided", 4096, stride=2, window=10)) == 10
    assert length_multiple(make_config("compressed", 4096, kernel=4, stride=2)) == 4
    assert length_multiple(make_config("local", 4096, window=3)) == 1
    assert [name for name in variant_names() if is_discontinuous(make_config(name, 4096))] == ["lsh"]
    assert is_discontinuous(make_config("lsh*5,longformer", 4096)) and not is_discontinuous(make_config("local,full", 4096))


def test_which_exports_get_a_short_graph():
    """Only where inputs of more than one granule are exact: padding is then needless."""
    from attnserve.export.lengths import short_graph_length

    lengths = {name: short_graph_length(make_config(name, 16384), 16384) for name in variant_names()}
    assert lengths == {"full": 0, "local": 257, "strided": 0, "global": 0, "longformer": 258, "bigbird": 320,
                       "lsh": 128, "sinkhorn": 128, "linformer": 256, "compressed": 0, "synthesizer": 0}
    assert short_graph_length(make_config("longformer", 200), 200) == 0  # 200 tokens pad to one 256 block anyway


def test_adapted_parameters_that_break_exactness_get_no_short_graph():
    """Linformer is exact up to k only with its initial E and F: adapted ones run its own graph."""
    import torch

    from attnserve.models import load_encoder
    from attnserve.export.lengths import short_graph_length

    encoder = load_encoder("linformer", max_length=1024)
    config = encoder.attention_config
    assert short_graph_length(config, 1024, encoder) == 256
    with torch.no_grad():
        encoder.layers[3].attention.E[0, 0] += 0.5
    assert not encoder.layers[3].attention.keeps_exactness()
    assert short_graph_length(config, 1024, encoder) == 0


def test_linformers_short_graph_is_verified_against_linformer(tmp_path, two_layer_minilm):
    """The export checks its short graph against the variant's own encoder (ExportFailed if
    they differ): linformer at its initial E passes, as exact_up_to claims. (The bundled MiniLM
    cut to two layers: the check is per layer, at a third of the six layers' export.)"""
    import json

    from attnserve.export.exporter import export_model
    from attnserve.export.recipe import Recipe

    export_model(Recipe.resolve("linformer", {}, 512, analysis=False, model=two_layer_minilm), tmp_path)
    short = json.loads((tmp_path / "manifest.json").read_text())["graphs"]["short"]
    assert short["max_length"] == 256 and short["verified"]


def test_variants_command_says_where_each_is_exact():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "attnserve", "variants"], capture_output=True, text=True, check=True).stdout
    lines = {line.split("|")[1].strip(): line for line in out.splitlines()[2:] if line.startswith("| ")}
    assert "exact full attention" in out.splitlines()[0]
    assert "all lengths" in lines["full"]
    assert "<= 257 tokens" in lines["local"] and "<= 258 tokens" in lines["longformer"]
    assert "<= 2 tokens" in lines["global"]
    assert "<= 256 tokens" in lines["linformer"]
    for name in ("strided", "compressed", "synthesizer"):
        assert "never" in lines[name]


# --------------------------------------------------------------------------- the short graph

VARIANT, MAX_LENGTH, SHORT = "longformer", 512, 258
OUTPUTS = ("sentence_embedding", "last_hidden_state")


@pytest.fixture(scope="module")
def export():
    return get_export(VARIANT, MAX_LENGTH)


@pytest.fixture(scope="module")
def runner(export):
    from attnserve.service.runtime import OnnxRunner

    return OnnxRunner(export[0], providers=["CPUExecutionProvider"], intra_op_threads=2)


def test_the_manifest_lists_the_short_graph(export):
    import onnx

    from attnserve.contract.export_format import EMBEDDING_OUTPUTS, sha256

    export_dir, _ = export
    manifest = json.loads((export_dir / "manifest.json").read_text())
    short = manifest["graphs"]["short"]
    assert short["file"] == "short.onnx" and short["outputs"] == EMBEDDING_OUTPUTS
    assert short["max_length"] == SHORT and short["length_multiple"] == 1 and short["attention"] == "full"
    assert manifest["length_multiple"] == 256  # the main graph keeps its granule
    for name in ("short.onnx", "short.onnx.data"):
        assert manifest["files"][name]["sha256"] == sha256(export_dir / name)
    model = onnx.load(str(export_dir / "short.onnx"), load_external_data=False)
    assert [o.name for o in model.graph.output] == EMBEDDING_OUTPUTS
    for value in model.graph.input:  # batch and sequence stay symbolic
        assert all(d.dim_param for d in value.type.tensor_type.shape.dim)


def _compare(runner, encoder, lengths, width=None, seed=0):
    """Run a padded batch through the runner and the variant's PyTorch encoder; returns the
    graph that ran it."""
    ids, mask = padded_batch(lengths, seed=seed)
    if width is not None:  # a caller's batch padded wider than its longest input
        ids, mask = (np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in (ids, mask))
    before = dict(runner.graph_runs)
    out = runner.run(ids, mask, OUTPUTS)
    with torch.no_grad():
        emb, hidden = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
    real = mask.astype(bool)
    assert out["last_hidden_state"].shape == (len(lengths), ids.shape[1], 384)
    d_emb = np.abs(out["sentence_embedding"] - emb.numpy()).max()
    d_hid = np.abs(out["last_hidden_state"] - hidden.numpy())[real].max()
    assert d_emb <= 1e-4, f"{lengths}: embedding max abs diff {d_emb:.2e}"
    assert d_hid <= 1e-3, f"{lengths}: hidden state max abs diff {d_hid:.2e}"
    ran = [graph for graph, count in runner.graph_runs.items() if count != before.get(graph, 0)]
    assert len(ran) == 1
    return ran[0]


@pytest.mark.parametrize("lengths,width,graph", [
    ([100], None, "short"),
    ([SHORT], None, "short"),                 # the short graph's capacity
    ([200, 50, 13], None, "short"),           # a mixed padded batch within it
    ([120, 7], 300, "short"),                 # padding past its capacity is cut off first
    ([SHORT + 1], None, "embedding"),         # one token more: the variant's own graph
    ([400, 100, 13], None, "embedding"),      # a mixed batch with a long input
])
def test_onnx_runtime_equals_the_variant_on_either_graph(runner, export, lengths, width, graph):
    assert runner.short_max_length == SHORT
    assert _compare(runner, export[1], lengths, width, seed=sum(lengths)) == graph


def test_both_graphs_give_the_same_outputs_for_short_inputs(runner, export):
    from attnserve.service.runtime import OnnxRunner

    main = OnnxRunner(export[0], providers=["CPUExecutionProvider"], intra_op_threads=2, short_graph=False)
    assert main.short_max_length == 0
    ids, mask = padded_batch([150, 16], seed=4)
    short, padded = runner.run(ids, mask, OUTPUTS), main.run(ids, mask, OUTPUTS)
    assert main.graph_runs == {"embedding": 1}
    real = mask.astype(bool)
    assert np.abs(short["sentence_embedding"] - padded["sentence_embedding"]).max() <= 1e-4
    assert np.abs(short["last_hidden_state"] - padded["last_hidden_state"])[real].max() <= 1e-3


def test_padded_length_is_what_runs(runner):
    assert [runner.padded_length(n) for n in (1, 16, SHORT, SHORT + 1, 512)] == [2, 16, SHORT, 512, 512]


def test_an_export_without_the_short_graph_still_serves(export, tmp_path):
    from attnserve.service.runtime import OnnxRunner

    target = tmp_path / "export"
    shutil.copytree(export[0], target)
    manifest = json.loads((target / "manifest.json").read_text())
    del manifest["graphs"]["short"]
    for name in ("short.onnx", "short.onnx.data"):
        del manifest["files"][name]
        (target / name).unlink()
    (target / "manifest.json").write_text(json.dumps(manifest))
    old = OnnxRunner(target, providers=["CPUExecutionProvider"], intra_op_threads=2)
    assert old.short_max_length == 0 and old.padded_length(100) == 256
    assert _compare(old, export[1], [100, 13]) == "embedding"
    assert old.graph_runs == {"embedding": 1}


def test_the_batch_budget_counts_what_the_short_graph_runs():
    """The batcher counts runner.padded_length: 12-token inputs that a short graph runs
    unpadded fill a 1,024-token budget 12 at a time, not 4 (4 x 256 padded tokens)."""
    import asyncio

    from http_fakes import FakeRunner
    from attnserve.service.batching import Timings, TokenBudgetBatcher

    class ShortGraphRunner(FakeRunner):
        length_multiple = 256

        def padded_length(self, n):
            return n if n <= 128 else -(-n // 256) * 256

    async def main():
        runner = ShortGraphRunner()
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=1024, max_batch_requests=32, max_concurrent_requests=100)
        await batcher.start()
        await asyncio.gather(*(batcher.embed([[101] + [7] * 10 + [102]], Timings()) for _ in range(12)))
        await batcher.embed([[101] + [7] * 200 + [102], [101] + [8] * 190 + [102]], Timings())  # past 128: 256 each
        await batcher.stop()
        return runner

    sizes = [size for size, _ in asyncio.run(main()).batches]
    assert sum(sizes[:-1]) == 12 and max(sizes[:-1]) > 4
    assert sizes[-1] == 2  # 2 x 256 <= 1024


def test_bench_short_inputs_prints_ratios_to_full(tmp_path):
    """A smoke run of `attnserve bench runtime --short-inputs` on one variant (no timing is
    asserted): full is always timed, every (variant, length) gets a row and a table cell."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "attnserve", "bench", "runtime", "--short-inputs", "--variants", "sinkhorn,strided",
         "--max-length", "256", "--repeats", "2", "--threads", "2", "--json", str(tmp_path / "rows.json"),
         "--exports-dir", str(EXPORTS_ROOT)],
        capture_output=True, text=True, check=True, timeout=900,
    )
    assert "| variant | exact full attention | 16 tokens | 128 tokens |" in out.stdout
    rows = {(r["variant"], r["length"]): r for r in json.loads((tmp_path / "rows.json").read_text())["short_inputs"]}
    assert set(rows) == {(v, n) for v in ("full", "sinkhorn", "strided") for n in (16, 128)}
    assert rows[("full", 16)]["ratio"] == 1.0
    assert rows[("sinkhorn", 128)]["graph"] == "short" and rows[("sinkhorn", 128)]["padded_to"] == 128
    assert rows[("sinkhorn", 128)]["main_padded_to"] == 128 and rows[("sinkhorn", 16)]["main_padded_to"] == 64
    assert rows[("strided", 16)]["graph"] == "embedding" and rows[("strided", 16)]["padded_to"] == 256
    assert not rows[("strided", 16)]["exact"] and rows[("sinkhorn", 16)]["exact"]
    assert "exporting sinkhorn" in out.stderr
