"""Where the `attnserve bench ...` commands come from: the benchmarks/ folder of a source
checkout, beside this package's models/ and service/, which the wheel does not install.

The command table (service/cli.py) names a benchmark as "attnserve.service.bench:MODULE.FUNCTION";
looking that name up here imports benchmarks.MODULE from the checkout. Installed from a wheel,
without the folder, the command exits 2 saying how to get a checkout.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]  # the repository root of an editable install
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
    spec = importlib.util.spec_from_file_location("benchmarks", init, submodule_search_locations=[str(BENCHMARKS)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = package
    spec.loader.exec_module(package)
    return package


def __getattr__(name: str):
    """"MODULE.FUNCTION" -> benchmarks.MODULE.FUNCTION."""
    module, dot, function = name.partition(".")
    if not dot:
        raise AttributeError(name)
    benchmarks_package()
    return getattr(importlib.import_module(f"benchmarks.{module}"), function)
