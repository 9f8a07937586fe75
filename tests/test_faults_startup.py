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
