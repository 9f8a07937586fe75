"""End to end: a real export (longformer, max_length 1024: conftest's export_dir, from the suite's
export cache), `attnserve serve` in a subprocess on 127.0.0.1, every route, the official openai
and voyageai clients, bad input, graceful shutdown.
"""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from export_helpers import HTTP_MAX_LENGTH as MAX_LENGTH
from http_checks import check_attention_formats, late_chunk_vectors
from http_server import ROOT, start_real_server, terminate_while_busy


API_KEY = "test-key-123"
AUTH = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(export_dir):
    # Named the way `attnserve serve` finds its export: models dir + variant + max_length.
    proc = start_real_server(None, "--models-dir", str(export_dir.parent), "--variant", "longformer",
                             "--max-length", str(MAX_LENGTH), "--max-client-batch-size", "8", "--api-key", API_KEY,
                             "--max-body-bytes", str(4 * 1024 * 1024), "--providers", "CPUExecutionProvider")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c:
        yield c


def alive(server) -> bool:
    return server.proc.poll() is None and httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_the_onnx_runner_is_a_runner(export_dir):
    """OnnxRunner satisfies service.backend.Runner, the Protocol the serving layers use it by
    (attributes of the declared types, every call present)."""
    import typing

    from attnserve.service.backend import Runner
    from attnserve.service.runtime import OnnxRunner

    runner = OnnxRunner(export_dir, providers=["CPUExecutionProvider"], intra_op_threads=1)
    assert isinstance(runner, Runner)
    for name, kind in typing.get_type_hints(Runner).items():
        assert isinstance(getattr(runner, name), kind), name


# -- every route ----------------------------------------------------------------------------
def test_health_needs_no_key_and_the_rest_do(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    for path in ("/info", "/metrics"):
        r = httpx.get(server.url + path)
        assert r.status_code == 401 and r.json()["error_type"] == "Unauthorized"
    r = httpx.post(server.url + "/embed", json={"inputs": "x"}, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_info(client, export_dir):
    info = client.get("/info").json()
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert info["variant"] == "longformer" and info["max_length"] == MAX_LENGTH
    assert info["provider"] == "CPUExecutionProvider"
    assert info["model_sha256"] == manifest["files"]["model.onnx"]["sha256"]
    assert info["parameters"]["window"] == 512 and info["num_layers"] == 6
    assert info["batching"]["max_client_batch_size"] == 8 and info["version"]
    assert info["attention_max_length"] == MAX_LENGTH  # longformer's maps are O(N * window)
    assert info["rank_collapse_max_length"] == MAX_LENGTH // 4  # four paths in one batch
    assert info["rank_collapse_paths"] == ["model", "attention_only", "attention_skip", "attention_mlp"]


def test_embed_matches_pytorch_encoder(client):
    from attnserve.models import load_encoder

    texts = ["Sparse attention lets a transformer read long documents.", "word " * 700]
    r = client.post("/embed", json={"inputs": texts})
    assert r.status_code == 200
    for name in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert float(r.headers[name]) >= 0
    got = np.array(r.json(), dtype=np.float32)
    # The server and the Python API pool by the same default (opening: the 702-token text
    # differs from its mean), normalised or not alike.
    encoder = load_encoder("longformer", max_length=MAX_LENGTH)
    assert got.shape == (2, 384)
    np.testing.assert_allclose(got, encoder.embed(texts).numpy(), atol=1e-4)
    raw = np.array(client.post("/embed", json={"inputs": texts, "normalize": False}).json())
    assert abs(np.linalg.norm(raw[0]) - 1) > 1e-3
    np.testing.assert_allclose(raw, encoder.embed(texts, normalize=False).numpy(), atol=1e-4)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), got, atol=1e-5)


def test_a_mixed_length_burst_gives_each_text_its_own_vector(client):
    """The batcher groups a request's texts by length (src/attnserve/service/packing.py): each text's vector
    is the one it gets alone, whichever texts it shared a batch with."""
    texts = [" ".join(["word"] * n) + f" {n}" for n in (3, 240, 7, 180, 30, 250, 1, 90)]  # this server takes 8 a request
    together = np.array(client.post("/embed", json={"inputs": texts}).json())
    alone = np.array([client.post("/embed", json={"inputs": text}).json()[0] for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_readme_curl_examples(server):
    """Every curl example in the READMEs runs against the real server and answers JSON."""
    import re
    import subprocess

    examples = [line for doc in ("README.md", "docs/api.md")
                for line in (ROOT / doc).read_text().splitlines() if line.strip().startswith("curl ")]
    routes = {re.search(r"127\.0\.0\.1:8080(/[\w/]+)", line).group(1) for line in examples}
    assert {"/embed", "/embed_chunks", "/embed_all", "/decode", "/similarity", "/v1/embeddings", "/v1/contextualizedembeddings",
            "/attention", "/info"} <= routes
    host = server.url.removeprefix("http://")
    for line in examples:
        command = line.strip().replace("127.0.0.1:8080", host).replace("curl -s", f"curl -sf -H 'authorization: Bearer {API_KEY}'", 1)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stderr)
        json.loads(done.stdout)


def test_too_long_413_then_truncate(client):
    text = "long " * 1500
    r = client.post("/embed", json={"inputs": text})
    assert r.status_code == 413
    assert "1502 tokens" in r.json()["error"] and str(MAX_LENGTH) in r.json()["error"]
    r = client.post("/embed", json={"inputs": text, "truncate": True})
    assert r.status_code == 200 and len(r.json()[0]) == 384


def test_openai_client(server, client):
    import openai

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    texts = ["first document about sparse attention", "second one, about rank collapse"]
    result = oa.embeddings.create(input=texts, model="attnserve-longformer")  # the client asks for base64
    assert result.model == "attnserve-longformer" and [d.index for d in result.data] == [0, 1]
    assert result.usage.prompt_tokens > 0 and result.usage.total_tokens == result.usage.prompt_tokens
    vectors = np.array([d.embedding for d in result.data], dtype=np.float32)
    tei = np.array(client.post("/embed", json={"inputs": texts}).json(), dtype=np.float32)
    np.testing.assert_allclose(vectors, tei, atol=1e-6)
    floats = oa.embeddings.create(input=texts[0], model="m", encoding_format="float", dimensions=64)
    short = np.array(floats.data[0].embedding)
    assert short.shape == (64,) and abs(np.linalg.norm(short) - 1) < 1e-5
    with pytest.raises(openai.APIStatusError) as info:
        oa.embeddings.create(input="too long " * 1000, model="m")
    assert info.value.status_code == 413 and info.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).embeddings.create(input="x", model="m")


CHUNKS = ["Late chunking runs the whole document through the encoder once.",
          "Each chunk's vector is then the mean of its own tokens' states,",
          "so a chunk that says 'it' still knows what the document is about."]


def test_jina_late_chunking_through_the_openai_client(server, client):
    import openai

    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    result = oa.embeddings.create(input=CHUNKS, model="m", extra_body={"late_chunking": True, "task": "retrieval.passage"})
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    np.testing.assert_allclose(got, late_chunk_vectors(client, CHUNKS), atol=1e-5)
    alone = np.array(client.post("/embed", json={"inputs": CHUNKS}).json(), dtype=np.float32)
    assert np.all(np.sum(got * alone, axis=1) < 0.999)  # each chunk's vector has seen the others
    tokens = len(client.post("/tokenize", json={"inputs": " ".join(CHUNKS)}).json()[0])
    assert result.usage.prompt_tokens == tokens
    one = oa.embeddings.create(input=[CHUNKS[0]], model="m", extra_body={"late_chunking": True})
    np.testing.assert_allclose(one.data[0].embedding, alone[0], atol=1e-5)


def test_voyage_client_contextualized_embeddings(server, client):
    import voyageai

    vo = voyageai.Client(api_key=API_KEY, base_url=server.url + "/v1", max_retries=0, timeout=120)
    single = "A document of one chunk gets the vector /embed gives it."
    result = vo.contextualized_embed(inputs=[CHUNKS, [single]], model="attnserve", input_type="document")
    assert [r.index for r in result.results] == [0, 1]
    expected = late_chunk_vectors(client, CHUNKS)
    np.testing.assert_allclose(np.array(result.results[0].embeddings), expected, atol=1e-5)
    np.testing.assert_allclose(result.results[1].embeddings[0], client.post("/embed", json={"inputs": single}).json()[0], atol=1e-5)
    tokens = [len(t) for t in client.post("/tokenize", json={"inputs": [" ".join(CHUNKS), single]}).json()]
    assert result.total_tokens == sum(tokens)
    bits = vo.contextualized_embed(inputs=[CHUNKS], model="m", output_dtype="ubinary", output_dimension=128)
    short = expected[:, :128]
    assert bits.results[0].embeddings == np.packbits(short > 0, axis=1).tolist()
    # Queries: one per inner list (the client wraps a flat list), each embedded as a short text is,
    # at any length; a long one differs from the document path (this deployment pools long texts by their opening).
    long = "word " * 700
    queries = vo.contextualized_embed(inputs=["what is late chunking?", long], model="m", input_type="query")
    as_query = np.array(client.post("/embed", json={"inputs": ["what is late chunking?", long], "input_type": "query"}).json())
    np.testing.assert_allclose(np.array([r.embeddings[0] for r in queries.results]), as_query, atol=1e-5)
    mean = client.post("/embed_chunks", json={"inputs": long, "chunk_tokens": 1000, "context": "late"}).json()[0][0]["embedding"]
    np.testing.assert_allclose(as_query[1], mean, atol=1e-5)
    as_document = np.array(client.post("/embed", json={"inputs": long}).json()[0])
    assert as_query[1] @ as_document < 0.9999
    with pytest.raises(voyageai.error.MalformedRequestError) as info:  # Voyage's class for a 422
        vo.contextualized_embed(inputs=[CHUNKS], model="m", input_type="query")
    assert "one query per inner list" in str(info.value)


def test_attention_formats(client):
    body, rows, cols = check_attention_formats(client, "The quick brown fox jumps over the lazy dog. " * 30, layer=3, atol=1e-3)
    assert all(0 < x <= 1.5 for x in body["rank_collapse"])
    assert set(cols[rows == 0]) == set(range(body["n_tokens"]))  # CLS is global in longformer


def test_rank_collapse_matches_pytorch(client):
    """/rank_collapse from the export's collapse graph equals the PyTorch encoder's paths."""
    from attnserve.models import load_encoder

    text = "Pure attention loses rank with depth; the skip connections keep it. " * 12  # < 256 tokens
    r = client.post("/rank_collapse", json={"inputs": text})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = load_encoder("longformer", max_length=MAX_LENGTH).rank_collapse(text, paths=list(body["paths"]))
    assert list(body["paths"]) == ["model", "attention_only", "attention_skip", "attention_mlp"]
    for path, curve in expected.items():
        np.testing.assert_allclose(body["paths"][path], curve, atol=1e-4, err_msg=path)
    assert body["paths"]["model"] == pytest.approx(client.post("/attention", json={"inputs": text, "layer": 0}).json()["rank_collapse"], abs=1e-5)
    # The paper's finding on this text: pure attention collapses, the skips keep the rank.
    assert body["paths"]["attention_only"][-1] < 0.01 < 0.3 < body["paths"]["attention_skip"][-1]
    r = client.post("/rank_collapse", json={"inputs": text, "paths": ["attention_only", "nope"]})
    assert r.status_code == 422 and "paths" in r.text


def test_tokenize_and_metrics(client):
    toks = client.post("/tokenize", json={"inputs": "Hello attention"}).json()[0]
    assert [t["text"] for t in toks] == ["[CLS]", "hello", "attention", "[SEP]"]
    text = client.get("/metrics").text
    assert 'attnserve_inference_duration_seconds_count{precision="float32",route="/embed",variant="longformer"}' in text
    assert 'attnserve_requests_failure_total{precision="float32",reason="too_long",route="/embed",variant="longformer"}' in text


# -- bad input: each a 4xx JSON error, the server alive afterwards ----------------------------
def _raw(body: bytes):
    return {"content": body, "headers": {**AUTH, "content-type": "application/json"}}


BAD_INPUTS = {
    "empty string": ("/embed", {"json": {"inputs": ""}}, 422),
    "empty list": ("/embed", {"json": {"inputs": []}}, 422),
    "empty openai input": ("/v1/embeddings", {"json": {"input": "", "model": "m"}}, 422),
    "too many inputs": ("/embed", {"json": {"inputs": ["x"] * 9}}, 413),
    "wrong type: number": ("/embed", {"json": {"inputs": 42}}, 422),
    "wrong type: dict list": ("/embed", {"json": {"inputs": [{"text": "x"}]}}, 422),
    "wrong type: truncate": ("/embed", {"json": {"inputs": "x", "truncate": "sometimes"}}, 422),
    "wrong type: layer": ("/attention", {"json": {"inputs": "x", "layer": "two"}}, 422),
    "invalid JSON": ("/embed", _raw(b'{"inputs": ["a", }'), 400),
    "not UTF-8": ("/embed", _raw(b'{"inputs": "\xc3\x28"}'), 400),
    "NUL byte": ("/embed", {"json": {"inputs": "before\x00after"}}, 422),
    "lone surrogate": ("/embed", _raw(b'{"inputs": "x\\ud83dy"}'), 422),
    "unknown layer": ("/attention", {"json": {"inputs": "x", "layer": 6}}, 422),
    "unknown head": ("/attention", {"json": {"inputs": "x", "layer": 0, "head": 12}}, 422),
    "negative head": ("/attention", {"json": {"inputs": "x", "layer": 0, "head": -1}}, 422),
    "1,000,000-character document": ("/embed", {"json": {"inputs": ("attention " * 100_000)[:1_000_000]}}, 413),
    "1,000,000 characters to /v1": ("/v1/embeddings", {"json": {"input": "a " * 500_000, "model": "m"}}, 413),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input(server, client, case):
    path, kwargs, status = BAD_INPUTS[case]
    r = client.post(path, **kwargs)
    assert r.status_code == status, r.text[:500]
    body = r.json()
    if path.startswith("/v1/"):
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    else:
        assert set(body) == {"error", "error_type"} and body["error"]
    assert alive(server)


def test_50_mb_body(server):
    body = b'{"inputs": "' + b"b" * (50 * 1024 * 1024) + b'"}'
    r = httpx.post(server.url + "/embed", content=body, headers={**AUTH, "content-type": "application/json"}, timeout=120)
    assert r.status_code == 413 and "limit" in r.json()["error"]
    assert alive(server)


def test_schemathesis_finds_no_5xx(server, tmp_path):
    """Over the real model: schema-valid and schema-invalid requests, none answered 5xx."""
    from test_http_schemathesis import run_schemathesis

    code, output, summary = run_schemathesis(server.url, tmp_path, ["not_a_server_error"], examples=10, headers=AUTH)
    assert code == 0 and "passed" in summary, output[-10000:]
    assert alive(server)


def test_graceful_shutdown_answers_accepted_requests(export_dir):
    proc = start_real_server(export_dir, "--max-batch-requests", "1", "--providers", "CPUExecutionProvider")
    text = "word " * 900  # about 900 tokens, under max_length 1024
    results, code = terminate_while_busy(proc, [f"{i} {text}" for i in range(4)], timeout=300)
    assert results == [200] * 4, (results, proc.log())
    assert code in (0, -15)


_NO_TORCH = """
import sys
class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch" or name.startswith("attnserve.models"):
            raise ImportError(f"{name} is blocked: serving must not need it")
sys.meta_path.insert(0, BlockTorch())
from attnserve.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_serving_needs_neither_torch_nor_models(export_dir):
    from http_server import ServerProcess, free_port

    port = free_port()
    # The default providers (CUDA, then CPU) and INFO logs: on a machine without CUDA the
    # start says so in one plain line, and nothing is logged as an error.
    proc = ServerProcess(["-c", _NO_TORCH, "serve", "--export-dir", str(export_dir), "--port", str(port), "--log-level", "info"], port)
    try:
        proc.wait_ready(180)
        r = httpx.post(proc.url + "/embed", json={"inputs": "no torch here"}, timeout=120)
        assert r.status_code == 200 and len(r.json()[0]) == 384
        r = httpx.post(proc.url + "/attention", json={"inputs": "no torch here", "layer": 1, "format": "grid"}, timeout=120)
        assert r.status_code == 200
        r = httpx.post(proc.url + "/rank_collapse", json={"inputs": "no torch here"}, timeout=120)
        assert r.status_code == 200 and len(r.json()["paths"]["attention_only"]) == 6
        provider = httpx.get(proc.url + "/info", timeout=60).json()["provider"]
    finally:
        proc.stop()
    log = proc.log()
    assert "ERROR" not in log and "[E:onnxruntime" not in log, log
    assert f"runs {export_dir} on {provider}" in log
    if provider == "CPUExecutionProvider":
        assert log.count("CUDA not available: ") == 1, log


# A variant that exports quickly at a short max_length, of the bundled MiniLM cut to two layers
# (the suite's two_layer_minilm folder): the first-start test pays for one whole export (every
# graph and the parity check), as a user's first `attnserve serve` does.
FIRST_START_VARIANT = "full"
FIRST_START_MAX_LENGTH = 512


def test_serve_exports_on_first_start_then_reuses_it(tmp_path, two_layer_minilm):
    from http_server import ServerProcess, free_port

    from attnserve.service.exports import export_path
    from attnserve.service.settings import Settings

    models_dir = tmp_path / "models"
    flags = ["--model", str(two_layer_minilm), "--models-dir", str(models_dir), "--variant", FIRST_START_VARIANT,
             "--max-length", str(FIRST_START_MAX_LENGTH), "--providers", "CPUExecutionProvider"]
    first = start_real_server(None, *flags, ready_timeout=900)
    try:
        info = httpx.get(first.url + "/info", timeout=60).json()
        r = httpx.post(first.url + "/embed", json={"inputs": "exported on its first start"}, timeout=120)
    finally:
        first.stop()
    assert "no export at" in first.log()  # the once-only export warning
    # One finished export where `serve` looks for it, no scratch directory left beside it.
    export = export_path(Settings(model=str(two_layer_minilm), models_dir=models_dir, variant=FIRST_START_VARIANT,
                                  max_length=FIRST_START_MAX_LENGTH))
    assert [p.name for p in models_dir.iterdir()] == [export.name]
    assert f"exported into {export}" in first.log()  # the folder it ends in, not its scratch name
    assert "torchvision" not in first.log() and "FutureWarning" not in first.log()
    manifest = json.loads((export / "manifest.json").read_text())
    assert {"model.onnx", "analysis.onnx", "tokenizer.json"} <= set(manifest["files"])
    assert info["variant"] == FIRST_START_VARIANT and info["max_length"] == FIRST_START_MAX_LENGTH
    assert len(info["model_sha256"]) == 64 and info["model_sha256"] == manifest["files"]["model.onnx"]["sha256"]
    assert r.status_code == 200 and len(r.json()) == 1 and len(r.json()[0]) == 384
    written = {p.name: p.stat().st_mtime_ns for p in export.iterdir()}

    # The second start reuses it: torch and models/ are blocked, so exporting again would fail, and
    # the export is found by its manifest under its model-named folder.
    port = free_port()
    second = ServerProcess(["-c", _NO_TORCH, "serve", *flags, "--port", str(port), "--log-level", "warning"], port)
    try:
        second.wait_ready(180)
        again = httpx.post(second.url + "/embed", json={"inputs": "exported on its first start"}, timeout=120)
        assert httpx.get(second.url + "/info", timeout=60).json()["model_sha256"] == info["model_sha256"]
    finally:
        second.stop()
    assert "no export at" not in second.log()
    assert {p.name: p.stat().st_mtime_ns for p in export.iterdir()} == written
    assert [p.name for p in models_dir.iterdir()] == [export.name]
    np.testing.assert_allclose(again.json(), r.json(), atol=1e-6)
