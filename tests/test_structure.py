"""The layout and the import boundary between exporting and serving.

Every module's import path is its file's path under src/ (attnserve.export.graphs is
src/attnserve/export/graphs.py). The torch side (attnserve.models: the encoder and its variants;
attnserve.export: ONNX export; attnserve.train: adaptation) and attnserve.service (numpy and ONNX
Runtime: serving) meet in one torch-free package, attnserve.contract (what an export holds and how
its outputs become vectors). Nothing on the torch side imports the service; nothing in the service
imports the torch side, so a serving install never needs torch; and the contract imports nothing
else of either. The imports are read from the source (every import statement, inside functions
too), not from what a run happens to load.
"""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attnserve"
CONTRACT = "attnserve.contract"
TORCH_SIDE = ("models", "export", "train")
PACKAGES = ("contract", *TORCH_SIDE, "service")
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
    for path in sorted((PACKAGE / source).rglob("*.py")):
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
    assert not (ROOT / "models").exists() and not (ROOT / "service").exists()


def test_the_torch_side_never_imports_the_service():
    assert (PACKAGE / "contract" / "export_format.py").exists()
    assert [c for side in TORCH_SIDE for c in crossings(side, "attnserve.service", set())] == []


def test_the_service_never_imports_the_torch_side():
    assert [c for side in TORCH_SIDE for c in crossings("service", f"attnserve.{side}", set())] == []


def test_models_never_import_training():
    """Training builds on the encoder and its export, never the other way round."""
    assert crossings("models", "attnserve.train", set()) == [] and crossings("export", "attnserve.train", set()) == []


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
    for path in sorted((PACKAGE / "contract").rglob("*.py")):
        for name in sorted(imports(path)):
            top = name.split(".")[0]
            if name.startswith(CONTRACT) or top in ALLOWED or top in sys.stdlib_module_names:
                continue
            outside.append(f"{path.relative_to(ROOT)} imports {name}")
    assert outside == []


def test_the_reader_resolves_relative_imports(tmp_path):
    probe = PACKAGE / "service" / "routes" / "__init__.py"
    assert "attnserve.service.routes" == module_name(probe)
    names = imports(probe)
    assert all(not n.startswith(".") for n in names)


def test_every_serving_module_imports_with_torch_blocked():
    """Each module of the service and the contract, imported in a process where torch and the
    torch side cannot be imported at all, as in the torch-free serving image."""
    modules = sorted(module_name(p) for d in ("service", "contract") for p in (PACKAGE / d).rglob("*.py")
                     if p.name != "__main__.py")
    script = f"""
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch" or name.startswith(("attnserve.models", "attnserve.export", "attnserve.train")):
            raise ImportError(name + " is blocked: serving must not need it")
sys.meta_path.insert(0, Block())
for name in {modules!r}:
    importlib.import_module(name)
print(len({modules!r}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(len(modules))


def test_every_module_imports_first_in_a_fresh_process():
    """Import order cannot matter: each module of both packages, imported before anything else
    of attnserve, loads (a cycle such as registry <-> variants shows up only this way). Each
    import runs in a child forked from one process that has loaded the third-party libraries
    (torch alone takes seconds to import) and nothing of attnserve."""
    modules = sorted(module_name(p) for d in PACKAGES for p in (PACKAGE / d).rglob("*.py") if p.name != "__main__.py")
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
