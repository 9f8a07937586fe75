"""TokenBudgetBatcher: the token budget, the request limit, admission, ordering."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from attnserve.service.batching import Overloaded, Timings, TokenBudgetBatcher, default_batch_tokens, pad
from http_fakes import FakeRunner


def run(coro):
    return asyncio.run(coro)


def test_pad_is_int64_right_padded():
    ids, mask = pad([[1, 2, 3], [4]])
    assert ids.dtype == np.int64 and mask.dtype == np.int64
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_batches_respect_token_budget_and_request_limit():
    async def main():
        runner = FakeRunner(delay=0.02)
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=400, max_batch_requests=3, max_concurrent_requests=100)
        await batcher.start()
        inputs = [[101] + [7] * n + [102] for n in (10, 20, 30, 40, 98, 5, 5, 5, 5, 5)]
        results = await asyncio.gather(*(batcher.embed([x], Timings()) for x in inputs))
        await batcher.stop()
        return runner, inputs, results

    runner, inputs, results = run(main())
    assert sum(size for size, _ in runner.batches) == len(inputs)
    for size, width in runner.batches:
        assert size <= 3
        assert size == 1 or size * width <= 400
    assert len(runner.batches) < len(inputs)  # it did batch
    # Results come back to the right caller: same ids give the same vector as alone.
    alone = FakeRunner()
    for x, got in zip(inputs, results):
        ids, mask = pad([x])
        np.testing.assert_allclose(got[0], alone.embed(ids, mask)[0], rtol=1e-6)


def test_an_input_over_the_budget_runs_alone():
    async def main():
        runner = FakeRunner()
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=8, max_batch_requests=8, max_concurrent_requests=10)
        await batcher.start()
        out = await batcher.embed([[101] + [5] * 20 + [102], [101, 102]], Timings())
        await batcher.stop()
        return runner, out

    runner, out = run(main())
    assert out.shape == (2, 384)
    assert (1, 22) in runner.batches


def test_the_budget_counts_the_padding_the_graph_runs():
    async def main():
        runner = FakeRunner()
        runner.length_multiple = 256  # like longformer's export: every batch runs at 256k tokens
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=1024, max_batch_requests=32, max_concurrent_requests=100)
        await batcher.start()
        await asyncio.gather(*(batcher.embed([[101] + [7] * 10 + [102]], Timings()) for _ in range(12)))
        await batcher.stop()
        return runner

    runner = run(main())
    sizes = [size for size, _ in runner.batches]
    assert sum(sizes) == 12 and max(sizes) == 4  # 4 x 256 padded tokens, not 1024 / 12 = 85 inputs


MIXED = [4, 120, 6, 118, 9, 115, 5, 122, 8, 119, 7, 117, 3, 121, 10, 116]


def _burst(by_length: bool):
    async def main():
        runner = FakeRunner()
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=512, max_batch_requests=8, max_concurrent_requests=10,
                                     by_length=by_length)
        await batcher.start()
        inputs = [[101] + [7 + n] * n + [102] for n in MIXED]
        out = await batcher.embed(inputs, Timings())
        await batcher.stop()
        return runner, inputs, out
    return run(main())


def test_a_mixed_length_burst_is_batched_by_length():
    runner, inputs, out = _burst(by_length=True)
    arrival, _, arrival_out = _burst(by_length=False)
    # Short texts share batches with short ones and long with long: padding is nearly gone.
    assert sorted(size for size, _ in runner.batches) == [4, 4, 8]
    assert sorted(width for _, width in runner.batches)[0] == 12  # the eight short ones together
    padded = lambda batches: sum(size * width for size, width in batches)  # noqa: E731
    real = sum(len(x) for x in inputs)
    assert padded(runner.batches) - real < (padded(arrival.batches) - real) / 10
    # Same vectors, in input order, either way.
    np.testing.assert_allclose(out, arrival_out, atol=1e-6)
    alone = FakeRunner()
    np.testing.assert_allclose(out, np.concatenate([alone.embed(*pad([x])) for x in inputs]), atol=1e-6)


def test_length_batches_cover_every_input_once_within_the_budget():
    from attnserve.service.packing import length_batches

    lengths = [30, 200, 5, 256, 17, 90, 91, 3, 250, 64, 2, 128]
    batches = length_batches(lengths, lambda n: -(-n // 16) * 16, max_tokens=512, max_inputs=4)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        widths = [lengths[i] for i in batch]
        assert len(batch) <= 4 and (len(batch) == 1 or len(batch) * -(-max(widths) // 16) * 16 <= 512)
    assert [lengths[b[0]] for b in batches] == sorted((lengths[b[0]] for b in batches), reverse=True)  # longest first


def test_default_budget_depends_on_the_provider():
    assert default_batch_tokens("CPUExecutionProvider") < default_batch_tokens("CUDAExecutionProvider")


def test_admission_refuses_beyond_the_limit():
    async def main():
        batcher = TokenBudgetBatcher(FakeRunner(), 100, 4, max_concurrent_requests=2)
        with batcher.admit(), batcher.admit():
            with pytest.raises(Overloaded):
                with batcher.admit():
                    pass
        with batcher.admit():  # places are given back
            pass
        assert batcher.in_flight == 0

    run(main())


def test_timings_and_batch_sizes_are_recorded():
    async def main():
        batcher = TokenBudgetBatcher(FakeRunner(delay=0.01), 1000, 8, 10)
        await batcher.start()
        timings = Timings()
        await batcher.embed([[101, 5, 102], [101, 6, 102]], timings)
        await batcher.stop()
        return timings

    timings = run(main())
    assert timings.inference > 0 and timings.queue >= 0
    assert timings.batch_sizes == [2, 2]


def test_attention_runs_alone_and_returns_map_and_ratios():
    async def main():
        runner = FakeRunner()
        batcher = TokenBudgetBatcher(runner, 1000, 8, 10)
        await batcher.start()
        emb, att = await asyncio.gather(
            batcher.embed([[101, 5, 102]], Timings()),
            batcher.attention([101, 5, 6, 102], 1, None, Timings()),
        )
        await batcher.stop()
        return emb, att

    emb, ((rows, cols, values), ratios) = run(main())
    assert emb.shape == (1, 384)
    assert len(ratios) == 6 and rows.max() == 3


def test_runner_errors_reach_every_caller_and_the_loop_survives():
    class Failing(FakeRunner):
        def embed(self, input_ids, attention_mask):
            if input_ids.shape[1] > 4:
                raise ValueError("too long for the export")
            return super().embed(input_ids, attention_mask)

    async def main():
        batcher = TokenBudgetBatcher(Failing(), 1000, 1, 10)
        await batcher.start()
        with pytest.raises(ValueError):
            await batcher.embed([[101, 1, 2, 3, 4, 102]], Timings())
        out = await batcher.embed([[101, 102]], Timings())
        await batcher.stop()
        return out

    assert run(main()).shape == (1, 384)


def test_stop_finishes_queued_work():
    async def main():
        batcher = TokenBudgetBatcher(FakeRunner(delay=0.02), 1000, 1, 10)
        await batcher.start()
        tasks = [asyncio.create_task(batcher.embed([[101, i, 102]], Timings())) for i in range(5)]
        await asyncio.sleep(0)
        await batcher.stop()
        return await asyncio.gather(*tasks)

    assert len(run(main())) == 5


def test_the_fake_runner_is_a_runner():
    import typing

    from attnserve.service.backend import Runner

    runner = FakeRunner()
    assert isinstance(runner, Runner)
    for name, kind in typing.get_type_hints(Runner).items():
        assert isinstance(getattr(runner, name), kind), name


@pytest.mark.parametrize("mode,normalize", [("mean", True), ("mean", False), ("cls", True), ("opening", True), ("opening", False)])
def test_the_backend_pools_what_the_batcher_batches(mode, normalize):
    """Vectors through the batcher are the pooling of each input's own token vectors (padding
    removed), whatever else shares its batch; normalised mean pooling is the graph's output."""
    from attnserve.contract.pooling import Pooling

    pooling = Pooling(mode, opening_weight=0.4, opening_tokens=3)
    inputs = [[101] + [7 + i] * (2 + 3 * i) + [102] for i in range(4)]

    async def main():
        runner = FakeRunner()
        batcher = TokenBudgetBatcher(runner, 1000, 8, 10, pooling=pooling)
        await batcher.start()
        out = await batcher.embed(inputs, Timings(), normalize=normalize)
        await batcher.stop()
        return runner, out

    runner, out = run(main())
    assert out.dtype == np.float32 and out.shape == (4, 384)
    assert [size for size, _ in runner.batches] == [4] * len(runner.batches)  # one batch (hidden_states embeds too)
    for x, got in zip(inputs, out):
        ids, mask = pad([x])
        expected = runner.embed(ids, mask)[0] if (mode, normalize) == ("mean", True) else pooling(runner.hidden_states(ids, mask)[0], normalize)
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_cuts_fall_where_the_lengths_jump():
    from attnserve.service.packing import cut_sorted, fill_batch

    same = lambda n: n  # noqa: E731
    assert cut_sorted([250, 240, 60, 50, 10, 8], same, max_tokens=4096, max_inputs=32) == [2, 2, 2]
    assert sorted(cut_sorted([100] * 5, same, max_tokens=4096, max_inputs=2)) == [1, 2, 2]  # the size limit
    assert cut_sorted([100] * 4, same, max_tokens=250, max_inputs=32) == [2, 2]  # the token budget
    assert cut_sorted([5000, 10], same, max_tokens=1000, max_inputs=32) == [1, 1]  # over the budget: alone
    # The batcher's view: from its first input, only inputs no longer than it, longest first.
    assert fill_batch(240, [10, 250, 230, 60, 235], same, max_tokens=4096, max_inputs=32) == [4, 2]
    assert fill_batch(240, [10, 250, 230], same, max_tokens=4096, max_inputs=32, by_length=False) == [0, 1, 2]


def _doc(tokens: int, mark: int = 7) -> list[int]:
    return [101] + [mark] * (tokens - 2) + [102]


def test_a_long_request_under_sustained_short_traffic_finishes_within_a_bound():
    """A 32-input request of 1,000-token texts while 16 clients keep sending 1-input 20-token
    requests (more than a batch holds, so short ones always wait): it gets a batch at least once
    every FAIR_WAIT_BATCHES + 1 batches, so it finishes within 32 x (FAIR_WAIT_BATCHES + 1)
    batches, long before the short traffic ends (counted in batches, not seconds)."""
    from attnserve.service.batching import FAIR_WAIT_BATCHES

    async def main():
        runner = FakeRunner(max_length=1024)
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=1024, max_batch_requests=4, max_concurrent_requests=1000)
        await batcher.start()
        state = {"shorts": 0, "long_done_at": None}

        async def client(i):
            while state["long_done_at"] is None and state["shorts"] < 3000:
                state["shorts"] += 1
                await batcher.embed([_doc(20, mark=i)], Timings())

        clients = [asyncio.create_task(client(i)) for i in range(16)]
        await asyncio.sleep(0)  # the short traffic first
        await batcher.embed([_doc(1000) for _ in range(32)], Timings())
        state["long_done_at"] = len(runner.batches)
        await asyncio.gather(*clients)
        await batcher.stop()
        return state, runner

    state, runner = run(main())
    assert state["shorts"] < 3000, "the long request waited for the short traffic to end"
    assert state["long_done_at"] <= 32 * (FAIR_WAIT_BATCHES + 1) + FAIR_WAIT_BATCHES, state
    assert sum(1 for size, width in runner.batches if width >= 1000) == 32


def test_a_short_query_behind_a_big_request_waits_for_at_most_two_batches():
    """Round-robin over requests: a 1-input query that arrives while a 64-input request of long
    documents waits runs in the next batch or, when the big request is due its fair turn, the one
    after, not after the 64."""

    async def main():
        runner = FakeRunner(max_length=1024, delay=0.005)
        batcher = TokenBudgetBatcher(runner, max_batch_tokens=1024, max_batch_requests=8, max_concurrent_requests=100)
        await batcher.start()
        big = asyncio.create_task(batcher.embed([_doc(900) for _ in range(64)], Timings()))
        waits = []
        for i in range(10):
            await asyncio.sleep(0.012)
            before = len(runner.batches)
            await batcher.embed([_doc(12, mark=i + 9)], Timings())
            waits.append(len(runner.batches) - before)
        await big
        await batcher.stop()
        return waits

    waits = run(main())
    assert max(waits) <= 3, waits  # the batch in progress, perhaps the big request's fair turn, its own
