"""README's quick start, run as a new user runs it: from a fresh clone of this checkout's HEAD in
a temporary folder with nothing beside it (no ../shared), with the commands read from the
README's "Quick start" section, not restated here.

Each install goes into a fresh venv of its own clone. pip uses what it is configured with
(its cache, find-links folders), so this runs offline where those hold every wheel; an index
that cannot be reached fails at once (PIP_RETRIES=0) instead of being retried per package.
The export the README makes (`attnserve export ... --out DIR`, minutes at 16,384 tokens) is
stood in for by the HTTP tests' cached export of the same variant at max_length 1024, so the
serve commands get ATTNSERVE_MAX_LENGTH=1024 beside it; every other command runs as printed,
with a free port in place of 8080.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from export_helpers import HTTP_MAX_LENGTH as MAX_LENGTH
from http_server import ROOT

from attnserve.bench.service import free_port, wait_until_healthy

# Needs the machine to itself: pytest-xdist runs this group on one worker, one test at a time.
pytestmark = pytest.mark.xdist_group("whole_machine")

INSTALL_TIMEOUT = 900
SERVE_READY_TIMEOUT = 240


@pytest.fixture
def workdir(tmp_path):
    """A folder for one clone; removed afterwards, since its venvs take 0.5 to 2 GB."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def quick_start(repo: Path) -> list[str]:
    """The commands of the clone's README's Quick start section: its indented code lines, in order."""
    text = (repo / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [line[4:].strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def command(repo: Path, pattern: str) -> str:
    """The one quick-start command matching `pattern` (a regular expression)."""
    found = [c for c in quick_start(repo) if re.search(pattern, c)]
    assert len(found) == 1, f"README's quick start should have one command matching {pattern!r}: {found}"
    return found[0]


def clone(where: Path) -> Path:
    where.mkdir(parents=True)
    repo = where / "attnserve"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True, timeout=300)
    assert sorted(p.name for p in where.iterdir()) == ["attnserve"], "the clone must have nothing beside it"
    return repo


def user_env(**extra: str) -> dict:
    """This machine's environment without the test run's venv, Python path or attnserve settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("ATTNSERVE_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT)))
    return {**env, "PIP_RETRIES": "0", **extra}


def run(cmd: str, repo: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-c", cmd], cwd=repo, env=env or user_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"`{cmd}` exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


class Served:
    """A quick-start serve command running in the clone on a free loopback port."""

    def __init__(self, cmd: str, repo: Path, env: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = repo / f"serve-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(["bash", "-c", f"exec {cmd} --port {self.port}"], cwd=repo, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        problem = wait_until_healthy(self.proc, self.url, SERVE_READY_TIMEOUT)
        if problem is not None:
            self.stop()
            raise AssertionError(f"`{cmd}`: {problem}\n{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def run_curl_examples(served: Served, repo: Path) -> None:
    curls = [c for c in quick_start(repo) if c.startswith("curl ")]
    assert len(curls) >= 5 and all("127.0.0.1:8080" in c for c in curls), curls
    for curl in curls:
        out = run(curl.replace("127.0.0.1:8080", f"127.0.0.1:{served.port}"), repo, timeout=300).stdout
        body = json.loads(out)
        assert not (isinstance(body, dict) and "error" in body), f"`{curl}` answered an error: {out[:1000]}"


def test_serving_only_install_serves_an_export_made_elsewhere(workdir, export_dir):
    repo = clone(workdir / "serving")
    install = command(repo, r"pip install \.$")
    run(install, repo, INSTALL_TIMEOUT)
    python = repo / ".venv" / "bin" / "python"
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True, timeout=120)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr, "the serving-only install has torch"

    serve = command(repo, r"attnserve serve --export-dir ")
    words = shlex.split(serve)
    where = words[words.index("--export-dir") + 1]
    target = repo / where

    # No export there yet: a clear error that says how to get one, and no export is started.
    missing = subprocess.run(["bash", "-c", f"{serve} --port {free_port()}"], cwd=repo, env=user_env(),
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0
    assert where in missing.stderr and "attnserve[export]" in missing.stderr, missing.stderr
    assert "exporting longformer" not in missing.stderr, missing.stderr  # serve's "exporting <variant>" line
    assert not target.exists() and not any(p.name.startswith(f".{target.name}-") for p in target.parent.glob(".*")), \
        "a serving-only install must not start an export"

    # The export made elsewhere: `attnserve export --out DIR`'s folder, copied where the README puts it.
    # Here, without the export extra, that command names the install it needs.
    export = command(repo, r"attnserve export ")
    words = shlex.split(export)
    assert words[words.index("--out") + 1] == where, (export, serve)
    refused = subprocess.run(["bash", "-c", export], cwd=repo, env=user_env(), capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "attnserve[export]" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert not target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(export_dir, target_is_directory=True)
    served = Served(serve, repo, user_env(ATTNSERVE_MAX_LENGTH=str(MAX_LENGTH)))
    try:
        run_curl_examples(served, repo)
        # /docs comes with the serving-only install: its page and script are this server's.
        page = httpx.get(served.url + "/docs", timeout=60)
        assert page.status_code == 200 and "://" not in page.text
        script = re.search(r'src="(/[^"]+\.js)"', page.text).group(1)
        assert httpx.get(served.url + script, timeout=60).status_code == 200
    finally:
        served.stop()


def test_export_install_serves_and_runs_the_quality_bench(workdir, export_dir):
    repo = clone(workdir / "export")
    install = command(repo, r"pip install -e '\.\[export\]'")
    assert "download.pytorch.org/whl/cpu" in install, "the export install must name PyTorch's CPU index"
    run(install, repo, INSTALL_TIMEOUT)
    python = repo / ".venv" / "bin" / "python"
    cuda = run(f"{python} -c 'import torch; print(torch.version.cuda)'", repo, timeout=300).stdout.strip()
    assert cuda == "None", f"the export install got a CUDA build of torch (CUDA {cuda})"

    # `attnserve serve` with nothing else: its export found through the settings, not made again.
    serve = command(repo, r"^\.venv/bin/attnserve serve$")
    served = Served(serve, repo, user_env(ATTNSERVE_EXPORT_DIR=str(export_dir), ATTNSERVE_MAX_LENGTH=str(MAX_LENGTH)))
    try:
        run_curl_examples(served, repo)
    finally:
        served.stop()

    bench = command(repo, r"attnserve bench quality --limit 5")
    out = run(bench, repo, timeout=900).stdout
    rows = [line for line in out.splitlines() if line.startswith("| longformer |")]
    assert rows and (repo / "reports" / "quality" / "quality.csv").is_file(), out[-3000:]
