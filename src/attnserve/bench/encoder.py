"""`attnserve bench encoder`: PyTorch encoder latency and peak memory per variant, the attention
op alone and the whole encoder, beside transformers' Longformer and BigBird of the same size.
With --model DIR: that folder's deployments in ONNX Runtime against transformers' own class of
it (attnserve.bench.model_speed).

A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

from pathlib import Path

import torch

from attnserve.models.registry import make_config, variant_names
from attnserve.bench import model_speed
from attnserve.bench.timing import interleaved_medians

HEADS, HEAD_DIM = 12, 32


def configure_bench_encoder(parser):
    parser.add_argument("--variants", default=",".join(variant_names()), help="comma-separated variants (full is always included)")
    parser.add_argument("--op-lengths", default="4096,16384", help="lengths for the attention-op table")
    parser.add_argument("--lengths", default="1024,4096,16384", help="lengths for the whole-encoder table")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per encoder cell (the median is reported)")
    parser.add_argument("--op-repeats", type=int, default=10, help="timed runs per attention-op cell: one op takes tens of ms, and a median of 3 of those varied by 20%% between runs")
    parser.add_argument("--hf-length", type=int, default=4096, help="length for the transformers comparison (0 to skip)")
    parser.add_argument("--out", default="reports/bench-encoder", help="folder for the CSV and plot (with --model: results.json)")
    parser.add_argument("--model", metavar="DIR", help="a model folder (BERT, XLM-RoBERTa, ModernBERT): time its deployments "
                        "in ONNX Runtime against transformers' class of it instead of the variant tables")
    model_speed.configure(parser)


def _op_call(name, n):
    """One call of the variant's attention op on random q, k, v of n tokens."""
    from attnserve.models.registry import build_attention

    attention = build_attention(make_config(name, 16384), HEADS, HEAD_DIM, 16384).eval()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g) for _ in range(3))
    valid = torch.ones(1, n, dtype=torch.bool)
    return lambda: attention(q, k, v, valid)


def _encoder_call(encoder, n):
    ids = torch.randint(1000, 30000, (1, n), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    return lambda: encoder(ids, mask)


def _hf_models():
    """transformers' Longformer and BigBird of this encoder's size, random weights (speed only),
    set up as this project's variants are by default (window, blocks, global tokens), each with
    a function giving the inputs it takes beyond input_ids for a batch of ids."""
    from transformers import BigBirdConfig, BigBirdModel, LongformerConfig, LongformerModel

    ours = {name: make_config(name, 16384) for name in ("longformer", "bigbird")}
    size = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    longformer = LongformerModel(LongformerConfig(attention_window=ours["longformer"].window, max_position_embeddings=16386, **size))
    bigbird = BigBirdModel(BigBirdConfig(attention_type="block_sparse", block_size=ours["bigbird"].block,
                                         num_random_blocks=ours["bigbird"].random_blocks, max_position_embeddings=16384, **size))
    global_tokens = torch.tensor(ours["longformer"].global_tokens)

    def longformer_inputs(ids):
        return {"global_attention_mask": torch.zeros_like(ids).index_fill(1, global_tokens, 1)}

    return {"longformer": (longformer.eval(), longformer_inputs), "bigbird": (bigbird.eval(), lambda ids: {})}


def _hf_call(model, extra_inputs, n):
    ids = torch.randint(1000, 30000, (1, n), generator=torch.Generator().manual_seed(0))
    kwargs = {"attention_mask": torch.ones_like(ids), **extra_inputs(ids)}
    return lambda: model(ids, **kwargs)


def _timed(calls: dict, repeats: int) -> dict:
    with torch.no_grad():
        return interleaved_medians(calls, repeats)


def bench_encoder(args) -> int:
    if args.model:
        return model_speed.bench_model(args)
    from attnserve.models import load_encoder
    from attnserve.bench.memory import measure

    names = ["full"] + [v for v in args.variants.split(",") if v and v != "full"]
    op_lengths = [int(x) for x in args.op_lengths.split(",") if x]
    lengths = [int(x) for x in args.lengths.split(",") if x]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1, median of {args.op_repeats} (op) / {args.repeats} (encoder)")

    print("\n## Attention op alone (q, k, v: 12 heads x 32 dims): speed-up over full (scaled_dot_product_attention)")
    print("| variant | " + " | ".join(f"{n} tokens" for n in op_lengths) + " |")
    print("|---|" + "---|" * len(op_lengths))
    # Every table times its variants in rounds (interleaved_medians): ratios from one run.
    op = {}
    for n in op_lengths:
        op.update({(name, n): t for name, t in _timed({name: _op_call(name, n) for name in names}, args.op_repeats).items()})
    for name in names:
        cells = [f"{op[('full', n)] / op[(name, n)]:.2f}x" for n in op_lengths]
        print(f"| {name} | " + " | ".join(cells) + " |")
        rows += [("op", name, n, op[(name, n)], "") for n in op_lengths]

    print("\n## Whole encoder forward: speed-up over full / peak memory as a fraction of full's")
    print("| variant | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    seconds, memory = {}, {}
    encoders = {name: load_encoder(name, max_length=max(lengths)) for name in names}
    for n in lengths:
        calls = {name: _encoder_call(encoder, n) for name, encoder in encoders.items()}
        seconds.update({(name, n): t for name, t in _timed(calls, args.repeats if n < 16384 else 1).items()})
    del encoders, calls
    for name in names:
        memory.update({(name, n): b for n, b in measure(name, lengths, max(lengths)).items()})
    for name in names:
        cells = [f"{seconds[('full', n)] / seconds[(name, n)]:.2f}x / {memory[(name, n)] / max(memory[('full', n)], 1):.2f}" for n in lengths]
        print(f"| {name} | " + " | ".join(cells) + " |")
        rows += [("encoder", name, n, seconds[(name, n)], memory[(name, n)]) for n in lengths]
    print("(absolute full: " + ", ".join(f"{n}: {seconds[('full', n)]:.2f} s, {memory[('full', n)] / 2**20:.0f} MiB" for n in lengths) + ")")

    if args.hf_length:
        n = args.hf_length
        print(f"\n## This project vs transformers at {n} tokens (same size: 6 layers, 384 wide, 12 heads)")
        print("| model | transformers | attnserve | speed-up |")
        print("|---|---|---|---|")
        for name, (model, extra_inputs) in _hf_models().items():
            calls = {"theirs": _hf_call(model, extra_inputs, n), "ours": _encoder_call(load_encoder(name, max_length=max(n, 4096)), n)}
            timed = _timed(calls, args.repeats)
            theirs, ours = timed["theirs"], timed["ours"]
            print(f"| {name} | {theirs:.3f} s | {ours:.3f} s | {theirs / ours:.2f}x |")
            rows += [("transformers", name, n, theirs, ""), ("attnserve", name, n, ours, "")]

    with open(out / "results.csv", "w") as f:
        f.write("table,variant,tokens,seconds,peak_extra_bytes\n")
        f.writelines(",".join(str(x) for x in row) + "\n" for row in rows)
    _plot(names, lengths, seconds, out / "encoder-latency.png")
    print(f"\nwrote {out / 'results.csv'} and {out / 'encoder-latency.png'}")
    return 0


def _plot(names, lengths, seconds, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in names:
        ax.plot(lengths, [seconds[(name, n)] for n in lengths], marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel="encoder forward (s)", title="Encoder latency by attention variant (batch 1, CPU)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
