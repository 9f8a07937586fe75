"""FLOP counts and the machine's matrix-multiply rate, for benchmarks: how close a forward
already runs to what the hardware can do bounds how much faster any runtime can make it."""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from attnserve.bench.timing import median_seconds


def _cpu_flash_attention(query, key, value, *args, out_val=None, **kwargs) -> int:
    # FlopCounterMode knows the CUDA fused-attention kernels but not the CPU one.
    return sdpa_flop_count(query, key, value)


_EXTRA_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_attention}


def count_flops(fn) -> int:
    """Floating-point operations of the matrix products and attention kernels fn() runs
    (multiply-add = 2). Softmax, normalisation and activations are not counted."""
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS) as counter:
        fn()
    return int(counter.get_total_flops())


def matmul_peak_flops(rows: int = 4096, hidden: int = 384, inner: int = 1536, repeats: int = 10) -> float:
    """FLOP/s of one large float32 matrix product at torch's current thread count (by default
    the encoder's widest GEMM, 4,096 tokens x 384 -> 1,536): about the best this machine
    sustains; a forward with its FLOPs counted cannot run faster than FLOPs / this rate."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, hidden, generator=g), torch.randn(hidden, inner, generator=g)
    seconds = median_seconds(lambda: torch.mm(a, b), repeats)
    return 2 * rows * hidden * inner / seconds
