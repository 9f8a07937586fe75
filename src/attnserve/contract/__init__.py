"""The contract between exporting (attnserve.models, torch) and serving (attnserve.service, no torch).

The one place both sides import: `export_format` (what an export directory holds, its typed
manifest, checksums, padding and `--param` values) and `pooling` (how an export's token
vectors become document and chunk vectors, so PyTorch and ONNX Runtime pool alike). It needs
numpy and pydantic only and imports nothing else of either side (tests/test_structure.py).
"""
