"""Numbers from Linux's /proc files, for the benchmarks (no dependencies: bench service runs
where torch is not installed)."""
from __future__ import annotations


def proc_bytes(path: str, key: str) -> int | None:
    """A "Key:  N kB" line of a /proc file (status, meminfo), in bytes; None where the file or
    the line cannot be read (not Linux, a process that has exited)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
