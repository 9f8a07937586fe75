"""Context heads: small modules over the frozen encoder's outputs that try to give chunk vectors
and one-vector documents what the long pass knows. They lost to naive chunks
(docs/results/context.md) and are not served.

    cache.py    `python -m research.context cache`: the export run once over documents, float16 shards
    heads.py    the designs (mix, attend, attention-pooling)
    train.py    `python -m research.context train`: heads learned on a cache
    files.py    a head folder: weights, ONNX graphs checked against PyTorch
    format.py   what a head folder holds (context.json)
    runtime.py  the heads' graphs through ONNX Runtime
    bench.py    `python -m research.context bench`: naive, late and learned, scored and timed
    cli.py      the command line of the three
"""
