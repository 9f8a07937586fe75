"""Writing and reading context-head folders (research/context/format.py says what one
holds): each head's parameters, its ONNX graph checked against PyTorch, and context.json."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from research.context.heads import make_head
from research.context.format import (
    CONTEXT_FORMAT, GRAPH_INPUTS, GRAPH_OUTPUTS, SPEC_FILE, WEIGHTS_FILE, ContextHeadError, read_spec)
from attnserve.contract.export_format import sha256

PARITY_TOL = 1e-4  # max abs difference of ONNX Runtime's unit vectors from PyTorch's


def example_inputs(kind: str, dim: int, size: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    if kind == "chunks":
        naive = torch.nn.functional.normalize(torch.randn(size, dim, generator=g), dim=-1)
        return naive, torch.randn(size, dim, generator=g) * 0.3, torch.randn(dim, generator=g) * 0.3
    return (torch.randn(size, dim, generator=g) * 0.3,)


def export_head(head: torch.nn.Module, path: Path, dim: int) -> float:
    """head's forward as an ONNX graph at path, with its size axis symbolic; returns the largest
    difference from PyTorch over two sizes (ExportFailed-style ValueError past PARITY_TOL)."""
    import onnxruntime as ort

    kind = head.kind
    size = torch.export.Dim("size", min=2, max=1 << 20)
    shapes = tuple({0: size} if name != "doc" else {} for name in GRAPH_INPUTS[kind])
    program = torch.export.export(head, example_inputs(kind, dim, 5), dynamic_shapes=shapes)
    torch.onnx.export(program, f=str(path), input_names=GRAPH_INPUTS[kind], output_names=[GRAPH_OUTPUTS[kind]],
                      external_data=False, verbose=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for n in (3, 37):
        inputs = example_inputs(kind, dim, n, seed=n)
        with torch.no_grad():
            expected = head(*inputs).numpy()
        got = session.run(None, {name: x.numpy() for name, x in zip(GRAPH_INPUTS[kind], inputs)})[0]
        worst = max(worst, float(np.abs(got - expected).max()))
    if worst > PARITY_TOL:
        raise ValueError(f"{path}: ONNX Runtime differs from PyTorch by {worst:.2e} (> {PARITY_TOL})")
    return worst


def save_heads(out, heads: dict[str, torch.nn.Module], records: dict[str, dict], *, variant: str, max_length: int,
               chunk_tokens: int, hidden_size: int, cache: dict) -> Path:
    """Write a context-head folder: one head per kind ("chunks", "pooling")."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors, spec_heads = {}, {}
    for kind, head in heads.items():
        tensors.update({f"{kind}.{name}": p.detach().contiguous() for name, p in head.state_dict().items()})
        graph = out / f"{kind}.onnx"
        parity = export_head(head, graph, hidden_size)
        spec_heads[kind] = {"design": records[kind]["design"], "rank": records[kind]["rank"], "graph": graph.name,
                            "sha256": sha256(graph), "onnx_max_abs_diff": parity}
    save_file(tensors, str(out / WEIGHTS_FILE))
    spec = {"format": CONTEXT_FORMAT, "variant": variant, "max_length": max_length, "chunk_tokens": chunk_tokens,
            "hidden_size": hidden_size, "heads": spec_heads, "trained": records, "cache": cache}
    (out / SPEC_FILE).write_text(json.dumps(spec, indent=1) + "\n")
    return out


def load_heads(folder) -> dict[str, torch.nn.Module]:
    """The folder's heads as PyTorch modules, by kind."""
    from safetensors.torch import load_file

    folder = Path(folder)
    spec = read_spec(folder)
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise ContextHeadError(f"{path}: missing; {SPEC_FILE} names heads whose parameters it holds")
    tensors = load_file(str(path))
    heads = {}
    for kind, record in spec.heads.items():
        head = make_head(record.design, spec.hidden_size, record.rank)
        own = {k.removeprefix(f"{kind}."): v for k, v in tensors.items() if k.startswith(f"{kind}.")}
        try:
            head.load_state_dict(own)
        except RuntimeError as exc:
            raise ContextHeadError(f"{path}: its {kind} tensors do not fit a {record.design} head of rank {record.rank} "
                                   f"({str(exc).splitlines()[0]})") from None
        heads[kind] = head.eval()
    return heads
