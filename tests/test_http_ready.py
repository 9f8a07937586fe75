"""GET /ready, the orchestrator's readiness answer, in process over a fake runner whose batches
wait on a gate the test opens: 503 while the model loads, while no admission place or queue
room is left and once shutdown has begun, 200 otherwise; and /health (the liveness answer)
keeps answering while a batch runs. Every wait is bounded."""
from __future__ import annotations

import threading

from fastapi.testclient import TestClient
from http_fakes import FakeRunner, tokenizer_json
from http_server import poll

from attnserve.service.app import create_app
from attnserve.service.routes.meta import readiness
from attnserve.service.settings import Settings

WAIT = 30.0  # seconds any one wait may take before the test fails


class GatedRunner(FakeRunner):
    """Each embed call says it started, then blocks until the gate opens."""

    def __init__(self, max_length: int):
        super().__init__(max_length=max_length)
        self.started = threading.Event()
        self.gate = threading.Event()
        self.warmed = False

    def embed(self, input_ids, attention_mask):
        if not self.warmed:  # the app's own warm-up batch at startup runs at once
            self.warmed = True
            return super().embed(input_ids, attention_mask)
        self.started.set()
        assert self.gate.wait(WAIT), "the test never opened the gate"
        return super().embed(input_ids, attention_mask)


def gated_app(**settings):
    settings.setdefault("max_length", 256)
    runner = GatedRunner(settings["max_length"])
    return create_app(Settings(**settings), runner=runner, tokenizer_path=tokenizer_json()), runner


def post_in_thread(client: TestClient, body: dict) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def call():
        out["response"] = client.post("/embed", json=body)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, out


def test_not_ready_while_the_model_loads():
    app, _ = gated_app()
    client = TestClient(app)  # no `with`: the lifespan that loads the model has not run
    r = client.get("/ready")
    assert r.status_code == 503
    assert r.json()["ready"] is False and r.json()["reason"] == "loading"


def test_ready_when_idle_and_the_figures_are_the_servers():
    app, _ = gated_app(max_concurrent_requests=7, max_queued_tokens=5000)
    with TestClient(app) as client:
        r = client.get("/ready")
        assert r.status_code == 200
        assert r.json() == {"ready": True, "reason": "ok", "in_flight": 0, "max_concurrent_requests": 7,
                            "queued_tokens": 0, "max_queued_tokens": 5000}


def test_no_admission_place_left_is_not_ready_and_health_still_answers():
    app, runner = gated_app(max_concurrent_requests=1)
    with TestClient(app) as client:
        thread, out = post_in_thread(client, {"inputs": "a document the runner holds"})
        try:
            assert runner.started.wait(WAIT)
            r = client.get("/ready")
            assert r.status_code == 503
            assert r.json()["reason"] == "at_concurrency_limit" and r.json()["in_flight"] == 1
            # Liveness is answered on the event loop while the batch runs in its thread.
            assert client.get("/health").status_code == 200
            assert client.post("/embed", json={"inputs": "one more"}).status_code == 429
        finally:
            runner.gate.set()
            thread.join(WAIT)
        assert out["response"].status_code == 200
        assert client.get("/ready").status_code == 200


def test_a_queue_that_cannot_take_one_longest_input_is_not_ready():
    # max_length 256: ready while queued tokens + 256 fit in max_queued_tokens (300).
    app, runner = gated_app(max_queued_tokens=300)
    with TestClient(app) as client:
        first, first_out = post_in_thread(client, {"inputs": "held in the runner"})
        second = second_out = None
        try:
            assert runner.started.wait(WAIT)  # the first batch left the queue and runs
            assert client.get("/ready").status_code == 200
            second, second_out = post_in_thread(client, {"inputs": "word " * 60})  # about 62 tokens wait
            r = poll(lambda: client.get("/ready"), lambda r: r.status_code == 503, timeout=WAIT)
            assert r.status_code == 503, r.json()
            body = r.json()
            assert body["reason"] == "queue_full"
            assert body["queued_tokens"] + 256 > body["max_queued_tokens"] == 300
        finally:
            runner.gate.set()
            first.join(WAIT)
            if second is not None:
                second.join(WAIT)
        assert first_out["response"].status_code == 200 and second_out["response"].status_code == 200
        assert client.get("/ready").json()["queued_tokens"] == 0


def test_not_ready_once_shutdown_has_begun():
    app, _ = gated_app()
    with TestClient(app):
        service = app.state.service
        assert readiness(service).ready
    # The lifespan has stopped the batcher: the instance takes no new work.
    state = readiness(service)
    assert not state.ready and state.reason == "shutting_down"


def test_ready_needs_no_api_key():
    app, _ = gated_app(api_key="secret")
    with TestClient(app) as client:
        assert client.get("/ready").status_code == 200
        assert client.get("/info").status_code == 401
