"""Benchmarks, memory probes and FLOP counters: what `attnserve bench ...` runs, from a source
checkout only (the wheel installs attnserve.models and attnserve.service, not this folder).

They may import both attnserve.models and attnserve.service, which never import them. Every
figure they print depends on the machine and on what else runs on it; tests run them only as
smoke runs and never assert on a timing.
"""
