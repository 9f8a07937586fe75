"""`python -m research.context {cache,train,bench}`, from the repository root: the context-head
research tool (research/README.md)."""
from __future__ import annotations

import argparse
import sys

from research.context import bench, cache, train

COMMANDS = {
    "cache": ("run the frozen encoder once over documents and store what the context heads learn from",
              cache.configure, cache.cache_command),
    "train": ("learn context heads (chunk vectors with context, learned pooling) on a cache, in minutes",
              train.configure, train.train_command),
    "bench": ("what document context buys chunk vectors and one-vector documents, from a cache, and its cost",
              bench.configure, bench.bench_context_command),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m research.context", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (text, configure, handler) in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text)
        configure(sub)
        sub.set_defaults(handler=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
