"""Where the `attnserve bench ...` commands come from: the benchmarks/ folder of a source
checkout, beside its src/, which the wheel does not install.

The command table (src/attnserve/service/cli.py) names a benchmark as "attnserve.service.bench:MODULE.FUNCTION";
looking that name up here imports benchmarks.MODULE from the checkout. Installed from a wheel,
without the folder, the command exits 2 saying how to get a checkout.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[3]  # the repository root of an editable install
BENCHMARKS = CHECKOUT / "benchmarks"


def benchmarks_package():
    """The checkout's benchmarks package, imported under the name `benchmarks` (its modules
    import each other so); exits 2 with what to do where there is no checkout."""
    if "benchmarks" in sys.modules:
        return sys.modules["benchmarks"]
    init = BENCHMARKS / "__init__.py"
    if not init.is_file():
        print("attnserve bench: the benchmarks run from a source checkout (their benchmarks/ folder is not in the "
              f"wheel, and this install has no {BENCHMARKS}); get one and install it editable: "
              "git clone <the attnserve repository> attnserve && cd attnserve && pip install -e '.[test]', "
              "then run attnserve bench there", file=sys.stderr)
        raise SystemExit(2)
    # One way in, as the tests (pytest's pythonpath), the benchmarks' own child processes
    # (PYTHONPATH) and benchmarks/gpu.py run as a script have it: the checkout's root on sys.path.
    if str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
    return importlib.import_module("benchmarks")


def __getattr__(name: str):
    """"MODULE.FUNCTION" -> benchmarks.MODULE.FUNCTION."""
    module, dot, function = name.partition(".")
    if not dot:
        raise AttributeError(name)
    benchmarks_package()
    return getattr(importlib.import_module(f"benchmarks.{module}"), function)
