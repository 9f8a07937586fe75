"""Startup and configuration faults: what `attnserve serve` refuses before it serves, and what
it must never do (delete files it did not write, turn auth off, serve a corrupt export).

The CLI checks run `python -m attnserve serve` as a subprocess (bounded by a timeout) and read
its exit status and stderr, as a user's shell would.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_serve(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m attnserve serve ARGS` to completion (it must exit on its own), with output."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "attnserve", "serve", "--port", "0", *args], cwd=cwd or ROOT, env=environ,
                          capture_output=True, text=True, timeout=timeout)


# -- the export directory: never delete what the program did not write ---------------------------

def test_serve_refuses_a_foreign_folder_and_keeps_its_files(tmp_path):
    folder = tmp_path / "tmp"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    result = run_serve("--export-dir", "tmp", "--max-length", "512", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "tmp: not empty and has no manifest.json" in result.stderr
    assert "move the files out" in result.stderr
    assert "no export at" not in result.stderr  # refused before exporting anything
    assert (folder / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # no scratch directory left either
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_serve_refuses_a_file_as_export_dir(tmp_path):
    path = tmp_path / "export"
    path.write_text("not a directory")
    result = run_serve("--export-dir", str(path), "--max-length", "512")
    assert result.returncode == 2 and f"{path}: not a directory" in result.stderr
    assert path.read_text() == "not a directory"


# The fakes stand in for run_export, the exporter child process of ensure_export (minutes of
# torch); the recipe still comes from the real exporter (`--print-recipe`).

def _fake_export(calls: list):
    """run_export's part in ensure_export: write a finished export's manifest into out_dir."""

    def run_export(settings, out_dir):
        calls.append(Path(out_dir))
        Path(out_dir, "manifest.json").write_text(json.dumps({"variant": settings.variant, "max_length": settings.max_length}))

    return run_export


def test_ensure_export_fills_an_empty_or_missing_folder_and_refuses_others(tmp_path, monkeypatch):
    from attnserve.service import exports
    from attnserve.service.exports import ensure_export
    from attnserve.contract.export_format import ExportError
    from attnserve.service.settings import Settings

    calls: list[Path] = []
    monkeypatch.setattr(exports, "run_export", _fake_export(calls))
    for name, make in (("missing", lambda p: None), ("empty", lambda p: p.mkdir())):
        target = tmp_path / name
        make(target)
        assert ensure_export(Settings(export_dir=target, max_length=512)) == target
        assert json.loads((target / "manifest.json").read_text())["max_length"] == 512
        assert calls[-1].parent == tmp_path and calls[-1] != target  # written beside it, then renamed
    # A foreign folder under models_dir (where the export's name points) is refused the same way.
    settings = Settings(models_dir=tmp_path / "models", max_length=512)
    from attnserve.service.exports import export_path

    foreign = export_path(settings)
    foreign.mkdir(parents=True)
    (foreign / "keep.bin").write_bytes(b"\0" * 10)
    exported = len(calls)
    with pytest.raises(ExportError, match="not empty and has no manifest.json"):
        ensure_export(settings)
    assert len(calls) == exported and (foreign / "keep.bin").read_bytes() == b"\0" * 10
    assert sorted(p.name for p in foreign.parent.iterdir()) == [foreign.name]  # no scratch left


def test_an_export_folder_that_is_a_mount_point_is_refused_by_name(tmp_path, monkeypatch):
    """The export is written beside its folder and renamed into place: where the folder above it
    cannot be written (a read-only root file system, with a volume mounted at the export folder
    itself), `attnserve prepare` and `serve` say so, naming it, instead of a traceback."""
    import errno
    import tempfile

    from attnserve.contract.export_format import ExportError
    from attnserve.service import exports
    from attnserve.service.settings import Settings

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    calls: list[Path] = []
    monkeypatch.setattr(exports, "run_export", _fake_export(calls))
    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    target = tmp_path / "mounted"
    target.mkdir()
    with pytest.raises(ExportError, match=f"{tmp_path}: cannot write there \\(Read-only file system\\).*a volume holds the export as a subfolder"):
        exports.ensure_export(Settings(export_dir=target, max_length=512))
    assert calls == [] and list(target.iterdir()) == []


def _recipe_export(calls: list):
    """run_export's part in ensure_export, writing a manifest with the recipe the real export
    records (settings_recipe's) and no graph files."""
    from attnserve.service import exports
    from attnserve.contract.export_format import EMBEDDING_OUTPUTS, FORMAT, Manifest, write_manifest

    def run_export(settings, out_dir):
        calls.append((settings.variant, dict(settings.params)))
        write_manifest(out_dir, Manifest(
            format=FORMAT, variant=settings.variant, max_length=settings.max_length, length_multiple=1, hidden_size=384,
            num_layers=6, num_heads=12, graphs={"embedding": {"file": "model.onnx", "outputs": EMBEDDING_OUTPUTS}}, files={},
            recipe=exports.settings_recipe(settings), created=f"2026-12-01T00:00:0{len(calls)}Z"))

    return run_export


def test_export_cache_keys_on_the_recipe(tmp_path, monkeypatch, caplog):
    from attnserve.service import exports
    from attnserve.service.exports import ExportMissing, ensure_export
    from attnserve.service.settings import Settings

    calls: list = []
    monkeypatch.setattr(exports, "run_export", _recipe_export(calls))
    models_dir = tmp_path / "models"
    default = ensure_export(Settings(models_dir=models_dir, max_length=512))
    # The default spelled out is the same export: nothing exported again.
    assert ensure_export(Settings(models_dir=models_dir, max_length=512, params={"window": "512"})) == default
    assert len(calls) == 1
    other = ensure_export(Settings(models_dir=models_dir, max_length=512, params={"window": "256"}))
    assert other != default and len(calls) == 2
    # An upgrade (other code) exports anew, and says why the cached one does not fit.
    real_recipe = exports.settings_recipe
    monkeypatch.setattr(exports, "settings_recipe", lambda settings: {**real_recipe(settings), "code_sha256": "0" * 64})
    monkeypatch.setattr(exports, "code_sha256", lambda: "0" * 64)
    with caplog.at_level("WARNING", logger="attnserve"):
        upgraded = ensure_export(Settings(models_dir=models_dir, max_length=512))
    assert upgraded not in (default, other) and len(calls) == 3
    assert "code_sha256 (attnserve's code changed)" in caplog.text

    # Without torch the export is found by its manifest: code, variant, max_length, the
    # parameters the settings name.
    def no_torch(settings):
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(exports, "settings_recipe", no_torch)
    # A newer export still under way, in its scratch folder (".<name>-..."), is not finished: not served.
    scratch = models_dir / f".{upgraded.name}-x1y2z3"
    shutil.copytree(upgraded, scratch)
    newer = json.loads((scratch / "manifest.json").read_text())
    (scratch / "manifest.json").write_text(json.dumps({**newer, "created": "2026-12-02T00:00:00Z"}))
    assert ensure_export(Settings(models_dir=models_dir, max_length=512)) == upgraded
    shutil.rmtree(scratch)
    monkeypatch.undo()
    monkeypatch.setattr(exports, "settings_recipe", no_torch)
    assert ensure_export(Settings(models_dir=models_dir, max_length=512, params={"window": "256"})) == other
    with pytest.raises(ExportMissing, match="--export-dir DIR"):
        ensure_export(Settings(models_dir=models_dir, max_length=512, params={"window": "128"}))
    assert len(calls) == 3


def test_ensure_export_never_replaces_a_folder_filled_while_it_exported(tmp_path, monkeypatch):
    from attnserve.service import exports
    from attnserve.service.exports import ensure_export
    from attnserve.contract.export_format import ExportError
    from attnserve.service.settings import Settings

    target = tmp_path / "export"
    plain = _fake_export([])

    def someone_writes_meanwhile(settings, out_dir):
        plain(settings, out_dir)
        target.mkdir(exist_ok=True)
        (target / "theirs.txt").write_text("theirs")

    monkeypatch.setattr(exports, "run_export", someone_writes_meanwhile)
    with pytest.raises(ExportError, match="cannot move the finished export there"):
        ensure_export(Settings(export_dir=target, max_length=512))
    assert (target / "theirs.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # our scratch removed, nothing else
    # Another server finishing the same export first is served as it is.
    shutil.rmtree(target)

    def another_server_finishes_first(settings, out_dir):
        plain(settings, out_dir)
        target.mkdir()
        (target / "manifest.json").write_text(json.dumps({"variant": "theirs"}))

    monkeypatch.setattr(exports, "run_export", another_server_finishes_first)
    assert ensure_export(Settings(export_dir=target, max_length=512)) == target
    assert json.loads((target / "manifest.json").read_text()) == {"variant": "theirs"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


# -- auth: a key that cannot silently turn off ----------------------------------------------------

KEY = "k3y-from-a-file"


def test_blank_api_key_is_a_settings_error(monkeypatch):
    from pydantic import ValidationError

    from attnserve.service.settings import Settings

    for blank in ("", "   ", "\t\n"):
        with pytest.raises(ValidationError, match="api_key is empty or blank"):
            Settings(api_key=blank)
        monkeypatch.setenv("ATTNSERVE_API_KEY", blank)
        with pytest.raises(ValidationError, match="api_key is empty or blank"):
            Settings()
    monkeypatch.delenv("ATTNSERVE_API_KEY")
    assert Settings().api_key is None  # unset: auth off, as documented
    assert Settings(api_key="  s3cret\n").api_key.get_secret_value() == "s3cret"


def test_api_key_file(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from attnserve.service.settings import Settings

    path = tmp_path / "key"
    path.write_text(f"\n  {KEY}  \n")
    assert Settings(api_key_file=path).api_key.get_secret_value() == KEY
    monkeypatch.setenv("ATTNSERVE_API_KEY_FILE", str(path))
    assert Settings().api_key.get_secret_value() == KEY
    monkeypatch.delenv("ATTNSERVE_API_KEY_FILE")
    path.write_text(" \n")
    with pytest.raises(ValidationError, match=f"api_key_file {path}: empty"):
        Settings(api_key_file=path)
    with pytest.raises(ValidationError, match=f"api_key_file {tmp_path / 'nope'}: cannot read it"):
        Settings(api_key_file=tmp_path / "nope")
    path.write_text(KEY)
    with pytest.raises(ValidationError, match="api_key and api_key_file are both set"):
        Settings(api_key="other", api_key_file=path)


def test_serve_refuses_a_blank_or_doubled_key_without_printing_it(tmp_path):
    for args, env, expected in [
        ((), {"ATTNSERVE_API_KEY": ""}, "api_key is empty or blank"),
        (("--api-key", "  "), {}, "api_key is empty or blank"),
        (("--api-key-file", str(tmp_path / "empty")), {}, "empty; write the key into it"),
        (("--api-key", "s3cret-on-the-command-line", "--api-key-file", str(tmp_path / "key")), {}, "api_key and api_key_file are both set"),
    ]:
        (tmp_path / "empty").write_text("")
        (tmp_path / "key").write_text(KEY)
        result = run_serve("--export-dir", str(tmp_path / "unused"), *args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert "invalid settings" in result.stderr and expected in result.stderr, result.stderr
        assert "s3cret-on-the-command-line" not in result.stderr and KEY not in result.stderr
        assert not (tmp_path / "unused").exists()  # refused before looking for an export


def _auth_client(api_key):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from attnserve.service.middleware import BearerAuthMiddleware

    async def ok(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/health", ok), Route("/embed", ok, methods=["GET", "POST"])])
    app.add_middleware(BearerAuthMiddleware, api_key=api_key)
    return TestClient(app)


def test_bearer_scheme_is_case_insensitive_and_the_key_exact(caplog):
    with caplog.at_level("INFO", logger="attnserve"), _auth_client(KEY) as client:
        for header in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", f"bEaReR {KEY}", f"Bearer    {KEY}"):
            assert client.get("/embed", headers={"authorization": header}).status_code == 200, header
        for header in (KEY, f"Bearer{KEY}", f"Basic {KEY}", "Bearer", "Bearer ", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}",
                       f"Bearer {KEY.upper()}", f"Token {KEY}", ""):
            r = client.get("/embed", headers={"authorization": header})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", header
            assert "wrong API key" in r.json()["error"]
        r = client.get("/embed")
        assert r.status_code == 401 and "missing API key" in r.json()["error"]
        assert client.get("/health").status_code == 200
    on = [r for r in caplog.records if "API key auth is on" in r.getMessage()]
    assert len(on) == 1 and on[0].levelname == "INFO"
    assert KEY not in caplog.text


def test_no_key_serves_without_auth_and_a_blank_one_is_refused(caplog):
    with caplog.at_level("INFO", logger="attnserve"), _auth_client(None) as client:
        assert client.get("/embed").status_code == 200
    assert "API key auth is on" not in caplog.text
    for blank in ("", "  "):
        with pytest.raises(ValueError, match="empty or blank"), _auth_client(blank) as client:
            client.get("/embed")


def test_fake_server_with_api_key_file(tmp_path):
    import httpx
    from http_server import start_fake_server

    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    proc = start_fake_server("--api-key-file", str(path))
    try:
        assert KEY not in Path(f"/proc/{proc.proc.pid}/cmdline").read_bytes().decode(errors="replace")
        assert httpx.get(proc.url + "/health", timeout=30).status_code == 200
        assert httpx.post(proc.url + "/embed", json={"inputs": "x"}, timeout=30).status_code == 401
        r = httpx.post(proc.url + "/embed", json={"inputs": "x"}, headers={"authorization": f"bearer {KEY}"}, timeout=30)
        assert r.status_code == 200 and len(r.json()[0]) == 384
        r = httpx.post(proc.url + "/v1/embeddings", json={"input": "x", "model": "m"}, headers={"authorization": "Bearer wrong"}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    finally:
        proc.stop()


# -- a damaged export is refused at startup, by file name -----------------------------------------

# The end-to-end tests' longformer export (max_length 1024: conftest's export_dir, from the suite's
# export cache), so that these tests never export.


def damaged_copy(export_dir: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the export in which `name` is a real file to damage and every other file a
    symlink to the cached one (the export is 277 MB)."""
    copy = tmp_path / "export"
    copy.mkdir()
    for path in export_dir.iterdir():
        if path.name in (name, "manifest.json"):
            shutil.copyfile(path, copy / path.name)
        else:
            (copy / path.name).symlink_to(path)
    return copy


def rewrite_manifest_to_match(copy: Path, name: str) -> None:
    """What someone editing both a file and the manifest would leave: the record matches."""
    from attnserve.contract.export_format import sha256

    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": sha256(copy / name), "bytes": (copy / name).stat().st_size}
    (copy / "manifest.json").write_text(json.dumps(manifest))


def test_truncated_analysis_graph_is_refused_at_startup(export_dir, tmp_path):
    from attnserve.service.runtime import ExportError, OnnxRunner

    copy = damaged_copy(export_dir, tmp_path, "analysis.onnx")
    size = (copy / "analysis.onnx").stat().st_size
    with open(copy / "analysis.onnx", "r+b") as f:
        f.truncate(size // 2)
    expected = f"{copy / 'analysis.onnx'}: {size // 2} bytes, manifest.json says {size} (file changed or truncated)"
    with pytest.raises(ExportError) as caught:
        OnnxRunner(copy)
    assert expected in str(caught.value) and f"delete {copy}" in str(caught.value)
    result = run_serve("--export-dir", str(copy), "--max-length", "1024")
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    # The same size with other bytes is caught by its sha256.
    with open(copy / "analysis.onnx", "r+b") as f:
        f.truncate(size)
    with pytest.raises(ExportError, match=r"analysis\.onnx: sha256 .* does not match manifest\.json"):
        OnnxRunner(copy)


def test_corrupt_tokenizer_is_refused_at_startup_by_name(export_dir, tmp_path):
    from attnserve.service.runtime import ExportError, OnnxRunner
    from attnserve.service.tokenizer import TextTokenizer

    copy = damaged_copy(export_dir, tmp_path, "tokenizer.json")
    tokenizer = copy / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:1000])
    with pytest.raises(ExportError, match=r"tokenizer\.json: 1000 bytes, manifest\.json says"):
        OnnxRunner(copy)
    result = run_serve("--export-dir", str(copy), "--max-length", "1024")
    assert result.returncode == 2 and f"{tokenizer}: 1000 bytes" in result.stderr, result.stderr
    # With a manifest that matches it, the tokenizer itself refuses it, naming the file.
    rewrite_manifest_to_match(copy, "tokenizer.json")
    with pytest.raises(ExportError, match=rf"{tokenizer}: not a tokenizer the tokenizers library can load"):
        TextTokenizer(tokenizer, 1024)
    result = run_serve("--export-dir", str(copy), "--max-length", "1024", "--providers", "CPUExecutionProvider")
    assert result.returncode == 2, result.stderr
    assert f"{tokenizer}: not a tokenizer the tokenizers library can load" in result.stderr
    assert "Traceback" not in result.stderr


# -- truncate: a long text is tokenized only as far as it must be ---------------------------------

def _tokenizers(max_length: int):
    """(the server's tokenizer, one that always tokenizes whole texts: the reference)."""
    from http_fakes import tokenizer_json

    from attnserve.service.tokenizer import TextTokenizer

    fast, whole = TextTokenizer(tokenizer_json(), max_length), TextTokenizer(tokenizer_json(), max_length)
    assert fast.prefix_chars > 0  # the shipped tokenizer is the BERT pipeline the prefix is exact for
    whole.prefix_chars = 0
    return fast, whole


# Pieces where a cut could go wrong: words longer than WordPiece's 100-character limit (one
# [UNK] whole, pieces when cut), runs of spaces and other whitespace, accents and combining
# marks (stripped by normalisation), CJK (split per character), emoji, right-to-left script,
# control and zero-width characters (removed), special tokens written in the text, punctuation.
_PIECES = ["the", "quick", "brown", "fox", "naïve", "café", "e\u0301te\u0301", "東京都", "한국어", "مرحبا", "😀👍🏽", "ﬁne",
           "[SEP]", "[MASK]", "hello,", "world!", "(x)", "¿qué?", "\x00", "\u200b", "\ufffd", "a-b_c", "12,345.67"]


def _text(rng, size: int) -> str:
    parts, length = [], 0
    while length < size:
        r = rng.random()
        if r < 0.04:
            part = rng.choice("xé東") * rng.randint(90, 400)
        elif r < 0.08:
            part = " " * rng.randint(2, 300)
        elif r < 0.1:
            part = rng.choice(["\n", "\t", "\r\n", "\u3000", "\xa0"])
        else:
            part = rng.choice(_PIECES)
        part += rng.choice([" ", " ", " ", "\n", "  ", ""])
        parts.append(part)
        length += len(part)
    return "".join(parts)


def _same(a, b) -> bool:
    return (a.ids, a.tokens, a.offsets, a.special) == (b.ids, b.tokens, b.offsets, b.special)


@pytest.mark.parametrize("max_length", [16, 128, 512])
def test_truncating_a_prefix_equals_truncating_the_whole_text(max_length):
    import random

    fast, whole = _tokenizers(max_length)
    rng = random.Random(max_length)
    texts = [_text(rng, rng.choice([1, 2, 4, 16, 64]) * fast.prefix_chars) for _ in range(60)]
    # Whitespace only early, none at all, and whitespace-heavy texts that need the prefix grown.
    texts += ["word " * 3 + "x" * fast.prefix_chars * 5, "y" * fast.prefix_chars * 3, ("a" + " " * 30) * fast.prefix_chars,
              " " * fast.prefix_chars * 2 + "late words " * max_length]
    for add_special_tokens in (True, False):
        got = fast.encode(texts, truncate=True, add_special_tokens=add_special_tokens)
        expected = whole.encode(texts, truncate=True, add_special_tokens=add_special_tokens)
        for index, (a, b) in enumerate(zip(got, expected)):
            assert _same(a, b), (max_length, add_special_tokens, index)
            # original_length: exact when the whole text was tokenized, else a lower bound that
            # still says the text was cut.
            assert a.original_length <= b.original_length and a.truncated == b.truncated


def test_a_long_text_is_tokenized_only_in_part():
    fast, whole = _tokenizers(512)
    seen: list[int] = []
    inner = fast._tokenizer

    class Recording:
        def __getattr__(self, name):
            return getattr(inner, name)

        def encode(self, text, **kw):
            seen.append(len(text))
            return inner.encode(text, **kw)

        def encode_batch(self, texts, **kw):
            seen.extend(len(t) for t in texts)
            return inner.encode_batch(texts, **kw)

    fast._tokenizer = Recording()
    text = "a long document about nothing in particular. " * 200_000  # 9 MB
    (cut,) = fast.encode([text], truncate=True)
    assert max(seen) <= fast.prefix_chars < len(text) // 1000
    (reference,) = whole.encode([text[: 100 * fast.prefix_chars]], truncate=True)
    assert _same(cut, reference) and len(cut) == 512 and cut.truncated
    # Without truncate it is refused from the prefix alone, with a length the text has at least.
    from attnserve.service.tokenizer import InputTooLong

    seen.clear()
    with pytest.raises(InputTooLong, match=r"input 1 is more than \d+ tokens long") as caught:
        fast.encode(["fits", text], truncate=False)
    assert 512 < caught.value.length and caught.value.index == 1 and max(seen) <= fast.prefix_chars
    # A text longer than the first prefix that still fits is tokenized whole and served whole.
    spaced = "word" + " " * (fast.prefix_chars * 3) + "end"
    (ok,) = fast.encode([spaced], truncate=False)
    assert ok.tokens == ["[CLS]", "word", "end", "[SEP]"] and not ok.truncated


# -- the command line: defaults shown, a busy port and an unknown variant refused up front ---------

def test_serve_help_shows_every_default_and_env_variable():
    from attnserve.service.settings import Settings

    result = subprocess.run([sys.executable, "-m", "attnserve", "serve", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    # Each option's entry, from its flag to the next flag, joined onto one line.
    entries = re.split(r"\n  (?=--)", result.stdout.split("options:", 1)[1])
    lines = {entry.split()[0]: " ".join(entry.split()) for entry in entries if entry.startswith("--")}
    for name, field in Settings.model_fields.items():
        flag = "--param" if name == "params" else "--" + name.replace("_", "-")
        assert f"env ATTNSERVE_{name.upper()})" in lines[flag] and "(default: " in lines[flag], lines[flag]
    for flag, default in (("--variant", "longformer"), ("--host", "127.0.0.1"), ("--port", "8080"), ("--max-length", "16384"),
                          ("--models-dir", "~/.cache/attnserve"), ("--pooling", "opening")):
        assert f"(default: {default};" in lines[flag]
    # What a model decides is named as it comes to be.
    assert "ModernBERT: native" in lines["--variant"] and "max_seq_length" in lines["--opening-tokens"]


def test_serve_refuses_a_busy_port_with_a_hint(tmp_path):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_serve("--port", str(port), "--models-dir", str(tmp_path), timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port N" in result.stderr
    assert "Errno" not in result.stderr and not any(tmp_path.iterdir())  # nothing exported first


def test_serve_refuses_an_unknown_variant_before_exporting(tmp_path):
    result = run_serve("--variant", "longformerr", "--models-dir", str(tmp_path), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "longformerr" in result.stderr and "longformer" in result.stderr.replace("longformerr", "")
    assert "exporting" not in result.stderr and not any(tmp_path.iterdir())
