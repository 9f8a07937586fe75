"""`attnserve bench collapse`: the rank collapse of pure attention paths, per variant.

"Attention is not all you need" (Dong, Cordonnier and Loukas 2021): a stack of pure
self-attention layers loses rank doubly exponentially with depth (the residual r_l ~ r_0^(3^l));
skip connections keep it, MLPs slow it. For every variant (and schedule) this runs bundled
documents cut at a few lengths along the four paths of LongContextEncoder.collapse_paths through
the same pretrained weights, and writes:

- collapse.csv: variant, tokens, path, depth (0: the embeddings, l: after layer l), the ratio
  ||X - 1 x^T|| / ||X|| as the geometric mean over the documents, and its min and max;
- collapse.png: a panel per path, the ratio by depth on a log scale, a line per variant at the
  longest length, and the paper's doubly exponential shape r_0^(3^l) drawn for comparison.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from attnserve.data import DEV_DOCUMENTS, read_jsonl
from attnserve.models.encoder import COLLAPSE_PATHS

DEFAULT_SCHEDULE = "local,local,full"  # ModernBERT's pattern: local layers, then one that sees everything
FLOOR = 1e-8  # float32 leaves ~1e-7 of a collapsed state; ratios are drawn and averaged from here


def configure(parser) -> None:
    from attnserve.models.registry import variant_names

    parser.add_argument("--variants", default=",".join(variant_names()), help="comma-separated variants")
    parser.add_argument("--schedule", action="append", default=None, metavar="SCHEDULE",
                        help=f"also this schedule, a variant per layer (repeatable; default: {DEFAULT_SCHEDULE}; '' for none)")
    parser.add_argument("--lengths", default="512,2048", help="comma-separated token counts the documents are cut at")
    parser.add_argument("--documents", type=int, default=3, help="bundled documents per length (the first long enough)")
    parser.add_argument("--data", default=str(DEV_DOCUMENTS), help="JSONL (or .jsonl.gz) with a 'text' per line")
    parser.add_argument("--out", default="reports/collapse", help="folder for collapse.csv and collapse.png")


def documents(encoder, path, count: int, length: int) -> list[list[int]]:
    """The token ids of the first `count` documents of at least `length` tokens, cut to it
    ([SEP] kept last)."""
    found = []
    for row in read_jsonl(path):
        ids = encoder.tokenize([row["text"]])[0]
        if len(ids) >= length:
            found.append(ids[: length - 1] + ids[-1:])
            if len(found) == count:
                return found
    raise SystemExit(f"attnserve bench collapse: {path} has only {len(found)} documents of {length} tokens or more "
                     f"(asked for {count}); pass fewer --documents or shorter --lengths")


@torch.no_grad()
def measure(encoder, docs: list[list[int]]) -> dict[str, np.ndarray]:
    """{path: (len(docs), 1 + layers) ratios}, one document at a time."""
    out = {path: [] for path in COLLAPSE_PATHS}
    for ids in docs:
        input_ids = torch.tensor([ids])
        for path, ratios in encoder.collapse_paths(input_ids, torch.ones_like(input_ids), COLLAPSE_PATHS).items():
            out[path].append(ratios[0].numpy())
    return {path: np.stack(rows) for path, rows in out.items()}


def summarise(name: str, length: int, ratios: dict[str, np.ndarray]) -> list[dict]:
    rows = []
    for path, values in ratios.items():
        values = np.maximum(values, FLOOR)
        for depth in range(values.shape[1]):
            column = values[:, depth]
            rows.append({"variant": name, "tokens": length, "path": path, "depth": depth,
                         "ratio": float(np.exp(np.log(column).mean())), "min": float(column.min()), "max": float(column.max())})
    return rows


def reference(r0: float, depths: int) -> list[float]:
    """The doubly exponential shape of pure attention, r_0^(3^l) (Dong et al. 2021), floored."""
    return [max(r0 ** (3 ** l), FLOOR) for l in range(depths)]


def plot(rows: list[dict], length: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["variant"] for r in rows))
    fig, axes = plt.subplots(1, len(COLLAPSE_PATHS), figsize=(4.2 * len(COLLAPSE_PATHS), 4.2), sharey=True)
    colours = plt.get_cmap("tab20")(np.linspace(0, 1, len(names)))
    for ax, collapse_path in zip(axes, COLLAPSE_PATHS):
        depths = 0
        for name, colour in zip(names, colours):
            curve = [r["ratio"] for r in rows if r["variant"] == name and r["path"] == collapse_path and r["tokens"] == length]
            depths = len(curve)
            ax.plot(range(depths), curve, marker="o", markersize=3, color=colour, label=name)
        r0 = next(r["ratio"] for r in rows if r["path"] == collapse_path and r["tokens"] == length and r["depth"] == 0)
        ax.plot(range(depths), reference(r0, depths), "k--", linewidth=2, label="r0^(3^l) (Dong et al.)")
        ax.set_yscale("log")
        ax.set_ylim(FLOOR / 2, 2)
        ax.set_title(collapse_path)
        ax.set_xlabel("depth (0: embeddings)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("||X - 1x^T|| / ||X||")
    axes[-1].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"rank collapse along four paths through the same weights, {length} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(rows: list[dict]) -> list[str]:
    """A Markdown table: the ratio after the last layer along each path, per variant and length."""
    last = max(r["depth"] for r in rows)
    lines = ["| variant | tokens | " + " | ".join(COLLAPSE_PATHS) + " |", "|---|---|" + "---|" * len(COLLAPSE_PATHS)]
    for name, length in dict.fromkeys((r["variant"], r["tokens"]) for r in rows):
        cells = [next(r["ratio"] for r in rows if (r["variant"], r["tokens"], r["path"], r["depth"]) == (name, length, p, last))
                 for p in COLLAPSE_PATHS]
        lines.append(f"| {name} | {length} | " + " | ".join(f"{c:.2g}" for c in cells) + " |")
    return lines


def bench_collapse_command(args) -> int:
    from tqdm import tqdm

    from attnserve.models import load_encoder

    lengths = sorted(int(x) for x in args.lengths.split(","))
    schedules = [s for s in (args.schedule if args.schedule is not None else [DEFAULT_SCHEDULE]) if s]
    names = [v for v in args.variants.split(",") if v] + list(dict.fromkeys(schedules))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with tqdm(total=len(names) * len(lengths), desc="collapse", unit="run") as bar:
        for name in names:
            encoder = load_encoder(name, max_length=max(lengths))
            for length in lengths:
                rows += summarise(name, length, measure(encoder, documents(encoder, args.data, args.documents, length)))
                bar.update()
    with open(out / "collapse.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, lengths[-1], out / "collapse.png")
    print("\n".join(table(rows)))
    print(f"wrote {out / 'collapse.csv'} and {out / 'collapse.png'}")
    return 0

