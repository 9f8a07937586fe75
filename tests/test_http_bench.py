"""The helpers behind `attnserve bench service` / `bench load` (the benchmarks themselves are
run by hand; tests never assert on timings)."""
from __future__ import annotations

import asyncio

from http_fakes import tokenizer_json
from http_server import start_fake_server

from service.bench import _closed_loop, corpus_words, percentile, text_of_tokens
from service.tokenizer import TextTokenizer


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([7.0], 99) == 7.0


def test_text_of_tokens_hits_the_length():
    tokenizer = TextTokenizer(tokenizer_json(), 10**9)
    words = corpus_words(None)
    for n in (100, 512, 2000):
        text, count = text_of_tokens(tokenizer, words, n, start=n)
        assert count == len(tokenizer.encode([text], truncate=False)[0].ids)
        assert n - 10 <= count <= n


def test_closed_loop_counts_every_answer():
    server = start_fake_server("--max-concurrent-requests", "2", delay=0.05)
    try:
        result = asyncio.run(_closed_loop(server.url, ["a short text", "another text"], clients=6, duration=1.0, backoff=0.01))
    finally:
        server.stop()
    codes = {code for code, _ in result["results"]}
    assert result["errors"] == [] and result["ok"] > 0
    assert codes <= {200, 429} and 429 in codes  # six clients, two places
