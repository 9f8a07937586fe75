"""Benchmarks, memory probes and FLOP counters: what `attnserve bench ...` runs, installed with
the package (the wheel has them; their third-party needs are the bench extra, `pip install
'attnserve[bench]'`). python -m attnserve.bench.gpu is the GPU benchmark (docs/gpu.md).

They may import both the torch side (attnserve.models, export, train) and attnserve.service,
which never import them. Every figure they print depends on the machine and on what else runs on
it; tests run them only as smoke runs and never assert on a timing.
"""
