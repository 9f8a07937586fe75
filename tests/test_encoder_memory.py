"""Every variant's PyTorch forward holds memory linear in the tokens: its peak measured at two
lengths by attnserve.bench.memory, in one fresh process (Python and torch start once, not once
per variant)."""
from __future__ import annotations

import pytest

from attnserve.bench.memory import measure_variants
from attnserve.models import variant_names

MEMORY_LENGTHS = (1024, 4096)  # 4x the tokens: 4x the memory if linear, 16x if anything is N x N
MEMORY_VARIANTS = variant_names()


@pytest.fixture(scope="module")
def peak_memory() -> dict[str, dict[int, int]]:
    """Every variant's peak at both lengths, one variant after another in one process."""
    return measure_variants(MEMORY_VARIANTS, list(MEMORY_LENGTHS), max_length=MEMORY_LENGTHS[1])


@pytest.mark.parametrize("variant", MEMORY_VARIANTS)
def test_peak_memory_is_linear_in_n(variant, peak_memory):
    """Peak memory of one forward, at two lengths: 4x the tokens may cost at most 5x the memory
    (an N x N tensor alone makes it 16x: 12 heads of 1,024^2 float32 are 50 MB, of 4,096^2
    805 MB), and the longer stays within 60 KB per token (240 MB, less than a third of one
    layer's 12 N x N score matrices at 4,096 tokens). The peak is exact (the kernel's high-water
    mark, with every large allocation mapped on its own) and repeats to the MiB: 3.4-4.0x the
    memory for 4x the tokens, and 15-36 KB per token at 4,096 (bigbird the most)."""
    short, long = MEMORY_LENGTHS
    extra = peak_memory[variant]
    assert extra[long] <= 60 * 1024 * long, f"{extra[long] / 2**20:.0f} MiB at {long} tokens"
    assert extra[long] <= 5 * max(extra[short], 1), f"{extra[short] / 2**20:.0f} -> {extra[long] / 2**20:.0f} MiB"
