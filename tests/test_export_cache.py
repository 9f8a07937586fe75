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

    def export_model(recipe, out_dir, **kwargs):
        calls.append(recipe)
        threading.Event().wait(0.3)  # long enough for a second caller to arrive meanwhile
        (Path(out_dir) / "manifest.json").write_text(json.dumps({"variant": recipe.variant}))
        return Path(out_dir)

    monkeypatch.setattr(export, "export_model", export_model)
    return calls


def cached(root, variant, params, max_length, **options):
    from attnserve.export.exporter import cached_export
    from attnserve.export.recipe import Recipe

    return cached_export(root, Recipe.resolve(variant, params, max_length, **options), log=None)


def test_one_export_per_recipe_however_many_ask_at_once(tmp_path, fake_exports):
    got = []
    threads = [threading.Thread(target=lambda: got.append(cached(tmp_path, "local", {}, 512)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 3 and len(set(got)) == 1 and len(fake_exports) == 1
    # Spelled-out defaults are the same recipe; another parameter, length or graph set is not.
    assert cached(tmp_path, "local", {"window": 512}, 512) == got[0]
    others = {cached(tmp_path, "local", {"window": 256}, 512),
              cached(tmp_path, "local", {}, 1024),
              cached(tmp_path, "local", {}, 512, analysis=False)}
    assert got[0] not in others and len(others) == 3 and len(fake_exports) == 4
    # No scratch folder is left behind: only the exports and their lock files.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(p.name for p in {got[0], *others})


def test_the_cache_folder_is_where_serve_looks(tmp_path, fake_exports):
    """`attnserve serve --models-dir ROOT` serves a cached export without exporting again."""
    from attnserve.service.exports import export_path
    from attnserve.service.settings import Settings

    made = cached(tmp_path, "bigbird", {"block": 32}, 512)
    assert export_path(Settings(variant="bigbird", params={"block": "32"}, max_length=512, models_dir=tmp_path)) == made


def test_a_foreign_folder_in_the_way_is_refused_and_kept(tmp_path, fake_exports):
    from attnserve.export.graphs import ExportFailed
    from attnserve.export.recipe import Recipe

    target = tmp_path / Recipe.resolve("local", {}, 512).name()
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ExportFailed, match="not an export and not empty"):
        cached(tmp_path, "local", {}, 512)
    assert (target / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [target.name]


def test_the_code_digest_follows_the_code_not_the_words_about_it():
    """code_sha256 reads every models/ and export/ source through code_tokens: a comment, a blank
    line or a docstring edited makes no new export; any change to the code does."""
    from attnserve.contract.export_format import code_tokens

    source = b'"""A module."""\nimport torch  # the one import\n\n\ndef band(x, half):\n    """Doc."""\n    return x[..., :half]\n'
    reworded = (b'"""The module, said again\nover two lines."""\nimport torch\n\ndef band(x, half):\n'
                b'    """Other words."""\n    # a comment of its own\n    return x[..., :half]  # and one here\n')
    assert code_tokens(reworded) == code_tokens(source)
    # A statement that is a lone string computes nothing, wherever it stands.
    assert code_tokens(source.replace(b"    return", b'    "a note"\n    return')) == code_tokens(source)
    for changed in (source.replace(b":half", b":half + 1"), source.replace(b"import torch", b"import numpy"),
                    source.replace(b"return x", b'return "x"')):
        assert code_tokens(changed) != code_tokens(source), changed
    # Source that does not tokenize is hashed as it is.
    assert code_tokens(b"def f(:\n  (") == b"def f(:\n  ("
