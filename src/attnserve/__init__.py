"""attnserve: long-document embeddings with efficient attention, served over HTTP.

Its packages, each a folder here:

    contract  what an export holds and how token vectors become vectors (torch-free; both sides use it)
    models    the encoder and its registry of attention variants (torch)
    export    the encoder to ONNX: graphs, lengths, precision, verification, the export cache (torch)
    train     adaptation: distilled variant weights (torch)
    service   the HTTP server, its batcher and ONNX Runtime (no torch)
    data      the bundled long documents (package data) and retrieval scores (torch-free)
    bench     the benchmarks `attnserve bench ...` runs

and cli.py, the `attnserve` command (`python -m attnserve`), which imports each command's module
only when that command runs.
"""
