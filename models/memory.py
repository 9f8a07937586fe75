"""Peak memory of one encoder forward, measured in a fresh process (ru_maxrss).

Used by the tests (a budget linear in N) and the encoder benchmark. Run as
`python -m models.memory VARIANT N [N ...]`: prints one line per length, "N extra_bytes".
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys

import torch


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(variant: str, lengths: list[int], max_length: int = 16384) -> dict[int, int]:
    """{N: bytes above the loaded model's footprint at the peak of a forward at N tokens}.
    Lengths must ascend: the peak of a process only grows."""
    code = f"import json, models.memory as m; print(json.dumps(m._run({variant!r}, {lengths!r}, {max_length})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def _run(variant, lengths, max_length):
    from models import load_encoder

    encoder = load_encoder(variant, max_length=max_length)
    ids = torch.randint(1000, 30000, (1, max(lengths)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        encoder(ids[:, :16], torch.ones(1, 16, dtype=torch.long))  # warm up allocator and kernels
        base = _peak_bytes()
        result = {}
        for n in lengths:
            encoder(ids[:, :n], torch.ones(1, n, dtype=torch.long))
            result[n] = _peak_bytes() - base
    return result


if __name__ == "__main__":
    for n, extra in measure(sys.argv[1], [int(x) for x in sys.argv[2:]]).items():
        print(n, extra)
