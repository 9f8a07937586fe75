"""Exporting the encoder to ONNX (`attnserve export`): exporter.py builds and caches an export,
graphs.py traces its graphs, lengths.py its length buckets, precision.py its int8 and float16
forms, verify.py checks ONNX Runtime against PyTorch."""
