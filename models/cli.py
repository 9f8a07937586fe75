"""`attnserve variants` and `attnserve bench encoder`."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from attnserve.models.attention.base import AttentionConfig
from attnserve.models.registry import VARIANTS, make_config, parameters, variant_names
from attnserve.models.timing import interleaved_medians

HEADS, HEAD_DIM = 12, 32


def configure_variants(parser):
    pass


# The length `attnserve variants` states exactness at: the serving default max_length.
VARIANTS_MAX_LENGTH = 16384


def exactness(name: str, max_length: int = VARIANTS_MAX_LENGTH) -> str:
    """For which inputs the variant with default parameters is exactly full attention."""
    exact = VARIANTS[name].exact_up_to(make_config(name, max_length), max_length)
    return "all lengths" if exact >= max_length else f"<= {exact} tokens" if exact else "never"


def variants_table() -> list[str]:
    """The variants as a Markdown table (what `attnserve variants` prints and README.md shows):
    cost, where each is exactly full attention, and the parameters of its own with defaults."""
    variant_names()
    common = {f.name for f in dataclasses.fields(AttentionConfig)}
    lines = ["| variant | cost | exact full attention | parameters (defaults) |", "|---|---|---|---|"]
    for name, cls in VARIANTS.items():
        own = ", ".join(f"{k}={v!r}" for k, v in parameters(name).items() if k not in common) or "-"
        lines.append(f"| {name} | {cls.cost} | {exactness(name)} | {own} |")
    shared = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(AttentionConfig))
    return [*lines, "", f"Every variant also takes {shared}."]


def variants_command(args) -> int:
    print("\n".join(variants_table()))
    return 0


def configure_bench_encoder(parser):
    parser.add_argument("--variants", default=",".join(variant_names()), help="comma-separated variants (full is always included)")
    parser.add_argument("--op-lengths", default="4096,16384", help="lengths for the attention-op table")
    parser.add_argument("--lengths", default="1024,4096,16384", help="lengths for the whole-encoder table")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per encoder cell (the median is reported)")
    parser.add_argument("--op-repeats", type=int, default=10, help="timed runs per attention-op cell: one op takes tens of ms, and a median of 3 of those varied by 20%% between runs")
    parser.add_argument("--hf-length", type=int, default=4096, help="length for the transformers comparison (0 to skip)")
    parser.add_argument("--out", default="reports/bench-encoder", help="folder for the CSV and plot")


def _op_call(name, n):
    """One call of the variant's attention op on random q, k, v of n tokens."""
    from attnserve.models.registry import build_attention, make_config

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
    """transformers' Longformer and BigBird of this encoder's size, random weights (speed only)."""
    from transformers import BigBirdConfig, BigBirdModel, LongformerConfig, LongformerModel

    size = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    longformer = LongformerModel(LongformerConfig(attention_window=512, max_position_embeddings=16386, **size))
    bigbird = BigBirdModel(BigBirdConfig(attention_type="block_sparse", block_size=64, num_random_blocks=3, max_position_embeddings=16384, **size))
    return {"longformer": longformer.eval(), "bigbird": bigbird.eval()}


def _hf_call(model, name, n):
    ids = torch.randint(1000, 30000, (1, n), generator=torch.Generator().manual_seed(0))
    kwargs = {"attention_mask": torch.ones_like(ids)}
    if name == "longformer":
        kwargs["global_attention_mask"] = torch.zeros_like(ids).index_fill(1, torch.tensor([0]), 1)
    return lambda: model(ids, **kwargs)


def _timed(calls: dict, repeats: int) -> dict:
    with torch.no_grad():
        return interleaved_medians(calls, repeats)


def bench_encoder(args) -> int:
    from attnserve.models import load_encoder
    from attnserve.models.memory import measure

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
        for name, model in _hf_models().items():
            calls = {"theirs": _hf_call(model, name, n), "ours": _encoder_call(load_encoder(name, max_length=max(n, 4096)), n)}
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
