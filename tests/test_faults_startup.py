"""Startup and configuration faults: what `attnserve serve` refuses before it serves, and what
it must never do (delete files it did not write, turn auth off, serve a corrupt export).

The CLI checks run `python -m service serve` as a subprocess (bounded by a timeout) and read
its exit status and stderr, as a user's shell would.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_serve(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m service serve ARGS` to completion (it must exit on its own), with output."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    environ.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "service", "serve", "--port", "0", *args], cwd=cwd or ROOT, env=environ,
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


def _fake_export(calls: list):
    """export_model's part in ensure_export: write a finished export's manifest into out_dir."""

    def export_model(variant, params, max_length, out_dir, weights=None):
        calls.append(Path(out_dir))
        Path(out_dir, "manifest.json").write_text(json.dumps({"variant": variant, "max_length": max_length}))

    return export_model


def test_ensure_export_fills_an_empty_or_missing_folder_and_refuses_others(tmp_path, monkeypatch):
    import models.export

    from service.exports import ensure_export
    from service.runtime import ExportError
    from service.settings import Settings

    calls: list[Path] = []
    monkeypatch.setattr(models.export, "export_model", _fake_export(calls))
    for name, make in (("missing", lambda p: None), ("empty", lambda p: p.mkdir())):
        target = tmp_path / name
        make(target)
        assert ensure_export(Settings(export_dir=target, max_length=512)) == target
        assert json.loads((target / "manifest.json").read_text())["max_length"] == 512
        assert calls[-1].parent == tmp_path and calls[-1] != target  # written beside it, then renamed
    # A foreign folder under models_dir (where the export's name points) is refused the same way.
    settings = Settings(models_dir=tmp_path / "models", max_length=512)
    from service.exports import export_path

    foreign = export_path(settings)
    foreign.mkdir(parents=True)
    (foreign / "keep.bin").write_bytes(b"\0" * 10)
    exported = len(calls)
    with pytest.raises(ExportError, match="not empty and has no manifest.json"):
        ensure_export(settings)
    assert len(calls) == exported and (foreign / "keep.bin").read_bytes() == b"\0" * 10
    assert sorted(p.name for p in foreign.parent.iterdir()) == [foreign.name]  # no scratch left


def test_ensure_export_never_replaces_a_folder_filled_while_it_exported(tmp_path, monkeypatch):
    import models.export

    from service.exports import ensure_export
    from service.runtime import ExportError
    from service.settings import Settings

    target = tmp_path / "export"
    plain = _fake_export([])

    def someone_writes_meanwhile(variant, params, max_length, out_dir, weights=None):
        plain(variant, params, max_length, out_dir, weights)
        target.mkdir(exist_ok=True)
        (target / "theirs.txt").write_text("theirs")

    monkeypatch.setattr(models.export, "export_model", someone_writes_meanwhile)
    with pytest.raises(ExportError, match="cannot move the finished export there"):
        ensure_export(Settings(export_dir=target, max_length=512))
    assert (target / "theirs.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # our scratch removed, nothing else
    # Another server finishing the same export first is served as it is.
    shutil.rmtree(target)

    def another_server_finishes_first(variant, params, max_length, out_dir, weights=None):
        plain(variant, params, max_length, out_dir, weights)
        target.mkdir()
        (target / "manifest.json").write_text(json.dumps({"variant": "theirs"}))

    monkeypatch.setattr(models.export, "export_model", another_server_finishes_first)
    assert ensure_export(Settings(export_dir=target, max_length=512)) == target
    assert json.loads((target / "manifest.json").read_text()) == {"variant": "theirs"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


# -- auth: a key that cannot silently turn off ----------------------------------------------------

KEY = "k3y-from-a-file"


def test_blank_api_key_is_a_settings_error(monkeypatch):
    from pydantic import ValidationError

    from service.settings import Settings

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

    from service.settings import Settings

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

    from service.middleware import BearerAuthMiddleware

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
