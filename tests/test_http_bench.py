"""The helpers behind `attnserve bench service` / `bench load` (the benchmarks themselves are
run by hand; tests never assert on timings)."""
from __future__ import annotations

import asyncio

from http_fakes import tokenizer_json
from http_server import start_fake_server

from attnserve.service.tokenizer import TextTokenizer
from attnserve.bench.service import closed_loop, corpus_words, drained, metric_value, percentile, rss_bytes, text_of_tokens


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
        result = asyncio.run(closed_loop(server.url, ["a short text", "another text"], clients=6, duration=1.0, backoff=0.01))
    finally:
        server.stop()
    codes = {code for code, _ in result["results"]}
    assert result["errors"] == [] and result["ok"] > 0
    assert codes <= {200, 429} and 429 in codes  # six clients, two places


def test_clients_that_give_up_are_counted_and_their_work_cancelled():
    server = start_fake_server(delay=0.6)
    try:
        # Bounded by the count (each request gives up within 1 s), not by the clock: all 6 are sent.
        result = asyncio.run(closed_loop(server.url, ["a short text"], clients=3, duration=60, abandon=1.0, max_requests=6))
        assert result["abandoned"] + len(result["results"]) == 6 and result["abandoned"] >= 3
        assert result["errors"] == []
        assert drained(server.url) == (0.0, 0.0)
        assert metric_value(server.url, "attnserve_requests_cancelled_total") >= 1
    finally:
        server.stop()


def test_rss_of_a_live_process():
    import os

    assert rss_bytes(os.getpid()) > 10 * 2**20
    assert rss_bytes(2**22 + 12345) == 0  # no such process
