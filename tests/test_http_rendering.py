"""Attention rendering: top-k, grid pooling, PNG encoding; and settings <-> CLI flags."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from service.rendering import colorize, heatmap_png, pool_grid, top_k_per_row
from service.settings import Settings, add_settings_arguments, settings_from_args


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


def decode_png(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8).reshape(height, 1 + width * 3)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(height, width, 3)


def test_png_round_trips_and_scales_up():
    grid = np.array([[1.0, 0.0], [0.5, 0.001]])
    image = decode_png(heatmap_png(grid, min_side=64))
    assert image.shape == (64, 64, 3)
    np.testing.assert_array_equal(image[0, 0], colorize(grid)[0, 0])
    assert not np.array_equal(image[0, 0], image[0, 63])  # 1.0 and 0.0 differ


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
    from service.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--max-batch-tokens" in out and "ATTNSERVE_API_KEY" in out
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "service" in capsys.readouterr().out
