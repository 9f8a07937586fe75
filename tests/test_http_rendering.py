"""Attention rendering: top-k, grid pooling, windows, the annotated PNG; and settings <-> CLI flags."""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

from attnserve.service.rendering import attention_png, colorize, pool_grid, render_attention, top_k_per_row
from attnserve.service.settings import Settings, add_settings_arguments, settings_from_args


def dense_to_coo(a):
    rows, cols = np.nonzero(a)
    return rows, cols, a[rows, cols]


def test_top_k_per_row_keeps_largest():
    rng = np.random.default_rng(0)
    a = rng.random((7, 7)) * (rng.random((7, 7)) > 0.3)
    rows, cols, vals = top_k_per_row(*dense_to_coo(a), 2)
    for r in range(7):
        expected = np.sort(a[r][a[r] > 0])[::-1][:2]
        np.testing.assert_allclose(np.sort(vals[rows == r])[::-1], expected)


def test_pool_grid_matches_dense_pooling():
    rng = np.random.default_rng(1)
    n = 37
    a = rng.random((n, n))
    a /= a.sum(axis=1, keepdims=True)
    grid, cell = pool_grid(*dense_to_coo(a), n, 8)
    assert cell == 5 and grid.shape == (8, 8)
    np.testing.assert_allclose(grid.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(grid[0, 1], a[0:5, 5:10].sum() / 5, rtol=1e-5)
    small, cell = pool_grid(*dense_to_coo(a), n, 100)
    assert cell == 1 and small.shape == (n, n)


def image_of(data: bytes) -> np.ndarray:
    from PIL import Image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def dark(pixels: np.ndarray) -> int:
    """How many pixels are nearly black (text)."""
    return int((pixels.max(axis=-1) < 90).sum())


def test_png_has_the_map_token_labels_colour_bar_and_title():
    n = 12
    tokens = ["[CLS]"] + [f"w{i}" for i in range(n - 2)] + ["[SEP]"]
    grid = np.eye(n, dtype=np.float32) * 0.9 + 0.1 / n
    image = render_attention(grid, 1, tokens, (0, n), (0, n), "local, layer 3, head 1")
    left, top, right, bottom = image.info["map_box"]
    assert right - left == bottom - top == 512 // n * n
    pixels = np.asarray(image.convert("RGB"))
    side = (right - left) // n
    # Each cell is one colour, the map's own: the diagonal the brightest.
    np.testing.assert_array_equal(pixels[top + side // 2, left + side // 2], colorize(grid)[0, 0])
    np.testing.assert_array_equal(pixels[top + side // 2, left + side + side // 2], colorize(grid)[0, 1])
    assert dark(pixels[top:bottom, :left]) > 30 * n  # a query label beside each row
    assert dark(pixels[top - 40:top, left:right]) > 30 * n  # a key label above each column
    assert dark(pixels[:24, :]) > 100  # the title
    bl, bt, br, bb = image.info["bar_box"]
    bar = pixels[bt:bb, (bl + br) // 2]
    np.testing.assert_array_equal(bar[0], colorize(np.array([[1.0]]))[0, 0])  # the largest weight at the top
    np.testing.assert_array_equal(bar[-1], colorize(np.array([[1.0, 1e-5]]))[0, 1])  # 4 decades below at the bottom
    assert dark(pixels[bt:bb, br:]) > 100  # the scale's numbers


def test_png_of_a_long_map_labels_token_indices():
    n = 3000
    rows = np.arange(n).repeat(3)
    cols = np.clip(rows + np.tile([-1, 0, 1], n), 0, n - 1)
    grid, cell = pool_grid(rows, cols, np.full(len(rows), 1 / 3), n, 256)
    data = attention_png(grid, cell, ["x"] * n, (0, n), (0, n), "local, layer 0, mean over heads")
    pixels = image_of(data)
    image = render_attention(grid, cell, ["x"] * n, (0, n), (0, n), "local, layer 0, mean over heads")
    left, top, right, bottom = image.info["map_box"]
    assert pixels.shape[:2] == (image.height, image.width)
    assert dark(pixels[top:bottom, :left]) > 50  # token indices down the left
    assert right - left == grid.shape[1] * ((right - left) // grid.shape[1])  # whole pixels per cell


def test_every_setting_is_a_flag_and_an_env_var(monkeypatch):
    import argparse

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    flags = {a.dest for a in parser._actions}
    assert set(Settings.model_fields) <= flags
    monkeypatch.setenv("ATTNSERVE_PORT", "9001")
    monkeypatch.setenv("ATTNSERVE_VARIANT", "bigbird")
    monkeypatch.setenv("ATTNSERVE_PARAMS", '{"block": 32}')
    monkeypatch.setenv("ATTNSERVE_PROVIDERS", "CPUExecutionProvider")
    s = settings_from_args(parser.parse_args(["--port", "9002", "--param", "window=128", "--param", "mode=x", "--max-batch-tokens", "4096"]))
    assert s.port == 9002 and s.variant == "bigbird" and s.params == {"block": 32, "window": 128, "mode": "x"}  # flags add to ATTNSERVE_PARAMS
    assert s.max_batch_tokens == 4096 and s.providers == ["CPUExecutionProvider"] and s.model_name is None
    s = settings_from_args(parser.parse_args([]))
    assert s.port == 9001 and s.params == {"block": 32}
    with pytest.raises(ValueError):
        settings_from_args(parser.parse_args(["--port", "-5"]))


def test_cli_lists_serve_and_bench_service(capsys):
    from attnserve.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--max-batch-tokens" in out and "ATTNSERVE_API_KEY" in out
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "service" in capsys.readouterr().out


def test_pool_grid_of_a_window_matches_dense_pooling():
    rng = np.random.default_rng(2)
    n = 40
    a = rng.random((n, n))
    grid, cell = pool_grid(*dense_to_coo(a), n, 4, queries=(10, 18), keys=(0, 40))
    assert cell == 10 and grid.shape == (1, 4)
    np.testing.assert_allclose(grid[0, 2], a[10:18, 20:30].sum() / 8, rtol=1e-5)
    exact, cell = pool_grid(*dense_to_coo(a), n, 64, queries=(3, 5), keys=(7, 12))
    assert cell == 1
    np.testing.assert_allclose(exact, a[3:5, 7:12], rtol=1e-6)


@pytest.fixture(scope="module")
def fake_client():
    from fastapi.testclient import TestClient
    from http_fakes import FakeRunner, tokenizer_json

    from attnserve.service.app import create_app

    with TestClient(create_app(Settings(max_length=256), runner=FakeRunner(max_length=256), tokenizer_path=tokenizer_json())) as client:
        yield client


TEXT = "the quick brown fox jumps over the lazy dog " * 3


def test_windowed_attention_answers_only_the_window(fake_client):
    whole = fake_client.post("/attention", json={"inputs": TEXT, "layer": 1}).json()
    n = whole["n_tokens"]
    assert whole["query_range"] == [0, n] and whole["key_range"] == [0, n] and len(whole["offsets"]) == n
    start, stop = whole["offsets"][1]
    assert TEXT[start:stop] == whole["tokens"][1] == "the"
    body = {"inputs": TEXT, "layer": 1, "query_range": [4, 9], "key_range": [5, 12]}
    part = fake_client.post("/attention", json=body).json()
    assert part["query_range"] == [4, 9] and part["key_range"] == [5, 12]
    rows, cols, vals = (np.array(whole[k]) for k in ("rows", "cols", "values"))
    inside = (rows >= 4) & (rows < 9) & (cols >= 5) & (cols < 12)
    assert part["rows"] == rows[inside].tolist() and part["cols"] == cols[inside].tolist()
    np.testing.assert_allclose(part["values"], vals[inside])
    grid = fake_client.post("/attention", json={**body, "format": "grid"}).json()
    assert grid["cell_tokens"] == 1 and np.array(grid["grid"]).shape == (5, 7)
    dense = np.zeros((n, n))
    dense[rows, cols] = vals
    np.testing.assert_allclose(grid["grid"], dense[4:9, 5:12], rtol=1e-6)
    one_row = fake_client.post("/attention", json={"inputs": TEXT, "layer": 1, "query_range": [3, 4], "top_k": 2}).json()
    assert one_row["rows"] == [3, 3]


@pytest.mark.parametrize("window, param", [
    ({"query_range": [5, 5]}, "query_range"),
    ({"key_range": [9, 2]}, "key_range"),
    ({"query_range": [0, 10_000]}, "query_range"),
    ({"key_range": [1]}, "key_range"),
    ({"key_range": [-1, 3]}, "key_range"),
])
def test_bad_windows_are_422_naming_the_field(fake_client, window, param):
    r = fake_client.post("/attention", json={"inputs": TEXT, "layer": 0, **window})
    assert r.status_code == 422, r.text
    assert param in r.text


def test_a_window_costs_its_own_answer():
    """A sparse map that could hold more than max_attention_entries weights is refused whole,
    and answered for a window whose queries x keys are fewer."""
    from fastapi.testclient import TestClient
    from http_fakes import FakeRunner, tokenizer_json

    from attnserve.service.app import create_app

    app = create_app(Settings(max_length=256, max_attention_entries=60), runner=FakeRunner(max_length=256), tokenizer_path=tokenizer_json())
    with TestClient(app) as client:
        assert client.post("/attention", json={"inputs": TEXT, "layer": 0}).status_code == 413
        r = client.post("/attention", json={"inputs": TEXT, "layer": 0, "query_range": [0, 8], "key_range": [0, 7]})
        assert r.status_code == 200 and max(r.json()["rows"]) == 7 and max(r.json()["cols"]) == 6
        assert client.post("/attention", json={"inputs": TEXT, "layer": 0, "query_range": [0, 8]}).status_code == 413


def explorer_client(**settings):
    from fastapi.testclient import TestClient
    from http_fakes import FakeRunner, tokenizer_json

    from attnserve.service.app import create_app

    return TestClient(create_app(Settings(max_length=256, **settings), runner=FakeRunner(max_length=256), tokenizer_path=tokenizer_json()))


def test_explorer_files_are_served_without_the_key():
    with explorer_client(api_key="k") as client:
        page = client.get("/explorer")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/explorer/explorer.js">' in page.text and "https://" not in page.text  # nothing from elsewhere
        for name, kind in (("explorer.js", "text/javascript"), ("explorer.css", "text/css"), ("samples.json", "application/json")):
            r = client.get(f"/explorer/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        assert len(client.get("/explorer/samples.json").json()["samples"]) == 4
        assert client.get("/explorer/config.json").json() == {"auth": True, "peers": []}
        missing = client.get("/explorer/index.py")
        assert missing.status_code == 404 and "explorer.js" in missing.json()["error"]
        assert client.get("/explorer/%2e%2e/settings.py").status_code in (401, 404)
        assert client.get("/info").status_code == 401  # everything else still needs the key


def test_cors_and_compare_mode_only_for_configured_peers():
    preflight = {"origin": "http://127.0.0.1:9002", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization,content-type"}
    with explorer_client(api_key="k") as client:
        assert "access-control-allow-origin" not in client.options("/attention", headers=preflight).headers
    with explorer_client(api_key="k", explorer_peers="http://127.0.0.1:9001/, http://127.0.0.1:9002") as client:
        assert client.get("/explorer/config.json").json()["peers"] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
        r = client.options("/attention", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://127.0.0.1:9002"
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        other = client.options("/attention", headers={**preflight, "origin": "http://example.com"})
        assert "access-control-allow-origin" not in other.headers
        r = client.post("/attention", json={"inputs": "a few words", "layer": 0}, headers={"origin": "http://127.0.0.1:9002", "authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://127.0.0.1:9002"


def test_compose_services_list_each_other_as_explorer_peers():
    """docker compose: every variant's explorer can compare with all of them, itself included."""
    import yaml

    from attnserve.service.settings import Settings

    text = (Path(__file__).resolve().parents[1] / "docker" / "compose.yaml").read_text()
    services = yaml.safe_load(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text))["services"]  # compose's defaults, as with no .env
    urls = {f"http://127.0.0.1:{service['environment']['ATTNSERVE_PORT']}" for service in services.values()}
    assert len(urls) == len(services)
    for name, service in services.items():
        peers = Settings(explorer_peers=service["environment"]["ATTNSERVE_EXPLORER_PEERS"]).explorer_peers
        assert set(peers) == urls, name


class QuadraticRunner:
    """A FakeRunner whose maps cost like full attention's: n x n weights, 400 bytes each while
    computed for the mean over heads, 20 for one head."""

    def __new__(cls, **kwargs):
        from http_fakes import FakeRunner

        from attnserve.service.attention_maps import MapCost

        runner = FakeRunner(**kwargs)
        runner.attention_cost = lambda n, head=None: MapCost(entries=n * n, work_bytes=n * n * (400 if head is None else 20))
        return runner


def quadratic_client(**settings):
    from fastapi.testclient import TestClient
    from http_fakes import tokenizer_json

    from attnserve.service.app import create_app

    return TestClient(create_app(Settings(max_length=256, **settings), runner=QuadraticRunner(max_length=256), tokenizer_path=tokenizer_json()))


LONG_TEXT = " ".join(f"word{i % 50}" for i in range(100))


def test_truncate_cuts_a_map_to_the_length_that_fits():
    """truncate=true answers a map that would pass the memory budget, cut to the longest text
    that fits (1 MiB: 51 tokens at 400 bytes a weight, 44 with a sparse answer's 130 more, 50
    with 3 a row); without it the 413 says so."""
    with quadratic_client(max_request_memory_mb=1) as client:
        whole = len(client.post("/tokenize", json={"inputs": LONG_TEXT}).json()[0])
        assert whole > 60
        refused = client.post("/attention", json={"inputs": LONG_TEXT, "layer": 0, "format": "grid"})
        assert refused.status_code == 413 and "truncate=true (cuts the text to the 51 tokens that fit)" in refused.json()["error"]
        assert "one head" in refused.json()["error"]  # the mean costs 20x one head here: head 0 fits
        for body, fitting in (({"format": "grid"}, 51), ({"format": "png"}, None), ({"format": "sparse"}, 44),
                              ({"format": "sparse", "top_k": 3}, 50), ({"format": "grid", "head": 0}, whole)):
            r = client.post("/attention", json={"inputs": LONG_TEXT, "layer": 0, "truncate": True, **body})
            assert r.status_code == 200, (body, r.text)
            if fitting:
                assert r.json()["n_tokens"] == fitting and r.json()["tokens"][-1] == "[SEP]", body


def test_a_413_never_asks_for_what_the_client_sent():
    """Each 413 of /attention names a field that makes the request fit, and never one the
    request already holds (top_k or head given)."""
    with quadratic_client(max_request_memory_mb=1, max_attention_entries=2_000) as client:
        n = len(client.post("/tokenize", json={"inputs": LONG_TEXT}).json()[0])
        for sent, absent in (({"top_k": 5}, "top_k"), ({"head": 2}, "one head"), ({"head": 0, "top_k": 100}, "top_k")):
            r = client.post("/attention", json={"inputs": LONG_TEXT, "layer": 0, **sent})
            assert r.status_code == 413, (sent, r.text)
            error = r.json()["error"]
            assert absent not in error.split("; send ")[1] and "truncate=true" in error, (sent, error)
    # Every weight of one head's map passes the answer limit; top_k makes it fit.
    with quadratic_client(max_request_memory_mb=2, max_attention_entries=2_000) as client:
        r = client.post("/attention", json={"inputs": LONG_TEXT, "layer": 0, "head": 0})
        assert r.status_code == 413 and f"top_k <= {2_000 // n}" in r.json()["error"]
