"""What a benchmark ran on and from: the CPU and the checkout's commit, for every results.json."""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def commit() -> str | None:
    """The checkout's commit, where attnserve runs from one (None for an installed wheel), with
    "+changes" where its tracked files differ from it."""
    done = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    clean = subprocess.run(["git", "-C", str(HERE), "diff", "--quiet", "HEAD"], check=False).returncode == 0
    return done.stdout.strip() + ("" if clean else "+changes")
