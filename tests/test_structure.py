"""The import boundary between exporting and serving.

attnserve.models (torch: the encoder, its variants, export) and attnserve.service (numpy and
ONNX Runtime: serving) meet in one torch-free package, the contract (service/contract/: what an
export holds and how its outputs become vectors). Nothing under models/ imports service/ but
that contract; nothing under service/ imports models/ at all, so a serving install never needs
torch; and the contract imports nothing else of either side. The imports are read from the source (every
import statement, inside functions too), not from what a run happens to load.
"""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = "attnserve.service.contract"
ALLOWED = {"numpy", "pydantic"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
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
    for path in sorted((ROOT / source).rglob("*.py")):
        for name in sorted(imports(path)):
            if (name == target or name.startswith(target + ".")) and name not in allowed and not any(
                    name.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_models_import_service_only_through_the_contract():
    assert (ROOT / "service" / "contract" / "export_format.py").exists()
    assert crossings("models", "attnserve.service", {CONTRACT}) == []


def test_service_never_imports_models():
    assert crossings("service", "attnserve.models", set()) == []


def test_the_contract_imports_only_itself_numpy_pydantic_and_the_standard_library():
    outside = []
    for path in sorted((ROOT / "service" / "contract").rglob("*.py")):
        for name in sorted(imports(path)):
            top = name.split(".")[0]
            if name.startswith(CONTRACT) or top in ALLOWED or top in sys.stdlib_module_names:
                continue
            outside.append(f"{path.relative_to(ROOT)} imports {name}")
    assert outside == []


def test_the_reader_resolves_relative_imports(tmp_path):
    probe = ROOT / "service" / "routes" / "__init__.py"
    assert "attnserve.service.routes" == module_name(probe)
    names = imports(probe)
    assert all(not n.startswith(".") for n in names)


def test_every_serving_module_imports_with_torch_blocked():
    """Each module under service/, imported in a process where torch and attnserve.models
    cannot be imported at all, as in the torch-free serving image."""
    modules = sorted(module_name(p) for p in (ROOT / "service").rglob("*.py") if p.name != "__main__.py")
    script = f"""
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch" or name.startswith("attnserve.models"):
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
    modules = sorted(module_name(p) for d in ("models", "service") for p in (ROOT / d).rglob("*.py")
                     if p.name != "__main__.py")
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
