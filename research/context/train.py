"""`python -m research.context train`: learn context heads (research/context/heads.py) on a cache written by
`python -m research.context cache`, in minutes, with the encoder frozen and never run.

Objective: InfoNCE with in-batch negatives, temperature 0.05, over two kinds of query per
document: its query (title) and its cached 30-word passages, each of whose positive is the
document. A document scores as retrieval sees it: by its best chunk (a smooth maximum while
training, the maximum when scoring) for a chunk head, by its one vector for a pooling head.
Queries are the cache's vectors of short texts, as the service embeds any query.

Checkpoints are chosen on documents held out of the cache (the last `holdout` after a seeded
shuffle), by the mean of the query and passage MRRs over them; nothing else is read. The out
folder (research/context/files.py says what it holds) gets the best head of each design given,
its ONNX graph (checked against PyTorch), and a curve of training loss and held-out score.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from research.context.heads import DESIGNS, make_head

TEMPERATURE = 0.05
SMOOTH_MAX = 0.01  # temperature of the smooth maximum over a document's chunks while training


# --------------------------------------------------------------------------- data


class Document:
    """One cached document as float32 tensors (the token states stay float16 until used)."""

    def __init__(self, arrays: dict):
        self.naive = torch.from_numpy(arrays["naive"].astype(np.float32))
        self.late = torch.from_numpy(arrays["late"].astype(np.float32))
        self._hidden = torch.from_numpy(arrays["hidden"])
        self.doc = self._hidden.float().mean(0)
        self.query = torch.from_numpy(arrays["query"].astype(np.float32))
        self.passages = torch.from_numpy(arrays["passages"].astype(np.float32)).reshape(-1, self.naive.shape[1])
        self.needle = torch.from_numpy(arrays["needle"].astype(np.float32)) if "needle" in arrays else None

    @property
    def hidden(self) -> torch.Tensor:
        """(n, d) float32 last hidden states."""
        return self._hidden.float()


def represent(head, doc: Document, kind: str) -> torch.Tensor:
    """The document's vectors as retrieval scores them: (C, d) chunks or (1, d) one vector; a
    document of one chunk skips the head (it keeps what the service gives a short text)."""
    if kind == "chunks":
        return doc.naive if head is None or len(doc.naive) == 1 else head(doc.naive, doc.late, doc.doc)
    if head is None or len(doc.naive) == 1:
        return (doc.doc / doc.doc.norm()).unsqueeze(0)
    return head(doc.hidden).unsqueeze(0)


def doc_scores(queries: torch.Tensor, vectors: list[torch.Tensor], smooth: float = 0.0) -> torch.Tensor:
    """(Q, D): each query against each document's best vector (smooth maximum when smooth > 0)."""
    columns = []
    for v in vectors:
        s = queries @ v.T
        columns.append(smooth * torch.logsumexp(s / smooth, dim=1) if smooth else s.max(1).values)
    return torch.stack(columns, dim=1)


def mrr(scores: torch.Tensor, targets: torch.Tensor) -> float:
    r = (scores > scores.gather(1, targets[:, None])).sum(1) + 1
    return float((1.0 / r.double()).mean())


def retrieval(head, docs: list[Document], kind: str, needles: bool = False) -> dict:
    """Query (summary) MRR and passage (needle) MRR with all `docs` as candidates; with needles,
    the documents' own needle passages, else all their cached passages."""
    with torch.no_grad():
        vectors = [represent(head, d, kind) for d in docs]
        queries = torch.stack([d.query for d in docs])
        summary = mrr(doc_scores(queries, vectors), torch.arange(len(docs)))
        if needles:
            passage = torch.stack([d.needle for d in docs])
            targets = torch.arange(len(docs))
        else:
            passage = torch.cat([d.passages for d in docs])
            targets = torch.cat([torch.full((len(d.passages),), i) for i, d in enumerate(docs)])
        needle = mrr(doc_scores(passage, vectors), targets)
    return {"summary_mrr": summary, "needle_mrr": needle}


# --------------------------------------------------------------------------- training


def batch_loss(head, batch: list[Document], kind: str) -> torch.Tensor:
    vectors = [represent(head, d, kind) for d in batch]
    queries = torch.stack([d.query for d in batch])
    passages = torch.cat([d.passages for d in batch])
    owners = torch.cat([torch.full((len(d.passages),), i) for i, d in enumerate(batch)])
    smooth = SMOOTH_MAX if kind == "chunks" else 0.0
    loss = torch.nn.functional.cross_entropy(doc_scores(queries, vectors, smooth) / TEMPERATURE, torch.arange(len(batch)))
    return loss + torch.nn.functional.cross_entropy(doc_scores(passages, vectors, smooth) / TEMPERATURE, owners)


def train_head(design: str, train: list[Document], held: list[Document], *, steps: int = 1500, batch: int = 32,
               lr: float = 1e-3, weight_decay: float = 0.01, rank: int = 64, eval_every: int = 100, seed: int = 0,
               select: str = "best", progress=None) -> tuple[torch.nn.Module, dict]:
    """The head of this design with the best held-out score seen (the untrained one counts:
    a head that never beats it stays the identity), or with select="last" the last one, and
    its record."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    head = make_head(design, train[0].naive.shape[1], rank)
    kind = head.kind
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)

    def held_score() -> float:
        head.eval()
        result = retrieval(head, held, kind)
        head.train()
        return (result["summary_mrr"] + result["needle_mrr"]) / 2

    before = held_score()
    best, best_step, best_state = before, 0, {k: v.clone() for k, v in head.state_dict().items()}
    curve = [{"step": 0, "loss": None, "held_out": before}]
    losses: list[float] = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        picks = rng.choice(len(train), size=min(batch, len(train)), replace=False)
        loss = batch_loss(head, [train[i] for i in picks], kind)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % eval_every == 0 or step == steps:
            score = held_score()
            curve.append({"step": step, "loss": float(np.mean(losses[-eval_every:])), "held_out": score})
            if score > best or select == "last":
                best, best_step, best_state = score, step, {k: v.clone() for k, v in head.state_dict().items()}
        if progress:
            progress(1)
    head.load_state_dict(best_state)
    head.eval()
    record = {"design": design, "kind": kind, "rank": rank, "steps": steps, "batch": batch, "lr": lr,
              "weight_decay": weight_decay, "seed": seed, "select": select, "train_documents": len(train), "held_out_documents": len(held),
              "held_out_before": before, "held_out_after": best, "best_step": best_step,
              "parameters": sum(p.numel() for p in head.parameters()), "seconds": round(time.perf_counter() - started, 1),
              "curve": curve}
    return head, record


def split(docs: list, holdout: int, seed: int) -> tuple[list, list]:
    order = np.random.default_rng(seed).permutation(len(docs))
    if not 0 < holdout < len(docs):
        raise ValueError(f"--holdout {holdout}: must be between 1 and the cache's {len(docs)} documents - 1")
    return [docs[i] for i in order[:-holdout]], [docs[i] for i in order[-holdout:]]


# --------------------------------------------------------------------------- command


def configure(parser) -> None:
    parser.add_argument("--cache", action="append", required=True,
                        help="a cache folder written by `python -m research.context cache` (repeatable: their documents are pooled)")
    parser.add_argument("--out", required=True, help="context-head folder to write (context.json, context.safetensors, *.onnx, curve.png)")
    parser.add_argument("--designs", default="mix,attention-pooling",
                        help=f"comma-separated designs, at most one per kind ({', '.join(DESIGNS)}; default mix,attention-pooling)")
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps per design (default 1500)")
    parser.add_argument("--batch", type=int, default=32, help="documents per step, each other's negatives (default 32)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--rank", type=int, default=64, help="width of each head's projections (default 64)")
    parser.add_argument("--holdout", type=int, default=80, help="cached documents held out to choose checkpoints by (default 80)")
    parser.add_argument("--train-documents", type=int, default=0, help="train on only this many of the rest (0: all; for data-size curves)")
    parser.add_argument("--eval-every", type=int, default=100, help="held-out score every this many steps (default 100)")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    parser.add_argument("--select", choices=("best", "last"), default="best",
                        help="the checkpoint kept: best held-out score (default) or the last step")
    parser.add_argument("--seed", type=int, default=0)


def train_command(args) -> int:
    import sys

    from tqdm import tqdm

    from research.context.cache import CacheError, load_cache
    from research.context.files import save_heads

    try:
        designs = [d.strip() for d in args.designs.split(",") if d.strip()]
        heads_by_kind: dict[str, str] = {}
        for design in designs:
            if design not in DESIGNS:
                raise ValueError(f"--designs: unknown design {design!r}; choose from {', '.join(DESIGNS)}")
            kind = DESIGNS[design].kind
            if kind in heads_by_kind:
                raise ValueError(f"--designs: {heads_by_kind[kind]} and {design} are both {kind} heads; give one per kind")
            heads_by_kind[kind] = design
        metas, docs = [], []
        for folder in args.cache:
            meta, arrays = load_cache(folder)
            metas.append(meta)
            docs += [Document(a) for a in tqdm(arrays, desc=f"load {folder}", unit="doc")]
        recipe_keys = [(m["recipe"]["variant"], m["chunk_tokens"], json.dumps(m["recipe"]["parameters"], sort_keys=True)) for m in metas]
        if len(set(recipe_keys)) > 1:
            raise ValueError(f"--cache folders hold different variants or chunk sizes ({sorted(set(recipe_keys))}); pass caches of one deployment")
        train, held = split(docs, args.holdout, args.seed)
        if args.train_documents:
            train = train[: args.train_documents]
    except (CacheError, ValueError) as exc:
        print(f"research.context train: {exc}", file=sys.stderr)
        return 2
    print(f"{len(train)} training documents, {len(held)} held out, from {', '.join(args.cache)}", flush=True)
    heads, records = {}, {}
    for kind, design in heads_by_kind.items():
        with tqdm(total=args.steps, desc=f"train {design}", unit="step") as bar:
            heads[kind], records[kind] = train_head(design, train, held, steps=args.steps, batch=args.batch, lr=args.lr,
                                                    rank=args.rank, eval_every=args.eval_every, seed=args.seed,
                                                    weight_decay=args.weight_decay, select=args.select, progress=bar.update)
        r = records[kind]
        print(f"{design}: held-out score {r['held_out_before']:.4f} -> {r['held_out_after']:.4f} (step {r['best_step']}, "
              f"{r['parameters']} parameters, {r['seconds']} s)", flush=True)
    recipe = metas[0]["recipe"]
    out = save_heads(args.out, heads, records, variant=recipe["variant"], max_length=recipe["max_length"],
                     chunk_tokens=metas[0]["chunk_tokens"], hidden_size=docs[0].naive.shape[1],
                     cache=[{k: m[k] for k in ("data", "documents", "chunk_tokens", "passages_per_doc", "seed")} for m in metas])
    plot_curves(records, out / "curve.png")
    print(f"wrote {out}")
    return 0


def plot_curves(records: dict[str, dict], path: Path) -> None:
    """Training loss and held-out score against steps, one line per design."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, held_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for record in records.values():
        points = [p for p in record["curve"] if p["loss"] is not None]
        loss_ax.plot([p["step"] for p in points], [p["loss"] for p in points], label=record["design"])
        held_ax.plot([p["step"] for p in record["curve"]], [p["held_out"] for p in record["curve"]], label=record["design"])
    loss_ax.set(xlabel="step", ylabel="InfoNCE loss (query + passage)", title="training loss")
    held_ax.set(xlabel="step", ylabel="mean of query and passage MRR", title="held-out training documents")
    for ax in (loss_ax, held_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
