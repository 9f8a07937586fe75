"""Peak memory of one encoder forward, measured in a fresh process.

Used by the tests (a budget linear in N) and the encoder benchmark. Run as
`python -m attnserve.bench.memory VARIANT N [N ...]`: prints one line per length, "N extra_bytes".

The peak is the resident set size above what the process held just before the forward. On
Linux the kernel's high-water mark (VmHWM) is reset to the current size before each forward
(writing 5 to /proc/self/clear_refs), so the mark after it is the forward's own peak, exactly,
however many forwards and models the process ran before. Where that reset is refused, ru_maxrss
gives the peak when the forward sets a new record for the process, and a thread samples the
resident size every half millisecond for the forwards that stay below the weights' loading
peak. Freed memory is handed back to the system (malloc_trim) before each forward so that the
starting point is what is really in use, and the measuring process maps each large allocation
on its own (measuring_env), so that its resident size is what is live.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import threading

import torch

from attnserve.bench.procfs import proc_bytes

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _record_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _reset_high_water_mark() -> bool:
    """Sets the kernel's peak resident size (VmHWM, and with it ru_maxrss) to the current
    size; False where the kernel or the sandbox does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _high_water_mark() is not None


def _high_water_mark() -> int | None:
    return proc_bytes("/proc/self/status", "VmHWM")


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline is then a little high
        pass


def peak_extra_bytes(fn) -> tuple[int, bool]:
    """Bytes above the current resident size at the peak of fn(), and whether that is exact
    (the high-water mark was reset before fn, or fn set a new ru_maxrss record) rather than the
    sampler's reading, which can miss a peak."""
    _trim()
    if _reset_high_water_mark():
        before = _resident_bytes()
        fn()
        return max(_high_water_mark() - before, 0), True
    before, record = _resident_bytes(), _record_bytes()
    peak, done = [before], threading.Event()

    def sample():
        while not done.wait(0.0005):
            peak[0] = max(peak[0], _resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    exact = _record_bytes() > record
    if exact:
        peak[0] = max(peak[0], _record_bytes())
    return max(peak[0] - before, 0), exact


def measure(variant: str, lengths: list[int], max_length: int = 16384) -> dict[int, int]:
    """{N: bytes above the loaded model's footprint at the peak of a forward at N tokens},
    each length measured in the same fresh process."""
    return measure_variants([variant], lengths, max_length)[variant]


def measure_variants(variants: list[str], lengths: list[int], max_length: int = 16384) -> dict[str, dict[int, int]]:
    """measure() of each variant, one after another in one fresh process (Python and torch start
    once): the high-water mark's reset, or the sampler where that is refused, measures each
    forward against what is resident just before it, not against an earlier model's peak."""
    code = ("import json, sys, attnserve.bench.memory as m; "
            "print(json.dumps({v: m._run(v, json.loads(sys.argv[2]), int(sys.argv[3])) for v in json.loads(sys.argv[1])}))")
    out = subprocess.run(fresh_python("-c", code, json.dumps(variants), json.dumps(lengths), str(max_length)),
                         capture_output=True, text=True, check=True, env=measuring_env()).stdout
    found = json.loads(out.strip().splitlines()[-1])
    return {v: {int(n): extra for n, extra in found[v].items()} for v in variants}


def fresh_python(*args: str) -> list[str]:
    """The command of a Python child of this interpreter whose record (ru_maxrss) starts at its
    own size. Linux carries a process's peak resident size over fork and exec into the child's
    record, so a child started straight from a test worker or a benchmark that has held
    gigabytes would start with their record, and no call of its own would set a new one (where
    the high-water mark cannot be reset, only a new record is exact). A shell started in between
    forks the child from its own small size."""
    return ["sh", "-c", '"$0" "$@"; exit $?', sys.executable, *args]


def measuring_env() -> dict[str, str]:
    """The environment of a measuring child: glibc maps every allocation of 64 KiB or more on its
    own and unmaps it when freed (a fixed mmap threshold, which glibc otherwise raises as blocks
    are freed), so the resident size follows what is live rather than what the heap kept from
    earlier calls: the same forward then reads the same peak, to the MiB, on an idle or a busy
    machine (without it, by up to a third between runs)."""
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}


def _run(variant, lengths, max_length):
    from attnserve.models import load_encoder

    encoder = load_encoder(variant, max_length=max_length)
    ids = torch.randint(1000, 30000, (1, max(lengths)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        encoder(ids[:, :16], torch.ones(1, 16, dtype=torch.long))  # warm up allocator and kernels
        return {n: _highest(lambda: encoder(ids[:, :n], torch.ones(1, n, dtype=torch.long))) for n in lengths}


def _highest(fn, tries: int = 3) -> int:
    """fn's peak: exact at once when it sets a new record for the process (a long forward),
    else the highest sampled reading of `tries` runs (on a busy machine the sampler can miss a
    short forward's peak, and one low reading would make the growth look steeper)."""
    readings = []
    for _ in range(tries):
        extra, exact = peak_extra_bytes(fn)
        readings.append(extra)
        if exact:
            break
    return max(readings)


if __name__ == "__main__":
    for n, extra in measure(sys.argv[1], [int(x) for x in sys.argv[2:]]).items():
        print(n, extra)
