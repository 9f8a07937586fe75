"""Schemathesis over /openapi.json of a live server (uvicorn subprocess over the fake runner):
generated requests, valid and invalid, never get a 5xx. Bounded: a few examples per route."""
from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from http_server import start_fake_server  # noqa: E402

EXAMPLES = 25
calls: list[int] = []


@pytest.fixture(scope="module")
def server():
    proc = start_fake_server("--max-length", "512")
    yield proc
    proc.stop()


def check_operation(operation, modes, examples: int = EXAMPLES, headers: dict | None = None):
    failures = []
    for mode in modes:
        strategy = operation.as_strategy(generation_mode=mode)

        @given(strategy)
        @settings(max_examples=examples, deadline=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=True, database=None)
        def run(case):
            response = case.call(timeout=120, headers=headers)
            calls.append(response.status_code)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.path} {case.body!r:.300} -> {response.status_code} {response.text[:300]}")
            content_type = response.headers.get("content-type") or ""
            if isinstance(content_type, list):  # schemathesis keeps every value of a header
                content_type = content_type[0] if content_type else ""
            if 400 <= response.status_code < 500 and content_type.startswith("application/json"):
                assert "error" in response.json(), response.text[:300]

        try:
            run()
        except Unsatisfiable:  # nothing to break in a route without parameters or body
            pass
    return failures


def test_no_server_errors(server):
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    failures, operations = [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        failures += check_operation(operation, [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    assert operations >= 7
    print(f"schemathesis: {operations} operations, {len(calls)} requests, statuses {sorted(set(calls))}")
    assert not failures, "\n".join(failures[:10])
    assert server.alive()
