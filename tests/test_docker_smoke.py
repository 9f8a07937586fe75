"""Docker smoke test: build the image, run it, ask /health and /embed over loopback.

Two environment variables adapt it to a machine without public images (docker/README.md,
"Building without internet"):

- ATTNSERVE_TEST_BASE_IMAGE: the base image to build on (`--build-arg BASE_IMAGE`); unset, the
  Dockerfile's default CUDA base.
- ATTNSERVE_TEST_DOCKER_SCRIPTS: a folder holding start-dockerd.sh, run when no Docker engine
  answers, and make-base-image.sh IMAGE, run when that base image is missing; unset, the
  engine must be running and the base pullable.

Skips only when no Docker engine answers and none can be started.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

# Needs the machine to itself: pytest-xdist runs this group on one worker, one test at a time.
pytestmark = pytest.mark.xdist_group("whole_machine")

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGE = os.environ.get("ATTNSERVE_TEST_BASE_IMAGE") or None
SCRIPTS = Path(os.environ["ATTNSERVE_TEST_DOCKER_SCRIPTS"]) if os.environ.get("ATTNSERVE_TEST_DOCKER_SCRIPTS") else None
IMAGE = "attnserve:smoke"
# The image the default build makes (its export made at build time, all its graphs), with the
# variant whose export is quickest: full's takes ~50 s at 1,024 tokens, longformer's (the default)
# ~160 s, and this layer is rebuilt whenever src/ changes. The variants' exports themselves are
# tested outside Docker (tests/test_export_parity.py).
VARIANT = "full"
MAX_LENGTH = 1024  # a small export keeps the build short


def sh(*cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


def docker_ok() -> bool:
    try:
        return shutil.which("docker") is not None and sh("docker", "info", check=False, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def ensure_engine() -> None:
    if docker_ok():
        return
    why = "no docker CLI answers `docker info`"
    if SCRIPTS is None:
        why += "; set ATTNSERVE_TEST_DOCKER_SCRIPTS to a folder with start-dockerd.sh to start one"
    else:
        script = SCRIPTS / "start-dockerd.sh"
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900)
        if docker_ok():
            return
        why += f"; ATTNSERVE_TEST_DOCKER_SCRIPTS: {script} failed: {(r.stderr or r.stdout).strip()[-500:]}"
    pytest.skip(f"cannot start a Docker engine: {why}")


def ensure_base_image() -> None:
    """Builds ATTNSERVE_TEST_BASE_IMAGE with make-base-image.sh when it is missing and the
    scripts folder is given; otherwise `docker build` pulls the base itself."""
    if BASE_IMAGE is None or SCRIPTS is None:
        return
    if sh("docker", "image", "inspect", BASE_IMAGE, check=False).returncode == 0:
        return
    r = subprocess.run(["bash", str(SCRIPTS / "make-base-image.sh"), BASE_IMAGE],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"building the base image failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


def pip_find_links() -> list[Path]:
    """The find-links folders pip is configured with (environment or config files)."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    folders = []
    for line in r.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += [Path(f) for f in value.strip().strip("'\"").split()]
    return folders


def stage_cpu_torch_wheel() -> None:
    """Copy the CPU torch wheel from pip's find-links folder into ./wheels/ (git-ignored),
    so the build does not download torch; without one the Dockerfile uses PyTorch's CPU
    index."""
    wheels = ROOT / "wheels"
    if list(wheels.glob("torch-2.13.0*.whl")):
        return
    for folder in pip_find_links():
        found = sorted(folder.glob("torch-2.13.0+cpu-*.whl")) if folder.is_dir() else []
        if found:
            wheels.mkdir(exist_ok=True)
            shutil.copy2(found[0], wheels / found[0].name)
            return


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def build(tag: str, *args: str) -> str:
    base = ["--build-arg", f"BASE_IMAGE={BASE_IMAGE}"] if BASE_IMAGE else []
    cmd = ["docker", "build", "--network", "host", *base, *args, "-t", tag, str(ROOT)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, f"docker build failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return tag


@pytest.fixture(scope="module")
def image() -> str:
    ensure_engine()
    ensure_base_image()
    stage_cpu_torch_wheel()
    return build(IMAGE, "--build-arg", f"VARIANT={VARIANT}", "--build-arg", f"MAX_LENGTH={MAX_LENGTH}")


@pytest.fixture(scope="module")
def own_model_images(image) -> tuple[str, str]:
    """The exporter (torch) and server (no torch, no export) targets: the image's own stages,
    so their layers are the ones `image` built."""
    return build("attnserve:smoke-exporter", "--target", "exporter"), build("attnserve:smoke-server", "--target", "server")


def test_image_has_no_torch_and_runs_as_non_root(image):
    r = sh("docker", "run", "--rm", "--network", "host", image, "python", "-c", "import torch", check=False)
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr, r.stderr
    r = sh("docker", "run", "--rm", "--network", "host", image, "python", "-c",
           "import os, onnxruntime; print(os.getuid(), onnxruntime.__version__)")
    uid = int(r.stdout.split()[0])
    assert uid != 0, "the runtime image must not run as root"


def wait_healthy(name: str, base: str, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    status = 0
    while time.monotonic() < deadline:
        state = sh("docker", "inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", "container exited:\n" + sh("docker", "logs", name, check=False).stderr[-3000:]
        try:
            status, _ = http("GET", f"{base}/health", timeout=5)
        except OSError:
            status = 0
        if status == 200:
            return
        time.sleep(1)
    pytest.fail("no 200 from /health:\n" + sh("docker", "logs", name, check=False).stderr[-3000:])


def test_container_serves_health_and_embed(image):
    port = free_loopback_port()
    name = f"attnserve-smoke-{uuid.uuid4().hex[:8]}"
    run = sh("docker", "run", "-d", "--name", name, "--network", "host",
             "-e", "ATTNSERVE_HOST=127.0.0.1", "-e", f"ATTNSERVE_PORT={port}", image)
    assert run.returncode == 0, run.stderr
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(name, base)
        status, body = http("POST", f"{base}/embed", {"inputs": "Docker smoke test: embed this sentence."})
        assert status == 200, body[:1000]
        vectors = json.loads(body)
        assert isinstance(vectors, list) and len(vectors) == 1
        vec = vectors[0]
        assert len(vec) == 384 and all(isinstance(x, float) and math.isfinite(x) for x in vec)
        assert sum(x * x for x in vec) > 0

        # The image's own HEALTHCHECK (every 10 s) agrees.
        deadline = time.monotonic() + 60
        health = ""
        while time.monotonic() < deadline:
            health = sh("docker", "inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
            if health == "healthy":
                break
            time.sleep(2)
        assert health == "healthy", health
    finally:
        sh("docker", "rm", "-f", name, check=False)
    assert sh("docker", "ps", "-a", "-q", "-f", f"name={name}").stdout.strip() == ""


# -- a model of your own: a mounted folder or a Hub id (docs/deploy.md, "Your own model") --------
# As Kubernetes runs them (deploy/kubernetes/components/model): uid 10001, a read-only root file
# system with /tmp writable, the model read-only.
POD = ("--network", "host", "--user", "10001:10001", "--read-only", "--tmpfs", "/tmp")
TEXTS = ["a first text for the container", "and a second one, a little longer than the first"]


def shared_dir(path: Path) -> Path:
    """A host folder the container's user (uid 10001) may read and write."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 10001, 10001)
    return path


def readable_by_all(root: Path) -> None:
    """The container's user reads a mounted model as a pod's fsGroup lets it (safetensors
    writes its file 0600)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def embed_in(name: str, image: str, *args: str) -> list[list[float]]:
    """Start `image` detached as `name` on a free loopback port, wait for it, embed TEXTS."""
    port = free_loopback_port()
    run = sh("docker", "run", "-d", "--name", name, *POD, "-e", "ATTNSERVE_HOST=127.0.0.1", "-e", f"ATTNSERVE_PORT={port}",
             *args, image, check=False)
    assert run.returncode == 0, run.stderr
    try:
        wait_healthy(name, f"http://127.0.0.1:{port}", seconds=300)
        status, body = http("POST", f"http://127.0.0.1:{port}/embed", {"inputs": TEXTS})
        assert status == 200, body[:1000]
        return json.loads(body)
    finally:
        sh("docker", "rm", "-f", name, check=False)


def test_a_mounted_folder_is_exported_by_prepare_and_served_by_the_server_image(own_model_images, tmp_path):
    """The Kubernetes init container's step (`attnserve prepare` in the exporter image) exports a
    mounted folder into the export volume; the server image (no torch) serves it with
    sentence-transformers' vectors; a second prepare exports nothing; and after the folder's
    pooling is edited the server refuses to start, naming the file."""
    from model_folders import bert_folder, sentence_transformers_vectors

    exporter, server = own_model_images
    folder = bert_folder(tmp_path / "models" / "encoder")
    readable_by_all(tmp_path / "models")
    export = shared_dir(tmp_path / "export")
    settings = ["-v", f"{tmp_path / 'models'}:/models:ro", "-e", "ATTNSERVE_MODEL=/models/encoder",
                "-e", "ATTNSERVE_VARIANT=full", "-e", "ATTNSERVE_MAX_LENGTH=128",
                "-e", "ATTNSERVE_EXPORT_DIR=/var/lib/attnserve/exports/model"]
    for attempt in (1, 2):  # a restarted init container finds the export made and checks it
        done = sh("docker", "run", "--rm", *POD, *settings, "-v", f"{export}:/var/lib/attnserve/exports",
                  exporter, "attnserve", "prepare", timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == "/var/lib/attnserve/exports/model" and (export / "model" / "manifest.json").is_file()
        assert ("exporting" in done.stderr) == (attempt == 1), done.stderr[-3000:]
    read_only = [*settings, "-v", f"{export}:/var/lib/attnserve/exports:ro", "-e", "HF_HUB_OFFLINE=1"]
    served = embed_in(f"attnserve-smoke-server-{uuid.uuid4().hex[:8]}", server, *read_only)
    expected = sentence_transformers_vectors(folder, TEXTS).numpy()
    assert max(abs(a - b) for row, want in zip(served, expected, strict=True) for a, b in zip(row, want, strict=True)) <= 1e-4

    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(pooling.read_text().replace('"pooling_mode_cls_token": false', '"pooling_mode_cls_token": true')
                       .replace('"pooling_mode_mean_tokens": true', '"pooling_mode_mean_tokens": false'))
    stale = sh("docker", "run", "--rm", *POD, *read_only, server, check=False, timeout=120)
    assert stale.returncode == 2 and "/var/lib/attnserve/exports/model/manifest.json: exported from /models/encoder" in stale.stderr, stale.stderr[-2000:]


def test_the_exporter_image_serves_a_hub_id_from_a_mounted_cache_offline(own_model_images, tmp_path):
    """`docker run` of the exporter image with ATTNSERVE_MODEL=org/name and a Hugging Face cache
    mounted (HF_HUB_OFFLINE=1: no network) exports the snapshot on first start into the mounted
    cache folder and serves it, with sentence-transformers' vectors of that snapshot."""
    from model_folders import HUB_MAIN, HUB_REPO, hub_cache, sentence_transformers_vectors

    exporter, _ = own_model_images
    hf = tmp_path / "hf"
    hub_cache(hf / "hub")
    readable_by_all(hf)
    cache = shared_dir(tmp_path / "exports")
    served = embed_in(f"attnserve-smoke-hub-{uuid.uuid4().hex[:8]}", exporter,
                      "-v", f"{hf}:/hf", "-e", "HF_HOME=/hf", "-e", "HF_HUB_OFFLINE=1", "-e", f"ATTNSERVE_MODEL={HUB_REPO}",
                      "-e", "ATTNSERVE_VARIANT=full", "-e", "ATTNSERVE_MAX_LENGTH=128",
                      "-v", f"{cache}:/home/attnserve/.cache/attnserve")
    expected = sentence_transformers_vectors(hf / "hub" / "models--acme--tiny-bert" / "snapshots" / HUB_MAIN, TEXTS).numpy()
    assert max(abs(a - b) for row, want in zip(served, expected, strict=True) for a, b in zip(row, want, strict=True)) <= 1e-4
    assert [p.name.split("--")[0] for p in cache.iterdir() if (p / "manifest.json").is_file()] == ["acme-tiny-bert"]
