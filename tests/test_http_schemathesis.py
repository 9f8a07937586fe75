"""Schemathesis over /openapi.json of a live server (uvicorn subprocess over the fake runner),
with every check it has: no 5xx, every status, content type, header and body as documented,
every request the schema allows accepted (ST202) and every one it forbids refused (ST201).
Bounded: at most EXAMPLES generated cases per route and phase, deterministic."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from http_server import start_fake_server


EXAMPLES = 60
# `--checks all` less two: max_response_time (tests never assert on wall-clock time) and
# object_level_authorization (it needs two users; this service has none).
CHECKS = [
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance", "negative_data_rejection", "positive_data_acceptance", "missing_required_header",
    "unsupported_method", "allow_header_conformance", "use_after_free", "ensure_resource_availability", "ignored_auth",
]
# The default statuses that count as refusing a schema-invalid request, and 413: a list over
# its maxItems (max_client_batch_size) is refused as too large, as every size limit is.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
"""


@pytest.fixture(scope="module")
def server():
    # 4,096 tokens: generated texts stay under the token limit, the one bound a schema cannot
    # state (it is counted in tokens, not characters).
    proc = start_fake_server(max_length=4096)
    yield proc
    proc.stop()


def test_schema_states_the_deployment_bounds(server):
    schema = httpx.get(server.url + "/openapi.json", timeout=30).json()
    text = json.dumps(schema)
    assert "x-deployment" not in text
    bodies = schema["components"]["schemas"]
    ids = bodies["DecodeRequest"]["properties"]["ids"]["anyOf"]
    assert ids[0]["items"] == {"type": "integer", "minimum": 0, "maximum": 30521, "description": "0 .. vocabulary size - 1"}
    assert ids[1]["maxItems"] == 64
    assert bodies["OpenAIEmbeddingRequest"]["properties"]["dimensions"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 384}
    attention = bodies["AttentionRequest"]["properties"]
    assert (attention["layer"]["minimum"], attention["layer"]["maximum"]) == (0, 5)
    assert attention["head"]["anyOf"][0]["maximum"] == 11
    text_schema, texts = bodies["EmbedRequest"]["properties"]["inputs"]["anyOf"]
    assert text_schema["minLength"] == 1 and text_schema["pattern"]
    assert (texts["minItems"], texts["maxItems"]) == (1, 64)


def run_schemathesis(url: str, workdir: Path, checks: list[str], examples: int, headers: dict | None = None):
    """The schemathesis CLI over url's /openapi.json (deterministic, one worker, bounded by
    examples per operation and a timeout): (exit status, output, its SUMMARY section)."""
    (workdir / "schemathesis.toml").write_text(CONFIG)
    tests_dir = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": f"{tests_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "SCHEMATHESIS_HOOKS": "schemathesis_hooks"}
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(workdir / "schemathesis.toml"),
        "run", url + "/openapi.json", "--checks", ",".join(checks), "--phases", "examples,coverage,fuzzing",
        "--max-examples", str(examples), "--generation-deterministic", "--workers", "1", "--continue-on-failure",
        "--request-timeout", "120", "--no-color",
    ]
    for name, value in (headers or {}).items():
        command += ["--header", f"{name}: {value}"]
    run = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=1200)
    return run.returncode, run.stdout + run.stderr, run.stdout[run.stdout.find("SUMMARY"):]


def test_schemathesis_all_checks(server, tmp_path):
    code, output, summary = run_schemathesis(server.url, tmp_path, CHECKS, EXAMPLES)
    print(summary)
    assert code == 0, output[-10000:]
    assert "Tested: 14" in summary and "generated" in summary and "passed" in summary
    assert server.alive()
