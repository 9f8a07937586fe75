"""`attnserve adapt`: train a variant on a CPU, in bounded time, with the pretrained weights frozen.

Two stages, each usable alone; both write the best parameters by a held-out score:

    OUT/weights.safetensors   the trained tensors (models.weights)
    OUT/adapt.json            what was trained, on which data, for how long, scores before/after
    OUT/loss.png              training loss and the held-out score against time

Stage "distill": the variant's own parameters (linformer's E/F, compressed's convolutions,
sinkhorn's sorting net, the synthesizer's factors) learn to reproduce the pretrained
full-attention model. Each step takes random windows of `window` tokens (default 512) from
the training documents, runs the teacher (full attention) through every layer, and trains each
layer's attention sub-layer on the teacher's input to give the teacher's output (layer-local
distillation: the six layers learn at once, and no error compounds through the stack while
they do). A layer's loss is the squared error of its sub-layer output over the real tokens
divided by the teacher output's, so every layer counts alike. With loss "end-to-end" the
student runs whole instead and learns the teacher's pooled vector and last hidden states
(10 x (1 - cosine) of the pooled vectors plus the mean of 1 - cosine over the tokens): every
layer then learns what the pooled vector needs of it, errors of the layers below included,
at about three times the cost of a layer-local step; meant to follow a layer-local run
(`--weights`) with `--also` modules that can make up for what the variant misses. Held-out
score: the mean cosine of the pooled vectors to the teacher's on the first `window` tokens of
held-out documents.
adapt.json also records that score by layer, before and after (`layer_cosines`: only that
layer the variant's, every other the teacher's), which says where the error that is left sits.

Stage "long": with positions=learned, only the offsets that tokens past 512 add to their
position rows are trained (inputs of at most 512 tokens stay exactly the pretrained model),
by a contrastive objective over whole documents of up to `window` tokens (default
max_length): a document's title and a 30-word passage from past its word 600 are queries
whose positive is that document, scored twice: by its pooled vector (the one-vector
representation; the other documents of the batch and of the last few batches are the
negatives) and by its best 256-token late chunk (MaxP, what a retrieval index over
/embed_chunks sees; the batch's documents are the negatives). InfoNCE, temperature 0.05, the
four terms averaged. Queries are short, so they are the frozen pretrained model's vectors.
Held-out score: the mean of the four MRRs (title and passage, one vector and late chunks) over
the held-out documents.

Held-out documents are the training file's last `holdout` after a seeded shuffle; they are
never trained on and choose the checkpoint. Never pass the documents you report quality on.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from attnserve.data import TRAIN_DOCUMENTS
from attnserve.contract.pooling import token_ranges

STAGES = ("distill", "long")
DISTILL_LOSSES = ("layer-local", "end-to-end")
TEMPERATURE = 0.05  # InfoNCE temperature of stage "long"
CHUNK_TOKENS = 256  # late chunks stage "long" scores documents by
BANK_BATCHES = 4  # earlier batches whose (detached) document vectors serve as extra negatives


@dataclasses.dataclass
class Plan:
    variant: str
    params: dict
    max_length: int
    data: str
    out: str
    minutes: float = 10.0
    stage: str = "distill"
    window: int = 0  # 0: the stage's default (distill 512, long max_length)
    batch: int = 4
    lr: float = 0.0  # 0: the stage's own rate
    holdout: int = 40
    eval_seconds: float = 60.0
    seed: int = 0
    threads: int = 0  # 0: torch's default
    max_steps: int = 0  # 0: as many as the minutes allow
    also: tuple[str, ...] = ()  # distill: per-layer modules trained besides the variant's own (e.g. attention_out)
    loss: str = "layer-local"  # distill: one of DISTILL_LOSSES
    weights: str | None = None  # adapted weights to start from (a weights directory)
    also_lr: float = 1e-4  # distill: Adam's rate for the --also modules
    model: str | None = None  # a sentence-transformers model folder (None: the bundled all-MiniLM-L6-v2)


def token_documents(tokenizer, rows) -> list[list[int]]:
    """Every document's token ids without [CLS]/[SEP] and without truncation."""
    truncation = tokenizer.truncation
    tokenizer.no_truncation()
    try:
        return [e.ids[1:-1] for e in tokenizer.encode_batch([r["text"] for r in rows])]
    finally:
        tokenizer.enable_truncation(**truncation)


def split(rows, holdout: int, seed: int):
    order = np.random.default_rng(seed).permutation(len(rows))
    if len(rows) < holdout + 1:
        raise ValueError(f"the training data has {len(rows)} documents; adapt holds out {holdout} and needs at least one more")
    return [rows[i] for i in order[holdout:]], [rows[i] for i in order[:holdout]]


def wrap(doc: list[int], start: int, window: int, cls: int, sep: int) -> list[int]:
    return [cls, *doc[start:start + window - 2], sep]


def layer_inputs(teacher, input_ids, mask) -> list[torch.Tensor]:
    """The teacher's input to every layer, and its last output."""
    key_valid = mask.bool()
    x = teacher.embeddings(input_ids, mask)
    states = [x]
    for layer in teacher.layers:
        x, _ = layer(x, key_valid)
        states.append(x)
    return states


@torch.no_grad()
def layer_cosines(student, teacher, ids: list[list[int]], batch: int = 8, progress=None) -> list[float]:
    """Per layer i, the mean cosine of the pooled vector to the teacher's when only layer i is
    the student's and the embeddings and every other layer are the teacher's: where a
    variant's error sits (the deficits 1 - cosine of the layers roughly add up to the whole
    student's). `ids`: token id lists the teacher reads whole (at most its max_length);
    `progress(n)` is called after each batch of n."""
    from attnserve.models.api import pad_batch
    from attnserve.models.encoder import pool

    def pooled(x, key_valid):  # the model's pooling, normalised for a cosine
        return pool(x, key_valid, teacher.shape.pooling, normalize=True)

    sums = torch.zeros(len(student.layers), dtype=torch.float64)
    for start in range(0, len(ids), batch):
        input_ids, mask = pad_batch(ids[start:start + batch])
        key_valid = mask.bool()
        states = layer_inputs(teacher, input_ids, mask)
        target = pooled(states[-1], key_valid)
        for i, layer in enumerate(student.layers):
            x, _ = layer(states[i], key_valid)
            for later in teacher.layers[i + 1:]:
                x, _ = later(x, key_valid)
            sums[i] += float((pooled(x, key_valid) * target).sum())
        if progress is not None:
            progress(input_ids.shape[0])
    return (sums / max(len(ids), 1)).tolist()


class Distill:
    """Stage "distill" (see the module docstring)."""

    name = "distill"
    metric = "mean cosine of pooled vectors to full attention on the first {window} tokens"
    loss_texts = {
        "layer-local": "layer-local: each attention sub-layer on the teacher's input vs the teacher's output, relative squared error",
        "end-to-end": "end-to-end: 10 x (1 - cosine) of the pooled vectors + mean over tokens of 1 - cosine of the last hidden states",
    }

    def __init__(self, plan: Plan, student, train_rows, held_rows):
        from attnserve.models.api import load_encoder
        from attnserve.models.registry import VARIANTS, adapt_lr

        if plan.loss not in DISTILL_LOSSES:
            raise ValueError(f"--loss {plan.loss!r}: choose from {', '.join(DISTILL_LOSSES)}")
        self.objective = plan.loss
        self.loss_text = self.loss_texts[plan.loss]
        positions = student.shape.max_positions  # the teacher's pretrained length
        self.window = plan.window or positions
        if not 8 <= self.window <= positions:
            raise ValueError(f"--window must be in 8..{positions} for stage distill, the teacher's pretrained length "
                             f"(got {self.window})")
        self.batch = plan.batch
        also = {f".{name}." for name in plan.also}
        unknown = sorted(name for name in plan.also if not any(f".{name}." in n for n, _ in named_once(student)))
        if unknown:
            raise ValueError(f"--also {', '.join(unknown)}: no such module in the encoder's layers; "
                             f"choose from attention_out, attention_norm, query, key, value, intermediate, output, output_norm, "
                             f"each for every layer, or with a layer index (5.intermediate) for that layer's only")
        self.params = trainable(student, "distill")
        if not self.params:
            raise ValueError(f"{plan.variant} has no parameters of its own to distill (its pattern is fixed); "
                             f"variants with some: {', '.join(n for n, c in VARIANTS.items() if c.adapt_lr)}")
        # A schedule trains the layers whose variant has parameters of its own.
        self.lr = plan.lr or adapt_lr(student.attention_config)
        # Modules named by --also: trained too, at a fine-tuning rate (default 1e-4).
        self.groups = [{"params": list(self.params.values()), "lr": self.lr}]
        extra = {n: p for n, p in named_once(student) if any(a in n for a in also) and ".attention." not in n}
        if extra:
            self.groups.append({"params": list(extra.values()), "lr": plan.also_lr})
            self.params = {**self.params, **extra}
        self.teacher = load_encoder("full", self.window, model=student.model)
        tokenizer = student.tokenizer
        self.cls, self.sep = student.special_ids
        self.docs = [d for d in token_documents(tokenizer, train_rows) if d]
        self.held_ids = [wrap(d, 0, self.window, self.cls, self.sep) for d in token_documents(tokenizer, held_rows)]
        self.teacher_vectors = self.teacher.embed_ids(self.held_ids)
        self.facts = {"teacher": f"full attention, pretrained {student.model.name}, {self.window} tokens"}
        # Windows start at position 0: a variant's position tables learn their first `window` rows only.
        self.position_rows = self.window

    def windows(self, rng):
        """(input_ids, mask) of `batch` random windows of the training documents."""
        from attnserve.models.api import pad_batch

        picked = []
        for i in rng.integers(0, len(self.docs), self.batch):
            doc = self.docs[i]
            picked.append(wrap(doc, int(rng.integers(0, max(1, len(doc) - (self.window - 2) + 1))), self.window, self.cls, self.sep))
        return pad_batch(picked)

    def loss(self, student, rng) -> torch.Tensor:
        input_ids, mask = self.windows(rng)
        return (self.end_to_end if self.objective == "end-to-end" else self.layer_local)(student, input_ids, mask)

    def layer_local(self, student, input_ids, mask) -> torch.Tensor:
        """Each student attention sub-layer on the teacher's input against the teacher's
        sub-layer output, relative squared error over the real tokens, summed."""
        key_valid = mask.bool()
        real = key_valid[:, :, None].to(torch.float32)
        with torch.no_grad():
            states = layer_inputs(self.teacher, input_ids, mask)
            targets = [layer.attention_block(x, key_valid)[0] for layer, x in zip(self.teacher.layers, states)]
        loss = 0.0
        for layer, x, target in zip(student.layers, states, targets):
            out, _ = layer.attention_block(x, key_valid)
            loss = loss + (((out - target) ** 2) * real).sum() / ((target**2) * real).sum()
        return loss

    def end_to_end(self, student, input_ids, mask) -> torch.Tensor:
        """The whole student against the whole teacher: pooled vectors and last hidden states."""
        with torch.no_grad():
            target_vector, target_states = self.teacher(input_ids, mask)
        vector, states = student(input_ids, mask)
        real = mask.to(torch.float32)
        tokens = ((1 - torch.nn.functional.cosine_similarity(states, target_states, dim=-1)) * real).sum() / real.sum()
        return 10 * (1 - (vector * target_vector).sum(1)).mean() + tokens

    @torch.no_grad()
    def score(self, student) -> float:
        return float((student.embed_ids(self.held_ids) * self.teacher_vectors).sum(1).mean())

    def by_layer(self, student) -> list[float]:
        return layer_cosines(student, self.teacher, self.held_ids)


class LongText:
    """Stage "long" (see the module docstring)."""

    name = "long"
    position_rows = 0  # what it trains is no variant's position table
    metric = "mean MRR of titles and passages over the held-out documents, one vector and late chunks MaxP, {window} tokens"
    loss_text = (f"InfoNCE (temperature {TEMPERATURE}): title and passage -> their document's vector (in-batch and recent-batch "
                 f"negatives) and -> its best {CHUNK_TOKENS}-token late chunk (in-batch negatives), averaged")

    def __init__(self, plan: Plan, student, train_rows, held_rows):
        from attnserve.data.retrieval import passage

        if student.attention_config.positions != "learned":
            raise ValueError("stage long trains the offsets of positions=learned; pass --param positions=learned")
        positions = student.shape.max_positions  # tokens past the position table read what this stage trains
        self.window = plan.window or plan.max_length
        if not positions + 2 <= self.window <= plan.max_length:
            raise ValueError(f"--window must be in {positions + 2}..max_length {plan.max_length} for stage long: only tokens "
                             f"past {positions} use what it trains (got {self.window})")
        self.batch = plan.batch
        self.params = trainable(student, "long")
        self.lr = plan.lr or 1e-3
        self.groups = [{"params": list(self.params.values()), "lr": self.lr}]
        if plan.also:
            raise ValueError("--also applies to stage distill only")
        if plan.loss != "layer-local":
            raise ValueError("--loss applies to stage distill only (stage long has its contrastive objective)")
        tokenizer = student.tokenizer
        cls, sep = student.special_ids
        # Documents that reach past the position table: only those train anything.
        rows = [(r, d) for r, d in zip(train_rows, token_documents(tokenizer, train_rows))
                if len(d) > positions and r.get("query")]
        if not rows:
            raise ValueError(f"stage long needs training documents longer than {positions} tokens with a 'query' (their title)")
        self.rows = [r for r, _ in rows]
        self.docs = [wrap(d, 0, self.window, cls, sep) for _, d in rows]
        # Queries are short: the pretrained model's vectors, whatever the offsets become.
        self.titles = student.embed_ids(student.tokenize([r["query"] for r in self.rows]))
        self.passage = passage
        held = list(zip(held_rows, token_documents(tokenizer, held_rows)))
        rng = np.random.default_rng(0)
        self.held_ids = [wrap(d, 0, self.window, cls, sep) for _, d in held]
        self.held_queries = [student.embed_ids(student.tokenize([r.get("query") or r["text"][:200] for r, _ in held])),
                             student.embed_ids(student.tokenize([passage(r["text"], rng) for r, _ in held]))]
        self.bank: list[tuple[torch.Tensor, np.ndarray]] = []
        self.facts = {"queries": "each document's title ('query' field) and a 30-word passage from past its word 600",
                      f"documents_longer_than_{positions}": len(self.docs)}

    def loss(self, student, rng) -> torch.Tensor:
        from attnserve.models.api import pad_batch

        picked = rng.choice(len(self.docs), size=min(self.batch, len(self.docs)), replace=False)
        input_ids, mask = pad_batch([self.docs[i] for i in picked])
        docs, hidden = student(input_ids, mask)
        chunks, chunk_valid = late_chunks(hidden, mask)
        with torch.no_grad():
            passages = student.embed_ids(student.tokenize([self.passage(self.rows[i]["text"], rng) for i in picked]))
        bank = [v for v, owners in self.bank if not np.isin(owners, picked).any()]
        candidates = torch.cat([docs, *bank]) if bank else docs
        target = torch.arange(len(picked))
        loss = 0.0
        for queries in (self.titles[picked], passages):
            loss = loss + torch.nn.functional.cross_entropy(queries @ candidates.T / TEMPERATURE, target)
            loss = loss + torch.nn.functional.cross_entropy(max_chunk_scores(queries, chunks, chunk_valid) / TEMPERATURE, target)
        self.bank = [*self.bank, (docs.detach(), picked)][-BANK_BATCHES:]
        return loss / 4

    @torch.no_grad()
    def score(self, student) -> float:
        from attnserve.models.api import pad_batch
        from attnserve.data.retrieval import mean_reciprocal_rank

        vectors, chunk_sets = [], []
        for ids in self.held_ids:  # one at a time: documents of up to max_length tokens
            input_ids, mask = pad_batch([ids])
            vector, hidden = student(input_ids, mask)
            vectors.append(vector)
            chunk_sets.append(late_chunks(hidden, mask))
        docs = torch.cat(vectors).numpy()
        # Every document's real chunks in a row, with their owner: quality's MaxP scoring.
        chunks = np.concatenate([c[0][v[0]].numpy() for c, v in chunk_sets])
        owner = np.concatenate([np.full(int(v.sum()), i) for i, (_, v) in enumerate(chunk_sets)])
        mrrs = []
        for queries in self.held_queries:
            mrrs.append(mean_reciprocal_rank(queries.numpy(), docs))
            mrrs.append(mean_reciprocal_rank(queries.numpy(), chunks, owner))
        return float(np.mean(mrrs))

    def by_layer(self, student) -> None:
        return None  # what it trains feeds every layer at once: no score by layer


def late_chunks(hidden: torch.Tensor, mask: torch.Tensor, chunk_tokens: int = CHUNK_TOKENS):
    """(B, C, hidden) L2-normalised chunk means of each document (its real tokens: mask), cut as
    /embed_chunks cuts them (contract.pooling.token_ranges: [CLS] in the first chunk, [SEP] in
    the last), and which chunks exist (B, C)."""
    ranges = [token_ranges(int(n), chunk_tokens) for n in mask.sum(1)]
    member = torch.zeros(hidden.shape[0], max(map(len, ranges)), hidden.shape[1], dtype=hidden.dtype)
    for row, chunks in enumerate(ranges):
        for index, (first, stop) in enumerate(chunks):
            member[row, index, first:stop] = 1.0
    counts = member.sum(2)
    means = (member @ hidden) / counts.clamp(min=1)[..., None]
    return torch.nn.functional.normalize(means, dim=-1), counts > 0


def max_chunk_scores(queries: torch.Tensor, chunks: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(Q, D): each query's best cosine over each document's chunks (MaxP)."""
    scores = torch.einsum("qh,dch->qdc", queries, chunks).masked_fill(~valid[None], -2.0)
    return scores.amax(-1)


def shown_path(path) -> str:
    """A path as adapt.json records it: the bundled documents as data/NAME (the package's data
    folder, which a checkout links at its root as data/), any other path in full."""
    path = Path(path).resolve()
    root = TRAIN_DOCUMENTS.parents[1]
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


STAGE_CLASSES = {"distill": Distill, "long": LongText}
assert tuple(STAGE_CLASSES) == STAGES


def named_once(module):
    """named_parameters lists a tied tensor once, under its first name."""
    return list(module.named_parameters())


def trainable(encoder, stage: str = "distill") -> dict[str, torch.nn.Parameter]:
    """What a stage trains, by state_dict name: the variant's own parameters (distill) or the
    learned positions' offsets (long)."""
    if stage == "long":
        offsets = encoder.embeddings.long_offsets
        return {} if offsets is None else {"embeddings.long_offsets": offsets}
    return {n: p for n, p in named_once(encoder) if ".attention." in n}


def started_from(weights_dir) -> list[str]:
    """The tensor names of the adapted weights a run starts from (none without)."""
    if not weights_dir:
        return []
    from safetensors import safe_open

    from attnserve.models.weights import weights_file

    with safe_open(str(weights_file(weights_dir)), "pt") as f:
        return list(f.keys())


def adapt(plan: Plan, log=print) -> dict:
    """Run `plan`; returns what adapt.json records."""
    from tqdm import tqdm

    from attnserve.models.api import load_encoder
    from attnserve.models.registry import make_config
    from attnserve.models.weights import load_weights, save_weights
    from attnserve.data import read_jsonl

    if plan.stage not in STAGES:
        raise ValueError(f"unknown stage {plan.stage!r}; valid: {', '.join(STAGES)}")
    if plan.minutes <= 0:
        raise ValueError(f"--minutes must be > 0 (got {plan.minutes})")
    if plan.threads:
        torch.set_num_threads(plan.threads)
    config = make_config(plan.variant, plan.max_length, **plan.params)
    torch.manual_seed(plan.seed)
    rng = np.random.default_rng(plan.seed)

    rows = read_jsonl(plan.data)
    train_rows, held_rows = split(rows, plan.holdout, plan.seed)
    student = load_encoder(plan.variant, plan.max_length, model=plan.model, **plan.params)
    if plan.weights:  # a start: it may have been trained under other parameter values (a new stride)
        load_weights(student, plan.weights, any_parameters=True)
    stage = STAGE_CLASSES[plan.stage](plan, student, train_rows, held_rows)
    params = stage.params
    for p in student.parameters():
        p.requires_grad_(False)
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(stage.groups, eps=1e-12)

    def snapshot():
        return {name: p.detach().clone() for name, p in params.items()}

    student.eval()
    before = stage.score(student)
    layers_before = stage.by_layer(student)
    best, best_state = before, snapshot()
    curve = {"seconds": [], "loss": [], "eval_seconds": [0.0], "held_out": [before]}
    log(f"adapt {config.variant} ({plan.stage}) {config.as_params()} at max_length {plan.max_length}: "
        f"{sum(p.numel() for p in params.values()):,} parameters in {len(params)} tensors, lr {stage.lr}, "
        f"{len(train_rows)} training / {len(held_rows)} held-out documents; held-out score before {before:.4f}")

    budget = plan.minutes * 60
    started = last_eval = time.perf_counter()
    steps, interrupted = 0, False
    with tqdm(total=round(budget), unit="s", desc=f"adapt {plan.variant}", mininterval=2, bar_format="{l_bar}{bar}| {n}/{total} s {postfix}") as bar:
        try:
            while time.perf_counter() - started < budget and not (plan.max_steps and steps >= plan.max_steps):
                student.train()
                loss = stage.loss(student, rng)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                steps += 1
                now = time.perf_counter()
                curve["seconds"].append(round(now - started, 2))
                curve["loss"].append(loss.item())
                last_step = now - started >= budget or steps == plan.max_steps
                if now - last_eval >= plan.eval_seconds or last_step:
                    student.eval()
                    score = stage.score(student)
                    curve["eval_seconds"].append(round(time.perf_counter() - started, 2))
                    curve["held_out"].append(score)
                    if score > best:
                        best, best_state = score, snapshot()
                    last_eval = time.perf_counter()
                bar.set_postfix_str(f"step {steps} loss {curve['loss'][-1]:.4f} held-out {curve['held_out'][-1]:.4f} (best {best:.4f})")
                bar.update(min(round(budget), round(time.perf_counter() - started)) - bar.n)
        except KeyboardInterrupt:  # Ctrl-C ends training early; the best checkpoint so far is written
            interrupted = True
            log(f"interrupted after {steps} steps: writing the best checkpoint so far")

    with torch.no_grad():
        for name, p in params.items():
            p.copy_(best_state[name])
    student.eval()
    by_layer = {}
    if layers_before is not None:
        layers_after = stage.by_layer(student)
        by_layer = {"by_layer": {"metric": "the same with only that layer the variant's, the others the teacher's",
                                 "before": [round(v, 5) for v in layers_before], "after": [round(v, 5) for v in layers_after]}}
        log("held-out score by layer (only that layer the variant's, the others the teacher's), before -> after: "
            + ", ".join(f"{i}: {a:.4f} -> {b:.4f}" for i, (a, b) in enumerate(zip(layers_before, layers_after))))
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    # Started from adapted weights: those not trained now are kept, so DIR alone gives the whole model
    # (a schedule keeps those of its own layers: the others were never loaded).
    state = student.state_dict()
    names = list(dict.fromkeys([*params, *(n for n in started_from(plan.weights) if n in state)]))
    sha = save_weights(student, out, names, position_rows=stage.position_rows)
    record = {
        "model": student.model.record,  # weights serve this model only (src/attnserve/models/weights.py)
        "variant": config.variant,
        "parameters": json.loads(json.dumps(config.as_params())),
        "max_length": plan.max_length,
        "stage": plan.stage,
        "trained": {name: list(p.shape) for name, p in params.items()},
        **({"kept": sorted(set(names) - set(params))} if set(names) - set(params) else {}),
        "trained_parameters": sum(p.numel() for p in params.values()),
        "frozen": "every other weight (the pretrained model's)",
        **({"started_from": {"dir": shown_path(plan.weights), "weights_sha256": student.weights["sha256"]}} if plan.weights else {}),
        "loss": stage.loss_text,
        **stage.facts,
        "data": {"file": shown_path(plan.data), "documents": len(rows), "training": len(train_rows), "held_out": len(held_rows),
                 "held_out_ids": [r.get("id") for r in held_rows], "seed": plan.seed},
        "window": stage.window,
        "batch": plan.batch,
        "lr": stage.lr,
        **({"also_lr": plan.also_lr} if plan.also else {}),
        "steps": steps,
        "minutes": plan.minutes,
        "interrupted": interrupted,
        "seconds": round(time.perf_counter() - started, 1),
        "threads": torch.get_num_threads(),
        "held_out": {"metric": stage.metric.format(window=stage.window), "before": round(before, 5), "after": round(best, 5),
                     **by_layer},
        "curve": curve,
        "weights_sha256": sha,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "adapt.json").write_text(json.dumps(record, indent=2) + "\n")
    plot(curve, out / "loss.png", f"adapt {plan.variant} ({plan.stage})", stage.metric.format(window=stage.window))
    log(f"held-out score {before:.4f} -> {best:.4f} after {steps} steps in {record['seconds']} s; wrote {out}")
    return record


def plot(curve: dict, path: Path, title: str, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, loss_axis = plt.subplots(figsize=(7, 4))
    loss_axis.plot(curve["seconds"], curve["loss"], color="tab:blue", alpha=0.35, lw=0.8, label="training loss")
    if len(curve["loss"]) >= 20:
        smooth = np.convolve(curve["loss"], np.ones(20) / 20, mode="valid")
        loss_axis.plot(curve["seconds"][19:], smooth, color="tab:blue", label="training loss (mean of 20)")
    loss_axis.set(xlabel="seconds", ylabel="loss", yscale="log", title=title)
    cos_axis = loss_axis.twinx()
    cos_axis.plot(curve["eval_seconds"], curve["held_out"], color="tab:red", marker="o", label="held-out score")
    cos_axis.set_ylabel(metric if len(metric) < 50 else "held-out score")
    lines = loss_axis.get_legend_handles_labels()[0] + cos_axis.get_legend_handles_labels()[0]
    fig.legend(lines, [line.get_label() for line in lines], loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI


def configure(parser) -> None:
    parser.add_argument("--variant", required=True, help="attention variant or schedule (distill: one with parameters of its own, linformer, compressed, sinkhorn, "
                        "synthesizer, or a schedule with some of them; long: any)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="variant parameter (repeatable)")
    parser.add_argument("--max-length", type=int, default=16384, help="the deployment's max_length the weights are for (default 16384)")
    parser.add_argument("--data", default=str(TRAIN_DOCUMENTS),
                        help="training documents, .jsonl or .jsonl.gz with a 'text' field, never the documents you report "
                             "quality on (default: the bundled data/longdocs-train.jsonl.gz, 520 Linux kernel documentation pages)")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time budget (default 10)")
    parser.add_argument("--out", required=True, help="directory for weights.safetensors, adapt.json and loss.png")
    parser.add_argument("--stage", default="distill", choices=STAGES)
    parser.add_argument("--window", type=int, default=0, help="training window in tokens (default: 512 for distill, the teacher's length; max_length for long)")
    parser.add_argument("--batch", type=int, default=4, help="windows per step (default 4)")
    parser.add_argument("--lr", type=float, default=0.0, help="Adam learning rate (default: the variant's own for distill, 1e-3 for long)")
    parser.add_argument("--holdout", type=int, default=40, help="training documents held out for choosing the checkpoint (default 40)")
    parser.add_argument("--eval-seconds", type=float, default=60.0, help="held-out score every this many seconds (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--also", default="", help="distill: comma-separated per-layer modules to train besides the variant's own "
                        "parameters, e.g. attention_out, in every layer, or 5.intermediate for one layer's (they then differ from the "
                        "pretrained model's for every input)")
    parser.add_argument("--also-lr", type=float, default=1e-4, help="distill: Adam's rate for the --also modules (default 1e-4)")
    parser.add_argument("--loss", default="layer-local", choices=DISTILL_LOSSES,
                        help="distill: layer-local (each attention sub-layer on the teacher's input) or end-to-end "
                             "(the whole student to the teacher's pooled vector and last hidden states; default layer-local)")
    parser.add_argument("--weights", default=None, help="adapted weights to start from (a weights directory, e.g. a "
                        "layer-local run's before --loss end-to-end); the output holds the tensors trained now")
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="a sentence-transformers folder (BERT or XLM-RoBERTa) to train for (default: the bundled "
                             "all-MiniLM-L6-v2); its weights serve that model only")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps even within the minutes (default: no cap)")


def adapt_command(args) -> int:
    import sys

    from attnserve.contract.export_format import parse_params

    try:
        plan = Plan(variant=args.variant, params=parse_params(args.param), max_length=args.max_length, data=args.data,
                    out=args.out, minutes=args.minutes, stage=args.stage, window=args.window, batch=args.batch,
                    lr=args.lr, holdout=args.holdout, eval_seconds=args.eval_seconds, seed=args.seed, threads=args.threads,
                    max_steps=args.max_steps, also=tuple(a.strip() for a in args.also.split(",") if a.strip()),
                    loss=args.loss, weights=args.weights, also_lr=args.also_lr,
                    model=args.model)
        if not Path(plan.data).is_file():
            raise ValueError(f"--data {plan.data}: no such file")
        adapt(plan)
    except ValueError as exc:
        print(f"attnserve adapt: error: {exc}", file=sys.stderr)
        return 2
    return 0
