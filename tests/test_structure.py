"""The layout and the import boundary between exporting and serving.

Every module's import path is its file's path under src/ (attnserve.export.graphs is
src/attnserve/export/graphs.py). The torch side (attnserve.models: the encoder and its variants;
attnserve.export: ONNX export; attnserve.train: adaptation) and attnserve.service (numpy and ONNX
Runtime: serving) meet in one torch-free package, attnserve.contract (what an export holds and how
its outputs become vectors). Nothing on the torch side imports the service; nothing in the service
imports the torch side, so a serving install never needs torch; and the contract imports nothing
else of either. attnserve.data (the bundled documents, retrieval scores) is torch-free too and
shared by training and the benchmarks. attnserve.bench (the benchmarks) may import both sides;
attnserve.cli (the command table) imports each command's module only when that command runs; no
other package imports either. attnserve.model_source (where --model points: a folder, or a Hugging
Face Hub id resolved offline first) is torch-free, for the command line and the server's
settings. The imports are read from the source (every import statement,
inside functions too), not from what a run happens to load.
"""
import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnserve"
TORCH_SIDE = ("models", "export", "train")
PACKAGES = ("contract", "data", *TORCH_SIDE, "service", "bench")
MODULES = ("cli", "model_source")  # modules of the package itself, beside its packages (and __main__.py)
ALLOWED = {"numpy", "pydantic"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(("attnserve", *parts))


def imports(path: Path) -> set[str]:
    """Every module an import statement in the file names, relative imports resolved."""
    package = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def crossings(source: str, target: str, allowed: set[str]) -> list[str]:
    bad = []
    files = [PACKAGE / f"{source}.py"] if source in MODULES else sorted((PACKAGE / source).rglob("*.py"))
    for path in files:
        for name in sorted(imports(path)):
            if (name == target or name.startswith(target + ".")) and name not in allowed and not any(
                    name.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_every_package_is_a_folder_found_by_setuptools():
    """The packages are found under src/ (pyproject.toml lists none), and each one is there."""
    assert 'where = ["src"]' in (ROOT / "pyproject.toml").read_text()
    found = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert found == sorted(PACKAGES)
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted(["__init__", "__main__", *MODULES])
    assert not (ROOT / "models").exists() and not (ROOT / "service").exists() and not (ROOT / "benchmarks").exists()
    # The bundled documents are package data; a checkout links their folder at its root.
    assert (ROOT / "data").is_symlink() and (ROOT / "data").resolve() == PACKAGE / "data"


def test_the_torch_side_never_imports_the_service():
    assert (PACKAGE / "contract" / "export_format.py").exists()
    assert [c for side in TORCH_SIDE for c in crossings(side, "attnserve.service", set())] == []


def test_the_service_never_imports_the_torch_side():
    assert [c for side in TORCH_SIDE for c in crossings("service", f"attnserve.{side}", set())] == []


def test_models_never_import_training():
    """Training builds on the encoder and its export, never the other way round."""
    assert crossings("models", "attnserve.train", set()) == [] and crossings("export", "attnserve.train", set()) == []


def test_only_the_command_line_imports_the_benchmarks_and_nothing_imports_the_command_line():
    """The benchmarks measure both sides; the service, the torch side, the contract and the data
    import neither them nor the command table (so `attnserve serve` is the server alone)."""
    for side in ("contract", "data", *TORCH_SIDE, "service"):
        assert crossings(side, "attnserve.bench", set()) == [] and crossings(side, "attnserve.cli", set()) == [], side
    assert crossings("bench", "attnserve.cli", set()) == []


def test_the_command_table_holds_functions_not_dispatch_strings():
    """Each row's setup is a function of attnserve.cli that imports its module by name (a tool can
    follow it), never a "module:function" string loaded by importlib."""
    from attnserve.cli import COMMANDS

    assert COMMANDS and all(inspect.isfunction(c.setup) and c.setup.__module__ == "attnserve.cli" for c in COMMANDS)
    source = (PACKAGE / "cli.py").read_text()
    strings = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert [s for s in strings if re.fullmatch(r"[\w.]+:[\w.]+", s)] == []
    assert "importlib" not in source and "import_module" not in source
    assert 'attnserve = "attnserve.cli:main"' in (ROOT / "pyproject.toml").read_text()


def test_nothing_in_the_product_imports_the_research_folder():
    """research/ (context heads, the training-documents scraper) sits outside src/ and the wheel:
    the product never imports it, so an install without a checkout lacks nothing it runs."""
    found = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted(PACKAGE.rglob("*.py"))
             for name in sorted(imports(path)) if name == "research" or name.startswith("research.")]
    assert found == []
    assert (ROOT / "research" / "__init__.py").is_file() and not (PACKAGE / "research").exists()


def test_the_research_commands_run_from_the_repository_root():
    """Every command research/README.md gives answers --help from the repository root, where a
    checkout has research/ importable."""
    for command in (["research.context", "--help"], ["research.context", "cache", "--help"], ["research.context", "train", "--help"],
                    ["research.context", "bench", "--help"], ["research.training_docs", "--help"]):
        done = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "usage: python -m " in done.stdout, (command, done.stderr[-2000:])
    readme = (ROOT / "research" / "README.md").read_text()
    assert all(f"python -m {name}" in readme for name in ("research.context cache", "research.context train",
                                                          "research.context bench", "research.training_docs"))


def test_the_contract_imports_only_itself_numpy_pydantic_and_the_standard_library():
    outside = []
    for package in ("contract", "data"):  # the bundled documents and their scores: the same rule
        for path in sorted((PACKAGE / package).rglob("*.py")):
            for name in sorted(imports(path)):
                top = name.split(".")[0]
                if name.startswith(f"attnserve.{package}") or top in ALLOWED or top in sys.stdlib_module_names:
                    continue
                outside.append(f"{path.relative_to(ROOT)} imports {name}")
    assert outside == []


def import_graph() -> dict[str, set[str]]:
    """{module: the modules of the package its import statements name} (inside functions too:
    an import deferred into a function to dodge a cycle is still the cycle)."""
    modules = {module_name(p): p for d in PACKAGES for p in (PACKAGE / d).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports(path):
            while imported and imported not in modules:  # `from pkg.module import name` -> pkg.module
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_itself_through_others():
    """No import circle anywhere in the package: the registry imports the variants, which import
    only their base; the schedule imports the base at its top."""
    graph = import_graph()
    assert "attnserve.models.attention.local" in graph["attnserve.models.registry"]
    assert import_cycles(graph) == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check finds one


def test_the_reader_resolves_relative_imports(tmp_path):
    probe = PACKAGE / "service" / "routes" / "__init__.py"
    assert "attnserve.service.routes" == module_name(probe)
    names = imports(probe)
    assert all(not n.startswith(".") for n in names)


def test_every_serving_module_imports_with_torch_blocked():
    """Each module of the service and the contract, imported in a process where torch and the
    torch side cannot be imported at all, as in the torch-free serving image."""
    modules = sorted(module_name(p) for d in ("service", "contract", "data") for p in (PACKAGE / d).rglob("*.py")
                     if p.name != "__main__.py") + ["attnserve.cli"]
    script = f"""
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch" or name.startswith(("attnserve.models", "attnserve.export", "attnserve.train")):
            raise ImportError(name + " is blocked: serving must not need it")
sys.meta_path.insert(0, Block())
for name in {modules!r}:
    importlib.import_module(name)
from attnserve.cli import main
for words in (["--help"], ["serve", "--help"], ["bench", "--help"]):  # the command line of a serving install
    try:
        main(words)
    except SystemExit as exit:
        assert exit.code == 0, (words, exit.code)
print(len({modules!r}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(len(modules))


def test_a_serving_install_names_the_extra_a_command_needs():
    """Where torch (the export extra) or httpx (the bench extra) is not installed, a command that
    needs it exits 2 naming the extra to install, its --help included, with no traceback."""
    script = """
import sys
missing = sys.argv[1]
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == missing:
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
sys.meta_path.insert(0, Missing())
from attnserve.cli import main
sys.exit(main(sys.argv[2:]))
"""
    for missing, words, extra in (("torch", ["variants"], "export"), ("torch", ["bench", "quality", "--help"], "export"),
                                  ("torch", ["adapt", "variant", "--help"], "export"), ("httpx", ["bench", "load"], "bench")):
        done = subprocess.run([sys.executable, "-c", script, missing, *words], capture_output=True, text=True, timeout=120)
        said = done.stderr
        assert done.returncode == 2 and "Traceback" not in said, (words, said[-2000:])
        assert f"attnserve {' '.join(w for w in words if w != '--help')}: needs {missing}" in said and f"attnserve[{extra}]" in said, said


def test_every_module_imports_first_in_a_fresh_process():
    """Import order cannot matter: each module of both packages, imported before anything else
    of attnserve, loads (a cycle such as registry <-> variants shows up only this way). Each
    import runs in a child forked from one process that has loaded the third-party libraries
    (torch alone takes seconds to import) and nothing of attnserve."""
    modules = sorted(module_name(p) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")
    script = """
import importlib, os, sys, traceback
for library in ("numpy", "torch", "onnx", "onnxscript", "onnxruntime", "fastapi", "pydantic", "pydantic_settings",
                "tokenizers", "safetensors", "uvicorn", "prometheus_client", "PIL", "tqdm", "filelock"):
    importlib.import_module(library)
assert not [m for m in sys.modules if m.startswith("attnserve")], "the parent must import nothing of attnserve"
failed = []
for name in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        said = f.read()
    if os.waitpid(pid, 0)[1]:
        failed.append(name + ": " + said)
print("\\n".join(failed))
"""
    result = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "", result.stdout
