"""attnserve.export.exporter.cached_export: the exporter's cache behind `bench runtime
--exports-dir` and the test suite's shared exports (tests/export_helpers.py)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest


@pytest.fixture
def fake_exports(monkeypatch):
    """export_model replaced by one that writes a manifest only, slowly, and counts its calls."""
    from attnserve.export import exporter as export

    calls = []

    def export_model(variant, params, max_length, out_dir, **kwargs):
        calls.append((variant, dict(params), max_length, kwargs["analysis"]))
        threading.Event().wait(0.3)  # long enough for a second caller to arrive meanwhile
        (Path(out_dir) / "manifest.json").write_text(json.dumps({"variant": variant}))
        return Path(out_dir)

    monkeypatch.setattr(export, "export_model", export_model)
    return calls


def test_one_export_per_recipe_however_many_ask_at_once(tmp_path, fake_exports):
    from attnserve.export.exporter import cached_export

    got = []
    threads = [threading.Thread(target=lambda: got.append(cached_export(tmp_path, "local", {}, 512, log=None)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 3 and len(set(got)) == 1 and len(fake_exports) == 1
    # Spelled-out defaults are the same recipe; another parameter, length or graph set is not.
    assert cached_export(tmp_path, "local", {"window": 512}, 512, log=None) == got[0]
    others = {cached_export(tmp_path, "local", {"window": 256}, 512, log=None),
              cached_export(tmp_path, "local", {}, 1024, log=None),
              cached_export(tmp_path, "local", {}, 512, analysis=False, log=None)}
    assert got[0] not in others and len(others) == 3 and len(fake_exports) == 4
    # No scratch folder is left behind: only the exports and their lock files.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(p.name for p in {got[0], *others})


def test_the_cache_folder_is_where_serve_looks(tmp_path, fake_exports):
    """`attnserve serve --models-dir ROOT` serves a cached export without exporting again."""
    from attnserve.export.exporter import cached_export
    from attnserve.service.exports import export_path
    from attnserve.service.settings import Settings

    made = cached_export(tmp_path, "bigbird", {"block": 32}, 512, log=None)
    assert export_path(Settings(variant="bigbird", params={"block": "32"}, max_length=512, models_dir=tmp_path)) == made


def test_a_foreign_folder_in_the_way_is_refused_and_kept(tmp_path, fake_exports):
    from attnserve.export.exporter import ExportFailed, cached_export, export_recipe, export_name
    from attnserve.models.registry import make_config

    target = tmp_path / export_name(export_recipe(make_config("local", 512), 512))
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ExportFailed, match="not an export and not empty"):
        cached_export(tmp_path, "local", {}, 512, log=None)
    assert (target / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [target.name]
