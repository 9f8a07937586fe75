"""What every benchmark's results.json records about where it ran from."""
import subprocess
from pathlib import Path

from attnserve.bench.provenance import commit, cpu_model
from attnserve.contract.export_format import package_version

ROOT = Path(__file__).resolve().parents[1]


def test_commit_names_the_checkout_and_marks_local_changes():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    changed = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"], check=False).returncode != 0
    assert commit() == head + ("+changes" if changed else "")


def test_versions_and_cpu():
    versions = {name: package_version(name) for name in ("onnxruntime-gpu", "numpy", "no-such-distribution")}
    assert versions["onnxruntime-gpu"] and versions["numpy"] and versions["no-such-distribution"] is None
    assert cpu_model()
