"""attnserve.bench.memory's peak: what a call allocates, read exactly after the process has
held more before it (the high-water mark's reset), and by ru_maxrss or the sampler where the
kernel refuses that reset."""
from __future__ import annotations

import numpy as np

from attnserve.bench import memory

MIB = 2**20


def allocate(mib: int):
    """A call that touches `mib` MiB and frees it before it returns."""
    def call():
        block = np.ones(mib * MIB // 8)
        return float(block[-1])
    return call


def test_a_call_below_an_earlier_peak_is_measured_exactly():
    allocate(400)()  # the process's record is now 400 MiB above where the calls start
    extra, exact = memory.peak_extra_bytes(allocate(120))
    assert exact and 115 * MIB <= extra <= 160 * MIB, extra / MIB


FALLBACK = """
import json
import numpy as np
from attnserve.bench import memory

memory._reset_high_water_mark = lambda: False  # as where the kernel refuses it
MIB = 2**20

def allocate(mib):
    def call():
        return float(np.ones(mib * MIB // 8)[-1])
    return call

allocate(200)()
lower = memory.peak_extra_bytes(allocate(120))  # below the record: the sampler's reading
above = (memory._record_bytes() - memory._resident_bytes()) // MIB + 150
higher = memory.peak_extra_bytes(allocate(above))  # past the record: ru_maxrss, exact
print(json.dumps([lower, higher, above]))
"""


def test_without_the_reset_a_new_record_is_exact_and_a_lower_call_is_sampled():
    """In a fresh process, whose record is the 200 MiB block's: started through
    memory.fresh_python, since a child started straight from a test worker starts with the
    worker's record (gigabytes, after the export tests)."""
    import json
    import subprocess

    done = subprocess.run(memory.fresh_python("-c", FALLBACK), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (lower, lower_exact), (higher, higher_exact), above = json.loads(done.stdout.strip().splitlines()[-1])
    assert not lower_exact and lower <= 135 * MIB, lower / MIB  # the sampler may miss a peak, never invent one
    assert above < 400 and higher_exact and higher >= (above - 10) * MIB, (higher / MIB, above)


def test_page_in_mapped_makes_a_mapped_file_resident(tmp_path):
    """bench encoder --model counts a call's memory above the weights: ONNX Runtime maps an
    export's data file and pages in what a text touches, so the bench makes the mapping resident
    first. Here a 32 MiB file mapped and never read becomes resident in this process."""
    import mmap
    import re
    from pathlib import Path

    from attnserve.bench.model_speed import page_in_mapped

    path = tmp_path / "weights.data"
    path.write_bytes(np.random.default_rng(0).bytes(32 << 20))

    def resident() -> int:
        text = Path("/proc/self/smaps").read_text()
        block = text[text.index(str(path)):]
        return int(re.search(r"^Rss:\s+(\d+) kB", block, re.M).group(1)) * 1024

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ):
        before = resident()
        page_in_mapped(tmp_path)
        assert before < (1 << 20) and resident() == 32 << 20, (before, resident())
